"""One ``iokernels bench`` run: every implementation on every configuration, ratios to the peers, the
environment, and the rendered tables."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..kernels.runtime import source_commit
from . import clocks
from .clocks import Timing, TooSlow, free_device_memory
from .configs import BWD_OVER_FWD, FLOP_CONVENTION, PASSES, Problem, computed_elements
from .implementations import PRIORITY, STRONGEST_FROM, Impl

# ---------------------------------------------------------------------------------------------
# the run

@dataclass
class _History:
    """Per implementation and pass: the last rate (for estimates) and, in the long table, the N at
    which it stopped (out of memory or too slow)."""

    rates: dict[tuple, float] = field(default_factory=dict)
    stopped: dict[tuple, str] = field(default_factory=dict)


def _row(problem: Problem, impl: Impl, direction: str, mode: str = "call") -> dict:
    """A row of ``impl`` on ``problem``: its FLOPs those of what it computes (:meth:`Impl.workload`; the block-sparse
    rows' the kept blocks', the dense reference's its dense count), its block mask that problem's (None: dense). Ours
    (not a reference) under a window or documents: also ``computed_flops``, the FLOPs of the tiles its plan computes
    (:func:`iokernels.bench.configs.computed_elements`)."""
    work = impl.workload(problem)
    computed = computed_elements(problem, direction) if impl.ours and not impl.reference else None
    return {"table": problem.table, "impl": impl.name, "label": impl.label, "ours": impl.ours,
            "reference": impl.reference, "pass": direction,
            "mode": mode, "d": problem.d, "N": problem.n, "dtype": problem.dtype, "batch": problem.batch,
            "heads": problem.heads, "causal": problem.causal, "dropout": problem.dropout,
            "window": None if problem.window is None else list(problem.window),
            "documents": None if problem.documents is None else list(problem.documents), "softcap": problem.softcap,
            "alibi": problem.alibi, "attn_mask": problem.attn_mask,
            "block_mask": None if work.block_mask is None else work.block_mask.as_dict(),
            "flops": work.flops(direction),
            "computed_flops": None if computed is None else 4.0 * problem.d * computed
            * (BWD_OVER_FWD if direction == "bwd" else 1.0),
            "status": None, "seconds": None, "tflops": None, "timed_calls": 0, "loop": None, "method": None,
            "note": None}


def _failed(row: dict, exc: BaseException, problem: Problem, key: tuple, history: _History) -> None:
    if isinstance(exc, TooSlow):
        row.update(status="skipped", seconds=exc.seconds, timed_calls=1, note=str(exc))
        history.rates[key] = row["flops"] / exc.seconds
        if problem.table == "long":
            history.stopped[key] = f"too slow at N={problem.n}"
        return
    status, note = clocks.classify(exc)
    row.update(status=status, note=note)
    if status == "oom" and problem.table == "long":
        history.stopped[key] = f"out of memory at N={problem.n}"


@dataclass
class _Pending:
    """An implementation set up for a configuration and pass (:func:`_prepare`): its rows (one per mode, each with a
    status once it failed or was skipped) and the modes ready to time (each Prepared holds the runner)."""

    key: tuple
    rows: list[dict]
    timed: list[tuple[dict, clocks.Prepared]] = field(default_factory=list)


def _prepare(impl: Impl, problem: Problem, direction: str, timing: Timing, history: _History, warmed: set,
             modes: Sequence[str]) -> _Pending:
    """``impl`` on ``problem`` set up once for every mode (:func:`clocks.prepare` each), or its rows' status: "not
    available", "skipped" (stopped at a smaller N, or too slow by estimate or after one call), "oom", "unsupported" or
    "error"."""
    rows = [_row(problem, impl, direction, mode) for mode in modes]
    pending = _Pending((problem.table, impl.name, direction, problem.d, problem.dtype, problem.causal), rows)
    flops = rows[0]["flops"]  # what this implementation computes (Impl.workload)

    def every(**values: object) -> _Pending:
        for r in rows:
            r.update(values)
        return pending

    reason = impl.unavailable(direction)
    if reason is not None:
        return every(status="not available", note=reason)
    if pending.key in history.stopped:
        return every(status="skipped", note=history.stopped[pending.key])
    rate = history.rates.get(pending.key)
    if rate:
        estimate = flops / rate
        if estimate > timing.max_call_seconds:
            if problem.table == "long":
                history.stopped[pending.key] = f"too slow at N={problem.n}"
            return every(status="skipped", note=f"estimated {estimate * 1e3:.0f} ms per call (from its rate at a "
                                                 f"smaller N) > --max-call-ms {timing.max_call_seconds * 1e3:g}")
    pending.timed = clocks.prepare_setup(lambda: impl.setup(problem, direction), impl.name, warmed, timing, rows,
                                         lambda row, exc: _failed(row, exc, problem, pending.key, history))
    return pending


def _measure(group: Sequence[_Pending], problem: Problem, timing: Timing, history: _History) -> list[dict]:
    """Time every prepared mode of ``group`` in turn (:func:`clocks.time_in_turn`), release the runners, and return the
    rows: status "ok" (seconds, tflops) where every sample ran, else the failure's."""
    owner = {id(row): p for p in group for row in p.rows}
    try:
        done = clocks.time_in_turn([t for p in group for t in p.timed], timing.repeats,
                                   lambda row, exc: _failed(row, exc, problem, owner[id(row)].key, history))
        for row in done:
            row["tflops"] = row["flops"] / row["seconds"] / 1e12
            p = owner[id(row)]
            if row is p.rows[0]:  # the first mode's rate estimates the next N's time
                history.rates[p.key] = row["flops"] / row["seconds"]
    finally:
        for p in group:  # drop the inputs, outputs and graphs before giving the memory back
            p.timed = []
        free_device_memory()
    rows = [row for p in group for row in p.rows]
    for row in rows:
        if problem.table == "long" and row["status"] == "oom":
            row["tflops"] = -1.0
    return rows


def measure(impl: Impl, problem: Problem, direction: str, timing: Timing, history: _History | None = None,
            warmed: set | None = None, modes: Sequence[str] = ("call",)) -> list[dict]:
    """One row per mode of ``impl`` alone on ``problem``: status "ok" (seconds, tflops), "oom", "unsupported",
    "not available", "skipped" or "error". One setup serves every mode; the modes' loops are taken in turn."""
    history = history if history is not None else _History()
    warmed = warmed if warmed is not None else set()
    return _measure([_prepare(impl, problem, direction, timing, history, warmed, modes)], problem, timing, history)


def _config(r: dict) -> tuple:
    return (r["table"], r["d"], r["N"], r["dtype"], r["batch"], r["heads"], r["causal"], r["pass"], r["mode"])


def _measured_by_config(rows: list[dict]) -> list[tuple[dict, dict[str, dict]]]:
    """The measured rows by configuration, pass and mode: (where, {impl: row}), ``where`` naming them as a ratio row
    does."""
    by_config: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            by_config.setdefault(_config(r), {})[r["impl"]] = r
    keys = ("table", "d", "N", "dtype", "batch", "heads", "causal", "pass", "mode")
    return [(dict(zip(keys, config, strict=True)), impls) for config, impls in by_config.items()]


def ratios(rows: list[dict]) -> list[dict]:
    """TFLOP/s of each of our implementations over each peer's, per configuration, pass and mode, where both
    measured; and over the strongest peer's there (peer "strongest": the largest TFLOP/s among the torch SDPA
    backends and FlexAttention measured, named under "strongest"). A reference of ours (``reference``: the dense
    fast path of a masked run) is a denominator, as a peer is, never a numerator."""
    out = []
    for where, impls in _measured_by_config(rows):
        strong = [r for r in impls.values() if r["impl"] in STRONGEST_FROM]
        best = max(strong, key=lambda r: r["tflops"]) if strong else None
        for ours in (r for r in impls.values() if r["ours"] and not r.get("reference")):
            if best is not None:
                out.append({**where, "impl": ours["impl"], "peer": "strongest", "strongest": best["impl"],
                            "ratio": ours["tflops"] / best["tflops"]})
            for peer in (r for r in impls.values() if not r["ours"] or r.get("reference")):
                out.append({**where, "impl": ours["impl"], "peer": peer["impl"],
                            "ratio": ours["tflops"] / peer["tflops"]})
    return out


def computed_ratios(rows: list[dict]) -> list[dict]:
    """Per configuration, pass and mode where ours (with ``computed_flops``) and the dense reference both measured:
    ours' TFLOP/s counted on the tiles its plan computes over the dense fast path's own TFLOP/s (issue #22's bar)."""
    out = []
    for where, impls in _measured_by_config(rows):
        refs = [r for r in impls.values() if r.get("reference")]
        for ours in (r for r in impls.values() if r.get("computed_flops") and not r.get("reference")):
            tflops = ours["computed_flops"] / ours["seconds"] / 1e12
            out += [{**where, "impl": ours["impl"], "peer": ref["impl"],
                     "computed_over_visible": ours["computed_flops"] / ours["flops"], "tflops": tflops,
                     "peer_tflops": ref["tflops"], "ratio": tflops / ref["tflops"]} for ref in refs]
    return out


def _computed_lines(doc: dict, names: dict[str, str]) -> list[str]:
    rows = doc.get("computed") or []
    if not rows:
        return []
    body = [[str(r["d"]), str(r["N"]), r["dtype"], r["pass"], r["mode"], names.get(r["impl"], r["impl"]),
             f"{r['computed_over_visible']:.3f}", f"{r['tflops']:.1f}", names.get(r["peer"], r["peer"]),
             f"{r['peer_tflops']:.1f}", f"{r['ratio']:.2f}x"] for r in rows]
    return ["", "on the computed tiles: ours' TFLOP/s counted on every tile its plan computes (whole (query tile, key "
                "tile) pairs with a visible element; 'computed' their elements over the visible ones) over the dense "
                "fast path's own (same run, same mode)",
            *text_table(["d", "N", "dtype", "pass", "mode", "ours", "computed", "TFLOP/s", "dense", "TFLOP/s",
                         "ratio"], body, 6)]


def summarize(ratio_rows: list[dict]) -> list[dict]:
    """Per (impl, peer, pass, mode) over the main table: the smallest, median and largest ratio."""
    groups: dict[tuple, list[float]] = {}
    for r in ratio_rows:
        if r["table"] == "main":
            groups.setdefault((r["impl"], r["peer"], r["pass"], r["mode"]), []).append(r["ratio"])
    return [{"impl": i, "peer": p, "pass": d, "mode": m, "configs": len(v), "min": min(v),
             "median": statistics.median(v), "max": max(v)} for (i, p, d, m), v in groups.items()]


def environment(impls: Sequence[Impl]) -> dict:
    """Device, versions (cupy, CUDA, torch, cuDNN), commit and date."""
    from ..analysis.compare import environment as base

    env = base()
    env["commit"] = source_commit()
    if any("torch" in i.name for i in impls):
        try:
            import torch

            env.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                       cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
            if torch.cuda.is_available():
                env["torch_gpu"] = torch.cuda.get_device_name()
                env.setdefault("gpu", env["torch_gpu"])
        except Exception:
            pass
    return env


TIMING = ("every implementation alike (iokernels.bench.clocks.prepare and interleave): mode call: CUDA events "
          "around `loop` back-to-back calls of its public function (host time included wherever the GPU waits for "
          "it; no CUDA graph, no prebuilt plan; one untimed call enqueued first, as in a loop of calls), divided by "
          "`loop`; mode graph: the same call captured once in a "
          "CUDA graph (torch.cuda.graph for torch callables, cupy stream capture for cupy ones) and `loop` "
          "replays timed the same way. Median of `repeats` loops after `warmup` calls; `loop` per row, "
          "chosen from one call so that a loop lasts about 5 ms; the loops of a configuration's implementations "
          "and modes taken in turn, one of each per round (iokernels.bench.clocks.interleave). torch backward: "
          "torch.autograd.grad(out, (q, k, v), dout, retain_graph=True); forward under torch.no_grad()")


def run(problems: Sequence[Problem], impls: Sequence[Impl], timing: Timing, *,
        long: Sequence[Problem] = (), backward: bool = True, progress: Callable[[str], None] | None = None,
        header: dict | None = None, modes: Sequence[str] = ("call",)) -> dict:
    """Measure every implementation on every problem (forward, and backward when asked) in each mode; the
    long table stops at the first N where nothing is left to run."""
    timing.check()
    for mode in modes:
        if mode not in clocks.MODES:
            raise ValueError(f"mode must be one of {clocks.MODES}, got {mode!r}")
    directions = PASSES if backward else ("fwd",)
    history, warmed, rows = _History(), set(), []
    started = time.monotonic()

    # measured in order of importance (a spent --time-budget cuts the least important first); shown
    # in the order given
    order = sorted(impls, key=lambda i: PRIORITY.index(i.name) if i.name in PRIORITY else len(PRIORITY))

    def one(problem: Problem) -> list[dict]:
        """Every implementation of ``problem`` set up, then timed in turn (a group); one that runs out of memory
        beside the others' inputs is set up again alone, after the group before it is timed and released."""
        out = []
        for direction in directions:
            group: list[_Pending] = []
            for impl in order:
                spent = timing.spent(started)
                if spent:
                    p = _Pending((), [_row(problem, impl, direction, mode) for mode in modes])
                    for row in p.rows:
                        row.update(status="skipped", note=spent)
                else:
                    p = _prepare(impl, problem, direction, timing, history, warmed, modes)
                    if any(r["status"] == "oom" for r in p.rows) and any(q.timed for q in group):
                        out += _measure(group, problem, timing, history)
                        group = []
                        history.stopped.pop(p.key, None)
                        p = _prepare(impl, problem, direction, timing, history, warmed, modes)
                group.append(p)
            got = _measure(group, problem, timing, history)
            out += got
        if progress is not None:
            for row in out:
                value = f"{row['tflops']:.1f} TFLOP/s ({row['seconds'] * 1e3:.3f} ms)" \
                    if row["status"] == "ok" else f"{row['status']}: {row['note']}"
                progress(f"{problem.table} {problem.describe()} {row['pass']} {row['mode']} {row['impl']}: {value}")
        return out

    for problem in problems:
        rows += one(problem)
    for problem in long:
        got = one(problem)
        rows += got
        if all(r["status"] not in ("ok", "error", "unsupported") for r in got):
            break  # out of memory, too slow or unavailable everywhere: larger N would be too
    ratio_rows = ratios(rows)
    head = {"environment": environment(impls), "flop_convention": FLOP_CONVENTION, "modes": list(modes),
            "warmup": timing.warmup, "repeats": timing.repeats, "max_call_seconds": timing.max_call_seconds,
            "budget_seconds": timing.budget_seconds, "wall_seconds": time.monotonic() - started,
            "backward": backward, "impls": [i.as_dict() for i in impls], "timing": TIMING,
            "strongest_from": list(STRONGEST_FROM), **(header or {})}
    return {"header": head, "rows": rows, "ratios": ratio_rows, "summary": summarize(ratio_rows),
            "computed": computed_ratios(rows)}


# ---------------------------------------------------------------------------------------------
# text

CELL = {"oom": "OOM", "unsupported": "unsup", "not available": "n/a", "skipped": "skip", "error": "err"}


def _slopes_text(slopes: Sequence[float]) -> str:
    """The slopes as powers of two, "2^-0.5, 2^-1, ..., 2^-8" (the first two and the last when more than 3)."""
    powers = [f"2^{math.log2(x):.4g}" if x > 0 else "0" for x in slopes]
    return ", ".join(powers if len(powers) <= 3 else [*powers[:2], "...", powers[-1]])


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row["status"] == "ok":
        return f"{row['tflops']:.1f}"
    if row["table"] == "long" and row["status"] == "oom":
        return "-1"
    return CELL.get(row["status"], row["status"])


def text_table(head: list[str], body: list[list[str]], left: int) -> list[str]:
    """A header, a rule and the body as lines of text: the first ``left`` columns left-aligned, the rest right."""
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            .rstrip() for r in [head, ["-" * w for w in widths], *body]]


def _labels(doc: dict) -> list[tuple[str, str]]:
    return [(i["name"], i["label"]) for i in doc["header"]["impls"]]


def _modes(doc: dict) -> list[str]:
    return list(doc["header"].get("modes") or dict.fromkeys(r.get("mode", "call") for r in doc["rows"]) or ["call"])


def _columns(doc: dict) -> list[tuple[str, str, str]]:
    """(impl, mode, header) per column: one per implementation, or with several modes one per
    implementation and mode, side by side."""
    modes = _modes(doc)
    return [(name, mode, label if len(modes) == 1 else f"{label} {mode}") for name, label in _labels(doc)
            for mode in modes]


def _block_sparse_lines(h: dict, main: list[dict], names: dict[str, str]) -> list[str]:
    """bench --block-sparse: the mask, the density it has per N, and which count each column's TFLOP/s uses."""
    sparse = h.get("block_sparse")
    if not sparse:
        return []
    density = {r["N"]: r["block_mask"]["density"] for r in main if r.get("block_mask")}
    dense = [names.get(r["impl"], r["impl"]) for r in main if r.get("reference")]
    counted = [names.get(r["impl"], r["impl"]) for r in main if r.get("block_mask") and r["status"] == "ok"]
    lines = [f"block-sparse: {sparse['pattern']} {sparse['block']}x{sparse['block']} blocks at density "
             f"{sparse['density']:g}" + (f", seed {sparse['seed']}" if sparse["pattern"] == "random" else "")
             + " (kept per N: " + ", ".join(f"{n} {d:.3f}" for n, d in sorted(density.items())) + ")"]
    lines.append("TFLOP/s counted on the kept blocks' visible elements" + (" (causal: on or below the diagonal)"
                                                                            if h.get("causal") else "")
                 + f" for {', '.join(dict.fromkeys(counted)) or 'the block-sparse columns'}"
                 + (f"; on the dense count (4*B*H*N^2*d{', halved' if h.get('causal') else ''}) for "
                    f"{', '.join(dict.fromkeys(dense))}, the dense fast path without the mask" if dense else ""))
    return lines


def _ratio_lines(doc: dict, labels: list[tuple[str, str]], dtypes: list[str]) -> list[str]:
    main_ratios = [r for r in doc["ratios"] if r["table"] == "main"]
    if not main_ratios:
        return []
    names = dict(labels)
    peers = [(n, lab) for n, lab in labels if any(r["peer"] == n for r in main_ratios)]
    lines = ["", "ratios: our TFLOP/s over the strongest peer's (the largest of the torch SDPA backends and "
                 "FlexAttention measured, named under 'strongest') and over each peer's (same run, same mode)"]
    refs = [lab for n, lab in peers if any(r["impl"] == n and r.get("reference") for r in doc["rows"])]
    if refs:
        lines.append(f"/{', /'.join(refs)}: our TFLOP/s (a block mask: on its kept blocks; a window or documents: on "
                     "the visible elements) over the dense fast path's (dense count): rates, not times")
    rindex = {(r["d"], r["N"], r["dtype"], r["causal"], r["pass"], r["mode"], r["impl"], r["peer"]): r
              for r in main_ratios}
    modes = _modes(doc)
    order = [n for n, _ in labels]
    keys = sorted(dict.fromkeys((r["d"], r["N"], r["dtype"], r["causal"], r["pass"], r["mode"], r["impl"])
                                for r in main_ratios),
                  key=lambda k: (k[0], k[1], dtypes.index(k[2]) if k[2] in dtypes else 0, PASSES.index(k[4]),
                                 order.index(k[6]), modes.index(k[5]) if k[5] in modes else 0))
    body = []
    for key in keys:
        best = rindex.get((*key, "strongest"))
        d, n, dtype, _, p, mode, impl = key
        body.append([str(d), str(n), dtype, p, mode, names.get(impl, impl),
                     f"{best['ratio']:.2f}x" if best else "-",
                     names.get(best["strongest"], best["strongest"]) if best else "-",
                     *(f"{rindex[(*key, peer)]['ratio']:.2f}x" if (*key, peer) in rindex else "-"
                       for peer, _ in peers)])
    lines += text_table(["d", "N", "dtype", "pass", "mode", "ours", "/strongest", "strongest",
                     *(f"/{lab}" for _, lab in peers)], body, 6)
    lines += ["", "over the main table (smallest / median / largest ratio, configurations measured):"]
    for s in doc["summary"]:
        peer = "strongest" if s["peer"] == "strongest" else names.get(s["peer"], s["peer"])
        lines.append(f"  {names.get(s['impl'], s['impl'])} / {peer} {s['pass']} {s.get('mode', 'call')}: "
                     f"{s['min']:.2f}x / {s['median']:.2f}x / {s['max']:.2f}x ({s['configs']})")
    return lines


def render(doc: dict) -> str:
    h, env = doc["header"], doc["header"]["environment"]
    torch_part = f"  torch {env['torch']} (CUDA {env.get('torch_cuda')}, cuDNN {env.get('cudnn')})" \
        if env.get("torch") else ""
    modes = _modes(doc)
    lines = [f"device: {env.get('gpu', 'none')}  cupy {env.get('cupy', '-')}  CUDA runtime "
             f"{env.get('cuda_runtime', '-')}  driver {env.get('cuda_driver', '-')}{torch_part}  "
             f"commit {env.get('commit')}  {env.get('date')}",
             f"TFLOP/s, {h['flop_convention']}",
             f"mode{'s' if len(modes) > 1 else ''} {', '.join(modes)}: "
             + "; ".join({"call": "CUDA events around back-to-back calls of each public function, host time "
                                  "included, one untimed call in flight first",
                          "graph": "the same call captured in a CUDA graph, replays timed the same way"}[m]
                         for m in modes)
             + f"; median of {h['repeats']} timed loops after {h['warmup']} warm-ups, the implementations' and modes' "
               "loops taken in turn; a configuration over "
               f"{h['max_call_seconds'] * 1e3:g} ms per call is skipped",
             "cells: n/a = not available, unsup = unsupported, OOM = out of memory, skip = too slow, err = error "
             "(reasons under notes)"]
    labels = _labels(doc)
    columns = _columns(doc)
    main = [r for r in doc["rows"] if r["table"] == "main"]
    index = {(r["table"], r["d"], r["N"], r["dtype"], r["causal"], r["pass"], r.get("mode", "call"), r["impl"]): r
             for r in doc["rows"]}
    dtypes = list(dict.fromkeys(r["dtype"] for r in main))
    if main:
        lines += ["", f"B*H*N = {h.get('tokens')}, heads {h.get('heads')}" + (", causal" if h.get("causal") else "")
                  + (f", dropout {h['dropout']:g} (each implementation its own mask)" if h.get("dropout") else "")
                  + (f", sliding window {tuple(h['window'])} (TFLOP/s on the visible elements)" if h.get("window")
                     else "")
                  + (f", {h['documents']} documents per sequence (N cut into equal lengths, the last taking the "
                     "remainder; TFLOP/s on the visible elements)" if h.get("documents") else "")
                  + (f", softcap {h['softcap']:g} (the logits capped at C tanh(s / C); the tanh not counted in FLOPs)"
                     if h.get("softcap") is not None else "")
                  + (f", ALiBi (the logits minus slope_h |j - i|, slopes {h['alibi']['rule']}: "
                     f"{_slopes_text(h['alibi']['slopes'])}; the bias not counted in FLOPs)" if h.get("alibi") else "")
                  + (f", an explicit {h['attn_mask']} mask per batch and head (B, H, N, N) as attn_mask, the same "
                     "values for every implementation; FLOPs as without" if h.get("attn_mask") else "")]
        lines += _block_sparse_lines(h, main, dict(labels))
        configs = list(dict.fromkeys((r["d"], r["N"], r["dtype"], r["causal"], r["pass"], r["batch"], r["heads"])
                                     for r in main))
        configs.sort(key=lambda c: (c[0], c[1], dtypes.index(c[2]), PASSES.index(c[4])))
        body = [[str(d), str(n), dtype, str(b), str(hh), p,
                 *(_cell(index.get(("main", d, n, dtype, causal, p, mode, name))) for name, mode, _ in columns)]
                for d, n, dtype, causal, p, b, hh in configs]
        lines += text_table(["d", "N", "dtype", "B", "H", "pass", *(head for _, _, head in columns)], body, 6)
    lines += _ratio_lines(doc, labels, dtypes)
    lines += _computed_lines(doc, dict(labels))
    long_rows = [r for r in doc["rows"] if r["table"] == "long"]
    if long_rows:
        first = long_rows[0]
        lines += ["", f"long sequences: heads {first['heads']}, d {first['d']}, batch {first['batch']}, "
                      f"{first['dtype']}; TFLOP/s, -1 = out of memory"]
        ns = sorted({r["N"] for r in long_rows})
        for p in PASSES:
            if not any(r["pass"] == p for r in long_rows):
                continue
            body = [[str(n), *(_cell(index.get(("long", first["d"], n, first["dtype"], first["causal"], p, mode,
                                                name))) for name, mode, _ in columns)] for n in ns]
            lines += ["", f"{p}:", *text_table(["N", *(head for _, _, head in columns)], body, 1)]
    lines += note_lines(doc["rows"], lambda r: f"{r['table']} d={r['d']} N={r['N']} {r['dtype']} {r['pass']} "
                                               f"{r.get('mode', 'call')}")
    return "\n".join(lines)


def note_lines(rows: list[dict], where: Callable[[dict], str]) -> list[str]:
    """The "notes:" block under a table: each reason a row was not measured, once, with where it happened
    (``where(row)``; the first three places, else the count and one example)."""
    notes: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        if r["status"] != "ok" and r["note"]:
            notes.setdefault((r["impl"], r["status"], r["note"]), []).append(where(r))
    lines = ["", "notes:"] if notes else []
    for (impl, status, note), places in notes.items():
        at = ", ".join(places) if len(places) <= 3 else f"{len(places)} configurations, e.g. {places[0]}"
        lines.append(f"  {impl} {status}: {note} [{at}]")
    return lines
