"""How ``iokernels bench`` times a call, every implementation's alike, and how it reads a failure (out of
memory, unsupported, too slow). :func:`time_runner` is the one timing method (modes "call" and "graph";
:func:`interleave` takes the samples of several implementations in turn); :func:`host_seconds` the host overhead
of ``bench --overhead``."""

from __future__ import annotations

import contextlib
import gc
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# ---------------------------------------------------------------------------------------------
# outcomes

class Unsupported(Exception):
    """This implementation does not run this configuration; the message says why."""


class TooSlow(Exception):
    def __init__(self, seconds: float, limit: float):
        self.seconds = seconds
        super().__init__(f"one call took {seconds * 1e3:.1f} ms > --max-call-ms {limit * 1e3:g}")


def is_oom(exc: BaseException) -> bool:
    """cupy's and torch's OutOfMemoryError (matched by class name, so neither is imported), a MemoryError
    (the library's DeviceMemoryError: its check before launching), or a CUDA or cuBLAS allocation failure."""
    if isinstance(exc, MemoryError) or any(c.__name__ == "OutOfMemoryError" for c in type(exc).__mro__):
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
# clocks: every implementation, ours and the peers', is timed here and only here, one way per mode
#
# mode "call": CUDA events around ``loop`` back-to-back calls of the implementation's public function,
#   nothing in between (no spin, no synchronisation), so the host's time per call counts wherever the
#   GPU would wait for it, as it does for a user; the figure is the loop's time divided by ``loop``.
#   One untimed call is enqueued before the start event (IN_FLIGHT), so that the timed calls find the GPU
#   busy as every call but the first of a user's loop does: without it each timed loop began on an idle GPU
#   (the loop before was synchronised) and the first call's host time, about 250 µs for a backward through
#   autograd, counted once per loop of a few long calls (loops of 3-4 at 1.5 ms a call). On an H100 at d 64, N 4096
#   (results/h100/issue21/bc176/, run3 against run6) every implementation's backward read 4-16 % faster with it.
# mode "graph": the same call captured once in a CUDA graph (torch.cuda.graph for torch callables,
#   cupy's stream capture for cupy ones) and ``loop`` replays timed by the same events.
# Each measurement is the median of ``repeats`` loops after ``warmup`` calls (or replays); ``loop`` is
# chosen per configuration from one call, so that a loop lasts about LOOP_TARGET_SECONDS. ``bench`` sets up every
# implementation of a configuration and pass, each mode, and takes their loops in turn (:func:`interleave`): one
# loop of each, ``repeats`` rounds. Timed one after another instead, each over about 50 ms, the same implementation
# read 565 and 486 TFLOP/s in two neighbouring measurements on an H200 (cuDNN, causal d 128, N 4096,
# results/h200/issue21/full-d1f5647/), the GPU's clocks moving under its power limit between them.

MODES = ("call", "graph")
IN_FLIGHT = 1  # untimed calls enqueued before each timed loop's start event
LOOP_TARGET_SECONDS = 0.005
MAX_LOOP = 200
OVERHEAD_CHUNK = 50  # host-overhead calls between synchronisations (which fall outside the timed calls)


def parse_mode(text: str) -> tuple[str, ...]:
    """``--mode``: "call", "graph" or "both" -> the modes to measure, in table order."""
    mode = str(text).strip().lower()
    if mode == "both":
        return MODES
    if mode in MODES:
        return (mode,)
    raise ValueError(f"--mode: expected call, graph or both, got {text!r}")


class CupyClock:
    """cupy events on a stream of the clock's own (cupy's stream capture needs a non-default one)."""

    name = "cupy"

    def __init__(self) -> None:
        from ..kernels.runtime import require_cupy

        self.cp = require_cupy()
        self.stream = self.cp.cuda.Stream(non_blocking=True)

    def on(self) -> Any:
        return self.stream

    def synchronize(self) -> None:
        self.stream.synchronize()

    def loop_seconds(self, fn: Callable[[], Any], loop: int) -> float:
        cp = self.cp
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        for _ in range(IN_FLIGHT):
            fn()
        start.record(self.stream)
        for _ in range(loop):
            fn()
        stop.record(self.stream)
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) / 1e3 / loop

    def capture(self, fn: Callable[[], Any]) -> Callable[[], None]:
        self.stream.begin_capture()
        try:
            kept = fn()  # the outputs the graph writes stay allocated while the graph lives
        finally:
            graph = self.stream.end_capture()
        stream = self.stream

        def replay() -> None:
            graph.launch(stream)

        replay.kept = kept  # type: ignore[attr-defined]
        return replay


class TorchClock:
    """torch events on a side stream of the clock's own (torch.cuda.graph captures there too)."""

    name = "torch"

    def __init__(self, torch: Any, device: str = "cuda"):
        self.torch = torch
        self.cuda = device == "cuda" or str(device).startswith("cuda")
        self.stream = torch.cuda.Stream() if self.cuda else None

    def on(self) -> Any:
        return self.torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    def synchronize(self) -> None:
        if self.cuda:
            self.stream.synchronize()

    def loop_seconds(self, fn: Callable[[], Any], loop: int) -> float:
        torch = self.torch
        if not self.cuda:  # torch's CPU build (tests): the wall clock
            t0 = time.perf_counter()
            for _ in range(loop):
                fn()
            return (time.perf_counter() - t0) / loop
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(IN_FLIGHT):
            fn()
        start.record()
        for _ in range(loop):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1e3 / loop

    def capture(self, fn: Callable[[], Any]) -> Callable[[], None]:
        torch = self.torch
        if not self.cuda:
            raise Unsupported("CUDA graphs need a CUDA device")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            kept = fn()

        def replay() -> None:
            graph.replay()

        replay.kept = kept  # type: ignore[attr-defined]
        return replay


@dataclass
class Runner:
    """One implementation set up for one configuration and pass: ``call`` is one call of its public
    function (allocating its outputs as a user's call would); ``clock`` its framework's events and
    graphs; ``context``, when given, is entered once around all the calls (e.g. torch's
    ``sdpa_kernel`` backend choice, ``no_grad`` for the forward), as a user would set it once.
    ``cycle``: successive calls rotate among this many distinct inputs (``bench --decode``'s K/V caches,
    so that no call finds its inputs in the L2 the call before left); mode "graph" captures ``cycle``
    calls in a row, every input once, and divides a replay's time by ``cycle``."""

    call: Callable[[], Any]
    clock: Any
    context: Callable[[], Any] | None = None
    cycle: int = 1

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with self.clock.on(), (self.context() if self.context is not None else contextlib.nullcontext()):
            yield

    def calls(self) -> list[Any]:
        """``cycle`` calls in a row (what mode "graph" captures); their outputs."""
        return [self.call() for _ in range(self.cycle)]


@dataclass(frozen=True)
class Timing:
    """Loops per measurement, the per-call limit, and an optional budget for the whole run (once it is
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

    def spent(self, started: float) -> str | None:
        """The note of a measurement skipped because the run's budget, counted from ``started``
        (time.monotonic()), is spent; None while it lasts."""
        if self.budget_seconds is not None and time.monotonic() - started > self.budget_seconds:
            return f"the run's --time-budget of {self.budget_seconds:g} s was spent"
        return None


@dataclass(frozen=True)
class Measured:
    seconds: float  # median seconds per call
    calls: int  # calls timed in all (a replay of a graph of k calls counts k)
    loop: int  # calls per timed loop
    method: str


def loop_length(once: float) -> int:
    return max(1, min(MAX_LOOP, math.ceil(LOOP_TARGET_SECONDS / max(once, 1e-9))))


@dataclass
class Prepared:
    """One implementation, configuration and mode ready to time (:func:`prepare`): ``fn`` is one call or one replay of
    its graph (``per`` calls), timed ``loop`` times back to back per sample; ``times`` its samples, seconds per call."""

    runner: Runner
    fn: Callable[[], Any]
    loop: int
    per: int
    method: str
    times: list[float]

    def sample(self) -> float:
        """Time one loop (in the runner's context, as every sample) and keep its seconds per call."""
        with self.runner.active():
            seconds = self.runner.clock.loop_seconds(self.fn, self.loop) / self.per
        self.times.append(seconds)
        return seconds

    def measured(self) -> Measured:
        return Measured(statistics.median(self.times), len(self.times) * self.loop * self.per, self.loop * self.per,
                        self.method)


def prepare(runner: Runner, timing: Timing, mode: str = "call", *, cold: bool = False) -> Prepared:
    """The set-up of :func:`time_runner`'s method: one call sets the loop's length (raising TooSlow after one call
    over the limit; ``cold``: the first call of an implementation may compile, so a slow one is retried once); in mode
    "graph" the calls are captured (whatever the capture raises propagates); then ``timing.warmup`` calls or replays.
    A runner whose calls rotate among ``cycle`` > 1 inputs is captured as one graph of ``cycle`` calls, replayed
    ceil(loop / cycle) times per timed loop."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if runner.cycle < 1:
        raise ValueError(f"Runner.cycle must be >= 1, got {runner.cycle}")
    clock, cycle = runner.clock, runner.cycle
    with runner.active():
        once = clock.loop_seconds(runner.call, 1)
        if once > timing.max_call_seconds and cold:
            once = clock.loop_seconds(runner.call, 1)
        if once > timing.max_call_seconds:
            raise TooSlow(once, timing.max_call_seconds)
        loop = loop_length(once)
        per = 1  # calls per fn()
        if mode == "graph":
            for _ in range(max(timing.warmup, cycle, 1)):  # warm up eagerly on the capture stream first, every input
                runner.call()
            clock.synchronize()
            fn = clock.capture(runner.calls)
            per, loop = cycle, math.ceil(loop / cycle)
        else:
            fn = runner.call
        for _ in range(timing.warmup):
            fn()
    what = "calls" if mode == "call" else "replays of a CUDA graph of " + ("one call" if per == 1 else f"{per} calls")
    method = (f"{clock.name} events around {loop} back-to-back {what}"
              + (f", rotating among {cycle} inputs" if cycle > 1 else ""))
    return Prepared(runner, fn, loop, per, method, [])


def time_runner(runner: Runner, timing: Timing, mode: str = "call", *, cold: bool = False) -> Measured:
    """The one timing method of ``iokernels bench`` (see above) for one runner alone: :func:`prepare`, then
    ``timing.repeats`` samples. ``bench`` itself samples the implementations of a configuration in turn
    (:func:`interleave`)."""
    prepared = prepare(runner, timing, mode, cold=cold)
    for _ in range(timing.repeats):
        prepared.sample()
    return prepared.measured()


def prepare_modes(runner: Runner, timing: Timing, rows: Sequence[dict], *, cold: bool,
                  failed: Callable[[dict, BaseException], None]) -> list[tuple[dict, Prepared]]:
    """:func:`prepare` for each row's ``"mode"`` (rows whose status is already set are left), the first call ``cold``;
    a failure is the row's (``failed(row, exc)``), and after TooSlow every later mode is "skipped" with its note.
    The (row, Prepared) pairs ready for :func:`interleave`."""
    ready = []
    for i, row in enumerate(rows):
        if row.get("status") is not None:
            continue
        try:
            ready.append((row, prepare(runner, timing, row["mode"], cold=cold)))
        except Exception as exc:
            failed(row, exc)
            if isinstance(exc, TooSlow):  # every later mode would be as slow
                for later in rows[i + 1:]:
                    later.update(status="skipped", note=row["note"])
                break
        finally:
            cold = False
    return ready


def prepare_setup(setup: Callable[[], Runner], name: str, warmed: set, timing: Timing, rows: Sequence[dict],
                  failed: Callable[[dict, BaseException], None]) -> list[tuple[dict, Prepared]]:
    """Implementation ``name`` set up once (``setup()``, its runner) for every row's mode (:func:`prepare_modes`, the
    first call cold unless ``name`` is in ``warmed``, which it then joins). A setup that raises is the failure of every
    row without a status (``failed(row, exc)``), and no mode is ready."""
    try:
        runner = setup()
    except Exception as exc:
        for row in rows:
            if row.get("status") is None:
                failed(row, exc)
        return []
    try:
        return prepare_modes(runner, timing, rows, cold=name not in warmed, failed=failed)
    finally:
        warmed.add(name)


def interleave(prepared: Sequence[Prepared], repeats: int,
               failed: Callable[[int, BaseException], None] | None = None) -> None:
    """``repeats`` samples of each of ``prepared``, taken in turn: round r times one loop of each, in an order
    shuffled per round (seeded by r, so a run repeats itself), so that the GPU's clock and power state, which drift
    within a second of sustained attention, fall alike on every implementation of a configuration, and no
    implementation always follows the same one (a loop after a lighter one may find more power headroom). A sample
    that raises drops that implementation from the rounds (``failed(index, exception)``; re-raised without it)."""
    live = list(range(len(prepared)))
    for r in range(repeats):
        for i in random.Random(r).sample(live, len(live)):
            try:
                prepared[i].sample()
            except Exception as exc:
                if failed is None:
                    raise
                failed(i, exc)
                live.remove(i)


def time_in_turn(timed: Sequence[tuple[dict, Prepared]], repeats: int,
                 failed: Callable[[dict, BaseException], None]) -> list[dict]:
    """The (row, Prepared) pairs of a configuration (:func:`prepare_modes` of each implementation) timed in turn
    (:func:`interleave`); a failing sample is its row's (``failed(row, exc)``). Each row whose samples all ran gets
    status "ok", seconds (the median per call), timed_calls, loop and method; those rows are returned, for the
    caller's rates. The Prepared hold the runners: dropping ``timed`` releases them."""
    interleave([prepared for _, prepared in timed], repeats, lambda i, exc: failed(timed[i][0], exc))
    done = []
    for row, prepared in timed:
        if row["status"] is None:
            got = prepared.measured()
            row.update(status="ok", seconds=got.seconds, timed_calls=got.calls, loop=got.loop, method=got.method)
            done.append(row)
    return done


def host_seconds(runner: Runner, calls: int = 200, warmup: int = 20, chunk: int = OVERHEAD_CHUNK) -> list[float]:
    """Host seconds of each of ``calls`` calls: time.perf_counter around the call only (its enqueue;
    nothing waits for the GPU inside the timed region). Every ``chunk`` calls the stream is
    synchronised, outside any timed call, so that the launch queue never fills (a full queue would make
    the enqueue wait for the GPU and time the GPU instead of the host)."""
    if calls < 1 or warmup < 0 or chunk < 1:
        raise ValueError(f"calls and chunk must be >= 1 and warmup >= 0, got {calls}, {chunk}, {warmup}")
    times: list[float] = []
    with runner.active():
        for _ in range(warmup):
            runner.call()
        runner.clock.synchronize()
        while len(times) < calls:
            for _ in range(min(chunk, calls - len(times))):
                t0 = time.perf_counter()
                runner.call()
                times.append(time.perf_counter() - t0)
            runner.clock.synchronize()
    return times


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between order statistics."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


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
