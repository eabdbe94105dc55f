"""The tensor-core kernels' exponentials as ex2.approx.ftz (tiles.cuh fast_exp2, the tree) against exp2f (a copy under
/tmp/alt, run with cwd and PYTHONPATH there): the tma forward plan and the tma backward's main stage alone in CUDA-graph
replays (kernels.timing.time_plan, median of 20), B·H·N = 262,144, 16 heads, fp16, inputs drawn on the GPU. TFLOP/s at
4·N²·d per head forward (halved when causal), 2.5× that backward."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.kernels.timing import time_plan
from iokernels.plan import make_plan
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.variants import with_causal

for d, n, causal in ((64, 4096, False), (128, 4096, False), (64, 16384, False), (128, 4096, True)):
    bh = 262144 // n
    rng = cp.random.default_rng(0)
    x = [launch.to_device(rng.standard_normal((bh, n, d), dtype=cp.float32), "float16") for _ in range(4)]
    fplan = make_plan("flash", "fast", N_q=n, d=d, dtype="float16", sram=227 * 1024, batch=bh // 16, heads=16,
                      causal=causal)
    fwd, _ = time_plan(fplan, {"Q": x[0], "K": x[1], "V": x[2]}, repeats=20)
    frun = launch.run_plan(fplan, {"Q": x[0], "K": x[1], "V": x[2]}, counting=False)
    bplan = with_causal(make_fast_backward_plan(N_q=n, d=d, dtype="float16", batch=bh // 16, heads=16, kernel="tma"),
                        causal)
    _, stages = time_plan(bplan, {"Q": x[0], "K": x[1], "V": x[2], "O": frun.buffers["O"], "lse": frun.buffers["lse"],
                                  "dO": x[3]}, repeats=20)
    flops = 4.0 * bh * n * n * d * (0.5 if causal else 1.0)
    bwd = 2.5 * flops / stages["main"] / 1e12
    print(f"d {d} N {n} causal {causal}: fwd {flops / fwd / 1e12:.1f} TFLOP/s, bwd main {bwd:.1f}", flush=True)
