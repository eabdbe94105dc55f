"""The causal tma plans' persistent list grids (ITEM_LIST) under compute-sanitizer: small shapes, both alignments,
N_q != N_k, grouped-query, the forward at d 64 / 128 / 256 and the backward at d 64 / 96 / 128 (SAN_DIRECTIONS: fwd,
bwd or both), the counting build (counters == the model) and the plain one."""
import os

import cupy as cp

from iokernels.kernels import launch
from iokernels.model.hbm import exact
from iokernels.plan import make_plan, with_causal
from iokernels.plan.fast import make_fast_plan

n = 0
directions = os.environ.get("SAN_DIRECTIONS", "fwd,bwd").split(",")
for d in (64, 128, 256) if "fwd" in directions else ():
    for causal in ("bottom_right", "top_left"):
        for n_q, n_k in ((113, 17), (17, 300), (1, 1), (300, 300)):
            for kv in (2, 1):
                plan = with_causal(make_fast_plan(N_q=n_q, N_k=n_k, d=d, dtype="float16", batch=2, heads=2,
                                                  kv_heads=kv, kernel="tma", causal=True), causal)
                assert dict(plan.stages[0].params).get("ITEM_LIST")
                inputs, _ = launch.make_device_inputs(plan, seed=1)
                run = launch.run_plan(plan, inputs, counting=True)
                assert run.counts == exact(plan), (plan.label, run.counts, exact(plan))
                launch.run_plan(plan, inputs, counting=False)
                n += 2
for d in (64, 96, 128) if "bwd" in directions else ():
    for causal in ("bottom_right", "top_left"):
        for n_q, n_k in ((113, 17), (17, 300), (1, 1), (300, 300)):
            for kv in (2, 1):
                plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * 1024, batch=2,
                                 heads=2, kv_heads=kv, causal=causal, direction="bwd")
                assert dict(plan.stage("main").params).get("ITEM_LIST")
                inputs, _ = launch.make_device_inputs(plan, seed=1)
                run = launch.run_plan(plan, inputs, counting=True)
                assert run.counts == exact(plan), (plan.label, run.counts, exact(plan))
                launch.run_plan(plan, inputs, counting=False)
                n += 2
cp.cuda.runtime.deviceSynchronize()
print("ran", n, "launches; counters == model on every counting one")
