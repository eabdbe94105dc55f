"""PyTorch front end of the programmable variants (issue #22): ``iokernels.torch.attention_mods(q, k, v,
mask_mod=..., score_mod=..., captures=...)``, differentiable, on CUDA float16/bfloat16 tensors, the kernels of
:mod:`iokernels.library.mods` on torch's current stream and allocator (no copies for contiguous tensors). An eager
autograd function: torch.compile breaks its graph there (the expressions are strings it cannot trace as tensors)."""

from __future__ import annotations

from typing import Any

import torch

from ..plan.masks import BlockMask
from .mods import attention_mods as cupy_forward
from .mods import attention_mods_backward as cupy_backward
from .torch_ops import as_cupy, torch_stream

_DTYPES = {torch.float16: False, torch.bfloat16: True}  # dtype -> the cupy front end's bfloat16 flag


class ModsAttention(torch.autograd.Function):
    """The forward and backward of :func:`attention_mods` (saving O and lse for the backward)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: dict[str, Any]) -> torch.Tensor:
        with torch_stream(q.device) as (cp, allocator):
            o, lse = cupy_forward(*(as_cupy(cp, x.contiguous()) for x in (q, k, v)), return_lse=True,
                                  bfloat16=_DTYPES[q.dtype], **_cupy_spec(cp, spec))
            out, lse_t = allocator.tensor(o, q.dtype), allocator.tensor(lse, torch.float32)
        ctx.save_for_backward(q, k, v, out, lse_t)
        ctx.spec = spec
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        with torch_stream(q.device) as (cp, allocator):
            grads = cupy_backward(*(as_cupy(cp, x.contiguous()) for x in (q, k, v, out, dout.to(q.dtype), lse)),
                                  bfloat16=_DTYPES[q.dtype], **_cupy_spec(cp, ctx.spec))
            dq, dk, dv = (allocator.tensor(g, q.dtype) for g in grads)
        return dq, dk, dv, None


def _cupy_spec(cp: Any, spec: dict[str, Any]) -> dict[str, Any]:
    captures = {n: as_cupy(cp, t.contiguous()) for n, t in (spec["captures"] or {}).items()}
    return {**spec, "captures": captures or None}


def attention_mods(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask_mod: str | None = None,
                   score_mod: str | None = None, score_grad: str | None = None,
                   captures: dict[str, torch.Tensor] | None = None, causal: bool | str = False,
                   block_mask: BlockMask | None = None, scale: float | None = None) -> torch.Tensor:
    """softmax(mods(τ Q Kᵀ)) V with a user's CUDA C ``mask_mod`` / ``score_mod`` (:mod:`iokernels.plan.mods`), with
    gradients (``score_grad``: d score_mod / d score, derived where left out). q (B, H, N_q, d), k and v (B, H_kv, N_k,
    d), CUDA float16 or bfloat16, d up to 128, on one sm_90 device; ``captures``: name -> a 1-d CUDA tensor of int32,
    int64, uint8 or float32 on that device, indexed by the expressions; ``causal``, ``block_mask``
    (:func:`iokernels.create_block_mask`) and ``scale`` as :func:`iokernels.torch.attention`. Returns O (B, H, N_q,
    d)."""
    for name, x in (("q", q), ("k", k), ("v", v), *((f"capture {n}", t) for n, t in (captures or {}).items())):
        if not isinstance(x, torch.Tensor) or not x.is_cuda or x.device != q.device:
            raise TypeError(f"{name}: a CUDA tensor on q's device, got {type(x).__name__}")
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v: float16 or bfloat16 of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    spec = {"mask_mod": mask_mod, "score_mod": score_mod, "score_grad": score_grad, "captures": captures,
            "causal": causal, "block_mask": block_mask, "scale": scale}
    return ModsAttention.apply(q, k, v, spec)
