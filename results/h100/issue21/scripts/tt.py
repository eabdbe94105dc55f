import sys
import numpy as np, cupy as cp
from iokernels.plan.fast import make_fast_plan
from iokernels.plan.variants import with_causal
from iokernels.kernels import launch
def tf(plan):
    dev, _ = launch.make_device_inputs(plan, seed=1)
    tot, _ = launch.time_plan(plan, dev, repeats=20)
    return 4 * plan.bh * plan.N_q * plan.N_k * plan.d * (0.5 if plan.causal else 1) / tot / 1e12
for d, br, bc in ((64, 128, 128), (64, 192, 128), (128, 128, 128), (96, 128, 128), (256, 128, 64)):
    for n, b in ((4096, 4), (16384, 1)):
        for causal in ("", "bottom_right"):
            try:
                t = tf(with_causal(make_fast_plan(N_q=n, d=d, dtype="float16", batch=b, heads=16, kernel="tma", block_r=br, block_c=bc), causal))
                print(f"{sys.argv[1]} d {d} {br}x{bc} N {n} {'causal' if causal else 'full'}: {t:6.1f}", flush=True)
            except Exception as e:
                print(f"{sys.argv[1]} d {d} {br}x{bc}: {repr(e)[:80]}")
