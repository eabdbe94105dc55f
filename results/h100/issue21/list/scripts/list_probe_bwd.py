"""Development probe (plan level, CUDA-graph replays of the plain build, timing.time_plan: the prep, main and dq
stages; not a user-facing figure): the causal tma backward as a persistent grid taking the host's list of items
(ITEM_LIST) against one block per (key block, K/V head) in bands of heads (the default before), the same tiles,
alternating, three rounds; dK and dV bitwise equal (a key block's work does not depend on the block that takes it),
dQ (added by the copy engine in another order) within 1e-2 relative."""
import os
from dataclasses import replace

import cupy as cp
import numpy as np

from iokernels.kernels import launch
from iokernels.kernels.timing import time_plan
from iokernels.plan import make_plan, visible_area
from iokernels.plan.variants import band_params


def per_item(plan):
    """The same plan as a block per item (grid (T_c, 1, BH_kv)), in bands of heads as before."""
    stages = []
    for stage in plan.stages:
        if stage.name == "main":
            params = tuple(p for p in stage.params if p[0] != "ITEM_LIST")
            stage = replace(stage, params=params, grid=(plan.tile["Tc"], 1, plan.bh_kv))
            stage = replace(stage, params=(*params, *band_params(stage)))
        stages.append(stage)
    return replace(plan, stages=tuple(stages))


CASES = [(4096, 4, 64), (4096, 4, 128), (16384, 1, 64), (16384, 1, 128), (4096, 4, 96)]
DS = [int(x) for x in os.environ.get("PROBE_D", "64,128,96").split(",")]  # the head dims to run, in CASES' order
for n, batch, d in [c for c in CASES if c[2] in DS]:
    for dtype in os.environ.get("PROBE_DTYPES", "float16,bfloat16").split(","):
        listed = make_plan("flash", "fast", N_q=n, d=d, dtype=dtype, sram=227 * 1024, batch=batch, heads=16,
                           causal=True, direction="bwd")
        assert dict(listed.stage("main").params).get("ITEM_LIST"), listed.stage("main").params
        plans = {"list": listed, "per item": per_item(listed)}
        inputs, _ = launch.make_device_inputs(listed, seed=0)
        outs = {k: {t: cp.asnumpy(launch.run_plan(p, inputs, counting=False).buffers[t]) for t in ("dK", "dV", "dQ")}
                for k, p in plans.items()}
        same = all((outs["list"][t].view("u2") == outs["per item"][t].view("u2")).all() for t in ("dK", "dV"))
        a, b = (outs[k]["dQ"].astype(np.float32) for k in plans)
        dq_rel = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
        flops = 2.5 * 4 * d * visible_area(n, n, listed.causal, None) * listed.bh
        times = {k: [] for k in plans}
        for _ in range(3):
            for k, p in plans.items():
                times[k].append(time_plan(p, inputs, repeats=7, warmup=2)[0])
        line = " ".join(f"{k} {min(v) * 1e3:.4f} ms ({flops / min(v) / 1e12:.1f} TFLOP/s; "
                        f"{' '.join(f'{x * 1e3:.4f}' for x in v)})" for k, v in times.items())
        print(f"causal bwd N {n} B {batch} H 16 d {d} {dtype}: {line}; list/per item "
              f"{min(times['per item']) / min(times['list']):.3f}x; dK dV bitwise equal {bool(same)}; dQ max rel "
              f"diff {dq_rel:.2e}", flush=True)
