import cupy as cp
from iokernels.kernels import launch
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.variants import with_causal
for d in (32, 96, 64):
    for dtype in ("float16", "bfloat16"):
        for br, bc in ((64, 128), (128, 128), (64, 64), (128, 64)):
            try:
                plan = make_fast_backward_plan(N_q=4096, d=d, dtype=dtype, batch=4, heads=16, kernel="wgmma", block_r=br, block_c=bc)
                dev, _ = launch.make_device_inputs(plan, seed=1)
                tot, _ = launch.time_plan(plan, dev, repeats=10)
                print(f"bwd d {d} {dtype} {br}x{bc}: {2.5 * 4 * plan.bh * 4096 * 4096 * d / tot / 1e12:6.1f} TFLOP/s", flush=True)
            except Exception as e:
                print(f"bwd d {d} {dtype} {br}x{bc}: {repr(e)[:120]}", flush=True)
