"""The variable-length kernels (flash_tma.cu and flash_tma_bwd.cu built with VARLEN, and the backward's row-wise
stages over the packed rows) under compute-sanitizer: the sanitizer cases of iokernels.analysis.sanitize_cases whose
plan is a variable-length one, every shape, counting and plain builds. Run as `compute-sanitizer --tool
memcheck|racecheck|synccheck|initcheck python3 results/h100/issue23/varlen/scripts/san_varlen.py [--quick]` (each
launch printed as it completes)."""
import sys
import time

import cupy as cp

from iokernels.analysis.sanitize_cases import variants
from iokernels.kernels import launch

QUICK = len(sys.argv) > 1 and sys.argv[1] == "--quick"  # the quick cases (one shape)
n, start = 0, time.monotonic()
for v in variants(QUICK):
    if v.plan.varlen is not None:
        inputs, _ = launch.make_device_inputs(v.plan, seed=1)
        launch.run_plan(v.plan, inputs, counting=v.counting)
        cp.cuda.runtime.deviceSynchronize()
        n += 1
        print(f"{time.monotonic() - start:7.1f} s  {v.label}", flush=True)
cp.cuda.runtime.deviceSynchronize()
print("ran", n)
