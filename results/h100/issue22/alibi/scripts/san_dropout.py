"""Dropout with a block mask and with ALiBi (flash_tma.cu and flash_tma_bwd.cu built with DROPOUT and BLOCK_SPARSE or
ALIBI) under compute-sanitizer: forward and backward, counting and plain builds. Run as
`compute-sanitizer --tool memcheck|racecheck python3 results/h100/issue22/alibi/scripts/san_dropout.py`."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.dropout import Dropout
from iokernels.plan.masks import pattern

plans = [make_plan("flash", "fast", N_q=300, N_k=257, d=d, dtype="float16", sram=227 * 1024, batch=2, heads=2,
                   kv_heads=1, causal=causal, direction=direction, dropout=Dropout(0.2, 7, 3), **extra)
         for direction in ("fwd", "bwd")
         for d, causal, extra in ((128, "", {"block_mask": pattern("random", 0.5, n_q=300, n_k=257, seed=1)}),
                                  (64, "bottom_right", {"alibi": (0.5, 0.25)}))]
n = 0
for plan in plans:
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    for counting in (True, False):
        launch.run_plan(plan, inputs, counting=counting)
        cp.cuda.runtime.deviceSynchronize()
        n += 1
print("ran", n)
