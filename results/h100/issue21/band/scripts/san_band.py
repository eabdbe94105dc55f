"""The causal tma forward and backward with HEAD_BAND under compute-sanitizer: bands of 2, 3 and 6 of 6 heads, both
alignments, N_q != N_k, fp16 and bf16, d 64, 128 (forward and backward) and 256 (wide backward), counting and plain
builds. SAN_BANDS: the bands to run, comma-separated ("none": HEAD_BAND removed); 2,3,6 by default. SAN_REPEAT: runs of
each launch (1); SAN_COUNTING_ONLY=1: the counting builds only."""
import os
from dataclasses import replace

import cupy as cp

from iokernels.kernels import launch
from iokernels.plan import make_plan

n = 0
for d in (64, 128, 256):
    for direction in ("fwd", "bwd"):
        if d == 256 and direction == "fwd":
            continue
        for causal, (n_q, n_k) in (("bottom_right", (300, 517)), ("top_left", (517, 300))):
            plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="bfloat16" if d == 128 else "float16",
                             sram=227 * 1024, batch=2, heads=3, direction=direction, causal=causal)
            assert "HEAD_BAND" in dict(plan.stage("main").params), plan.stage("main")
            inputs, _ = launch.make_device_inputs(plan, seed=1)
            for band in [None if b == "none" else int(b) for b in os.environ.get("SAN_BANDS", "2,3,6").split(",")]:
                def params(s, band=band):
                    return tuple((k, band if k == "HEAD_BAND" else v) for k, v in s.params if band or k != "HEAD_BAND")
                p = replace(plan, stages=tuple(replace(s, params=params(s)) for s in plan.stages))
                for counting in (True,) if os.environ.get("SAN_COUNTING_ONLY") == "1" else (True, False):
                    for _ in range(int(os.environ.get("SAN_REPEAT", "1"))):
                        launch.run_plan(p, inputs, counting=counting)
                        n += 1
cp.cuda.runtime.deviceSynchronize()
print("ran", n)
