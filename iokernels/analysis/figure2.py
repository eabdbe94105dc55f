"""``iokernels paper fig2``: the three panels of the FlashAttention paper's Figure 2 (Dao et al. 2022),
predicted by the model for every point, and measured on the GPU when there is one.

* left: GPT-2 medium attention (N 1024, d 64, 16 heads, batch 64, float16), forward + backward, for
  standard attention, the flash plans the library runs (the tensor-core ``flash/fast`` forward and
  backward) and the paper's own schedule (``flash/kv_outer`` forward and backward, Algorithms 1 and 4):
  GFLOPs (``model.predict(plan).flops``), HBM bytes predicted (``model.exact``) and counted (the
  counting build), DRAM bytes (Nsight Compute), runtime, the roofline time on the chosen GPU spec, and
  the paper's published A100 figures beside them; per-tensor bytes show where the flash bytes go;
* middle: the flash forward against its resident block size (B_c of ``kv_outer``, B_r of ``q_outer``),
  64, 128, ... up to the largest power of two that fits M: bytes, runtime, the slope of log runtime
  against log bytes and the knee where runtime stops falling, beside the roofline's knee;
* right: the block-sparse flash forward against the fraction of nonzero blocks.

Rows and points are plain dicts built once (:func:`build`); :func:`render` prints them and
``figure2_plot.plot`` draws them. GPU work is :func:`measure_gpu` and :func:`dram_bytes` (cupy and ncu
imported lazily); without them every measured field stays None. GB here is 10^9 bytes, as in the paper.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from .. import model
from ..model.specs import GpuSpec
from ..plan import Plan, TilesDoNotFit, Unsupported, make_plan
from ..plan.masks import PATTERNS
from ..plan.masks import pattern as block_pattern
from ..plan.units import itemsize
from .fit import slope
from .report import text_table

PANELS = ("left", "middle", "right")
GB = 1e9
# the paper's Figure 2 (left): A100, GPT-2 medium, forward + backward
PAPER_A100 = {"standard": {"gflops": 66.6, "hbm_gb": 40.3, "runtime_ms": 41.7},
              "flash": {"gflops": 75.2, "hbm_gb": 4.4, "runtime_ms": 7.3}}
GPT2_MEDIUM = {"N": 1024, "d": 64, "batch": 64, "heads": 16, "dtype": "float16"}
FIRST_BLOCK = 64
DENSITIES = (1.0, 0.5, 0.25, 0.125, 0.0625)
SPARSE_PATTERN = "random"  # exact fractions of the blocks (local and strided round to whole key blocks per row)
SPARSE_BLOCK = 128
KNEE_TOLERANCE = 0.05  # runtime has stopped falling when no later point is more than 5% faster
RESIDENT = {"kv_outer": "block_c", "q_outer": "block_r"}  # the forced resident block of each forward schedule

Measure = Callable[[Plan], dict]  # plan -> {"counted_read_bytes", "counted_write_bytes", "seconds", ...}


@dataclass(frozen=True)
class Problem:
    """The attention problem of every panel (the paper's GPT-2 medium by default); ``sram`` is M in bytes."""

    N: int
    d: int
    batch: int
    heads: int
    dtype: str
    sram: int

    def plan(self, algorithm: str, schedule: str | None, direction: str = "fwd", **kw) -> Plan:
        return make_plan(algorithm, schedule, N_q=self.N, d=self.d, dtype=self.dtype, sram=self.sram,
                         batch=self.batch, heads=self.heads, direction=direction, **kw)


def parse_panels(text: str) -> tuple[str, ...]:
    """``--panels left,middle``: a subset of the panels, in figure order."""
    names = [t.strip() for t in str(text).split(",")]
    wrong = [n for n in names if n not in PANELS]
    if wrong or not names:
        raise ValueError(f"--panels {text!r}: expected a comma-separated subset of {','.join(PANELS)}")
    return tuple(p for p in PANELS if p in names)


def parse_numbers(option: str, text: str, kind: type) -> tuple:
    try:
        values = tuple(kind(t) for t in str(text).split(","))
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected comma-separated numbers") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"{option} {text!r}: every value must be positive")
    return values


# ---------------------------------------------------------------------------------------------
# which plans each panel runs

def left_plans(problem: Problem) -> list[tuple[str, str, list[Plan]]]:
    """(row, paper column, [forward plan, backward plan]) for the left panel: standard attention, the flash
    plans the library runs (``library/api.py`` ``choose_plan``: flash/fast where its kernels take the
    problem, else q_outer forward and kv_outer backward) and the paper's Algorithms 1 and 4 (kv_outer)."""
    both = ("fwd", "bwd")
    standard = [problem.plan("standard", None, direction) for direction in both]
    try:
        library = [problem.plan("flash", "fast", direction) for direction in both]
    except Unsupported:  # float32, or a head dim the tensor-core kernels do not take
        library = [problem.plan("flash", "q_outer", "fwd"), problem.plan("flash", "kv_outer", "bwd")]
    research = [problem.plan("flash", "kv_outer", direction) for direction in both]
    name = "flash (library: " + " + ".join(f"{p.schedule} {p.direction}" for p in library) + ")"
    return [("standard", "standard", standard), (name, "flash", library),
            ("flash (paper: kv_outer fwd + bwd)", "flash", research)]


def block_sizes(problem: Problem, schedule: str, first: int = FIRST_BLOCK) -> tuple[list[int], int]:
    """The resident block sizes first, 2·first, ... that fit M (``make_plan`` accepts them), and the first that
    does not."""
    knob = _knob(schedule)
    sizes, block = [], first
    while True:
        try:
            problem.plan("flash", schedule, **{knob: block})
        except TilesDoNotFit:
            return sizes, block
        sizes.append(block)
        block *= 2


def block_plan(problem: Problem, schedule: str, block: int) -> Plan:
    return problem.plan("flash", schedule, **{_knob(schedule): block})


def _knob(schedule: str) -> str:
    if schedule not in RESIDENT:
        raise ValueError(f"--schedule {schedule!r}: expected one of {', '.join(RESIDENT)}")
    return RESIDENT[schedule]


def sparse_plans(problem: Problem, schedule: str, densities: Sequence[float], kind: str = SPARSE_PATTERN,
                 block: int = SPARSE_BLOCK, seed: int = 0) -> list[tuple[float, Plan]]:
    """(requested density, block-sparse flash forward plan) per density (``plan/masks.py`` patterns)."""
    _knob(schedule)
    if kind not in PATTERNS:
        raise ValueError(f"--block-pattern {kind!r}: expected one of {', '.join(PATTERNS)}")
    return [(dens, problem.plan("flash", schedule, block_mask=block_pattern(
        kind, dens, n_q=problem.N, n_k=problem.N, block_q=block, seed=seed))) for dens in densities]


# ---------------------------------------------------------------------------------------------
# pure analysis: roofline, slope, knee

def memory_bound(flops: float, nbytes: float, spec: GpuSpec, dtype: str, peak: float | None = None) -> bool:
    """The roofline's verdict: moving the bytes at HBM bandwidth takes longer than the FLOPs at ``peak``
    (default: the spec's peak for the dtype, tensor cores for float16/bfloat16)."""
    return nbytes / spec.hbm_bytes_per_s > flops / (peak or spec.peak_flops(dtype))


def time_bytes_slopes(nbytes: Sequence[float], seconds: Sequence[float],
                      bound: Sequence[bool]) -> dict:
    """Least-squares slope of log(seconds) against log(bytes), over all points and over the memory-bound
    ones (``bound``); None where fewer than two distinct byte counts are left. Time proportional to
    bytes gives 1; time that ignores bytes gives 0."""
    def fit(pairs: list[tuple[float, float]]) -> float | None:
        if len({b for b, _ in pairs}) < 2:
            return None
        return slope([b for b, _ in pairs], [s for _, s in pairs])

    points = [(b, s, m) for b, s, m in zip(nbytes, seconds, bound, strict=True) if b and s]
    every = [(b, s) for b, s, _ in points]
    memory = [(b, s) for b, s, m in points if m]
    return {"all": fit(every), "n_all": len(every), "memory_bound": fit(memory), "n_memory_bound": len(memory)}


def knee(xs: Sequence[int], seconds: Sequence[float], tolerance: float = KNEE_TOLERANCE) -> int | None:
    """The first x after which runtime stops falling: no later point is more than ``tolerance`` faster.
    None when it is still falling at the last point (or there are fewer than two)."""
    for i in range(len(xs) - 1):
        if all(later >= (1 - tolerance) * seconds[i] for later in seconds[i + 1:]):
            return xs[i]
    return None


def roofline_knee(xs: Sequence[int], flops: Sequence[float], nbytes: Sequence[float], spec: GpuSpec,
                  dtype: str, peak: float | None = None) -> int | None:
    """The first x where the roofline turns compute-bound (bytes / bandwidth <= FLOPs / peak); None if none."""
    for x, f, b in zip(xs, flops, nbytes, strict=True):
        if not memory_bound(f, b, spec, dtype, peak):
            return x
    return None


# ---------------------------------------------------------------------------------------------
# points and rows

def _point(plan: Plan, spec: GpuSpec, measured: dict | None, dram: dict | None) -> dict:
    pred = model.predict(plan)
    measured = measured or {}
    counted = None if "counted_read_bytes" not in measured else \
        measured["counted_read_bytes"] + measured["counted_write_bytes"]
    return {
        "plan": plan.label, "tiles": plan.tile, "smem_bytes": plan.smem_bytes, "flops": pred.flops,
        "predicted_read_bytes": pred.read_bytes, "predicted_write_bytes": pred.write_bytes,
        "predicted_bytes": pred.total_bytes, "theta_bytes": pred.theta_bytes,
        "roofline_seconds": pred.roofline_seconds(spec),
        "memory_bound": memory_bound(pred.flops, pred.total_bytes, spec, plan.dtype),
        "counted_read_bytes": measured.get("counted_read_bytes"),
        "counted_write_bytes": measured.get("counted_write_bytes"), "counted_bytes": counted,
        "dram_bytes": None if not dram else dram["dram_bytes"],
        "dram_read_bytes": None if not dram else dram["dram_read_bytes"],
        "dram_write_bytes": None if not dram else dram["dram_write_bytes"],
        "seconds": measured.get("seconds"), "stage_seconds": measured.get("stage_seconds", {}),
    }


def _sum(values: list) -> float | None:
    return None if any(v is None for v in values) else sum(values)


def left_panel(problem: Problem, spec: GpuSpec, results: Callable[[Plan], tuple]) -> dict:
    rows, tensors = [], []
    for name, paper, plans in left_plans(problem):
        passes = [_point(p, spec, *results(p)) for p in plans]
        row = {"row": name, "passes": passes, "gflops": sum(p["flops"] for p in passes) / 1e9,
               "paper_a100": PAPER_A100[paper]}
        for key in ("predicted_bytes", "counted_bytes", "dram_bytes", "seconds", "roofline_seconds"):
            row[key] = _sum([p[key] for p in passes])
        rows.append(row)
        for plan in plans:
            total = row["predicted_bytes"]
            for tensor, (r, w) in model.predict(plan).per_tensor.items():
                tensors.append({"row": name, "plan": plan.label, "tensor": tensor, "read_bytes": r,
                                "write_bytes": w, "share_of_row": (r + w) / total})
    return {"rows": rows, "per_tensor": tensors, "notes": byte_notes(rows, tensors)}


def with_dram_model(doc: dict) -> dict:
    """``doc`` with the two-level DRAM model's bytes (``model/l2.py``: cold L2, reuse within a wave) beside ncu's:
    ``model_dram_read_bytes`` / ``model_dram_write_bytes`` / ``model_dram_bytes`` on every left-panel row and
    middle-panel point, for the GPU that ran (``header.device``; else the spec). A pure function of the header's
    problem, so it also completes documents saved before the column existed."""
    from ..model.l2 import dram_spec_for, dram_totals

    header = doc["header"]
    problem = Problem(**header["problem"])
    spec = dram_spec_for(header.get("device") or header["spec"]["name"])
    header["dram_model"] = f"model DRAM: the two-level model (model/l2.py) on {spec.name}"

    def fill(target: dict, plans: list[Plan]) -> None:
        totals = [dram_totals(p, spec) for p in plans]
        r = sum(v[0] for t in totals for v in t.values())
        w = sum(v[1] for t in totals for v in t.values())
        target.update(model_dram_read_bytes=r, model_dram_write_bytes=w, model_dram_bytes=r + w)

    if "left" in doc:
        for row, (_, _, plans) in zip(doc["left"]["rows"], left_plans(problem), strict=True):
            fill(row, plans)
    if "middle" in doc:
        for point in doc["middle"]["points"]:
            fill(point, [block_plan(problem, doc["middle"]["schedule"], point["block"])])
    return doc


def byte_notes(rows: list[dict], tensors: list[dict]) -> list[str]:
    """Where each flash row's bytes go, against the paper's 4.4 GB: its largest tensors."""
    notes = []
    for row in rows[1:]:
        mine = sorted((t for t in tensors if t["row"] == row["row"]),
                      key=lambda t: -(t["read_bytes"] + t["write_bytes"]))
        top = ", ".join(f"{t['tensor']} ({t['plan'].split('/')[-1]}) "
                        f"{(t['read_bytes'] + t['write_bytes']) / GB:.2f} GB ({100 * t['share_of_row']:.0f}%)"
                        for t in mine[:3])
        notes.append(f"{row['row']}: {row['predicted_bytes'] / GB:.2f} GB predicted "
                     f"({row['predicted_bytes'] / GB / row['paper_a100']['hbm_gb']:.2f}x the paper's "
                     f"{row['paper_a100']['hbm_gb']} GB); largest: {top}")
    return notes


def fitting_blocks(problem: Problem, schedule: str, blocks: Sequence[int] | None) -> list[int]:
    """The middle panel's block sizes: ``blocks`` (default 64, 128, ... while they fit), those whose plan fits M."""
    fitting, _ = block_sizes(problem, schedule)
    out = []
    for b in blocks or fitting:
        try:
            block_plan(problem, schedule, b)
        except TilesDoNotFit:
            continue
        out.append(b)
    return out


def middle_panel(problem: Problem, spec: GpuSpec, schedule: str, blocks: Sequence[int] | None,
                 results: Callable[[Plan], tuple]) -> dict:
    _, too_big = block_sizes(problem, schedule)
    chosen = fitting_blocks(problem, schedule, blocks)
    skipped = [b for b in (blocks or ()) if b not in chosen]
    points = []
    for b in chosen:
        plan = block_plan(problem, schedule, b)
        points.append({"block": b, **_point(plan, spec, *results(plan))})
    xs = [p["block"] for p in points]
    bound = [p["memory_bound"] for p in points]
    flops, nbytes = [p["flops"] for p in points], [p["predicted_bytes"] for p in points]
    seconds = [p["seconds"] for p in points]
    timed = all(s is not None for s in seconds) and points
    fits = {}
    measured_knee = knee(xs, seconds) if timed else None
    # the falling region: every point up to the measured knee (all of them when runtime still falls)
    falling = [measured_knee is None or x <= measured_knee for x in xs]
    for source in ("counted_bytes", "dram_bytes"):
        ys = [p[source] for p in points]
        if timed and all(y is not None for y in ys):
            fits[source] = time_bytes_slopes(ys, seconds, bound)
            before = time_bytes_slopes(ys, seconds, falling)
            fits[source].update(falling=before["memory_bound"], n_falling=before["n_memory_bound"])
    return {"schedule": schedule, "knob": _knob(schedule), "points": points, "skipped": skipped,
            "first_not_fitting": too_big, "fits": fits, "knee": measured_knee,
            "roofline_knee": roofline_knee(xs, flops, nbytes, spec, problem.dtype),
            # the same knee at the spec's fp32 (CUDA-core) peak: float32 plans, and a far lower compute ceiling
            "roofline_knee_cuda_cores": roofline_knee(xs, flops, nbytes, spec, problem.dtype, spec.fp32_flops)}


def right_panel(problem: Problem, spec: GpuSpec, schedule: str, densities: Sequence[float], kind: str, block: int,
                seed: int, results: Callable[[Plan], tuple]) -> dict:
    points = []
    for dens, plan in sparse_plans(problem, schedule, densities, kind, block, seed):
        points.append({"requested_density": dens, "density": plan.block_mask.density,
                       **_point(plan, spec, *results(plan))})
    return {"schedule": schedule, "pattern": kind, "block_size": block, "seed": seed, "points": points}


# ---------------------------------------------------------------------------------------------
# the document

def build(problem: Problem, spec: GpuSpec, panels: Sequence[str], *, schedule: str = "kv_outer",
          blocks: Sequence[int] | None = None, densities: Sequence[float] = DENSITIES, pattern: str = SPARSE_PATTERN,
          sparse_block: int = SPARSE_BLOCK, seed: int = 0, measure: Measure | None = None,
          dram: Callable[[list[Plan]], list[dict | None]] | None = None, header: dict | None = None) -> dict:
    """The figure's document. ``measure``: runs one plan on the GPU (None: predicted columns only);
    ``dram``: DRAM bytes of a list of plans (None: no DRAM column; the right panel never takes it)."""
    measured: dict[Plan, dict | None] = {}

    def run(plan: Plan) -> dict | None:
        if plan not in measured:
            measured[plan] = measure(plan) if measure else None
        return measured[plan]

    dram_by_plan: dict[Plan, dict | None] = {}
    if dram is not None:  # DRAM first, in as few ncu runs as the plans allow, then the timed runs
        wanted = [p for _, _, ps in left_plans(problem) for p in ps] if "left" in panels else []
        if "middle" in panels:
            wanted += [block_plan(problem, schedule, b) for b in fitting_blocks(problem, schedule, blocks)]
        wanted = list(dict.fromkeys(wanted))
        dram_by_plan = dict(zip(wanted, dram(wanted), strict=True))

    def results(plan: Plan) -> tuple:
        return run(plan), dram_by_plan.get(plan)

    doc = {"header": {"figure": "FlashAttention (Dao et al. 2022), Figure 2", "panels": list(panels),
                      "problem": asdict(problem), "sram_elements": problem.sram // itemsize(problem.dtype),
                      "spec": spec.as_row(), "measured": measure is not None, "dram": dram is not None,
                      "units": "GB = 1e9 bytes; seconds; GFLOPs = 1e9 matrix-product FLOPs",
                      **(header or {})}}
    if "left" in panels:
        doc["left"] = left_panel(problem, spec, results)
    if "middle" in panels:
        doc["middle"] = middle_panel(problem, spec, schedule, blocks, results)
    if "right" in panels:
        doc["right"] = right_panel(problem, spec, schedule, densities, pattern, sparse_block, seed,
                                   lambda p: (run(p), None))
    try:
        return with_dram_model(doc)
    except ValueError as exc:  # a GPU that gpus.json does not name, or whose L2 it does not know
        doc["header"]["dram_model"] = f"no two-level DRAM model column: {exc}"
        return doc


# ---------------------------------------------------------------------------------------------
# the GPU (cupy and ncu imported lazily)

def measure_gpu(plan: Plan, *, repeats: int = 10, seed: int = 0) -> dict:
    """Counted bytes (counting build, once) and median seconds (plain build, CUDA-graph replays,
    ``timing.time_plan``) of one plan. Inputs as ``iokernels profile`` makes them
    (``profile.device_inputs``: random on the device for large backward plans, whose host reference would
    need several float64 N x N arrays per batch-head); no output check."""
    from ..kernels import launch, timing
    from ..kernels.runtime import require_cupy
    from .profile import device_inputs

    cp = require_cupy()
    inputs, _ = device_inputs(plan, seed)
    run = launch.run_plan(plan, inputs, counting=True)
    counts = run.counts
    del run
    seconds, stage_seconds = timing.time_plan(plan, inputs, repeats=repeats)
    del inputs
    cp.get_default_memory_pool().free_all_blocks()
    read = sum(r for tensors in counts.values() for r, _ in tensors.values())
    write = sum(w for tensors in counts.values() for _, w in tensors.values())
    return {"counted_read_bytes": read, "counted_write_bytes": write, "seconds": seconds,
            "stage_seconds": stage_seconds}


def label_batches(plans: list[Plan]) -> list[list[Plan]]:
    """``plans`` split into runs of distinct labels (``profile.profile`` keys its stages by plan label)."""
    batches: list[list[Plan]] = []
    for plan in plans:
        for batch in batches:
            if all(p.label != plan.label for p in batch):
                batch.append(plan)
                break
        else:
            batches.append([plan])
    return batches


def dram_bytes(plans: list[Plan], *, ncu: str, seed: int = 0, cache_control: str = "all") -> list[dict | None]:
    """DRAM bytes read and written by every stage of each plan, added up (``profile.profile``'s "all" rows;
    plain build under ncu, one ncu run per batch of distinct plan labels)."""
    from .profile import profile

    out: dict[int, dict] = {}
    for batch in label_batches(plans):
        doc = profile(batch, cache_control=cache_control, seed=seed, ncu=ncu)
        totals = {(r["algorithm"], r["schedule"], r["pass"]): r for r in doc["rows"] if r["stage"] == "all"}
        for plan in batch:
            r = totals.get((plan.algorithm, plan.schedule, plan.direction))
            out[id(plan)] = None if r is None else {k: r[k] for k in ("dram_read_bytes", "dram_write_bytes",
                                                                       "dram_bytes")}
    return [out[id(p)] for p in plans]


# ---------------------------------------------------------------------------------------------
# text

def _gb(x: float | None) -> str:
    return "-" if x is None else f"{x / GB:.2f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def header_text(doc: dict) -> str:
    h = doc["header"]
    pr, spec = h["problem"], h["spec"]
    env = h.get("environment") or {}
    ran = ("measured on " + str(env.get("gpu", "the GPU")) + (" with ncu DRAM counters" if h["dram"] else
                                                              " (no DRAM column: " + h.get("dram_note", "") + ")")
           if h["measured"] else f"predicted columns only ({h.get('reason', 'nothing was run')})")
    return "\n".join([
        f"{h['figure']}: {ran}",
        f"N={pr['N']}  d={pr['d']}  batch={pr['batch']}  heads={pr['heads']}  {pr['dtype']}  "
        f"M={pr['sram']:,} bytes ({h['sram_elements']:,} elements)",
        f"model spec (roofline): {spec['name']}: HBM {spec['hbm_bytes_per_s'] / 1e9:.0f} GB/s, "
        f"{'fp32' if pr['dtype'] == 'float32' else 'tensor'} peak "
        f"{(spec['fp32_flops'] if pr['dtype'] == 'float32' else spec['tensor_flops']) / 1e12:.0f} TFLOP/s",
        f"commit {h.get('commit') or '?'}; {h['units']}",
        *([h["dram_model"]] if h.get("dram_model") else []),
    ])


def render_left(panel: dict) -> str:
    headers = ["row", "GFLOPs", "model GB", "counted GB", "DRAM GB", "model DRAM GB", "ms", "roofline ms",
               "paper GFLOPs", "paper GB", "paper ms"]
    body = [[r["row"], f"{r['gflops']:.1f}", _gb(r["predicted_bytes"]), _gb(r["counted_bytes"]), _gb(r["dram_bytes"]),
             _gb(r.get("model_dram_bytes")), _ms(r["seconds"]), _ms(r["roofline_seconds"]),
             f"{r['paper_a100']['gflops']}", f"{r['paper_a100']['hbm_gb']}", f"{r['paper_a100']['runtime_ms']}"]
            for r in panel["rows"]]
    names = [r["row"] for r in panel["rows"]]
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for t in panel["per_tensor"]:
        cells.setdefault((t["tensor"], t["plan"].rsplit("/", 1)[-1]), {})[t["row"]] = (
            f"{(t['read_bytes'] + t['write_bytes']) / GB:.2f} ({100 * t['share_of_row']:.0f}%)")
    t_headers = ["tensor", "pass", *names]
    t_body = [[tensor, direction, *(row.get(n, "-") for n in names)]
              for (tensor, direction), row in sorted(cells.items(), key=lambda kv: kv[0][1] == "bwd")]
    return "\n".join(["left: GPT-2 medium attention, forward + backward (paper: A100)",
                      text_table(headers, body, set(range(1, len(headers)))), "",
                      "where the bytes go (model: GB read + written per tensor and pass, share of the row):",
                      text_table(t_headers, t_body, set(range(2, len(t_headers)))), "", *panel["notes"]])


def render_middle(panel: dict) -> str:
    headers = ["block", "tiles", "model GB", "counted GB", "DRAM GB", "model DRAM GB", "ms", "TFLOP/s", "counted GB/s",
               "roofline ms", "bound"]

    def rate(num: float | None, sec: float | None, unit: float) -> str:
        return "-" if not num or not sec else f"{num / sec / unit:.1f}"

    body = [[str(p["block"]), ", ".join(f"{k}={v}" for k, v in p["tiles"].items() if k in ("Br", "Bc")),
             _gb(p["predicted_bytes"]), _gb(p["counted_bytes"]), _gb(p["dram_bytes"]), _gb(p.get("model_dram_bytes")),
             _ms(p["seconds"]), rate(p["flops"], p["seconds"], 1e12), rate(p["counted_bytes"], p["seconds"], 1e9),
             _ms(p["roofline_seconds"]), "memory" if p["memory_bound"] else "compute"] for p in panel["points"]]
    lines = [f"middle: flash/{panel['schedule']} forward against the resident block ({panel['knob']}); "
             f"{panel['first_not_fitting']} does not fit M",
             text_table(headers, body, {0, 2, 3, 4, 5, 6, 7, 8, 9})]
    if panel["skipped"]:
        lines.append(f"skipped (do not fit M): {', '.join(map(str, panel['skipped']))}")
    for source, f in panel["fits"].items():
        def s(x):
            return "-" if x is None else f"{x:.2f}"
        lines.append(f"slope of log(ms) against log({source.replace('_bytes', '')} bytes): {s(f['all'])} over all "
                     f"{f['n_all']} points, {s(f['memory_bound'])} over the {f['n_memory_bound']} memory-bound ones, "
                     f"{s(f.get('falling'))} over the {f.get('n_falling', 0)} up to the knee (1: time proportional "
                     "to bytes)")
    lines.append(f"knee (runtime stops falling, {100 * KNEE_TOLERANCE:.0f}%): "
                 f"{panel['knee'] if panel['knee'] is not None else 'not measured or not reached'}; roofline knee "
                 f"(bytes/bandwidth <= FLOPs/peak): {panel['roofline_knee'] or 'beyond the largest block'} "
                 f"at the tensor-core peak, {panel['roofline_knee_cuda_cores'] or 'beyond the largest block'} "
                 "at the fp32 (CUDA-core) peak")
    return "\n".join(lines)


def render_right(panel: dict) -> str:
    headers = ["requested", "density", "GFLOPs", "model GB", "counted GB", "ms", "roofline ms"]
    body = [[f"{p['requested_density']:g}", f"{p['density']:.4f}", f"{p['flops'] / 1e9:.1f}",
             _gb(p["predicted_bytes"]), _gb(p["counted_bytes"]), _ms(p["seconds"]), _ms(p["roofline_seconds"])]
            for p in panel["points"]]
    return "\n".join([f"right: block-sparse flash/{panel['schedule']} forward ({panel['pattern']} blocks of "
                      f"{panel['block_size']}, seed {panel['seed']})",
                      text_table(headers, body, set(range(len(headers))))])


def render(doc: dict) -> str:
    parts = [header_text(doc)]
    for name, fn in (("left", render_left), ("middle", render_middle), ("right", render_right)):
        if name in doc:
            parts.append(fn(doc[name]))
    return "\n\n".join(parts)
