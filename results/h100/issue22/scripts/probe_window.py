"""Development probe (plan level, CUDA-graph replays of the plain build; not a user-facing figure): TFLOP/s counted
on the visible elements (4 d per element forward, 10 d backward) of a sliding window 1024 at N 16384 against
the dense causal plan, d 64 and 128, fp16, B 1 H 16."""
from iokernels.kernels import launch
from iokernels.plan import make_plan, visible_area

for d in (64, 128):
    for direction, flops_per in (("fwd", 4), ("bwd", 10)):
        for name, kw in (("causal", dict(causal=True)), ("window 1024", dict(window=(1024, 0))),
                         ("window 1024 causal", dict(causal=True, window=(1024, 0))),
                         ("window (512, 512)", dict(window=(512, 512)))):
            plan = make_plan("flash", "fast", N_q=16384, d=d, dtype="float16", sram=227 * 1024, heads=16,
                             direction=direction, **kw)
            inputs, _ = launch.make_device_inputs(plan, seed=0)
            total, _ = launch.time_plan(plan, inputs, repeats=5, warmup=2)
            area = visible_area(plan.N_q, plan.N_k, plan.causal, plan.window)
            tflops = flops_per * d * area * plan.bh / total / 1e12
            print(f"d {d} {direction} {name:20s} {total * 1e3:8.3f} ms {tflops:7.1f} TFLOP/s (visible area)",
                  flush=True)
