"""The softcap's cost: iokernels.torch.attention with softcap 30 against without, and FlexAttention compiled with a
tanh score_mod, fp16, B 4, H 16, N 4096, d 64 and 128, causal and not; back-to-back calls with CUDA events around
the loop (one untimed call first), median of 5 loops of 10; forward alone (no grad) and forward + backward."""
import statistics

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import iokernels.torch

flex = torch.compile(flex_attention, dynamic=False)
C = 30.0


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


def capped(score, b, h, qi, ki):
    return C * torch.tanh(score / C)


for d in (64, 128):
    for causal in (False, True):
        n, heads, batch = 4096, 16, 4
        q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16, requires_grad=True)
                   for _ in range(3))
        do = torch.randn_like(q)
        bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device="cuda") if causal else None
        flops = 4.0 * batch * heads * n * n * d * (0.5 if causal else 1.0)
        impls = {"ours softcap": lambda: iokernels.torch.attention(q, k, v, causal=causal, softcap=C),
                 "ours plain": lambda: iokernels.torch.attention(q, k, v, causal=causal),
                 "flex softcap": lambda: flex(q, k, v, score_mod=capped, block_mask=bm)}
        for name, f in impls.items():
            with torch.no_grad():
                qn, kn, vn = (t.detach() for t in (q, k, v))
                if name.startswith("flex"):
                    tf = timed(lambda: flex(qn, kn, vn, score_mod=capped, block_mask=bm))
                else:
                    tf = timed(lambda: iokernels.torch.attention(qn, kn, vn, causal=causal,
                                                                 softcap=C if "softcap" in name else None))
            tfb = timed(lambda f=f: torch.autograd.backward(f(), do))
            print(f"d {d:3d} causal {causal!s:5s} {name:12s}: fwd {flops / tf / 1e12:6.1f} TFLOP/s  fwd+bwd "
                  f"{3.5 * flops / tfb / 1e12:6.1f} TFLOP/s", flush=True)
