"""``iokernels roofline``, and the roofline behind ``compare``'s bound column.

Per plan and stage: FLOPs (:func:`stage_flops`), HBM bytes (:func:`iokernels.model.exact`, equal to the
counters), intensity (FLOP/B) and the roofline-attainable time ``max(FLOPs / peak, bytes / bandwidth)``
against two ceilings (:class:`Ceilings`): the spec's (``tensor_tflops`` for float16/bfloat16, ``fp32_tflops``
for float32, as :meth:`iokernels.model.specs.GpuSpec.peak_flops`; ``hbm_gb_per_s``), or measured on the
device (:func:`measure_ceilings`: a device-to-device copy and a large cuBLAS matrix product). A plan's
roofline time is the sum of its stages' (they run one after another), and it is bound by the resource that
accounts for the larger share of that time.

Per-stage FLOPs: the model counts matrix-product FLOPs per pass (2·BH·N_q·N_k·d per product of shape
N_q x N_k x d; halved for causal plans, those of the kept blocks for block-sparse ones: the model's
conventions). :data:`STAGE_MATMULS` says which stage computes which of those products, and a stage's FLOPs
are the pass's times its share; the row-wise softmax stages (rowmax, rowsum, normalize, rowdot, ds, init,
finalize, prep, dq of the flash backward) compute no matrix product: 0 FLOPs (their elementwise work is not
counted, as in the model).

On a GPU, :func:`measure` times each stage alone (:func:`iokernels.kernels.timing.time_plan`) and, when asked,
takes each stage's DRAM bytes from Nsight Compute (:func:`iokernels.analysis.profile.profile`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .. import model
from ..model.specs import GpuSpec
from ..plan import Plan
from .report import text_table

# which stage computes how many of the pass's N_q x N_k x d matrix products (model/hbm.py counts them per pass)
STAGE_MATMULS: dict[tuple[str, ...], dict[str, int]] = {
    ("standard", "default", "fwd"): {"qk": 1, "pv": 1},
    ("standard", "default", "bwd"): {"dv": 1, "dp": 1, "dq": 1, "dk": 1},
    ("two_pass", "store", "fwd"): {"stats": 1, "output": 1},
    ("two_pass", "recompute", "fwd"): {"stats": 1, "output": 2},  # the output pass recomputes S
    ("flash", "kv_outer", "fwd"): {"main": 2},
    ("flash", "q_outer", "fwd"): {"main": 2},
    ("flash", "fast", "fwd"): {"main": 2},
    ("flash", "kv_outer", "bwd"): {"main": 5},  # S, dV, dP, dQ, dK
    ("flash", "fast", "bwd"): {"main": 5},
    ("flash", "fast", "bwd", "deterministic"): {"dq": 3, "dkdv": 4},  # S, dP recomputed by the dq stage
    ("flash", "fast", "fwd", "split"): {"main": 2}, ("flash", "fast", "fwd", "packed"): {"main": 2},  # + combine
    ("flash", "fast", "fwd", "varlen"): {"main": 2}, ("flash", "fast", "bwd", "varlen"): {"main": 5},
}


def stage_flops(plan: Plan) -> dict[str, int]:
    """Matrix-product FLOPs of each stage of ``plan``; they add up to ``model.predict(plan).flops``."""
    key = (plan.algorithm, plan.schedule, plan.direction) + ((plan.variant,) if plan.variant else ())
    share = STAGE_MATMULS.get(key)
    if share is None or not set(share) <= {s.name for s in plan.stages}:
        raise ValueError(f"no per-stage FLOP split for {plan.label} (iokernels.analysis.roofline.STAGE_MATMULS)")
    total, products = model.predict(plan).flops, sum(share.values())
    return {s.name: total * share.get(s.name, 0) // products for s in plan.stages}


@dataclass(frozen=True)
class Ceilings:
    """The two roofs: compute (FLOP/s) and memory (bytes/s), and where they come from."""

    flops_per_s: float
    bytes_per_s: float
    source: str  # "spec" or "measured"
    note: str

    @property
    def ridge(self) -> float:
        """The intensity (FLOP/B) where the two roofs meet."""
        return self.flops_per_s / self.bytes_per_s

    def attainable(self, intensity: float) -> float:
        """The roofline's FLOP/s at ``intensity``."""
        return min(self.flops_per_s, self.bytes_per_s * intensity)

    def as_dict(self) -> dict:
        return {**asdict(self), "ridge_flops_per_byte": self.ridge}


def spec_ceilings(spec: GpuSpec, dtype: str) -> Ceilings:
    peak = spec.peak_flops(dtype)
    kind = "fp32 (CUDA cores)" if dtype == "float32" else "tensor-core"
    return Ceilings(peak, spec.hbm_bytes_per_s, "spec",
                    f"{spec.name} spec: {kind} {peak / 1e12:.0f} TFLOP/s, HBM {spec.hbm_bytes_per_s / 1e9:.0f} GB/s")


def _stage_time(flops: int, nbytes: int, ceilings: Ceilings) -> dict:
    compute, memory = flops / ceilings.flops_per_s, nbytes / ceilings.bytes_per_s
    return {"compute_seconds": compute, "memory_seconds": memory, "roofline_seconds": max(compute, memory),
            "bound": "compute" if compute > memory else "memory"}


def stage_rows(plan: Plan, ceilings: Ceilings) -> list[dict]:
    """One row per stage: FLOPs, model bytes, intensity and the roofline's time and bound."""
    flops, exact = stage_flops(plan), model.exact(plan)
    rows = []
    for stage in plan.stages:
        nbytes = sum(r + w for r, w in exact.get(stage.name, {}).values())
        f = flops[stage.name]
        rows.append({"label": plan.label, "algorithm": plan.algorithm, "schedule": plan.schedule,
                     "pass": plan.direction, "stage": stage.name, "flops": f, "bytes": nbytes,
                     "intensity_flops_per_byte": f / nbytes if nbytes else math.inf,
                     **_stage_time(f, nbytes, ceilings)})
    return rows


def plan_row(plan: Plan, ceilings: Ceilings, stages: list[dict] | None = None) -> dict:
    """The plan's stages added up: roofline time Σ max(FLOPs/peak, bytes/bandwidth); ``compute_seconds`` and
    ``memory_seconds`` what FLOPs alone and bytes alone would take; bound: the resource of the larger share."""
    stages = stage_rows(plan, ceilings) if stages is None else stages
    by = {b: sum(s["roofline_seconds"] for s in stages if s["bound"] == b) for b in ("compute", "memory")}
    flops, nbytes = sum(s["flops"] for s in stages), sum(s["bytes"] for s in stages)
    return {"label": plan.label, "algorithm": plan.algorithm, "schedule": plan.schedule, "pass": plan.direction,
            "stage": "all", "flops": flops, "bytes": nbytes,
            "intensity_flops_per_byte": flops / nbytes if nbytes else math.inf,
            "compute_seconds": sum(s["compute_seconds"] for s in stages),
            "memory_seconds": sum(s["memory_seconds"] for s in stages),
            "roofline_seconds": by["compute"] + by["memory"],
            "bound": "compute" if by["compute"] > by["memory"] else "memory"}


# ---------------------------------------------------------------------------------------------
# does time rank as bytes do? (compare)

TOLERANCE = 0.3  # a ratio within 30 % of the one it is compared with follows it


def time_check(plans: list[Plan], ceilings: Ceilings, seconds: dict[str, float] | None = None) -> dict:
    """Per plan its roofline (and measured/roofline with ``seconds``, plan label -> measured seconds); per
    plan other than standard, standard's bytes, roofline time and measured time over its own (the
    ``compare`` ratios), whether time ranks as bytes do, and a one-line reason where it does not, where the
    roofline's ratio is off the bytes' or the time's off the roofline's by more than :data:`TOLERANCE`."""
    seconds = seconds or {}
    rows = {}
    for plan in plans:
        row = plan_row(plan, ceilings)
        t = seconds.get(plan.label)
        row["measured_seconds"] = t
        row["measured_over_roofline"] = t / row["roofline_seconds"] if t else None
        rows[plan.label] = row
    checks = []
    for label, row in rows.items():
        base = rows.get(f"standard/default/{row['pass']}")
        if base is None or row["algorithm"] == "standard":
            continue
        check = {"numerator": base["label"], "denominator": label, "bytes": base["bytes"] / row["bytes"],
                 "roofline": base["roofline_seconds"] / row["roofline_seconds"],
                 "time": (base["measured_seconds"] / row["measured_seconds"]
                          if base["measured_seconds"] and row["measured_seconds"] else None)}
        ratio = check["roofline"] if check["time"] is None else check["time"]
        check["ranks_as_bytes"] = (ratio > 1) == (check["bytes"] > 1)
        check["time_over_roofline_ratio"] = None if check["time"] is None else check["time"] / check["roofline"]
        check["reason"] = _reason(check, row, base)
        checks.append(check)
    return {"ceilings": ceilings.as_dict(), "rows": list(rows.values()), "checks": checks}


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f} ms"


def _off(a: float, b: float) -> bool:
    return abs(a / b - 1) > TOLERANCE


def _reason(check: dict, row: dict, base: dict) -> str | None:
    """Why time does not follow bytes: the roofline's ratio is off the bytes' (a compute-bound plan), and/or
    the measured ratio is off the roofline's (the kernels run below the roofline by different factors)."""
    reasons = []
    if _off(check["roofline"], check["bytes"]):
        # where both are memory-bound the roofline's ratio is the bytes' ratio: one of them is compute-bound
        r = row if row["bound"] == "compute" else base
        reasons.append(f"{r['label']} is compute-bound: roofline predicts {_ms(r['roofline_seconds'])} "
                       f"(FLOPs alone {_ms(r['compute_seconds'])}), bytes alone would give {_ms(r['memory_seconds'])}")
    if check["time"] is not None and (not check["ranks_as_bytes"] or _off(check["time"], check["roofline"])):
        reasons.append(f"time off the roofline: measured/roofline {row['measured_over_roofline']:.2f}x for "
                       f"{row['label']}, {base['measured_over_roofline']:.2f}x for standard (grid, occupancy, "
                       "latency or slower arithmetic than the peak, not bytes)")
    return "; ".join(reasons) or None


def annotate(doc: dict, plans: list[Plan], spec: GpuSpec) -> dict:
    """``compare``'s document gains the roofline against ``spec``'s ceilings: its total and stage rows their
    roofline time, bound and measured/roofline, its header the :func:`time_check` of its timings (if any)."""
    ceilings = spec_ceilings(spec, plans[0].dtype)
    labels = {(p.algorithm, p.schedule_label, p.direction): p.label for p in plans}
    seconds = {labels[(r["algorithm"], r["schedule"], r["pass"])]: r["seconds"]
               for r in doc["rows"] if r["tensor"] == "total" and r.get("seconds")}
    summary = time_check(plans, ceilings, seconds)
    by_plan = {r["label"]: r for r in summary["rows"]}
    stages = {(p.algorithm, p.schedule_label, p.direction, s["stage"]): s
              for p in plans for s in stage_rows(p, ceilings)}
    for row in doc["rows"] + doc["stages"]:
        if row["tensor"] != "total":
            continue
        key = (row["algorithm"], row["schedule"], row["pass"])
        r = by_plan[labels[key]] if "stage" not in row else stages[(*key, row["stage"])]
        row["roofline_stage_seconds"] = r["roofline_seconds"]
        row["bound"] = r["bound"]
        t = row.get("seconds")
        row["seconds_over_roofline"] = t / r["roofline_seconds"] if t else None
    doc["header"]["roofline"] = summary
    return doc


# ---------------------------------------------------------------------------------------------
# iokernels roofline: measuring on the GPU

WARMUP = 3


def measure_ceilings(dtype: str, *, n: int = 8192, copy_bytes: int = 2 * 1024**3, repeats: int = 20) -> Ceilings:
    """The device's copy bandwidth (:func:`iokernels.kernels.timing.copy_bandwidth`: a device-to-device
    ``cupy.copyto``, bytes read + written over time) and matrix-product peak (``cupy.matmul`` of two n x n
    matrices, cuBLAS: 2n³ over time; float16 for float16 and bfloat16, which cupy lacks; float32 for float32),
    each the median of ``repeats`` calls between CUDA events (:func:`iokernels.kernels.timing.event_seconds`).
    RuntimeError without cupy or a GPU."""
    from ..kernels import timing
    from ..kernels.runtime import require_cupy

    cp = require_cupy()
    free, _ = cp.cuda.runtime.memGetInfo()
    copy_bytes = max(1 << 20, min(copy_bytes, free // 8)) // 4 * 4
    bandwidth = timing.copy_bandwidth(copy_bytes, warmup=WARMUP, repeats=repeats)
    mm_dtype = "float32" if dtype == "float32" else "float16"
    a = cp.random.random((n, n), dtype=cp.float32).astype(mm_dtype)
    b = cp.random.random((n, n), dtype=cp.float32).astype(mm_dtype)
    c = cp.empty((n, n), dtype=mm_dtype)
    mm_s = timing.event_seconds(lambda: cp.matmul(a, b, out=c), warmup=WARMUP, repeats=repeats)
    flops = 2 * n**3 / mm_s
    return Ceilings(flops, bandwidth, "measured",
                    f"measured: copy {bandwidth / 1e9:.0f} GB/s (cupy.copyto, {copy_bytes / 2**30:.2f} GiB device to "
                    f"device, bytes read + written over time), matmul {flops / 1e12:.1f} TFLOP/s (cupy.matmul "
                    f"{n}x{n}x{n} {mm_dtype}, 2n^3 over time); median of {repeats} calls after {WARMUP} "
                    "warm-ups, CUDA events around each")


def measure(plans: list[Plan], *, seed: int = 0, repeats: int = 10, dram: bool = False) -> dict:
    """Per plan label: ``seconds`` (the whole plan) and ``stage_seconds`` (each stage alone;
    :func:`iokernels.kernels.timing.time_plan`), and with ``dram`` each stage's DRAM bytes from ncu
    (``dram_bytes``: stage -> bytes; :func:`iokernels.analysis.profile.profile`, cache control all)."""
    from ..kernels import timing
    from . import profile

    out: dict[str, dict] = {}
    for plan in plans:
        inputs, _ = profile.device_inputs(plan, seed)
        total, per_stage = timing.time_plan(plan, inputs, repeats=repeats)
        out[plan.label] = {"seconds": total, "stage_seconds": per_stage, "dram_bytes": {}}
        del inputs
    if dram:
        doc = profile.profile(plans, seed=seed)
        labels = {(p.algorithm, p.schedule_label, p.direction): p.label for p in plans}
        for r in doc["rows"]:
            if r["stage"] != "all":
                out[labels[(r["algorithm"], r["schedule"], r["pass"])]]["dram_bytes"][r["stage"]] = r["dram_bytes"]
    return out


# ---------------------------------------------------------------------------------------------
# the document, its table and its plot

def _measured_fields(row: dict, seconds: float | None, dram_bytes: int | None) -> None:
    row["seconds"] = seconds
    row["achieved_flops_per_s"] = row["flops"] / seconds if seconds else None
    row["achieved_bytes_per_s"] = row["bytes"] / seconds if seconds else None
    row["of_roofline"] = row["roofline_seconds"] / seconds if seconds else None
    row["dram_bytes"] = dram_bytes
    row["dram_intensity_flops_per_byte"] = row["flops"] / dram_bytes if dram_bytes else None
    row["dram_bytes_per_s"] = dram_bytes / seconds if dram_bytes and seconds else None


def build(plans: list[Plan], spec: GpuSpec, *, measured_ceilings: Ceilings | None = None,
          measured: dict[str, dict] | None = None, note: str = "", problem_note: str | None = None) -> dict:
    """The roofline document: a header (problem, ceilings) and one row per plan (stage "all") and stage.
    The predicted columns use the measured ceilings when there are, else the spec's."""
    first = plans[0]
    spec_roof = spec_ceilings(spec, first.dtype)
    roof = measured_ceilings or spec_roof
    measured = measured or {}
    rows = []
    for plan in plans:
        stages = stage_rows(plan, roof)
        m = measured.get(plan.label, {})
        dram = m.get("dram_bytes", {})
        total = plan_row(plan, roof, stages)
        dram_total = sum(dram.values()) if dram and len(dram) == len(stages) and None not in dram.values() else None
        _measured_fields(total, m.get("seconds"), dram_total)
        for s in stages:
            _measured_fields(s, m.get("stage_seconds", {}).get(s["stage"]), dram.get(s["stage"]))
        rows += [total, *stages]
    for r in rows:
        r["predicted_flops_per_s"] = r["flops"] / r["roofline_seconds"] if r["roofline_seconds"] else 0.0
    header = {"gpu": spec.name, "gpu_key": spec.key, "source": "gpu" if measured else "model", "note": note,
              "dtype": first.dtype, "N_q": first.N_q, "N_k": first.N_k, "d": first.d, "batch": first.batch,
              "heads": first.heads, "problem_note": problem_note, "sram_bytes": first.sram_bytes,
              "ceilings": roof.as_dict(),
              "spec_ceilings": spec_roof.as_dict(),
              "measured_ceilings": measured_ceilings.as_dict() if measured_ceilings else None,
              "dram": any(r["dram_bytes"] is not None for r in rows),
              "plans": [p.as_dict() for p in plans]}
    return {"header": header, "rows": rows}


def _num(x: float | None, scale: float = 1.0, fmt: str = ".3g") -> str:
    return "-" if x is None else ("inf" if math.isinf(x) else format(x / scale, fmt))


def render(doc: dict) -> str:
    h = doc["header"]
    gpu = h["source"] == "gpu"
    lines = [f"source: {h['source']}" + (f"  ({h['note']})" if h.get("note") else ""),
             f"gpu: {h['gpu']}   dtype: {h['dtype']}   N_q={h['N_q']}  N_k={h['N_k']}  d={h['d']}  "
             f"batch={h['batch']}  heads={h['heads']}  M={h['sram_bytes']:,} bytes",
             *([f"batch x heads = {h['batch']} x {h['heads']}: {h['problem_note']}"] if h.get("problem_note") else []),
             f"ceilings used: {h['ceilings']['note']}; ridge {h['ceilings']['ridge_flops_per_byte']:.1f} FLOP/B"]
    if h.get("measured_ceilings"):
        lines.append(f"spec ceilings: {h['spec_ceilings']['note']}")
    lines.append("FLOPs: matrix products only (row-wise stages: 0); bytes: the exact model (= the counters); "
                 "roofline: max(FLOPs/peak, bytes/bandwidth) per stage, summed over a plan's stages")
    headers = ["plan", "stage", "GFLOP", "MB", "FLOP/B", "bound", "roofline ms", "pred TFLOP/s"]
    if gpu:
        headers += ["time ms", "TFLOP/s", "TB/s", "of roofline"]
    if h.get("dram"):
        headers += ["DRAM MB", "DRAM FLOP/B", "DRAM TB/s"]
    body = []
    for r in doc["rows"]:
        cells = [r["label"] if r["stage"] == "all" else "", r["stage"], _num(r["flops"], 1e9, ".4g"),
                 _num(r["bytes"], 1e6, ".4g"), _num(r["intensity_flops_per_byte"], 1, ".1f"), r["bound"],
                 _num(r["roofline_seconds"], 1e-3, ".4f"), _num(r["predicted_flops_per_s"], 1e12, ".2f")]
        if gpu:
            cells += [_num(r["seconds"], 1e-3, ".4f"), _num(r["achieved_flops_per_s"], 1e12, ".2f"),
                      _num(r["achieved_bytes_per_s"], 1e12, ".3f"), _num(r["of_roofline"], 0.01, ".0f") + "%"
                      if r["of_roofline"] is not None else "-"]
        if h.get("dram"):
            cells += [_num(r["dram_bytes"], 1e6, ".4g"), _num(r["dram_intensity_flops_per_byte"], 1, ".1f"),
                      _num(r["dram_bytes_per_s"], 1e12, ".3f")]
        body.append(cells)
    return "\n".join([*lines, "", text_table(headers, body, set(range(2, len(headers))) - {5})])


def plot(doc: dict, path: str) -> None:
    """A log-log roofline: x FLOP/byte, y TFLOP/s, the two ceilings (measured and spec), and one point per
    stage with FLOPs: predicted (on the roof), measured (counted bytes) and, with DRAM bytes, at the DRAM
    intensity. Stages with no matrix product (intensity 0) have no place on a log axis and are left out."""
    try:  # matplotlib only here, as in plotting.py (which imports sweep, and so compare and this module)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib, which is not installed: pip install 'iokernels[plot]'") from exc
    h = doc["header"]
    fig = Figure(figsize=(9, 6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    points = [r for r in doc["rows"] if r["stage"] != "all" and r["flops"] > 0 and r["bytes"] > 0]
    xs = [r["intensity_flops_per_byte"] for r in points] + [r["dram_intensity_flops_per_byte"] for r in points
                                                            if r["dram_intensity_flops_per_byte"]]
    lo, hi = min(xs) / 4 if xs else 1.0, max([*xs, h["ceilings"]["ridge_flops_per_byte"]]) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    roofs = [(h["ceilings"], "-")] + ([(h["spec_ceilings"], ":")] if h.get("measured_ceilings") else [])
    for c, style in roofs:
        ax.plot(grid, [min(c["flops_per_s"], c["bytes_per_s"] * x) / 1e12 for x in grid], style, color="black",
                label=f"roof ({c['source']}): {c['flops_per_s'] / 1e12:.0f} TFLOP/s, {c['bytes_per_s'] / 1e9:.0f} GB/s")
    colors: dict[str, str] = {}
    for r in points:  # a colour per plan; hollow: predicted, filled: measured (counted bytes), square: DRAM bytes
        first = r["label"] not in colors
        color = colors.setdefault(r["label"], f"C{len(colors) % 10}")
        x = r["intensity_flops_per_byte"]
        ax.plot(x, r["predicted_flops_per_s"] / 1e12, "o", mfc="none", color=color, label=r["label"] if first else None)
        ax.annotate(r["stage"], (x, r["predicted_flops_per_s"] / 1e12), fontsize=6, color=color,
                    xytext=(3, -8), textcoords="offset points")
        if r["seconds"]:
            ax.plot(x, r["achieved_flops_per_s"] / 1e12, "o", color=color)
        if r["dram_intensity_flops_per_byte"] and r["seconds"]:
            ax.plot(r["dram_intensity_flops_per_byte"], r["achieved_flops_per_s"] / 1e12, "s", color=color)
    ax.plot([], [], "o", mfc="none", color="gray", label="predicted (on the roof)")
    if h["source"] == "gpu":
        ax.plot([], [], "o", color="gray", label="measured, counted bytes")
    if h.get("dram"):
        ax.plot([], [], "s", color="gray", label="measured, DRAM bytes")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{h['gpu']}, {h['dtype']}, N={h['N_q']}x{h['N_k']}, d={h['d']}, batch x heads = "
                 f"{h['batch']}x{h['heads']} ({'measured' if h['source'] == 'gpu' else 'predicted only'})")
    ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
