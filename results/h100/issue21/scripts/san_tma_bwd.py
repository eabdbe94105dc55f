"""The tma backward (kernels/flash_tma_bwd.cu) under compute-sanitizer: d 64, 96, 128 at its default tiles and
64 x 64; plain, both causal alignments, dropout, grouped-query; ragged N; counting and plain builds. Run as
`compute-sanitizer --tool memcheck|racecheck|synccheck python3 results/h100/issue21/scripts/san_tma_bwd.py`.
SAN_DS="256,136": those d at their default tiles instead (d past 128: the wide tiles, flash_tma_bwd_wide)."""
import os

import cupy as cp

from iokernels.kernels import launch
from iokernels.plan.dropout import Dropout
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.variants import with_causal, with_dropout

QUICK = os.environ.get("SAN_QUICK") == "1"  # racecheck and synccheck: the default tiles at d 64 and 128, fewer cases
DS = [(int(d), {}) for d in os.environ.get("SAN_DS", "").split(",") if d]
n = 0
for d, tiles in DS or (((64, {}), (128, {})) if QUICK else ((64, {}), (128, {}), (96, {}), (64, {"block_r": 64, "block_c": 64}))):
    for variant in ("", "bottom_right", "dropout", "gqa") if QUICK else ("", "bottom_right", "top_left", "dropout", "gqa"):
        for n_q, n_k in ((113, 200),) if QUICK else ((113, 17), (17, 300), (1, 1)):
            heads, kv = (4, 2) if variant == "gqa" else (2, 2)
            kw = dict(N_q=n_q, N_k=n_k, d=d, dtype="bfloat16", batch=1, heads=heads, kv_heads=kv, kernel="tma", **tiles)
            if variant == "dropout":
                plan = with_dropout(make_fast_backward_plan(**kw, dropout=True), Dropout(0.1, 7, 3))
            else:
                plan = with_causal(make_fast_backward_plan(**kw), variant if variant != "gqa" else "")
            inputs, _ = launch.make_device_inputs(plan, seed=1)
            for counting in (True, False):
                launch.run_plan(plan, inputs, counting=counting)
                n += 1
cp.cuda.runtime.deviceSynchronize()
print("ran", n)
