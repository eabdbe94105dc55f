"""Development probe (plan level, CUDA-graph replays of the plain build, launch.time_plan): the causal tma forward with
dropout 0.1 as the list's persistent grid (ITEM_LIST, the default since this commit) against a block per item in
bands of heads (the default before), the same tiles, alternating, three rounds; O bitwise equal."""
from dataclasses import replace

from iokernels.kernels import launch
from iokernels.kernels.timing import time_plan
from iokernels.plan import make_plan, visible_area
from iokernels.plan.dropout import Dropout
from iokernels.plan.variants import band_params


def per_item(plan):
    stage = plan.stages[0]
    params = tuple(p for p in stage.params if p[0] not in ("PERSISTENT", "ITEM_LIST"))
    stage = replace(stage, params=params, grid=(plan.tile["Tr"], 1, plan.bh))
    return replace(plan, stages=(replace(stage, params=(*params, *band_params(stage))),))


for n, batch in ((4096, 4), (16384, 1)):
    for d in (64, 128):
        listed = make_plan("flash", "fast", N_q=n, d=d, dtype="float16", sram=227 * 1024, batch=batch, heads=16,
                           causal=True, dropout=Dropout(0.1, 7, 0))
        assert dict(listed.stages[0].params).get("ITEM_LIST"), listed.stages[0].params
        plans = {"list": listed, "per item": per_item(listed)}
        inputs, _ = launch.make_device_inputs(listed, seed=0)
        outs = {k: launch.run_plan(p, inputs, counting=False).buffers["O"].get() for k, p in plans.items()}
        same = outs["list"].tobytes() == outs["per item"].tobytes()
        flops = 4 * d * visible_area(n, n, listed.causal, None) * listed.bh
        times = {k: [] for k in plans}
        for _ in range(3):
            for k, p in plans.items():
                times[k].append(time_plan(p, inputs, repeats=7, warmup=2)[0])
        line = " ".join(f"{k} {min(v) * 1e3:.4f} ms ({flops / min(v) / 1e12:.1f} TFLOP/s)" for k, v in times.items())
        print(f"causal dropout 0.1 N {n} B {batch} H 16 d {d} fp16: {line}; list/per item "
              f"{min(times['per item']) / min(times['list']):.3f}x; O bitwise equal {same}", flush=True)
