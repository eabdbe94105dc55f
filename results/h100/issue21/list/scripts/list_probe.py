"""Development probe (plan level, CUDA-graph replays of the plain build, launch.time_plan; not a user-facing figure):
the causal tma forward as a persistent grid taking the host's list of items (ITEM_LIST, the default since this
commit) against one block per item in bands of heads (the default before), the same tiles, alternating, three rounds;
the two O bitwise equal (each item's work does not depend on the block that takes it)."""
import sys
from dataclasses import replace

import cupy as cp

from iokernels.kernels import launch
from iokernels.kernels.timing import time_plan
from iokernels.plan import visible_area, with_causal
from iokernels.plan.fast import make_fast_plan
from iokernels.plan.variants import band_params


def per_item(plan):
    """The same plan as a block per item (grid (T_r, 1, BH)), in bands of heads as before."""
    stage = plan.stages[0]
    params = tuple(p for p in stage.params if p[0] not in ("PERSISTENT", "ITEM_LIST"))
    stage = replace(stage, params=params, grid=(plan.tile["Tr"], 1, plan.bh))
    return replace(plan, stages=(replace(stage, params=(*params, *band_params(stage))),))


cases = [(4096, 4, 64), (4096, 4, 128), (16384, 1, 64), (16384, 1, 128), (4096, 4, 256)]
if len(sys.argv) > 1:
    cases = cases[: int(sys.argv[1])]
for n, batch, d in cases:
    for dtype in ("float16", "bfloat16"):
        listed = with_causal(make_fast_plan(N_q=n, d=d, dtype=dtype, batch=batch, heads=16, kernel="tma", causal=True),
                             True)
        assert dict(listed.stages[0].params).get("ITEM_LIST"), listed.stages[0].params
        plans = {"list": listed, "per item": per_item(listed)}
        inputs, _ = launch.make_device_inputs(listed, seed=0)
        outs = {k: cp.asnumpy(launch.run_plan(p, inputs, counting=False).buffers["O"]) for k, p in plans.items()}
        same = (outs["list"].view("u2") == outs["per item"].view("u2")).all()
        flops = 4 * d * visible_area(n, n, listed.causal, None) * listed.bh
        times = {k: [] for k in plans}
        for _ in range(3):
            for k, p in plans.items():
                times[k].append(time_plan(p, inputs, repeats=7, warmup=2)[0])
        line = " ".join(f"{k} {min(v) * 1e3:.4f} ms ({flops / min(v) / 1e12:.1f} TFLOP/s; "
                        f"{' '.join(f'{x * 1e3:.4f}' for x in v)})" for k, v in times.items())
        print(f"causal N {n} B {batch} H 16 d {d} {dtype}: {line}; list/per item "
              f"{min(times['per item']) / min(times['list']):.3f}x; O bitwise equal {bool(same)}", flush=True)
