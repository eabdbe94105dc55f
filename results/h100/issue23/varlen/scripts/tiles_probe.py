"""The variable-length forward at d 64 in tiles of 128 and 192 query rows (plain build, graph replays of the plan alone,
kernels.timing.time_plan), on bench --varlen's problem (64 sequences of lengths uniform in 1..8192, seed 0, 16 heads,
float16), causal and not; TFLOP/s on the real tokens. Run from the repository root with PYTHONPATH=.."""
import cupy as cp
import numpy as np

from iokernels.bench.varlen import VarlenProblem
from iokernels.kernels.timing import time_plan
from iokernels.plan.varlen import make_varlen_plan

for causal in (False, True):
    problem = VarlenProblem(d=64, causal=causal)
    lengths = problem.lengths
    total = sum(lengths)
    cu = cp.asarray(np.concatenate([[0], np.cumsum(lengths)]), dtype=cp.int32)
    rng = cp.random.default_rng(0)
    q, k, v = (rng.standard_normal((total, 16, 64), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    for block_r in (128, 192):
        plan = make_varlen_plan(d=64, dtype="float16", heads=16, lengths_q=lengths, causal=causal, block_r=block_r)
        seconds, _ = time_plan(plan, {"Q": q, "K": k, "V": v, "cu_seqlens_q": cu, "cu_seqlens_k": cu}, repeats=10)
        print(f"d 64 causal={causal} B_r {block_r}: {seconds * 1e3:.3f} ms, {problem.flops('fwd') / seconds / 1e12:.1f} "
              "TFLOP/s real", flush=True)
