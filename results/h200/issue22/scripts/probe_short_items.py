"""Issues #22 / #23: what short work items cost the tma forward, to tell whether a persistent grid would lift the
documents and the variable-length batch (a block per item today) toward the dense rate. Plan level, CUDA-graph
replays (kernels.timing.time_plan), fp16, 16 heads, TFLOP/s on the computed elements: the dense forward (not causal)
with B·N fixed at 16384 rows a head and N = 2048, 4096, 16384 (items of N / B_c steps), as its default persistent
grid and as a block per item; and 8 documents of 2048 (the head-major variable-length plan, a block per item). At d 64
and 128 (at d 64 also B_r 128 beside the default 192). If the dense N 2048 persistent grid runs well above its block-per-item grid and the documents, the start and
end of an item is the documents' gap and a persistent variable-length forward should close it; if not, the gap is the
short items themselves (the pipeline's fill and drain: S_0 issued alone, the last P V alone).
Run from the repository root with PYTHONPATH=..
"""
import cupy as cp
import numpy as np

from iokernels.kernels.timing import time_plan
from iokernels.plan.fast import make_fast_plan
from iokernels.plan.varlen import make_documents_plan

H, ROWS = 16, 16384
rng = cp.random.default_rng(0)


def rnd(*shape):
    return rng.standard_normal(shape, dtype=cp.float32).astype(cp.float16)


def show(label, plan, inputs, flops):
    seconds, _ = time_plan(plan, inputs, repeats=10, warmup=2)
    tiles = dict(plan.tiles)
    print(f"d {plan.d} {label}: {tiles['Br']}x{tiles['Bc']} grid {plan.stage('main').grid} "
          f"{'persistent' if dict(plan.stage('main').params).get('PERSISTENT') else 'a block per item'}: "
          f"{seconds * 1e3:.4f} ms {flops / seconds / 1e12:6.1f} TFLOP/s", flush=True)


for d in (64, 128):
    for n in (2048, 4096, 16384):
        batch = ROWS // n
        inputs = {"Q": rnd(batch * H, n, d), "K": rnd(batch * H, n, d), "V": rnd(batch * H, n, d)}
        for block_r in ((None, 128) if d == 64 else (None,)):
            for persistent in (None, False):
                try:
                    plan = make_fast_plan(N_q=n, d=d, dtype="float16", batch=batch, heads=H, kernel="tma",
                                          persistent=persistent, block_r=block_r)
                except ValueError as error:
                    print(f"d {d} dense B {batch} N {n} B_r {block_r} persistent {persistent}: {error}")
                    continue
                show(f"dense B {batch} N {n}", plan, inputs, 4.0 * d * batch * H * n * n)
    docs = (2048,) * 8
    cu = cp.asarray(np.concatenate([[0], np.cumsum(docs)]), dtype=cp.int32)
    inputs = {"Q": rnd(H, ROWS, d), "K": rnd(H, ROWS, d), "V": rnd(H, ROWS, d), "cu_seqlens_q": cu,
              "cu_seqlens_k": cu}
    for block_r in ((None, 128) if d == 64 else (None,)):
        show("8 documents of 2048", make_documents_plan(docs, d=d, dtype="float16", heads=H, block_r=block_r),
             inputs, 4.0 * d * H * sum(x * x for x in docs))
