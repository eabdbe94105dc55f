"""A/B of the persistent causal forward (flash_tma.cu) through iokernels.torch.attention: causal, fp16, B·H·N =
262,144, 16 heads, d 64 and 128, N 4096 and 16384; CUDA events around 30 back-to-back calls after 5 untimed (one in
flight before the loop); TFLOP/s at 2·N²·d FLOPs per head (causal half of 4·N²·d). Argument: the variant's label."""
import sys

import torch

import iokernels.torch as iot

label = sys.argv[1]
for d in (64, 128):
    for n in (4096, 16384):
        b = 262144 // n // 16
        q, k, v = (torch.randn(b, 16, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        for _ in range(5):
            iot.attention(q, k, v, causal=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(30):
            iot.attention(q, k, v, causal=True)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / 30
        print(f"{label} d{d} N{n} {ms:.4f} ms {2 * b * 16 * n * n * d / ms / 1e9:.1f} TFLOP/s", flush=True)
