"""The tma forward's persistent grid with three consumer warpgroups (B_r 192, plan.fast.with_wide_persistent) under
compute-sanitizer: dense d 64 and 32 (HEAD_D_TILE 64), ragged N, grouped-query, several items a block (the full grid
and grids cut to 3 and 1 blocks), counting and plain builds. Run as `compute-sanitizer --tool
memcheck|racecheck|synccheck python3 results/h200/issue22/scripts/san_wide_persistent.py`."""
import dataclasses

import cupy as cp

from iokernels.kernels import launch
from iokernels.plan import make_plan

n = 0
for problem in (dict(N_q=1000, N_k=2000, d=64, dtype="float16", heads=8, kv_heads=2),
                dict(N_q=193, d=32, dtype="bfloat16", batch=2, heads=8)):
    plan = make_plan("flash", "fast", sram=227 * 1024, **problem)
    assert dict(plan.stage("main").params).get("PERSISTENT") == 1 and plan.tile["Br"] == 192
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    for blocks in (None, 3, 1):
        run = plan if blocks is None else dataclasses.replace(
            plan, stages=(dataclasses.replace(plan.stage("main"), grid=(blocks, 1, 1)),))
        for counting in (True, False):
            launch.run_plan(run, inputs, counting=counting)
            cp.cuda.runtime.deviceSynchronize()
            n += 1
print("ran", n)
