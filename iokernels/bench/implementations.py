"""``iokernels bench``: attention throughput of iokernels beside its peers, in one run on one GPU (issues #5, #20).

Every implementation is a call of a public function, set up here and timed by :mod:`iokernels.bench.clocks`
(the one timing method, the same for all; modes "call" and "graph").

Ours (``--impls``):

- ``iokernels_torch``: ``iokernels.torch.attention(q, k, v)`` on torch tensors, the library's defaults (the
  tensor-core flash path where it applies); backward as torch's peers', autograd.
- ``iokernels_cupy``: ``iokernels.attention(q, k, v)`` on cupy arrays (float16/float32; cupy has no
  bfloat16); backward ``iokernels.attention_backward(q, k, v, o, do, lse)``.
- ``iokernels_flash`` (``q_outer`` forward), ``iokernels_standard`` (forward and backward), ``iokernels_flash_kv_outer``
  (Algorithm 1, forward only, slow): the research kernels through the same public cupy call, ``algorithm=`` and
  ``schedule=`` given. No prebuilt plan, no graph of the library's own: what a user's call costs.

Peers (``--peers``):

- ``cupy_standard``: standard attention from cupy: ``cupy.matmul`` (cuBLAS) in the input dtype, softmax, D and dS in
  float32 element-wise kernels; its backward from a forward's P and O (no bfloat16 in cupy: unsupported).
- ``torch_flash``, ``torch_cudnn``, ``torch_efficient``, ``torch_math``: ``F.scaled_dot_product_attention`` under
  ``sdpa_kernel(SDPBackend.X)``, one backend at a time (one that refuses: "unsupported", with torch's reasons).
- ``torch_flex``: FlexAttention (``torch.nn.attention.flex_attention``) compiled with ``torch.compile`` (its first
  call outside the timed calls), with a block mask or ``score_mod`` for each variant (below); no dropout.
- ``iokernels_torch_dense`` (``--block-sparse`` only): ``iokernels.torch.attention`` without the block mask, the dense
  fast path on the same shapes and its dense count: the denominator of the ratios, not a numerator.
Layout (B, H, N, d), contiguous, random normal inputs.

Passes: "fwd" (torch: under ``torch.no_grad()``), "bwd" (torch: ``torch.autograd.grad`` on an ``out`` computed once,
outside the timed calls; cupy: the backward call on a stored forward's O and lse), "fwdbwd" (``bench --overhead``).

Work counted (FlashAttention-2 convention): forward 4·B·H·N_q·N_k·d FLOPs, halved when causal; backward 2.5×
forward. The variants run on ours and FlexAttention only (torch's SDPA and the cupy standard attention have none), each
counted the same for both, 4·B·H·d per visible element: a window (Flex: its ``mask_mod``), documents (ours
``documents=``, Flex a ``document_id`` mask), a softcap (ours ``softcap=``, Flex a ``score_mod``; its tanh not
counted), a block mask (``--block-sparse``: ours ``block_mask=``, Flex ``BlockMask.from_kv_blocks`` of the same 128 x
128 blocks, :func:`flex_kv_blocks`; the kept blocks' visible elements, ``configs.block_sparse_area``), ALiBi (ours
``alibi_slopes=``, Flex a ``score_mod``, the slopes ``configs.alibi_slopes``; its bias not counted); the Flex
arguments built in :mod:`iokernels.bench.flex_mods`.
Shapes: B·H·N = ``--tokens`` with H = ``--heads`` (16), B = tokens / (N·H).
The long-sequence table (``--long``): H = 48, d = 64, B = 1, N from 512 doubling to ``--long-max-n``.

Out of memory is "oom" and the run goes on (cupy's pool and torch's allocator released after every measurement); in
the long table it shows -1, and the same implementation and pass is not tried at larger N."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from typing import Any

from ..plan.units import parse_size
from .clocks import CupyClock, Runner, TorchClock, Unsupported, no_kernel, one_line
from .configs import PASSES, Problem, explicit_mask
from .flex_mods import flex_block_mask, flex_kv_blocks, flex_mask_mod, flex_score_mod  # noqa: F401 (re-exported)

DIRECTIONS = (*PASSES, "fwdbwd")  # fwdbwd: bench --overhead only

# ---------------------------------------------------------------------------------------------
# implementations

class Impl:
    """An implementation: ``unavailable`` says why it cannot run at all (None when it can);
    ``setup`` prepares one configuration and pass (raising Unsupported, or OOM) as a Runner."""

    name: str = ""
    label: str = ""
    ours: bool = False
    reference: bool = False  # ours, but a denominator of the ratios (iokernels_torch_dense)
    description: str = ""

    def unavailable(self, direction: str) -> str | None:
        return None

    def workload(self, problem: Problem) -> Problem:
        """The problem this implementation computes on ``problem``'s inputs, whose FLOPs its TFLOP/s count: the
        problem itself, but for the dense reference of a masked run (no block mask, window or documents)."""
        return problem

    def setup(self, problem: Problem, direction: str) -> Runner:
        raise NotImplementedError

    def as_dict(self) -> dict:
        return {"name": self.name, "label": self.label, "ours": self.ours, "description": self.description,
                "unavailable": {p: self.unavailable(p) for p in PASSES}}


def cupy_reason() -> str | None:
    try:
        from ..kernels.runtime import require_cupy

        require_cupy()
    except RuntimeError as exc:
        return str(exc)
    return None


def _random(cp: Any, shape: tuple[int, ...], seed: int) -> Any:
    return cp.random.RandomState(seed).standard_normal(shape, dtype=cp.float32)


def contexts(*factories: Callable[[], Any] | None) -> Callable[[], Any] | None:
    """One context factory entering each of ``factories`` (None entries skipped), or None."""
    chosen = [f for f in factories if f is not None]
    if not chosen:
        return None

    def enter() -> Any:
        stack = contextlib.ExitStack()
        for f in chosen:
            stack.enter_context(f())
        return stack

    return enter


class IokernelsCupy(Impl):
    """``iokernels.attention`` / ``attention_backward`` on cupy arrays, with the given options."""

    ours = True

    def __init__(self, name: str = "iokernels_cupy", label: str = "io-cupy", forward: dict | None = None,
                 backward: dict | None = None, has_backward: bool = True, sram: int | None = None):
        self.name, self.label = name, label
        self.forward = {**(forward or {}), **({"sram": sram} if sram is not None else {})}
        self.backward = {**(backward or {}), **({"sram": sram} if sram is not None else {})}
        self.has_backward = has_backward
        opts = ", ".join(f"{k}={v!r}" for k, v in self.forward.items())
        self.description = (f"iokernels.attention(q, k, v{', ' + opts if opts else ''}) on cupy arrays"
                            + ("; backward iokernels.attention_backward" if has_backward else "; forward only"))

    def unavailable(self, direction: str) -> str | None:
        if direction != "fwd" and not self.has_backward:
            return f"no {direction}: this schedule has no backward of its own through the public call"
        return cupy_reason()

    def setup(self, problem: Problem, direction: str) -> Runner:
        if problem.dtype == "bfloat16":
            raise Unsupported("iokernels.attention on cupy arrays takes float16/float32 (cupy has no bfloat16 "
                              "dtype); bfloat16 goes through iokernels.torch")
        if problem.attn_mask is not None:
            raise Unsupported("--attn-mask is timed through torch (io-torch), on the same mask as the peers")
        from ..kernels.runtime import require_cupy
        from ..library.api import attention, attention_backward

        cp = require_cupy()
        dt = cp.dtype(problem.dtype)
        shape = (problem.batch, problem.heads, problem.n, problem.d)
        q, k, v, do = (_random(cp, shape, i).astype(dt) for i in range(4))
        variants = {"window": problem.window, "documents": problem.documents, "softcap": problem.softcap,
                    "block_mask": problem.block_mask, "alibi_slopes": problem.alibi_slopes}
        fwd = {**self.forward, "causal": problem.causal, "dropout": problem.dropout, **variants}
        bwd = {**self.backward, "causal": problem.causal, **variants}
        clock = CupyClock()
        with clock.on():
            cp.cuda.Device().synchronize()
            if direction == "fwd":
                attention(q, k, v, **fwd)

                def call() -> Any:
                    return attention(q, k, v, **fwd)
            elif direction == "bwd":
                o, lse, drop = attention(q, k, v, return_lse=True, return_dropout=True, **fwd)

                def call() -> Any:
                    return attention_backward(q, k, v, o, do, lse, dropout=drop, **bwd)
            else:
                def call() -> Any:
                    o, lse, drop = attention(q, k, v, return_lse=True, return_dropout=True, **fwd)
                    return attention_backward(q, k, v, o, do, lse, dropout=drop, **bwd)
            clock.synchronize()
        return Runner(call=call, clock=clock)


class CupyStandard(Impl):
    name, label, ours = "cupy_standard", "cupy", False
    description = ("standard attention from cupy: cupy.matmul (cuBLAS) in the input dtype, softmax and dS in float32 "
                   "cupy kernels; bfloat16 unsupported (no cupy dtype)")

    def unavailable(self, direction: str) -> str | None:
        return cupy_reason()

    def setup(self, problem: Problem, direction: str) -> Runner:
        if problem.dtype == "bfloat16":
            raise Unsupported("cupy has no bfloat16 dtype (cupy.matmul cannot reach cuBLAS's bfloat16); "
                              "not substituted by float16")
        if problem.dropout:
            raise Unsupported("the cupy standard attention has no dropout")
        if problem.window is not None:
            raise Unsupported("the cupy standard attention has no sliding window")
        if problem.masks_documents:
            raise Unsupported("the cupy standard attention has no document mask")
        if problem.softcap is not None:
            raise Unsupported("the cupy standard attention has no softcap")
        if problem.alibi:
            raise Unsupported("the cupy standard attention has no ALiBi (an additive dense bias: another workload)")
        if problem.attn_mask is not None:
            raise Unsupported("the cupy standard attention has no explicit mask")
        if problem.block_mask is not None:
            raise Unsupported("the cupy standard attention has no block mask (a dense mask would compute every block: "
                              "another workload)")
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

        def backward(o: Any, p: Any) -> tuple[Any, Any, Any]:
            dv = cp.matmul(p.swapaxes(-1, -2), do)
            dp = cp.matmul(do, v.swapaxes(-1, -2)).astype(f32)
            delta = (do.astype(f32) * o.astype(f32)).sum(axis=-1, keepdims=True)
            dp -= delta
            dp *= p
            dp *= scale
            ds = dp.astype(dt)
            del dp
            return cp.matmul(ds, k), cp.matmul(ds.swapaxes(-1, -2), q), dv

        clock = CupyClock()
        cp.cuda.Device().synchronize()  # the inputs, made on the default stream, before the clock's stream
        if direction == "fwd":
            return Runner(call=forward, clock=clock)
        if direction == "fwdbwd":
            return Runner(call=lambda: backward(*forward()), clock=clock)
        with clock.on():
            o, p = forward()
        clock.synchronize()
        return Runner(call=lambda: backward(o, p), clock=clock)


TORCH_BACKENDS = {"torch_flash": ("FLASH_ATTENTION", "FLASH"), "torch_cudnn": ("CUDNN_ATTENTION", "CUDNN"),
                  "torch_efficient": ("EFFICIENT_ATTENTION", "EFFIC"), "torch_math": ("MATH", "MATH")}
TORCH_DTYPES = ("float16", "bfloat16", "float32")


def torch_import_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    except Exception as exc:
        return one_line(f"torch cannot be imported: {type(exc).__name__}: {exc}")
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda})"
    return None


def torch_reason(backend: str) -> str | None:
    reason = torch_import_reason()
    if reason is not None:
        return reason
    import torch

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
    except Exception as exc:
        return one_line(f"torch {torch.__version__} has no torch.nn.attention.sdpa_kernel: {exc}")
    if not hasattr(SDPBackend, backend):
        return f"torch {torch.__version__} has no SDPBackend.{backend}"
    return None


def sdpa_first_call(call: Callable[[], Any]) -> Any:
    """The first call of torch's SDPA: where the backend forced (or, none forced, every one) refuses the inputs,
    torch raises "No available kernel", with its reasons as warnings; they become one Unsupported."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return call()
        except RuntimeError as exc:
            if no_kernel(exc):
                reasons = [str(w.message) for w in caught if f"{w.message}".strip()]
                raise Unsupported("; ".join(reasons) or str(exc)) from None
            raise


def torch_runner(problem: Problem, direction: str, attend: Callable[..., Any], *, device: str = "cuda",
                 context: Callable[[], Any] | None = None,
                 first: Callable[[Callable[[], Any]], Any] | None = None) -> Runner:
    """A Runner of ``attend(q, k, v)`` on random torch tensors (B, H, N, d), for every torch callable alike
    (ours and the peers'): :func:`leaves_runner` on q, k, v and dout drawn from one seeded generator."""
    def make(torch: Any) -> tuple[tuple[Any, ...], Any, Callable[..., Any]]:
        dt = getattr(torch, problem.dtype)
        shape = (problem.batch, problem.heads, problem.n, problem.d)
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v, dout = (torch.randn(shape, device=device, dtype=dt, generator=gen) for _ in range(4))
        return (q, k, v), dout, attend

    return leaves_runner(direction, make, device=device, context=context, first=first)


def leaves_runner(direction: str, make: Callable[[Any], tuple[tuple[Any, ...], Any, Callable[..., Any]]], *,
                  device: str = "cuda", context: Callable[[], Any] | None = None,
                  first: Callable[[Callable[[], Any]], Any] | None = None) -> Runner:
    """A Runner of ``attend(*leaves)`` in pass ``direction``: ``make(torch)`` gives the leaves (the tensors the
    backward differentiates), the output's gradient ``dout`` and ``attend``. The leaves, the first call (``first``
    wraps it, to read a refusal) and ``out`` are made on the clock's stream, so that autograd's backward runs there
    too. "fwd": the call under ``torch.no_grad``; "bwd": ``torch.autograd.grad`` of an ``out`` computed once, here;
    "fwdbwd": a forward and its backward per call."""
    import torch

    clock = TorchClock(torch, device)
    grad = direction != "fwd"
    forward_ctx = contexts(context, None if grad else torch.no_grad)
    with clock.on():
        leaves, dout, attend = make(torch)
        for x in leaves:
            x.requires_grad_(grad)
        with forward_ctx() if forward_ctx else contextlib.nullcontext():
            out = first(lambda: attend(*leaves)) if first is not None else attend(*leaves)
        clock.synchronize()
    if direction == "fwd":
        return Runner(call=lambda: attend(*leaves), clock=clock, context=forward_ctx)
    if direction == "bwd":
        return Runner(call=lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True), clock=clock,
                      context=context)
    return Runner(call=lambda: torch.autograd.grad(attend(*leaves), leaves, dout), clock=clock, context=context)


class IokernelsTorch(Impl):
    """``iokernels.torch.attention`` on torch tensors, the library's defaults."""

    name, label, ours = "iokernels_torch", "io-torch", True
    description = ("iokernels.torch.attention(q, k, v) on torch tensors (defaults: the tensor-core flash path "
                   "where it applies); backward torch.autograd.grad")

    def __init__(self, device: str = "cuda"):
        self.device = device

    def unavailable(self, direction: str) -> str | None:
        return torch_import_reason() or cupy_reason()

    def setup(self, problem: Problem, direction: str) -> Runner:
        from ..torch import attention

        # block_mask= and alibi_slopes= only when there is one (made once per problem, here, outside the timed calls)
        extra = {} if problem.block_mask is None else {"block_mask": problem.block_mask}
        extra.update({} if problem.alibi_slopes is None else {"alibi_slopes": problem.alibi_slopes})
        extra.update({} if problem.attn_mask is None else {"attn_mask": explicit_mask(problem, self.device)})

        def attend(q: Any, k: Any, v: Any) -> Any:
            return attention(q, k, v, causal=problem.causal, dropout=problem.dropout, window=problem.window,
                             documents=problem.documents, softcap=problem.softcap, **extra)

        return torch_runner(problem, direction, attend, device=self.device)


class IokernelsTorchDense(IokernelsTorch):
    """The dense reference of ``bench --block-sparse``, ``--window`` and ``--documents``: ``iokernels.torch.attention``
    on the same shapes without the block mask, window or documents, its TFLOP/s on the dense count."""

    name, label, ours, reference = "iokernels_torch_dense", "io-dense", True, True
    description = ("iokernels.torch.attention(q, k, v) without the block mask, window or documents (the dense fast "
                   "path on the run's shapes); TFLOP/s on the dense count (4*B*H*N^2*d, halved when causal); a "
                   "reference of the ratios")

    def workload(self, problem: Problem) -> Problem:
        return dataclasses.replace(problem, block_mask=None, window=None, documents=None)

    def setup(self, problem: Problem, direction: str) -> Runner:
        if problem.block_mask is None and problem.window is None and not problem.masks_documents:
            raise Unsupported("the dense reference of bench --block-sparse, --window or --documents: without a mask "
                              "it is io-torch")
        return super().setup(self.workload(problem), direction)


class TorchSdpa(Impl):
    ours = False

    def __init__(self, name: str, device: str = "cuda"):
        self.name, self.device = name, device
        self.backend, self.label = TORCH_BACKENDS[name]
        self.description = (f"torch F.scaled_dot_product_attention with sdpa_kernel(SDPBackend.{self.backend}) "
                            "entered once around the calls")

    def unavailable(self, direction: str) -> str | None:
        return torch_reason(self.backend)

    def setup(self, problem: Problem, direction: str) -> Runner:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, self.backend)
        if problem.window is not None:
            raise Unsupported("torch's scaled_dot_product_attention has no sliding window (an explicit mask would "
                              "compute every block: another workload)")
        if problem.masks_documents:
            raise Unsupported("torch's scaled_dot_product_attention has no document mask (an explicit mask would "
                              "compute every block: another workload)")
        if problem.softcap is not None:
            raise Unsupported("torch's scaled_dot_product_attention has no softcap")
        if problem.alibi:
            raise Unsupported("torch's scaled_dot_product_attention has no ALiBi (an explicit additive bias would be a "
                              "dense mask: another workload)")
        if problem.block_mask is not None:
            raise Unsupported("torch's scaled_dot_product_attention has no block-sparse mask (an explicit mask would "
                              "compute every block: another workload)")

        mask = None if problem.attn_mask is None else explicit_mask(problem, self.device)

        def attend(q: Any, k: Any, v: Any) -> Any:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=problem.causal,
                                                  dropout_p=problem.dropout)

        return torch_runner(problem, direction, attend, device=self.device, context=lambda: sdpa_kernel(backend),
                            first=sdpa_first_call)


@cache
def _compiled_flex() -> Any:
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    config = torch._dynamo.config  # one compiled kernel per shape: allow them all without falling back
    for limit in ("cache_size_limit", "recompile_limit"):
        if hasattr(config, limit):
            setattr(config, limit, max(getattr(config, limit), 256))
    return torch.compile(flex_attention, dynamic=False)


class TorchFlex(Impl):
    name, label, ours = "torch_flex", "FLEX", False
    description = ("torch FlexAttention (torch.nn.attention.flex_attention.flex_attention) compiled with "
                   "torch.compile(dynamic=False); a causal block mask when causal, a sliding-window one with a window, "
                   "a document one (document_id[q_idx] == document_id[kv_idx]) with documents, a score_mod "
                   "c * tanh(score / c) with a softcap, score - slope[h] * |kv_idx - q_idx| with ALiBi, "
                   "BlockMask.from_kv_blocks of our block mask's blocks (causal: a causal mask_mod on the diagonal's) "
                   "with a block mask; no dropout")

    def __init__(self, device: str = "cuda"):
        self.device = device

    def unavailable(self, direction: str) -> str | None:
        reason = torch_import_reason()
        if reason is not None:
            return reason
        try:
            from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
        except Exception as exc:
            return one_line(f"no FlexAttention in this torch: {type(exc).__name__}: {exc}")
        return None

    def setup(self, problem: Problem, direction: str) -> Runner:
        if problem.dropout:
            raise Unsupported("FlexAttention has no dropout")
        from torch.nn.attention.flex_attention import create_block_mask

        if problem.attn_mask == "bool":
            raise Unsupported("--attn-mask bool: FlexAttention applies a mask_mod through a block mask made of it, "
                              "for every batch and head here (another workload)")
        flex = _compiled_flex()
        mask_mod = flex_mask_mod(problem, self.device)
        if problem.block_mask is not None:
            block_mask = flex_block_mask(problem, self.device)
        else:
            block_mask = None if mask_mod is None else create_block_mask(mask_mod, None, None, problem.n, problem.n,
                                                                         device=self.device)
        score_mod = flex_score_mod(problem, self.device)

        def attend(q: Any, k: Any, v: Any) -> Any:
            return flex(q, k, v, score_mod=score_mod, block_mask=block_mask)

        return torch_runner(problem, direction, attend, device=self.device)


# names, aliases and defaults

OURS = ("iokernels_torch", "iokernels_cupy", "iokernels_flash", "iokernels_standard", "iokernels_flash_kv_outer")
DEFAULT_OURS = OURS[:2]
DENSE = "iokernels_torch_dense"  # the dense reference of bench --block-sparse, --window, --documents (with them, "all"
# and "default" include it)
MASKED_OURS = (*OURS, DENSE)
MASKED_DEFAULT_OURS = ("iokernels_torch", DENSE)  # a masked run's default: the fast path, masked and dense
PEERS = ("cupy_standard", "torch_flash", "torch_cudnn", "torch_efficient", "torch_math", "torch_flex")
STRONGEST_FROM = ("torch_flash", "torch_cudnn", "torch_efficient", "torch_math", "torch_flex")  # "the strongest peer"
PRIORITY = ("iokernels_torch", "torch_flash", "torch_cudnn", "iokernels_cupy", "torch_flex", DENSE, "torch_efficient",
            "iokernels_flash", "iokernels_standard", "cupy_standard", "torch_math", "iokernels_flash_kv_outer")
IMPL_ALIASES = {"torch": "iokernels_torch", "fast": "iokernels_torch", "cupy": "iokernels_cupy", "dense": DENSE,
                "flash": "iokernels_flash", "standard": "iokernels_standard",
                "kv_outer": "iokernels_flash_kv_outer", "flash_kv_outer": "iokernels_flash_kv_outer"}
PEER_ALIASES = {"cupy": "cupy_standard", "flex": "torch_flex", **{k.split("_", 1)[1]: k for k in TORCH_BACKENDS},
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
        "iokernels_torch": IokernelsTorch,
        DENSE: IokernelsTorchDense,
        "iokernels_cupy": IokernelsCupy,
        "iokernels_flash": lambda: IokernelsCupy("iokernels_flash", "io-flash",
                                                 {"algorithm": "flash", "schedule": "q_outer"}, None,
                                                 has_backward=False, sram=sram_bytes),
        "iokernels_standard": lambda: IokernelsCupy("iokernels_standard", "io-std", {"algorithm": "standard"},
                                                    {"algorithm": "standard"}, sram=sram_bytes),
        "iokernels_flash_kv_outer": lambda: IokernelsCupy("iokernels_flash_kv_outer", "io-kvo",
                                                          {"algorithm": "flash", "schedule": "kv_outer"}, None,
                                                          has_backward=False, sram=sram_bytes),
        "cupy_standard": CupyStandard,
        "torch_flex": TorchFlex,
        **{name: (lambda name=name: TorchSdpa(name)) for name in TORCH_BACKENDS},
    }
    return [factories[n]() for n in names]
