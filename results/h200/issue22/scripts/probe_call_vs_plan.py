"""Issue #22: 8 documents of 2048 and the dense forward (N 16384, B 1, H 16, fp16, d 64 and 128) timed three ways in
one process, alternating, ROUNDS rounds: the plan alone (kernels.timing.time_plan, CUDA-graph replays), the public torch
call back to back (iokernels.torch.attention, CUDA events around CALLS calls) and that call captured in a CUDA graph
(replays timed the same way). Tells whether the documents' gap to the dense rate in bench (t2-05dda5e: 0.80 at d 128)
is the kernels' or the call's. TFLOP/s on the visible elements, best and median of the rounds. Run from the repository
root with PYTHONPATH=.."""
import os
import statistics

import cupy as cp
import numpy as np
import torch

import iokernels.torch as iot
from iokernels.kernels.timing import time_plan
from iokernels.plan import make_plan
from iokernels.plan.varlen import make_documents_plan

ROUNDS, CALLS, H, N = int(os.environ.get("ROUNDS", "5")), 20, 16, 16384
DOCS = (2048,) * 8


def events(fn, calls=CALLS):
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def graphed(fn):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay


for d in (64, 128):
    q, k, v = (torch.randn(1, H, N, d, device="cuda", dtype=torch.float16) for _ in range(3))
    cu = cp.asarray(np.concatenate([[0], np.cumsum(DOCS)]), dtype=cp.int32)
    flat = {"Q": cp.asarray(q.view(H, N, d)), "K": cp.asarray(k.view(H, N, d)), "V": cp.asarray(v.view(H, N, d))}
    cases = {
        "documents": (4.0 * d * H * sum(n * n for n in DOCS),
                      make_documents_plan(DOCS, d=d, dtype="float16", heads=H),
                      {**flat, "cu_seqlens_q": cu, "cu_seqlens_k": cu},
                      lambda q=q, k=k, v=v: iot.attention(q, k, v, documents=DOCS)),
        "dense": (4.0 * d * H * N * N, make_plan("flash", "fast", N_q=N, d=d, dtype="float16", sram=227 * 1024,
                                                   heads=H), flat, lambda q=q, k=k, v=v: iot.attention(q, k, v)),
    }
    ways = {}
    for name, (_, plan, inputs, call) in cases.items():
        ways[name, "plan"] = lambda plan=plan, inputs=inputs: time_plan(plan, inputs, repeats=CALLS, warmup=2)[0]
        ways[name, "call"] = lambda call=call: events(call)
        replay = graphed(call)
        ways[name, "graph"] = lambda replay=replay: events(replay)
    seconds = {key: [] for key in ways}
    for _ in range(ROUNDS):
        for key, way in ways.items():
            seconds[key].append(way())
    for (name, how), got in seconds.items():
        flops = cases[name][0]
        print(f"d {d} {name:9s} {how:5s}: best {flops / min(got) / 1e12:6.1f} median "
              f"{flops / statistics.median(got) / 1e12:6.1f} TFLOP/s ({min(got) * 1e3:.4f} ms)", flush=True)
    for how in ("plan", "call", "graph"):
        rate = {name: cases[name][0] / min(seconds[name, how]) for name in cases}
        ratio = rate["documents"] / rate["dense"]
        print(f"d {d} documents / dense, {how}: {ratio:.3f}", flush=True)
