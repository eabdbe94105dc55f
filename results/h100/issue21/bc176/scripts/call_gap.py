"""Why the backward through the public call (bench's call mode) is slower than its graph replays: for ours
(iokernels.torch.attention) and SDPA's CUDNN backend, on the bench's inputs (d 64, N 4096, fp16, B 4, H 16, leaves on a
side stream as bench's torch_runner makes them), 20 back-to-back torch.autograd.grad calls: host seconds per call (the
enqueue alone), GPU seconds per call (CUDA events), then torch.profiler over 5 calls: each CUDA kernel's time and the
CPU-side CUDA runtime calls (a synchronization shows here). Arguments: d (64), and the order of the implementations,
comma-separated (ours,cudnn; a name given again is timed again, its profile not printed again). Run from the
repository root with PYTHONPATH=.."""
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from iokernels.torch import attention

B, H, N, D = 4, 16, 4096, int(sys.argv[1]) if len(sys.argv) > 1 else 64
ORDER = sys.argv[2].split(",") if len(sys.argv) > 2 else ["ours", "cudnn"]
stream = torch.cuda.Stream()
profiled = set()
for name in ORDER:
    with torch.cuda.stream(stream):
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
        dout = torch.randn(B, H, N, D, device="cuda", dtype=torch.float16)
        ctx = sdpa_kernel(SDPBackend.CUDNN_ATTENTION) if name == "cudnn" else torch.enable_grad()
        with ctx:
            out = attention(q, k, v) if name == "ours" else F.scaled_dot_product_attention(q, k, v)

            def call(out=out, leaves=(q, k, v), dout=dout):
                return torch.autograd.grad(out, leaves, dout, retain_graph=True)

            for _ in range(5):
                call()
            stream.synchronize()
            t0 = time.perf_counter()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                call()
            host = (time.perf_counter() - t0) / 20
            stop.record()
            stop.synchronize()
            gpu = start.elapsed_time(stop) / 1e3 / 20
            print(f"{name} d {D}: host {host * 1e6:.1f} us per call (enqueue), GPU {gpu * 1e6:.1f} us per call",
                  flush=True)
            if name in profiled:
                continue
            profiled.add(name)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    call()
                stream.synchronize()
            print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60),
                  flush=True)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60),
                  flush=True)
