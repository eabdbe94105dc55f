"""``iokernels bench``: attention throughput of iokernels beside its peers, in one run on one GPU (issue #5).

Implementations (``--impls`` picks ours, ``--peers`` the others):

- ``iokernels_fast``: the tensor-core path of issue #5 from ``iokernels.fast``: its library calls
  ``attention_forward`` / ``attention_backward`` when they exist (contract below), else its plans
  (``make_fast_plan`` forward; ``make_fast_backward_plan``, or ``make_fast_plan(direction="bwd")``,
  backward) through the plan launcher. A pass with neither is "not available", with the reason.
- ``iokernels_flash``: the research plans, flash ``q_outer`` forward and flash ``kv_outer`` backward;
  ``iokernels_standard``: standard forward and backward (paper Algorithms 0 and 3);
  ``iokernels_flash_kv_outer`` (only when asked): Algorithm 1 literally, forward only, slow.
  Plain build, M = ``--sram`` (default the library's 96 KB, capped at the device's per-block limit).
- ``cupy_standard``: standard attention from cupy: ``cupy.matmul`` (cuBLAS) in the input dtype for
  QKᵀ, PV and the backward's products; softmax, D = rowsum(dO∘O) and dS in float32 cupy element-wise
  and reduction kernels. The backward starts from P and O stored by a forward run. cupy has no
  bfloat16 dtype, so bfloat16 is reported as unsupported (not computed as float16).
- ``torch_flash``, ``torch_cudnn``, ``torch_efficient``, ``torch_math``: ``F.scaled_dot_product_attention``
  inside ``torch.nn.attention.sdpa_kernel(SDPBackend.X)``, one backend forced at a time. A backend that
  refuses a configuration is "unsupported" with torch's own reasons. Layout (B, H, N, d), contiguous.

Work counted (FlashAttention-2 convention): forward 4·B·H·N_q·N_k·d FLOPs, halved when causal;
backward 2.5× forward. Shapes: B·H·N = ``--tokens`` with H = ``--heads`` (16), B = tokens / (N·H).
The long-sequence table (``--long``): H = 48, d = 64, B = 1, N from 512 doubling to ``--long-max-n``.

Timing: every configuration first runs one timed call. If it takes more than ``--max-call-ms``, or a
call is estimated to (from the same implementation's rate at a smaller N), the configuration is
"skipped" and says why. Otherwise, after ``--warmup`` calls, ``--repeats`` timed calls follow and
the median is reported:

- plans (iokernels research, and the fast path's) enqueue kernels without allocating, so they are timed as CUDA-graph
  replays (:func:`iokernels.gpu.graph_seconds`; one replay runs the plan k times, k chosen so that a
  replay lasts about 2 ms, and is divided by k);
- library calls (the fast path's), cupy and torch allocate their outputs, so each call is timed alone with CUDA events
  (cupy's or torch's) on the library's current stream. Before each timed call a spin kernel keeps the
  GPU busy for about half a millisecond (``torch.cuda._sleep`` for torch, a ``clock64`` loop for cupy)
  so that the host has enqueued the call before the start event fires: host launch latency is not
  counted. torch's backward is ``torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)`` on
  an ``out`` computed once, outside the timed calls; its forward runs under ``torch.no_grad()`` on
  inputs that do not require grad.

Out of memory (cupy's or torch's OutOfMemoryError, or "out of memory" in a CUDA error) is "oom"
and the run goes on; the device memory of cupy's pool and torch's caching allocator is released
after every measurement. In the long table a configuration that ran out of memory shows -1, and
the same implementation and pass is not tried at larger N.

Fast-path library contract (q, k, v, o, do: cupy arrays (B, H, N, d), float16, or bfloat16 as uint16 bits
with ``dtype="bfloat16"`` passed; ``causal=True`` passed only for causal runs):
``iokernels.fast.attention_forward(q, k, v) -> o or (o, lse)`` and
``iokernels.fast.attention_backward(q, k, v, o, do, lse) -> (dq, dk, dv)``.
A ValueError, TypeError or NotImplementedError from them reads as "unsupported".
"""

from __future__ import annotations

import functools
import gc
import importlib
import inspect
import math
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from .plan import check_problem
from .units import check_dtype, parse_size

PASSES = ("fwd", "bwd")
BWD_OVER_FWD = 2.5
DEFAULT_TOKENS = 262144
DEFAULT_HEADS = 16
LONG_HEADS, LONG_D, LONG_BATCH, LONG_N_START, LONG_N_MAX = 48, 64, 1, 512, 131072
SPIN_CYCLES = 1_000_000  # about half a millisecond of GPU time before each event-timed call
FLOP_CONVENTION = ("FlashAttention-2: forward 4*B*H*N_q*N_k*d FLOPs, halved when causal; backward 2.5x forward; "
                   "TFLOP/s = FLOPs / median seconds / 1e12")


# ---------------------------------------------------------------------------------------------
# work and configurations

def attention_flops(batch: int, heads: int, n_q: int, n_k: int, d: int, *, causal: bool = False,
                    direction: str = "fwd") -> float:
    """FLOPs of one attention call by the FlashAttention-2 convention."""
    if direction not in PASSES:
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    flops = 4.0 * batch * heads * n_q * n_k * d
    if causal:
        flops /= 2
    return flops * (BWD_OVER_FWD if direction == "bwd" else 1.0)


@dataclass(frozen=True)
class Problem:
    batch: int
    heads: int
    n: int
    d: int
    dtype: str
    causal: bool = False
    table: str = "main"
    dropout: float = 0.0  # dropout probability on P (every implementation draws its own mask)

    @property
    def bh(self) -> int:
        return self.batch * self.heads

    def flops(self, direction: str) -> float:
        return attention_flops(self.batch, self.heads, self.n, self.n, self.d, causal=self.causal,
                               direction=direction)

    def describe(self) -> str:
        return (f"d={self.d} N={self.n} {self.dtype} B={self.batch} H={self.heads}" + (" causal" if self.causal else "")
                + (f" dropout={self.dropout:g}" if self.dropout else ""))

    def dropout_plan_arg(self) -> Any:
        """make_plan's dropout argument: None, or a fixed Dropout of seed 0 (timing does not depend on it)."""
        from .dropout import Dropout

        return Dropout(self.dropout, 0) if self.dropout else None


def parse_ints(option: str, text: str) -> list[int]:
    """``"64,128"`` -> [64, 128]; ValueError naming the option on anything else."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError(f"{option}: give at least one value")
    out = []
    for x in items:
        try:
            value = int(x)
        except ValueError:
            raise ValueError(f"{option}: {x!r} is not an integer") from None
        if value < 1:
            raise ValueError(f"{option}: values must be >= 1, got {value}")
        out.append(value)
    return list(dict.fromkeys(out))


def parse_dtypes(text: str) -> list[str]:
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError("--dtype: give at least one dtype")
    return list(dict.fromkeys(check_dtype(x) for x in items))


def main_problems(ds: Sequence[int], ns: Sequence[int], dtypes: Sequence[str], *, tokens: int = DEFAULT_TOKENS,
                  heads: int = DEFAULT_HEADS, causal: bool = False, dropout: float = 0.0) -> list[Problem]:
    """One problem per (d, dtype, N), N ascending within each (d, dtype), with B·H·N = tokens."""
    if tokens < 1 or heads < 1:
        raise ValueError(f"--tokens and --heads must be >= 1, got {tokens}, {heads}")
    problems = []
    for d in ds:
        for dtype in dtypes:
            for n in sorted(ns):
                if tokens % (n * heads):
                    raise ValueError(f"--tokens {tokens} is not a multiple of N*heads = {n}*{heads} = {n * heads}; "
                                     "choose --tokens, --N or --heads so that batch = tokens/(N*heads) is whole")
                batch = tokens // (n * heads)
                check_problem(n, n, d, dtype, batch, heads)
                problems.append(Problem(batch, heads, n, d, check_dtype(dtype), causal, dropout=dropout))
    return problems


def long_problems(*, n_max: int = LONG_N_MAX, dtype: str = "float16", n_start: int = LONG_N_START,
                  heads: int = LONG_HEADS, d: int = LONG_D, batch: int = LONG_BATCH,
                  causal: bool = False, dropout: float = 0.0) -> list[Problem]:
    """The long-sequence table: N = n_start, 2·n_start, ... up to n_max."""
    if n_max < n_start:
        raise ValueError(f"--long-max-n must be >= {n_start}, got {n_max}")
    out, n = [], n_start
    while n <= n_max:
        check_problem(n, n, d, dtype, batch, heads)
        out.append(Problem(batch, heads, n, d, check_dtype(dtype), causal, table="long", dropout=dropout))
        n *= 2
    return out


# ---------------------------------------------------------------------------------------------
# outcomes

class Unsupported(Exception):
    """This implementation does not run this configuration; the message says why."""


class TooSlow(Exception):
    def __init__(self, seconds: float, limit: float):
        self.seconds = seconds
        super().__init__(f"one call took {seconds * 1e3:.1f} ms > --max-call-ms {limit * 1e3:g}")


def is_oom(exc: BaseException) -> bool:
    """cupy's and torch's OutOfMemoryError (matched by class name, so neither is imported), or a CUDA
    or cuBLAS allocation failure."""
    if any(c.__name__ == "OutOfMemoryError" for c in type(exc).__mro__):
        return True
    msg = str(exc).lower()
    return any(s in msg for s in ("out of memory", "alloc_failed", "cudaerrormemoryallocation"))


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _no_kernel(exc: BaseException) -> bool:
    """torch's refusal when the forced SDPA backend does not take the inputs (CUDA: "No available
    kernel. Aborting execution."; CPU: "No viable backend ...")."""
    msg = str(exc).lower()
    return "no available kernel" in msg or "no viable backend" in msg


def classify(exc: BaseException) -> tuple[str, str]:
    """(status, note) for an exception raised while measuring."""
    if isinstance(exc, Unsupported):
        return "unsupported", _one_line(str(exc))
    text = _one_line(f"{type(exc).__name__}: {exc}")
    if is_oom(exc):
        return "oom", text
    msg = str(exc).lower()
    if isinstance(exc, (NotImplementedError, ValueError, TypeError)) or _no_kernel(exc) \
            or "not supported" in msg or "not_supported" in msg or "no execution plan" in msg:
        return "unsupported", text
    return "error", text


# ---------------------------------------------------------------------------------------------
# clocks: one timed call between two GPU events, with the host's launch hidden behind a spin

_SPIN_SOURCE = r"""
extern "C" __global__ void iok_spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


@cache
def _cupy_spin_kernel(device_id: int) -> Any:
    import cupy as cp

    with cp.cuda.Device(device_id):
        return cp.RawKernel(_SPIN_SOURCE, "iok_spin")


class CupyClock:
    name = "cuda-events"

    def __init__(self) -> None:
        from ._cupy import require_cupy

        self.cp = require_cupy()
        self.spin = _cupy_spin_kernel(self.cp.cuda.Device().id)

    def time_one(self, fn: Callable[[], Any]) -> float:
        cp = self.cp
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        self.spin((1,), (1,), (cp.int64(SPIN_CYCLES),))
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) / 1e3


class TorchClock:
    name = "cuda-events"

    def __init__(self, torch: Any):
        self.torch = torch
        self.sleep = getattr(torch.cuda, "_sleep", None)

    def time_one(self, fn: Callable[[], Any]) -> float:
        torch = self.torch
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if self.sleep is not None:
            self.sleep(SPIN_CYCLES)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1e3


@dataclass
class Runner:
    """One implementation set up for one configuration and pass: ``call`` runs it once (it may
    allocate); ``launch``, when given, only enqueues kernels and is timed as CUDA-graph replays."""

    call: Callable[[], Any]
    clock: Any
    launch: Callable[[], None] | None = None


@dataclass(frozen=True)
class Timing:
    """Calls per measurement, the per-call limit, and an optional budget for the whole run (once it is
    spent, the remaining measurements are "skipped", so the run still ends with its document)."""

    warmup: int = 3
    repeats: int = 20
    max_call_seconds: float = 2.0
    budget_seconds: float | None = None

    def check(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        if self.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {self.repeats}")
        if not self.max_call_seconds > 0:
            raise ValueError(f"--max-call-ms must be > 0, got {self.max_call_seconds * 1e3:g}")
        if self.budget_seconds is not None and not self.budget_seconds > 0:
            raise ValueError(f"--time-budget must be > 0 seconds, got {self.budget_seconds:g}")


def time_runner(runner: Runner, timing: Timing, *, cold: bool = False) -> tuple[float, int, str]:
    """(median seconds per call, timed calls, method). Raises TooSlow after one call over the limit
    (``cold``: the first call of an implementation may compile, so a slow one is retried once)."""
    once = runner.clock.time_one(runner.call)
    if once > timing.max_call_seconds and cold:
        once = runner.clock.time_one(runner.call)
    if once > timing.max_call_seconds:
        raise TooSlow(once, timing.max_call_seconds)
    if runner.launch is not None:
        from . import gpu

        return gpu.graph_seconds(runner.launch, warmup=timing.warmup, repeats=timing.repeats), \
            timing.repeats, "cuda-graph"
    for _ in range(timing.warmup):
        runner.call()
    times = [runner.clock.time_one(runner.call) for _ in range(timing.repeats)]
    return statistics.median(times), timing.repeats, runner.clock.name


def free_device_memory() -> None:
    """Give cached device memory back (cupy's pool, torch's caching allocator), so the next
    implementation starts from an empty device."""
    gc.collect()
    cp = sys.modules.get("cupy")
    if cp is not None:
        try:
            cp.cuda.Stream.null.synchronize()
            cp.get_default_memory_pool().free_all_blocks()
        except Exception:
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------
# implementations

class Impl:
    """An implementation: ``unavailable`` says why it cannot run at all (None when it can);
    ``setup`` prepares one configuration and pass (raising Unsupported, or OOM)."""

    name: str = ""
    label: str = ""
    ours: bool = False
    description: str = ""
    timing_method: str = "cuda-events"

    def unavailable(self, direction: str) -> str | None:
        return None

    def setup(self, problem: Problem, direction: str) -> Runner:
        raise NotImplementedError

    def as_dict(self) -> dict:
        return {"name": self.name, "label": self.label, "ours": self.ours, "description": self.description,
                "timing": self.timing_method,
                "unavailable": {p: self.unavailable(p) for p in PASSES}}


def _cupy_reason() -> str | None:
    try:
        from ._cupy import require_cupy

        require_cupy()
    except RuntimeError as exc:
        return str(exc)
    return None


def _random(cp: Any, shape: tuple[int, ...], seed: int) -> Any:
    return cp.random.RandomState(seed).standard_normal(shape, dtype=cp.float32)


def plan_runner(plan: Any, problem: Problem) -> Runner:
    """A plan (research or fast) with random inputs, ready for CUDA-graph replays of the plain build.

    Q, K, V, dO and O are random normal; a flash backward's lse is log N + 1/2 (about the true
    logsumexp of random unit rows, so exp(S - lse) stays in range); a standard backward's P comes from
    one run of the standard forward plan.
    """
    from . import gpu, reference
    from .plan import make_plan

    cp = gpu.require_cupy()
    needed = set(gpu.plan_tensors(plan))
    make_p = "P" in needed and plan.algorithm == "standard"
    inputs: dict[str, Any] = {}
    names = ("Q", "K", "V", "dO", "O") if plan.direction == "bwd" else ("Q", "K", "V")  # not the outputs
    for i, name in enumerate(names):
        if name in needed or (make_p and name in ("Q", "K", "V")):
            inputs[name] = gpu.to_device(_random(cp, gpu.tensor_shape(plan, name), i), plan.dtype)
    if "lse" in needed and plan.direction == "bwd":
        inputs["lse"] = cp.full(gpu.tensor_shape(plan, "lse"), math.log(plan.N_k) + 0.5, dtype=cp.float32)
    if make_p:
        fwd = make_plan("standard", N_q=plan.N_q, N_k=plan.N_k, d=plan.d, dtype=plan.dtype, sram=plan.sram_bytes,
                        batch=plan.batch, heads=plan.heads, causal=plan.causal)
        inputs["P"] = gpu.run_plan(fwd, {n: inputs[n] for n in ("Q", "K", "V")}).buffers["P"]
    buffers, _ = gpu.allocate(plan, {n: x for n, x in inputs.items() if n in needed})
    del inputs
    gpu.compile_plan(plan)
    scale = reference.default_scale(problem.d)

    def launch() -> None:
        for stage in plan.stages:
            gpu.launch_stage(plan, stage, buffers, scale, False)

    return Runner(call=launch, clock=CupyClock(), launch=launch)


class ResearchPlan(Impl):
    """iokernels research kernels through the plan launcher (plain build), one plan per pass."""

    ours = True
    timing_method = "cuda-graph"

    def __init__(self, name: str, label: str, schedules: dict[str, tuple[str, str]], sram: int | None = None):
        self.name, self.label, self.schedules, self.sram = name, label, schedules, sram
        self.description = "iokernels research plans (CUDA cores; tensor cores for standard's half products): " + \
            ", ".join(f"{d} {a}/{s}" for d, (a, s) in schedules.items())

    def unavailable(self, direction: str) -> str | None:
        if direction not in self.schedules:
            return f"no {direction} plan (the {direction} of this schedule is another implementation's)"
        return _cupy_reason()

    def sram_bytes(self) -> tuple[int, int | None]:
        from .api import DEFAULT_SRAM
        from .specs import current_device_spec

        spec = current_device_spec()
        limit = spec.smem_per_block_bytes if spec and spec.smem_per_block_bytes else None
        sram = self.sram if self.sram is not None else (min(DEFAULT_SRAM, limit) if limit else DEFAULT_SRAM)
        return sram, limit

    def as_dict(self) -> dict:
        return {**super().as_dict(), "sram_bytes": self.sram_bytes()[0]}

    def setup(self, problem: Problem, direction: str) -> Runner:
        from .plan import make_plan

        algorithm, schedule = self.schedules[direction]
        sram, limit = self.sram_bytes()
        try:
            plan = make_plan(algorithm, schedule, direction=direction, N_q=problem.n, N_k=problem.n, d=problem.d,
                             dtype=problem.dtype, sram=sram, batch=problem.batch, heads=problem.heads,
                             smem_limit=limit, causal=problem.causal, dropout=problem.dropout_plan_arg())
        except ValueError as exc:
            raise Unsupported(str(exc)) from exc
        return plan_runner(plan, problem)


class FastPath(Impl):
    """The issue #5 tensor-core path, found in ``iokernels.fast`` (see the module docstring): library
    calls ``attention_forward`` / ``attention_backward`` when they exist (CUDA events per call), else
    its plans, ``make_fast_plan`` (forward) and ``make_fast_backward_plan`` or ``make_fast_plan(...,
    direction="bwd")`` (backward), through the plan launcher (CUDA-graph replays)."""

    name, label, ours = "iokernels_fast", "fast", True
    MODULE = "iokernels.fast"
    FUNCTIONS: ClassVar[dict[str, str]] = {"fwd": "attention_forward", "bwd": "attention_backward"}

    def _module(self) -> tuple[Any, str | None]:
        try:
            return importlib.import_module(self.MODULE), None
        except ModuleNotFoundError as exc:
            if exc.name == self.MODULE:
                return None, f"{self.MODULE} does not exist yet (issue #5)"
            return None, _one_line(f"{self.MODULE} cannot be imported: {exc}")
        except Exception as exc:
            return None, _one_line(f"{self.MODULE} cannot be imported: {type(exc).__name__}: {exc}")

    def route(self, direction: str) -> tuple[str | None, Any, str | None]:
        """("call", function, None), ("plan", plan maker, None) or (None, None, why not)."""
        module, why = self._module()
        if module is None:
            return None, None, why
        fn = getattr(module, self.FUNCTIONS[direction], None)
        if callable(fn):
            return "call", fn, None
        maker = getattr(module, "make_fast_plan", None)
        if direction == "bwd":
            backward = getattr(module, "make_fast_backward_plan", None)
            if callable(backward):
                return "plan", backward, None
            if callable(maker) and "direction" in inspect.signature(maker).parameters:
                return "plan", functools.partial(maker, direction="bwd"), None
            return None, None, f"{self.MODULE} has no backward yet (attention_backward or make_fast_backward_plan)"
        if callable(maker):
            return "plan", maker, None
        return None, None, f"{self.MODULE} has neither attention_forward nor make_fast_plan"

    @property
    def timing_method(self) -> str:  # type: ignore[override]
        return {"plan": "cuda-graph", "call": "cuda-events"}.get(self.route("fwd")[0], "-")

    @property
    def description(self) -> str:  # type: ignore[override]
        routes = {p: self.route(p) for p in PASSES}
        return "iokernels.fast, the issue #5 tensor-core path: " + ", ".join(
            f"{p} " + (f"{getattr(fn, '__name__', None) or getattr(getattr(fn, 'func', None), '__name__', '?')}"
                       f" ({kind})" if kind else "none") for p, (kind, fn, _) in routes.items())

    def unavailable(self, direction: str) -> str | None:
        return self.route(direction)[2] or _cupy_reason()

    def setup(self, problem: Problem, direction: str) -> Runner:
        kind, fn, why = self.route(direction)
        if kind is None:
            raise Unsupported(why)
        if kind == "plan":
            from .plan import with_causal, with_dropout

            # with dropout, the makers' tiles for it (the backward's B_r = 64: no spills)
            extra = {"dropout": True} if problem.dropout and "dropout" in inspect.signature(fn).parameters else {}
            try:
                plan = with_dropout(with_causal(fn(N_q=problem.n, N_k=problem.n, d=problem.d, dtype=problem.dtype,
                                                   batch=problem.batch, heads=problem.heads, **extra), problem.causal),
                                    problem.dropout_plan_arg())
            except ValueError as exc:
                raise Unsupported(str(exc)) from exc
            return plan_runner(plan, problem)
        from . import gpu

        cp = gpu.require_cupy()
        shape = (problem.batch, problem.heads, problem.n, problem.d)
        q, k, v, do = (gpu.to_device(_random(cp, shape, i), problem.dtype) for i in range(4))
        kwargs: dict[str, Any] = {}
        if problem.dtype == "bfloat16":
            kwargs["dtype"] = "bfloat16"
        if problem.causal:
            kwargs["causal"] = True
        if problem.dropout:
            raise Unsupported(f"{self.MODULE}'s functions take no dropout")
        if direction == "fwd":
            return Runner(call=lambda: fn(q, k, v, **kwargs), clock=CupyClock())
        module, _ = self._module()
        forward = getattr(module, self.FUNCTIONS["fwd"], None)
        if not callable(forward):
            raise Unsupported(f"{self.MODULE}.attention_forward is missing (the backward needs its o and lse)")
        result = forward(q, k, v, **kwargs)
        if not isinstance(result, tuple) or len(result) < 2:
            raise Unsupported(f"{self.MODULE}.attention_forward returned no lse (the backward needs it)")
        o, lse = result[0], result[1]
        del result
        return Runner(call=lambda: fn(q, k, v, o, do, lse, **kwargs), clock=CupyClock())


class CupyStandard(Impl):
    name, label, ours = "cupy_standard", "cupy", False
    description = ("standard attention from cupy: cupy.matmul (cuBLAS) in the input dtype, softmax and dS in float32 "
                   "cupy kernels; bfloat16 unsupported (no cupy dtype)")

    def unavailable(self, direction: str) -> str | None:
        return _cupy_reason()

    def setup(self, problem: Problem, direction: str) -> Runner:
        if problem.dtype == "bfloat16":
            raise Unsupported("cupy has no bfloat16 dtype (cupy.matmul cannot reach cuBLAS's bfloat16); "
                              "not substituted by float16")
        if problem.dropout:
            raise Unsupported("the cupy standard attention has no dropout")
        from ._cupy import require_cupy

        cp = require_cupy()
        dt = cp.dtype(problem.dtype)
        f32 = cp.float32
        shape = (problem.batch, problem.heads, problem.n, problem.d)
        q, k, v, do = (_random(cp, shape, i).astype(dt) for i in range(4))
        scale = 1.0 / math.sqrt(problem.d)
        # causal (N_q = N_k): −inf above the diagonal, added to the scaled scores
        mask = cp.triu(cp.full((problem.n, problem.n), -cp.inf, dtype=f32), 1) if problem.causal else None

        def forward() -> tuple[Any, Any]:
            s = cp.matmul(q, k.swapaxes(-1, -2))
            s32 = s.astype(f32)
            del s
            s32 *= scale
            if mask is not None:
                s32 += mask
            s32 -= s32.max(axis=-1, keepdims=True)
            cp.exp(s32, out=s32)
            s32 /= s32.sum(axis=-1, keepdims=True)
            p = s32.astype(dt)
            del s32
            return cp.matmul(p, v), p

        if direction == "fwd":
            return Runner(call=forward, clock=CupyClock())
        o, p = forward()

        def backward() -> tuple[Any, Any, Any]:
            dv = cp.matmul(p.swapaxes(-1, -2), do)
            dp = cp.matmul(do, v.swapaxes(-1, -2)).astype(f32)
            delta = (do.astype(f32) * o.astype(f32)).sum(axis=-1, keepdims=True)
            dp -= delta
            dp *= p
            dp *= scale
            ds = dp.astype(dt)
            del dp
            return cp.matmul(ds, k), cp.matmul(ds.swapaxes(-1, -2), q), dv

        return Runner(call=backward, clock=CupyClock())


TORCH_BACKENDS = {"torch_flash": ("FLASH_ATTENTION", "FLASH"), "torch_cudnn": ("CUDNN_ATTENTION", "CUDNN"),
                  "torch_efficient": ("EFFICIENT_ATTENTION", "EFFIC"), "torch_math": ("MATH", "MATH")}


def _torch_reason(backend: str) -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    except Exception as exc:
        return _one_line(f"torch cannot be imported: {type(exc).__name__}: {exc}")
    try:
        if not torch.cuda.is_available():
            return f"torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda})"
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
    except Exception as exc:
        return _one_line(f"torch {torch.__version__} has no torch.nn.attention.sdpa_kernel: {exc}")
    if not hasattr(SDPBackend, backend):
        return f"torch {torch.__version__} has no SDPBackend.{backend}"
    return None


class TorchSdpa(Impl):
    ours = False

    def __init__(self, name: str, device: str = "cuda"):
        self.name, self.device = name, device
        self.backend, self.label = TORCH_BACKENDS[name]
        self.description = f"torch F.scaled_dot_product_attention with sdpa_kernel(SDPBackend.{self.backend})"

    def unavailable(self, direction: str) -> str | None:
        return _torch_reason(self.backend)

    def setup(self, problem: Problem, direction: str) -> Runner:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, self.backend)
        dt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[problem.dtype]
        shape = (problem.batch, problem.heads, problem.n, problem.d)
        gen = torch.Generator(device=self.device).manual_seed(0)
        q, k, v = (torch.randn(shape, device=self.device, dtype=dt, generator=gen) for _ in range(3))

        def sdpa() -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=problem.causal, dropout_p=problem.dropout)

        def probe() -> Any:
            """The first call; a backend that refuses the inputs raises "No available kernel", and
            its reasons come as warnings."""
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    return sdpa()
                except RuntimeError as exc:
                    if _no_kernel(exc):
                        reasons = [str(w.message) for w in caught if f"{w.message}".strip()]
                        raise Unsupported("; ".join(reasons) or str(exc)) from None
                    raise

        clock = TorchClock(torch)
        if direction == "fwd":
            with torch.no_grad():
                probe()

            def forward() -> Any:
                with torch.no_grad():
                    return sdpa()

            return Runner(call=forward, clock=clock)
        for x in (q, k, v):
            x.requires_grad_(True)
        out = probe()
        dout = torch.randn(out.shape, device=self.device, dtype=dt, generator=gen)
        return Runner(call=lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), clock=clock)


# names, aliases and defaults

OURS = ("iokernels_fast", "iokernels_flash", "iokernels_standard", "iokernels_flash_kv_outer")
DEFAULT_OURS = OURS[:3]
PEERS = ("cupy_standard", "torch_flash", "torch_cudnn", "torch_efficient", "torch_math")
PRIORITY = ("iokernels_fast", "torch_flash", "torch_cudnn", "iokernels_flash", "torch_efficient", "iokernels_standard",
            "cupy_standard", "torch_math", "iokernels_flash_kv_outer")
IMPL_ALIASES = {"fast": "iokernels_fast", "flash": "iokernels_flash", "standard": "iokernels_standard",
                "kv_outer": "iokernels_flash_kv_outer", "flash_kv_outer": "iokernels_flash_kv_outer"}
PEER_ALIASES = {"cupy": "cupy_standard", **{k.split("_", 1)[1]: k for k in TORCH_BACKENDS},
                **{v[0].lower(): k for k, v in TORCH_BACKENDS.items()}}


def parse_names(option: str, text: str, names: Sequence[str], aliases: dict[str, str],
                default: Sequence[str]) -> list[str]:
    """A comma list of names or aliases (case-insensitive); "all", "none" and "default" too."""
    out: list[str] = []
    for item in (x.strip().lower() for x in str(text).split(",") if x.strip()):
        if item == "all":
            out += names
        elif item == "default":
            out += default
        elif item == "none":
            continue
        elif item in names or item in aliases:
            out.append(aliases.get(item, item))
        else:
            choices = ", ".join([*names, *sorted(aliases), "all", "none"])
            raise ValueError(f"{option}: unknown implementation {item!r}; expected one of {choices}")
    return list(dict.fromkeys(out))


def make_impls(names: Iterable[str], *, sram: int | str | None = None) -> list[Impl]:
    sram_bytes = None if sram is None else parse_size(sram)
    factories: dict[str, Callable[[], Impl]] = {
        "iokernels_fast": FastPath,
        "iokernels_flash": lambda: ResearchPlan("iokernels_flash", "io-flash",
                                                {"fwd": ("flash", "q_outer"), "bwd": ("flash", "kv_outer")},
                                                sram_bytes),
        "iokernels_standard": lambda: ResearchPlan("iokernels_standard", "io-std",
                                                   {"fwd": ("standard", "default"), "bwd": ("standard", "default")},
                                                   sram_bytes),
        "iokernels_flash_kv_outer": lambda: ResearchPlan("iokernels_flash_kv_outer", "io-kvo",
                                                         {"fwd": ("flash", "kv_outer")}, sram_bytes),
        "cupy_standard": CupyStandard,
        **{name: (lambda name=name: TorchSdpa(name)) for name in TORCH_BACKENDS},
    }
    return [factories[n]() for n in names]


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
    from .compare import environment as base

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
