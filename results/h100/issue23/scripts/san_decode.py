"""The split-KV decode's kernels (flash_tma.cu with SPLIT, combine.cu; the packed persistent forward) under
compute-sanitizer: the sanitizer cases of iokernels.analysis.sanitize_cases whose plan is a decode plan, every shape,
counting and plain builds. Run as `compute-sanitizer --tool memcheck|racecheck|synccheck|initcheck python3
results/h100/issue23/scripts/san_decode.py`."""
import cupy as cp

from iokernels.analysis.sanitize_cases import variants
from iokernels.kernels import launch
from iokernels.plan.decode import DECODE_VARIANTS

n = 0
for v in variants():
    if v.plan.variant in DECODE_VARIANTS:
        inputs, _ = launch.make_device_inputs(v.plan, seed=1)
        launch.run_plan(v.plan, inputs, counting=v.counting)
        n += 1
cp.cuda.runtime.deviceSynchronize()
print("ran", n)
