"""The library's decode step on a KV cache (issue #23): :func:`attention_with_kvcache`, the new query tokens of each
sequence against its cached keys and values, contiguous or paged, each sequence of its own length, read by the
kernels from device memory (no copy to the host, so a decode step can be captured in a CUDA graph).

The plan is the split-KV decode (:mod:`iokernels.plan.decode`, :mod:`iokernels.plan.kvcache`): the g query heads
of a K/V head packed into one tile, so K and V are read once per K/V head; the keys cut into splits that fill the
SMs; a combine by log-sum-exp. Each call signature (shapes, dtypes, strides, options, device) is checked and
planned once; later calls allocate the outputs and launch (the fast path, :mod:`.fastpath`).
"""

from __future__ import annotations

from typing import Any

from ..kernels import launch
from ..kernels.runtime import require_cupy
from ..plan import D_MAX, D_MIN, D_MULTIPLE, Unsupported, normalize_causal
from ..plan.decode import MAX_SPLITS, make_decode_plan
from ..plan.kvcache import PAGE_SIZES, make_kv_cache
from ..simulate import reference
from .dispatch import Dispatch, DispatchCache, array_key, check_scale, device_id
from .fastpath import check_in_place, cupy_empty, forward_result, prepare_fast, run_fast
from .memory import needed_bytes, require_memory
from .planning import DECODE_SMS, sm_count_of

KV_CALLS = DispatchCache()  # a kvcache call's signature -> its Dispatch (with its fast path after the first call)
KV_INPUTS = ("Q", "K", "V", "seqlens", "page_table", "Knew", "Vnew")  # the fast path's input tuple (unused: 0)
KV_OUTPUTS = ("O", "lse")
_DTYPES = ("float16",)
Shape = tuple[int, ...]


def _check(q: Any, k: Any, v: Any, seqlens: Any, table: Any, k_new: Any, v_new: Any, bfloat16: bool
           ) -> dict[str, Any]:
    """The problem of a call, checked: every array a contiguous cupy array on one device, q (B, H, N_q, d), the cache
    contiguous (B, H_kv, N_cap, d) or paged (pages, H_kv, page_size, d) with the page table (B, max_pages) int32,
    cache_seqlens (B,) int32, the new keys and values (B, H_kv, N_new, d) of q's dtype."""
    check_in_place({"q": q, "k_cache": k, "v_cache": v, "cache_seqlens": seqlens, "page_table": table, "k": k_new,
                    "v": v_new}, "attention_with_kvcache reads the cache where it lies")
    dtype = "bfloat16" if bfloat16 else str(q.dtype)
    want = "uint16" if bfloat16 else q.dtype
    if dtype not in (*_DTYPES, "bfloat16") or any(x is not None and x.dtype != want for x in (k, v, k_new, v_new)):
        got = ", ".join(str(x.dtype) for x in (q, k, v, k_new, v_new) if x is not None)
        raise TypeError(f"q, k_cache, v_cache (and k, v) must be one dtype, float16 (bfloat16 through "
                        f"iokernels.torch), got {got}")
    lengths, pages = (None if x is None else (str(x.dtype), tuple(x.shape)) for x in (seqlens, table))
    new = None if k_new is None and v_new is None else tuple(None if x is None else tuple(x.shape)
                                                             for x in (k_new, v_new))
    return cache_problem(tuple(q.shape), tuple(k.shape), tuple(v.shape), lengths, pages, dtype, new)


def cache_problem(q: Shape, k: Shape, v: Shape, seqlens: tuple[str, Shape] | None, table: tuple[str, Shape] | None,
                  dtype: str, new: tuple[Shape | None, Shape | None] | None = None) -> dict[str, Any]:
    """The problem of a call from its shapes alone, checked (ValueError): q, k_cache, v_cache's shapes; cache_seqlens
    and page_table as (dtype name, shape), None when not given; ``dtype`` the problem's ("float16", "bfloat16");
    ``new`` the shapes of k and v to append (None: no append; one of them None: refused). The cupy front end's and
    the torch one's (:mod:`.torch_ops`, its fake implementation included)."""
    if len(q) != 4 or len(k) != 4 or k != v:
        raise ValueError(f"q must be (B, H, N_q, d) and k_cache, v_cache one 4-d shape, got {q}, {k}, {v}")
    batch, heads, n_q, d = q
    kv_heads = k[1]
    if k[3] != d or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"the cache's heads must divide q's and its head dim equal q's: q {q}, cache {k}")
    if not (D_MIN <= d <= D_MAX) or d % D_MULTIPLE or n_q < 1 or batch < 1:
        raise ValueError(f"q {q}: d must be a multiple of {D_MULTIPLE} from {D_MIN} to {D_MAX}, N_q and B >= 1")
    for name, x, ndim in (("cache_seqlens", seqlens, 1), ("page_table", table, 2)):
        if x is not None and (x[0] != "int32" or len(x[1]) != ndim or x[1][0] != batch):
            raise ValueError(f"{name} must be int32 with {ndim} dim(s) and {batch} rows (one per sequence), got "
                             f"{x[0]} {x[1]}")
    append = 0
    if new is not None:
        k_new, v_new = new
        if k_new is None or v_new is None or k_new != v_new or len(k_new) != 4 or k_new[:2] != (batch, kv_heads) \
                or k_new[3] != d or k_new[2] < 1:
            raise ValueError(f"k and v (the keys and values to append) must both be (B, H_kv, N_new, d) = ({batch}, "
                             f"{kv_heads}, N_new >= 1, {d}), got {k_new}, {v_new}")
        if seqlens is None:
            raise ValueError("appending k and v needs cache_seqlens: each sequence's keys, after which they go")
        append = k_new[2]
    if table is None:
        if k[0] != batch:
            raise ValueError(f"a contiguous cache is (B, H_kv, N_cap, d) with q's B = {batch}, got {k}")
        problem = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "n_q": n_q, "n_k": k[2], "d": d,
                   "dtype": dtype, "page_size": 0, "pages": 0, "append": append}
        if append > k[2]:
            raise ValueError(f"k and v append {append} keys to a cache of capacity {k[2]}")
        return problem
    if seqlens is None:
        raise ValueError("a paged cache (page_table given) needs cache_seqlens: the keys of each sequence")
    page_size, pages = k[2], k[0]
    if page_size not in PAGE_SIZES:
        raise ValueError(f"the page size (k_cache.shape[2]) must be one of {PAGE_SIZES}, got {page_size}")
    if pages < 1 or table[1][1] < 1:
        raise ValueError(f"a paged cache needs a pool of pages and a page table with a column per page of a sequence: "
                         f"k_cache {k}, page_table {table[1]}")
    if append > table[1][1] * page_size:
        raise ValueError(f"k and v append {append} keys to sequences of at most {table[1][1] * page_size}")
    return {"batch": batch, "heads": heads, "kv_heads": kv_heads, "n_q": n_q, "n_k": table[1][1] * page_size,
            "d": d, "dtype": dtype, "page_size": page_size, "pages": pages, "append": append}


def check_options(n_q: int, causal: str, num_splits: Any) -> None:
    """Unsupported for a top-left causal mask (``causal`` normalized: the new tokens come last, bottom-right),
    ValueError for a bad ``num_splits``."""
    if causal not in ("", "bottom_right"):
        raise Unsupported(f"attention_with_kvcache's causal mask is bottom-right (the new tokens come after the cached "
                          f"ones: causal=True), got causal={causal!r} with N_q = {n_q}")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 0 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be an int from 0 (the plan's choice) to {MAX_SPLITS}, got {num_splits!r}")


def _plan_call(problem: dict[str, Any], ragged: bool, causal: str, scale: float | None, num_splits: int) -> Dispatch:
    check_options(problem["n_q"], causal, num_splits)
    batch, n_k = problem["batch"], problem["n_k"]
    cache = make_kv_cache(batch=batch, n_k=n_k, page_size=problem["page_size"], pages=problem["pages"],
                          append=problem["append"]) if ragged else None
    device = device_id()
    plan = make_decode_plan(N_q=problem["n_q"], N_k=n_k, d=problem["d"], dtype=problem["dtype"], batch=batch,
                            heads=problem["heads"], kv_heads=problem["kv_heads"], splits=num_splits or None,
                            sms=(sm_count_of(device) if device is not None else None) or DECODE_SMS, kv_cache=cache,
                            causal=causal == "bottom_right")
    lead = (batch, problem["heads"])
    return Dispatch("cupy", problem["dtype"], lead, problem["n_q"], n_k, problem["d"],
                    problem["heads"] // problem["kv_heads"], False, (plan,), needed_bytes([plan], False, 1),
                    reference.default_scale(problem["d"]) if scale is None else scale, True)


def kvcache_call(q: Any, k_cache: Any, v_cache: Any, cache_seqlens: Any, page_table: Any, k: Any = None,
                 v: Any = None, *, causal: bool | str, scale: float | None, num_splits: int, return_lse: bool,
                 bfloat16: bool) -> Dispatch:
    """The :class:`Dispatch` of a call of :func:`attention_with_kvcache` (its arguments as given): checked, planned
    and its fast path prepared at its signature's first call, from :data:`KV_CALLS` after."""
    key_arrays = (q, k_cache, v_cache, cache_seqlens, page_table, k, v)
    options = (normalize_causal(causal), scale, num_splits, return_lse, bfloat16)
    try:
        key = (*(None if x is None else array_key(x) for x in key_arrays), *((type(o), o) for o in options),
               device_id())
        hash(key)
    except (AttributeError, TypeError):
        key = None

    def build() -> Dispatch:
        if not isinstance(return_lse, bool):
            raise TypeError(f"return_lse must be True or False, got {return_lse!r}")
        problem = _check(q, k_cache, v_cache, cache_seqlens, page_table, k, v, bfloat16)
        call = _plan_call(problem, cache_seqlens is not None, options[0], check_scale(scale), num_splits)
        require_memory(call.chain, call.needed_bytes, call.lead)
        prepare_fast(call, KV_INPUTS, {"O": tuple(q.shape), "lse": tuple(q.shape[:-1])}, KV_OUTPUTS)
        return call

    return KV_CALLS.lookup(key, build)


def attention_with_kvcache(q: Any, k_cache: Any, v_cache: Any, *, cache_seqlens: Any = None, page_table: Any = None,
                           k: Any = None, v: Any = None, causal: bool | str = False, scale: float | None = None,
                           num_splits: int = 0, return_lse: bool = False, bfloat16: bool = False) -> Any:
    """One decode step: ``softmax(scale · q kᵀ) v`` of each sequence's new query tokens over the keys in its cache.

    q (B, H, N_q, d) cupy float16 (bfloat16: :mod:`iokernels.torch`), C-contiguous. The cache, one of:

    - contiguous: k_cache, v_cache (B, H_kv, N_cap, d); ``cache_seqlens`` (B,) int32 on the device, each sequence's
      keys (0 .. N_cap), or None: every sequence N_cap keys;
    - paged (vLLM's block tables, FlashInfer's HND pages): k_cache, v_cache (pages, H_kv, page_size, d), page_size one
      of 8, 16, ..., 256; ``page_table`` (B, max_pages) int32: key n of sequence b is row n % page_size of page
      page_table[b, n // page_size]; ``cache_seqlens`` required (at most max_pages · page_size each).

    H_kv divides H (grouped-query attention: query head h reads K/V head h // (H / H_kv)); d a multiple of 8 from 16
    to 256. The lengths and the page table stay on the device (a call reads nothing back: it can be captured in a
    CUDA graph); the rows of the cache past a sequence's length may hold anything, NaN included. A sequence of no
    key gives O = 0 and lse −inf. A length past the capacity counts as the capacity, and an appended row past it (or on
    a negative page entry) is not written; a page number past the pool is not checked (read and written out of
    bounds).

    k, v: new keys and values (B, H_kv, N_new, d), q's dtype, written into the cache right after each sequence's
    ``cache_seqlens`` keys (required) before the step attends to the N + N_new keys (FlashAttention's
    flash_attn_with_kvcache(k=, v=); ``cache_seqlens`` is not advanced: the caller adds N_new). The caches are updated
    in place; positions past the capacity are not checked on the device.

    causal: False, or True / "bottom_right": query i of N_q sees the keys up to n − N_q + i of its sequence's n (with
    N_q = 1, every key); top-left raises Unsupported. scale: 1/sqrt(d) by default. num_splits: the splits of the
    keys (0: the plan's choice, by modelled time on this device's SMs; at most 128). Returns O (B, H, N_q, d), and
    lse (B, H, N_q) float32 with ``return_lse``. Runs on sm_90 (the tma kernels) only, on cupy's current stream.
    """
    key_arrays = (q, k_cache, v_cache, cache_seqlens, page_table, k, v)
    call = kvcache_call(*key_arrays, causal=causal, scale=scale, num_splits=num_splits, return_lse=return_lse,
                        bfloat16=bfloat16)
    if launch.counting_active():  # inside count_io: the counting build, its counts logged
        inputs = {"Q": q.reshape(call.chain[0].bh, call.n_q, call.d), "K": k_cache, "V": v_cache}
        inputs.update({n: x for n, x in (("seqlens", cache_seqlens), ("page_table", page_table), ("Knew", k),
                                         ("Vnew", v)) if x is not None})
        shaped = {n: x.reshape(launch.tensor_shape(call.chain[0], n)) for n, x in inputs.items()}
        out = launch.run_plan(call.chain[0], shaped, scale=call.scale).buffers
    else:
        given = tuple(0 if x is None else x.data.ptr for x in key_arrays)
        arrays = run_fast(call, given, cupy_empty(require_cupy()), launch.current_stream(), None)
        out = {n: arrays[i] for n, i in call.outputs.items()}
    return forward_result(call, out, return_lse, False, None)
