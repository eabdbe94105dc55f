"""Run every plan and put measured bytes next to the model's prediction.

The GPU path arrives with the kernels; until then, and whenever ``simulate=True`` or no GPU is
present, the plans run through the CPU simulator, and the report says so in its header.
"""

from __future__ import annotations

from .plan import Plan
from .report import Measured, build
from .simulate import make_inputs, max_relative_error, reference_outputs, simulate
from .specs import GpuSpec

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


def compare(plans: list[Plan], spec: GpuSpec, *, reason: str, seed: int = 0) -> dict:
    """The report document for ``plans``: simulated bytes beside the model's.

    ``reason`` says in the header why the simulator ran (``--simulate``, no GPU, ...).
    """
    check_simulator_size(plans)
    measured = {p.label: run_simulated(p, seed) for p in plans}
    note = f"CPU simulator ({reason}): bytes counted tile by tile in numpy, no timings"
    return build(plans, spec, "simulator", measured, note)
