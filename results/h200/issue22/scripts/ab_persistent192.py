"""Issue #22 (the d 64 forward's short items): the tma forward at d 64 (and 32) in 192 x 128 tiles on a persistent grid
(PERSISTENT with three consumer warpgroups) against a block per item (the default) and the 128 x 128 persistent grid,
plan level, CUDA-graph replays (kernels.timing.time_plan), alternating, ROUNDS rounds, best and median; the dense
forward, fp16, 16 heads, B·N = 16384 rows a head (N 512 ... 16384); O of each plan against the default's. Run from the
repository root with PYTHONPATH=.."""
import os
import statistics

import cupy as cp
import numpy as np

from iokernels.kernels.launch import run_plan
from iokernels.kernels.timing import time_plan
from iokernels.plan.fast import make_fast_plan

ROUNDS, H = int(os.environ.get("ROUNDS", "4")), 16
rng = cp.random.default_rng(0)


def rnd(*shape):
    return rng.standard_normal(shape, dtype=cp.float32).astype(cp.float16)


for d in (64, 32):
    for n in ((512, 1024, 2048, 4096, 16384) if d == 64 else (2048, 16384)):
        batch = 16384 // n
        inputs = {"Q": rnd(batch * H, n, d), "K": rnd(batch * H, n, d), "V": rnd(batch * H, n, d)}
        common = dict(N_q=n, d=d, dtype="float16", batch=batch, heads=H, kernel="tma")
        plans = {"192 per item": make_fast_plan(**common),
                 "192 persistent": make_fast_plan(**common, persistent=True),
                 "128 persistent": make_fast_plan(**common, block_r=128, persistent=True)}
        outs = {k: cp.asnumpy(run_plan(p, inputs, counting=False).buffers["O"]).astype(np.float64)
                for k, p in plans.items()}
        got = {k: [] for k in plans}
        for _ in range(ROUNDS):
            for k, p in plans.items():
                got[k].append(time_plan(p, inputs, repeats=10, warmup=2)[0])
        flops = 4.0 * d * batch * H * n * n
        base = "192 per item"
        for k, seconds in got.items():
            diff = np.abs(outs[k] - outs[base]).max() / np.abs(outs[base]).max()
            median = statistics.median(got[base]) / statistics.median(seconds)
            print(f"d {d} B {batch:2d} N {n:5d} {k:15s} grid {plans[k].stage('main').grid}: best "
                  f"{flops / min(seconds) / 1e12:6.1f} median {flops / statistics.median(seconds) / 1e12:6.1f} "
                  f"TFLOP/s, {min(got[base]) / min(seconds):.3f}x ({median:.3f}x "
                  f"median); O rel diff {diff:.1e}", flush=True)
