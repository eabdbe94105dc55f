"""The programmable variants' kernels (flash_tma.cu and flash_tma_bwd.cu built with MASK_MOD / SCORE_MOD /
SCORE_GRAD) and mod_blocks.cu (a mask_mod's block levels) under compute-sanitizer: captured int32 and float32 arrays, a block mask made from the mask_mod (partial
and full blocks), ragged N, N_q != N_k, grouped-query, causal, counting and plain builds. Run as
`compute-sanitizer --tool memcheck|racecheck|synccheck python3 results/h100/issue22/mods/scripts/san_mods.py`."""
import cupy as cp
import numpy as np

from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.mods import check_mods, mod_block_mask

doc = np.minimum(np.arange(400) * 3 // 400, 2).astype(np.int32)
slopes = np.array([0.5, 0.25], np.float16)  # (a __half capture)
docs = check_mods(mask_mod="doc[q_idx] == doc[kv_idx]", score_mod="score - slopes[h] * abs(q_idx - kv_idx)",
                  score_grad="1.0f", captures={"doc": doc, "slopes": slopes})
cap = check_mods(score_mod="20.0f * tanhf(score / 20.0f)", score_grad="1.0f - tanhf(score / 20.0f) * tanhf(score / 20.0f)",
                 mask_mod="kv_idx < 50 || kv_idx <= q_idx")
band = check_mods(mask_mod="kv_idx <= q_idx && q_idx - kv_idx < 150")
runs = []
for direction in ("fwd", "bwd"):
    for n_q, n_k, d, causal, mods, caps, sparse in ((400, 400, 64, "bottom_right", docs, {"doc": doc, "slopes": slopes}, False),
                                                    (113, 300, 128, "", cap, {}, False),
                                                    (300, 300, 96, "", band, {}, True)):
        block_mask = mod_block_mask(mods, caps, n_q, n_k) if sparse else None
        plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * 1024, batch=2, heads=2,
                         kv_heads=1, causal=causal, mods=mods, capture_values=caps, block_mask=block_mask,
                         direction=direction)
        runs.append((plan, caps))
from iokernels.library.mods import gpu_block_levels

n = 0
for expr, caps in (("doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx", {"doc": doc}), ("kv_idx < 50 || kv_idx <= q_idx", {})):
    mods = check_mods(mask_mod=expr, captures=caps)  # kernels/mod_blocks.cu, ragged N_q
    for counting in (True, False):
        gpu_block_levels(mods, {k: cp.asarray(x) for k, x in caps.items()}, 300, 400, 128, counting=counting)
        cp.cuda.runtime.deviceSynchronize()
        n += 1
for plan, caps in runs:
    inputs, _ = launch.make_device_inputs(plan, seed=1, captures=caps)
    for counting in (True, False):
        launch.run_plan(plan, inputs, counting=counting)
        cp.cuda.runtime.deviceSynchronize()
        n += 1
print("ran", n)
