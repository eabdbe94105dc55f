"""Run every plan and put measured bytes next to the model's prediction.

On a GPU the counting build of each plan's kernels runs once (bytes, and the output checked against
the float64 reference), then the plain build is timed: the whole plan and each stage alone, as CUDA-graph replays of
back-to-back launches timed with CUDA events (warm-up, median), so host launch latency is not counted
as kernel time (:func:`iokernels.kernels.timing.graph_seconds`). Without a GPU, or with ``--simulate``, the
plans run through the CPU simulator, and the report says so in its header.

The simulator runs one batch-head of each plan (:func:`one_batch_head`: the same plan with batch = heads = 1)
and multiplies its counts by batch*heads (:func:`scaled_counts`). That is exact because every batch-head runs
the same schedule on the same tiles and moves the same bytes: the causal mask, the block mask (one for all
batch-heads) and the explicit mask (read once per batch-head, shared or not) are the same for each, and
dropout moves no bytes. Grouped-query attention (kv_heads < heads) breaks it: K and V rows are per K/V
head, so those plans are simulated in full. ``max_rel_err`` is then that of the one batch-head simulated. A causal
tma plan's list of items (tensor ``work``) belongs to the whole grid: its bytes are the simulator's walk of the
whole plan's list (:func:`iokernels.simulate.item_list_counts`).

``compare``'s defaults (:func:`filling_problem`): heads = 16, as the paper's GPT-2 runs, and the smallest
batch whose smallest grid among the plans' stages has at least one thread block per SM, in waves at least 90 %
full, within a memory bound.
"""

from __future__ import annotations

import dataclasses
import datetime
import platform
from collections.abc import Callable

import numpy as np

from ..model.specs import GpuSpec
from ..plan import Plan
from ..plan.fast import listed
from ..plan.tensors import OUTPUTS, Counts
from ..plan.units import format_bytes
from ..simulate import item_list_counts, make_inputs, max_relative_error, reference_outputs, simulate
from .report import Measured, build

SIM_MEMORY_LIMIT = 6 * 1024**3  # bytes of float64 arrays the simulator may hold at once


def simulator_memory_bytes(plan: Plan) -> int:
    """A bound on the float64 arrays one simulated run holds (inputs, workspace, reference)."""
    big = plan.N_q * plan.N_k * plan.bh
    small = (plan.N_q + plan.N_k) * plan.d * plan.bh
    return 8 * (6 * big + 12 * small)


def one_batch_head(plan: Plan) -> Plan | None:
    """``plan`` for batch = heads = 1 (grids' batch*heads extent 1), when every batch-head of ``plan`` moves
    the same bytes, so that its counts times batch*heads are ``plan``'s exactly; None where they do not
    (grouped-query attention: K and V are read per K/V head; a variable-length batch's sequences differ; a
    programmable variant's expressions read b or h) or there is one batch-head already."""
    if plan.bh == 1 or plan.kv_heads != plan.heads or plan.varlen is not None:
        return None
    if plan.mods is not None and any({"b", "h"} & e.names for e in plan.mods.parsed().values()):
        return None  # (a variant's expressions that read the batch or head: the heads' reads may differ)
    stages = tuple(dataclasses.replace(s, grid=(s.grid[0], s.grid[1], 1)) if s.grid[2] == plan.bh else s
                   for s in plan.stages)
    # (ALiBi: the first batch-head's slope; the bytes do not depend on the slopes' values)
    alibi = None if plan.alibi is None else plan.alibi[:1]
    return dataclasses.replace(plan, batch=1, heads=1, kv_heads=1, stages=stages, alibi=alibi)


def scaled_counts(counts: Counts, factor: int) -> Counts:
    """Every (read, written) count times ``factor``."""
    return {stage: {t: (r * factor, w * factor) for t, (r, w) in tensors.items()} for stage, tensors in counts.items()}


def simulated_plan(plan: Plan) -> Plan:
    """The plan the simulator runs for ``plan``: one batch-head where that scales exactly, else ``plan``."""
    return one_batch_head(plan) or plan


def check_simulator_size(plans: list[Plan]) -> None:
    need = max(simulator_memory_bytes(simulated_plan(p)) for p in plans)
    if need > SIM_MEMORY_LIMIT:
        raise ValueError(
            f"the simulator would need about {need / 1024**3:.1f} GiB of float64 arrays for this size "
            f"(limit {SIM_MEMORY_LIMIT / 1024**3:.0f} GiB): use smaller N or batch*heads, or `iokernels model`"
        )


def run_simulated(plan: Plan, seed: int = 0, *, scale: bool = True) -> Measured:
    """Simulate ``plan``: with ``scale``, one batch-head where that is exact (:func:`one_batch_head`), its
    counts times batch*heads; otherwise every batch-head."""
    run = simulated_plan(plan) if scale else plan
    inputs = make_inputs(run, seed)
    result = simulate(run, inputs)
    err = max_relative_error(result.outputs, reference_outputs(run, inputs))
    counts = result.counts if run is plan else scaled_counts(result.counts, plan.bh // run.bh)
    if run is not plan and listed(plan):  # the grid's list of items: the whole grid's walk, not a batch-head's
        counts["main"]["work"] = item_list_counts(plan)
    return Measured(counts=counts, max_rel_err=err)


def gpu_inputs(plan: Plan, seed: int = 0) -> tuple[dict, dict, Plan]:
    """Device inputs for ``plan``, the float64 host inputs the reference check reads, and the plan they are of.
    Where one batch-head scales exactly (:func:`one_batch_head`), one batch-head's inputs are made on the host
    and repeated to every batch-head on the device (no kernel's accesses depend on values, so the bytes and
    the time are those of distinct inputs), and the check reads batch-head 0: the host never holds batch*heads
    N x N float64 arrays (a backward plan's inputs O, lse and P come from the host reference)."""
    from ..kernels import launch
    from ..kernels.runtime import require_cupy
    from ..plan.mods import capture_buffer

    one = one_batch_head(plan)
    captured = () if plan.mods is None else {capture_buffer(n) for n, _ in plan.mods.captures}  # (one for every head)
    if one is None:
        return *launch.make_device_inputs(plan, seed), plan
    small, host = launch.make_device_inputs(one, seed)
    cp = require_cupy()
    inputs = {}
    for name, x in small.items():
        shared = (name == "mask" and plan.mask is not None and plan.mask.shared) or name in captured
        inputs[name] = x if shared else cp.ascontiguousarray(cp.broadcast_to(x, (plan.bh, *x.shape[1:])))
    return inputs, host, one


def run_gpu(plan: Plan, seed: int = 0, repeats: int = 10, reference_check: bool = True) -> Measured:
    """Counting build once (bytes, output check), then the plain build timed."""
    from ..kernels import launch, timing

    inputs, host, checked = gpu_inputs(plan, seed)
    run = launch.run_plan(plan, inputs, counting=True, poison_outputs=True)  # an element no kernel writes: NaN
    err = None
    if reference_check:
        want = reference_outputs(checked, host)
        got = {name: launch.to_float64(run.buffers[name] if checked is plan else run.buffers[name][:checked.bh],
                                       plan.dtype) for name in want}
        err = max_relative_error(got, want)
    outputs = sum(int(run.buffers[n].nbytes) for n in OUTPUTS[plan.direction])
    extra, counts = run.workspace_bytes - outputs, run.counts
    del run  # free the workspace before timing
    seconds, stage_seconds = timing.time_plan(plan, inputs, repeats=repeats)
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
            repeats: int = 10, reference_check: bool = True, problem_note: str | None = None) -> dict:
    """The report document for ``plans``: measured bytes (GPU counters, or the simulator's) beside
    the model's, with timings on the GPU. ``reference_check=False`` skips the float64 reference on the host
    for GPU runs (``max_rel_err`` stays None), which dominates large sweeps' host time. ``problem_note``:
    how batch x heads were chosen (the header's)."""
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
        scaled = [p.label for p in plans if one_batch_head(p) is not None]
        how = ("" if not scaled else "; simulated one batch-head, bytes scaled by BH = batch*heads"
               + ("" if len(scaled) == len(plans) else f" ({', '.join(scaled)}; the others in full)"))
        doc = build(plans, spec, "simulator", measured,
                    f"CPU simulator ({reason}): bytes counted tile by tile in numpy, no timings{how}")
        doc["header"]["simulated_one_batch_head"] = scaled
    doc["header"]["environment"] = environment()
    doc["header"]["problem_note"] = problem_note
    return doc


FILL_HEADS = 16  # the paper's GPT-2 runs: batch 64 x heads 16
MEMORY_FRACTION = 0.5  # of the device memory the largest plan's tensors may take
WAVE_FILL = 0.9  # the smallest grid's waves (one block per SM) must be this full on average
MAX_FILL_BATCH = 256


def fills_waves(blocks: int, sms: int) -> bool:
    """True when ``blocks`` thread blocks, one per SM, give every SM work and fill their waves to
    :data:`WAVE_FILL` on average (144 blocks on 132 SMs take two waves, 55 % full: the last wave's 12 blocks
    would double the time of a kernel whose blocks all last as long)."""
    return blocks >= sms and blocks / (-(-blocks // sms) * sms) >= WAVE_FILL


def _smallest_grid(plans: list[Plan]) -> tuple[int, str]:
    return min((s.blocks, f"{p.label} {s.name}") for p in plans for s in p.stages)


def filling_problem(make: Callable[[int, int], list[Plan]], sms: int | None, memory_bytes: int | None = None,
                    kv_heads: int | None = None) -> tuple[list[Plan], str]:
    """``compare``'s default batch x heads: heads = 16 (a multiple of ``kv_heads``), and the smallest batch
    whose smallest stage grid among the plans ``make(batch, heads)`` has at least ``sms`` thread blocks; smaller
    where the largest plan's device tensors (:func:`iokernels.kernels.launch.plan_device_bytes`: standard's
    N x N matrices) would exceed :data:`MEMORY_FRACTION` of ``memory_bytes`` (None: not checked). Returns the
    plans and a sentence saying how batch x heads were chosen."""
    from ..kernels.launch import plan_device_bytes

    heads = FILL_HEADS if kv_heads is None or FILL_HEADS % kv_heads == 0 else kv_heads
    per_batch, _ = _smallest_grid(make(1, heads))
    batch = max(1, -(-(sms or 0) // per_batch))
    plans = make(batch, heads)
    while sms and not fills_waves(_smallest_grid(plans)[0], sms) and batch < MAX_FILL_BATCH:
        batch += 1
        plans = make(batch, heads)
    blocks, where = _smallest_grid(plans)
    note = (f"heads {heads} as the paper's GPT-2 runs; batch {batch}, the smallest whose smallest grid "
            f"({where}: {blocks} blocks) fills the {sms} SMs in waves at least {WAVE_FILL:.0%} full" if sms else
            f"heads {heads} as the paper's GPT-2 runs; batch 1 (the SM count is unknown)")

    def need(ps: list[Plan]) -> int:
        return max(plan_device_bytes(p) for p in ps)

    if memory_bytes is None:
        return plans, note + f"; largest plan's tensors {format_bytes(need(plans))} (device memory not checked)"
    limit = int(MEMORY_FRACTION * memory_bytes)
    if need(plans) <= limit:
        return plans, note + f"; largest plan's tensors {format_bytes(need(plans))} <= {MEMORY_FRACTION:g} of " \
                             f"device memory"
    wanted = batch
    while batch > 1 and need(plans) > limit:
        batch = max(1, min(batch - 1, batch * limit // need(plans)))
        plans = make(batch, heads)
    blocks, where = _smallest_grid(plans)
    return plans, (f"heads {heads}; batch {batch} (not {wanted}, which fills the {sms} SMs): the largest plan's "
                   f"tensors, {format_bytes(need(plans))}, must stay within {MEMORY_FRACTION:g} of device memory "
                   f"({format_bytes(memory_bytes)}); smallest grid {where}: {blocks} blocks")
