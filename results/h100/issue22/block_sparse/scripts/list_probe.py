"""Development probe (plan level, CUDA-graph replays of the plain build, launch.time_plan): the block-sparse tma forward
as a persistent grid taking the host's list of its items, balanced by their kept tiles (ITEM_LIST, the default since
this commit) against a block per item (the default before; in bands of heads when causal), the same tiles and mask
(random 25 % of 128 x 128 blocks, N 16384, B 1, H 16), alternating, three rounds; TFLOP/s on the kept blocks' visible
elements; the two O bitwise equal."""
from dataclasses import replace

import cupy as cp

from iokernels.kernels import launch
from iokernels.kernels.timing import time_plan
from iokernels.plan import make_plan, pair_sums
from iokernels.plan.masks import pattern
from iokernels.plan.variants import band_params


def per_item(plan):
    """The same plan as a block per item (grid (T_r, 1, BH); causal: in bands of heads)."""
    stage = plan.stages[0]
    params = tuple(p for p in stage.params if p[0] not in ("PERSISTENT", "ITEM_LIST"))
    stage = replace(stage, params=params, grid=(plan.tile["Tr"], 1, plan.bh))
    return replace(plan, stages=(replace(stage, params=(*params, *(band_params(stage) if plan.causal else ()))),))


n = 16384
mask = pattern("random", 0.25, n_q=n, n_k=n)
for d in (64, 128):
    for causal in ("", "bottom_right"):
        listed = make_plan("flash", "fast", N_q=n, d=d, dtype="float16", sram=227 * 1024, heads=16, causal=causal,
                           block_mask=mask)
        assert dict(listed.stages[0].params).get("ITEM_LIST"), listed.stages[0].params
        plans = {"list": listed, "per item": per_item(listed)}
        inputs, _ = launch.make_device_inputs(listed, seed=0)
        outs = {k: cp.asnumpy(launch.run_plan(p, inputs, counting=False).buffers["O"]) for k, p in plans.items()}
        same = (outs["list"].view("u2") == outs["per item"].view("u2")).all()
        flops = 4 * d * pair_sums(listed)["A_S"] * listed.bh  # (the kept tile pairs' area, as computed)
        times = {k: [] for k in plans}
        for _ in range(3):
            for k, p in plans.items():
                times[k].append(time_plan(p, inputs, repeats=7, warmup=2)[0])
        line = " ".join(f"{k} {min(v) * 1e3:.4f} ms ({flops / min(v) / 1e12:.1f} TFLOP/s computed; "
                        f"{' '.join(f'{x * 1e3:.4f}' for x in v)})" for k, v in times.items())
        print(f"block-sparse 25% {causal or 'no mask'} N {n} H 16 d {d}: {line}; list/per item "
              f"{min(times['per item']) / min(times['list']):.3f}x; O bitwise equal {bool(same)}", flush=True)
