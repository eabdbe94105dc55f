"""A/B of the forward's MOD_STAGE on an explicit mask per batch and head (B 4, H 16, N 4096, fp16, d 64 and 128):
iokernels.torch.attention(attn_mask=) (explicit masks: ``score + mask[...]`` for an additive float16 mask, ``mask[...]
!= 0`` for a boolean one; rows of 16-byte multiples, so each warp copies its rows of the next key tile into shared
memory by cp.async while a step runs, and reads them there), the same variant written so that neither the staging
nor the prefetch applies (``score + 0.0f + mask[...]``, ``0 != mask[...]``; the same elements read from global memory
after the product) through iokernels.torch.attention_mods, and SDPA CUDNN with the mask as attn_mask. Each: CUDA
events around 10 back-to-back calls after 3 untimed, the median of 5 such loops, alternated A B C A B C; forward
TFLOP/s at 4·N²·d per head; the outputs compared."""
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import iokernels.torch as iot

b, h, n = 4, 16, 4096


def loop(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 10


def case(d, kind):
    gen = torch.Generator(device="cuda").manual_seed(d)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
    if kind == "additive":
        mask = torch.randn(b, h, n, n, device="cuda", dtype=torch.float16, generator=gen)
        flat = mask.reshape(-1)
    else:
        mask = torch.rand(b, h, n, n, device="cuda", generator=gen) < 0.9
        flat = mask.reshape(-1).view(torch.uint8)
    flops = 4 * d * b * h * n * n
    index = f"b * {h * n * n} + h * {n * n} + q_idx * {n} + kv_idx"
    written = {"score_mod": f"score + 0.0f + mask[{index}]"} if kind == "additive" else \
        {"mask_mod": f"0 != mask[{index}]"}

    def fetch():
        return iot.attention(q, k, v, attn_mask=mask)

    def plain():
        return iot.attention_mods(q, k, v, captures={"mask": flat}, **written)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    fns = {"staged": fetch, "none": plain, "cudnn": cudnn}
    outs = {name: fn().float() for name, fn in fns.items()}
    for fn in fns.values():
        for _ in range(3):
            fn()
    times = {name: [] for name in fns}
    for _ in range(5):
        for name, fn in fns.items():
            times[name].append(loop(fn))
    for name, t in times.items():
        ms = statistics.median(t)
        loops = [round(x, 3) for x in t]
        print(f"{kind} d{d} {name:9s} fwd {ms:7.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s  loops {loops}", flush=True)
    for name in ("staged", "none"):
        print(f"  max |{name} - cudnn| = {(outs[name] - outs['cudnn']).abs().max().item():.3e}", flush=True)


with torch.no_grad():
    for d, kind in ((64, "additive"), (128, "additive"), (64, "bool")):
        case(d, kind)
