"""``paper fig2 --plot``: the three panels of Figure 2 in one figure, laid out like the paper's.

left: a table (GFLOPs, HBM GB, runtime) per row, beside the paper's A100 figures; middle: HBM GB as bars
(model, counted, DRAM) and runtime as a line (measured, roofline) against the block size; right: runtime
(measured, roofline) against the fraction of nonzero blocks. matplotlib is imported only here, through
:func:`iokernels.analysis.plotting.require_matplotlib`.
"""

from __future__ import annotations

from .figure2 import GB
from .plotting import require_matplotlib


def _num(x: float | None, scale: float, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x / scale)


def _left(ax, panel: dict) -> None:
    ax.axis("off")
    rows = panel["rows"]
    # standard, the library's flash plans, the paper's schedule (figure2.left_plans)
    short = ("standard", "flash\n(library)", "flash\n(kv_outer)")
    columns = [*short[:len(rows)], "paper A100\nstandard", "paper A100\nflash"]
    paper = [rows[0]["paper_a100"], next(r["paper_a100"] for r in rows[1:])]
    cells = [
        [f"{r['gflops']:.1f}" for r in rows] + [f"{p['gflops']}" for p in paper],
        [_num(r["predicted_bytes"], GB) for r in rows] + [f"{p['hbm_gb']}" for p in paper],
        [_num(r["counted_bytes"], GB) for r in rows] + ["", ""],
        [_num(r["dram_bytes"], GB) for r in rows] + ["", ""],
        [_num(r["seconds"], 1e-3) for r in rows] + [f"{p['runtime_ms']}" for p in paper],
        [_num(r["roofline_seconds"], 1e-3, "{:.2f}") for r in rows] + ["", ""],
    ]
    labels = ["GFLOPs", "HBM GB (model)", "HBM GB (counted)", "DRAM GB (ncu)", "runtime ms", "roofline ms"]
    table = ax.table(cellText=cells, rowLabels=labels, colLabels=columns, loc="center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.scale(1.0, 2.4)
    ax.set_title("GPT-2 medium attention, forward + backward", fontsize=10)


def _middle(ax, panel: dict) -> None:
    pts = panel["points"]
    xs = list(range(len(pts)))
    series = [(k, label) for k, label in (("predicted_bytes", "HBM GB (model)"), ("counted_bytes", "counted"),
                                          ("dram_bytes", "DRAM (ncu)")) if all(p[k] is not None for p in pts)]
    width = 0.8 / max(1, len(series))
    for i, (key, label) in enumerate(series):
        ax.bar([x + (i - (len(series) - 1) / 2) * width for x in xs], [p[key] / GB for p in pts], width,
               label=label, color=f"C{i}", alpha=0.7)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(p["block"]) for p in pts])
    ax.set_xlabel(f"block size ({panel['knob']} of flash/{panel['schedule']})")
    ax.set_ylabel("HBM accesses (GB)")
    twin = ax.twinx()
    if all(p["seconds"] is not None for p in pts):
        twin.plot(xs, [p["seconds"] * 1e3 for p in pts], "ko-", label="runtime (measured)")
    twin.plot(xs, [p["roofline_seconds"] * 1e3 for p in pts], "k--", lw=1, label="roofline")
    twin.set_ylabel("runtime (ms)")
    twin.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=7, loc="upper right")
    fit = panel["fits"].get("dram_bytes") or panel["fits"].get("counted_bytes") or {}
    slopes = [f"{fit[k]:.2f} {what}"
              for k, what in (("falling", "up to the knee"), ("memory_bound", "memory-bound points"))
              if fit.get(k) is not None]
    ax.set_title("flash forward: effect of block size"
                 + (f"\nslope of log time on log bytes: {', '.join(slopes)}" if slopes else ""), fontsize=9)


def _right(ax, panel: dict) -> None:
    pts = panel["points"]
    dens = [p["density"] for p in pts]
    if all(p["seconds"] is not None for p in pts):
        ax.plot(dens, [p["seconds"] * 1e3 for p in pts], "o-", label="runtime (measured)")
    ax.plot(dens, [p["roofline_seconds"] * 1e3 for p in pts], "k--", lw=1, label="roofline (model)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("fraction of nonzero blocks")
    ax.set_ylabel("forward runtime (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax.set_title(f"block-sparse flash/{panel['schedule']} forward", fontsize=10)


def plot(doc: dict, path: str) -> None:
    """Write the figure of a ``paper fig2`` document to ``path`` (format by its extension)."""
    Figure, FigureCanvasAgg, _ = require_matplotlib()
    panels = [(name, fn) for name, fn in (("left", _left), ("middle", _middle), ("right", _right)) if name in doc]
    fig = Figure(figsize=(6.4 * len(panels), 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, fn) in zip(axes, panels, strict=True):
        fn(ax, doc[name])
    h = doc["header"]
    pr = h["problem"]
    where = (h.get("environment") or {}).get("gpu") if h["measured"] else "predicted only"
    fig.suptitle(f"Figure 2 (Dao et al. 2022): {where}; roofline {h['spec']['name']}; N={pr['N']}, d={pr['d']}, "
                 f"batch·heads={pr['batch']}·{pr['heads']}, {pr['dtype']}, M={pr['sram']:,} B", fontsize=10)
    fig.savefig(path, dpi=120)
