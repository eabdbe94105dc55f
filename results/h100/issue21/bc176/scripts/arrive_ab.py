"""The tma backward's ring release: an arrival per consumer thread (the tree) against one per warp after __syncwarp (the
copy under /tmp/alt, run with cwd there): the main stage alone in CUDA-graph replays (kernels.timing.time_plan), B·H·N =
262,144, 16 heads, inputs drawn on the GPU (O and lse from the forward). Prints TFLOP/s (2.5 · 4 · N² · d per head)."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.kernels.timing import time_plan
from iokernels.plan import make_plan
from iokernels.plan.fast_bwd import make_fast_backward_plan

for d, dtype, n in ((64, "float16", 4096), (128, "float16", 4096), (128, "bfloat16", 16384)):
    bh = 262144 // n
    fplan = make_plan("flash", "fast", N_q=n, d=d, dtype=dtype, sram=227 * 1024, batch=bh // 16, heads=16)
    rng = cp.random.default_rng(0)
    x = [launch.to_device(rng.standard_normal((bh, n, d), dtype=cp.float32), dtype) for _ in range(4)]
    fin = {"Q": x[0], "K": x[1], "V": x[2]}
    frun = launch.run_plan(fplan, fin, counting=False)
    plan = make_fast_backward_plan(N_q=n, d=d, dtype=dtype, batch=bh // 16, heads=16, kernel="tma")
    inputs = {**fin, "O": frun.buffers["O"], "lse": frun.buffers["lse"], "dO": x[3]}
    _, stages = time_plan(plan, inputs, repeats=20)
    print(f"bwd d {d} {dtype} N {n}: main {2.5 * 4 * bh * n * n * d / stages['main'] / 1e12:.1f} TFLOP/s", flush=True)
