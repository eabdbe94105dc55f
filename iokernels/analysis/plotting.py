"""``sweep --plot``: measured points and model lines on log-log axes (matplotlib, Agg, no display).

matplotlib is optional (``pip install 'iokernels[plot]'``); it is imported only here, and only when
a plot is asked for. One row of panels per pass (fwd, bwd), a bytes panel and, for GPU runs, a
time panel. In the bytes panel markers are measured bytes, solid lines the exact model, dashed lines
the Θ form; ``--vary M`` adds Saha & Ye's square-tiling bound N²d/√M and marks M = d².
"""

from __future__ import annotations

from .sweep import groups

X_LABELS = {"N": "N (sequence length)", "d": "d (head dimension)", "M": "M (shared memory per block, bytes)",
            "block": "resident block size (B_c of kv_outer / bwd, B_r of q_outer / two_pass)",
            "density": "block-mask density (fraction of blocks computed)"}


def require_matplotlib():
    """(Figure, FigureCanvasAgg, NullLocator), or RuntimeError with the install command."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import NullLocator
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib, which is not installed: pip install 'iokernels[plot]'") from exc
    return Figure, FigureCanvasAgg, NullLocator


def _fit_text(doc: dict, name: str, quantity: str) -> str:
    for f in doc.get("fits") or []:
        if f"{f['algorithm']}/{f['schedule']}/{f['pass']}" == name and f["quantity"] == quantity:
            return f" (a={f['exponent']:.2f})"
    return ""


def plot(doc: dict, path: str) -> None:
    """Write the sweep's figure to ``path`` (PNG by its extension, any format matplotlib knows)."""
    Figure, FigureCanvasAgg, NullLocator = require_matplotlib()
    h = doc["header"]
    vary = h["vary"]
    by_plan = groups(doc["points"])
    passes = [p for p in ("fwd", "bwd") if any(k.endswith("/" + p) for k in by_plan)]
    timed = any(pt["seconds"] for pt in doc["points"])
    cols = 2 if timed else 1
    fig = Figure(figsize=(6.4 * cols, 4.6 * len(passes)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(passes), cols, squeeze=False)
    colors = {name: f"C{i}" for i, name in enumerate(by_plan)}
    theta_labelled = set()
    values = sorted({pt["value"] for pt in doc["points"]})
    for row, direction in enumerate(passes):
        ax_b = axes[row][0]
        ax_t = axes[row][1] if timed else None
        for name, pts in by_plan.items():
            if not name.endswith("/" + direction):
                continue
            xs = [p["value"] for p in pts]
            c = colors[name]
            short = name.rsplit("/", 1)[0]
            ax_b.plot(xs, [p["measured_bytes"] for p in pts], "o", color=c,
                      label=f"{short} measured{_fit_text(doc, name, 'bytes')}")
            ax_b.plot(xs, [p["predicted_bytes"] for p in pts], "-", color=c, label=f"{short} model (exact)")
            if vary != "block":  # the Θ form has the paper's tiles, not forced ones: flat against block size
                theta_label = "_nolegend_" if direction in theta_labelled else "dashed: Θ form (paper tiles)"
                theta_labelled.add(direction)
                ax_b.plot(xs, [p["theta_bytes"] for p in pts], "--", color=c, alpha=0.5, lw=1, label=theta_label)
            if ax_t is not None and all(p["seconds"] for p in pts):
                ax_t.plot(xs, [p["seconds"] * 1e3 for p in pts], "o-", color=c,
                          label=f"{short}{_fit_text(doc, name, 'seconds')}")
        if vary == "M":
            first = next((pts for name, pts in by_plan.items() if name.endswith("/" + direction)), [])
            if first:
                ax_b.plot([p["value"] for p in first], [p["square_tiling_bytes"] for p in first], ":", color="k",
                          label="N²d/√M (square tiling, constant 1)")
                d2_bytes = first[0]["d"] ** 2 * first[0]["sram_bytes"] // first[0]["sram_elements"]
                if min(values) / 2 <= d2_bytes <= max(values) * 2:
                    for ax in (ax_b, ax_t):
                        if ax is not None:
                            ax.axvline(d2_bytes, color="grey", lw=0.8)
                    ax_b.annotate("M = d²", (d2_bytes, 0.02), xycoords=("data", "axes fraction"), rotation=90,
                                  color="grey", fontsize=8)
        for ax, ylabel in ((ax_b, "HBM bytes"), (ax_t, "time (ms)")):
            if ax is None:
                continue
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(values)
            ax.set_xticklabels([_tick(vary, v) for v in values], fontsize=8)
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlabel(X_LABELS[vary])
            ax.set_ylabel(ylabel)
            ax.grid(True, which="major", alpha=0.3)
            ax.set_title(f"{direction}: {ylabel}", fontsize=10)
            ax.legend(fontsize=7)
    fixed = [f"N={h['N_q']}" if vary != "N" and h["N_q"] == h["N_k"] else
             f"N_q={h['N_q']}, N_k={h['N_k']}" if vary != "N" else "", f"d={h['d']}" if vary != "d" else "",
             f"M={h['sram_bytes']:,} B" if vary != "M" else ""]
    fig.suptitle(", ".join([f"{h['gpu']} ({h['source']})", h["dtype"], *(f for f in fixed if f),
                            f"batch·heads={h['batch'] * h['heads']}"]), fontsize=10)
    fig.savefig(path, dpi=120)


def _tick(vary: str, v: int) -> str:
    if vary == "M":
        return f"{v / 1024:g}K"
    return f"{v // 1024}k" if vary == "N" and v >= 1024 and v % 1024 == 0 else str(v)
