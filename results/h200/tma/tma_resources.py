import subprocess, tempfile, time, sys
from iokernels.plan.fast import make_fast_plan
from iokernels.plan.variants import with_causal, with_dropout
from iokernels.plan.dropout import Dropout
from iokernels.kernels import nvrtc
from iokernels.kernels.stages import kernel_ref
from iokernels.kernels.sources import build_source
objdump = sys.argv[1]
for dtype in ("float16", "bfloat16"):
  for d in (64, 128):
    for bc in (64, 128):
      for variant in ("", "causal", "dropout"):
        plan = make_fast_plan(N_q=4096, d=d, dtype=dtype, batch=4, heads=16, kernel="tma", block_r=128, block_c=bc)
        if variant == "causal": plan = with_causal(plan, "bottom_right")
        if variant == "dropout": plan = with_dropout(plan, Dropout(0.1, 1, 0))
        ref = kernel_ref(plan, plan.stages[0])
        for counting in (False, True):
            t0 = time.time()
            res = nvrtc.compile_to_cubin(build_source(ref.source, ref.define_dict, counting), arch="sm_90a", name=ref.source,
                                         name_expressions=[ref.name_expression])
            ct = time.time() - t0
            r = res.resources_of(ref.name_expression)
            line = f"{dtype:8s} d {d:3d} B_c {bc:3d} {variant or 'plain':7s} {'counting' if counting else 'plain   '}: compile {ct:4.1f} s, {r.registers} registers, spills {r.spill_stores}/{r.spill_loads}, static smem {r.shared} B + dynamic {plan.smem_bytes} B"
            if not counting:
                with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                    f.write(res.cubin)
                sass = subprocess.run([objdump, "-sass", f.name], capture_output=True, text=True).stdout
                line += " | SASS: " + ", ".join(f"{k} {sass.count(k)}" for k in ("HGMMA", "UTMALDG", "SYNCS", "USETMAXREG"))
            print(line, flush=True)
