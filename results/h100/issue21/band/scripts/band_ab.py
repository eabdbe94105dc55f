"""Causal tma forward and backward (main stage), plan alone in CUDA-graph replays (kernels.timing.time_plan, median of
10 replays): the grid in bands of heads (HEAD_BAND, the plan's) against one head after another (the same plan without
it), interleaved A B A B A B on the same inputs. B·H·N = 262,144, 16 heads, fp16 (and bf16 at d 128, N 4096);
TFLOP/s at 2·N²·d per head forward (causal: the visible half), 2.5× that backward."""
import statistics
from dataclasses import replace

import cupy as cp

from iokernels.kernels import launch
from iokernels.kernels.timing import time_plan
from iokernels.plan import make_plan
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.variants import with_causal


def without_band(plan):
    return replace(plan, stages=tuple(replace(s, params=tuple(p for p in s.params if p[0] != "HEAD_BAND"))
                                      for s in plan.stages))


for dtype, cases in (("float16", ((64, 4096), (128, 4096), (64, 8192), (128, 16384))), ("bfloat16", ((128, 4096),))):
    for d, n in cases:
        bh = 262144 // n
        rng = cp.random.default_rng(0)
        x = [launch.to_device(rng.standard_normal((bh, n, d), dtype=cp.float32), dtype) for _ in range(4)]
        fplan = make_plan("flash", "fast", N_q=n, d=d, dtype=dtype, sram=227 * 1024, batch=bh // 16, heads=16,
                          causal=True)
        frun = launch.run_plan(fplan, {"Q": x[0], "K": x[1], "V": x[2]}, counting=False)
        bplan = with_causal(make_fast_backward_plan(N_q=n, d=d, dtype=dtype, batch=bh // 16, heads=16, kernel="tma"),
                            True)
        binputs = {"Q": x[0], "K": x[1], "V": x[2], "O": frun.buffers["O"], "lse": frun.buffers["lse"], "dO": x[3]}
        flops = 2.0 * bh * n * n * d
        res = {"fwd": {"band": [], "heads": []}, "bwd": {"band": [], "heads": []}}
        for _ in range(3):
            for label, f in (("band", lambda p: p), ("heads", without_band)):
                t, _ = time_plan(f(fplan), {"Q": x[0], "K": x[1], "V": x[2]}, repeats=10)
                res["fwd"][label].append(flops / t / 1e12)
                _, st = time_plan(f(bplan), binputs, repeats=10)
                res["bwd"][label].append(2.5 * flops / st["main"] / 1e12)
        bands = (dict(fplan.stage("main").params).get("HEAD_BAND"), dict(bplan.stage("main").params).get("HEAD_BAND"))
        cells = []
        for direction in ("fwd", "bwd"):
            a, b = (statistics.median(res[direction][k]) for k in ("band", "heads"))
            cells.append(f"{direction} band {a:6.1f} heads {b:6.1f} ({a / b:.3f}) "
                         f"[{' '.join(f'{v:.0f}' for v in res[direction]['band'])} | "
                         f"{' '.join(f'{v:.0f}' for v in res[direction]['heads'])}]")
        print(f"{dtype} d {d} N {n} bands {bands}: " + "   ".join(cells), flush=True)
