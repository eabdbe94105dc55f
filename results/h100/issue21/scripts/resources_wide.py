import sys, time
from iokernels.kernels import nvrtc
from iokernels.kernels.sources import build_source
from iokernels.kernels.stages import kernel_ref
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.variants import with_causal, with_dropout
from iokernels.plan.dropout import Dropout
ds = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [256]
for d in ds:
    for t in ("float16", "bfloat16"):
        for var in ("", "causal", "dropout"):
            plan = make_fast_backward_plan(N_q=1000, d=d, dtype=t, heads=2, kernel="tma", dropout=var == "dropout")
            if var == "causal": plan = with_causal(plan, True)
            if var == "dropout": plan = with_dropout(plan, Dropout(0.1, 1, 0))
            stage = plan.stage("main"); ref = kernel_ref(plan, stage)
            for counting in (False, True):
                t0 = time.time()
                try:
                    r = nvrtc.compile_to_cubin(build_source(ref.source, ref.define_dict, counting), arch="sm_90a", name=ref.source, name_expressions=[ref.name_expression])
                except Exception as e:
                    print(d, t, var, counting, "FAILED", str(e)[:3000]); continue
                res = r.resources_of(ref.name_expression)
                print(f"{stage.kernel} d {d} {t} {var or 'plain'} {'count' if counting else 'plain'}: {time.time()-t0:.2f}s regs {res.registers} spills {res.spill_stores}/{res.spill_loads} stack {res.stack_frame} smem {stage.smem_bytes}", flush=True)
            if t == "bfloat16": break
