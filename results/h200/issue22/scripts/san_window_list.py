"""The sliding window's backward on the persistent list grid (ITEM_LIST with WINDOW, flash_tma_bwd.cu) under
compute-sanitizer: small shapes, windows bounded on one side or both, with and without the causal mask, N_q != N_k,
grouped-query, d 64 and 128, the counting build (counters == the model) and the plain one."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.model.hbm import exact
from iokernels.plan import make_plan

n = 0
for d in (64, 128):
    for causal, window in (("", (40, 0)), ("", (30, 70)), ("bottom_right", (100, None)), ("top_left", (None, 20))):
        for n_q, n_k, kv in ((113, 300, 1), (300, 140, 2)):
            plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * 1024, batch=2,
                             heads=2, kv_heads=kv, causal=causal, window=window, direction="bwd")
            assert dict(plan.stage("main").params).get("ITEM_LIST") and dict(plan.stage("main").params).get("WINDOW")
            inputs, _ = launch.make_device_inputs(plan, seed=1)
            run = launch.run_plan(plan, inputs, counting=True)
            assert run.counts == exact(plan), (plan.label, run.counts, exact(plan))
            launch.run_plan(plan, inputs, counting=False)
            n += 2
cp.cuda.runtime.deviceSynchronize()
print("ran", n, "launches; counters == model on every counting one")
