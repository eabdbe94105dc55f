"""The kernels edited on 2026-11-27 under compute-sanitizer: the tma forward at B_c 176 (d 128 and 96, ragged N, N_q !=
N_k, grouped-query), the causal tma forward and backward with the blocks' longest-first order (both alignments, 2
batches x 3 heads, and grouped-query), counting and plain builds. Run as `compute-sanitizer --tool
memcheck|racecheck|synccheck|initcheck python3 results/h100/issue21/bc176/scripts/san_today.py`."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.plan.fast import make_fast_plan
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.variants import with_causal

plans = []
for d in (128, 96):
    for n_q, n_k in ((113, 400), (300, 17), (1, 1)):
        plans.append(make_fast_plan(N_q=n_q, N_k=n_k, d=d, dtype="float16", batch=2, heads=2, kv_heads=1,
                                    kernel="tma", block_c=176))
for causal in ("bottom_right", "top_left"):
    for n_q, n_k in ((300, 200), (130, 513)):
        plans.append(with_causal(make_fast_plan(N_q=n_q, N_k=n_k, d=64, dtype="bfloat16", batch=2, heads=3,
                                                kernel="tma", causal=True), causal))
        plans.append(with_causal(make_fast_backward_plan(N_q=n_q, N_k=n_k, d=128, dtype="float16", batch=2, heads=4,
                                                         kv_heads=2, kernel="tma"), causal))
n = 0
for plan in plans:
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    for counting in (True, False):
        launch.run_plan(plan, inputs, counting=counting)
        cp.cuda.runtime.deviceSynchronize()
        n += 1
print("ran", n)
