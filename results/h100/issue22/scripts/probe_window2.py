"""Development probe (plan level, CUDA-graph replays of the plain build; not a user-facing figure): why a window
(1024, 0) ran at half the speed of (512, 512) (the same tiles per block) in probe_window.py. Forward and backward,
d 64, fp16, N 16384, B 1 H 16; R_K (key rows the forward loads) from the model's pair sums."""
import sys

from iokernels.kernels import launch
from iokernels.plan import make_plan, pair_sums, visible_area

DIRS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["fwd", "bwd"]
for direction in DIRS:
    for name, kw in (("causal", dict(causal=True)), ("w(1024,0)", dict(window=(1024, 0))),
                     ("w(0,1024)", dict(window=(0, 1024))), ("w(512,512)", dict(window=(512, 512))),
                     ("w(1024,0) top_left", dict(window=(1024, 0), causal="top_left")),
                     ("dense N_k 1152", dict(N_k=1152)), ("w(1023,0)", dict(window=(1023, 0))),
                     ("w(1024,0) N_k+1", dict(window=(1024, 0), N_k=16385))):
        plan = make_plan("flash", "fast", **{"N_q": 16384, "d": 64, "dtype": "float16", "sram": 227 * 1024,
                                             "heads": 16, "direction": direction, **kw})
        inputs, _ = launch.make_device_inputs(plan, seed=0)
        total, _ = launch.time_plan(plan, inputs, repeats=5, warmup=2)
        area = visible_area(plan.N_q, plan.N_k, plan.causal, plan.window)
        flops = (4 if direction == "fwd" else 10) * 64 * area * plan.bh
        print(f"{direction} {name:20s} {plan.describe_tiles():30s} R_K {pair_sums(plan)['R_K']:9d} "
              f"{total * 1e3:8.3f} ms {flops / total / 1e12:7.1f} TFLOP/s", flush=True)
