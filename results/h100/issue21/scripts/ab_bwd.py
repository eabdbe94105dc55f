# A/B of the sm_90 backward kernels: the whole backward plan (prep + main + dq) graph-timed by launch.time_plan,
# inputs made on the GPU (random Q, K, V, dO; O and lse from the default forward plan)
import sys
import cupy as cp
from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.variants import with_causal
cases = [(64, "float16", 4096, ""), (64, "bfloat16", 4096, ""), (128, "float16", 4096, ""), (128, "bfloat16", 4096, ""),
         (64, "float16", 16384, ""), (128, "float16", 16384, ""), (64, "float16", 4096, "bottom_right"),
         (128, "float16", 4096, "bottom_right"), (32, "float16", 4096, ""), (96, "float16", 4096, "")]
kernels = sys.argv[1].split(",") if len(sys.argv) > 1 else ["wgmma", "tma"]
for d, dtype, n, causal in cases:
    bh = 262144 // n
    batch, heads = max(1, bh // 16), min(16, bh)
    fplan = make_plan("flash", "fast", N_q=n, d=d, dtype=dtype, sram=227 * 1024, batch=batch, heads=heads, causal=causal)
    rnd = lambda: launch.to_device(cp.random.standard_normal((bh, n, d), dtype=cp.float32), dtype)
    fin = {"Q": rnd(), "K": rnd(), "V": rnd()}
    frun = launch.run_plan(fplan, fin, counting=False)
    row = []
    for kernel in kernels:
        plan = with_causal(make_fast_backward_plan(N_q=n, d=d, dtype=dtype, batch=batch, heads=heads, kernel=kernel), causal)
        inputs = {**fin, "O": frun.buffers["O"], "lse": frun.buffers["lse"], "dO": rnd()}
        tot, st = launch.time_plan(plan, inputs, repeats=20)
        flops = 2.5 * 4 * plan.bh * n * n * d * (0.5 if causal else 1)
        row.append(f"{kernel} {flops / tot / 1e12:6.1f} (main {flops / st['main'] / 1e12:6.1f})")
    print(f"bwd d {d} {dtype} N {n} {causal or 'full'}: " + " | ".join(row), flush=True)
