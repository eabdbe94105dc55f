"""The library's variable-length attention (issue #23; FlashAttention's ``flash_attn_varlen_func``):
:func:`attention_varlen` and :func:`attention_varlen_backward`, B sequences packed without padding, each sequence's
queries against its own keys.

The plans are :mod:`iokernels.plan.varlen` (the tma forward and backward built with VARLEN): the kernels read the
offsets ``cu_seqlens_q`` and ``cu_seqlens_k`` from device memory (no copy to the host: a call can be captured in a
CUDA graph); the grid follows the longest sequences (``max_seqlen_q``, ``max_seqlen_k``). Each call signature (shapes,
dtypes, the longest lengths, options, device) is checked and planned once; later calls allocate the outputs and
launch (the fast path, :mod:`.fastpath`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..kernels import launch
from ..kernels.runtime import require_cupy
from ..plan import D_MAX, D_MIN, D_MULTIPLE, normalize_causal
from ..plan.sequences import check_lengths, offsets
from ..plan.varlen import make_varlen_plan
from ..simulate import reference
from .dispatch import Dispatch, DispatchCache, array_key, check_scale, device_id
from .fastpath import check_in_place, cupy_empty, prepare_fast, run_fast
from .memory import needed_bytes, require_memory

VARLEN_CALLS = DispatchCache()  # a varlen call's signature -> its Dispatch (with its fast path after the first call)
VARLEN_INPUTS = {"fwd": ("Q", "K", "V", "cu_seqlens_q", "cu_seqlens_k"),  # the fast path's input tuples
                 "bwd": ("Q", "K", "V", "O", "dO", "lse", "cu_seqlens_q", "cu_seqlens_k")}
VARLEN_OUTPUTS = {"fwd": ("O", "lse"), "bwd": ("dQ", "dK", "dV")}
_NAMES = {"Q": "q", "K": "k", "V": "v", "O": "o", "dO": "do", "lse": "lse", "cu_seqlens_q": "cu_seqlens_q",
          "cu_seqlens_k": "cu_seqlens_k"}
Shape = tuple[int, ...]


def varlen_problem(q: Shape, k: Shape, v: Shape, cu_q: tuple[str, Shape], cu_k: tuple[str, Shape], max_q: Any,
                   max_k: Any, dtype: str, head_major: bool = False) -> dict[str, Any]:
    """The problem of a call from its shapes alone, checked (ValueError): q (total_q, H, d), k and v (total_k, H_kv,
    d) (``head_major``: (H, total_q, d) and (H_kv, total_k, d)), the offsets as (dtype name, shape), int32 (B + 1,)
    each, and the longest sequences. The cupy front end's and the torch one's."""
    if not isinstance(head_major, bool):
        raise TypeError(f"head_major must be True or False, got {head_major!r}")
    if len(q) != 3 or len(k) != 3 or k != v:
        form = ("(H, total_q, d) and k, v one (H_kv, total_k, d)" if head_major else
                "(total_q, H, d) and k, v one (total_k, H_kv, d)")
        raise ValueError(f"q must be {form} shape, got {q}, {k}, {v}")
    if head_major:
        heads, total_q, d = q
        kv_heads, total_k = k[0], k[1]
    else:
        total_q, heads, d = q
        total_k, kv_heads = k[0], k[1]
    if total_q < 1 or total_k < 1:
        raise ValueError(f"q and k must hold packed rows (total_q, total_k >= 1), got {q}, {k}")
    if k[2] != d or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"k and v's heads must divide q's and their head dim equal q's: q {q}, k {k}")
    if not (D_MIN <= d <= D_MAX) or d % D_MULTIPLE:
        raise ValueError(f"q {q}: d must be a multiple of {D_MULTIPLE} from {D_MIN} to {D_MAX}")
    if cu_q[1] != cu_k[1] or cu_q[0] != "int32" or cu_k[0] != "int32" or len(cu_q[1]) != 1 or cu_q[1][0] < 2:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must be int32 (B + 1,) offsets, B >= 1, of one shape, got "
                         f"{cu_q[0]} {cu_q[1]} and {cu_k[0]} {cu_k[1]}")
    for name, value, total in (("max_seqlen_q", max_q, total_q), ("max_seqlen_k", max_k, total_k)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= total:
            raise ValueError(f"{name} must be an int from 0 to the packed rows ({total}), got {value!r}")
    return {"batch": cu_q[1][0] - 1, "heads": heads, "kv_heads": kv_heads, "d": d, "dtype": dtype,
            "total_q": total_q, "total_k": total_k, "max_q": max_q, "max_k": max_k, "head_major": head_major}


def varlen_plan(problem: dict[str, Any], causal: str, direction: str = "fwd") -> Any:
    """The launch plan of a checked problem (the lengths unknown: read by the kernels)."""
    return make_varlen_plan(d=problem["d"], dtype=problem["dtype"], heads=problem["heads"],
                            kv_heads=problem["kv_heads"], batch=problem["batch"], max_q=problem["max_q"],
                            max_k=problem["max_k"], total_q=problem["total_q"], total_k=problem["total_k"],
                            causal=causal, direction=direction, head_major=problem["head_major"])


def check_backward_shapes(q: Shape, o: Shape, do: Shape, lse: tuple[str, Shape]) -> None:
    """A backward call's o and do shaped as q, lse (total_q, H) float32 ((H, total_q) head-major) (ValueError)."""
    if o != q or do != q or lse != ("float32", q[:2]):
        raise ValueError(f"o and do must be shaped as q {q} and lse float32 {q[:2]} (the forward's), got o {o}, do "
                         f"{do}, lse {lse[0]} {lse[1]}")


def varlen_call(arrays: dict[str, Any], max_seqlen_q: Any, max_seqlen_k: Any, *, causal: bool | str,
                scale: float | None, bfloat16: bool, direction: str = "fwd", head_major: bool = False) -> Dispatch:
    """The :class:`Dispatch` of a call of :func:`attention_varlen` (``arrays`` by tensor name, as
    :data:`VARLEN_INPUTS`) or :func:`attention_varlen_backward`: checked, planned and its fast path prepared at its
    signature's first call, from :data:`VARLEN_CALLS` after."""
    options = (direction, max_seqlen_q, max_seqlen_k, normalize_causal(causal), scale, bfloat16, head_major)
    try:
        key = (*(array_key(x) for x in arrays.values()), *((type(o), o) for o in options), device_id())
        hash(key)
    except (AttributeError, TypeError):
        key = None

    def build() -> Dispatch:
        q, k, v = arrays["Q"], arrays["K"], arrays["V"]
        check_in_place({_NAMES[n]: x for n, x in arrays.items()}, "attention_varlen reads its inputs where they lie")
        want = "uint16" if bfloat16 else "float16"
        values = [x for n, x in arrays.items() if n in ("Q", "K", "V", "O", "dO")]
        if any(str(x.dtype) != want for x in values):
            raise TypeError(f"q, k, v (and o, do) must be float16 (bfloat16 through iokernels.torch), got "
                            f"{', '.join(str(x.dtype) for x in values)}")
        cu_q, cu_k = arrays["cu_seqlens_q"], arrays["cu_seqlens_k"]
        problem = varlen_problem(tuple(q.shape), tuple(k.shape), tuple(v.shape),
                                 (str(cu_q.dtype), tuple(cu_q.shape)), (str(cu_k.dtype), tuple(cu_k.shape)),
                                 max_seqlen_q, max_seqlen_k, "bfloat16" if bfloat16 else "float16", head_major)
        if direction == "bwd":
            lse = arrays["lse"]
            check_backward_shapes(tuple(q.shape), tuple(arrays["O"].shape), tuple(arrays["dO"].shape),
                                  (str(lse.dtype), tuple(lse.shape)))
        plan = varlen_plan(problem, options[3], direction)
        call = Dispatch("cupy", plan.dtype, tuple(q.shape[:2]), problem["max_q"],
                        problem["max_k"], problem["d"], problem["heads"] // problem["kv_heads"], False, (plan,),
                        needed_bytes([plan], False, 1),
                        reference.default_scale(problem["d"]) if check_scale(scale) is None else scale, True)
        require_memory(call.chain, call.needed_bytes, call.lead)
        shapes = ({"O": tuple(q.shape), "lse": tuple(q.shape[:-1])} if direction == "fwd" else
                  {"dQ": tuple(q.shape), "dK": tuple(k.shape), "dV": tuple(v.shape)})
        prepare_fast(call, VARLEN_INPUTS[direction], shapes, VARLEN_OUTPUTS[direction])
        return call

    return VARLEN_CALLS.lookup(key, build)


def attention_varlen(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
                     max_seqlen_k: int, *, causal: bool | str = False, scale: float | None = None,
                     return_lse: bool = False, bfloat16: bool = False, head_major: bool = False) -> Any:
    """Attention of B sequences packed without padding: ``softmax(scale · q_b k_bᵀ) v_b`` for each sequence b.

    q (total_q, H, d), k and v (total_k, H_kv, d): cupy float16 (bfloat16: :mod:`iokernels.torch`), C-contiguous, the
    rows of every sequence one after another (``head_major``: q (H, total_q, d), k and v (H_kv, total_k, d), each
    head's rows together, the dense layout; lse (H, total_q)); ``cu_seqlens_q`` and ``cu_seqlens_k`` (B + 1,) int32
    on the device:
    sequence b's queries are rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q and its keys rows [cu_seqlens_k[b],
    cu_seqlens_k[b + 1]) of k and v (FlashAttention's ``flash_attn_varlen_func``). ``max_seqlen_q`` and
    ``max_seqlen_k``: the longest sequences (the grid's length; a longer sequence's rows past them are not computed,
    so they must be at least the longest). H_kv divides H (grouped-query attention: query head h reads K/V head
    h // (H / H_kv)); d a multiple of 8 from 16 to 256.

    The offsets stay on the device (a call reads nothing back: it can be captured in a CUDA graph); they must be
    non-decreasing from 0, the last total_q (total_k). The kernels clamp each offset to the packed rows and to the one
    before it, so offsets out of range or out of order give a shorter, longer or empty sequence (a wrong result; rows
    past ``max_seqlen_q`` are not computed), never a read or write outside the arrays. A sequence with no key gives
    O = 0 and lse −inf. Rows a tile reads past its sequence (the next one's) never reach its outputs: keys are masked
    and values zeroed in shared memory in the forward; in :func:`attention_varlen_backward` the next sequence's q, dO,
    k and v rows are zeroed, and nothing is added to its dq rows, so a NaN or inf stays in its sequence.

    causal: False, or True / "bottom_right" (FlashAttention's: query i of a sequence of L_q queries and L_k keys sees
    the keys up to L_k − L_q + i) or "top_left" (up to i), per sequence. scale: 1/sqrt(d) by default. Returns O
    (total_q, H, d), and lse (total_q, H) float32 with ``return_lse``. Runs on sm_90 (the tma kernel) only, on cupy's
    current stream.
    """
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be True or False, got {return_lse!r}")
    arrays = dict(zip(VARLEN_INPUTS["fwd"], (q, k, v, cu_seqlens_q, cu_seqlens_k), strict=True))
    out = _run(varlen_call(arrays, max_seqlen_q, max_seqlen_k, causal=causal, scale=scale, bfloat16=bfloat16,
                           head_major=head_major), arrays)
    return (out["O"], out["lse"]) if return_lse else out["O"]


def attention_varlen_backward(do: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
                              max_seqlen_q: int, max_seqlen_k: int, *, causal: bool | str = False,
                              scale: float | None = None, bfloat16: bool = False, head_major: bool = False
                              ) -> tuple[Any, Any, Any]:
    """Gradients (dq, dk, dv) of ``o = attention_varlen(q, k, v, ...)`` given ``do = dL/do``: o and do shaped as q,
    lse (total_q, H) float32 from ``attention_varlen(..., return_lse=True)`` with the same offsets, causal and scale;
    the other arguments as :func:`attention_varlen`. dk and dv are shaped as k and v (grouped-query attention: each
    K/V head's gradient sums its query heads'); a key no query of its sequence sees gets dk = dv = 0; ``head_major`` as
    :func:`attention_varlen`'s. The tma backward (flash_tma_bwd.cu built with VARLEN) on sm_90, float16 (bfloat16
    through iokernels.torch), d up to 256."""
    arrays = dict(zip(VARLEN_INPUTS["bwd"], (q, k, v, o, do, lse, cu_seqlens_q, cu_seqlens_k), strict=True))
    call = varlen_call(arrays, max_seqlen_q, max_seqlen_k, causal=causal, scale=scale, bfloat16=bfloat16,
                       direction="bwd", head_major=head_major)
    out = _run(call, arrays)
    return out["dQ"], out["dK"], out["dV"]


def _run(call: Dispatch, arrays: dict[str, Any]) -> dict[str, Any]:
    """A call's outputs by name: the counting build inside count_io (its counts logged), else the fast path."""
    if launch.counting_active():
        return launch.run_plan(call.chain[0], arrays, scale=call.scale).buffers
    out = run_fast(call, tuple(x.data.ptr for x in arrays.values()), cupy_empty(require_cupy()),
                   launch.current_stream(), None)
    return {n: out[i] for n, i in call.outputs.items()}


# ---------------------------------------------------------------------------------------------
# document masking (issue #22): the variable-length kernels on the dense layout, a sequence per document

def documents_only(*, algorithm: Any, schedule: Any = None, sram: Any = None, graph: Any = False,
                    block_mask: Any = None, mask: Any = None, dropout: Any = 0.0, return_dropout: Any = False,
                    window: Any = None, deterministic: Any = False, softcap: Any = None,
                    alibi_slopes: Any = None) -> None:
    """ValueError unless a call with ``documents`` leaves every option it does not take at its default."""
    given = [name for name, off in (
        ("algorithm", algorithm == "flash"), ("schedule", schedule in (None, "fast")), ("sram", sram is None),
        ("graph", graph is False), ("block_mask", block_mask is None), ("mask", mask is None),
        ("return_dropout", return_dropout is False), ("window", window is None), ("softcap", softcap is None),
        ("deterministic", deterministic is False), ("alibi_slopes", alibi_slopes is None),
        ("dropout", dropout is None or (type(dropout) in (int, float) and dropout == 0))) if not off]
    if given:
        raise ValueError(f"documents runs the tensor-core flash path alone (the sm_90 variable-length kernels): it "
                         f"takes causal and scale, not {', '.join(given)}")


@functools.lru_cache(maxsize=64)
def document_offsets(documents: tuple[int, ...], device: int) -> Any:
    """The documents' offsets (D + 1,) int32 on ``device`` (cupy), made once per documents and device."""
    cp = require_cupy()
    with cp.cuda.Device(device):
        return cp.asarray(offsets(documents))


def documents_shapes(q: Shape, k: Shape, v: Shape, documents: Any) -> tuple[tuple[int, ...], int, int, int, int]:
    """(documents, the query heads, the K/V heads, N, d) of a document-masked call from its shapes alone, checked
    (ValueError): q (..., N, d) and k, v (..., N, d) of equal leading dims, or grouped-query q (..., H, N, d) and k,
    v (..., H_kv, N, d) with H_kv dividing H, N = sum(documents) (queries and keys alike). The heads are those of
    the flattened leading dims (every batch row and head has the documents)."""
    documents = check_lengths("documents", documents)
    if len(q) < 2 or len(k) != len(q) or k != v:
        raise ValueError(f"q must be (..., N, d) and k, v one (..., N, d) shape of as many dims, got {q}, {k}, {v}")
    n = sum(documents)
    if q[-2] != n or k[-2] != n or k[-1] != q[-1]:
        raise ValueError(f"documents of {n} rows in all: q and k must hold N = {n} rows of one d, got {q}, {k}")
    if q[:-3] != k[:-3] or (len(q) > 2 and (k[-3] < 1 or q[-3] % k[-3])):
        raise ValueError(f"k and v's leading dims must be q's (the K/V heads dividing the query heads): q {q}, k {k}")
    heads, kv_heads = int(np.prod(q[:-2])), int(np.prod(k[:-2]))
    return documents, heads, kv_heads, n, q[-1]


def uniform_documents(documents: tuple[int, ...], heads: int, kv_heads: int) -> bool:
    """Whether a documents= call runs as the dense path on a batch of documents: more than one document, all of one
    length L, and K/V with q's heads. Then (..., N, d) viewed as (..., D, L, d) holds D attention problems per row and
    head, independent of each other as the documents are, and the dense fast path takes them as a batch: the same
    results and arithmetic, on its own plan (the dense forward's wider tiles and persistent grid, no sequence's tail
    to zero) and bytes (no offsets read). Otherwise, and with grouped-query heads (whose documents a view cannot
    batch), the variable-length kernels run."""
    return len(documents) > 1 and len(set(documents)) == 1 and heads == kv_heads


def _batched(x: Any, count: int) -> Any:
    """A contiguous array (..., N, d) viewed as (..., count, N / count, d): its documents as a batch dim."""
    return x.reshape(*x.shape[:-2], count, x.shape[-2] // count, x.shape[-1])


def _flat(x: Any, rows: int) -> Any:
    """A contiguous cupy array's view as (heads, rows, d) (the varlen call checks what it is)."""
    if getattr(x, "flags", None) is not None and not x.flags.c_contiguous:
        raise ValueError(f"documents: the arrays are read where they lie and must be C-contiguous, got strides "
                         f"{x.strides} for shape {x.shape}")
    return x.reshape(-1, rows, x.shape[-1]) if hasattr(x, "reshape") else x


def attention_documents(q: Any, k: Any, v: Any, documents: Any, *, causal: bool | str = False,
                        scale: float | None = None, return_lse: bool = False, bfloat16: bool = False,
                        dense: Any = None) -> Any:
    """:func:`iokernels.attention` with ``documents``: each row sees the keys of its own document only (FlexAttention's
    ``document_id[q_idx] == document_id[kv_idx]``; causal: in it), the same documents for every batch row and head.
    Runs :func:`attention_varlen` with ``head_major`` on the arrays' flattened views: each document tiled on its own
    (no tile spans two documents' work), the offsets on the device (made once per documents); documents of one length
    (:func:`uniform_documents`), ``dense`` (the dense path's call, ``iokernels.library.api.attention_arrays``; None:
    the variable-length kernels always) on the arrays viewed as a batch of them."""
    documents, heads, kv_heads, n, _ = documents_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape), documents)
    check_in_place({"q": q, "k": k, "v": v}, "documents= reads its inputs where they lie")
    if dense is not None and uniform_documents(documents, heads, kv_heads):  # a batch of documents of one length
        count = len(documents)
        out = dense(_batched(q, count), _batched(k, count), _batched(v, count), causal=causal, scale=scale,
                    return_lse=return_lse, bfloat16=bfloat16)
        if return_lse:
            return out[0].reshape(q.shape), out[1].reshape(q.shape[:-1])
        return out.reshape(q.shape)
    offsets = document_offsets(documents, q.data.device_id)
    longest = max(documents)
    out = attention_varlen(_flat(q, n), _flat(k, n), _flat(v, n), offsets, offsets, longest, longest,
                           causal=causal, scale=scale, return_lse=return_lse, bfloat16=bfloat16, head_major=True)
    if return_lse:
        return out[0].reshape(q.shape), out[1].reshape(q.shape[:-1])
    return out.reshape(q.shape)


def attention_documents_backward(do: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, documents: Any, *,
                                 causal: bool | str = False, scale: float | None = None, bfloat16: bool = False,
                                 dense: Any = None) -> tuple[Any, Any, Any]:
    """:func:`iokernels.attention_backward` with ``documents`` (:func:`attention_documents`'s forward): o and do shaped
    as q, lse as q's leading dims and N; dk, dv shaped as k, v. ``dense``: as the forward's, the dense backward's call
    (``iokernels.library.api.attention_backward_arrays``)."""
    documents, heads, kv_heads, n, _ = documents_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape), documents)
    check_in_place({"q": q, "k": k, "v": v, "o": o, "do": do, "lse": lse}, "documents= reads its inputs where they lie")
    if tuple(o.shape) != tuple(q.shape) or tuple(do.shape) != tuple(q.shape) or tuple(lse.shape) != tuple(q.shape[:-1]):
        raise ValueError(f"o and do must be shaped as q {tuple(q.shape)} and lse as {tuple(q.shape[:-1])}, got o "
                         f"{tuple(o.shape)}, do {tuple(do.shape)}, lse {tuple(lse.shape)}")
    if dense is not None and uniform_documents(documents, heads, kv_heads):  # as the forward
        count = len(documents)
        grads = dense(*(_batched(x, count) for x in (q, k, v, o, do)), lse.reshape(*lse.shape[:-1], count, n // count),
                      causal=causal, scale=scale, bfloat16=bfloat16)
        return tuple(g.reshape(x.shape) for g, x in zip(grads, (q, k, v), strict=True))
    offsets = document_offsets(documents, q.data.device_id)
    longest = max(documents)
    dq, dk, dv = attention_varlen_backward(_flat(do, n), _flat(q, n), _flat(k, n), _flat(v, n), _flat(o, n),
                                           lse.reshape(-1, n), offsets, offsets, longest, longest, causal=causal,
                                           scale=scale, bfloat16=bfloat16, head_major=True)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
