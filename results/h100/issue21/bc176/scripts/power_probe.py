"""Sustained back-to-back backward calls (torch.autograd.grad, as bench's call mode) of ours (iokernels.torch.attention)
and SDPA's CUDNN backend, d 128, N 4096, fp16, B 4, H 16: GPU microseconds per call over successive 20-call loops
(CUDA events), with the SM clock, power and throttle reasons sampled by NVML (pynvml) in a thread every 10 ms during
each loop. Does ours slow down over a sustained run where cuDNN does not (power or clock limits), or is it slower from
the first loop? Arguments: the order (ours,cudnn,...), loops per implementation (6). Run with PYTHONPATH=.."""
import sys
import threading
import time

import pynvml
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from iokernels.torch import attention

pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
ORDER = sys.argv[1].split(",") if len(sys.argv) > 1 else ["ours", "cudnn"]
LOOPS = int(sys.argv[2]) if len(sys.argv) > 2 else 6
B, H, N, D = 4, 16, 4096, 128
stream = torch.cuda.Stream()


def sample(stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        out.append((pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                    pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                    pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)))
        time.sleep(0.01)


for name in ORDER:
    with torch.cuda.stream(stream):
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
        dout = torch.randn(B, H, N, D, device="cuda", dtype=torch.float16)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION) if name == "cudnn" else torch.enable_grad():
            out = attention(q, k, v) if name == "ours" else F.scaled_dot_product_attention(q, k, v)
            for _ in range(3):
                torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            stream.synchronize()
            for loop in range(LOOPS):
                samples: list = []
                stop = threading.Event()
                thread = threading.Thread(target=sample, args=(stop, samples))
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                thread.start()
                start.record()
                for _ in range(20):
                    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                end.record()
                end.synchronize()
                stop.set()
                thread.join()
                us = start.elapsed_time(end) * 1e3 / 20
                clocks = [s[0] for s in samples]
                power = [s[1] for s in samples]
                reasons = sorted({hex(s[2]) for s in samples})
                print(f"{name} loop {loop}: {us:7.1f} us per call  SM clock {min(clocks)}-{max(clocks)} MHz "
                      f"(mean {sum(clocks) / len(clocks):.0f})  power {max(power):.0f} W max  throttle {reasons}",
                      flush=True)
