"""PyTorch front end of the programmable variants (issue #22): ``iokernels.torch.attention_mods(q, k, v,
mask_mod=..., score_mod=..., captures=...)``, differentiable, on CUDA float16/bfloat16 tensors: the custom operators
``torch.ops.iokernels.attention_mods_fwd`` / ``_bwd`` (fake implementations and an autograd formula, so torch.compile
traces a call without a graph break; the expressions are string arguments, the captured arrays a tensor list, a block
mask its levels as a uint8 CPU tensor), running the kernels of :mod:`iokernels.library.mods` on torch's current stream
and allocator (no copies for contiguous tensors)."""

from __future__ import annotations

from typing import Any

import torch

from ..plan.masks import BlockMask
from .mods import attention_mods as cupy_forward
from .mods import attention_mods_backward as cupy_backward
from .mods import checked_mods
from .torch_ops import as_cupy, block_mask_args, torch_stream

_DTYPES = {torch.float16: False, torch.bfloat16: True}  # dtype -> the cupy front end's bfloat16 flag
_ARGS = ("Tensor[] captures, str[] capture_names, str? mask_mod, str? score_mod, str? score_grad, str causal, "
         "float? scale, Tensor? block_levels, int block")
FWD_SCHEMA = f"(Tensor q, Tensor k, Tensor v, {_ARGS}) -> (Tensor, Tensor)"
BWD_SCHEMA = f"(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_ARGS}) -> (Tensor, Tensor, Tensor)"


def _spec(cp: Any, q: torch.Tensor, k: torch.Tensor, captures: list[torch.Tensor], capture_names: list[str],
          mask_mod: str | None, score_mod: str | None, score_grad: str | None, causal: str, scale: float | None,
          block_levels: torch.Tensor | None, block: int) -> dict[str, Any]:
    """The cupy front end's keyword arguments from the operators' ones."""
    block_mask = None if block_levels is None else BlockMask.from_levels(
        block_levels.numpy(), n_q=q.shape[-2], n_k=k.shape[-2], block_q=block, block_k=block, label="mask_mod")
    caps = {n: as_cupy(cp, t.contiguous()) for n, t in zip(capture_names, captures, strict=True)}
    return {"mask_mod": mask_mod, "score_mod": score_mod, "score_grad": score_grad, "captures": caps or None,
            "causal": causal, "block_mask": block_mask, "scale": scale, "bfloat16": _DTYPES[q.dtype]}


@torch.library.custom_op("iokernels::attention_mods_fwd", mutates_args=(), schema=FWD_SCHEMA)
def attention_mods_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, captures: list[torch.Tensor],
                       capture_names: list[str], mask_mod: str | None, score_mod: str | None, score_grad: str | None,
                       causal: str, scale: float | None, block_levels: torch.Tensor | None, block: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    with torch_stream(q.device) as (cp, allocator):
        spec = _spec(cp, q, k, captures, capture_names, mask_mod, score_mod, score_grad, causal, scale, block_levels,
                     block)
        o, lse = cupy_forward(*(as_cupy(cp, x.contiguous()) for x in (q, k, v)), return_lse=True, **spec)
        return allocator.tensor(o, q.dtype), allocator.tensor(lse, torch.float32)


@attention_mods_fwd.register_fake
def _fwd_fake(q, k, v, captures, capture_names, mask_mod, score_mod, score_grad, causal, scale, block_levels, block):
    _check(q, k, v, captures, capture_names, mask_mod, score_mod, score_grad)
    return q.new_empty(tuple(q.shape)), q.new_empty(tuple(q.shape[:-1]), dtype=torch.float32)


@torch.library.custom_op("iokernels::attention_mods_bwd", mutates_args=(), schema=BWD_SCHEMA)
def attention_mods_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, captures: list[torch.Tensor], capture_names: list[str], mask_mod: str | None,
                       score_mod: str | None, score_grad: str | None, causal: str, scale: float | None,
                       block_levels: torch.Tensor | None, block: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with torch_stream(q.device) as (cp, allocator):
        spec = _spec(cp, q, k, captures, capture_names, mask_mod, score_mod, score_grad, causal, scale, block_levels,
                     block)
        grads = cupy_backward(*(as_cupy(cp, x.contiguous()) for x in (q, k, v, out, dout.to(q.dtype), lse)), **spec)
        return tuple(allocator.tensor(g, q.dtype) for g in grads)


@attention_mods_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, captures, capture_names, mask_mod, score_mod, score_grad, causal, scale,
              block_levels, block):
    return tuple(t.new_empty(tuple(t.shape)) for t in (q, k, v))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    q, k, v, captures, *options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, *captures)
    ctx.mark_non_differentiable(lse)
    ctx.options = options


def _backward(ctx: Any, dout: torch.Tensor, dlse: Any) -> tuple[torch.Tensor | None, ...]:
    q, k, v, out, lse, *captures = ctx.saved_tensors
    dq, dk, dv = torch.ops.iokernels.attention_mods_bwd(dout, q, k, v, out, lse, captures, *ctx.options)
    return dq, dk, dv, [None] * len(captures), *(None,) * 8  # the forward's inputs' structure: captures a list


attention_mods_fwd.register_autograd(_backward, setup_context=_setup_context)


def _check(q: Any, k: Any, v: Any, captures: Any, capture_names: Any, mask_mod: Any, score_mod: Any,
           score_grad: Any) -> None:
    """TypeError/ValueError for tensors and expressions the operators do not take (before anything runs)."""
    for name, x in (("q", q), ("k", k), ("v", v), *((f"capture {n}", t) for n, t in zip(capture_names, captures,
                                                                                         strict=True))):
        if not isinstance(x, torch.Tensor) or x.device != q.device or x.device.type != "cuda":
            raise TypeError(f"{name}: a CUDA tensor on q's device, got {type(x).__name__}")
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v: float16 or bfloat16 of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    checked_mods(mask_mod, score_mod, score_grad, dict(zip(capture_names, captures, strict=True)))


def attention_mods(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask_mod: str | None = None,
                   score_mod: str | None = None, score_grad: str | None = None,
                   captures: dict[str, torch.Tensor] | None = None, causal: bool | str = False,
                   block_mask: BlockMask | None = None, scale: float | None = None) -> torch.Tensor:
    """softmax(mods(τ Q Kᵀ)) V with a user's CUDA C ``mask_mod`` / ``score_mod`` (:mod:`iokernels.plan.mods`), with
    gradients (``score_grad``: d score_mod / d score, derived where left out). q (B, H, N_q, d), k and v (B, H_kv, N_k,
    d), CUDA float16 or bfloat16, d up to 128, on one sm_90 device; ``captures``: name -> a 1-d CUDA tensor of int32,
    int64, uint8, float16 or float32 on that device, indexed by the expressions; ``causal``, ``block_mask``
    (:func:`iokernels.create_block_mask`) and ``scale`` as :func:`iokernels.torch.attention`. Returns O (B, H, N_q,
    d). The call is ``torch.ops.iokernels.attention_mods_fwd`` (torch.compile traces it)."""
    from ..plan.causal import normalize_causal

    names, tensors = list((captures or {}).keys()), list((captures or {}).values())
    if not torch.compiler.is_compiling():  # (traced, the operator's fake implementation checks the same)
        _check(q, k, v, tensors, names, mask_mod, score_mod, score_grad)
    if block_mask is not None and (not isinstance(block_mask, BlockMask) or block_mask.block_q != block_mask.block_k):
        raise TypeError("block_mask: an iokernels.BlockMask of square blocks (create_block_mask's)")
    levels, block, _ = (None, 0, 0) if block_mask is None else block_mask_args(block_mask)  # (no graph break)
    out, _ = torch.ops.iokernels.attention_mods_fwd(q, k, v, tensors, names, mask_mod, score_mod, score_grad,
                                                    normalize_causal(causal), scale, levels, block)
    return out
