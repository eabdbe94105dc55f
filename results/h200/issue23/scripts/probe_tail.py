"""Issue #23: what zeroing a sequence's last V tile past its end costs the variable-length forward (flash_tma.cu's
IOK_TAIL, warp 1 of the producer), plan level, CUDA-graph replays, alternating, ROUNDS rounds, best and median: the
plans as they are and built with AB_NO_TAIL (the zeroing left out: a probe only, a NaN in the next sequence's V rows
would then reach O), at 128 x 128 and 128 x 176 tiles; bench --varlen's batch (d 128, 64 sequences of 1..8192, seed 0)
and 7 documents of N 16384 (6 x 2340 + 2344, head-major). Runs on branch next/tail-probe. PYTHONPATH=.."""
import os
import statistics
from dataclasses import replace

import cupy as cp
import numpy as np

from iokernels.kernels.timing import time_plan
from iokernels.plan.core import layout, layout_bytes
from iokernels.plan.fast import fast_buffers
from iokernels.plan.units import cdiv
from iokernels.plan.varlen import make_documents_plan, make_varlen_plan

ROUNDS, H, D = int(os.environ.get("ROUNDS", "4")), 16, 128
rng = cp.random.default_rng(0)


def rnd(*shape):
    return rng.standard_normal(shape, dtype=cp.float32).astype(cp.float16)


def wide(plan):
    """``plan`` in 128 x 176 tiles (the dense forward's)."""
    buffers = fast_buffers(128, 2, 128, 176)
    stage = replace(plan.stage("main"), smem=layout(buffers))
    tiles = tuple((k, 176 if k == "Bc" else cdiv(plan.N_k, 176) if k == "Tc" else v) for k, v in plan.tiles)
    return replace(plan, tiles=tiles, stages=(stage,), sram_bytes=layout_bytes(buffers))


def no_tail(plan):
    stage = plan.stage("main")
    return replace(plan, stages=(replace(stage, params=(*stage.params, ("AB_NO_TAIL", 1))),))


def run(label, base, inputs, flops):
    plans = {"128": base, "128 no tail": no_tail(base), "176": wide(base), "176 no tail": no_tail(wide(base))}
    got = {name: [] for name in plans}
    for _ in range(ROUNDS):
        for name, plan in plans.items():
            got[name].append(time_plan(plan, inputs, repeats=10, warmup=2)[0])
    for name, seconds in got.items():
        print(f"{label} {name:12s}: best {flops / min(seconds) / 1e12:6.1f} median "
              f"{flops / statistics.median(seconds) / 1e12:6.1f} TFLOP/s", flush=True)


lengths = [int(x) for x in np.random.default_rng(0).integers(1, 8193, 64)]
total = sum(lengths)
cu = cp.asarray(np.concatenate([[0], np.cumsum(lengths)]), dtype=cp.int32)
inputs = {"Q": rnd(total, H, D), "K": rnd(total, H, D), "V": rnd(total, H, D), "cu_seqlens_q": cu, "cu_seqlens_k": cu}
run("varlen batch", make_varlen_plan(d=D, dtype="float16", heads=H, lengths_q=lengths), inputs,
    4.0 * D * H * sum(n * n for n in lengths))
docs = (2340,) * 6 + (2344,)
cu = cp.asarray(np.concatenate([[0], np.cumsum(docs)]), dtype=cp.int32)
inputs = {"Q": rnd(H, 16384, D), "K": rnd(H, 16384, D), "V": rnd(H, 16384, D), "cu_seqlens_q": cu,
          "cu_seqlens_k": cu}
run("7 documents", make_documents_plan(docs, d=D, dtype="float16", heads=H), inputs,
    4.0 * D * H * sum(n * n for n in docs))
