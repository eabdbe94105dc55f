"""Issue #23 (and #22's documents): the variable-length forward's persistent grid (PERSISTENT, flash_tma.cu's
IOK_VARLEN_ITEMS) against a block per item, and in 128 x 176 tiles, plan level, CUDA-graph replays
(kernels.timing.time_plan), the plans alternating, ROUNDS rounds, the best of each; fp16, 16 heads, d 128 (64 for the
documents too): bench --varlen's batch (64 sequences of lengths uniform in 1..8192, seed 0; TFLOP/s on the real tokens),
the same batch causal, and 8 documents of 2048 (head-major; TFLOP/s on the visible elements), beside the dense forward
(its default plan) on bench --varlen's io-dense problem (64 sequences of the mean length, 4224) and on 16 heads of
16384. O of each plan compared with the block-per-item plan's (max |a - b| over max |b|). Run from the repository root
with PYTHONPATH=.."""
import os
from dataclasses import replace

import cupy as cp
import numpy as np

from iokernels.kernels.launch import run_plan
from iokernels.kernels.timing import time_plan
from iokernels.plan import make_plan
from iokernels.plan.varlen import make_documents_plan, make_varlen_plan

ROUNDS = int(os.environ.get("ROUNDS", "3"))
H = 16
rng = cp.random.default_rng(0)


def rnd(*shape):
    return rng.standard_normal(shape, dtype=cp.float32).astype(cp.float16)


def ab(label, plans, inputs, flops):
    outs = {name: cp.asnumpy(run_plan(plan, inputs, counting=False).buffers["O"]).astype(np.float64)
            for name, plan in plans.items()}
    best = {name: float("inf") for name in plans}
    for _ in range(ROUNDS):
        for name, plan in plans.items():
            best[name] = min(best[name], time_plan(plan, inputs, repeats=10, warmup=2)[0])
    base = next(iter(plans))
    for name, plan in plans.items():
        diff = np.abs(outs[name] - outs[base]).max() / max(np.abs(outs[base]).max(), 1e-30)
        print(f"{label}: {name} {plan.tile['Br']}x{plan.tile['Bc']} grid {plan.stage('main').grid}: "
              f"{best[name] * 1e3:.4f} ms {flops / best[name] / 1e12:6.1f} TFLOP/s, {best[base] / best[name]:.3f}x "
              f"{base}; O rel diff {diff:.1e}", flush=True)


def tweak(plan, params=(), blocks=None):
    """``plan`` with the main stage's extra defines (AB_HEADS_FAST: the items' heads fastest; AB_REGS56: 56 / 224
    registers) or another number of persistent blocks."""
    stage = plan.stage("main")
    stage = replace(stage, params=(*stage.params, *params), grid=(blocks or stage.grid[0], 1, 1))
    return replace(plan, stages=(stage,))


def variants(make, full=True, **kw):
    base = make(**kw)
    out = {"per item": make(**kw, persistent=False), "persistent": base, "persistent 176": make(**kw, block_c=176)}
    if full:
        out.update({"heads fastest": tweak(base, (("AB_HEADS_FAST", 1),)),
                    "regs 56/224": tweak(base, (("AB_REGS56", 1),)), "131 blocks": tweak(base, blocks=131)})
    return out


lengths = [int(x) for x in np.random.default_rng(0).integers(1, 8193, 64)]
total = sum(lengths)
cu = cp.asarray(np.concatenate([[0], np.cumsum(lengths)]), dtype=cp.int32)
inputs = {"Q": rnd(total, H, 128), "K": rnd(total, H, 128), "V": rnd(total, H, 128), "cu_seqlens_q": cu,
          "cu_seqlens_k": cu}
area = sum(n * n for n in lengths)
for causal in (False, True):
    launch = dict(d=128, dtype="float16", heads=H, batch=64, max_q=max(lengths), max_k=max(lengths), total_q=total,
                  total_k=total, causal=causal)
    ab(f"varlen 64 x 1..8192{' causal' if causal else ''} d 128", variants(make_varlen_plan, not causal, **launch),
       inputs, 4.0 * 128 * H * area / (2 if causal else 1))
docs = (2048,) * 8
cu = cp.asarray(np.concatenate([[0], np.cumsum(docs)]), dtype=cp.int32)
for d in (128, 64):
    inputs = {"Q": rnd(H, 16384, d), "K": rnd(H, 16384, d), "V": rnd(H, 16384, d), "cu_seqlens_q": cu,
              "cu_seqlens_k": cu}
    plans = ({"per item": make_documents_plan(docs, d=d, dtype="float16", heads=H),
              "persistent 128x128": make_documents_plan(docs, d=d, dtype="float16", heads=H, block_r=128),
              "persistent 128x176": make_documents_plan(docs, d=d, dtype="float16", heads=H, block_r=128,
                                                        block_c=176)}
             if d == 64 else variants(make_documents_plan, documents=docs, d=d, dtype="float16", heads=H))
    ab(f"8 documents of 2048 d {d}", plans, inputs, 4.0 * d * H * sum(n * n for n in docs))
for d in (128, 64):
    for batch, n in ((64, 4224), (1, 16384)):
        inputs = {"Q": rnd(batch * H, n, d), "K": rnd(batch * H, n, d), "V": rnd(batch * H, n, d)}
        plan = make_plan("flash", "fast", N_q=n, d=d, dtype="float16", sram=227 * 1024, batch=batch, heads=H)
        seconds = min(time_plan(plan, inputs, repeats=10, warmup=2)[0] for _ in range(ROUNDS))
        print(f"dense d {d} B {batch} N {n} H {H} ({plan.tile['Br']}x{plan.tile['Bc']}, grid "
              f"{plan.stage('main').grid}): {seconds * 1e3:.4f} ms {4.0 * d * batch * H * n * n / seconds / 1e12:6.1f} "
              "TFLOP/s", flush=True)
        del inputs
