"""Run every plan and put measured bytes next to the model's prediction.

On a GPU the counting build of each plan's kernels runs once (bytes, and the output checked against
the float64 reference), then the plain build is timed: the whole plan and each stage alone, as CUDA-graph replays of
back-to-back launches timed with CUDA events (warm-up, median), so host launch latency is not counted
as kernel time (:func:`iokernels.kernels.launch.graph_seconds`). Without a GPU, or with ``--simulate``, the
plans run through the CPU simulator, and the report says so in its header.
"""

from __future__ import annotations

import datetime
import platform

import numpy as np

from ..model.specs import GpuSpec
from ..plan import Plan
from ..plan.tensors import OUTPUTS
from ..simulate import make_inputs, max_relative_error, reference_outputs, simulate
from .report import Measured, build

SIM_MEMORY_LIMIT = 6 * 1024**3  # bytes of float64 arrays the simulator may hold at once


def simulator_memory_bytes(plan: Plan) -> int:
    """A bound on the float64 arrays one simulated run holds (inputs, workspace, reference)."""
    big = plan.N_q * plan.N_k * plan.bh
    small = (plan.N_q + plan.N_k) * plan.d * plan.bh
    return 8 * (6 * big + 12 * small)


def check_simulator_size(plans: list[Plan]) -> None:
    need = max(simulator_memory_bytes(p) for p in plans)
    if need > SIM_MEMORY_LIMIT:
        raise ValueError(
            f"the simulator would need about {need / 1024**3:.1f} GiB of float64 arrays for this size "
            f"(limit {SIM_MEMORY_LIMIT / 1024**3:.0f} GiB): use smaller N or batch*heads, or `iokernels model`"
        )


def run_simulated(plan: Plan, seed: int = 0) -> Measured:
    inputs = make_inputs(plan, seed)
    result = simulate(plan, inputs)
    err = max_relative_error(result.outputs, reference_outputs(plan, inputs))
    return Measured(counts=result.counts, max_rel_err=err)


def run_gpu(plan: Plan, seed: int = 0, repeats: int = 10, reference_check: bool = True) -> Measured:
    """Counting build once (bytes, output check), then the plain build timed."""
    from ..kernels import launch

    inputs, host = launch.make_device_inputs(plan, seed)
    run = launch.run_plan(plan, inputs, counting=True)
    err = None
    if reference_check:
        want = reference_outputs(plan, host)
        got = {name: launch.to_float64(run.buffers[name], plan.dtype) for name in want}
        err = max_relative_error(got, want)
    outputs = sum(int(run.buffers[n].nbytes) for n in OUTPUTS[plan.direction])
    extra, counts = run.workspace_bytes - outputs, run.counts
    del run  # free the workspace before timing
    seconds, stage_seconds = launch.time_plan(plan, inputs, repeats=repeats)
    return Measured(counts=counts, seconds=seconds, stage_seconds=stage_seconds, max_rel_err=err,
                    peak_memory_bytes=extra)


def environment() -> dict:
    """GPU, versions and date, for results that are committed."""
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "numpy": np.__version__}
    try:
        import cupy

        rt = cupy.cuda.runtime
        props = rt.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"]
        env.update(gpu=name.decode() if isinstance(name, bytes) else str(name), cupy=cupy.__version__,
                   cuda_runtime=rt.runtimeGetVersion(), cuda_driver=rt.driverGetVersion())
    except Exception:  # no cupy or no device: the CPU-only fields stay
        pass
    return env


def compare(plans: list[Plan], spec: GpuSpec, *, on_gpu: bool, reason: str = "", seed: int = 0,
            repeats: int = 10, reference_check: bool = True) -> dict:
    """The report document for ``plans``: measured bytes (GPU counters, or the simulator's) beside
    the model's, with timings on the GPU. ``reference_check=False`` skips the float64 reference on
    the host for GPU runs (``max_rel_err`` stays None), which dominates large sweeps' host time."""
    if on_gpu:
        from ..kernels.launch import underfill_note

        measured = {p.label: run_gpu(p, seed, repeats, reference_check) for p in plans}
        notes = [n for n in (underfill_note(p, spec.sms) for p in plans) if n]
        note = "GPU: counting build for bytes, plain build timed (CUDA events around CUDA-graph " \
               f"replays, median of {repeats} after 3 warm-ups)"
        doc = build(plans, spec, "gpu", measured, note)
        doc["header"]["warnings"] = notes
    else:
        check_simulator_size(plans)
        measured = {p.label: run_simulated(p, seed) for p in plans}
        doc = build(plans, spec, "simulator", measured,
                    f"CPU simulator ({reason}): bytes counted tile by tile in numpy, no timings")
    doc["header"]["environment"] = environment()
    return doc
