"""Issue #23 probe: the split count of the decode plan against its time, on the card. For each case (B, H, H_kv, N_k;
d 128, fp16, one query token) the public call ``iokernels.torch.attention_with_kvcache(num_splits=S)`` for several S
(0: the plan's own choice, printed beside it) and SDPA CUDNN / FLASH, each captured in a CUDA graph that cycles
through enough caches to exceed 4x the L2, replays timed with CUDA events (µs a call, KV bandwidth in TB/s).
Usage: python3 split_sweep.py [B,H,H_kv,N_k ...]"""

import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import iokernels.torch as iot
from iokernels.plan.decode import make_decode_plan

D, DTYPE = 128, torch.float16
CASES = [(1, 8, 8, 131072), (1, 64, 8, 131072), (1, 64, 8, 65536), (1, 64, 8, 16384), (4, 64, 8, 131072),
         (4, 8, 8, 131072), (16, 64, 8, 65536), (16, 64, 8, 131072), (64, 64, 8, 32768)]
SPLITS = (0, 1, 2, 4, 8, 11, 16, 22, 24, 32, 33, 44, 48, 49, 64, 66, 96, 128)


def graph_us(fn, calls: int) -> float:
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        fn()
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times[3:])


def main() -> None:
    cases = [tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]] or CASES
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    src = torch.empty(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    copy = graph_us(lambda: dst.copy_(src), 1)
    print(f"device {torch.cuda.get_device_name()} L2 {l2 >> 20} MB, copy {2 * src.numel() * 4 / copy / 1e6:.2f} TB/s "
          f"(read + written)", flush=True)
    for b, h, hkv, nk in cases:
        kv_bytes = 2 * b * hkv * nk * D * 2
        rot = max(1, -(-4 * l2 // kv_bytes))
        q = torch.randn(b, h, 1, D, device="cuda", dtype=DTYPE)
        ks = [torch.randn(b, hkv, nk, D, device="cuda", dtype=DTYPE) for _ in range(rot)]
        vs = [torch.randn(b, hkv, nk, D, device="cuda", dtype=DTYPE) for _ in range(rot)]
        own = make_decode_plan(N_q=1, N_k=nk, d=D, dtype="float16", batch=b, heads=h, kv_heads=hkv).tile["S"]
        row = []
        with torch.inference_mode():
            for name, backend in (("CUDNN", SDPBackend.CUDNN_ATTENTION), ("FLASH", SDPBackend.FLASH_ATTENTION)):
                def sdpa(backend=backend, q=q, ks=ks, vs=vs):
                    with sdpa_kernel(backend):
                        for k, v in zip(ks, vs, strict=True):
                            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                row.append((name, graph_us(sdpa, rot)))
            for s in SPLITS:
                used = make_decode_plan(N_q=1, N_k=nk, d=D, dtype="float16", batch=b, heads=h, kv_heads=hkv,
                                        splits=s or None).tile["S"]
                if s and used != s:
                    continue  # (the same splits as a smaller S)
                def ours(s=s, q=q, ks=ks, vs=vs):
                    for k, v in zip(ks, vs, strict=True):
                        iot.attention_with_kvcache(q, k, v, num_splits=s)
                row.append((f"S{s or 'own'}={used}", graph_us(ours, rot)))
        best = min(t for n, t in row if n.startswith("S"))
        text = " ".join(f"{n} {t:.1f}" for n, t in row)
        print(f"B{b} H{h}/{hkv} N_k {nk} (plan S {own}, rot {rot}): {text} | best ours {best:.1f} us "
              f"{kv_bytes / best / 1e6:.2f} TB/s; cudnn {row[0][1]:.1f} {kv_bytes / row[0][1] / 1e6:.2f} TB/s",
              flush=True)


if __name__ == "__main__":
    main()
