"""Rows of predicted and measured bytes: built once, then printed as a table or as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import model
from ..model.specs import GpuSpec
from ..plan import Plan
from ..plan.tensors import TENSORS, Counts
from ..plan.units import format_bytes


@dataclass
class Measured:
    """What one run of a plan produced: counted bytes, and timings when the GPU ran it."""

    counts: Counts
    seconds: float | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    max_rel_err: float | None = None
    peak_memory_bytes: int | None = None


def _byte_fields(pred: tuple[int, int], meas: tuple[int, int] | None) -> dict:
    row = {
        "predicted_read_bytes": pred[0],
        "predicted_write_bytes": pred[1],
        "predicted_bytes": pred[0] + pred[1],
        "measured_read_bytes": None if meas is None else meas[0],
        "measured_write_bytes": None if meas is None else meas[1],
        "measured_bytes": None if meas is None else meas[0] + meas[1],
    }
    total = row["predicted_bytes"]
    row["measured_over_predicted"] = (None if meas is None else
                                      (row["measured_bytes"] / total if total else float(row["measured_bytes"] == 0)))
    return row


def _sum(pairs: list[tuple[int, int]]) -> tuple[int, int]:
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


def build(plans: list[Plan], spec: GpuSpec, source: str, measured: dict[str, Measured] | None = None,
          note: str | None = None) -> dict:
    """The JSON document: a header and one row per algorithm, schedule, pass and tensor, plus
    a ``total`` row per (algorithm, schedule, pass); ``stages`` has the same per kernel launch."""
    measured = measured or {}
    first = plans[0]
    header = {
        "gpu": spec.name,
        "gpu_key": spec.key,
        "source": source,
        "note": note,
        "dtype": first.dtype,
        "N_q": first.N_q,
        "N_k": first.N_k,
        "d": first.d,
        "batch": first.batch,
        "heads": first.heads,
        "kv_heads": first.kv_heads,
        "sram_bytes": first.sram_bytes,
        "sram_elements": first.sram_elements,
        "causal": first.causal or None,
        "block_mask": first.block_mask.as_dict() if first.block_mask is not None else None,
        "mask": first.mask.as_dict() if first.mask is not None else None,
        "dropout": first.dropout.as_dict() if first.dropout is not None else None,
        "plans": [p.as_dict() for p in plans],
    }
    rows, stage_rows, totals = [], [], {}
    for plan in plans:
        pred = model.predict(plan)
        meas = measured.get(plan.label)
        ident = {"algorithm": plan.algorithm, "schedule": plan.schedule_label, "pass": plan.direction}
        mt = model.per_tensor(meas.counts) if meas else {}
        for tensor in sorted(set(pred.per_tensor) | set(mt), key=TENSORS.index):
            p = pred.per_tensor.get(tensor, (0, 0))
            rows.append({**ident, "tensor": tensor, **_byte_fields(p, mt.get(tensor, (0, 0)) if meas else None),
                         "theta_bytes": None, "source": source})
        total = {**ident, "tensor": "total",
                 **_byte_fields((pred.read_bytes, pred.write_bytes), _sum(list(mt.values())) if meas else None),
                 "theta_bytes": pred.theta_bytes,
                 "order": model.order(plan.algorithm, plan.schedule, plan.direction, plan.variant),
                 "source": source, "flops": pred.flops, "intensity_flops_per_byte": pred.intensity,
                 "roofline_seconds": pred.roofline_seconds(spec), "footprint_bytes": pred.footprint_bytes,
                 "seconds": meas.seconds if meas else None,
                 "bandwidth_bytes_per_s": (None if not meas or not meas.seconds
                                           else sum(map(sum, mt.values())) / meas.seconds),
                 "max_rel_err": meas.max_rel_err if meas else None,
                 "peak_memory_bytes": meas.peak_memory_bytes if meas else None}
        rows.append(total)
        totals[plan.label] = total
        for stage in plan.stages:
            ps = pred.stages.get(stage.name, {})
            ms = meas.counts.get(stage.name, {}) if meas else {}
            for tensor in sorted(set(ps) | set(ms), key=TENSORS.index):
                stage_rows.append({**ident, "stage": stage.name, "tensor": tensor,
                                   **_byte_fields(ps.get(tensor, (0, 0)), ms.get(tensor, (0, 0)) if meas else None),
                                   "source": source})
            seconds = meas.stage_seconds.get(stage.name) if meas else None
            stage_rows.append({**ident, "stage": stage.name, "tensor": "total",
                               **_byte_fields(_sum(list(ps.values())), _sum(list(ms.values())) if meas else None),
                               "source": source, "seconds": seconds,
                               "grid": list(stage.grid), "threads": stage.threads, "smem_bytes": stage.smem_bytes})
    header["ratios"] = _ratios(totals)
    return {"header": header, "rows": rows, "stages": stage_rows}


def _ratios(totals: dict[str, dict]) -> list[dict]:
    """Standard over each other forward algorithm (and flash backward), predicted and measured."""
    out = []
    for direction in ("fwd", "bwd"):
        base = totals.get(f"standard/default/{direction}")
        if not base:
            continue
        for label, row in totals.items():
            if label.endswith(direction) and not label.startswith("standard"):
                measured = (base["measured_bytes"] / row["measured_bytes"]
                            if base["measured_bytes"] and row["measured_bytes"] else None)
                time = base["seconds"] / row["seconds"] if base["seconds"] and row["seconds"] else None
                out.append({"numerator": base["algorithm"] + "/" + base["schedule"] + "/" + direction,
                            "denominator": label, "predicted": base["predicted_bytes"] / row["predicted_bytes"],
                            "measured": measured, "time": time})
    return out


# ---------------------------------------------------------------------------------------------
# text rendering

def count_text(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def text_table(headers: list[str], body: list[list[str]], right: set[int]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in pairs)

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in body)])


def header_text(doc: dict) -> str:
    h = doc["header"]
    lines = [
        f"source: {h['source']}" + (f"  ({h['note']})" if h.get("note") else ""),
        f"gpu: {h['gpu']}   dtype: {h['dtype']}   N_q={h['N_q']}  N_k={h['N_k']}  d={h['d']}  "
        f"batch={h['batch']}  heads={h['heads']}"
        + (f"  kv_heads={h['kv_heads']}" if h.get("kv_heads") not in (None, h["heads"]) else "")
        + (f"  causal ({h['causal'].replace('_', '-')} aligned)" if h.get("causal") else "")
        + (f"  block-sparse {h['block_mask']['label']}: {h['block_mask']['blocks'][0]}x{h['block_mask']['blocks'][1]} "
           f"blocks of {h['block_mask']['block_q']}x{h['block_mask']['block_k']}, density "
           f"{h['block_mask']['density']:.3f}" if h.get("block_mask") else "")
        + (f"  mask ({h['mask']['kind']}, {'shared' if h['mask']['shared'] else 'one per batch-head'})"
           if h.get("mask") else "")
        + (f"  dropout p={h['dropout']['p']:g} (seed {h['dropout']['seed']}, offset {h['dropout']['offset']}; "
           "regenerated, never stored: no bytes)" if h.get("dropout") else ""),
        f"M (--sram) = {h['sram_bytes']:,} bytes = {format_bytes(h['sram_bytes'])} "
        f"= {h['sram_elements']:,} elements of {h['dtype']} (the paper's M is in elements)",
        "plans:",
    ]
    if h.get("problem_note"):
        lines.insert(2, f"batch x heads = {h['batch']} x {h['heads']}: {h['problem_note']}")
    env = h.get("environment") or {}
    if env.get("gpu"):
        lines.insert(1, f"device: {env['gpu']}  cupy {env.get('cupy')}  CUDA runtime {env.get('cuda_runtime')}  "
                        f"driver {env.get('cuda_driver')}  {env.get('date')}")
    for p in h["plans"]:
        tiles = ", ".join(f"{k}={v}" for k, v in p["tiles"].items())
        stages = "; ".join(f"{s['name']} grid={'x'.join(map(str, s['grid']))} smem={s['smem_bytes']:,}"
                           for s in p["stages"])
        variant = f"+{p['variant']}" if p.get("variant") else ""
        lines.append(f"  {p['algorithm']}/{p['schedule']}/{p['pass']}{variant}: {tiles}  [{stages}]")
    return "\n".join(lines)


def render(doc: dict, *, detail: bool = False, measured: bool = True) -> str:
    """Per algorithm, schedule and pass: total, then each stage (and each tensor with detail)."""
    headers = ["algorithm", "schedule", "pass", "stage", "tensor"]
    if measured:
        headers += ["measured B", "predicted B", "meas/pred", "theta B", "time ms", "GB/s", "max rel err"]
    else:
        headers += ["read B", "write B", "predicted B", "theta B", "order"]
    roof = doc["header"].get("roofline") is not None and measured
    if roof:
        headers += ["roofline ms", "bound", "time/roofline"]
    body = []
    stage_rows = doc["stages"]
    for row in (r for r in doc["rows"] if r["tensor"] == "total"):
        key = (row["algorithm"], row["schedule"], row["pass"])
        body.append(_cells(row, "*", measured) + (_roof_cells(row) if roof else []))
        for srow in (s for s in stage_rows if (s["algorithm"], s["schedule"], s["pass"]) == key):
            if srow["tensor"] == "total" or detail:
                body.append(_cells(srow, srow["stage"], measured) + (_roof_cells(srow) if roof else []))
    right = set(range(5, len(headers))) - ({len(headers) - 2} if roof else set())
    out = [header_text(doc), *(f"warning: {w}" for w in doc["header"].get("warnings") or []), "",
           text_table(headers, body, right)]
    ratios = doc["header"].get("ratios") or []
    if ratios:
        out.append("")
        out.append("bytes (and time) of standard over each other algorithm:")
        for r in ratios:
            m = "-" if r["measured"] is None else f"{r['measured']:.2f}x"
            t = "" if r.get("time") is None else f", time {r['time']:.2f}x"
            out.append(f"  {r['numerator']} / {r['denominator']}: predicted {r['predicted']:.2f}x, measured {m}{t}")
    if roof:
        out += ["", *roofline_lines(doc["header"]["roofline"])]
    mem = [r for r in doc["rows"] if r["tensor"] == "total" and r.get("peak_memory_bytes") is not None]
    if mem:
        out.append("")
        out.append("device memory beyond inputs and outputs (measured from the memory pool / model footprint):")
        for r in mem:
            out.append(f"  {r['algorithm']}/{r['schedule']}/{r['pass']}: {format_bytes(r['peak_memory_bytes'])} "
                       f"/ {format_bytes(r['footprint_bytes'])}")
    return "\n".join(out)


def roofline_lines(summary: dict) -> list[str]:
    """The text under ``compare``'s table: per plan other than standard, its ratios and reason."""
    c = summary["ceilings"]
    out = [f"time against bytes (standard over each; roofline: sum over stages of max(FLOPs/peak, bytes/bandwidth),"
           f" {c['note']}):"]
    for k in summary["checks"]:
        time = "-" if k["time"] is None else f"{k['time']:.2f}x"
        verdict = ("ranks as bytes" if k["ranks_as_bytes"] else "does NOT rank as bytes") + (
            "" if k["time"] is not None else " (roofline)")
        out.append(f"  {k['denominator']}: bytes {k['bytes']:.2f}x, roofline {k['roofline']:.2f}x, time {time}: "
                   f"{verdict}" + (f"; {k['reason']}" if k["reason"] else ""))
    return out


def _roof_cells(row: dict) -> list[str]:
    if row.get("bound") is None:  # a per-tensor row
        return ["", "", ""]
    ratio = row.get("seconds_over_roofline")
    return [f"{row['roofline_stage_seconds'] * 1e3:.3f}", row["bound"], "-" if ratio is None else f"{ratio:.2f}"]


def _cells(row: dict, stage: str, measured: bool) -> list[str]:
    total = row["tensor"] == "total"
    name = "total" if total else row["tensor"]
    ident = [row["algorithm"], row["schedule"], row["pass"], stage if stage != "*" else "all", name]
    theta = row.get("theta_bytes")
    theta_s = "-" if theta is None else f"{theta:.4g}"
    if not measured:
        return [*ident, count_text(row["predicted_read_bytes"]), count_text(row["predicted_write_bytes"]),
                count_text(row["predicted_bytes"]), theta_s, row.get("order", "") if stage == "*" else ""]
    ratio = row.get("measured_over_predicted")
    secs = row.get("seconds")
    bw = row.get("bandwidth_bytes_per_s")
    if bw is None and secs and row["measured_bytes"] is not None:
        bw = row["measured_bytes"] / secs
    return [*ident, count_text(row["measured_bytes"]), count_text(row["predicted_bytes"]),
            "-" if ratio is None else f"{ratio:.3f}", theta_s,
            "-" if not secs else f"{secs * 1e3:.3f}", "-" if not bw else f"{bw / 1e9:.1f}",
            "-" if row.get("max_rel_err") is None else f"{row['max_rel_err']:.1e}"]
