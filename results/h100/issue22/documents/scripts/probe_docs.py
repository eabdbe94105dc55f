"""Document masking, 8 documents of 2048 in N 16384, B 1, H 16 (issue #22's case), fp16: ours
(iokernels.torch.attention(documents=)) against FlexAttention compiled (mask_mod document_id[q] == document_id[kv],
causal too when causal) and against the dense fast path (iokernels.torch.attention, no mask: its TFLOP/s on all N²
elements is the bar "0.9x the dense path on the computed blocks" compares with). Back-to-back calls with CUDA events
around the loop (one untimed call first), median of 5 loops of 10; forward, and forward + backward (backward time =
the difference). TFLOP/s: 4·H·d per visible element (Σ n_i², or n_i (n_i + 1) / 2 causal), backward 2.5×."""
import statistics
import sys

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import iokernels.torch

flex = torch.compile(flex_attention, dynamic=False)
docs = (2048,) * 8
n, h = sum(docs), 16
ids = torch.repeat_interleave(torch.arange(len(docs), device="cuda"), torch.tensor(docs, device="cuda"))


def timed(fn, reps=10, loops=5):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(loops):
        fn()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / reps / 1e3)
    return statistics.median(out)


for d in (64, 128):
    for causal in (False, True):
        q, k, v = (torch.randn(1, h, n, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)
        vis = sum(x * (x + 1) // 2 if causal else x * x for x in docs)
        full = n * (n + 1) // 2 if causal else n * n

        def mask_mod(b, hh, qi, ki):
            same = ids[qi] == ids[ki]
            return same & (qi >= ki) if causal else same

        bm = create_block_mask(mask_mod, 1, 1, n, n, device="cuda")
        impls = {"ours": lambda: iokernels.torch.attention(q, k, v, documents=docs, causal=causal),
                 "flex": lambda: flex(q, k, v, block_mask=bm),
                 "dense": lambda: iokernels.torch.attention(q, k, v, causal=causal)}
        for name, f in impls.items():
            with torch.no_grad():
                tf = timed(f)
            tfb = timed(lambda f=f: torch.autograd.backward(f(), do))
            elems = full if name == "dense" else vis
            fl = 4.0 * h * d * elems
            print(f"d {d:3d} causal {causal!s:5s} {name:5s}: fwd {fl / tf / 1e12:6.1f} TFLOP/s ({tf * 1e3:.3f} ms)  "
                  f"bwd {2.5 * fl / (tfb - tf) / 1e12:6.1f} TFLOP/s ({(tfb - tf) * 1e3:.3f} ms)", flush=True)
        sys.stdout.flush()
