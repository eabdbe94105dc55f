"""Programmable variants through the library (issue #22): attention with a ``mask_mod`` and a ``score_mod`` given
as CUDA C expressions (:mod:`iokernels.plan.mods`), forward and backward on cupy float16 (or bfloat16) arrays, and
:func:`create_block_mask`, the block mask of a mask_mod whose empty blocks the kernels skip and whose full blocks
they do not mask.

Each call signature (shapes, expressions, captures' names and types, causal, block mask, scale) is checked, planned
and prepared once (the kernels of a new expression compile at its first call: NVRTC; a bad expression fails before,
with its column or NVRTC's line); later calls launch on raw addresses (kernels.rawlaunch), as the library's fast path
does. Inside :func:`iokernels.count_io` the counting build runs.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..kernels import launch
from ..kernels.runtime import require_cupy
from ..kernels.sources import build_source
from ..plan import make_plan
from ..plan.causal import normalize_causal
from ..plan.masks import BlockMask
from ..plan.mods import (
    MAX_CAPTURES,
    MOD_BLOCK_THREADS,
    Mods,
    capture_buffer,
    capture_inputs,
    check_mods,
    mod_block_mask,
    mod_blocks_defines,
)
from ..simulate.reference import default_scale
from .fastpath import cupy_empty, prepared


def checked_mods(mask_mod: str | None, score_mod: str | None, score_grad: str | None,
                 captures: Mapping[str, Any] | None) -> Mods:
    """:func:`iokernels.plan.mods.check_mods` of these expressions and captures, once per (expressions, captures'
    names, dtypes and shapes); ValueError without a mask_mod or a score_mod."""
    for name, x in (captures or {}).items():
        if not hasattr(x, "dtype") or not hasattr(x, "shape"):
            raise TypeError(f"capture {name!r} must be an array, got {type(x).__name__}")
    signature = tuple((name, _dtype(name, x.dtype).str, tuple(x.shape)) for name, x in (captures or {}).items())
    mods = _checked(mask_mod, score_mod, score_grad, signature)
    if mods is None:
        raise ValueError("give a mask_mod or a score_mod")
    return mods


def _dtype(name: str, dtype: Any) -> np.dtype:
    """numpy's dtype of capture ``name``'s (numpy, cupy or torch: torch.int32 -> int32); TypeError for one it has
    not (check_mods says which it takes)."""
    try:
        return np.dtype(dtype)
    except TypeError:
        try:
            return np.dtype(str(dtype).removeprefix("torch."))
        except TypeError:
            raise TypeError(f"capture {name!r}: dtype {dtype} is not one a capture takes") from None


@functools.lru_cache(maxsize=256)
def _checked(mask_mod: Any, score_mod: Any, score_grad: Any, signature: tuple[Any, ...]) -> Mods | None:
    # stand-ins of the captures' dtypes and shapes: check_mods reads nothing else of them
    stand_ins = {name: SimpleNamespace(dtype=np.dtype(dtype), shape=shape) for name, dtype, shape in signature}
    return check_mods(mask_mod, score_mod, score_grad, stand_ins)


@functools.lru_cache(maxsize=64)
def _prepared(plan: Any, scale: float, names: tuple[str, ...], shapes: tuple[Any, ...], outputs: tuple[str, ...],
              device: int) -> tuple[Any, dict[str, int]]:
    """fastpath.prepared, once per plan, scale, inputs and device (its constants uploaded once)."""
    return prepared(plan, scale, names, dict(shapes), outputs)


def _run(plan: Any, scale: float, inputs: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The plan on ``inputs`` (device arrays by buffer name); its outputs in ``shapes``. The counting build inside
    count_io (through launch.run_plan), else the prepared launches."""
    capture_inputs(plan.mods, inputs)  # each captured array of its planned type, contiguous, 1-d
    if launch.counting_active():
        run = launch.run_plan(plan, inputs, scale=scale)
        return {n: run.buffers[n].reshape(shape) for n, shape in shapes.items()}
    cp = require_cupy()
    raw, where = _prepared(plan, scale, tuple(inputs), tuple(sorted(shapes.items())), tuple(shapes),
                           cp.cuda.Device().id)
    arrays = raw.run(tuple(x.data.ptr for x in inputs.values()), cupy_empty(cp), launch.current_stream(), None,
                     launch.DEBUG_POISON)
    return {n: arrays[where[n]] for n in shapes}


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
def variant_plan(direction: str, batch: int, heads: int, kv_heads: int, n_q: int, n_k: int, d: int, dtype: str,
                 mods: Mods, causal: str, block_mask: BlockMask | None) -> Any:
    """The variant's plan of a call (its expressions through NVRTC first: :func:`_compiled`), once per signature."""
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
        x = cp.ascontiguousarray(cp.asarray(captures[name]))
        # 16-byte aligned (a staged read copies 16-byte pieces, plan.mods.staging): an offset view copied once
        out[capture_buffer(name)] = x if x.data.ptr % 16 == 0 else x.copy()
    return out


def attention_mods(q: Any, k: Any, v: Any, *, mask_mod: str | None = None, score_mod: str | None = None,
                   score_grad: str | None = None, captures: Mapping[str, Any] | None = None,
                   causal: bool | str = False, block_mask: BlockMask | None = None, scale: float | None = None,
                   return_lse: bool = False, bfloat16: bool = False) -> Any:
    """softmax(mods(τ Q Kᵀ)) V on the sm_90 tma forward with a user's expressions compiled in (module docstring of
    :mod:`iokernels.plan.mods` for what they read). q (B, H, N_q, d), k and v (B, H_kv, N_k, d), cupy float16
    (``bfloat16``: bfloat16 as uint16 words), d up to 128; ``captures``: name -> 1-d cupy (or numpy) array of int32,
    int64, uint8, float16 (read as floats) or float32 the expressions index; ``causal`` and ``block_mask`` (e.g.
    :func:`create_block_mask`) as :func:`iokernels.attention`. Returns O (B, H, N_q, d) float16, and lse (B, H, N_q)
    float32 with ``return_lse``; rows that see no key give 0 and −inf.

    Example (GPU), documents given as an id per position, causal within each::

        doc = cupy.repeat(cupy.arange(4, dtype=cupy.int32), 256)
        o = attention_mods(q, k, v, mask_mod="doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx", captures={"doc": doc})
    """
    mods = checked_mods(mask_mod, score_mod, score_grad, captures)
    batch, heads, kv_heads, n_q, n_k, d = _check(q, k, v, bfloat16=bfloat16)
    plan = variant_plan("fwd", batch, heads, kv_heads, n_q, n_k, d, "bfloat16" if bfloat16 else "float16", mods,
                 normalize_causal(causal), block_mask)
    out = _run(plan, default_scale(d) if scale is None else scale, _inputs(q, k, v, captures, mods),
               {"O": (batch, heads, n_q, d), "lse": (batch, heads, n_q)})
    return (out["O"], out["lse"]) if return_lse else out["O"]


def attention_mods_backward(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any, *, mask_mod: str | None = None,
                            score_mod: str | None = None, score_grad: str | None = None,
                            captures: Mapping[str, Any] | None = None, causal: bool | str = False,
                            block_mask: BlockMask | None = None, scale: float | None = None, bfloat16: bool = False
                            ) -> tuple[Any, Any, Any]:
    """dQ, dK, dV of :func:`attention_mods` (the same arguments, with its O and lse and the gradient dO of O) on the
    narrow tma backward: dS times ``score_grad`` (d score_mod / d score; derived from score_mod where not given)."""
    mods = checked_mods(mask_mod, score_mod, score_grad, captures)
    batch, heads, kv_heads, n_q, n_k, d = _check(q, k, v, (("o", o), ("do", do)), bfloat16)
    plan = variant_plan("bwd", batch, heads, kv_heads, n_q, n_k, d, "bfloat16" if bfloat16 else "float16", mods,
                 normalize_causal(causal), block_mask)
    cp = require_cupy()
    inputs = _inputs(q, k, v, captures, mods)
    inputs.update(O=cp.ascontiguousarray(o).reshape(batch * heads, n_q, d),
                  dO=cp.ascontiguousarray(do).reshape(batch * heads, n_q, d),
                  lse=cp.ascontiguousarray(lse, dtype=cp.float32).reshape(batch * heads, n_q))
    out = _run(plan, default_scale(d) if scale is None else scale, inputs,
               {"dQ": q.shape, "dK": k.shape, "dV": v.shape})
    return out["dQ"], out["dK"], out["dV"]


def create_block_mask(mask_mod: str, n_q: int, n_k: int, *, captures: Mapping[str, Any] | None = None,
                      block: int = 128, on_gpu: bool | None = None) -> BlockMask:
    """The block mask of ``mask_mod`` (FlexAttention's ``create_block_mask``) in ``block`` x ``block`` blocks: 0 where
    it hides a whole block (skipped), 2 where it keeps a whole one (not masked), 1 otherwise; the expression evaluated
    for batch 0 and head 0 on every element, so one that reads b or h is refused. ``on_gpu``: by kernels/mod_blocks.cu
    (a block of 256 threads per block of the mask; ``captures`` there as device or host arrays) or, False, on the CPU
    with numpy (:func:`iokernels.plan.mods.block_levels`); None: on the GPU where cupy sees one."""
    mods = checked_mods(mask_mod, None, None, captures)
    if {"b", "h"} & mods.parsed()["mask_mod"].names:
        raise ValueError("create_block_mask: the block mask is shared by every head; this mask_mod reads b or h")
    if on_gpu is None:
        try:
            require_cupy()
            on_gpu = True
        except RuntimeError:
            on_gpu = False
    if not on_gpu:
        return mod_block_mask(mods, captures or {}, n_q, n_k, block)
    levels, _ = gpu_block_levels(mods, captures or {}, n_q, n_k, block)
    return BlockMask.from_levels(levels.get(), n_q=n_q, n_k=n_k, block_q=block, block_k=block, label="mask_mod")


@functools.lru_cache(maxsize=32)
def _mod_blocks(defines: tuple[Any, ...], counting: bool, device: int) -> Any:
    cp = require_cupy()
    with cp.cuda.Device(device):
        module = cp.RawModule(code=build_source("mod_blocks.cu", dict(defines), counting), options=("-std=c++17",),
                              name_expressions=["mod_blocks"])
        return module.get_function("mod_blocks")


def gpu_block_levels(mods: Mods, captures: Mapping[str, Any], n_q: int, n_k: int, block: int = 128,
                     counting: bool = False) -> tuple[Any, dict[str, tuple[int, int]] | None]:
    """kernels/mod_blocks.cu: the levels of the mask_mod's blocks, (⌈n_q / block⌉, ⌈n_k / block⌉) uint8 on the device,
    and with ``counting`` the bytes it moved by tensor (the counting build: the captured arrays' reads, a byte of
    levels per block; :func:`iokernels.plan.mods.block_levels` predicts them)."""
    if not isinstance(block, int) or isinstance(block, bool) or block < 1 or n_q < 1 or n_k < 1:
        raise ValueError(f"block, n_q and n_k must be ints >= 1, got {block}, {n_q}, {n_k}")
    cp = require_cupy()
    fn = _mod_blocks(tuple(sorted(mod_blocks_defines(mods, block).items())), counting, cp.cuda.Device().id)
    caps = [cp.ascontiguousarray(cp.asarray(captures[name])) for name, _ in mods.captures]
    capture_inputs(mods, {capture_buffer(name): x for (name, _), x in zip(mods.captures, caps, strict=True)})
    levels = cp.empty((-(-n_q // block), -(-n_k // block)), cp.uint8)
    counters = launch.new_counters() if counting else np.uint64(0)
    fn((levels.shape[1], levels.shape[0], 1), (MOD_BLOCK_THREADS,),
       (levels, np.int32(n_q), np.int32(n_k), np.int32(1), *caps, *[np.uint64(0)] * (MAX_CAPTURES - len(caps)),
        counters))
    return levels, (launch.counts_from(cp.asnumpy(counters)) if counting else None)
