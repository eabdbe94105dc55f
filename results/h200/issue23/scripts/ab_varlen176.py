"""Issue #23: the variable-length forward at d 128 without a mask in 128 x 176 tiles (the dense forward's) against 128 x
128 (the tree before, AB_BASE: a copy of its iokernels/ imported as package iok_base), plan level, CUDA-graph replays
(kernels.timing.time_plan), the two trees alternating, ROUNDS rounds, the best of each: bench --varlen's batch (64
sequences of lengths uniform in 1..8192, seed 0, 16 heads, fp16; TFLOP/s on the real tokens) and 8 documents of 2048
(head-major, 16 heads; TFLOP/s on the visible elements), beside the dense forward on 16 heads of 16384 and of the
batch's mean length. O compared (max |a - b| over max |b|). Run from the repository root with PYTHONPATH=.."""
import importlib
import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.environ.get("AB_BASE", "ab_base"))
sys.path.insert(0, ".")
NAMES = ("iok_base", "iokernels")
trees = {n: {m: importlib.import_module(f"{n}.{m}") for m in ("plan", "plan.varlen", "kernels.launch",
                                                                "kernels.timing")} for n in NAMES}
ROUNDS = int(os.environ.get("ROUNDS", "3"))
H, D = 16, 128
rng = cp.random.default_rng(0)


def rnd(*shape):
    return rng.standard_normal(shape, dtype=cp.float32).astype(cp.float16)


def ab(label, plans, inputs, flops):
    outs = {}
    for name, plan in plans.items():
        run = trees[name]["kernels.launch"].run_plan(plan, inputs, counting=False)
        outs[name] = cp.asnumpy(run.buffers["O"]).astype(np.float64)
    best = {name: float("inf") for name in plans}
    for _ in range(ROUNDS):
        for name, plan in plans.items():
            seconds, _ = trees[name]["kernels.timing"].time_plan(plan, inputs, repeats=10, warmup=2)
            best[name] = min(best[name], seconds)
    a, b = outs["iokernels"], outs["iok_base"]
    tiles = {name: f"{dict(p.tiles)['Br']}x{dict(p.tiles)['Bc']}" for name, p in plans.items()}
    print(f"{label}: " + " | ".join(f"{name} {tiles[name]} {best[name] * 1e3:.4f} ms {flops / best[name] / 1e12:6.1f} "
                                     "TFLOP/s" for name in plans)
          + f"; over iok_base {best['iok_base'] / best['iokernels']:.3f}x; O rel diff "
          f"{np.abs(a - b).max() / max(np.abs(b).max(), 1e-30):.2e}", flush=True)


lengths = [int(x) for x in np.random.default_rng(0).integers(1, 8193, 64)]
total = sum(lengths)
cu = cp.asarray(np.concatenate([[0], np.cumsum(lengths)]), dtype=cp.int32)
inputs = {"Q": rnd(total, H, D), "K": rnd(total, H, D), "V": rnd(total, H, D), "cu_seqlens_q": cu, "cu_seqlens_k": cu}
ab("varlen 64 x 1..8192", {n: t["plan.varlen"].make_varlen_plan(d=D, dtype="float16", heads=H, lengths_q=lengths)
                           for n, t in trees.items()}, inputs, 4.0 * D * H * sum(n * n for n in lengths))
docs = (2048,) * 8
cu = cp.asarray(np.concatenate([[0], np.cumsum(docs)]), dtype=cp.int32)
inputs = {"Q": rnd(H, 16384, D), "K": rnd(H, 16384, D), "V": rnd(H, 16384, D), "cu_seqlens_q": cu, "cu_seqlens_k": cu}
ab("8 documents of 2048", {n: t["plan.varlen"].make_documents_plan(docs, d=D, dtype="float16", heads=H)
                           for n, t in trees.items()}, inputs, 4.0 * D * H * sum(n * n for n in docs))
for n in (16384, max(128, round(total / 64 / 128) * 128)):
    inputs = {"Q": rnd(H, n, D), "K": rnd(H, n, D), "V": rnd(H, n, D)}
    plan = trees["iokernels"]["plan"].make_plan("flash", "fast", N_q=n, d=D, dtype="float16", sram=227 * 1024,
                                                heads=H)
    seconds, _ = trees["iokernels"]["kernels.timing"].time_plan(plan, inputs, repeats=10, warmup=2)
    print(f"dense N {n} H {H} ({dict(plan.tiles)['Br']}x{dict(plan.tiles)['Bc']}): {seconds * 1e3:.4f} ms "
          f"{4.0 * D * H * n * n / seconds / 1e12:6.1f} TFLOP/s", flush=True)
