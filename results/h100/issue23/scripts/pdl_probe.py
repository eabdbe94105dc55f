"""Issue #23 probe: the split-KV decode's main + combine, the combine launched as a programmatic dependent launch (PDL,
the plan's) or plainly (the same plan without the PDL parameter), CUDA-graph replays (kernels.timing.time_plan) over
one cache, beside each stage alone. Usage: python3 results/h100/issue23/scripts/pdl_probe.py"""

from dataclasses import replace

import cupy as cp

from iokernels.kernels import launch, timing
from iokernels.plan.decode import make_decode_plan

for b, h, hkv, nk in [(1, 64, 8, 4096), (1, 8, 8, 4096), (1, 64, 8, 16384), (4, 64, 8, 4096), (1, 64, 8, 131072)]:
    plan = make_decode_plan(N_q=1, N_k=nk, d=128, dtype="float16", batch=b, heads=h, kv_heads=hkv)
    main, combine = plan.stages
    plain = replace(plan, stages=(main, replace(combine, params=tuple(p for p in combine.params if p[0] != "PDL"))))
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    row = []
    for label, p in (("pdl", plan), ("plain", plain), ("pdl", plan), ("plain", plain)):
        total, stages = timing.time_plan(p, inputs, repeats=20)
        row.append(f"{label} {total * 1e6:.2f}")
    cp.cuda.runtime.deviceSynchronize()
    print(f"B{b} H{h}/{hkv} N_k {nk} S={plan.tile['S']}: main {stages['main'] * 1e6:.2f} combine "
          f"{stages['combine'] * 1e6:.2f} | total us: {' '.join(row)}", flush=True)
