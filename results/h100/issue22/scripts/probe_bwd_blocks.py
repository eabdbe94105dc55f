"""Development probe (plan level, CUDA-graph replays of the plain build; not a user-facing figure): is the window
backward slow per step or per block? The tma backward (fp16, H 16) on a window (1024, 0) at N 16384 against dense
problems whose blocks have as many steps (N_q 1152 queries per key block: 18 steps of 64 at d 128, 9 of 128 at d 64)
and against the dense N 16384 backward; inputs made on the device (no host reference)."""
import cupy as cp

from iokernels.kernels import launch
from iokernels.plan import make_plan, pair_sums, visible_area


def device_inputs(plan):
    rng = cp.random.default_rng(0)
    bh, bhk = plan.bh, plan.bh_kv
    out = {}
    for name, rows, n in (("Q", bh, plan.N_q), ("K", bhk, plan.N_k), ("V", bhk, plan.N_k), ("O", bh, plan.N_q),
                          ("dO", bh, plan.N_q)):
        out[name] = rng.standard_normal((rows, n, plan.d), dtype=cp.float32).astype(cp.float16)
    out["lse"] = cp.full((bh, plan.N_q), 8.0, dtype=cp.float32)
    return {k: v for k, v in out.items() if k in launch.plan_tensors(plan)}


for d in (64, 128):
    for name, kw in (("w(1024,0) N 16384", dict(N_q=16384, window=(1024, 0))),
                     ("dense N_q 1152 N_k 16384", dict(N_q=1152, N_k=16384)),
                     ("dense N 16384", dict(N_q=16384))):
        plan = make_plan("flash", "fast", d=d, dtype="float16", sram=227 * 1024, heads=16, direction="bwd", **kw)
        total, stages = launch.time_plan(plan, device_inputs(plan), repeats=5, warmup=2)
        main = stages["main"]
        area = visible_area(plan.N_q, plan.N_k, plan.causal, plan.window)
        computed = pair_sums(plan)["A_S"] if plan.window is not None else plan.N_q * plan.N_k
        steps = -(-computed // (plan.tile["Br"] * plan.tile["Bc"])) // plan.tile["Tc"]
        print(f"d {d} {name:26s} {plan.describe_tiles():34s} ~{steps} steps/block  total {total * 1e3:7.3f} ms "
              f"main {main * 1e3:7.3f} ms: visible {10 * d * area * 16 / total / 1e12:6.1f}, computed (main) "
              f"{10 * d * computed * 16 / main / 1e12:6.1f} TFLOP/s", flush=True)
