"""The tma forward with 176 keys per tile (FlashAttention-3's B_c at d 128 without a mask) against the default tiles:
the plain build's plan alone in CUDA-graph replays (kernels.timing.time_plan, median of 20), B·H·N = 262,144, 16 heads,
inputs drawn on the GPU; TFLOP/s at 4·N²·d per head. Run from the repository root with PYTHONPATH=.."""
import cupy as cp

from iokernels.kernels.launch import tensor_shape, to_device
from iokernels.kernels.timing import time_plan
from iokernels.plan.fast import make_fast_plan

CASES = [(128, "float16", 4096), (128, "bfloat16", 4096), (128, "float16", 16384), (128, "bfloat16", 16384),
         (96, "float16", 4096), (64, "float16", 4096), (64, "float16", 16384)]
for d, dtype, n in CASES:
    heads, batch = 16, 262144 // (16 * n)
    flops = 4.0 * n * n * d * batch * heads
    tiles = [{"block_r": 128, "block_c": 128}, {"block_r": 128, "block_c": 176}]
    if d <= 64:
        tiles = [{"block_r": 192, "block_c": 128}, *tiles]  # (the default at d 64)
    rng = cp.random.default_rng(0)
    inputs = None
    for t in tiles:
        plan = make_fast_plan(N_q=n, d=d, dtype=dtype, batch=batch, heads=heads, kernel="tma", **t)
        if inputs is None:
            inputs = {x: to_device(rng.standard_normal(tensor_shape(plan, x), dtype=cp.float32), dtype) for x in "QKV"}
        seconds, _ = time_plan(plan, inputs, repeats=20)
        print(f"d {d} {dtype} N {n}: {plan.describe_tiles()} {dict(plan.stages[0].params)} {seconds * 1e3:.3f} ms "
              f"{flops / seconds / 1e12:.1f} TFLOP/s", flush=True)
