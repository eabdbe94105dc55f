"""A/B of the tensor-core kernels before and after the instruction cuts of 2026-11-28 (iok_exp2, wg_desc_add,
wg_index, the backward's lse in base 2 and its key_out branch): plan level, CUDA-graph replays (timing.time_plan: the
whole plan and each stage alone), the tree of the commit before (AB_BASE: a copy of its iokernels/ imported as package
iok_base) and this tree's, alternating, ROUNDS rounds; the best round of each. Outputs compared (max |a - b| over
max |b|). Inputs random on the device (the backward's O and lse from this tree's forward). Not a user-facing figure:
the public call's are `iokernels bench` (run_full.sh). AB_CASES=bwd (or fwd): one direction's cases."""
import importlib
import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.environ.get("AB_BASE", "ab_base"))
sys.path.insert(0, ".")
# AB_TREES: the packages compared, the last this tree's (iok_nolean: a copy of this tree with TB_LEAN off on the lists)
NAMES = os.environ.get("AB_TREES", "iok_base,iokernels").split(",")
trees = {name: {m: importlib.import_module(f"{name}.{m}") for m in ("plan", "kernels.launch", "kernels.timing")}
         for name in NAMES}
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CASES = [  # direction, d, dtype, N, batch, heads, causal
    ("bwd", 128, "float16", 4096, 4, 16, False), ("bwd", 128, "bfloat16", 4096, 4, 16, False),
    ("bwd", 64, "float16", 4096, 4, 16, False), ("bwd", 128, "float16", 65536, 1, 4, True),
    ("fwd", 128, "float16", 4096, 4, 16, False), ("fwd", 64, "float16", 4096, 4, 16, False),
    ("fwd", 128, "float16", 65536, 1, 4, True),
]
ONLY = os.environ.get("AB_CASES")  # "bwd" or "fwd": that direction's cases only; "causal": the causal d 128 backwards
if ONLY == "causal":
    CASES = [("bwd", 128, "float16", 16384, 1, 16, True), ("bwd", 128, "bfloat16", 4096, 4, 16, True),
             ("bwd", 128, "float16", 4096, 4, 16, False)]
    ONLY = None
for direction, d, dtype, n, batch, heads, causal in CASES:
    if ONLY and direction != ONLY:
        continue
    bh = batch * heads
    kw = dict(N_q=n, d=d, dtype=dtype, sram=227 * 1024, batch=batch, heads=heads, causal=causal)
    to_device = trees["iokernels"]["kernels.launch"].to_device

    def rnd(shape=(bh, n, d), dtype=dtype, to_device=to_device):
        return to_device(cp.random.standard_normal(shape, dtype=cp.float32), dtype)

    inputs = {"Q": rnd(), "K": rnd(), "V": rnd()}
    if direction == "bwd":
        fwd = trees["iokernels"]["plan"].make_plan("flash", "fast", **kw)
        run = trees["iokernels"]["kernels.launch"].run_plan(fwd, inputs, counting=False)
        inputs.update(O=run.buffers["O"], lse=run.buffers["lse"], dO=rnd())
    plans = {name: t["plan"].make_plan("flash", "fast", direction=direction, **kw) for name, t in trees.items()}
    outs = {}
    for name, t in trees.items():
        r = t["kernels.launch"].run_plan(plans[name], inputs, counting=False)
        outs[name] = {k: np.asarray(cp.asnumpy(r.buffers[k])) for k in (("dQ", "dK", "dV") if direction == "bwd"
                                                                          else ("O", "lse"))}
    diffs = []
    for k, b in outs[NAMES[0]].items():
        a = outs[NAMES[-1]][k]
        if dtype == "bfloat16" and a.dtype == np.uint16:
            a, b = ((x.astype(np.uint32) << 16).view(np.float32) for x in (a, b))
        a, b = a.astype(np.float64), b.astype(np.float64)
        diffs.append(f"{k} {np.abs(a - b).max() / max(np.abs(b).max(), 1e-30):.2e}")
    best = {name: (float("inf"), {}) for name in trees}
    for _ in range(ROUNDS):
        for name, t in trees.items():
            total, each = t["kernels.timing"].time_plan(plans[name], inputs, repeats=10, warmup=2)
            if total < best[name][0]:
                best[name] = (total, each)
    flops = 4 * bh * n * n * d * (0.5 if causal else 1) * (2.5 if direction == "bwd" else 1)
    text = " | ".join(f"{name} {flops / tot / 1e12:6.1f} TFLOP/s {tot * 1e3:.4f} ms ("
                      + " ".join(f"{s} {v * 1e3:.4f}" for s, v in each.items()) + ")"
                      for name, (tot, each) in best.items())
    gain = " ".join(f"{best[NAMES[0]][0] / best[name][0]:.3f}x" for name in NAMES[1:])
    print(f"{direction} d {d} {dtype} N {n} B {batch} H {heads}{' causal' if causal else ''}: {text}; over {NAMES[0]} "
          f"{gain}; rel diff {' '.join(diffs)}", flush=True)
