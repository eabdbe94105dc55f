"""Speed of the programmable variants against the built-ins and FlexAttention compiled with the same mods, through
the torch front ends (iokernels.torch.attention_mods, iokernels.torch.attention, flex_attention under torch.compile):
CUDA events around 10 back-to-back calls after 3 untimed (forward; forward + backward through autograd), fp16.
TFLOP/s on the visible elements: 4·d per element forward, 2.5× that backward (backward = fwd+bwd − fwd).
Cases: 8 documents of 2048 in N 16384 (B 1, H 16; ours: a mask_mod reading a document table + the block mask
create_block_mask makes of it), a causal sliding window of 1024 in N 16384 (the same way), ALiBi and a softcap at N 4096
(B 4, H 16)."""
import sys

import numpy as np
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import iokernels
import iokernels.torch as iot

flex = torch.compile(flex_attention, dynamic=False)


def timed(fn, backward):
    def once():
        out = fn()
        if backward:
            out.backward(dout)
    for _ in range(3):
        once()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        once()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 10


def report(case, name, fn, flops):
    try:
        f = timed(fn, False)
        fb = timed(fn, True)
        print(f"{case} {name:10s} fwd {f:8.3f} ms {flops / f / 1e9:6.1f} TFLOP/s  bwd {fb - f:8.3f} ms "
              f"{2.5 * flops / (fb - f) / 1e9:6.1f} TFLOP/s", flush=True)
    except Exception as exc:  # a peer that cannot run this case: say so, go on
        print(f"{case} {name:10s} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)


which = sys.argv[1:] or ["docs", "window", "alibi", "softcap"]
for d in (64, 128):
    if "docs" in which:
        n, b, h, docs = 16384, 1, 16, 8
        doc = torch.arange(docs, device="cuda", dtype=torch.int32).repeat_interleave(n // docs)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
        dout = torch.randn(b, h, n, d, device="cuda", dtype=torch.float16)
        flops = 4 * d * b * h * docs * (n // docs) ** 2
        expr = "doc[q_idx] == doc[kv_idx]"
        bm = iokernels.create_block_mask(expr, n, n, captures={"doc": doc.cpu().numpy()})
        report(f"docs8 d{d}", "mods", lambda: iot.attention_mods(q, k, v, mask_mod=expr, captures={"doc": doc},
                                                                  block_mask=bm), flops)
        report(f"docs8 d{d}", "built-in", lambda: iot.attention(q, k, v, documents=(n // docs,) * docs), flops)
        fbm = create_block_mask(lambda b_, h_, qi, ki: doc[qi] == doc[ki], None, None, n, n)
        report(f"docs8 d{d}", "flex", lambda: flex(q, k, v, block_mask=fbm), flops)
    if d == 128 and "window" in which:  # a sliding window of 1024 keys to the left, causal
        n, b, h, w = 16384, 1, 16, 1024
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
        dout = torch.randn(b, h, n, d, device="cuda", dtype=torch.float16)
        flops = 4 * d * b * h * sum(min(i, w) + 1 for i in range(n))
        expr = f"kv_idx <= q_idx && q_idx - kv_idx <= {w}"
        bm = iokernels.create_block_mask(expr, n, n)
        report(f"window d{d}", "mods", lambda: iot.attention_mods(q, k, v, mask_mod=expr, block_mask=bm), flops)
        report(f"window d{d}", "built-in", lambda: iot.attention(q, k, v, window=(w, 0)), flops)
        fbm = create_block_mask(lambda b_, h_, qi, ki: (ki <= qi) & (qi - ki <= w), None, None, n, n)
        report(f"window d{d}", "flex", lambda: flex(q, k, v, block_mask=fbm), flops)
    if d == 128 and ("alibi" in which or "softcap" in which):
        n, b, h = 4096, 4, 16
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
        dout = torch.randn(b, h, n, d, device="cuda", dtype=torch.float16)
        flops = 4 * d * b * h * n * n
        slopes = torch.tensor([2.0 ** (-8 * (i + 1) / h) for i in range(h)], device="cuda", dtype=torch.float32)
        if "alibi" in which:
            expr = "score - slopes[h] * abs(kv_idx - q_idx)"
            report(f"alibi d{d}", "mods", lambda: iot.attention_mods(q, k, v, score_mod=expr,
                                                                      captures={"slopes": slopes}), flops)
            report(f"alibi d{d}", "built-in", lambda: iot.attention(q, k, v, alibi_slopes=slopes.tolist()), flops)
            report(f"alibi d{d}", "flex", lambda: flex(q, k, v, score_mod=lambda s, b_, h_, qi, ki:
                                                        s - slopes[h_] * (ki - qi).abs()), flops)
        if "softcap" in which:
            expr = "30.0f * tanhf(score / 30.0f)"
            report(f"softcap d{d}", "mods", lambda: iot.attention_mods(q, k, v, score_mod=expr), flops)
            expr_mul = "30.0f * tanhf(score * (1.0f / 30.0f))"  # (no IEEE division per element)
            report(f"softcap d{d}", "mods-mul", lambda: iot.attention_mods(q, k, v, score_mod=expr_mul), flops)
            report(f"softcap d{d}", "built-in", lambda: iot.attention(q, k, v, softcap=30.0), flops)
            report(f"softcap d{d}", "flex", lambda: flex(q, k, v, score_mod=lambda s, b_, h_, qi, ki:
                                                          30.0 * torch.tanh(s / 30.0)), flops)
print("done", np.__version__)
