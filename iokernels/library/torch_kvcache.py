"""The torch operators of the decode step (issue #23): ``torch.ops.iokernels.attention_with_kvcache`` (the plain step)
and ``torch.ops.iokernels.attention_with_kvcache_append`` (the step that appends k, v to the caches first, which it
declares mutated), behind :func:`iokernels.torch.attention_with_kvcache`, registered through ``torch.library`` at
import with fake implementations; forward only (the plain step's backward raises). Their implementation,
:func:`kvcache_forward`, is :mod:`.torch_ops`'s way: a call signature's first call through
:func:`iokernels.attention_with_kvcache` on cupy views of the tensors' memory, later calls on raw addresses.

Schemas::

    iokernels::attention_with_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? cache_seqlens,
        Tensor? page_table, str causal, float? scale, int num_splits) -> (Tensor out, Tensor lse)
    iokernels::attention_with_kvcache_append(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens,
        Tensor? page_table, Tensor k_new, Tensor v_new, str causal, float? scale, int num_splits)
        -> (Tensor out, Tensor lse)

The arguments and outputs are :func:`iokernels.attention_with_kvcache`'s (``causal`` normalized; lse always).
"""

from __future__ import annotations

from typing import Any

import torch

from ..plan import normalize_causal
from . import kvcache
from . import torch_ops as ops
from .dispatch import TORCH_CALLS

KV_SCHEMA = ("(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? cache_seqlens, Tensor? page_table, str causal, "
             "float? scale, int num_splits) -> (Tensor, Tensor)")
# the decode step that appends k_new, v_new to the cache first: the caches mutated (a second operator, so that the
# plain step's caches are never taken for mutated by torch.compile's functionalization)
KV_APPEND_SCHEMA = ("(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens, Tensor? page_table, "
                    "Tensor k_new, Tensor v_new, str causal, float? scale, int num_splits) -> (Tensor, Tensor)")
KV_DTYPES = (torch.float16, torch.bfloat16)


def dtype_name(t: torch.Tensor) -> str:
    """A tensor's dtype as numpy and cupy spell it ("int32", "float16", "bfloat16")."""
    return str(t.dtype).removeprefix("torch.")


def check_in_place(tensors: dict[str, Any]) -> None:
    """TypeError/ValueError unless each of ``tensors`` (by argument name) is a torch tensor on one CUDA (or meta)
    device, contiguous: what a front end that reads its inputs where they lie (never a copy) takes; the decode step's
    and the variable-length call's (:mod:`.torch_varlen`)."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__module__}.{type(t).__name__}")
        if t.device.type not in ops.DEVICE_TYPES:
            raise ValueError(f"{name} is on {t.device}: iokernels runs on CUDA tensors")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (it is read in place, never copied), got strides "
                             f"{t.stride()} for shape {tuple(t.shape)}")
    if len({t.device for t in tensors.values()}) > 1:
        raise ValueError("the tensors must be on one device, got " + ", ".join(f"{n} on {t.device}"
                                                                           for n, t in tensors.items()))


def check_kv_tensors(q: Any, k_cache: Any, v_cache: Any, cache_seqlens: Any, page_table: Any, k_new: Any = None,
                     v_new: Any = None) -> None:
    """TypeError/ValueError for what :func:`iokernels.attention_with_kvcache` refuses, from metadata only (the fake
    implementation runs it too): torch tensors (the lengths and the page table optional) on one CUDA (or meta)
    device, contiguous (read in place: a cache is never copied), q, k_cache and v_cache of one dtype, float16 or
    bfloat16; the shapes and int32 checked by :func:`.kvcache.cache_problem`, the cupy function's own."""
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    tensors.update((n, t) for n, t in (("cache_seqlens", cache_seqlens), ("page_table", page_table), ("k", k_new),
                                       ("v", v_new)) if t is not None)
    check_in_place(tensors)
    same = (k_cache, v_cache, k_new, v_new)
    if q.dtype not in KV_DTYPES or any(t is not None and t.dtype != q.dtype for t in same):
        raise TypeError(f"q, k_cache, v_cache (and k, v) must be one dtype, torch.float16 or torch.bfloat16, got "
                        f"{', '.join(str(t.dtype) for t in (q, *same) if t is not None)}")
    lengths, pages = (None if t is None else (dtype_name(t), tuple(t.shape)) for t in (cache_seqlens, page_table))
    new = None if k_new is None and v_new is None else tuple(None if t is None else tuple(t.shape)
                                                             for t in (k_new, v_new))
    kvcache.cache_problem(tuple(q.shape), tuple(k_cache.shape), tuple(v_cache.shape), lengths, pages, dtype_name(q),
                          new)


def kvcache_forward(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor | None,
                    page_table: torch.Tensor | None, causal: str, scale: float | None, num_splits: int,
                    keep_lse: bool = True, k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(O, lse) of :func:`iokernels.attention_with_kvcache` on CUDA tensors (the operators' implementation, and the
    eager call's), as :func:`forward`: a signature's first call through the cupy function on views of the tensors'
    memory, later ones on raw addresses; ``keep_lse=False``: lse may be None (written to a scratch buffer). ``k_new``,
    ``v_new``: appended to the caches first (in place)."""
    tensors = (q, k_cache, v_cache, cache_seqlens, page_table, k_new, v_new)
    try:  # num_splits with its type: True == 1, and only the cupy function's check tells them apart
        key = ("kv", *(None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in tensors), causal,
               scale, type(num_splits), num_splits)
        hash(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable option: the checks say so
        key = None
    entry = None if key is None else ops.fast_call(key, q.device)
    if entry is not None:
        given = tuple(0 if t is None else t.data_ptr() for t in tensors)
        arrays = ops.run_torch(entry, tensors[:3], given, None, keep_lse)
        out = entry.call.outputs
        return arrays[out["O"]], arrays[out["lse"]] if keep_lse else None
    check_kv_tensors(*tensors)
    options = {"causal": causal, "scale": scale, "num_splits": num_splits, "return_lse": True,
               "bfloat16": q.dtype == torch.bfloat16}
    with ops.torch_stream(q.device) as (cp, allocator):
        arrays = [None if t is None else ops.as_cupy(cp, t) for t in tensors]
        o, lse = kvcache.attention_with_kvcache(*arrays[:3], cache_seqlens=arrays[3], page_table=arrays[4],
                                                k=arrays[5], v=arrays[6], **options)
        result = allocator.tensor(o, q.dtype), allocator.tensor(lse, torch.float32)
        call = kvcache.kvcache_call(*arrays, **options)
    if key is not None and call.fast is not None:
        TORCH_CALLS.put(key, ops.torch_call(call, tensors[:3]))
    return result


@torch.library.custom_op("iokernels::attention_with_kvcache", mutates_args=(), schema=KV_SCHEMA)
def attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           cache_seqlens: torch.Tensor | None, page_table: torch.Tensor | None, causal: str,
                           scale: float | None, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    return kvcache_forward(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits)


@attention_with_kvcache.register_fake
def _attention_with_kvcache_fake(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits):
    check_kv_tensors(q, k_cache, v_cache, cache_seqlens, page_table)
    kvcache.check_options(q.shape[2], normalize_causal(causal), num_splits)
    return q.new_empty(tuple(q.shape)), q.new_empty(tuple(q.shape[:-1]), dtype=torch.float32)


@torch.library.custom_op("iokernels::attention_with_kvcache_append", mutates_args=("k_cache", "v_cache"),
                         schema=KV_APPEND_SCHEMA)
def attention_with_kvcache_append(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  cache_seqlens: torch.Tensor, page_table: torch.Tensor | None, k_new: torch.Tensor,
                                  v_new: torch.Tensor, causal: str, scale: float | None, num_splits: int
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    return kvcache_forward(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits, k_new=k_new,
                           v_new=v_new)


@attention_with_kvcache_append.register_fake
def _attention_with_kvcache_append_fake(q, k_cache, v_cache, cache_seqlens, page_table, k_new, v_new, causal, scale,
                                        num_splits):
    check_kv_tensors(q, k_cache, v_cache, cache_seqlens, page_table, k_new, v_new)
    kvcache.check_options(q.shape[2], normalize_causal(causal), num_splits)
    return q.new_empty(tuple(q.shape)), q.new_empty(tuple(q.shape[:-1]), dtype=torch.float32)


KV_NO_BACKWARD = ("iokernels.torch.attention_with_kvcache has no backward (a decode step is forward only, as "
                  "FlashAttention's flash_attn_with_kvcache): call it under torch.no_grad() or torch.inference_mode(), "
                  "or on tensors that do not require grad")


def _kvcache_backward(ctx: Any, dout: Any, dlse: Any) -> tuple[None, ...]:
    raise RuntimeError(KV_NO_BACKWARD)


attention_with_kvcache.register_autograd(_kvcache_backward)
# (the append operator mutates its inputs: torch takes no autograd formula for it; the front end refuses a call
# under autograd instead, iokernels.library.torch)
