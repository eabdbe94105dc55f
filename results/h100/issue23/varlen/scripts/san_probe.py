"""Which backward launch hangs under compute-sanitizer (checks3.sh: synccheck and racecheck stopped at the first varlen
backward, memcheck at the fourth): one plan per run, named on the command line. `dense`: the dense tma backward at d 64
(113 queries, 17 keys); `varlen-aligned`: the varlen backward with every sequence a multiple of B_r (no tail block);
`varlen-tail`: the sanitizer case's lengths (1, 113, 0, 130) / (1, 17, 7, 130); `dense-steps`: the dense tma backward
with eight steps per key block (N_q 1000, N_k 128). Then `count` or `plain`."""
import sys
import time

import cupy as cp

from iokernels.kernels import launch
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.varlen import make_varlen_plan

which, build = sys.argv[1], sys.argv[2]
if which == "dense":
    plan = make_fast_backward_plan(N_q=113, N_k=17, d=64, dtype="float16", batch=1, heads=2, kernel="tma")
elif which == "dense-steps":  # eight query blocks per key block: each ring stage reused
    plan = make_fast_backward_plan(N_q=1000, N_k=128, d=64, dtype="float16", batch=1, heads=1, kernel="tma")
elif which == "varlen-aligned":
    plan = make_varlen_plan(d=64, dtype="float16", heads=4, kv_heads=2, lengths_q=(128, 256), lengths_k=(128, 256),
                            direction="bwd")
else:
    plan = make_varlen_plan(d=64, dtype="float16", heads=4, kv_heads=2, lengths_q=(1, 113, 0, 130),
                            lengths_k=(1, 17, 7, 130), direction="bwd")
inputs, _ = launch.make_device_inputs(plan, seed=1)
start = time.monotonic()
launch.run_plan(plan, inputs, counting=build == "count")
cp.cuda.runtime.deviceSynchronize()
print(f"{which} {build}: {time.monotonic() - start:.1f} s", flush=True)
