"""The variable-length kernels (flash_tma.cu and flash_tma_bwd.cu built with VARLEN, and the backward's row-wise
stages over the packed rows) under compute-sanitizer: the sanitizer cases of iokernels.analysis.sanitize_cases whose
plan is a variable-length one, every shape, counting and plain builds. Run as `compute-sanitizer --tool
memcheck|racecheck|synccheck|initcheck python3 results/h100/issue23/varlen/scripts/san_varlen.py`."""
import cupy as cp

from iokernels.analysis.sanitize_cases import variants
from iokernels.kernels import launch

n = 0
for v in variants():
    if v.plan.varlen is not None:
        inputs, _ = launch.make_device_inputs(v.plan, seed=1)
        launch.run_plan(v.plan, inputs, counting=v.counting)
        n += 1
cp.cuda.runtime.deviceSynchronize()
print("ran", n)
