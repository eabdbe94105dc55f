"""``iokernels bench --overhead``: host microseconds per call, ours beside the peers (torch SDPA first).

Each call is timed on the CPU alone: ``time.perf_counter`` around the call, which only enqueues its
kernels (nothing waits for the GPU inside the timed region); the stream is synchronised every
:data:`iokernels.bench.clocks.OVERHEAD_CHUNK` calls, between timed calls, so that the launch queue never
fills (:func:`iokernels.bench.clocks.host_seconds`). Passes: "fwd" (a forward call) and "fwd+bwd" (a forward
and its backward: torch.autograd.grad for torch tensors, ``iokernels.attention_backward`` for cupy
arrays). The implementations are those of ``iokernels bench`` (:mod:`iokernels.bench.implementations`),
set up the same way; the median and the 90th percentile over ``calls`` calls after ``warmup``."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from . import clocks
from .clocks import free_device_memory
from .configs import Problem
from .implementations import PRIORITY, Impl

PASS_NAMES = {"fwd": "fwd", "fwdbwd": "fwd+bwd"}
METHOD = ("host microseconds per call: time.perf_counter around each call (its enqueue only, no synchronisation "
          "inside the timed region; the stream synchronised every {chunk} calls, between timed calls, so the "
          "launch queue never fills); median and p90 over {calls} calls after {warmup} warm-up calls")


def check(calls: int, warmup: int) -> None:
    if calls < 1:
        raise ValueError(f"--overhead-calls must be >= 1, got {calls}")
    if warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {warmup}")


def measure(impl: Impl, problem: Problem, direction: str, *, calls: int = 200, warmup: int = 20) -> dict:
    """One row: status "ok" (median_us, p90_us) or why not ("not available", "unsupported", "oom", "error")."""
    row = {"impl": impl.name, "label": impl.label, "ours": impl.ours, "pass": PASS_NAMES[direction],
           "d": problem.d, "N": problem.n, "dtype": problem.dtype, "batch": problem.batch, "heads": problem.heads,
           "causal": problem.causal, "dropout": problem.dropout, "status": None, "median_us": None, "p90_us": None,
           "calls": 0, "note": None}
    reason = impl.unavailable("fwd" if direction == "fwd" else "bwd")
    if reason is not None:
        row.update(status="not available", note=reason)
        return row
    runner = None
    try:
        runner = impl.setup(problem, direction)
        times = clocks.host_seconds(runner, calls=calls, warmup=warmup)
        row.update(status="ok", median_us=statistics.median(times) * 1e6, p90_us=clocks.percentile(times, 90) * 1e6,
                   calls=len(times))
    except Exception as exc:
        status, note = clocks.classify(exc)
        row.update(status=status, note=note)
    finally:
        runner = None
        free_device_memory()
    return row


def run(problems: Sequence[Problem], impls: Sequence[Impl], *, calls: int = 200, warmup: int = 20,
        backward: bool = True, progress: Callable[[str], None] | None = None, header: dict | None = None) -> dict:
    """Every implementation on every problem, forward and (``backward``) forward+backward."""
    from .suite import environment

    check(calls, warmup)
    started = time.monotonic()
    order = sorted(impls, key=lambda i: PRIORITY.index(i.name) if i.name in PRIORITY else len(PRIORITY))
    rows = []
    for problem in problems:
        for direction in ("fwd", "fwdbwd") if backward else ("fwd",):
            for impl in order:
                row = measure(impl, problem, direction, calls=calls, warmup=warmup)
                rows.append(row)
                if progress is not None:
                    value = f"median {row['median_us']:.1f} us, p90 {row['p90_us']:.1f} us" \
                        if row["status"] == "ok" else f"{row['status']}: {row['note']}"
                    progress(f"overhead {problem.describe()} {row['pass']} {impl.name}: {value}")
    head = {"environment": environment(impls), "calls": calls, "warmup": warmup, "chunk": clocks.OVERHEAD_CHUNK,
            "method": METHOD.format(chunk=clocks.OVERHEAD_CHUNK, calls=calls, warmup=warmup),
            "impls": [i.as_dict() for i in impls], "wall_seconds": time.monotonic() - started, **(header or {})}
    return {"header": head, "overhead": rows}


def render(doc: dict) -> str:
    from .suite import CELL, note_lines

    h, env = doc["header"], doc["header"]["environment"]
    torch_part = f"  torch {env['torch']}" if env.get("torch") else ""
    lines = [f"device: {env.get('gpu', 'none')}  cupy {env.get('cupy', '-')}{torch_part}  commit {env.get('commit')}"
             f"  {env.get('date')}", h["method"], "cells: median / p90 microseconds; n/a = not available, "
             "unsup = unsupported, OOM = out of memory, err = error (reasons under notes)", ""]
    labels = [(i["name"], i["label"]) for i in h["impls"]]
    index = {(r["d"], r["N"], r["dtype"], r["batch"], r["heads"], r["pass"], r["impl"]): r for r in doc["overhead"]}
    configs = list(dict.fromkeys((r["d"], r["N"], r["dtype"], r["batch"], r["heads"], r["pass"])
                                 for r in doc["overhead"]))
    body = []
    for config in configs:
        cells = []
        for name, _ in labels:
            r = index.get((*config, name))
            cells.append("-" if r is None else f"{r['median_us']:.1f} / {r['p90_us']:.1f}" if r["status"] == "ok"
                         else CELL.get(r["status"], r["status"]))
        body.append([*(str(x) for x in config), *cells])
    head = ["d", "N", "dtype", "B", "H", "pass", *(lab for _, lab in labels)]
    widths = [max(len(x), *(len(b[i]) for b in body)) if body else len(x) for i, x in enumerate(head)]
    lines += ["  ".join(c.ljust(w) if i < 6 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
              .rstrip() for row in [head, ["-" * w for w in widths], *body]]
    lines += note_lines(doc["overhead"], lambda r: f"d={r['d']} N={r['N']} {r['dtype']} {r['pass']}")
    return "\n".join(lines)
