"""create_block_mask on the GPU (kernels/mod_blocks.cu) against the CPU (numpy), N 16384: a document table (8
documents) and a causal sliding window of 1024; the GPU's first call (compile) apart, then the median of 5 calls
each (the levels copied back included), and whether both give the same block mask."""
import statistics
import time

import cupy as cp
import numpy as np

import iokernels

n = 16384
doc = np.repeat(np.arange(8, dtype=np.int32), n // 8)
for name, expr, caps in (("docs8", "doc[q_idx] == doc[kv_idx]", {"doc": doc}),
                         ("window1024", "kv_idx <= q_idx && q_idx - kv_idx <= 1024", {})):
    dev = {k: cp.asarray(v) for k, v in caps.items()}
    t0 = time.perf_counter()
    first = iokernels.create_block_mask(expr, n, n, captures=dev, on_gpu=True)
    compile_s = time.perf_counter() - t0
    times = {}
    for where, c in (("gpu", dev), ("cpu", caps)):
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            bm = iokernels.create_block_mask(expr, n, n, captures=c, on_gpu=where == "gpu")
            cp.cuda.runtime.deviceSynchronize()
            ts.append(time.perf_counter() - t0)
        times[where] = (statistics.median(ts), bm)
    same = times["gpu"][1] == times["cpu"][1] == first
    print(f"{name}: first GPU call {compile_s * 1e3:.1f} ms, then GPU {times['gpu'][0] * 1e3:.2f} ms, "
          f"CPU {times['cpu'][0] * 1e3:.1f} ms, same block mask: {same}", flush=True)
