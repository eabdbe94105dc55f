"""The softcap's kernels (flash_tma.cu and flash_tma_bwd.cu built with SOFTCAP) under compute-sanitizer: d 64, 128,
96 (and the forward at 256), ragged N, N_q != N_k, grouped-query, causal, a window, counting and plain builds. Run as
`compute-sanitizer --tool memcheck|racecheck|synccheck python3 results/h100/issue22/softcap/scripts/san_softcap.py`."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.plan import make_plan

plans = []
for direction in ("fwd", "bwd"):
    for n_q, n_k, d, causal, window in ((113, 400, 128, "", None), (300, 300, 64, "bottom_right", (50, None)),
                                        (257, 130, 96, "top_left", None), (200, 200, 256, "", None)):
        if direction == "bwd" and d > 128:
            continue
        plans.append(make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * 1024, batch=2,
                               heads=2, kv_heads=1, causal=causal, window=window, softcap=5.0, direction=direction))
n = 0
for plan in plans:
    inputs, _ = launch.make_device_inputs(plan, seed=1, magnitude=3.0)
    for counting in (True, False):
        launch.run_plan(plan, inputs, counting=counting)
        cp.cuda.runtime.deviceSynchronize()
        n += 1
print("ran", n)
