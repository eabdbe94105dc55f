"""The sm_90 backwards' dSᵀ store as stmatrix (wg_bwd.cuh wgb_store_ds, the tree) against 32-bit stores (a copy under
/tmp/alt, run with cwd and PYTHONPATH there): the tma backward's main stage alone in CUDA-graph replays
(kernels.timing.time_plan, median of 20), B·H·N = 262,144, 16 heads, inputs drawn on the GPU; TFLOP/s at 2.5 · 4 · N²·d
per head (halved when causal)."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.kernels.timing import time_plan
from iokernels.plan import make_plan
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.variants import with_causal

for d, n, dtype, causal in ((64, 4096, "float16", False), (128, 4096, "bfloat16", False),
                            (128, 16384, "float16", False), (128, 4096, "float16", True)):
    bh = 262144 // n
    rng = cp.random.default_rng(0)
    x = [launch.to_device(rng.standard_normal((bh, n, d), dtype=cp.float32), dtype) for _ in range(4)]
    fplan = make_plan("flash", "fast", N_q=n, d=d, dtype=dtype, sram=227 * 1024, batch=bh // 16, heads=16,
                      causal=causal)
    frun = launch.run_plan(fplan, {"Q": x[0], "K": x[1], "V": x[2]}, counting=False)
    bplan = with_causal(make_fast_backward_plan(N_q=n, d=d, dtype=dtype, batch=bh // 16, heads=16, kernel="tma"),
                        causal)
    _, stages = time_plan(bplan, {"Q": x[0], "K": x[1], "V": x[2], "O": frun.buffers["O"], "lse": frun.buffers["lse"],
                                  "dO": x[3]}, repeats=20)
    flops = 2.5 * 4.0 * bh * n * n * d * (0.5 if causal else 1.0)
    print(f"bwd d {d} N {n} {dtype} causal {causal}: main {flops / stages['main'] / 1e12:.1f} TFLOP/s", flush=True)
