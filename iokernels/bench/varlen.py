"""``iokernels bench --varlen`` (issue #23): a variable-length batch (B sequences of random lengths, packed without
padding), ours beside the ways torch runs it, every implementation timed the one way of :mod:`iokernels.bench.clocks`
(modes "call" and "graph"; a problem's implementations and modes set up, then their loops taken in turn) in the same
run.

The batch: B lengths drawn uniformly from 1 .. ``max_len`` (numpy, seeded), the same for queries and keys, H heads of
d. Implementations, forward (under ``torch.no_grad``) and backward (``torch.autograd.grad`` of an output computed once,
as ``bench``'s suite):

- ``iokernels_varlen`` (ours): ``iokernels.torch.attention_varlen`` on the packed (total, H, d) tensors;
- ``iokernels_padded`` (ours): ``iokernels.torch.attention`` on the batch padded to (B, H, max, d), the dense fast
  path computing every padded row and key;
- ``iokernels_dense`` (ours, a reference of efficiency, not the same problem): ``iokernels.torch.attention`` on B
  sequences of the mean length (rounded to 128), (B, H, mean, d): what the dense fast path reaches on as many tokens;
- ``torch_flash``, ``torch_cudnn`` (padded): ``F.scaled_dot_product_attention`` on the padded batch under one backend,
  without a mask (a key padding mask would only add work: these are torch's lower bounds on the padded batch);
- ``torch_nested`` (torch's own variable-length attention): SDPA on a nested tensor of the jagged layout
  (``torch.nested.nested_tensor_from_jagged`` of the packed rows and int64 offsets), H before the ragged dim.

TFLOP/s counted on the real tokens (``real``): 4·d·H·Σ L_b² (halved when causal; backward 2.5×) over each
implementation's seconds; ``own``: each implementation's own problem (the padded batch's B·max², the mean-length
batch's B·mean²). Ratios: ours (varlen) over each, on real tokens (> 1: ours is faster); and the issue's two: ours
over the padded dense fast path, on real tokens, and over the dense fast path's own TFLOP/s (``iokernels_dense``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..plan.sequences import offsets
from . import clocks
from .clocks import Runner, free_device_memory
from .implementations import (
    TORCH_BACKENDS,
    cupy_reason,
    leaves_runner,
    sdpa_first_call,
    torch_import_reason,
    torch_reason,
)
from .suite import CELL, TIMING, environment, note_lines, text_table

VARLEN_IMPLS = ("iokernels_varlen", "iokernels_padded", "iokernels_dense", "torch_flash", "torch_cudnn",
                "torch_nested")
PASSES = ("fwd", "bwd")
FLOPS = ("4*d*H*sum(L_b^2) FLOPs forward on the real tokens (halved when causal), backward 2.5x; 'own' counts each "
         "implementation's own problem (the padded batch's B*max^2, the mean-length batch's B*mean^2)")


@dataclass(frozen=True)
class VarlenProblem:
    """B sequences of lengths drawn uniformly from 1 .. max_len (seed), H heads of d, dtype, causal."""

    batch: int = 64
    max_len: int = 8192
    heads: int = 16
    d: int = 128
    dtype: str = "float16"
    causal: bool = False
    seed: int = 0

    @property
    def lengths(self) -> list[int]:
        return [int(x) for x in np.random.default_rng(self.seed).integers(1, self.max_len + 1, self.batch)]

    @property
    def longest(self) -> int:
        return max(self.lengths)

    @property
    def mean_len(self) -> int:
        """The mean length rounded to a multiple of 128 (at least 128): the dense reference's N."""
        return max(128, round(sum(self.lengths) / self.batch / 128) * 128)

    def flops(self, direction: str, lengths: Sequence[int] | None = None) -> float:
        f = 4.0 * self.d * self.heads * sum(n * n for n in (self.lengths if lengths is None else lengths))
        f = f / 2 if self.causal else f
        return f * 2.5 if direction == "bwd" else f

    def describe(self) -> str:
        return (f"B={self.batch} L=1..{self.max_len} H={self.heads} d={self.d} {self.dtype}"
                + (" causal" if self.causal else ""))


class VarlenImpl:
    name, label, ours, description = "", "", False, ""
    graph_reason: str | None = None  # why mode "graph" cannot capture the call (None: it can)

    def unavailable(self) -> str | None:
        return torch_import_reason()

    def own_lengths(self, problem: VarlenProblem) -> list[int]:
        """The lengths of the problem this implementation computes (its 'own' FLOPs)."""
        return problem.lengths

    def setup(self, problem: VarlenProblem, direction: str) -> Runner:
        raise NotImplementedError

    def as_dict(self) -> dict:
        return {"name": self.name, "label": self.label, "ours": self.ours, "description": self.description}


def _randn(torch: Any, problem: VarlenProblem, *shape: int) -> tuple[tuple[Any, Any, Any], Any]:
    """(q, k, v) and dout of ``shape``, random normal (one generator seeded with the problem's seed)."""
    gen = torch.Generator(device="cuda").manual_seed(problem.seed)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=getattr(torch, problem.dtype), generator=gen)
                     for _ in range(4))
    return (q, k, v), dout


def _packed(torch: Any, problem: VarlenProblem) -> tuple[tuple[Any, Any, Any], Any, Any]:
    """(q, k, v) and dout (total, H, d), and the offsets (B + 1,) int32 on the device."""
    leaves, dout = _randn(torch, problem, sum(problem.lengths), problem.heads, problem.d)
    cu = torch.from_numpy(offsets(problem.lengths)).to("cuda")
    return leaves, dout, cu


class OursVarlen(VarlenImpl):
    name, label, ours = "iokernels_varlen", "io-varlen", True
    description = ("iokernels.torch.attention_varlen(q, k, v, cu_seqlens, cu_seqlens, max, max) on the packed "
                   "(total, H, d) tensors")

    def unavailable(self) -> str | None:
        return torch_import_reason() or cupy_reason()

    def setup(self, problem: VarlenProblem, direction: str) -> Runner:
        from ..torch import attention_varlen

        def make(torch: Any) -> tuple[tuple[Any, ...], Any, Callable[..., Any]]:
            leaves, dout, cu = _packed(torch, problem)
            longest = problem.longest
            return leaves, dout, lambda q, k, v: attention_varlen(q, k, v, cu, cu, longest, longest,
                                                                  causal=problem.causal)

        return leaves_runner(direction, make)


class OursDense(VarlenImpl):
    """iokernels.torch.attention on (B, H, N, d): the padded batch (``padded``) or B sequences of the mean length."""

    ours = True

    def __init__(self, padded: bool):
        self.padded = padded
        self.name, self.label = ("iokernels_padded", "io-padded") if padded else ("iokernels_dense", "io-dense")
        self.description = ("iokernels.torch.attention(q, k, v) on the batch padded to (B, H, max, d)" if padded else
                            "iokernels.torch.attention(q, k, v) on (B, H, mean length rounded to 128, d): the dense "
                            "fast path on as many tokens (efficiency reference, another problem)")

    def unavailable(self) -> str | None:
        return torch_import_reason() or cupy_reason()

    def own_lengths(self, problem: VarlenProblem) -> list[int]:
        return [problem.longest if self.padded else problem.mean_len] * problem.batch

    def setup(self, problem: VarlenProblem, direction: str) -> Runner:
        from ..torch import attention

        n = self.own_lengths(problem)[0]

        def make(torch: Any) -> tuple[tuple[Any, ...], Any, Callable[..., Any]]:
            leaves, dout = _randn(torch, problem, problem.batch, problem.heads, n, problem.d)
            return leaves, dout, lambda q, k, v: attention(q, k, v, causal=problem.causal)

        return leaves_runner(direction, make)


class TorchPadded(VarlenImpl):
    """torch SDPA on the padded batch under one backend, no mask."""

    def __init__(self, name: str):
        self.name = name
        self.backend, label = TORCH_BACKENDS[name]
        self.label = f"{label}-padded"
        self.description = (f"F.scaled_dot_product_attention(q, k, v, is_causal=causal) on the batch padded to (B, H, "
                            f"max, d), no mask, under sdpa_kernel(SDPBackend.{self.backend})")

    def unavailable(self) -> str | None:
        return torch_reason(self.backend)

    def own_lengths(self, problem: VarlenProblem) -> list[int]:
        return [problem.longest] * problem.batch

    def setup(self, problem: VarlenProblem, direction: str) -> Runner:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        n = problem.longest

        def make(torch: Any) -> tuple[tuple[Any, ...], Any, Callable[..., Any]]:
            leaves, dout = _randn(torch, problem, problem.batch, problem.heads, n, problem.d)
            return leaves, dout, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=problem.causal)

        return leaves_runner(direction, make, context=lambda: sdpa_kernel(getattr(SDPBackend, self.backend)),
                             first=sdpa_first_call)


class TorchNested(VarlenImpl):
    name, label = "torch_nested", "torch-NJT"
    graph_reason = ("SDPA on nested tensors is not capturable: its capture failed (cudaErrorStreamCaptureInvalidated, "
                    "H100, torch 2.11) and left torch's CUDA generator unusable for the rest of the process, so it is "
                    "not attempted")
    description = ("F.scaled_dot_product_attention(q, k, v, is_causal=causal) on nested tensors of the jagged layout "
                   "(torch.nested.nested_tensor_from_jagged(packed, int64 offsets), transposed to (B, H, j, d)), "
                   "torch's own backend choice; the nested views are made inside each call")

    def setup(self, problem: VarlenProblem, direction: str) -> Runner:
        import torch.nn.functional as F

        def make(torch: Any) -> tuple[tuple[Any, ...], Any, Callable[..., Any]]:
            leaves, dout, cu = _packed(torch, problem)
            offsets = cu.to(torch.int64)
            longest = problem.longest

            def attend(q: Any, k: Any, v: Any) -> Any:
                nq, nk, nv = (torch.nested.nested_tensor_from_jagged(x, offsets, max_seqlen=longest).transpose(1, 2)
                              for x in (q, k, v))
                return F.scaled_dot_product_attention(nq, nk, nv, is_causal=problem.causal).transpose(1, 2).values()

            return leaves, dout, attend

        return leaves_runner(direction, make, first=sdpa_first_call)


def make_impls(names: Sequence[str]) -> list[VarlenImpl]:
    made = {"iokernels_varlen": OursVarlen, "iokernels_padded": lambda: OursDense(True),
            "iokernels_dense": lambda: OursDense(False), "torch_nested": TorchNested}
    for name in names:
        if name not in VARLEN_IMPLS:
            raise ValueError(f"unknown --varlen implementation {name!r}: expected some of {', '.join(VARLEN_IMPLS)}")
    return [made[n]() if n in made else TorchPadded(n) for n in names]


def _row(problem: VarlenProblem, impl: VarlenImpl, direction: str, mode: str) -> dict:
    return {"impl": impl.name, "label": impl.label, "ours": impl.ours, "pass": direction, "mode": mode,
            "batch": problem.batch, "max_len": problem.max_len, "heads": problem.heads, "d": problem.d,
            "dtype": problem.dtype, "causal": problem.causal, "seed": problem.seed, "status": None, "seconds": None,
            "tflops_real": None, "tflops_own": None, "timed_calls": 0, "loop": None, "method": None, "note": None}


def _failed(row: dict, exc: BaseException) -> None:
    row.update(zip(("status", "note"), clocks.classify(exc), strict=True))


def _prepare(impl: VarlenImpl, problem: VarlenProblem, direction: str, timing: clocks.Timing,
             modes: Sequence[str], warmed: set) -> tuple[list[dict], list[tuple[dict, clocks.Prepared]]]:
    """``impl`` set up once for every mode (its rows and the modes ready to time), or its rows' status."""
    rows = [_row(problem, impl, direction, mode) for mode in modes]
    reason = impl.unavailable()
    if reason is not None:
        for row in rows:
            row.update(status="not available", note=reason)
        return rows, []
    for row in rows:
        if row["mode"] == "graph" and impl.graph_reason is not None:
            row.update(status="unsupported", note=impl.graph_reason)
    return rows, clocks.prepare_setup(lambda: impl.setup(problem, direction), impl.name, warmed, timing, rows, _failed)


def _time(problem: VarlenProblem, direction: str, group: list[tuple[VarlenImpl, list[tuple[dict, clocks.Prepared]]]],
          timing: clocks.Timing) -> None:
    """Every prepared mode of a problem's implementations timed in turn (:func:`clocks.time_in_turn`), with their
    TFLOP/s on the real tokens and on each implementation's own."""
    impl_of = {id(row): impl for impl, ready in group for row, _ in ready}
    for row in clocks.time_in_turn([t for _, ready in group for t in ready], timing.repeats, _failed):
        own = impl_of[id(row)].own_lengths(problem)
        row.update(tflops_real=problem.flops(direction) / row["seconds"] / 1e12,
                   tflops_own=problem.flops(direction, own) / row["seconds"] / 1e12)


def measure(impl: VarlenImpl, problem: VarlenProblem, direction: str, timing: clocks.Timing,
            modes: Sequence[str], warmed: set) -> list[dict]:
    """One row per mode of ``impl`` alone; the modes' loops taken in turn."""
    rows, ready = _prepare(impl, problem, direction, timing, modes, warmed)
    try:
        _time(problem, direction, [(impl, ready)], timing)
    finally:
        del ready
        free_device_memory()
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    """Per problem, pass and mode: ours (varlen) over each other implementation on the real tokens (its time over
    ours), and over the dense fast path's own TFLOP/s (``iokernels_dense``)."""
    key = ("batch", "max_len", "heads", "d", "dtype", "causal", "seed", "pass", "mode")
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            groups.setdefault(tuple(r[k] for k in key), {})[r["impl"]] = r
    out = []
    for k, impls in groups.items():
        ours = impls.get("iokernels_varlen")
        if ours is None:
            continue
        entry = {**dict(zip(key, k, strict=True)),
                 "over": {n: r["seconds"] / ours["seconds"] for n, r in impls.items() if n != "iokernels_varlen"}}
        dense = impls.get("iokernels_dense")
        entry["efficiency"] = None if dense is None else ours["tflops_real"] / dense["tflops_own"]
        out.append(entry)
    return out


def run(problems: Sequence[VarlenProblem], impls: Sequence[VarlenImpl], timing: clocks.Timing, *,
        modes: Sequence[str] = ("call", "graph"), passes: Sequence[str] = PASSES,
        progress: Callable[[str], None] | None = None, header: dict | None = None) -> dict:
    timing.check()
    started = time.monotonic()
    rows: list[dict] = []
    warmed: set = set()
    for problem in problems:
        for direction in passes:  # every implementation set up, then their loops taken in turn
            got: list[dict] = []
            group: list[tuple[VarlenImpl, list[tuple[dict, clocks.Prepared]]]] = []
            try:
                for impl in impls:
                    spent = timing.spent(started)
                    if spent:
                        skipped = [_row(problem, impl, direction, m) for m in modes]
                        for r in skipped:
                            r.update(status="skipped", note=spent)
                        got += skipped
                        continue
                    impl_rows, ready = _prepare(impl, problem, direction, timing, modes, warmed)
                    if any(r["status"] == "oom" for r in impl_rows) and group:  # beside the others' inputs: time
                        _time(problem, direction, group, timing)                # and release them, then again alone
                        group = []
                        free_device_memory()
                        impl_rows, ready = _prepare(impl, problem, direction, timing, modes, warmed)
                    got += impl_rows
                    group.append((impl, ready))
                _time(problem, direction, group, timing)
            finally:
                group = []
                free_device_memory()
            rows += got
            for r in got if progress else ():
                value = (f"{r['tflops_real']:.1f} TFLOP/s real ({r['seconds'] * 1e3:.3f} ms)"
                         if r["status"] == "ok" else f"{r['status']}: {r['note']}")
                progress(f"varlen {problem.describe()} {direction} {r['mode']} {r['impl']}: {value}")
    head = {"environment": environment(impls), "table": "varlen", "modes": list(modes), "passes": list(passes),
            "warmup": timing.warmup, "repeats": timing.repeats, "max_call_seconds": timing.max_call_seconds,
            "budget_seconds": timing.budget_seconds, "wall_seconds": time.monotonic() - started,
            "impls": [i.as_dict() for i in impls], "timing": TIMING, "flops": FLOPS,
            "problems": [{"describe": p.describe(), "lengths": p.lengths, "total": sum(p.lengths),
                          "longest": p.longest, "mean_len": p.mean_len} for p in problems], **(header or {})}
    return {"header": head, "rows": rows, "ratios": ratios(rows)}


def render(doc: dict) -> str:
    h, env = doc["header"], doc["header"]["environment"]
    lines = [f"device: {env.get('gpu', 'none')}  cupy {env.get('cupy', '-')}  torch {env.get('torch', '-')} (cuDNN "
             f"{env.get('cudnn')})  commit {env.get('commit')}  {env.get('date')}",
             "variable-length attention (issue #23): B sequences of lengths uniform in 1..max, packed; TFLOP/s: "
             + FLOPS,
             "modes: call = CUDA events around back-to-back calls of each public function (host time included); graph"
             f" = the call captured in a CUDA graph, replays timed the same way; median of {h['repeats']} loops after "
             f"{h['warmup']} warm-ups",
             "x = the implementation's median time over ours (io-varlen), same problem, pass and mode (> 1: ours is "
             "faster); eff = ours' TFLOP/s on real tokens over io-dense's own",
             "cells: " + ", ".join(f"{v} = {k}" for k, v in CELL.items())]
    for p in h["problems"]:
        lines.append(f"problem {p['describe']}: total {p['total']} tokens, longest {p['longest']}, mean length "
                     f"(io-dense) {p['mean_len']}")
    impls = [(i["name"], i["label"]) for i in h["impls"]]
    index = {(r["pass"], r["mode"], r["causal"], r["d"], r["impl"]): r for r in doc["rows"]}
    rindex = {(r["pass"], r["mode"], r["causal"], r["d"]): r for r in doc["ratios"]}
    cases = list(dict.fromkeys((r["pass"], r["mode"], r["causal"], r["d"]) for r in doc["rows"]))
    head = ["pass", "mode", "d", "causal"]
    for name, label in impls:
        head += [f"{label} real", *(["own"] if name in ("iokernels_padded", "iokernels_dense") else []),
                 *(["x"] if name != "iokernels_varlen" else [])]
    head.append("eff")
    body = []
    for case in cases:
        cells = [case[0], case[1], str(case[3]), "yes" if case[2] else "no"]
        ratio = rindex.get(case)
        for name, _ in impls:
            r = index.get((*case, name))
            ok = r is not None and r["status"] == "ok"
            cells.append(f"{r['tflops_real']:.1f}" if ok else CELL.get(r["status"], r["status"]) if r else "-")
            if name in ("iokernels_padded", "iokernels_dense"):
                cells.append(f"{r['tflops_own']:.1f}" if ok else "-")
            if name != "iokernels_varlen":
                x = ratio["over"].get(name) if ratio else None
                cells.append("-" if x is None or name == "iokernels_dense" else f"{x:.2f}x")
        eff = ratio["efficiency"] if ratio else None
        cells.append("-" if eff is None else f"{eff:.2f}")
        body.append(cells)
    lines += ["", *text_table(head, body, 4)]
    lines += note_lines(doc["rows"], lambda r: f"{r['pass']} {r['mode']} d={r['d']} causal={r['causal']}")
    return "\n".join(lines)
