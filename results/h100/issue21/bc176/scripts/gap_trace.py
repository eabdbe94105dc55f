"""Where the GPU time of back-to-back backward calls goes between kernels: torch.profiler over 20
torch.autograd.grad calls (after 5 warm-ups) of ours (iokernels.torch.attention) and SDPA's CUDNN backend, d 128,
N 4096, fp16, B 4, H 16; from the trace's kernel events: per kernel name the mean duration and the mean idle gap
before it, and the span per call against the kernels' sum. Arguments: the order (ours,cudnn). Run with
PYTHONPATH=.."""
import itertools
import json
import os
import statistics
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from iokernels.torch import attention

ORDER = sys.argv[1].split(",") if len(sys.argv) > 1 else ["ours", "cudnn"]
B, H, N, D = 4, 16, 4096, 128
stream = torch.cuda.Stream()
for name in ORDER:
    with torch.cuda.stream(stream):
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
        dout = torch.randn(B, H, N, D, device="cuda", dtype=torch.float16)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION) if name == "cudnn" else torch.enable_grad():
            out = attention(q, k, v) if name == "ours" else F.scaled_dot_product_attention(q, k, v)
            for _ in range(5):
                torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            stream.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                stream.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    gpu = ("kernel", "gpu_memset", "gpu_memcpy")
    kernels = sorted((e for e in events if e.get("cat") in gpu), key=lambda e: e["ts"])
    by: dict = {}
    for prev, e in itertools.pairwise(kernels):
        gap = e["ts"] - (prev["ts"] + prev["dur"])
        by.setdefault(e["name"][:70], []).append((e["dur"], gap))
    span = (kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]) / 20
    total = sum(e["dur"] for e in kernels) / 20
    print(f"{name}: {len(kernels)} GPU events, span {span:.1f} us per call, busy {total:.1f} us per call", flush=True)
    for n, v in by.items():
        print(f"  {n}: {len(v)}x  mean {statistics.mean(d for d, _ in v):8.1f} us  gap before: mean "
              f"{statistics.mean(g for _, g in v):6.1f} us, max {max(g for _, g in v):6.1f}", flush=True)
