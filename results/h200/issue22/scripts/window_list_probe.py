"""Development probe (plan level, CUDA-graph replays of the plain build, timing.time_plan: the prep, main and dq
stages; not a user-facing figure): the sliding window's backward (window 1024 to the left, N 16384, B 1, H 16, fp16)
on the persistent grid of its list of items (ITEM_LIST) against the same plan as a block per item (the default
before), alternating, two rounds; and the dense backward of the same shape, for the rate on the computed blocks
(TFLOP/s counted on the tiles each plan computes, plan.pair_sums). dK and dV bitwise equal; dQ within 1e-2. The inputs
are random on the device (O random, lse 30: finite probabilities; the time does not depend on the values), not
launch.make_device_inputs, whose float64 reference P of 16 heads of 16384² took the host's memory. Since 6312ab6
(after w2, whose output lacks it) it also prints each stage's time alone (CUDA-graph replays of the stage), to show
what the O(N d) passes cost."""
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, ".")
from iokernels.kernels import launch
from iokernels.kernels.timing import time_plan
from iokernels.plan import make_plan, pair_sums
from tests.gpu.helpers import per_item

for d in (64, 128):
    kw = dict(N_q=16384, d=d, dtype="float16", sram=227 * 1024, batch=1, heads=16, direction="bwd")
    listed = make_plan("flash", "fast", window=(1024, 0), **kw)
    assert dict(listed.stage("main").params).get("ITEM_LIST")
    plans = {"list": listed, "per item": per_item(listed), "dense": make_plan("flash", "fast", **kw)}
    rng = cp.random.default_rng(0)
    inputs = {n: rng.standard_normal((16, 16384, d), dtype=cp.float32).astype(cp.float16)
              for n in ("Q", "K", "V", "dO")}
    inputs["O"] = (rng.standard_normal((16, 16384, d), dtype=cp.float32) * 0.1).astype(cp.float16)
    inputs["lse"] = cp.full((16, 16384), 30.0, dtype=cp.float32)
    outs = {k: {t: cp.asnumpy(launch.run_plan(plans[k], inputs, counting=False).buffers[t]).view(np.uint16)
                for t in ("dK", "dV", "dQ")} for k in ("list", "per item")}
    same = all((outs["list"][t] == outs["per item"][t]).all() for t in ("dK", "dV"))
    a, b = (outs[k]["dQ"].view(np.float16).astype(np.float32) for k in ("list", "per item"))
    dq_rel = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    area = {k: pair_sums(p)["A_S"] for k, p in plans.items()}  # the S elements of the computed tiles, per head
    times, stages = {k: [] for k in plans}, {k: {} for k in plans}
    for _ in range(2):
        for k, p in plans.items():
            total, each = time_plan(p, inputs, repeats=7, warmup=2)
            times[k].append(total)
            for name, sec in each.items():  # each stage alone: prep, main, dq (the fastest round's)
                stages[k][name] = min(stages[k].get(name, sec), sec)
    best = {k: min(v) for k, v in times.items()}
    rate = {k: 2.5 * 4 * d * area[k] * 16 / best[k] / 1e12 for k in plans}  # TFLOP/s on the computed tiles
    text = " ".join(f"{k} {best[k] * 1e3:.4f} ms, {rate[k]:.1f} TFLOP/s computed "
                    f"({' '.join(f'{x * 1e3:.4f}' for x in v)})" for k, v in times.items())
    print(f"window (1024, 0) bwd N 16384 B 1 H 16 d {d} fp16: {text}; per item / list "
          f"{best['per item'] / best['list']:.3f}x; dK dV bitwise equal {bool(same)}; dQ max rel diff {dq_rel:.2e}; "
          f"list / dense on the computed tiles {rate['list'] / rate['dense']:.3f}x; stages alone (ms) "
          + "; ".join(f"{k}: " + " ".join(f"{n} {s * 1e3:.4f}" for n, s in v.items()) for k, v in stages.items()),
          flush=True)
