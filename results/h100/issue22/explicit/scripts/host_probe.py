"""Host time of a masked call through the public function (issue #22's explicit-mask route): iokernels.torch.attention
(q, k, v, attn_mask=m) on a small problem (B 1, H 4, N 128, d 64, float16; an additive float16 mask per head and a
boolean one shared), 300 calls timed on the CPU around the enqueue only (median and p90 microseconds per call, the
GPU left to drain every 50), beside SDPA's default choice with the same mask; then cProfile's top functions of 500
of our calls."""
import cProfile
import io
import pstats
import statistics
import time

import torch

import iokernels.torch as iot

q, k, v = (torch.randn(1, 4, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
masks = {"additive": torch.randn(4, 128, 128, device="cuda", dtype=torch.float16),
         "bool": torch.rand(128, 128, device="cuda") > 0.2}


def host_us(fn, calls=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    out = []
    for i in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
        if i % 50 == 49:
            torch.cuda.synchronize()
    out.sort()
    return statistics.median(out), out[int(0.9 * len(out))]


with torch.no_grad():
    for kind, m in masks.items():
        ours = host_us(lambda m=m: iot.attention(q, k, v, attn_mask=m))
        sdpa = host_us(lambda m=m: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m))
        plain = host_us(lambda: iot.attention(q, k, v))
        print(f"{kind:8s} ours {ours[0]:6.1f} / {ours[1]:6.1f} us   SDPA {sdpa[0]:6.1f} / {sdpa[1]:6.1f} us   "
              f"ours unmasked {plain[0]:6.1f} / {plain[1]:6.1f} us (median / p90)", flush=True)
    m = masks["additive"]
    pr = cProfile.Profile()
    pr.enable()
    for i in range(500):
        iot.attention(q, k, v, attn_mask=m)
        if i % 50 == 49:
            torch.cuda.synchronize()
    pr.disable()
    st = io.StringIO()
    pstats.Stats(pr, stream=st).sort_stats("tottime").print_stats(25)
    print(st.getvalue()[:6000])
