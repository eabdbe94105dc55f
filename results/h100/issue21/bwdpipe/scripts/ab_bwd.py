"""The tma backward's main stage in three builds: the tree (dSᵀ by stmatrix, dK issued after dQ and, at B_r 64, waited
once the next step's Sᵀ/dPᵀ are issued), `stsm` (only dSᵀ by stmatrix) and `base` (af554d1), each a copy of the
package under /tmp/ab/<name> (run with cwd and PYTHONPATH there). CUDA-graph replays of the main stage alone
(kernels.timing.time_plan, median of 20), 16 heads, inputs drawn on the GPU; TFLOP/s at 2.5 · 4 · N²·d per head
(halved when causal). Usage: python3 ab_bwd.py <label>"""
import sys

import cupy as cp

from iokernels.kernels import launch
from iokernels.kernels.timing import time_plan
from iokernels.plan import make_plan
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.variants import with_causal

CASES = ((64, 4096, "float16", False, 4), (128, 4096, "bfloat16", False, 4), (128, 16384, "float16", False, 1),
         (128, 4096, "float16", True, 4), (64, 16384, "float16", True, 1), (128, 65536, "float16", True, 1))
for d, n, dtype, causal, batch in CASES:
    heads = 16 if n < 65536 else 4
    bh = batch * heads
    rng = cp.random.default_rng(0)
    x = [launch.to_device(rng.standard_normal((bh, n, d), dtype=cp.float32), dtype) for _ in range(4)]
    fplan = make_plan("flash", "fast", N_q=n, d=d, dtype=dtype, sram=227 * 1024, batch=batch, heads=heads,
                      causal=causal)
    frun = launch.run_plan(fplan, {"Q": x[0], "K": x[1], "V": x[2]}, counting=False)
    bplan = with_causal(make_fast_backward_plan(N_q=n, d=d, dtype=dtype, batch=batch, heads=heads, kernel="tma"),
                        causal)
    _, stages = time_plan(bplan, {"Q": x[0], "K": x[1], "V": x[2], "O": frun.buffers["O"], "lse": frun.buffers["lse"],
                                  "dO": x[3]}, repeats=20)
    flops = 2.5 * 4.0 * bh * n * n * d * (0.5 if causal else 1.0)
    print(f"{sys.argv[1]:5s} d {d:3d} N {n:5d} B {batch} H {heads:2d} {dtype:8s} causal {causal!s:5s}: main "
          f"{stages['main'] * 1e3:8.3f} ms {flops / stages['main'] / 1e12:6.1f} TFLOP/s", flush=True)
    del x, frun
