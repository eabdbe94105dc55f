"""The ALiBi kernels (flash_tma.cu and flash_tma_bwd.cu built with ALIBI) under compute-sanitizer: d 64, 96, 128,
ragged N, N_q != N_k, grouped-query, causal both ways, a window, a block mask, counting and plain builds. Run as
`compute-sanitizer --tool memcheck|racecheck|synccheck python3 results/h100/issue22/alibi/scripts/san_alibi.py`."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.masks import pattern

plans = []
for direction in ("fwd", "bwd"):
    for n_q, n_k, d, causal, window, sparse in ((113, 400, 128, "", None, False), (300, 300, 64, "bottom_right", None, True),
                                                (257, 130, 96, "top_left", None, False), (300, 300, 64, "", (50, 10), False)):
        mask = pattern("random", 0.5, n_q=n_q, n_k=n_k, seed=n_q) if sparse else None
        plans.append(make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * 1024, batch=2,
                               heads=2, kv_heads=1, causal=causal, window=window, block_mask=mask, alibi=(0.5, 0.125),
                               direction=direction))
n = 0
for plan in plans:
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    for counting in (True, False):
        launch.run_plan(plan, inputs, counting=counting)
        cp.cuda.runtime.deviceSynchronize()
        n += 1
print("ran", n)
