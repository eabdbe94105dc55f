"""Issues #22 / #23: two questions, plan level, CUDA-graph replays (kernels.timing.time_plan), fp16, 16 heads.
1. The sliding window (1024, 0) at N 16384 on other tilings than its default (128 x 128, persistent): 192 x 128 and
   128 x 128 a block per item at d 64, 128 x 128 a block per item at d 128 (TFLOP/s on the visible elements).
2. What the variable-length forward's empty blocks cost: bench --varlen's launch grid (64 sequences, max 8192, d 128)
   with every sequence 1 token long (of 8192 packed rows) (its 65,536 blocks nearly all empty), beside the bench's batch itself.
Run from the repository root with PYTHONPATH=.."""
import cupy as cp
import numpy as np

from iokernels.kernels.timing import time_plan
from iokernels.plan import make_plan
from iokernels.plan.fast import make_fast_plan
from iokernels.plan.varlen import make_varlen_plan
from iokernels.plan.variants import with_window

H, N, W = 16, 16384, (1024, 0)
rng = cp.random.default_rng(0)


def rnd(*shape):
    return rng.standard_normal(shape, dtype=cp.float32).astype(cp.float16)


def show(label, plan, inputs, flops):
    seconds, _ = time_plan(plan, inputs, repeats=10, warmup=2)
    params = dict(plan.stage("main").params)
    print(f"{label}: {plan.tile['Br']}x{plan.tile['Bc']} grid {plan.stage('main').grid} "
          f"{'persistent' if params.get('PERSISTENT') else 'a block per item'}: {seconds * 1e3:.4f} ms "
          f"{flops / seconds / 1e12:6.1f} TFLOP/s", flush=True)


visible = sum(min(i, W[0]) + 1 for i in range(N))
for d in (64, 128):
    inputs = {"Q": rnd(H, N, d), "K": rnd(H, N, d), "V": rnd(H, N, d)}
    flops = 4.0 * d * H * visible
    show(f"d {d} window default", make_plan("flash", "fast", N_q=N, d=d, dtype="float16", sram=227 * 1024, heads=H,
                                            window=W), inputs, flops)
    for br in ((192, 128) if d == 64 else (128,)):
        try:
            plan = with_window(make_fast_plan(N_q=N, d=d, dtype="float16", heads=H, kernel="tma", block_r=br,
                                              block_c=128, persistent=False), W)
        except ValueError as error:
            print(f"d {d} window {br}x128 a block per item: {error}")
            continue
        show(f"d {d} window", plan, inputs, flops)

D, B, MAX = 128, 64, 8192
lengths = [int(x) for x in np.random.default_rng(0).integers(1, MAX + 1, B)]
total = sum(lengths)
cu = cp.asarray(np.concatenate([[0], np.cumsum(lengths)]), dtype=cp.int32)
inputs = {"Q": rnd(total, H, D), "K": rnd(total, H, D), "V": rnd(total, H, D), "cu_seqlens_q": cu, "cu_seqlens_k": cu}
launch = dict(d=D, dtype="float16", heads=H, batch=B, max_q=MAX, max_k=MAX, total_q=total, total_k=total)
show("varlen bench batch, launch plan", make_varlen_plan(**launch), inputs, 4.0 * D * H * sum(n * n for n in lengths))
show("varlen bench batch, exact plan", make_varlen_plan(d=D, dtype="float16", heads=H, lengths_q=lengths), inputs,
     4.0 * D * H * sum(n * n for n in lengths))
ones = cp.arange(B + 1, dtype=cp.int32)
inputs = {"Q": rnd(MAX, H, D), "K": rnd(MAX, H, D), "V": rnd(MAX, H, D), "cu_seqlens_q": ones, "cu_seqlens_k": ones}
show("varlen 64 sequences of 1 on the max-8192 grid", make_varlen_plan(**{**launch, "total_q": MAX, "total_k": MAX}),
     inputs, 4.0 * D * H * B)
show("varlen 64 sequences of 1 on their own grid", make_varlen_plan(d=D, dtype="float16", heads=H, lengths_q=[1] * B),
     inputs, 4.0 * D * H * B)
