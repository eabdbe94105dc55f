"""A first look at ALiBi's cost (not `iokernels bench`, which has no ALiBi option yet): iokernels.torch.attention with
alibi_slopes against itself without, and FlexAttention compiled with an ALiBi score_mod (score − slope_h |q − kv|;
its causal block mask when causal), B 4, H 16, N 4096, fp16, d 64 and 128, forward and forward + backward. Each
timed the same way: CUDA events around 20 back-to-back calls after 3 warm-ups, median of 5 loops; TFLOP/s on
4·B·H·N²·d (halved when causal), forward + backward 3.5× that."""
import statistics

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from iokernels.torch import attention

B, H, N = 4, 16, 4096
slopes = tuple(2.0 ** (-8 * (h + 1) / H) for h in range(H))
slope_t = torch.tensor(slopes, device="cuda", dtype=torch.float32)
flex = torch.compile(flex_attention)


def alibi_mod(score, b, h, q_idx, kv_idx):
    return score - slope_t[h] * (q_idx - kv_idx).abs()


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


print(f"B {B} H {H} N {N} fp16; ms per call and TFLOP/s")
for d in (64, 128):
    for causal in (False, True):
        q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)
        bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, N, N) if causal else None
        impls = {
            "ours+alibi": lambda: attention(q, k, v, is_causal=causal, alibi_slopes=slopes),
            "ours": lambda: attention(q, k, v, is_causal=causal),
            "flex+alibi": lambda: flex(q, k, v, score_mod=alibi_mod, block_mask=bm),
        }
        flops = 4 * B * H * N * N * d / (2 if causal else 1)
        for name, f in impls.items():
            with torch.no_grad():
                t_f = timed(f)

            def fb(f=f):
                torch.autograd.grad(f(), (q, k, v), do)
            t_fb = timed(fb)
            print(f"d {d:3d} causal {causal!s:5} {name:11s} fwd {t_f:7.3f} ms {flops / t_f / 1e9:6.1f}  "
                  f"fwd+bwd {t_fb:7.3f} ms {3.5 * flops / t_fb / 1e9:6.1f}", flush=True)
