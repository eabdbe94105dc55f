"""Timing on the GPU, the one method of the plans' kernels: CUDA-graph replays of back-to-back launches with CUDA
events around each replay (:func:`graph_seconds`, :func:`time_plan`), and CUDA events around each call for long
library calls such as a large copy (:func:`event_seconds`, :func:`copy_bandwidth`). The library calls of ``iokernels
bench`` are timed by :mod:`iokernels.bench.clocks` the same two ways."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from ..plan import Plan, Stage
from ..simulate import reference
from .launch import allocate, compile_plan, launch_stage, new_counters
from .runtime import require_cupy

# Timing of long library calls (a large copy, a cuBLAS product): CUDA events around each call, which is long
# enough that the host's launch latency does not count; the plans' kernels are timed by graph_seconds below.

def event_seconds(fn: Callable[[], Any], *, warmup: int = 3, repeats: int = 20) -> float:
    """Median seconds of one ``fn()`` over ``repeats`` calls after ``warmup``, CUDA events around each."""
    cp = require_cupy()
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 1 << 30, *, warmup: int = 3, repeats: int = 20) -> float:
    """Bytes read + written per second by a device-to-device copy of ``nbytes`` (``cupy.copyto``)."""
    cp = require_cupy()
    src, dst = cp.ones(nbytes // 4, dtype=cp.float32), cp.empty(nbytes // 4, dtype=cp.float32)
    return 2 * src.nbytes / event_seconds(lambda: cp.copyto(dst, src), warmup=warmup, repeats=repeats)


# Timing: CUDA-graph replays of back-to-back launches, CUDA events around each replay. A stage of a
# few microseconds launched from Python would otherwise time the host's launch latency, not the GPU.
GRAPH_TARGET_SECONDS = 2e-3  # each timed replay runs about this long (more launches for short kernels)
GRAPH_MAX_LAUNCHES = 200


def graph_seconds(launch: Callable[[], None], *, warmup: int = 3, repeats: int = 10) -> float:
    """Median GPU seconds of one ``launch()`` (which must only enqueue kernels on cupy's current
    stream, allocating nothing): ``launch`` is captured k times into a CUDA graph, k chosen so a
    replay runs about :data:`GRAPH_TARGET_SECONDS`; each of ``repeats`` replays after ``warmup`` is
    timed with CUDA events and divided by k."""
    cp = require_cupy()
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    stream = cp.cuda.Stream(non_blocking=True)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    with stream:
        launch()  # compiles and loads what it needs: nothing may do so during capture
        start.record(stream)
        launch()
        stop.record(stream)
        stop.synchronize()
        once = cp.cuda.get_elapsed_time(start, stop) / 1e3
        k = max(1, min(GRAPH_MAX_LAUNCHES, math.ceil(GRAPH_TARGET_SECONDS / max(once, 1e-9))))
        stream.begin_capture()
        try:
            for _ in range(k):
                launch()
        finally:
            graph = stream.end_capture()
        for _ in range(warmup):
            graph.launch(stream)
        times = []
        for _ in range(repeats):
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3 / k)
    return statistics.median(times)


def time_plan(plan: Plan, inputs: dict[str, Any], *, counting: bool = False, warmup: int = 3, repeats: int = 10,
              scale: float | None = None) -> tuple[float, dict[str, float]]:
    """Median GPU seconds of the whole plan and of each stage alone (:func:`graph_seconds`). The plan runs once first,
    so every stage reads the intermediate tensors it would in a real run; a stage replayed alone recomputes (or, for
    accumulating stages, keeps adding to) the same buffers, which changes values but not the work done."""
    scale = reference.default_scale(plan.d) if scale is None else scale
    buffers, _ = allocate(plan, inputs)
    counters = new_counters() if counting else None
    compile_plan(plan, counting)

    def run(stages: tuple[Stage, ...]) -> Callable[[], None]:
        def launch() -> None:
            for stage in stages:
                launch_stage(plan, stage, buffers, scale, counting, counters)
        return launch

    total = graph_seconds(run(plan.stages), warmup=warmup, repeats=repeats)
    per_stage = {s.name: graph_seconds(run((s,)), warmup=warmup, repeats=repeats) for s in plan.stages}
    return total, per_stage
