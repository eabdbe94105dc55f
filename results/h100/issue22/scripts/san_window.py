"""The sliding-window builds of the tma kernels (flash_tma.cu, flash_tma_bwd.cu with WINDOW) under
compute-sanitizer: d 64, 128 and 256 (the wide backward), forward and backward, a window alone and with causal,
ragged N both ways (rows that see no key), counting and plain builds. Run as
`compute-sanitizer --tool memcheck|racecheck|synccheck python3 results/h100/issue22/scripts/san_window.py`;
SAN_QUICK=1: d 64 only, one shape (racecheck and synccheck are slow); SAN_DIRS=fwd: the forward only."""
import os

import cupy as cp

from iokernels.kernels import launch
from iokernels.plan import make_plan

QUICK = os.environ.get("SAN_QUICK") == "1"
DIRS = os.environ.get("SAN_DIRS", "fwd,bwd").split(",")
n = 0
for d in (64,) if QUICK else (64, 128, 256):
    for direction in DIRS:
        for causal, window in (("", (16, 8)), ("bottom_right", (40, None))):
            for n_q, n_k in ((113, 300),) if QUICK else ((113, 300), (300, 113)):
                plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="bfloat16", sram=227 * 1024,
                                 heads=2, direction=direction, causal=causal, window=window)
                inputs, _ = launch.make_device_inputs(plan, seed=1)
                for counting in (True, False):
                    launch.run_plan(plan, inputs, counting=counting)
                    n += 1
cp.cuda.runtime.deviceSynchronize()
print("ran", n)
