"""Sweeps: ``compare`` over a range of N, d, M or block size, with log-log exponent fits.

For each value of the varied quantity every selected plan runs once through
:func:`iokernels.analysis.compare.compare` (GPU counters and timings, or the CPU simulator), and its total
row becomes a point. The points of each algorithm, schedule and pass are then fitted as
bytes ∝ x^a (and seconds ∝ x^a on a GPU), beside the model's own slopes over the same points:

* ``model``: the exact model's bytes (ceilings and the plan's tiles included);
* ``theory``: the Θ form's leading term in N (``model.theta_leading``): its degree for ``--vary N``,
  its slope in d or M over the swept values for ``--vary d``/``M``. Flash: 2 in N, 2 in d (Algorithm 1
  slightly less: its ℓ and m round trips add a d¹ term), −1 in M; standard: 2 in N, and in d and M
  whatever its matrix products' panel re-reads give;
* ``flops``: the FLOPs' slope (time follows it when the kernels are compute bound).

``--vary block`` forces the resident block of each plan (``make_plan(block_c=)`` for flash kv_outer,
Algorithm 1, and the flash backward: B_c, the paper's Figure 2 study; ``block_r=`` for q_outer and
two_pass, whose resident block is the Q block B_r); block sizes that do not fit M are skipped and
reported. ``--vary M`` also reports the regime M < d² of Saha & Ye, where flash's Θ(N²d²/M) exceeds
the square-tiling bound Θ(N²d/√M).
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .. import model
from ..model.specs import GpuSpec
from ..plan import ALGORITHMS, SCHEDULES, Plan, SramTooSmall, TilesDoNotFit, Unsupported, make_plan
from ..plan.masks import DEFAULT_BLOCK, PATTERNS, check_density
from ..plan.masks import pattern as block_pattern
from ..plan.units import check_dtype, format_bytes, parse_size
from . import fit
from .compare import check_simulator_size, compare

VARIES = ("N", "d", "M", "block", "density")
Key = tuple[str, str, str]  # (algorithm, schedule, direction)

CSV_COLUMNS = (
    "vary", "value", "algorithm", "schedule", "pass", "N_q", "N_k", "d", "dtype", "batch", "heads", "causal",
    "sram_bytes", "sram_elements", "Br", "Bc", "BM", "BN", "BK", "smem_bytes", "measured_bytes",
    "predicted_bytes", "measured_over_predicted", "theta_bytes", "square_tiling_bytes", "flops", "seconds",
    "bandwidth_bytes_per_s", "max_rel_err", "source", "block_density",
)


@dataclass(frozen=True)
class Problem:
    """The fixed part of a sweep; the varied quantity replaces one of these per point."""

    N_q: int | None
    N_k: int | None
    d: int
    dtype: str
    sram: int
    batch: int = 1
    heads: int = 1
    causal: str = ""  # "", "top_left" or "bottom_right" (iokernels.plan.normalize_causal)
    # block-sparse attention (iokernels.plan.masks): the density of every point (None: dense), or the swept value
    # of --vary density; the pattern's kind, seed and block size
    block_sparse: float | None = None
    block_pattern: str = PATTERNS[0]
    block_seed: int = 0
    block_size: int = DEFAULT_BLOCK


def parse_values(vary: str, text: str) -> list[int] | list[float]:
    """``--values``: comma-separated integers; sizes (48KB, 1MB, 196608) for M; fractions in (0, 1] for
    density."""
    items = [t.strip() for t in str(text).split(",")]
    if not items or any(not t for t in items):
        raise ValueError(f"--values {text!r}: expected a comma-separated list such as 1024,2048,4096")
    out = []
    for t in items:
        if vary == "M":
            out.append(parse_size(t))
            continue
        if vary == "density":
            try:
                out.append(check_density(float(t)))
            except ValueError as exc:
                raise ValueError(f"--values: {t!r}: {exc}") from None
            continue
        try:
            v = int(t)
        except ValueError:
            raise ValueError(f"--values: {t!r} is not an integer (--vary {vary})") from None
        if v < 1:
            raise ValueError(f"--values: {vary} must be >= 1, got {v}")
        out.append(v)
    if len(set(out)) != len(out):
        raise ValueError(f"--values {text!r} repeats a value")
    return sorted(out)


def resident_tile(key: Key) -> str:
    """The tile ``--vary block`` sets: the block a thread block keeps on chip for its whole sweep."""
    algorithm, schedule, direction = key
    if algorithm == "flash" and (schedule == "kv_outer" or direction == "bwd"):
        return "Bc"
    return "Br"


def select(algorithms: str | None, schedules: str | None, backward: bool, vary: str) -> list[Key]:
    """The (algorithm, schedule, pass) triples a sweep runs, in display order."""
    default = ("flash",) if vary in ("block", "density") else ALGORITHMS
    algs = default if algorithms is None else tuple(a.strip() for a in algorithms.split(",") if a.strip())
    for a in algs:
        if a not in ALGORITHMS:
            raise ValueError(f"--algorithms: unknown algorithm {a!r}: expected some of {', '.join(ALGORITHMS)}")
    if vary == "block" and "standard" in algs:
        raise ValueError("--vary block sets the B_r x B_c tiles of flash and two_pass; standard attention has "
                         "none: drop it from --algorithms")
    directions = ("fwd", "bwd") if backward else ("fwd",)
    keys = [(a, s, p) for a in ALGORITHMS if a in algs for p in directions for s in SCHEDULES.get((a, p), ())]
    if schedules is not None:
        wanted = [s.strip() for s in schedules.split(",") if s.strip()]
        known = {s for _, s, _ in keys}
        for s in wanted:
            if s not in known:
                raise ValueError(f"--schedules: {s!r} is not a schedule of the selected algorithms and passes "
                                 f"(expected some of {', '.join(sorted(known))})")
        keys = [k for k in keys if k[1] in wanted]
    else:  # flash/fast has fixed tiles and half precision only: swept when asked for by --schedules
        keys = [k for k in keys if k[1] != "fast"]
    if not keys:
        raise ValueError("no plan selected: --algorithms has no pass here (add --backward?)")
    return keys


def check_problem(vary: str, values: list[int], base: Problem, smem_limit: int | None) -> None:
    if vary != "N" and (base.N_q is None or base.N_k is None):
        raise ValueError("give --N (or both --Nq and --Nk) unless --vary N")
    check_dtype(base.dtype)
    for m in values if vary == "M" else [base.sram]:
        if smem_limit and m > smem_limit:
            raise ValueError(f"M = {m} bytes ({format_bytes(m)}) exceeds the GPU's per-block shared-memory "
                             f"limit of {smem_limit} bytes ({format_bytes(smem_limit)}); choose smaller values "
                             "or another --gpu")


def make_point_plan(key: Key, vary: str, value: int, base: Problem, smem_limit: int | None) -> Plan:
    """The plan of ``key`` at one value of the varied quantity (ValueError when it does not fit)."""
    algorithm, schedule, direction = key
    kw = dict(N_q=base.N_q, N_k=base.N_k, d=base.d, dtype=base.dtype, sram=base.sram, batch=base.batch,
              heads=base.heads, direction=direction, smem_limit=smem_limit or None, causal=base.causal)
    density = base.block_sparse
    if vary == "N":
        kw.update(N_q=value, N_k=value)
    elif vary == "d":
        kw.update(d=value)
    elif vary == "M":
        kw.update(sram=value)
    elif vary == "density":
        density = value
    else:
        kw["block_c" if resident_tile(key) == "Bc" else "block_r"] = value
    if density is not None:  # the mask at this point's N, the same for every plan of the point
        kw["block_mask"] = block_pattern(base.block_pattern, density, n_q=kw["N_q"], n_k=kw["N_k"],
                                         block_q=base.block_size, seed=base.block_seed)
    return make_plan(algorithm, schedule, **kw)


def build_plans(vary: str, values: list[int], keys: list[Key], base: Problem, smem_limit: int | None
                ) -> tuple[list[tuple[int, Plan]], list[dict]]:
    """(value, plan) for every point that fits; the rest as ``skipped`` records with the reason.

    A malformed problem (a bad d, a bad dtype) raises; a tiling that does not fit M is skipped."""
    jobs, skipped = [], []
    for value in values:
        for key in keys:
            try:
                jobs.append((value, make_point_plan(key, vary, value, base, smem_limit)))
            except (SramTooSmall, TilesDoNotFit, Unsupported) as exc:
                skipped.append({"value": value, "plan": "/".join(key), "reason": str(exc)})
    if not jobs:
        reasons = "; ".join(f"{s['plan']} at {s['value']}: {s['reason']}" for s in skipped[:2])
        raise ValueError(f"no point of this sweep fits: {reasons}")
    return jobs, skipped


def precompile(plans: Iterable[Plan]) -> None:
    """Compile every distinct kernel of ``plans`` (counting and plain) on a thread pool before the
    sweep runs: NVRTC releases the GIL, and a sweep over M or block size has many distinct tilings.
    Best effort: a failure here is left for the real run to report."""
    from ..kernels import launch
    from ..kernels.stages import kernel_ref

    jobs = {}
    for plan in plans:
        for stage in plan.stages:
            for counting in (True, False):
                jobs.setdefault((kernel_ref(plan, stage), counting, stage.smem_bytes), (plan, stage, counting))

    def one(job: tuple) -> None:
        with contextlib.suppress(Exception):
            launch.kernel_function(*job)

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(16, os.cpu_count() or 1))) as pool:
        list(pool.map(one, jobs.values()))


def _free_device_pool() -> None:
    """Give cached device memory back between points: a sweep over N allocates S and P of every size."""
    with contextlib.suppress(Exception):
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()


def _point(vary: str, value: int, plan: Plan, doc: dict) -> dict:
    total = next(r for r in doc["rows"] if r["tensor"] == "total")
    tile = plan.tile
    degree, coefficient = model.theta_leading(plan)
    return {
        "vary": vary, "value": value, "algorithm": plan.algorithm, "schedule": plan.schedule,
        "pass": plan.direction, "N_q": plan.N_q, "N_k": plan.N_k, "d": plan.d, "dtype": plan.dtype,
        "batch": plan.batch, "heads": plan.heads, "causal": plan.causal,
        "block_density": None if plan.block_mask is None else plan.block_mask.density, "sram_bytes": plan.sram_bytes,
        "sram_elements": plan.sram_elements, "tiles": tile, **{k: tile.get(k) for k in ("Br", "Bc", "BM", "BN", "BK")},
        "smem_bytes": plan.smem_bytes,
        "measured_bytes": total["measured_bytes"], "predicted_bytes": total["predicted_bytes"],
        "measured_over_predicted": total["measured_over_predicted"], "theta_bytes": total["theta_bytes"],
        "theta_leading_degree": degree, "theta_leading_coefficient": coefficient,
        "square_tiling_bytes": model.bound_bytes(model.square_tiling_expr(), plan),
        "lower_bound_bytes": model.bound_bytes(model.io_lower_bound_expr(), plan),
        "flops": total["flops"], "seconds": total["seconds"],
        "bandwidth_bytes_per_s": total["bandwidth_bytes_per_s"], "max_rel_err": total["max_rel_err"],
        "source": total["source"],
    }


def label(point: dict) -> str:
    return f"{point['algorithm']}/{point['schedule']}/{point['pass']}"


def groups(points: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for p in points:
        out.setdefault(label(p), []).append(p)
    return out


def _theory(vary: str, pts: list[dict]) -> float | None:
    if vary == "N":
        return float(pts[0]["theta_leading_degree"])
    if vary in ("d", "M"):
        return fit.slope([p["value"] for p in pts], [p["theta_leading_coefficient"] for p in pts])
    # block size: the Θ form uses the paper's tiles, not forced ones; density: Θ(Nd + N²d²M⁻¹s) is not a
    # power of s (see the model and Θ columns)
    return None


def fits(vary: str, points: list[dict]) -> list[dict]:
    """One fit per algorithm/schedule/pass and quantity (measured bytes; seconds when timed)."""
    out = []
    for name, pts in groups(points).items():
        xs = [p["value"] for p in pts]
        if len(set(xs)) < 2:
            continue
        a, s, d = name.split("/")
        common = {"algorithm": a, "schedule": s, "pass": d,
                  "model_exponent": fit.slope(xs, [p["predicted_bytes"] for p in pts]),
                  "theta_exponent": None if vary == "block" else fit.slope(xs, [p["theta_bytes"] for p in pts]),
                  "theory_exponent": _theory(vary, pts),
                  "flops_exponent": fit.slope(xs, [p["flops"] for p in pts]),
                  "x_min": min(xs), "x_max": max(xs)}
        quantities = [("bytes", "measured_bytes")]
        if all(p["seconds"] for p in pts):
            quantities.append(("seconds", "seconds"))
        for quantity, field in quantities:
            ys = [p[field] for p in pts]
            f = fit.loglog_fit(xs, ys)
            # the local slope between the two largest values: where the leading term dominates most
            end = math.log(ys[-1] / ys[-2]) / math.log(xs[-1] / xs[-2])
            out.append({**common, "quantity": quantity, **f.as_dict(), "end_exponent": end})
    return out


def regime(points: list[dict]) -> list[dict]:
    """``--vary M``: flash against Saha & Ye's square-tiling bound N²d/√M, per plan, with the local
    log-log slope between neighbouring M and a one-line summary of what the points show."""
    out = []
    for name, pts in groups(points).items():
        if not name.startswith("flash") or len(pts) < 2:
            continue
        d2 = pts[0]["d"] ** 2
        rows = []
        for i, p in enumerate(pts):
            local = None
            if i:
                q = pts[i - 1]
                local = math.log(p["measured_bytes"] / q["measured_bytes"]) / math.log(p["value"] / q["value"])
            rows.append({"sram_bytes": p["value"], "M_elements": p["sram_elements"],
                         "M_over_d2": p["sram_elements"] / d2, "tiles": p["tiles"],
                         "measured_bytes": p["measured_bytes"], "square_tiling_bytes": p["square_tiling_bytes"],
                         "over_square_tiling": p["measured_bytes"] / p["square_tiling_bytes"],
                         "local_exponent": local})
        out.append({"plan": name, "d": pts[0]["d"], "d2_elements": d2, "points": rows,
                    "summary": _regime_summary(name, rows)})
    return out


FLAT = -0.05  # a local M-exponent above this counts as "no longer improving"


def _regime_summary(name: str, rows: list[dict]) -> str:
    lo, hi = rows[0], rows[-1]
    locals_ = [r["local_exponent"] for r in rows[1:]]
    below = [r for r in rows if r["M_over_d2"] < 1]
    overall = math.log(hi["measured_bytes"] / lo["measured_bytes"]) / math.log(hi["M_elements"] / lo["M_elements"])
    flat = next((r for r in rows[1:] if r["local_exponent"] > FLAT), None)
    text = (f"{name}: M from {lo['M_elements']:,} to {hi['M_elements']:,} elements "
            f"({lo['M_over_d2']:.3g}·d² to {hi['M_over_d2']:.3g}·d², {len(below)} of {len(rows)} points below d²); "
            f"bytes ∝ M^{overall:.2f} overall (local slopes {min(locals_):.2f} to {max(locals_):.2f}) against "
            f"M^-0.50 for square tiling; measured / (N²d/√M) goes from {lo['over_square_tiling']:.3g} to "
            f"{hi['over_square_tiling']:.3g}; ")
    if flat is None:
        text += "the bytes keep falling at every step"
    else:
        text += (f"the bytes stop improving from M = {flat['M_elements']:,} elements "
                 f"(local slope {flat['local_exponent']:.2f} > {FLAT})")
    return text


def run(vary: str, values: list[int], keys: list[Key], base: Problem, spec: GpuSpec, *, on_gpu: bool,
        reason: str = "", seed: int = 0, repeats: int = 10, reference_check: bool = True, do_fit: bool = True,
        progress: Callable[[list], Iterable] | None = None) -> dict:
    """The sweep document: ``header``, ``points`` (one per value and plan), ``skipped``, ``fits``
    and, for ``--vary M``, ``regime``. ``progress`` wraps the job list (a progress bar)."""
    if do_fit:
        fit.require_scipy()
    smem_limit = spec.smem_per_block_bytes or None
    check_problem(vary, values, base, smem_limit)
    jobs, skipped = build_plans(vary, values, keys, base, smem_limit)
    if on_gpu:
        precompile(plan for _, plan in jobs)
    else:
        check_simulator_size([plan for _, plan in jobs])
    points, header, warnings = [], None, []
    for value, plan in (progress(jobs) if progress else jobs):
        doc = compare([plan], spec, on_gpu=on_gpu, reason=reason, seed=seed, repeats=repeats,
                      reference_check=reference_check)
        header = header or doc["header"]
        warnings += [w for w in doc["header"].get("warnings") or [] if w not in warnings]
        points.append(_point(vary, value, plan, doc))
        if on_gpu:
            _free_device_pool()
    points.sort(key=lambda p: (keys.index((p["algorithm"], p["schedule"], p["pass"])), p["value"]))
    doc = {
        "header": {
            "command": "sweep", "vary": vary, "values": values, "source": header["source"], "note": header["note"],
            "gpu": spec.name, "gpu_key": spec.key, "dtype": base.dtype, "N_q": base.N_q, "N_k": base.N_k,
            "d": base.d, "sram_bytes": base.sram, "batch": base.batch, "heads": base.heads, "causal": base.causal,
            "block_sparse": ({"density": None if vary == "density" else base.block_sparse,
                              "pattern": base.block_pattern, "seed": base.block_seed, "block_size": base.block_size}
                             if vary == "density" or base.block_sparse is not None else None),
            "plans": ["/".join(k) for k in keys], "repeats": repeats if on_gpu else None,
            "reference_check": reference_check or not on_gpu,
            "block_tile": {"/".join(k): resident_tile(k) for k in keys} if vary == "block" else None,
            "warnings": warnings,
            "environment": header.get("environment"),
        },
        "points": points,
        "skipped": skipped,
        "fits": fits(vary, points) if do_fit else [],
    }
    if vary == "M":
        doc["regime"] = regime(points)
    return doc


def refit(doc: dict) -> dict:
    """Recompute the fits (and the M < d² table) of a sweep document from its points: for a run made
    with ``--no-fit`` where scipy was missing, e.g. ``sweep.refit(json.load(open("N.json")))``."""
    vary = doc["header"]["vary"]
    out = {**doc, "fits": fits(vary, doc["points"])}
    if vary == "M":
        out["regime"] = regime(doc["points"])
    return out


# ---------------------------------------------------------------------------------------------
# output

def to_csv(doc: dict) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for p in doc["points"]:
        writer.writerow({k: ("" if p.get(k) is None else p.get(k)) for k in CSV_COLUMNS})
    return buf.getvalue()


def _table(headers: list[str], body: list[list[str]], left: int) -> str:
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths,
                                                                                                strict=True)))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in body)])


def _value_text(vary: str, v: int) -> str:
    return format_bytes(v) if vary == "M" else str(v)


def _opt(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(round(x, 3) + 0.0, fmt)  # + 0.0: no "-0.000"


def render(doc: dict) -> str:
    h = doc["header"]
    varied = {"N": ("N_q", "N_k"), "d": ("d",), "M": ("sram_bytes",), "block": (), "density": ()}[h["vary"]]
    fixed = [f"{k}={h[k]}" for k in ("N_q", "N_k", "d") if h[k] is not None and k not in varied]
    if "sram_bytes" not in varied:
        fixed.append(f"M (--sram) = {h['sram_bytes']:,} bytes")
    lines = [f"source: {h['source']}" + (f"  ({h['note']})" if h.get("note") else ""),
             f"gpu: {h['gpu']}   dtype: {h['dtype']}   {'  '.join(fixed)}   batch={h['batch']}  heads={h['heads']}",
             f"vary {h['vary']} over {', '.join(_value_text(h['vary'], v) for v in h['values'])}"]
    env = h.get("environment") or {}
    if env.get("gpu"):
        lines.append(f"device: {env['gpu']}  cupy {env.get('cupy')}  CUDA runtime {env.get('cuda_runtime')}  "
                     f"{env.get('date')}")
    if h.get("block_tile"):
        lines.append("block = " + ", ".join(f"{t} of {p}" for p, t in h["block_tile"].items()))
    if h.get("block_sparse"):
        b = h["block_sparse"]
        seed = f" (seed {b['seed']})" if b["pattern"] == "random" else ""
        lines.append(f"block-sparse: pattern {b['pattern']}{seed}, blocks of {b['block_size']}"
                     + (f", density {b['density']}" if b["density"] else ""))
    lines += [f"warning: {w}" for w in h.get("warnings") or []]
    headers = [h["vary"], "algorithm", "schedule", "pass", "tiles", "measured B", "predicted B", "meas/pred",
               "theta B", "time ms", "GB/s"]
    body = []
    for p in doc["points"]:
        tiles = ",".join(f"{k}={v}" for k, v in p["tiles"].items() if k in ("Br", "Bc", "BM", "BN"))
        bw = p.get("bandwidth_bytes_per_s")
        body.append([_value_text(h["vary"], p["value"]), p["algorithm"], p["schedule"], p["pass"], tiles,
                     f"{p['measured_bytes']:,}", f"{p['predicted_bytes']:,}", f"{p['measured_over_predicted']:.3f}",
                     f"{p['theta_bytes']:.4g}", "-" if not p["seconds"] else f"{p['seconds'] * 1e3:.3f}",
                     "-" if not bw else f"{bw / 1e9:.1f}"])
    lines += ["", _table(headers, body, 5)]
    if doc["skipped"]:
        lines += ["", "skipped (does not fit):"]
        lines += [f"  {h['vary']}={_value_text(h['vary'], s['value'])} {s['plan']}: {s['reason']}"
                  for s in doc["skipped"]]
    if doc["fits"]:
        lines += ["", f"log-log fits, y ∝ {h['vary']}^a over all points (95% CI from the t distribution, n-2 "
                  "dof), the measured slope between the two largest values (last pair), and the slopes over the "
                  "same points of the exact model's bytes, of the Θ form, of its leading N-term (theory) and of "
                  "the FLOPs:"]
        fh = ["algorithm", "schedule", "pass", "quantity", "fitted a", "95% CI", "r²", "n", "last pair a",
              "model a", "Θ a", "theory a", "FLOPs a"]
        fb = [[f["algorithm"], f["schedule"], f["pass"], f["quantity"], _opt(f["exponent"]),
               "-" if f["ci_low"] is None else f"[{f['ci_low']:.3f}, {f['ci_high']:.3f}]", f"{f['r2']:.4f}",
               str(f["n"]), *(_opt(f[k]) for k in ("end_exponent", "model_exponent", "theta_exponent",
                                                    "theory_exponent", "flops_exponent"))] for f in doc["fits"]]
        lines += [_table(fh, fb, 4)]
    if doc.get("regime"):
        lines += ["", "M against d² (Saha & Ye: Θ(min(N²d²/M, N²d/√M)); square tiling wins below M = d² elements):"]
        for r in doc["regime"]:
            rh = ["M", "M elements", "M/d²", "tiles", "measured B", "N²d/√M B", "meas/bound", "local a"]
            rb = [[format_bytes(x["sram_bytes"]), f"{x['M_elements']:,}", f"{x['M_over_d2']:.3f}",
                   ",".join(f"{k}={v}" for k, v in x["tiles"].items()), f"{x['measured_bytes']:,}",
                   f"{x['square_tiling_bytes']:.4g}", f"{x['over_square_tiling']:.3g}",
                   _opt(x["local_exponent"], ".3f")] for x in r["points"]]
            lines += ["", f"[{r['plan']}] d={r['d']}, d² = {r['d2_elements']:,} elements", _table(rh, rb, 1),
                      r["summary"]]
    return "\n".join(lines)
