"""Explicit masks on the tensor-core path (issue #22): a boolean or additive mask broadcastable to (..., N_q, N_k),
read by the sm_90 tma forward and narrow backward as a programmable variant (:mod:`iokernels.library.mods`).

A boolean mask becomes the mask_mod ``mask[i] != 0``, an additive one the score_mod ``score + mask[i]`` (its
derivative 1: the backward multiplies nothing), with i the element's offset in the mask's own memory: the strides of
the mask broadcast to (*lead, N_q, N_k), the leading dims read as (batch, head) with the last one the head (b, h of the
expression). The mask is read where it lies, in its dtype (bool as bytes, float16, float32; float64 as float32),
unless its batch dims cannot be walked with one stride (then a (batch·heads, N_q, N_k) copy). Every computed
element reads its mask element: the model counts them as the variant's ``captures`` bytes.

The research kernels (flash q_outer / kv_outer, standard) keep every other masked call: numpy inputs, float32, d past
:data:`iokernels.plan.mods.MOD_D_MAX`, dropout, windows, softcaps, ALiBi, ``deterministic=True``, ``graph=True``, an
explicit schedule, other GPUs than sm_90.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ..kernels import launch
from ..kernels.runtime import require_cupy
from ..plan import Unsupported
from ..plan.fast import default_kernel
from ..plan.masks import explicit_mask, mask_layout
from ..plan.mods import MOD_D_MAX, capture_buffer
from ..simulate.reference import default_scale
from .dispatch import ROUTED_CALLS, Dispatch, call_key
from .fastpath import cupy_empty, module_of, prepared, run_fast
from .mods import attention_mods, attention_mods_backward, checked_mods, variant_plan

CAPTURE = "mask"  # the captured array's name in the expressions
INT_MAX = 2**31 - 1


def takes(q: Any, mask: Any, *, algorithm: str, schedule: str | None, graph: bool = False, dropout: Any = None,
          window: Any = None, softcap: Any = None, alibi: Any = None, deterministic: bool = False,
          bfloat16: bool = False, **_: Any) -> bool:
    """Whether a masked call runs on the tma kernels (module docstring): cupy float16 (or ``bfloat16``) arrays with
    d a multiple of 8 up to MOD_D_MAX on an sm_90 GPU, flash with no schedule or "fast", and nothing the variants
    do not combine with (the call's other options, causal, scale, sram, do not matter)."""
    if mask is None or algorithm != "flash" or schedule not in (None, "fast") or graph or deterministic:
        return False
    if dropout not in (None, 0, 0.0) or window is not None or softcap is not None or alibi is not None:
        return False
    try:
        if module_of(q) != "cupy" or module_of(mask) not in ("cupy", "numpy"):
            return False
    except TypeError:
        return False
    if str(q.dtype) != ("uint16" if bfloat16 else "float16") or q.ndim < 2:
        return False
    d = q.shape[-1]
    return 16 <= d <= MOD_D_MAX and d % 8 == 0 and default_kernel() == "tma"


def _heads(lead: tuple[int, ...]) -> tuple[int, int]:
    """(batch, heads) of the leading dims: the last one the heads, the rest the batch."""
    return (math.prod(lead[:-1]), lead[-1]) if lead else (1, 1)


def _dims(q: Any, k: Any) -> tuple[tuple[int, ...], int, int, int, int, int, int]:
    """(lead, n_q, n_k, d, batch, heads, kv_heads) of a call's q (..., N_q, d) and k (..., H_kv, N_k, d)."""
    lead = tuple(q.shape[:-2])
    return (lead, q.shape[-2], k.shape[-2], q.shape[-1], *_heads(lead), k.shape[-3] if k.ndim >= 3 else 1)


def variant(mask: Any, lead: tuple[int, ...], n_q: int, n_k: int) -> tuple[str | None, str | None, Any]:
    """(mask_mod, score_mod, the captured 1-d array) of a mask (module docstring). TypeError or ValueError for a dtype
    or shape that :func:`iokernels.plan.masks.mask_layout` refuses; a numpy mask is checked as the research path's
    (NaN and +inf refused) and copied to the device."""
    cp = require_cupy()
    spec, _ = mask_layout(mask.dtype, mask.shape, lead, n_q, n_k)
    batch, heads = _heads(lead)
    full = (*lead, n_q, n_k)
    if module_of(mask) == "numpy":  # checked, and laid out (1 or batch·heads, n_q, n_k)
        base = cp.asarray(explicit_mask(mask, lead, n_q, n_k)[1])
        plane = n_q * n_k
        strides = [0, 0] if spec.shared else [heads * plane, plane]
        strides += [n_k, 1]
    else:
        base = mask if mask.flags.c_contiguous else cp.ascontiguousarray(mask)
        if base.dtype == np.float64:
            base = base.astype(np.float32)
        strides = strides_of(base, full)
        if strides is None:  # batch dims with no single stride: one (batch·heads, n_q, n_k) copy
            base = cp.ascontiguousarray(cp.broadcast_to(base, full).reshape(batch * heads, n_q, n_k))
            strides = [heads * n_q * n_k, n_q * n_k, n_k, 1]
    if base.dtype == np.bool_:
        base = base.view(np.uint8)
    return (*expressions(spec.kind, strides, base.size > INT_MAX), base.reshape(-1))


def expressions(kind: str, strides: list[int], wide: bool = False) -> tuple[str | None, str | None]:
    """(mask_mod, score_mod) of a mask of ``kind`` ("bool" or "additive") whose element (b, h, q_idx, kv_idx) lies at
    the offset of those ``strides``; ``wide``: offsets past int, in 64-bit constants (the index then computes in long
    long)."""
    index = " + ".join(name if stride == 1 and not wide else f"{name} * {stride}{'l' if wide else ''}"
                       for name, stride in zip(("b", "h", "q_idx", "kv_idx"), strides, strict=True) if stride)
    element = f"{CAPTURE}[{index or 0}]"
    return (f"{element} != 0", None) if kind == "bool" else (None, f"score + {element}")


def strides_of(base: Any, full: tuple[int, ...]) -> list[int] | None:
    """The element strides (b, h, q_idx, kv_idx) of a C-contiguous ``base`` broadcast to ``full`` = (*lead, n_q, n_k),
    or None where its batch dims (lead[:-1]) are not one stride apart."""
    shape = (1,) * (len(full) - base.ndim) + tuple(base.shape)
    contiguous = [base.strides[i] // base.itemsize for i in range(base.ndim)]
    own = [0] * (len(full) - base.ndim) + contiguous
    strides = [0 if n == 1 else s for n, s in zip(shape, own, strict=True)]
    lead, lead_strides = full[:-2], strides[:-2]
    head = lead_strides[-1] if lead else 0
    dims = [(n, s) for n, s in zip(lead[:-1], lead_strides[:-1], strict=True) if n > 1]
    for (_, outer), (n_inner, inner) in itertools.pairwise(dims):
        if outer != inner * n_inner:
            return None
    return [dims[-1][1] if dims else 0, head, strides[-2], strides[-1]]


def forward(q: Any, k: Any, v: Any, mask: Any, *, causal: str, scale: float | None, block_mask: Any,
            bfloat16: bool) -> tuple[Any, Any]:
    """(O, lse) of a masked call :func:`takes` accepts, in the caller's shapes (q (..., N_q, d), lse (..., N_q));
    Unsupported where the variant's plan refuses the problem (e.g. a block mask's blocks)."""
    lead, n_q, n_k, d, batch, heads, kv_heads = _dims(q, k)
    mask_mod, score_mod, capture = variant(mask, lead, n_q, n_k)
    o, lse = attention_mods(q.reshape(batch, heads, n_q, d), k.reshape(batch, kv_heads, n_k, d),
                            v.reshape(batch, kv_heads, n_k, d), mask_mod=mask_mod, score_mod=score_mod,
                            captures={CAPTURE: capture}, causal=causal, block_mask=block_mask, scale=scale,
                            return_lse=True, bfloat16=bfloat16)
    return o.reshape(*lead, n_q, d), lse.reshape(*lead, n_q)


def routed_call(direction: str, arrays: tuple[Any, ...], mask: Any, *, causal: str, scale: float | None,
                block_mask: Any, bfloat16: bool) -> Dispatch | None:
    """A :class:`Dispatch` whose fast path runs a routed call again on raw addresses (``torch_ops``' fast path: the
    variant's prepared launches, the mask's own memory as the captured array, inputs in the library's order: q, k, v
    and the mask; the backward's q, k, v, dO, O, lse and the mask), after the call ran once on the general path; None
    where the mask is not read where it lies (:func:`variant` copies it: not C-contiguous, float64, batch dims no
    single stride walks; a numpy one; an address off 16 bytes) or the variant's plan refuses the problem: those take
    the general path every time."""
    q, k = arrays[0], arrays[1]
    lead, n_q, n_k, d, batch, heads, kv_heads = _dims(q, k)
    if module_of(mask) != "cupy":  # (a numpy mask is checked and copied up at every call)
        return None
    if not mask.flags.c_contiguous or mask.dtype == np.float64 or mask.data.ptr % 16:  # variant would copy it, or
        return None  # off 16 bytes (checked before variant: no copy made only to be dropped)
    mask_mod, score_mod, capture = variant(mask, lead, n_q, n_k)
    if capture.data.ptr != mask.data.ptr:  # a copy (batch dims no single stride walks): not read where it lies
        return None
    mods = checked_mods(mask_mod, score_mod, None, {CAPTURE: capture})
    try:
        plan = variant_plan(direction, batch, heads, kv_heads, n_q, n_k, d, "bfloat16" if bfloat16 else "float16",
                            mods, causal, block_mask)
    except Unsupported:  # (the general path ran it on the research kernels)
        return None
    scale = default_scale(d) if scale is None else scale
    if direction == "fwd":
        names, shapes = ("Q", "K", "V", capture_buffer(CAPTURE)), {"O": (*lead, n_q, d), "lse": (*lead, n_q)}
    else:
        names = ("Q", "K", "V", "dO", "O", "lse", capture_buffer(CAPTURE))
        shapes = {"dQ": tuple(q.shape), "dK": tuple(k.shape), "dV": tuple(arrays[2].shape)}
    call = Dispatch("cupy", plan.dtype, lead, n_q, n_k, d, heads // kv_heads, False, (plan,), 0, scale, True)
    call.fast, call.outputs = prepared(plan, scale, names, shapes, tuple(shapes))
    return call


def fast_call(direction: str, arrays: tuple[Any, ...], mask: Any, **options: Any) -> Dispatch | None:
    """The fast path of a routed cupy call whose signature ran before (:func:`remember`), None without one, inside
    count_io, or for a mask off 16-byte alignment (the general path copies it)."""
    if launch.counting_active():
        return None
    key = call_key(direction, arrays, mask, **options)
    call = None if key is None else ROUTED_CALLS.get(key)
    return call if call is not None and mask.data.ptr % 16 == 0 else None


def remember(direction: str, arrays: tuple[Any, ...], mask: Any, options: dict[str, Any], causal: str,
             scale: float | None) -> None:
    """After a routed cupy call ran on the general path: its signature's fast path (:func:`routed_call`, with causal
    and scale normalized) stored under the key of its arguments as given (``options``: causal, scale, block_mask,
    bfloat16), where it has one (contiguous arrays, a mask read where it lies)."""
    key = call_key(direction, arrays, mask, **options)
    if key is None or not all(x.flags.c_contiguous for x in arrays):
        return
    call = routed_call(direction, arrays, mask, causal=causal, scale=scale, block_mask=options["block_mask"],
                       bfloat16=options["bfloat16"])
    if call is not None:
        ROUTED_CALLS.put(key, call)


def run(direction: str, arrays: tuple[Any, ...], mask: Any, causal: Any, scale: Any, block_mask: Any, bfloat16: bool,
        checked: Any) -> Any:
    """A call :func:`takes` routes, on cupy arrays (``arrays``: q, k, v, and the backward's o, do, lse, as the library
    takes them): on its signature's fast path where it ran before; else checked (``checked(arrays, causal, scale,
    bfloat16)``: the library's checks, giving causal and scale normalized), run by :func:`forward` or
    :func:`backward` and remembered. (O, lse) or (dQ, dK, dV); None where the variant's plan refuses the problem (the
    research kernels then run it)."""
    options = {"causal": causal, "scale": scale, "block_mask": block_mask, "bfloat16": bfloat16}
    fast = fast_call(direction, arrays, mask, **options)
    if fast is not None:  # its prepared launches on raw addresses, inputs in routed_call's order
        order = (0, 1, 2) if direction == "fwd" else (0, 1, 2, 4, 3, 5)
        given = (*(arrays[i].data.ptr for i in order), mask.data.ptr)
        out = run_fast(fast, given, cupy_empty(require_cupy()), launch.current_stream(), None)
        return tuple(out[fast.outputs[n]] for n in (("O", "lse") if direction == "fwd" else ("dQ", "dK", "dV")))
    causal, scale = checked(arrays, causal, scale, bfloat16)
    try:
        result = (forward if direction == "fwd" else backward)(*arrays, mask, causal=causal, scale=scale,
                                                               block_mask=block_mask, bfloat16=bfloat16)
    except Unsupported:
        return None
    remember(direction, arrays, mask, options, causal, scale)
    return result


def backward(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any, mask: Any, *, causal: str, scale: float | None,
             block_mask: Any, bfloat16: bool) -> tuple[Any, Any, Any]:
    """(dQ, dK, dV) of :func:`forward`'s call, in the shapes of q, k and v."""
    lead, n_q, n_k, d, batch, heads, kv_heads = _dims(q, k)
    mask_mod, score_mod, capture = variant(mask, lead, n_q, n_k)
    q4, o4, do4 = (x.reshape(batch, heads, n_q, d) for x in (q, o, do))
    k4, v4 = (x.reshape(batch, kv_heads, n_k, d) for x in (k, v))
    dq, dk, dv = attention_mods_backward(q4, k4, v4, o4, do4, lse.reshape(batch, heads, n_q), mask_mod=mask_mod,
                                         score_mod=score_mod, captures={CAPTURE: capture}, causal=causal,
                                         block_mask=block_mask, scale=scale, bfloat16=bfloat16)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)

