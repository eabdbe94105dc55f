"""Development probe (plan level, CUDA-graph replays of the plain build; not a user-facing figure): a window
(1024, 0) at N 16384, B 1 H 16, fp16, d 64 and 128, at several tma tilings (forward B_r x B_c; backward the
defaults), against the dense plans; TFLOP/s on the visible elements and on the computed (visited) tiles."""
from iokernels.kernels import launch
from iokernels.plan import make_plan, pair_sums, visible_area, with_window
from iokernels.plan.fast import make_fast_plan

N = 16384
for d in (64, 128):
    cases = [("fwd dense", make_plan("flash", "fast", N_q=N, d=d, dtype="float16", sram=227 * 1024, heads=16))]
    for tiles in ((128, 128), (192, 128), (128, 64), (192, 64)):
        try:
            plan = make_fast_plan(N_q=N, d=d, dtype="float16", heads=16, kernel="tma", block_r=tiles[0],
                                  block_c=tiles[1], causal=True)
            cases.append((f"fwd w1024 {tiles}", with_window(plan, (1024, 0))))
        except Exception as exc:
            print(f"d {d} fwd {tiles}: {type(exc).__name__}: {exc}")
    cases.append(("bwd dense", make_plan("flash", "fast", N_q=N, d=d, dtype="float16", sram=227 * 1024, heads=16,
                                          direction="bwd")))
    cases.append(("bwd causal", make_plan("flash", "fast", N_q=N, d=d, dtype="float16", sram=227 * 1024, heads=16,
                                           direction="bwd", causal=True)))
    cases.append(("bwd w1024", make_plan("flash", "fast", N_q=N, d=d, dtype="float16", sram=227 * 1024, heads=16,
                                         direction="bwd", window=(1024, 0))))
    for name, plan in cases:
        inputs, _ = launch.make_device_inputs(plan, seed=0)
        total, stages = launch.time_plan(plan, inputs, repeats=5, warmup=2)
        per = 4 if plan.direction == "fwd" else 10
        area = visible_area(plan.N_q, plan.N_k, plan.causal, plan.window)
        computed = pair_sums(plan)["A_S"] if plan.window is not None or plan.causal else N * N
        main = stages["main"]
        print(f"d {d} {name:22s} {plan.describe_tiles():32s} {total * 1e3:7.3f} ms (main {main * 1e3:7.3f}) "
              f"visible {per * d * area * 16 / total / 1e12:6.1f} computed {per * d * computed * 16 / main / 1e12:6.1f}"
              " TFLOP/s", flush=True)
