"""Host time of a decode call through the public function (issue #23's call mode): iokernels.torch.attention(q, k, v)
with one query token, d 128, float16, H:H_kv 64:8 and 8:8, B 1 and 4, N_k 4096, each call on the next of 13 K/V
caches (as `bench --decode` rotates them), beside SDPA FLASH and CUDNN (enable_gqa=True) on the same inputs.
Per implementation: the enqueue alone timed on the CPU (median / p90 microseconds per call, the GPU drained every
50 calls), and the call mode's figure (CUDA events around 200 back-to-back calls, microseconds per call), three
times each in turn; then cProfile's top functions of 2000 of our calls (8:8, B 1)."""
import cProfile
import io
import itertools
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import iokernels.torch as iot
from iokernels.library import dispatch

CACHES = 13


def host_us(fn, calls=400):
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
    torch.cuda.synchronize()
    out.sort()
    return statistics.median(out), out[int(0.9 * len(out))]


def call_us(fn, calls=200):
    fn()
    torch.cuda.synchronize()
    fn()  # one in flight
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / calls


def runner(attend, q, caches):
    turn = itertools.cycle(caches)

    def call():
        k, v = next(turn)
        return attend(q, k, v)
    return call


def ours(q, k, v):
    return iot.attention(q, k, v)


def sdpa(backend):
    def attend(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return attend


impls = {"ours": ours, "FLASH": sdpa(SDPBackend.FLASH_ATTENTION), "CUDNN": sdpa(SDPBackend.CUDNN_ATTENTION)}
with torch.no_grad():
    for heads, B in itertools.product((64, 8), (1, 4)):
        q = torch.randn(B, heads, 1, 128, device="cuda", dtype=torch.float16)
        caches = [tuple(torch.randn(B, 8, 4096, 128, device="cuda", dtype=torch.float16) for _ in range(2))
                  for _ in range(CACHES)]
        fns = {name: runner(f, q, caches) for name, f in impls.items()}
        for rep in range(3):
            cells = []
            for name, fn in fns.items():
                h = host_us(fn)
                c = call_us(fn)
                cells.append(f"{name} host {h[0]:5.1f}/{h[1]:5.1f} call {c:6.1f}")
            print(f"{heads}:8 B {B} rep {rep}: " + "   ".join(cells), flush=True)
        hit = dispatch.TORCH_CALLS.hits, len(dispatch.TORCH_CALLS.entries)
        print(f"   torch fast-path entries {hit[1]}", flush=True)
    q = torch.randn(1, 8, 1, 128, device="cuda", dtype=torch.float16)
    caches = [tuple(torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.float16) for _ in range(2))
              for _ in range(CACHES)]
    fn = runner(ours, q, caches)
    fn()
    pr = cProfile.Profile()
    pr.enable()
    for i in range(2000):
        fn()
        if i % 50 == 49:
            torch.cuda.synchronize()
    pr.disable()
    st = io.StringIO()
    pstats.Stats(pr, stream=st).sort_stats("tottime").print_stats(30)
    print(st.getvalue()[:7000])
    sys.stdout.flush()
