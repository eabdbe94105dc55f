"""tma vs wgmma forward: graph-replay TFLOP/s of the plain build, max |diff| to wgmma's O, compile time,
registers/shared memory, and SASS instruction counts (HGMMA, UTMALDG) when cuobjdump is on PATH."""
import os, shutil, subprocess, tempfile, time
import numpy as np, cupy as cp
from iokernels.plan.fast import make_fast_plan
from iokernels.plan.variants import with_causal
from iokernels.kernels import launch, nvrtc
from iokernels.kernels.stages import kernel_ref
from iokernels.kernels.sources import build_source

def plan_of(kernel, d, n, b, h, bc=None, causal=""):
    kw = {} if bc is None else {"block_r": 128, "block_c": bc}
    return with_causal(make_fast_plan(N_q=n, d=d, dtype="float16", batch=b, heads=h, kernel=kernel, **kw), causal)

def run(plan):
    dev, _ = launch.make_device_inputs(plan, seed=1)
    o = cp.asnumpy(launch.run_plan(plan, dev).buffers["O"]).astype(np.float64)
    tot, _ = launch.time_plan(plan, dev, repeats=20)
    fl = 4 * plan.bh * plan.N_q * plan.N_k * plan.d * (0.5 if plan.causal else 1)
    return o, fl / tot / 1e12

for d in (64, 128):
    for n, b in ((512, 32), (4096, 4), (16384, 1)):
        for causal in ("", "bottom_right"):
            ref, tf_ref = run(plan_of("wgmma", d, n, b, 16, causal=causal))
            line = f"d {d} N {n:5d} B {b:2d} {'causal' if causal else 'full  '}: wgmma {tf_ref:6.1f}"
            for bc in (64, 128):
                try:
                    o, tf = run(plan_of("tma", d, n, b, 16, bc, causal))
                    line += f" | tma bc{bc} {tf:6.1f} err {float(np.abs(o - ref).max()):.1e}"
                except Exception as e:
                    line += f" | tma bc{bc} FAIL {repr(e)[:150]}"
            print(line, flush=True)

objdump = shutil.which("cuobjdump")
print("cuobjdump:", objdump)
for d in (64, 128):
    for bc in (64, 128):
        plan = plan_of("tma", d, 4096, 4, 16, bc)
        stage = plan.stages[0]
        ref = kernel_ref(plan, stage)
        t0 = time.time()
        res = nvrtc.compile_to_cubin(build_source(ref.source, ref.define_dict, False), arch="sm_90a", name=ref.source,
                                     name_expressions=[ref.name_expression])
        ct = time.time() - t0
        r = next(iter(res.resources.values()))  # the one kernel of this module
        line = f"tma d {d} bc {bc}: compile {ct:.1f} s, {r}"
        if objdump:
            with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                f.write(res.cubin)
            sass = subprocess.run([objdump, "-sass", f.name], capture_output=True, text=True).stdout
            ops = {k: sass.count(k) for k in ("HGMMA", "UTMALDG", "SYNCS", "USETMAXREG", "LDG", "STG")}
            line += f" SASS {ops}"
        print(line, flush=True)
