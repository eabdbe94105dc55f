"""Development probe (plan level, CUDA-graph replays of the plain build, timing.time_plan: the prep, main and dq
stages; not a user-facing figure): the non-causal tma backward as a persistent grid taking the host's list of items
(ITEM_LIST, plan.fast_bwd.with_item_list) against its default grid of a block per (key block, K/V head), the same
tiles, alternating, three rounds; dK and dV bitwise equal, dQ (added by the copy engine in another order) within 1e-2
relative. Usage: python3 list_probe_dense_bwd.py (B·H·N = 262,144, 16 heads; d 64 and 128, N 4096 and 16384)."""
import cupy as cp
import numpy as np

from iokernels.kernels import launch
from iokernels.kernels.timing import time_plan
from iokernels.plan import make_plan, visible_area
from iokernels.plan.fast_bwd import with_item_list

CASES = [(4096, 4, 128, "float16"), (4096, 4, 128, "bfloat16"), (16384, 1, 128, "float16"), (4096, 4, 64, "float16"),
         (16384, 1, 64, "float16")]
for n, batch, d, dtype in CASES:
    grid = make_plan("flash", "fast", N_q=n, d=d, dtype=dtype, sram=227 * 1024, batch=batch, heads=16,
                     direction="bwd")
    listed = with_item_list(grid)
    assert dict(listed.stage("main").params).get("ITEM_LIST"), listed.stage("main").params
    plans = {"list": listed, "grid": grid}
    inputs, _ = launch.make_device_inputs(grid, seed=0)
    outs = {k: {t: cp.asnumpy(launch.run_plan(p, inputs, counting=False).buffers[t]) for t in ("dK", "dV", "dQ")}
            for k, p in plans.items()}
    same = all((outs["list"][t].view("u2") == outs["grid"][t].view("u2")).all() for t in ("dK", "dV"))
    a, b = (outs[k]["dQ"].astype(np.float32) for k in plans)
    dq_rel = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    flops = 2.5 * 4 * d * visible_area(n, n, "", None) * grid.bh
    times = {k: [] for k in plans}
    mains = {k: [] for k in plans}
    for _ in range(3):
        for k, p in plans.items():
            total, stages = time_plan(p, inputs, repeats=7, warmup=2)
            times[k].append(total)
            mains[k].append(stages["main"])
    line = " ".join(f"{k} {min(v) * 1e3:.4f} ms ({flops / min(v) / 1e12:.1f} TFLOP/s; main {min(mains[k]) * 1e3:.4f}; "
                    f"{' '.join(f'{x * 1e3:.4f}' for x in v)})" for k, v in times.items())
    print(f"bwd N {n} B {batch} H 16 d {d} {dtype}: {line}; grid/list {min(times['grid']) / min(times['list']):.3f}x "
          f"(main {min(mains['grid']) / min(mains['list']):.3f}x); dK dV bitwise equal {bool(same)}; dQ max rel diff "
          f"{dq_rel:.2e}", flush=True)
