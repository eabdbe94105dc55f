"""Document masking's forward at d 64: B_r 192 (the variable-length default) against 128, the main stage alone in
CUDA-graph replays (kernels.timing.time_plan, median of 20), 8 documents of 2048 and 8 of 1000..3000 in one head
group of B 1, H 16, fp16; TFLOP/s on the visible elements."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.kernels.timing import time_plan
from iokernels.plan.varlen import make_documents_plan

for docs in ((2048,) * 8, (1000, 3000, 1500, 2500, 2048, 1800, 2200, 2336)):
    for causal in (False, True):
        vis = sum(x * (x + 1) // 2 if causal else x * x for x in docs)
        for br in (192, 128, 192, 128):
            plan = make_documents_plan(docs, d=64, dtype="float16", heads=16, causal=causal, block_r=br)
            inputs, _ = launch.make_device_inputs(plan, seed=0)
            _, st = time_plan(plan, inputs, repeats=20)
            print(f"docs {'8x2048' if len(set(docs)) == 1 else 'mixed '} causal {causal!s:5s} B_r {br}: "
                  f"{4 * 16 * 64 * vis / st['main'] / 1e12:6.1f} TFLOP/s", flush=True)
