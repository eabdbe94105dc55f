import cupy as cp
from iokernels.kernels import launch
from iokernels.plan.dropout import Dropout
from iokernels.plan.fast import make_fast_plan
from iokernels.plan.variants import with_causal, with_dropout
n = 0
for d, br, bc in ((64, 192, 128), (64, 128, 128), (96, 128, 128), (256, 128, 64), (160, 128, 64), (128, 128, 128)):
    for variant in ("", "bottom_right", "top_left", "dropout"):
        for n_q, n_k in ((113, 17), (17, 300), (1, 1)):
            plan = make_fast_plan(N_q=n_q, N_k=n_k, d=d, dtype="float16", batch=1, heads=2, kernel="tma", block_r=br, block_c=bc)
            plan = with_dropout(plan, Dropout(0.1, 7, 3)) if variant == "dropout" else with_causal(plan, variant)
            inputs, _ = launch.make_device_inputs(plan, seed=1)
            for counting in (True, False):
                launch.run_plan(plan, inputs, counting=counting)
                n += 1
cp.cuda.runtime.deviceSynchronize()
print("ran", n)
