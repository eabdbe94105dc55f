"""PyTorch front end: ``iokernels.torch.attention(q, k, v)``, differentiable, on CUDA tensors.

An optional module: ``import iokernels`` never imports torch, and this module needs it. The tensors
cross to cupy through DLPack (no copies for contiguous tensors) and every kernel runs on torch's
current CUDA stream of the tensors' device, so the call orders with the torch work around it as any
torch op would (CUDA graphs of torch's own, ``torch.cuda.graph``, are not supported).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:
    import torch
except ImportError as exc:  # an optional dependency: say how to get it
    raise ImportError("iokernels.torch needs PyTorch, which is not installed: pip install torch "
                      "(iokernels itself does not depend on it)") from exc

from . import api

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@contextlib.contextmanager
def _torch_stream(device: torch.device) -> Iterator[Any]:
    """cupy on ``device`` and torch's current stream there; yields cupy."""
    from ..kernels.runtime import require_cupy

    cp = require_cupy()
    with cp.cuda.Device(device.index), cp.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream):
        yield cp


def _to_cupy(cp: Any, t: torch.Tensor) -> Any:
    """A cupy view of ``t`` (a copy first only when it is not contiguous); bfloat16 as uint16 bits."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return cp.from_dlpack(t.view(torch.int16)).view(cp.uint16)
    return cp.from_dlpack(t)


def _to_torch(cp: Any, x: Any, dtype: torch.dtype) -> torch.Tensor:
    """A torch view of the cupy array ``x`` (bfloat16 from uint16 bits)."""
    if dtype == torch.bfloat16:
        return torch.from_dlpack(x.view(cp.int16)).view(torch.bfloat16)
    return torch.from_dlpack(x)


def _check(q: Any, k: Any, v: Any) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__module__}.{type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"unsupported dtype {t.dtype} of {name}: expected torch.float32, torch.float16 or "
                            "torch.bfloat16")
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}: iokernels runs on CUDA tensors")
    if len({t.device for t in (q, k, v)}) != 1:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")


class _Attention(torch.autograd.Function):
    """O = attention(q, k, v); saves q, k, v, O and lse for the backward."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: dict) -> torch.Tensor:
        bf16 = q.dtype == torch.bfloat16
        with _torch_stream(q.device) as cp:
            mask = options["mask"]
            if isinstance(mask, torch.Tensor):  # checked and stored by the library from the host
                mask = (mask.detach().float() if mask.is_floating_point() else mask.detach()).cpu().numpy()
            o, lse, dropout = api.attention_arrays(*(_to_cupy(cp, t) for t in (q, k, v)), return_lse=True,
                                                   bfloat16=bf16, mask=mask, return_dropout=True, **options["forward"])
            o_t, lse_t = _to_torch(cp, o, q.dtype), torch.from_dlpack(lse)
        ctx.save_for_backward(q, k, v, o_t, lse_t)
        ctx.options, ctx.dropout, ctx.mask = options, dropout, mask
        return o_t

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, o, lse = ctx.saved_tensors
        with _torch_stream(q.device) as cp:
            grads = api.attention_backward_arrays(*(_to_cupy(cp, t) for t in (q, k, v, o, do.to(q.dtype))),
                                            _to_cupy(cp, lse), bfloat16=q.dtype == torch.bfloat16,
                                            mask=ctx.mask, dropout=ctx.dropout, **ctx.options["backward"])
            dq, dk, dv = (_to_torch(cp, g, q.dtype) for g in grads)
        return dq, dk, dv, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool | str = False,
              scale: float | None = None, algorithm: str = "flash", schedule: str | None = None,
              sram: int | str | None = None, deterministic: bool = False, mask: Any = None,
              dropout: float = 0.0) -> torch.Tensor:
    """Exact attention ``softmax(scale * q kᵀ) v`` on CUDA tensors, with autograd.

    Shapes as :func:`iokernels.attention`: q (..., N_q, d), k and v (..., N_k, d) with equal leading
    dims, or grouped-query attention with k, v (..., H_kv, N_k, d), H_kv dividing H_q; d a multiple
    of 8 from 16 to 256. dtypes: torch.float32, torch.float16 or torch.bfloat16, one for all, on one
    CUDA device. bfloat16 crosses to cupy as raw 16-bit words (cupy has no bfloat16), with the same
    kernels as float16: the tensor-core flash path for d of 64 or 128, the research kernels elsewhere.

    The forward calls :func:`iokernels.attention` on DLPack views of the tensors (no copies for
    contiguous tensors) on torch's current stream, and saves q, k, v, O and the row logsumexp; the
    backward calls :func:`iokernels.attention_backward` (algorithm "standard" for a standard
    forward, "flash" otherwise) with them. causal, scale, algorithm, schedule and sram as
    :func:`iokernels.attention`; deterministic as :func:`iokernels.attention_backward`. mask: a
    boolean or floating tensor (or numpy/cupy array) broadcastable to (..., N_q, N_k), as
    :func:`iokernels.attention`'s. dropout: the probability p in [0, 1) of dropping an attention
    probability (training; pass 0 for evaluation): each call draws the library's next Philox offset
    (:mod:`iokernels.plan.dropout`), and its backward regenerates the same mask.

    Returns O (..., N_q, d), a tensor of q's dtype on q's device, with a grad_fn when an input
    requires grad. Raises ImportError at import without torch, TypeError/ValueError on bad input
    (non-tensors, other dtypes, CPU tensors, the shape errors of :func:`iokernels.attention`).

    Example (GPU and torch):

    >>> import torch, iokernels.torch
    >>> q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    ...            for _ in range(3))
    >>> o = iokernels.torch.attention(q, k, v, causal=True)
    >>> o.sum().backward()
    >>> o.shape, q.grad.shape, q.grad.dtype
    (torch.Size([2, 4, 300, 64]), torch.Size([2, 4, 300, 64]), torch.float16)
    >>> want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    >>> bool((o.double() - want).abs().max() < 1e-2)   # N_q = N_k: bottom-right and top-left agree
    True
    """
    _check(q, k, v)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"mixed dtypes: q {q.dtype}, k {k.dtype}, v {v.dtype}; pass one dtype for all")
    forward = {"algorithm": algorithm, "schedule": schedule, "causal": causal, "scale": scale, "sram": sram,
               "dropout": dropout}
    backward = {"algorithm": "standard" if algorithm == "standard" else "flash", "causal": causal, "scale": scale,
                "sram": sram, "deterministic": deterministic}
    return _Attention.apply(q, k, v, {"forward": forward, "backward": backward, "mask": mask})
