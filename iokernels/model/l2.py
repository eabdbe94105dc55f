"""The two-level IO model: DRAM bytes (``dram__bytes_read/write``) per stage and tensor, behind an L2.

:mod:`.hbm` counts *requested* bytes (every re-read counts, DESIGN.md rule 2): what the kernels' counters
say. This module predicts what of that traffic reaches DRAM through the L2, for one launch that starts
with a cold, clean L2 (ncu's ``--cache-control all``). Names here are ``dram_*``; they never mix with
the counted (exact) ones. Formulas, assumptions and the comparison with the H200 measurements:
``docs/DRAM-MODEL.md``.

Per stage, from the exact table :func:`iokernels.model.io_exprs` (R_t read and W_t written bytes of tensor t)
and the tensor's size in memory F_t (``sec``: rounded up to 32-byte sectors):

* footprints: f_t = sec(min(R_t, F_t)) read, g_t = sec(min(W_t, F_t)) written;
* reuse r_t = R_t / F_t where R_t is not identically F_t (e.g. T_r, ⌈N_q/BM⌉). A matrix product's A panel
  (r_t = ⌈n/BN⌉) is re-read by one row of the grid, consecutive blocks: fetched ⌈r_t/R⌉ times. Every other
  tensor with r_t > 1 is *shared* by the blocks of its batch-head slice; the rest stream once;
* resident blocks R = n_SM · b_SM (b_SM from shared memory, threads and the per-SM block limit), G the
  stage's blocks, BH slices launched one after the other (grid z is slowest), c = min(BH, ⌈BH·R/G⌉)
  of them at once;
* the reuse working set D = hot + min(1, R/G) · (streamed + Σ_t g_t), hot = c/BH · Σ_shared f_t,
  streamed = Σ_not shared f_t: the shared tensors of the slices in flight plus one wave's other traffic;
* fits ⇔ D ≤ L_2 (:func:`dram_l2_bytes`: the spec's L2 over its partitions). A shared tensor is fetched
  n_t = 1 time if it fits; else once per wave of its slice, min(r_t, ⌈G/(BH·R)⌉), or r_t when a slice is
  one block (its own loop re-reads it);
* dram_read_t = f_t · n_t; written before the launch ends, w_t = g_t · n_t (n_t = 1 for a tensor not
  re-read: round trips and atomics are re-written per fetch);
* the L2 is write-back: at the end of the launch it still holds max(0, L_2 − hot') bytes of the launch's
  traffic (hot' = hot if it fits, else 0), a share W/(W + streamed) of them dirty (W = Σ w_t). Those reach
  DRAM after the launch and are not billed to it: kept = min(W, max(0, L_2 − hot') · W/(W + streamed)),
  dram_write_t = w_t · (1 − kept/W).
"""

from __future__ import annotations

import math
from functools import cache

import sympy as sp

from ..plan import Plan, make_plan
from ..plan.core import FLOAT32_TENSORS, Stage
from ..plan.tensors import DIMS
from ..plan.units import ACC_ITEMSIZE
from .hbm import BH, BN, BH_kv, N_k, N_q, cache_kind, d, e, io_exprs, plan_values
from .specs import GpuSpec, list_specs

DRAM_SECTOR = 32  # bytes: the L2's sector, the unit it fetches from and writes back to DRAM
# The per-SM limits, the shared memory reserved per block and the L2's partitions are the spec's (gpus.json).

_Pos = {"positive": True, "integer": True}
dram_L2 = sp.Symbol("L_2", **_Pos)  # effective L2 bytes (dram_l2_bytes)
dram_n_SM = sp.Symbol("n_SM", **_Pos)  # SMs
dram_b_SM = sp.Symbol("b_SM", **_Pos)  # resident blocks per SM of the stage
dram_G = sp.Symbol("G", **_Pos)  # thread blocks of the stage (all batch-heads)
DRAM_SYMBOLS = (dram_L2, dram_n_SM, dram_b_SM, dram_G)

DramTable = dict[str, dict[str, tuple[sp.Expr, sp.Expr]]]  # stage -> tensor -> (dram read, dram write)


def dram_sectors(x: sp.Expr) -> sp.Expr:
    """Bytes rounded up to whole 32-byte sectors."""
    return DRAM_SECTOR * sp.ceiling(x / DRAM_SECTOR)


def _memory_bytes(tensor: str) -> sp.Expr | None:
    """Bytes of the tensor in memory (all batch-heads), or None for the masks (streamed as counted)."""
    if tensor not in DIMS:
        return None
    extent = {"q": N_q, "k": N_k, "d": d}
    rows = BH_kv if tensor in ("K", "V", "dK", "dV") else BH
    size = sp.Integer(ACC_ITEMSIZE) if tensor in FLOAT32_TENSORS else e
    return rows * size * sp.Mul(*(extent[x] for x in DIMS[tensor]))


def _stage_exprs(tensors: dict[str, tuple[sp.Expr, sp.Expr]]) -> dict[str, tuple[sp.Expr, sp.Expr]]:
    resident = dram_n_SM * dram_b_SM
    slices = sp.Min(BH, sp.ceiling(BH * resident / dram_G))  # batch-head slices in flight at once
    wave = sp.Min(1, resident / dram_G)  # the share of the stage's blocks resident at once
    zero = sp.Integer(0)
    f, g, reuse, row, shared = {}, {}, {}, {}, {}
    for t, (r, w) in tensors.items():
        full = _memory_bytes(t)
        f[t] = dram_sectors(r if full is None else sp.Min(r, full)) if r != 0 else zero
        g[t] = dram_sectors(w if full is None else sp.Min(w, full)) if w != 0 else zero
        if r != 0 and full is not None and sp.cancel(r / full) != 1:
            reuse[t] = r / full  # r_t
            row[t] = reuse[t].has(BN)  # a matrix product's A panel: re-read by one row of the grid
            if not row[t]:
                shared[t] = reuse[t] > 1
    hot_bytes = sum((sp.Piecewise((f[t], c), (0, True)) for t, c in shared.items()), zero)
    hot = slices / BH * hot_bytes
    streamed = sum(f.values(), zero) - hot_bytes
    fits = hot + wave * (streamed + sum(g.values(), zero)) <= dram_L2
    fetches = {}
    for t, r in reuse.items():
        waves = sp.Piecewise((r, sp.Eq(dram_G, BH)), (sp.Min(r, sp.ceiling(dram_G / (BH * resident))), True))
        if row[t]:  # consecutive blocks: fetched once per wave the row spans
            fetches[t] = sp.ceiling(r / resident)
        else:
            fetches[t] = sp.Piecewise((1, r <= 1), (1, fits), (waves, True))
    out_r = {t: f[t] * fetches.get(t, 1) for t in tensors}
    out_w = {t: g[t] * fetches.get(t, 1) for t in tensors}
    total_w = sum(out_w.values(), zero)
    if total_w == 0:
        return {t: (out_r[t], zero) for t in tensors}
    room = sp.Max(0, dram_L2 - sp.Piecewise((hot, fits), (0, True)))
    kept = sp.Min(total_w, room * total_w / (total_w + streamed))
    return {t: (out_r[t], out_w[t] * (1 - kept / total_w)) for t in tensors}


@cache
def dram_exprs(algorithm: str, schedule: str, direction: str, variant: str = "", *,
               causal: bool | str = False, block_sparse: bool = False, mask: bool = False, cache: str = "",
               alibi: bool = False) -> DramTable:
    """DRAM bytes (read, written) per stage and tensor, as sympy expressions in the symbols of
    :mod:`.hbm` and :data:`DRAM_SYMBOLS` (``G`` and ``b_SM`` are each stage's own; ``cache``: a decode plan's cache
    of per-sequence lengths, :func:`.hbm.cache_kind`)."""
    table = io_exprs(algorithm, schedule, direction, variant, causal=causal, block_sparse=block_sparse, mask=mask,
                     cache=cache, alibi=alibi)
    return {stage: _stage_exprs(tensors) for stage, tensors in table.items()}


def dram_l2_bytes(spec: GpuSpec) -> int:
    """The L2 one working set read by every SM can use: the spec's L2 over its partitions."""
    if spec.l2_bytes is None:
        raise ValueError(f"{spec.name}: its L2 size is unknown (l2_mb in gpus.json); the DRAM model needs it")
    return spec.l2_bytes // spec.l2_partitions


def dram_blocks_per_sm(stage: Stage, spec: GpuSpec) -> int:
    """Resident blocks per SM: shared memory (plus what the driver reserves per block), threads and the block
    limit, all from the spec (registers are not modelled)."""
    by_smem = spec.smem_per_sm_bytes // (stage.smem_bytes + spec.smem_reserved_per_block_bytes)
    return max(1, min(by_smem, spec.max_threads_per_sm // stage.threads, spec.max_blocks_per_sm))


def dram_values(plan: Plan, spec: GpuSpec) -> dict[str, dict]:
    """Per stage: the values of every symbol of :func:`dram_exprs` for this plan on this GPU."""
    if spec.sms is None:
        raise ValueError(f"{spec.name}: its SM count is unknown (sms in gpus.json); the DRAM model needs it")
    base = plan_values(plan)
    base.update({dram_L2: dram_l2_bytes(spec), dram_n_SM: spec.sms})
    return {s.name: {**base, dram_G: s.blocks, dram_b_SM: dram_blocks_per_sm(s, spec)} for s in plan.stages}


def _table(plan: Plan) -> DramTable:
    return dram_exprs(plan.algorithm, plan.schedule, plan.direction, plan.variant, causal=plan.causal,
                      block_sparse=plan.block_mask is not None, mask=plan.mask is not None, cache=cache_kind(plan),
                      alibi=plan.alibi is not None)


def _number(expr: sp.Expr, values: dict) -> int:
    # xreplace: all symbols at once (a sequential subs can leave Min/Piecewise half-evaluated)
    return math.floor(float(sp.sympify(expr).xreplace(values)) + 0.5)


def dram(plan: Plan, spec: GpuSpec) -> dict[str, dict[str, tuple[int, int]]]:
    """Predicted DRAM bytes (read, written) per stage and tensor for this plan on this GPU (bytes rounded
    to the nearest integer: the write-back share is a fraction)."""
    values = dram_values(plan, spec)
    return {stage: {t: (_number(r, values[stage]), _number(w, values[stage])) for t, (r, w) in tensors.items()}
            for stage, tensors in _table(plan).items()}


def dram_totals(plan: Plan, spec: GpuSpec) -> dict[str, tuple[int, int]]:
    """Predicted DRAM bytes (read, written) per stage."""
    return {stage: (sum(r for r, _ in ts.values()), sum(w for _, w in ts.values()))
            for stage, ts in dram(plan, spec).items()}


# ---------------------------------------------------------------------------------------------
# against Nsight Compute: results/<device>/profile/profile-N*-cc-*.json

DRAM_TOLERANCE = 0.15


def dram_spec_for(device_name: str) -> GpuSpec:
    """The gpus.json entry whose key appears in a device name ("NVIDIA H200" -> h200), longest key first."""
    lowered = device_name.lower()
    for spec in sorted(list_specs(), key=lambda s: -len(s.key)):
        if spec.key in lowered.replace(" ", "-") or spec.key in lowered:
            return spec
    raise ValueError(f"no GPU spec matches device {device_name!r}; pass spec=")


def _ratio(predicted: int, measured: int) -> float:
    if measured == 0:
        return 1.0 if predicted == 0 else math.inf
    return predicted / measured


def compare_profile(doc: dict, spec: GpuSpec | None = None) -> list[dict]:
    """Predicted against measured DRAM bytes for every row of an ``iokernels profile --json`` document
    (stages and, where complete, plan totals ``all``). Pure: rebuilds each plan from the header."""
    head = doc["header"]
    spec = spec or dram_spec_for(head["environment"]["gpu"])
    cache_control = head.get("cache_control", "")
    plans: dict[tuple[str, str, str], dict[str, tuple[int, int]]] = {}
    out = []
    for row in doc["rows"]:
        key = (row["algorithm"], row["schedule"], row["pass"])
        if key not in plans:
            plan = make_plan(key[0], key[1], N_q=head["N_q"], N_k=head["N_k"], d=head["d"], dtype=head["dtype"],
                             sram=head["sram_bytes"], batch=head["batch"], heads=head["heads"], direction=key[2])
            recorded = [p for p in head.get("plans", []) if (p["algorithm"], p["schedule"], p["pass"]) == key]
            if recorded and recorded[0]["tiles"] != plan.tile:
                raise ValueError(f"{plan.label}: tiles {plan.tile} differ from the profiled {recorded[0]['tiles']}")
            plans[key] = dram_totals(plan, spec)
        totals = plans[key]
        if row["stage"] == "all":
            stages = row.get("stages", list(totals))
            read, write = sum(totals[s][0] for s in stages), sum(totals[s][1] for s in stages)
        else:
            read, write = totals[row["stage"]]
        rr, wr = _ratio(read, row["dram_read_bytes"]), _ratio(write, row["dram_write_bytes"])
        out.append({
            "N_q": head["N_q"], "N_k": head["N_k"], "d": head["d"], "dtype": head["dtype"],
            "cache_control": cache_control, "spec": spec.key,
            "algorithm": key[0], "schedule": key[1], "pass": key[2], "stage": row["stage"],
            "counted_read_bytes": row["counted_read_bytes"], "counted_write_bytes": row["counted_write_bytes"],
            "dram_read_measured": row["dram_read_bytes"], "dram_read_predicted": read, "dram_read_ratio": rr,
            "dram_read_within": abs(rr - 1) <= DRAM_TOLERANCE,
            "dram_write_measured": row["dram_write_bytes"], "dram_write_predicted": write, "dram_write_ratio": wr,
            "dram_write_within": abs(wr - 1) <= DRAM_TOLERANCE,
        })
    return out


def render_comparison(rows: list[dict]) -> str:
    """A markdown table of :func:`compare_profile` rows (the one in docs/DRAM-MODEL.md)."""
    lines = ["| N | cache | plan | stage | read meas | read pred | pred/meas | ±15% | write meas | write pred "
             "| pred/meas | ±15% |", "|---:|---|---|---|---:|---:|---:|:-:|---:|---:|---:|:-:|"]

    def ratio(x: float) -> str:
        return "inf" if math.isinf(x) else f"{x:.3f}"

    for r in rows:
        lines.append(
            f"| {r['N_q']} | {r['cache_control']} | {r['algorithm']}/{r['schedule']}/{r['pass']} | {r['stage']} "
            f"| {r['dram_read_measured']:,} | {r['dram_read_predicted']:,} | {ratio(r['dram_read_ratio'])} "
            f"| {'yes' if r['dram_read_within'] else 'no'} | {r['dram_write_measured']:,} "
            f"| {r['dram_write_predicted']:,} | {ratio(r['dram_write_ratio'])} "
            f"| {'yes' if r['dram_write_within'] else 'no'} |")
    return "\n".join(lines)
