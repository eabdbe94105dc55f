"""Development probe (plan level, CUDA-graph replays of the plain build; not a user-facing figure): the tma forward
with a persistent grid (PERSISTENT, at most 132 blocks taking work items in turn) against one block per item, on the
same tiles: dense, causal and a window (1024, 0), fp16, B 1 H 16, N 16384 (and N 4096 B 4)."""
from dataclasses import replace

from iokernels.kernels import launch
from iokernels.plan import make_plan, visible_area, with_causal, with_window
from iokernels.plan.fast import make_fast_plan


def one_block_per_item(plan):
    stage = plan.stages[0]
    params = tuple(p for p in stage.params if p[0] != "PERSISTENT")
    grid = (plan.tile["Tr"], 1, plan.bh)
    return replace(plan, stages=(replace(stage, params=params, grid=grid),))


for n, batch in ((16384, 1), (4096, 4)):
    for d in (64, 128):
        for name, variant in (("dense", lambda p: p), ("causal", lambda p: with_causal(p, True)),
                              ("w(1024,0)", lambda p: with_window(p, (1024, 0)))):
            base = variant(make_fast_plan(N_q=n, d=d, dtype="float16", batch=batch, heads=16, kernel="tma",
                                          block_r=128, block_c=128, causal=name != "dense"))
            for label, plan in (("persistent", base), ("per item", one_block_per_item(base))):
                inputs, _ = launch.make_device_inputs(plan, seed=0)
                total, _ = launch.time_plan(plan, inputs, repeats=7, warmup=2)
                area = visible_area(plan.N_q, plan.N_k, plan.causal, plan.window)
                print(f"N {n} d {d} {name:10s} {label:10s} grid {plan.stages[0].grid} {total * 1e3:7.3f} ms "
                      f"{4 * d * area * plan.bh / total / 1e12:6.1f} TFLOP/s (visible)", flush=True)
        if d == 64:
            plan = make_plan("flash", "fast", N_q=n, d=d, dtype="float16", sram=227 * 1024, batch=batch, heads=16)
            inputs, _ = launch.make_device_inputs(plan, seed=0)
            total, _ = launch.time_plan(plan, inputs, repeats=7, warmup=2)
            print(f"N {n} d {d} dense      default {plan.describe_tiles()} {total * 1e3:7.3f} ms "
                  f"{4 * d * n * n * plan.bh / total / 1e12:6.1f} TFLOP/s", flush=True)
