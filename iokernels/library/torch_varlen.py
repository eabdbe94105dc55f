"""The torch operators of variable-length attention (issue #23): ``torch.ops.iokernels.attention_varlen_fwd`` and
``torch.ops.iokernels.attention_varlen_bwd``, behind :func:`iokernels.torch.attention_varlen`, registered through
``torch.library`` at import, each with a fake implementation (shapes and dtypes from the metadata, checked as the cupy
function checks them: :func:`.varlen.varlen_problem`), the forward with an autograd formula whose backward is the
second operator. Their implementation (:func:`varlen_forward`, :func:`varlen_backward`) is :mod:`.torch_ops`'s way:
a call signature's first call through :func:`iokernels.attention_varlen` / :func:`iokernels.attention_varlen_backward`
on cupy views of the tensors' memory, later calls on raw addresses (the offsets stay on the device either way).

Schemas::

    iokernels::attention_varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
        int max_seqlen_q, int max_seqlen_k, str causal, float? scale, bool head_major=False)
        -> (Tensor out, Tensor lse)
    iokernels::attention_varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,
        Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, str causal, float? scale,
        bool head_major=False) -> (Tensor dq, Tensor dk, Tensor dv)

The arguments and outputs are :func:`iokernels.attention_varlen`'s and :func:`iokernels.attention_varlen_backward`'s
(``causal`` normalized: "", "bottom_right" or "top_left"; lse always). lse carries no gradient, nor do the offsets.
"""

from __future__ import annotations

from typing import Any

import torch

from ..plan import normalize_causal
from . import torch_ops as ops
from . import varlen
from .dispatch import TORCH_CALLS, check_scale
from .torch_kvcache import KV_DTYPES, check_in_place, dtype_name

VARLEN_FWD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
                     "int max_seqlen_k, str causal, float? scale, bool head_major=False) -> (Tensor, Tensor)")
VARLEN_BWD_SCHEMA = ("(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, "
                     "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, str causal, float? scale, "
                     "bool head_major=False) -> (Tensor, Tensor, Tensor)")


def check_varlen_tensors(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any,
                         max_seqlen_k: Any, head_major: Any = False) -> None:
    """TypeError/ValueError for what :func:`iokernels.attention_varlen` refuses, from metadata only (the fake
    implementations run it too): torch tensors on one CUDA (or meta) device, contiguous (read in place), q, k and v of
    one dtype, float16 or bfloat16; the shapes, the offsets' int32 and the longest lengths checked by
    :func:`.varlen.varlen_problem`, the cupy function's own."""
    check_in_place({"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k})
    if q.dtype not in KV_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must be one dtype, torch.float16 or torch.bfloat16, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    varlen.varlen_problem(tuple(q.shape), tuple(k.shape), tuple(v.shape),
                          (dtype_name(cu_seqlens_q), tuple(cu_seqlens_q.shape)),
                          (dtype_name(cu_seqlens_k), tuple(cu_seqlens_k.shape)), max_seqlen_q, max_seqlen_k,
                          dtype_name(q), head_major)


def check_varlen_backward(dout: Any, q: torch.Tensor, out: Any, lse: Any) -> None:
    """The backward's own tensors (q already checked): dout and out contiguous on q's device in q's dtype and shape, lse
    (total_q, H) float32 (:func:`.varlen.check_backward_shapes`)."""
    check_in_place({"q": q, "dout": dout, "out": out, "lse": lse})
    if dout.dtype != q.dtype or out.dtype != q.dtype:
        raise TypeError(f"dout and out must have q's dtype {q.dtype}, got {dout.dtype}, {out.dtype}")
    varlen.check_backward_shapes(tuple(q.shape), tuple(out.shape), tuple(dout.shape), (dtype_name(lse),
                                                                                       tuple(lse.shape)))


def _key(direction: str, tensors: tuple[Any, ...], options: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """A torch call's signature in :data:`TORCH_CALLS`: each tensor's metadata, each option with its type (True == 1,
    and only the cupy function's check tells them apart); None for what is not a tensor or not hashable."""
    try:
        key = ("varlen_" + direction, *((t.shape, t.stride(), t.dtype, t.device) for t in tensors),
               *((type(o), o) for o in options))
        hash(key)
    except (AttributeError, TypeError):  # the checks say what is wrong
        return None
    return key


def varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: str, scale: float | None,
                   keep_lse: bool = True, head_major: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(O, lse) of :func:`iokernels.attention_varlen` on CUDA tensors (the forward operator's implementation, and the
    eager call's without autograd): a signature's first call through the cupy function on views of the tensors' memory,
    later ones on raw addresses; ``keep_lse=False``: lse may be None (written to a scratch buffer)."""
    tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k)  # varlen.VARLEN_INPUTS["fwd"]'s order
    key = _key("fwd", tensors, (max_seqlen_q, max_seqlen_k, causal, scale, head_major))
    entry = None if key is None else ops.fast_call(key, q.device)
    if entry is not None:
        arrays = ops.run_torch(entry, tensors[:3], tuple(t.data_ptr() for t in tensors), None, keep_lse)
        out = entry.call.outputs
        return arrays[out["O"]], arrays[out["lse"]] if keep_lse else None
    check_varlen_tensors(*tensors, max_seqlen_q, max_seqlen_k, head_major)
    options = {"causal": causal, "scale": scale, "bfloat16": q.dtype == torch.bfloat16, "head_major": head_major}
    with ops.torch_stream(q.device) as (cp, allocator):
        arrays = [ops.as_cupy(cp, t) for t in tensors]
        o, lse = varlen.attention_varlen(*arrays, max_seqlen_q, max_seqlen_k, return_lse=True, **options)
        result = allocator.tensor(o, q.dtype), allocator.tensor(lse, torch.float32)
        call = varlen.varlen_call(dict(zip(varlen.VARLEN_INPUTS["fwd"], arrays, strict=True)), max_seqlen_q,
                                  max_seqlen_k, **options)
    if key is not None and call.fast is not None:
        TORCH_CALLS.put(key, ops.torch_call(call, tensors[:3]))
    return result


def varlen_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                    max_seqlen_k: int, causal: str, scale: float | None, head_major: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of :func:`iokernels.attention_varlen_backward` on CUDA tensors (the backward operator's
    implementation), as :func:`varlen_forward`: the first call of a signature through the cupy function, later ones on
    raw addresses."""
    tensors = (q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k)  # varlen.VARLEN_INPUTS["bwd"]'s order
    key = _key("bwd", tensors, (max_seqlen_q, max_seqlen_k, causal, scale, head_major))
    entry = None if key is None else ops.fast_call(key, q.device)
    if entry is not None:
        arrays = ops.run_torch(entry, tensors[:3], tuple(t.data_ptr() for t in tensors), None)
        return tuple(arrays[entry.call.outputs[n]] for n in ("dQ", "dK", "dV"))
    check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, head_major)
    check_varlen_backward(dout, q, out, lse)
    options = {"causal": causal, "scale": scale, "bfloat16": q.dtype == torch.bfloat16, "head_major": head_major}
    with ops.torch_stream(q.device) as (cp, allocator):
        arrays = dict(zip(varlen.VARLEN_INPUTS["bwd"], (ops.as_cupy(cp, t) for t in tensors), strict=True))
        grads = varlen.attention_varlen_backward(arrays["dO"], arrays["Q"], arrays["K"], arrays["V"], arrays["O"],
                                                 arrays["lse"], arrays["cu_seqlens_q"], arrays["cu_seqlens_k"],
                                                 max_seqlen_q, max_seqlen_k, **options)
        result = tuple(allocator.tensor(g, q.dtype) for g in grads)
        call = varlen.varlen_call(arrays, max_seqlen_q, max_seqlen_k, direction="bwd", **options)
    if key is not None and call.fast is not None:
        TORCH_CALLS.put(key, ops.torch_call(call, tensors[:3]))
    return result


# ---------------------------------------------------------------------------------------------
# the operators

@torch.library.custom_op("iokernels::attention_varlen_fwd", mutates_args=(), schema=VARLEN_FWD_SCHEMA)
def attention_varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: str,
                         scale: float | None, head_major: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                          head_major=head_major)


@attention_varlen_fwd.register_fake
def _attention_varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                               head_major=False):
    check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, head_major)
    normalize_causal(causal)
    check_scale(scale)
    return q.new_empty(tuple(q.shape)), q.new_empty(tuple(q.shape[:-1]), dtype=torch.float32)


@torch.library.custom_op("iokernels::attention_varlen_bwd", mutates_args=(), schema=VARLEN_BWD_SCHEMA)
def attention_varlen_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                         lse: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                         max_seqlen_k: int, causal: str, scale: float | None, head_major: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                           scale, head_major)


@attention_varlen_bwd.register_fake
def _attention_varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               causal, scale, head_major=False):
    check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, head_major)
    check_varlen_backward(dout, q, out, lse)
    normalize_causal(causal)
    check_scale(scale)
    return tuple(t.new_empty(tuple(t.shape)) for t in (q, k, v))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, *head_major = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.mark_non_differentiable(lse)
    ctx.options = (max_seqlen_q, max_seqlen_k, causal, scale, *head_major)


def _backward(ctx: Any, dout: torch.Tensor, dlse: Any) -> tuple[torch.Tensor | None, ...]:
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    # dout as autograd hands it may be a broadcast view (o.sum().backward(): stride 0); the kernels read it in place
    dq, dk, dv = torch.ops.iokernels.attention_varlen_bwd(dout.contiguous(), q, k, v, out, lse, cu_seqlens_q,
                                                          cu_seqlens_k, *ctx.options)
    return (dq, dk, dv) + (None,) * (2 + len(ctx.options))  # the offsets and the options get none


attention_varlen_fwd.register_autograd(_backward, setup_context=_setup_context)
