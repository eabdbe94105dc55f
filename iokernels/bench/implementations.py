"""``iokernels bench``: attention throughput of iokernels beside its peers, in one run on one GPU (issue #5).

Implementations (``--impls`` picks ours, ``--peers`` the others):

- ``iokernels_fast``: the tensor-core path (flash/fast), its plans (``make_fast_plan`` forward,
  ``make_fast_backward_plan`` backward) through the plan launcher.
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
  replays (:func:`iokernels.kernels.launch.graph_seconds`; one replay runs the plan k times, k chosen so that a
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
the same implementation and pass is not tried at larger N."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..plan.units import parse_size
from .clocks import CupyClock, Runner, TorchClock, Unsupported, no_kernel, one_line
from .configs import PASSES, Problem

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
        from ..kernels.runtime import require_cupy

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
    from ..kernels import launch
    from ..plan import make_plan
    from ..simulate import reference

    cp = launch.require_cupy()
    needed = set(launch.plan_tensors(plan))
    make_p = "P" in needed and plan.algorithm == "standard"
    inputs: dict[str, Any] = {}
    names = ("Q", "K", "V", "dO", "O") if plan.direction == "bwd" else ("Q", "K", "V")  # not the outputs
    for i, name in enumerate(names):
        if name in needed or (make_p and name in ("Q", "K", "V")):
            inputs[name] = launch.to_device(_random(cp, launch.tensor_shape(plan, name), i), plan.dtype)
    if "lse" in needed and plan.direction == "bwd":
        inputs["lse"] = cp.full(launch.tensor_shape(plan, "lse"), math.log(plan.N_k) + 0.5, dtype=cp.float32)
    if make_p:
        fwd = make_plan("standard", N_q=plan.N_q, N_k=plan.N_k, d=plan.d, dtype=plan.dtype, sram=plan.sram_bytes,
                        batch=plan.batch, heads=plan.heads, causal=plan.causal)
        inputs["P"] = launch.run_plan(fwd, {n: inputs[n] for n in ("Q", "K", "V")}).buffers["P"]
    buffers, _ = launch.allocate(plan, {n: x for n, x in inputs.items() if n in needed})
    del inputs
    launch.compile_plan(plan)
    scale = reference.default_scale(problem.d)

    def replay() -> None:
        for stage in plan.stages:
            launch.launch_stage(plan, stage, buffers, scale, False)

    return Runner(call=replay, clock=CupyClock(), launch=replay)


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
        from ..library.api import DEFAULT_SRAM
        from ..model.specs import current_device_spec

        spec = current_device_spec()
        limit = spec.smem_per_block_bytes if spec and spec.smem_per_block_bytes else None
        sram = self.sram if self.sram is not None else (min(DEFAULT_SRAM, limit) if limit else DEFAULT_SRAM)
        return sram, limit

    def as_dict(self) -> dict:
        return {**super().as_dict(), "sram_bytes": self.sram_bytes()[0]}

    def setup(self, problem: Problem, direction: str) -> Runner:
        from ..plan import make_plan

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
    """The tensor-core path (flash/fast): its plans, ``make_fast_plan`` (forward) and
    ``make_fast_backward_plan`` (backward), through the plan launcher (CUDA-graph replays)."""

    name, label, ours = "iokernels_fast", "fast", True
    timing_method = "cuda-graph"
    description = ("iokernels flash/fast, the tensor-core path: fwd make_fast_plan (plan), "
                   "bwd make_fast_backward_plan (plan)")

    @staticmethod
    def maker(direction: str) -> Callable[..., Any]:
        from ..plan.fast import make_fast_plan
        from ..plan.fast_bwd import make_fast_backward_plan

        return make_fast_plan if direction == "fwd" else make_fast_backward_plan

    def unavailable(self, direction: str) -> str | None:
        return _cupy_reason()

    def setup(self, problem: Problem, direction: str) -> Runner:
        from ..plan import with_causal, with_dropout

        maker = self.maker(direction)
        # with dropout, the makers' tiles for it (the backward's B_r = 64: no spills)
        extra = {"dropout": True} if problem.dropout and direction == "bwd" else {}
        try:
            plan = with_dropout(with_causal(maker(N_q=problem.n, N_k=problem.n, d=problem.d, dtype=problem.dtype,
                                                  batch=problem.batch, heads=problem.heads, **extra), problem.causal),
                                problem.dropout_plan_arg())
        except ValueError as exc:
            raise Unsupported(str(exc)) from exc
        return plan_runner(plan, problem)


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
        from ..kernels.runtime import require_cupy

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
        return one_line(f"torch cannot be imported: {type(exc).__name__}: {exc}")
    try:
        if not torch.cuda.is_available():
            return f"torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda})"
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
    except Exception as exc:
        return one_line(f"torch {torch.__version__} has no torch.nn.attention.sdpa_kernel: {exc}")
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
                    if no_kernel(exc):
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
