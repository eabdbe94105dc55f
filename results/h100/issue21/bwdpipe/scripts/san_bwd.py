"""The tma backward after its step's new order (dK after dQ; at B_r 64 waited once the next step's Sᵀ/dPᵀ fly) under
compute-sanitizer: d 128 (B_r 64), d 64 (B_r 128), d 96 and 40 (tile 128, 64), ragged N, N_q != N_k, grouped-query,
causal in both alignments, a window, dropout, counting and plain builds; a key block with no step (a window past every
query). Run as `compute-sanitizer --tool memcheck|racecheck|synccheck|initcheck python3 .../san_bwd.py`."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.dropout import Dropout
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.variants import with_causal

plans = []
for d in (128, 64, 96, 40):
    for n_q, n_k in ((113, 400), (300, 17), (1, 1)):
        plans.append(make_fast_backward_plan(N_q=n_q, N_k=n_k, d=d, dtype="float16", batch=2, heads=2, kv_heads=1,
                                             kernel="tma"))
for causal in ("bottom_right", "top_left"):
    for d in (128, 64):
        plans.append(with_causal(make_fast_backward_plan(N_q=300, N_k=200, d=d, dtype="bfloat16", batch=2, heads=4,
                                                         kv_heads=2, kernel="tma"), causal))
for d in (128, 64):
    for n_q, n_k, window, p in ((257, 385, (64, 0), 0.0), (200, 700, (16, 16), 0.0), (257, 300, None, 0.1)):
        dropout = Dropout(p, 1234567, 7) if p else None
        plans.append(make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * 1024, heads=2,
                               window=window, direction="bwd", dropout=dropout))
n = 0
for plan in plans:
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    for counting in (True, False):
        launch.run_plan(plan, inputs, counting=counting)
        cp.cuda.runtime.deviceSynchronize()
        n += 1
print("ran", n)
