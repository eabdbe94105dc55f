"""Document masking's kernels (flash_tma.cu and flash_tma_bwd.cu built with VARLEN and VARLEN_HEAD_MAJOR) under
compute-sanitizer: empty, one-row and ragged documents, causal or not, grouped-query, d 64, 128, 256, forward and
backward, counting and plain builds. Run as `compute-sanitizer --tool memcheck|racecheck|synccheck|initcheck python3
results/h100/issue22/documents/scripts/san_docs.py`."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.plan.varlen import make_documents_plan

plans = []
for direction in ("fwd", "bwd"):
    for documents, d, causal in (((1, 113, 0, 239), 64, False), ((300, 17, 129), 128, True),
                                 ((130, 1, 257), 256, True)):
        plans.append(make_documents_plan(documents, d=d, dtype="float16", batch=2, heads=2, kv_heads=1,
                                         causal=causal, direction=direction))
n = 0
for plan in plans:
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    for counting in (True, False):
        launch.run_plan(plan, inputs, counting=counting)
        cp.cuda.runtime.deviceSynchronize()
        n += 1
print("ran", n)
