"""CUDA-graph timing (iokernels.kernels.timing.graph_seconds, time_plan) on the GPU."""

import pytest

from iokernels.kernels import launch, timing
from iokernels.plan import make_plan

cp = pytest.importorskip("cupy")


def test_graph_seconds_is_per_launch_and_excludes_host_latency():
    x = cp.ones(1 << 26, dtype=cp.float32)  # 256 MiB: a copy of it takes ~0.1 ms on an H200
    y = cp.empty_like(x)
    one = timing.graph_seconds(lambda: cp.copyto(y, x), repeats=10)
    two = timing.graph_seconds(lambda: (cp.copyto(y, x), cp.copyto(x, y)), repeats=10)
    assert 1.7 < two / one < 2.3
    tiny = cp.zeros(1, dtype=cp.float32)
    # one element: the kernel itself takes a few microseconds; Python's launch path takes more
    assert timing.graph_seconds(lambda: tiny.fill(1.0), repeats=10) < 15e-6


def test_graph_seconds_rejects_bad_repeats():
    with pytest.raises(ValueError, match="repeats"):
        timing.graph_seconds(lambda: None, repeats=0)


def test_time_plan_total_is_about_the_sum_of_its_stages():
    plan = make_plan("standard", N_q=2048, d=64, dtype="float16", sram=96 * 1024, heads=8)
    inputs, _ = launch.make_device_inputs(plan, seed=3)
    total, stages = timing.time_plan(plan, inputs, repeats=5)
    assert set(stages) == {s.name for s in plan.stages}
    assert all(t > 0 for t in stages.values())
    assert 0.8 < total / sum(stages.values()) < 1.25


def test_call_mode_enqueues_the_in_flight_calls_before_its_timed_loop():
    """bench's call mode (iokernels.bench.clocks): IN_FLIGHT untimed calls, then `loop` timed ones; the figure is per
    timed call, so a loop of one call of ~n kernels' work reads about one call's GPU time, not two."""
    from iokernels.bench import clocks

    clock = clocks.CupyClock()
    x = cp.zeros(1 << 24, dtype=cp.float32)
    calls = []

    def fn():
        calls.append(1)
        with clock.on():
            x.__iadd__(1.0)

    one = clock.loop_seconds(fn, 1)
    assert len(calls) == 1 + clocks.IN_FLIGHT
    ten = clock.loop_seconds(fn, 10)
    assert len(calls) == 11 + 2 * clocks.IN_FLIGHT
    assert 0.5 * one < ten < 2.0 * one  # per call either way
