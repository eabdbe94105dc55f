"""Programmable variants through the library (issue #22): attention with a ``mask_mod`` and a ``score_mod`` given
as CUDA C expressions (:mod:`iokernels.plan.mods`), forward and backward on cupy float16 (or bfloat16) arrays, and
:func:`create_block_mask`, the block mask of a mask_mod whose empty blocks the kernels skip and whose full blocks
they do not mask.

Each call signature (shapes, expressions, captures' names and types, causal, block mask, scale) is planned once; the
kernels of a new expression compile at its first call (NVRTC; a bad expression fails before, with the column).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from ..kernels import launch
from ..kernels.runtime import require_cupy
from ..plan import make_plan
from ..plan.causal import normalize_causal
from ..plan.masks import BlockMask
from ..plan.mods import Mods, capture_buffer, check_mods, mod_block_mask
from ..simulate.reference import default_scale


@functools.lru_cache(maxsize=64)
def _compiled(mods: Mods) -> None:
    """The expressions through NVRTC alone (:meth:`Mods.check_source`), once: a bad one raises ValueError with NVRTC's
    message, which names the expression and its line, before a kernel is compiled or launched."""
    cp = require_cupy()
    try:
        cp.RawModule(code=mods.check_source(), options=("-std=c++17",)).compile()
    except cp.cuda.compiler.CompileException as exc:
        raise ValueError(f"NVRTC rejected the expressions:\n{exc}") from None


@functools.lru_cache(maxsize=64)
def _plan(direction: str, batch: int, heads: int, kv_heads: int, n_q: int, n_k: int, d: int, dtype: str, mods: Mods,
          causal: str, block_mask: BlockMask | None) -> Any:
    _compiled(mods)
    return make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=227 * 1024, batch=batch,
                     heads=heads, kv_heads=kv_heads, direction=direction, causal=causal, block_mask=block_mask,
                     mods=mods)


def _check(q: Any, k: Any, v: Any, extra: tuple[Any, ...] = (), bfloat16: bool = False
           ) -> tuple[int, int, int, int, int, int]:
    cp = require_cupy()
    want = cp.uint16 if bfloat16 else cp.float16
    for name, x in (("q", q), ("k", k), ("v", v), *extra):
        if not isinstance(x, cp.ndarray) or x.dtype != want or x.ndim != 4:
            raise TypeError(f"{name}: a 4-d cupy {'bfloat16 (uint16 words)' if bfloat16 else 'float16'} array "
                            f"(batch, heads, N, d), got {type(x).__name__} {getattr(x, 'dtype', '')} "
                            f"{getattr(x, 'shape', '')}")
    (batch, heads, n_q, d), (_, kv_heads, n_k, _) = q.shape, k.shape
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != d or heads % kv_heads:
        raise ValueError(f"k and v: (batch, kv_heads, N_k, d) with kv_heads dividing heads, got q {q.shape}, "
                         f"k {k.shape}, v {v.shape}")
    return batch, heads, kv_heads, n_q, n_k, d


def _inputs(q: Any, k: Any, v: Any, captures: Mapping[str, Any] | None, mods: Mods) -> dict[str, Any]:
    cp = require_cupy()
    b, h, n_q, d = q.shape
    out = {"Q": cp.ascontiguousarray(q).reshape(b * h, n_q, d),
           "K": cp.ascontiguousarray(k).reshape(-1, k.shape[2], d),
           "V": cp.ascontiguousarray(v).reshape(-1, v.shape[2], d)}
    for name, _ in mods.captures:
        out[capture_buffer(name)] = cp.ascontiguousarray(cp.asarray(captures[name]))
    return out


def attention_mods(q: Any, k: Any, v: Any, *, mask_mod: str | None = None, score_mod: str | None = None,
                   score_grad: str | None = None, captures: Mapping[str, Any] | None = None,
                   causal: bool | str = False, block_mask: BlockMask | None = None, scale: float | None = None,
                   return_lse: bool = False, bfloat16: bool = False) -> Any:
    """softmax(mods(τ Q Kᵀ)) V on the sm_90 tma forward with a user's expressions compiled in (module docstring of
    :mod:`iokernels.plan.mods` for what they read). q (B, H, N_q, d), k and v (B, H_kv, N_k, d), cupy float16
    (``bfloat16``: bfloat16 as uint16 words), d up to 128; ``captures``: name -> 1-d cupy (or numpy) array of int32,
    int64, uint8 or float32 the expressions index; ``causal`` and ``block_mask`` (e.g. :func:`create_block_mask`) as
    :func:`iokernels.attention`. Returns O (B, H, N_q, d) float16, and lse (B, H, N_q) float32 with ``return_lse``;
    rows that see no key give 0 and −inf.

    Example (GPU), documents given as an id per position, causal within each::

        doc = cupy.repeat(cupy.arange(4, dtype=cupy.int32), 256)
        o = attention_mods(q, k, v, mask_mod="doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx", captures={"doc": doc})
    """
    mods = check_mods(mask_mod, score_mod, score_grad, captures)
    if mods is None:
        raise ValueError("attention_mods needs a mask_mod or a score_mod")
    batch, heads, kv_heads, n_q, n_k, d = _check(q, k, v, bfloat16=bfloat16)
    plan = _plan("fwd", batch, heads, kv_heads, n_q, n_k, d, "bfloat16" if bfloat16 else "float16", mods,
                 normalize_causal(causal), block_mask)
    run = launch.run_plan(plan, _inputs(q, k, v, captures, mods), scale=default_scale(d) if scale is None else scale)
    o = run.buffers["O"].reshape(batch, heads, n_q, d)
    return (o, run.buffers["lse"].reshape(batch, heads, n_q)) if return_lse else o


def attention_mods_backward(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any, *, mask_mod: str | None = None,
                            score_mod: str | None = None, score_grad: str | None = None,
                            captures: Mapping[str, Any] | None = None, causal: bool | str = False,
                            block_mask: BlockMask | None = None, scale: float | None = None, bfloat16: bool = False
                            ) -> tuple[Any, Any, Any]:
    """dQ, dK, dV of :func:`attention_mods` (the same arguments, with its O and lse and the gradient dO of O) on the
    narrow tma backward: dS times ``score_grad`` (d score_mod / d score; required where score_mod reads score)."""
    mods = check_mods(mask_mod, score_mod, score_grad, captures)
    if mods is None:
        raise ValueError("attention_mods_backward needs a mask_mod or a score_mod")
    batch, heads, kv_heads, n_q, n_k, d = _check(q, k, v, (("o", o), ("do", do)), bfloat16)
    plan = _plan("bwd", batch, heads, kv_heads, n_q, n_k, d, "bfloat16" if bfloat16 else "float16", mods,
                 normalize_causal(causal), block_mask)
    cp = require_cupy()
    inputs = _inputs(q, k, v, captures, mods)
    inputs.update(O=cp.ascontiguousarray(o).reshape(batch * heads, n_q, d),
                  dO=cp.ascontiguousarray(do).reshape(batch * heads, n_q, d),
                  lse=cp.ascontiguousarray(lse, dtype=cp.float32).reshape(batch * heads, n_q))
    run = launch.run_plan(plan, inputs, scale=default_scale(d) if scale is None else scale)
    return (run.buffers["dQ"].reshape(q.shape), run.buffers["dK"].reshape(k.shape),
            run.buffers["dV"].reshape(v.shape))


def create_block_mask(mask_mod: str, n_q: int, n_k: int, *, captures: Mapping[str, Any] | None = None,
                      block: int = 128) -> BlockMask:
    """The block mask of ``mask_mod`` (FlexAttention's ``create_block_mask``) in ``block`` x ``block`` blocks: 0 where
    it hides a whole block (skipped), 2 where it keeps a whole one (not masked), 1 otherwise; from the expression
    evaluated for batch 0 and head 0 (on the CPU), so one that reads b or h is refused."""
    mods = check_mods(mask_mod=mask_mod, captures=captures)
    if {"b", "h"} & mods.parsed()["mask_mod"].names:
        raise ValueError("create_block_mask: the block mask is shared by every head; this mask_mod reads b or h")
    return mod_block_mask(mods, captures or {}, n_q, n_k, block)
