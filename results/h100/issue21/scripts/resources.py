"""NVRTC compile time and ptxas's registers/spills/shared memory of the default tma forward and the tma and wgmma
backward plans at several d (plain and counting builds), on the CPU: PYTHONPATH=. python3 results/h100/issue21/scripts/resources.py"""
import time

from iokernels.kernels import nvrtc
from iokernels.kernels.sources import build_source
from iokernels.kernels.stages import kernel_ref
from iokernels.plan.fast import make_fast_plan
from iokernels.plan.fast_bwd import make_fast_backward_plan

plans = [make_fast_plan(N_q=4096, d=d, dtype="float16", heads=16, kernel="tma", causal=c)
         for d in (32, 64, 96, 128, 256) for c in (False, True)]
plans += [make_fast_backward_plan(N_q=4096, d=d, dtype=t, heads=16, kernel=k) for d in (32, 64, 96, 128)
          for k in ("tma", "wgmma") for t in ("float16", "bfloat16")]
for plan in plans:
    stage = plan.stage("main")
    ref = kernel_ref(plan, stage)
    for counting in (False, True):
        t0 = time.time()
        r = nvrtc.compile_to_cubin(build_source(ref.source, ref.define_dict, counting), arch="sm_90a", name=ref.source,
                                   name_expressions=[ref.name_expression])
        res = r.resources_of(ref.name_expression)
        tiles = dict(plan.tiles)
        print(f"{stage.kernel} d {plan.d} {plan.dtype} {tiles['Br']}x{tiles['Bc']} {'counting' if counting else 'plain   '}: "
              f"compile {time.time() - t0:.2f} s, {res.registers} registers at launch, spills {res.spill_stores}/"
              f"{res.spill_loads} B, static smem {res.shared} B, dynamic {stage.smem_bytes} B", flush=True)
