"""Explicit masks on the tma kernels (iokernels/library/explicit.py) under compute-sanitizer: a shared boolean mask
with causal and N_q != N_k, a per-head float16 one with grouped-query attention at d 128, a per-batch float32 one,
one whose batch dims the library copies, and two whose rows are 16-byte multiples (the forward stages them through
shared memory: a float16 one per batch and head with causal, a shared boolean one at d 128); forward and backward,
plain and counting builds. Prints one line per launch
pair; run as ``compute-sanitizer --tool memcheck python3 san_explicit.py`` from the repository root (PYTHONPATH=.)."""
import cupy as cp
import numpy as np

import iokernels

rng = np.random.default_rng(0)
CASES = [((2, 3), 3, 200, 333, 64, (200, 333), "bool", "bottom_right"),
         ((1, 4), 2, 239, 239, 128, (4, 239, 239), "float16", ""),
         ((2, 2), 2, 113, 300, 64, (2, 1, 113, 300), "float32", "top_left"),
         ((2, 3, 2), 2, 64, 129, 64, (2, 1, 2, 64, 129), "float16", ""),
         # rows of 16-byte multiples: staged through shared memory (MOD_STAGE; since MOD_TMA, loaded by the copy engine)
         ((2, 2), 2, 250, 512, 64, (2, 2, 250, 512), "float16", "bottom_right"),
         ((1, 4), 4, 130, 384, 128, (130, 384), "bool", ""),
         # (since MOD_TMA the two above load by the copy engine; a float32 mask at d 128 still by cp.async)
         ((1, 4), 2, 200, 264, 128, (4, 200, 264), "float32", "top_left")]
for lead, kv, n_q, n_k, d, shape, kind, causal in CASES:
    kv_lead = (*lead[:-1], kv)
    q, do = (cp.asarray(rng.standard_normal((*lead, n_q, d)).astype(np.float16)) for _ in range(2))
    k, v = (cp.asarray(rng.standard_normal((*kv_lead, n_k, d)).astype(np.float16)) for _ in range(2))
    keep = rng.random(shape) < 0.7
    mask = cp.asarray(keep if kind == "bool" else np.where(keep, rng.standard_normal(shape), -np.inf).astype(kind))
    for counting in (False, True):
        if counting:
            with iokernels.count_io() as records:
                o, lse = iokernels.attention(q, k, v, mask=mask, causal=causal, return_lse=True)
                g = iokernels.attention_backward(q, k, v, o, do, lse, mask=mask, causal=causal)
            kernels = sorted({r["kernel"] for r in records})
        else:
            o, lse = iokernels.attention(q, k, v, mask=mask, causal=causal, return_lse=True)
            g = iokernels.attention_backward(q, k, v, o, do, lse, mask=mask, causal=causal)
            kernels = "plain"
        cp.cuda.Device().synchronize()
        finite = bool(cp.isfinite(o).all()) and all(bool(cp.isfinite(x).all()) for x in g)
        print(f"ran {lead} {shape} {kind} causal={causal or 'none'} counting={counting} finite={finite} {kernels}",
              flush=True)
