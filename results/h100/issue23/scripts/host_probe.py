"""Issue #23 probe: where the host time of one decode call goes. For each case, iokernels.torch.attention(q, k, v)
and torch SDPA (FLASH, CUDNN; enable_gqa=True) on one cache: host microseconds per call (time.perf_counter around
the call alone, the stream synchronised every 20 calls outside the timed region; median of 400), then cProfile of
400 of our calls (the functions by own time, and by cumulative time). Usage: python3 host_probe.py [B,H,H_kv,N_k ...]"""

import cProfile
import io
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import iokernels.torch as iot

D, DTYPE = 128, torch.float16
CASES = [(1, 64, 8, 4096), (1, 8, 8, 16384), (4, 64, 8, 16384)]


def host_us(fn, calls: int = 400, chunk: int = 20) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if i % chunk == chunk - 1:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def main() -> None:
    cases = [tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]] or CASES
    print(f"device {torch.cuda.get_device_name()}")
    for b, h, hkv, nk in cases:
        q = torch.randn(b, h, 1, D, device="cuda", dtype=DTYPE)
        k = torch.randn(b, hkv, nk, D, device="cuda", dtype=DTYPE)
        v = torch.randn_like(k)
        def ours(q=q, k=k, v=v):
            return iot.attention(q, k, v)

        def sdpa(q=q, k=k, v=v):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        line = [f"B{b} H{h}/{hkv} N_k {nk}: ours {host_us(ours):.1f} us"]
        for name, be in (("FLASH", SDPBackend.FLASH_ATTENTION), ("CUDNN", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    line.append(f"{name} {host_us(sdpa):.1f} us")
            except RuntimeError as exc:
                line.append(f"{name} {type(exc).__name__}")
        print(", ".join(line), flush=True)
        prof = cProfile.Profile()
        prof.enable()
        for i in range(400):
            ours()
            if i % 20 == 19:
                torch.cuda.synchronize()
        prof.disable()
        for key in ("tottime", "cumulative"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(45)
            print(f"-- cProfile, 400 calls, by {key}\n" + s.getvalue())


if __name__ == "__main__":
    main()
