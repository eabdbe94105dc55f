import cupy as cp
from iokernels.kernels import launch
from iokernels.plan.fast import make_fast_plan
from iokernels.plan.variants import with_causal
for d in (32, 96):
    for causal in ("", "bottom_right"):
        plan = with_causal(make_fast_plan(N_q=113, N_k=17, d=d, dtype="float16", batch=1, heads=2, kernel="tma"), causal)
        inputs, _ = launch.make_device_inputs(plan, seed=1)
        for counting in (True, False):
            launch.run_plan(plan, inputs, counting=counting)
cp.cuda.runtime.deviceSynchronize()
print("ran")
