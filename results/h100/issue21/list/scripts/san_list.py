"""The causal tma forward's persistent list grid (ITEM_LIST) under compute-sanitizer: small shapes, both alignments,
N_q != N_k, grouped-query, d 64 / 128 / 256, the counting build (counters == the model) and the plain one."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.model.hbm import exact
from iokernels.plan import with_causal
from iokernels.plan.fast import make_fast_plan

n = 0
for d in (64, 128, 256):
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
cp.cuda.runtime.deviceSynchronize()
print("ran", n, "launches; counters == model on every counting one")
