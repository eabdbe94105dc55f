"""How the library runs a chain of plans: launched one by one, or captured once as a CUDA graph and replayed
(``graph=True``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ..kernels import launch
from ..kernels.runtime import require_cupy
from ..plan import Plan

MAX_GRAPHS = 16  # captured CUDA graphs kept (least recently used dropped first)


def _plan_inputs(plan: Plan, available: dict[str, Any]) -> dict[str, Any]:
    wanted = (*launch.INPUTS[plan.direction], *(("mask",) if plan.mask is not None else ()))
    return {n: available[n] for n in (*launch.plan_tensors(plan), "mask") if n in wanted and n in available}


_GRAPHS: OrderedDict[tuple, tuple[Any, list[dict[str, Any]]]] = OrderedDict()


def clear_graphs() -> None:
    """Drop the CUDA graphs ``graph=True`` captured, and the device buffers they hold."""
    _GRAPHS.clear()


def execute(chain: Sequence[Plan], inputs: dict[str, Any], scale: float, graph: bool, outputs: tuple[str, ...],
            raws: list[Any] | None = None) -> dict[str, Any]:
    """Run the plans in order on the current stream (each takes its inputs from ``inputs`` and from the
    previous plan's buffers); return the last plan's ``outputs``. ``raws``: one slot per plan for its
    prepared launches (``launch.GpuRun.raw``, at this ``scale`` on the current device), kept by the
    caller's dispatch cache and filled here at a plan's first run (not by the counting build)."""
    if graph:
        return _replay(list(chain), inputs, scale, outputs)
    available = dict(inputs)
    for i, plan in enumerate(chain):
        run = launch.run_plan(plan, _plan_inputs(plan, available), scale=scale, raw=None if raws is None else raws[i])
        if raws is not None and run.raw is not None:
            raws[i] = run.raw
        buffers = run.buffers
        available = {**_passed_on(buffers), **inputs}  # the rest of this plan's buffers are released
    return {n: buffers[n] for n in outputs if n in buffers}


def _passed_on(buffers: dict[str, Any]) -> dict[str, Any]:
    """What a plan's buffers hand to the next plan of a chain (the standard forward's P)."""
    return {n: b for n, b in buffers.items() if n in launch.INPUTS["bwd"]}


def _replay(chain: list[Plan], inputs: dict[str, Any], scale: float, outputs: tuple[str, ...]) -> dict[str, Any]:
    """The launches of ``chain`` as one CUDA graph, captured the first time these plans meet inputs at
    these device addresses and replayed after; the outputs come back as copies (the graph's own
    buffers are overwritten by its next replay)."""
    cp = require_cupy()
    key = (tuple(chain), scale, cp.cuda.Device().id, tuple(sorted((n, x.data.ptr) for n, x in inputs.items())))
    entry = _GRAPHS.pop(key, None)
    if entry is None:
        runs, available = [], dict(inputs)
        for plan in chain:
            buffers, _ = launch.allocate(plan, _plan_inputs(plan, available))
            runs.append((plan, buffers))
            available = {**_passed_on(buffers), **inputs}
        graph = launch.capture_plans(runs, scale)
        # the graph keeps its workspace and outputs alive, not the caller's arrays: a later call whose
        # inputs sit at the same addresses (with the same shapes: the plans are in the key) replays it
        owned = [{n: b for n, b in buffers.items() if b is not inputs.get(n)} for _, buffers in runs]
        entry = (graph, owned)
    _GRAPHS[key] = entry
    while len(_GRAPHS) > MAX_GRAPHS:
        _GRAPHS.popitem(last=False)
    graph, owned = entry
    graph.launch(cp.cuda.get_current_stream())
    return {n: owned[-1][n].copy() for n in outputs if n in owned[-1]}
