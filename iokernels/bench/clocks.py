"""How ``iokernels bench`` times a call, and how it reads a failure (out of memory, unsupported, too slow).

The timing method is described in :mod:`iokernels.bench.implementations`."""

from __future__ import annotations

import gc
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

SPIN_CYCLES = 1_000_000  # about half a millisecond of GPU time before each event-timed call


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


def one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def no_kernel(exc: BaseException) -> bool:
    """torch's refusal when the forced SDPA backend does not take the inputs (CUDA: "No available
    kernel. Aborting execution."; CPU: "No viable backend ...")."""
    msg = str(exc).lower()
    return "no available kernel" in msg or "no viable backend" in msg


def classify(exc: BaseException) -> tuple[str, str]:
    """(status, note) for an exception raised while measuring."""
    if isinstance(exc, Unsupported):
        return "unsupported", one_line(str(exc))
    text = one_line(f"{type(exc).__name__}: {exc}")
    if is_oom(exc):
        return "oom", text
    msg = str(exc).lower()
    if isinstance(exc, (NotImplementedError, ValueError, TypeError)) or no_kernel(exc) \
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
        from ..kernels.runtime import require_cupy

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
        from ..kernels import launch

        return launch.graph_seconds(runner.launch, warmup=timing.warmup, repeats=timing.repeats), \
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
