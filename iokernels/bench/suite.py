"""One ``iokernels bench`` run: every implementation on every configuration, ratios to the peers, the
environment, and the rendered tables."""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .clocks import Timing, TooSlow, classify, free_device_memory, time_runner
from .configs import FLOP_CONVENTION, PASSES, Problem
from .implementations import PRIORITY, Impl, TorchSdpa

# ---------------------------------------------------------------------------------------------
# the run

@dataclass
class _History:
    """Per implementation and pass: the last rate (for estimates) and, in the long table, the N at
    which it stopped (out of memory or too slow)."""

    rates: dict[tuple, float] = field(default_factory=dict)
    stopped: dict[tuple, str] = field(default_factory=dict)


def _row(problem: Problem, impl: Impl, direction: str) -> dict:
    return {"table": problem.table, "impl": impl.name, "label": impl.label, "ours": impl.ours, "pass": direction,
            "d": problem.d, "N": problem.n, "dtype": problem.dtype, "batch": problem.batch, "heads": problem.heads,
            "causal": problem.causal, "dropout": problem.dropout, "flops": problem.flops(direction), "status": None,
            "seconds": None,
            "tflops": None, "timed_calls": 0, "method": None, "note": None}


def measure(impl: Impl, problem: Problem, direction: str, timing: Timing, history: _History | None = None,
            warmed: set | None = None) -> dict:
    """One row: status "ok" (seconds, tflops), "oom", "unsupported", "not available", "skipped" or "error"."""
    history = history if history is not None else _History()
    warmed = warmed if warmed is not None else set()
    row = _row(problem, impl, direction)
    key = (problem.table, impl.name, direction, problem.d, problem.dtype, problem.causal)
    reason = impl.unavailable(direction)
    if reason is not None:
        row.update(status="not available", note=reason)
        return row
    if key in history.stopped:
        row.update(status="skipped", note=history.stopped[key])
        return row
    rate = history.rates.get(key)
    if rate:
        estimate = problem.flops(direction) / rate
        if estimate > timing.max_call_seconds:
            row.update(status="skipped", note=f"estimated {estimate * 1e3:.0f} ms per call (from its rate at a "
                                              f"smaller N) > --max-call-ms {timing.max_call_seconds * 1e3:g}")
            if problem.table == "long":
                history.stopped[key] = f"too slow at N={problem.n}"
            return row
    runner = None
    try:
        runner = impl.setup(problem, direction)
        seconds, calls, method = time_runner(runner, timing, cold=impl.name not in warmed)
        row.update(status="ok", seconds=seconds, tflops=problem.flops(direction) / seconds / 1e12,
                   timed_calls=calls, method=method)
        history.rates[key] = problem.flops(direction) / seconds
    except TooSlow as exc:
        row.update(status="skipped", seconds=exc.seconds, timed_calls=1, note=str(exc))
        history.rates[key] = problem.flops(direction) / exc.seconds
        if problem.table == "long":
            history.stopped[key] = f"too slow at N={problem.n}"
    except Exception as exc:
        status, note = classify(exc)
        row.update(status=status, note=note)
        if status == "oom" and problem.table == "long":
            history.stopped[key] = f"out of memory at N={problem.n}"
    finally:
        runner = None  # drop the inputs and outputs before giving the memory back
        warmed.add(impl.name)
        free_device_memory()
    if problem.table == "long" and row["status"] == "oom":
        row["tflops"] = -1.0
    return row


def ratios(rows: list[dict]) -> list[dict]:
    """TFLOP/s of each of our implementations over each peer's, per configuration and pass, where
    both measured."""
    by_config: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            key = (r["table"], r["d"], r["N"], r["dtype"], r["batch"], r["heads"], r["causal"], r["pass"])
            by_config.setdefault(key, {})[r["impl"]] = r
    out = []
    for (table, d, n, dtype, batch, heads, causal, direction), impls in by_config.items():
        for ours in (r for r in impls.values() if r["ours"]):
            for peer in (r for r in impls.values() if not r["ours"]):
                out.append({"table": table, "d": d, "N": n, "dtype": dtype, "batch": batch, "heads": heads,
                            "causal": causal, "pass": direction, "impl": ours["impl"], "peer": peer["impl"],
                            "ratio": ours["tflops"] / peer["tflops"]})
    return out


def summarize(ratio_rows: list[dict]) -> list[dict]:
    """Per (impl, peer, pass) over the main table: the smallest, median and largest ratio."""
    groups: dict[tuple, list[float]] = {}
    for r in ratio_rows:
        if r["table"] == "main":
            groups.setdefault((r["impl"], r["peer"], r["pass"]), []).append(r["ratio"])
    return [{"impl": i, "peer": p, "pass": d, "configs": len(v), "min": min(v), "median": statistics.median(v),
             "max": max(v)} for (i, p, d), v in groups.items()]


def _git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parents[1]
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except Exception:
        pass
    return None


def environment(impls: Sequence[Impl]) -> dict:
    """Device, versions (cupy, CUDA, torch, cuDNN), commit and date."""
    from ..analysis.compare import environment as base

    env = base()
    env["commit"] = _git_commit()
    if any(isinstance(i, TorchSdpa) for i in impls):
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


def run(problems: Sequence[Problem], impls: Sequence[Impl], timing: Timing, *,
        long: Sequence[Problem] = (), backward: bool = True, progress: Callable[[str], None] | None = None,
        header: dict | None = None) -> dict:
    """Measure every implementation on every problem (forward, and backward when asked); the long
    table stops at the first N where nothing is left to run."""
    timing.check()
    directions = PASSES if backward else ("fwd",)
    history, warmed, rows = _History(), set(), []
    started = time.monotonic()

    # measured in order of importance (a spent --time-budget cuts the least important first); shown
    # in the order given
    order = sorted(impls, key=lambda i: PRIORITY.index(i.name) if i.name in PRIORITY else len(PRIORITY))

    def one(problem: Problem) -> list[dict]:
        out = []
        for direction in directions:
            for impl in order:
                if timing.budget_seconds is not None and time.monotonic() - started > timing.budget_seconds:
                    row = _row(problem, impl, direction)
                    row.update(status="skipped", note=f"the run's --time-budget of {timing.budget_seconds:g} s "
                                                      "was spent")
                else:
                    row = measure(impl, problem, direction, timing, history, warmed)
                out.append(row)
                if progress is not None:
                    value = f"{row['tflops']:.1f} TFLOP/s ({row['seconds'] * 1e3:.3f} ms)" \
                        if row["status"] == "ok" else f"{row['status']}: {row['note']}"
                    progress(f"{problem.table} {problem.describe()} {direction} {impl.name}: {value}")
        return out

    for problem in problems:
        rows += one(problem)
    for problem in long:
        got = one(problem)
        rows += got
        if all(r["status"] not in ("ok", "error", "unsupported") for r in got):
            break  # out of memory, too slow or unavailable everywhere: larger N would be too
    ratio_rows = ratios(rows)
    head = {"environment": environment(impls), "flop_convention": FLOP_CONVENTION,
            "warmup": timing.warmup, "repeats": timing.repeats, "max_call_seconds": timing.max_call_seconds,
            "budget_seconds": timing.budget_seconds, "wall_seconds": time.monotonic() - started,
            "backward": backward, "impls": [i.as_dict() for i in impls],
            "timing": ("iokernels research plans: median of `repeats` CUDA-graph replays (each replay k calls, "
                       "divided by k) after `warmup`; others: median of `repeats` calls each timed alone with CUDA "
                       "events after `warmup` calls, behind a GPU spin so host launch latency is hidden; torch "
                       "backward: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)"),
            **(header or {})}
    return {"header": head, "rows": rows, "ratios": ratio_rows, "summary": summarize(ratio_rows)}


# ---------------------------------------------------------------------------------------------
# text

CELL = {"oom": "OOM", "unsupported": "unsup", "not available": "n/a", "skipped": "skip", "error": "err"}


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row["status"] == "ok":
        return f"{row['tflops']:.1f}"
    if row["table"] == "long" and row["status"] == "oom":
        return "-1"
    return CELL.get(row["status"], row["status"])


def _table(head: list[str], body: list[list[str]], left: int) -> list[str]:
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            .rstrip() for r in [head, ["-" * w for w in widths], *body]]


def _labels(doc: dict) -> list[tuple[str, str]]:
    return [(i["name"], i["label"]) for i in doc["header"]["impls"]]


def render(doc: dict) -> str:
    h, env = doc["header"], doc["header"]["environment"]
    torch_part = f"  torch {env['torch']} (CUDA {env.get('torch_cuda')}, cuDNN {env.get('cudnn')})" \
        if env.get("torch") else ""
    lines = [f"device: {env.get('gpu', 'none')}  cupy {env.get('cupy', '-')}  CUDA runtime "
             f"{env.get('cuda_runtime', '-')}  driver {env.get('cuda_driver', '-')}{torch_part}  "
             f"commit {env.get('commit')}  {env.get('date')}",
             f"TFLOP/s, {h['flop_convention']}",
             f"median of {h['repeats']} timed calls after {h['warmup']} warm-ups; a configuration over "
             f"{h['max_call_seconds'] * 1e3:g} ms per call is skipped",
             "cells: n/a = not available, unsup = unsupported, OOM = out of memory, skip = too slow, err = error "
             "(reasons under notes)"]
    labels = _labels(doc)
    main = [r for r in doc["rows"] if r["table"] == "main"]
    index = {(r["table"], r["d"], r["N"], r["dtype"], r["causal"], r["pass"], r["impl"]): r for r in doc["rows"]}
    if main:
        lines += ["", f"B*H*N = {h.get('tokens')}, heads {h.get('heads')}" + (", causal" if h.get("causal") else "")
                  + (f", dropout {h['dropout']:g} (each implementation its own mask)" if h.get("dropout") else "")]
        configs = list(dict.fromkeys((r["d"], r["N"], r["dtype"], r["causal"], r["pass"], r["batch"], r["heads"])
                                     for r in main))
        dtypes = list(dict.fromkeys(r["dtype"] for r in main))
        configs.sort(key=lambda c: (c[0], c[1], dtypes.index(c[2]), PASSES.index(c[4])))
        body = [[str(d), str(n), dtype, str(b), str(hh), p,
                 *(_cell(index.get(("main", d, n, dtype, causal, p, name))) for name, _ in labels)]
                for d, n, dtype, causal, p, b, hh in configs]
        lines += _table(["d", "N", "dtype", "B", "H", "pass", *(lab for _, lab in labels)], body, 6)
    main_ratios = [r for r in doc["ratios"] if r["table"] == "main"]
    if main_ratios:
        peers = [(n, lab) for n, lab in labels if any(r["peer"] == n for r in main_ratios)]
        lines += ["", "ratios: our TFLOP/s / the peer's (same run)"]
        rindex = {(r["d"], r["N"], r["dtype"], r["causal"], r["pass"], r["impl"], r["peer"]): r["ratio"]
                  for r in main_ratios}
        keys = sorted(dict.fromkeys((r["d"], r["N"], r["dtype"], r["causal"], r["pass"], r["impl"])
                                    for r in main_ratios),
                      key=lambda k: (k[0], k[1], dtypes.index(k[2]), PASSES.index(k[4]),
                                     [n for n, _ in labels].index(k[5])))
        body = [[str(d), str(n), dtype, p, dict(labels)[impl],
                 *(f"{rindex[(d, n, dtype, c, p, impl, peer)]:.2f}x" if (d, n, dtype, c, p, impl, peer) in rindex
                   else "-" for peer, _ in peers)] for d, n, dtype, c, p, impl in keys]
        lines += _table(["d", "N", "dtype", "pass", "ours", *(f"/{lab}" for _, lab in peers)], body, 5)
        names = dict(labels)
        lines += ["", "over the main table (smallest / median / largest ratio, configurations measured):"]
        for s in doc["summary"]:
            lines.append(f"  {names.get(s['impl'], s['impl'])} / {names.get(s['peer'], s['peer'])} {s['pass']}: "
                         f"{s['min']:.2f}x / {s['median']:.2f}x / {s['max']:.2f}x ({s['configs']})")
    long_rows = [r for r in doc["rows"] if r["table"] == "long"]
    if long_rows:
        first = long_rows[0]
        lines += ["", f"long sequences: heads {first['heads']}, d {first['d']}, batch {first['batch']}, "
                      f"{first['dtype']}; TFLOP/s, -1 = out of memory"]
        ns = sorted({r["N"] for r in long_rows})
        for p in PASSES:
            if not any(r["pass"] == p for r in long_rows):
                continue
            body = [[str(n), *(_cell(index.get(("long", first["d"], n, first["dtype"], first["causal"], p, name)))
                               for name, _ in labels)] for n in ns]
            lines += ["", f"{p}:", *_table(["N", *(lab for _, lab in labels)], body, 1)]
    notes: dict[tuple[str, str, str], list[str]] = {}
    for r in doc["rows"]:
        if r["status"] != "ok" and r["note"]:
            where = f"{r['table']} d={r['d']} N={r['N']} {r['dtype']} {r['pass']}"
            notes.setdefault((r["impl"], r["status"], r["note"]), []).append(where)
    if notes:
        lines += ["", "notes:"]
        for (impl, status, note), where in notes.items():
            at = ", ".join(where) if len(where) <= 3 else f"{len(where)} configurations, e.g. {where[0]}"
            lines.append(f"  {impl} {status}: {note} [{at}]")
    return "\n".join(lines)
