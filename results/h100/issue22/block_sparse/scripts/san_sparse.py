"""The block-sparse tma kernels (flash_tma.cu and flash_tma_bwd.cu built with BLOCK_SPARSE) under compute-sanitizer:
d 64, 128, 96 and 256 (the wide backward), ragged N, N_q != N_k, grouped-query, causal both ways, a softcap, rows of
the grid with no kept block, counting and plain builds. Run as
`compute-sanitizer --tool memcheck|racecheck|synccheck python3 results/h100/issue22/block_sparse/scripts/san_sparse.py`."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.masks import pattern

plans = []
for direction in ("fwd", "bwd"):
    for n_q, n_k, d, causal, density, softcap in ((113, 400, 128, "", 0.5, None), (300, 300, 64, "bottom_right", 0.6, None),
                                                  (257, 130, 96, "top_left", 0.5, None), (200, 300, 256, "", 0.5, None),
                                                  (520, 520, 64, "", 0.1, None), (300, 300, 128, "top_left", 0.5, 5.0)):
        mask = pattern("random", density, n_q=n_q, n_k=n_k, seed=n_q)
        plans.append(make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * 1024, batch=2,
                               heads=2, kv_heads=1, causal=causal, block_mask=mask, softcap=softcap,
                               direction=direction))
n = 0
for plan in plans:
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    for counting in (True, False):
        launch.run_plan(plan, inputs, counting=counting)
        cp.cuda.runtime.deviceSynchronize()
        n += 1
print("ran", n)
