"""The library: exact attention on cupy or numpy arrays, forward and backward.

``iokernels.attention`` and ``iokernels.attention_backward`` run on the GPU through cupy; numpy in
gives numpy out, cupy in gives cupy out, and every kernel is enqueued on cupy's current stream.
``iokernels.memory_needed`` says, without a GPU, how much device memory a call would allocate: the
figure each call compares with the free device memory before it launches anything (a call that
does not fit raises :class:`DeviceMemoryError`, a ``MemoryError``). PyTorch tensors, with autograd:
:mod:`iokernels.torch`.

Example (no GPU needed): standard attention keeps S and P, N_q x N_k each, in device memory; flash
attention needs O(N).

>>> import iokernels
>>> round(iokernels.memory_needed((1, 1_048_576, 64), dtype="float16", algorithm="standard") / 2**30)
4096
>>> iokernels.memory_needed((1, 1_048_576, 64), dtype="float16") / 2**20   # flash: O and lse
132.0
"""

from __future__ import annotations

import math
from typing import Any

from ..kernels import launch
from ..kernels.runtime import require_cupy
from ..plan import D_MAX, D_MIN, D_MULTIPLE, normalize_causal, normalize_window
from ..plan.dropout import Dropout, next_dropout
from ..plan.fast import FAST_DTYPES, FAST_HEAD_DIMS
from ..plan.variants import check_softcap
from ..simulate import reference
from . import explicit
from .dispatch import CACHE, CUPY_CALLS, Dispatch, call_key, check_scale, dropout_present, memo_key
from .execute import execute
from .fastpath import (
    BWD_INPUTS,
    BWD_OUTPUTS,
    FWD_INPUTS,
    FWD_OUTPUTS,
    cupy_empty,
    fast_ok,
    forward_result,
    mask_array,
    mask_spec,
    memo_call,
    module_of,
    prepare_fast,
    run_fast,
)
from .memory import copied_bytes, needed_bytes, require_memory
from .planning import alibi_for, alibi_values, choose_plan, plan_chain
from .varlen import attention_documents, attention_documents_backward, documents_only

_DTYPES = {"float32": "float32", "float16": "float16"}


# ---------------------------------------------------------------------------------------------
# checks: everything a user can get wrong fails here, before cupy or the GPU is touched

def _kv_group(q: Any, k: Any, v: Any) -> int:
    """Query heads per K/V head: 1, or heads_q / heads_kv when k and v have fewer heads in their last
    leading dim (grouped-query attention: q (..., H_q, N_q, d), k and v (..., H_kv, N_k, d))."""
    if q.ndim < 3 or k.ndim != q.ndim or tuple(k.shape[:-2]) == tuple(q.shape[:-2]):
        return 1
    hq, hk = q.shape[-3], k.shape[-3]
    if (hk < 1 or tuple(k.shape[:-3]) != tuple(q.shape[:-3]) or tuple(v.shape[:-2]) != tuple(k.shape[:-2])
            or hq % hk):
        return 1  # not grouped-query: _check reports the mismatch
    return hq // hk


def _check(arrays: dict[str, Any], n_names: dict[str, str], kv_group: int = 1, bfloat16: bool = False
           ) -> tuple[str, str, tuple[int, ...], int, int, int]:
    """Validate shapes (..., N, d) and dtypes; return (module, plan dtype, leading dims, N_q, N_k, d).
    k and v have 1/kv_group of q's heads in their last leading dim when kv_group > 1. ``bfloat16``
    (:mod:`iokernels.torch`): the arrays are cupy uint16 holding bfloat16 bits."""
    mods = {module_of(x) for x in arrays.values()}
    if len(mods) != 1:
        raise TypeError(f"mixed array types: {', '.join(sorted(mods))}; pass all numpy or all cupy arrays")
    dtypes = {name: str(x.dtype) for name, x in arrays.items()}
    if len(set(dtypes.values())) != 1:
        raise TypeError(f"mixed dtypes: {dtypes}; pass one dtype for all")
    dtype = next(iter(dtypes.values()))
    allowed = {"uint16": "bfloat16"} if bfloat16 else _DTYPES
    if dtype not in allowed:
        raise TypeError(f"unsupported dtype {dtype}: expected float32 or float16 (bfloat16: through "
                        "iokernels.torch, since numpy and cupy have no bfloat16)")
    q = arrays["q"]
    if q.ndim < 2:
        raise ValueError(f"q must have shape (..., N, d), got {q.shape}")
    lead, d = tuple(q.shape[:-2]), q.shape[-1]
    extents: dict[str, int] = {}
    kv_lead = (*lead[:-1], lead[-1] // kv_group) if kv_group > 1 else lead
    for name, x in arrays.items():
        if x.ndim != q.ndim or tuple(x.shape[:-2]) != (kv_lead if name in ("k", "v") else lead):
            raise ValueError(f"shape mismatch: {name} {tuple(x.shape)} vs q {tuple(q.shape)} (leading batch/head "
                             "dims must be equal, or k and v may have fewer heads in the last one, dividing q's)")
        if x.shape[-1] != d:
            raise ValueError(f"shape mismatch: {name} has head dim {x.shape[-1]}, q has {d}")
        extent, key = x.shape[-2], n_names[name]
        if extents.setdefault(key, extent) != extent:
            raise ValueError(f"shape mismatch: {name} {tuple(x.shape)} has {extent} rows, expected {extents[key]}")
    if not (D_MIN <= d <= D_MAX) or d % D_MULTIPLE:
        raise ValueError(f"unsupported head dimension d={d}: expected a multiple of {D_MULTIPLE} "
                         f"from {D_MIN} to {D_MAX}")
    n_q, n_k = extents["q"], extents["k"]
    if n_q < 1 or n_k < 1:
        raise ValueError(f"sequence lengths must be >= 1, got N_q={n_q}, N_k={n_k}")
    if math.prod(lead) < 1:
        raise ValueError(f"leading batch/head dims must not be empty, got {lead}")
    return mods.pop(), allowed[dtype], lead, n_q, n_k, d


def _check_options(scale: Any, **flags: Any) -> float | None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    if flags.get("graph") and launch.counting_active():
        raise ValueError("graph=True runs the plain build; inside count_io() pass graph=False")
    return check_scale(scale)


def _forward_dropout(dropout: Any, draw: bool = True) -> Dropout | None:
    """attention's ``dropout``: a probability (0: none; else the library's seed and its next offset) or a
    :class:`iokernels.plan.dropout.Dropout` used as given. ``draw=False``: a Dropout of that probability at
    seed and offset 0, for planning (the plan does not depend on them), drawing nothing."""
    if dropout is None or isinstance(dropout, Dropout):
        return dropout
    from ..plan.dropout import check_p

    p = check_p(dropout)
    if p == 0:
        return None
    return next_dropout(p) if draw else Dropout(p, 0, 0)


def _backward_dropout(dropout: Any) -> Dropout | None:
    if dropout is None or isinstance(dropout, Dropout):
        return dropout
    raise TypeError("attention_backward's dropout must be the iokernels.plan.dropout.Dropout the forward used "
                    f"(attention(..., return_dropout=True)), got {type(dropout).__name__} {dropout!r}")


def memory_needed(q_shape: tuple[int, ...], k_shape: tuple[int, ...] | None = None, *, dtype: str = "float16",
                  algorithm: str = "flash", schedule: str | None = None, backward: bool = False,
                  causal: bool | str = False, sram: int | str | None = None,
                  window: tuple[int | None, int | None] | None = None) -> int:
    """Device bytes that ``attention`` (``backward=True``: ``attention_backward``) allocates beyond
    its inputs for q of shape ``q_shape`` and k, v of ``k_shape`` (default: ``q_shape``; fewer heads
    for grouped-query attention) of ``dtype`` ("float32", "float16" or "bfloat16"), on the plan the
    call would run on the current device (the H200's without a GPU). No GPU needed.

    It is the plan's own buffers, exactly (intermediates, workspace, outputs; the standard backward
    also runs the standard forward to recompute P, and counts the larger of the two), plus the K/V
    copies of grouped-query attention where the plan does not take it natively. Before launching,
    every call compares this figure, plus any copies of numpy or non-contiguous inputs, with the
    device's free memory (cupy's pool included) and raises :class:`DeviceMemoryError` ("needs X GB,
    device has Y GB free ...") when it does not fit. algorithm, schedule (forward only: the
    backward picks its own), causal, sram and window as :func:`attention` (a window the call would refuse
    raises the same error here).
    """
    import numpy as np

    causal, window = normalize_causal(causal), normalize_window(window)
    _check_options(None, backward=backward)
    storage = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
    if dtype not in storage:
        raise ValueError(f"unsupported dtype {dtype!r}: expected one of {', '.join(storage)}")

    def shaped(shape: tuple[int, ...]) -> np.ndarray:  # an array of that shape and dtype, of no memory
        return np.lib.stride_tricks.as_strided(np.zeros(1, storage[dtype]), tuple(shape), (0,) * len(shape))

    q = shaped(q_shape)
    k = q if k_shape is None else shaped(k_shape)
    group = _kv_group(q, k, k)
    arrays = {"q": q, "k": k, "v": k} if not backward else {"q": q, "k": k, "v": k, "o": q, "do": q}
    _, dtype, lead, n_q, n_k, d = _check(arrays, {"q": "q", "k": "k", "v": "k", "o": "q", "do": "q"}, group,
                                         bfloat16=dtype == "bfloat16")
    plan, expand = choose_plan("bwd" if backward else "fwd", algorithm, None if backward else schedule, n_q, n_k,
                               d, dtype, lead, sram, group, causal, window=window)
    return needed_bytes(plan_chain(plan, algorithm, n_q, n_k, d, dtype, lead, sram, causal, window), expand, group)


def _to_device(cp: Any, x: Any, shape: tuple[int, ...]) -> Any:
    return cp.ascontiguousarray(cp.asarray(x)).reshape(shape)


def _group_sum(cp: Any, x: Any, group: int, dtype: str) -> Any:
    """Sum rows (heads) r*group ... r*group + group - 1 of x (heads, N, d): dK, dV of expanded K, V."""
    x = x.reshape(-1, group, *x.shape[1:])
    if dtype == "bfloat16":  # uint16 bits
        return launch.to_device((x.astype(cp.uint32) << 16).view(cp.float32).sum(axis=1), "bfloat16")
    return x.sum(axis=1, dtype=cp.float32).astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# the public calls

def attention(q: Any, k: Any, v: Any, *, algorithm: str = "flash", schedule: str | None = None,
              causal: bool | str = False, scale: float | None = None, sram: int | str | None = None,
              return_lse: bool = False, graph: bool = False, block_mask: Any = None, mask: Any = None,
              dropout: float | Dropout = 0.0, return_dropout: bool = False,
              window: tuple[int | None, int | None] | None = None, documents: Any = None,
              softcap: float | None = None, alibi_slopes: Any = None) -> Any:
    """Exact attention ``softmax(scale * q kᵀ) v`` on the GPU.

    Shapes: q (..., N_q, d); k and v (..., N_k, d), with any number of leading batch/head dims, equal
    for q, k and v; or, grouped-query attention, q (..., H_q, N_q, d) and k, v (..., H_kv, N_k, d)
    with H_kv dividing H_q, where query head h uses K/V head h // (H_q / H_kv). d is a multiple of 8
    from 16 to 256. N_q, N_k >= 1, any value (no alignment needed).

    dtypes: float32 or float16, the same for all (bfloat16: :mod:`iokernels.torch`). numpy inputs are
    copied to the GPU and the results come back as numpy; cupy in gives cupy out. Inputs need not be
    contiguous (such inputs are copied first). The kernels run on cupy's current stream
    (``with cupy.cuda.Stream(): ...``) and the call does not synchronize it for cupy inputs.

    algorithm: "flash" (default), "two_pass" or "standard". schedule: for flash, "fast" (tensor cores: float16
    with d of 64 or 128, the forward on sm_90 every multiple of 8 up to 256; the default there), "q_outer" (the
    FlashAttention-2 order on CUDA cores, the default elsewhere) or "kv_outer" (the paper's Algorithm 1); for two_pass,
    "store" (default) or "recompute". Flash needs O(N) device memory beyond inputs and outputs;
    standard and two_pass "store" keep N_q x N_k scores per head (:func:`memory_needed`). A call
    that would need more device memory than is free raises :class:`DeviceMemoryError`
    ("needs X GB, device has Y GB free") before anything is launched.

    Grouped-query attention runs natively on the tensor-core flash forward (each K/V head read by its
    query heads); elsewhere K and V are expanded to q's heads (each head repeated H_q / H_kv times)
    and the ordinary plan runs, so its time and bytes are those of the expanded problem.

    causal: False (default), True, "bottom_right" or "top_left". True means **bottom-right**
    alignment (as FlashAttention-2 and torch's ``causal_lower_right``): query i sees key j iff
    j <= i + N_k - N_q, so the last query sees every key (decoding with a KV cache). "top_left" is
    torch's ``is_causal=True``: j <= i. With bottom-right and N_q > N_k the first N_q - N_k queries
    see no key: their output rows are 0 and their lse −inf. Flash and two_pass skip the blocks that
    are entirely masked; standard attention computes them.

    window: a sliding window (left, right), FlashAttention-2's ``window_size``: query i sees key j iff
    i + o − left <= j <= i + o + right, with o = N_k − N_q (the bottom-right offset, as causal=True); None or −1
    leaves a side unbounded, and None or (−1, −1) is no window (each side otherwise an int >= 0; anything else
    raises ValueError before the GPU). With causal both apply (the intersection: (left, 0) is causal=True's mask
    cut to the last left + 1 keys). Rows that see no key give 0 and lse −inf. It runs on the tensor-core path
    only, forward and backward (:func:`attention_backward` takes the same window): flash with schedule "fast"
    (the one chosen with no schedule given), the sm_90 tma kernels (H100, H200), float16 (bfloat16 through
    :mod:`iokernels.torch`), d a multiple of 8 up to 256, with grouped-query attention and dropout; key tiles
    wholly outside the band are skipped. Anything else (float32, another algorithm or schedule, another GPU, a
    mask or block_mask, deterministic=True) raises :class:`iokernels.plan.Unsupported` (a ValueError) before any
    launch; it never runs unmasked.

    softcap: a number c > 0 caps the logits, ``c · tanh(scale * q kᵀ / c)`` before the softmax (Gemma 2's attention
    softcapping; None: none), forward and backward (:func:`attention_backward` takes the same softcap). Like a window
    it runs on the tensor-core path's sm_90 tma kernels only (float16, bfloat16 through :mod:`iokernels.torch`, d up
    to 256 forward and 128 backward, causal and windows included, not dropout or masks); anything else raises
    :class:`iokernels.plan.Unsupported` before any launch.

    alibi_slopes: ALiBi (FlashAttention-2's ``alibi_slopes``): one slope per head, H numbers (every batch row alike)
    or one per batch row and head, ``prod(leading dims)`` numbers (a sequence, a numpy array; values >= 0, read on the
    host, part of the call's plan like a block mask: constants of the model, not per-call data); the logits of query
    i and key j get −slope · |j − i − (N_k − N_q)|, forward and backward. It runs on the sm_90 tma kernels (flash
    "fast", float16, bfloat16 through :mod:`iokernels.torch`, d up to 128; with causal, windows, block masks,
    grouped-query attention and dropout; not with a softcap); anything else raises :class:`iokernels.plan.Unsupported`.

    documents: document masking, the lengths (n_1, ..., n_D) of documents packed one after another along N (N_q = N_k
    = their sum; the same for every batch row and head): query i sees key j iff both lie in one document
    (FlexAttention's ``document_id[q_idx] == document_id[kv_idx]``), and with causal also j <= i. It runs the sm_90
    variable-length tma kernels on the arrays where they lie (cupy, C-contiguous, float16; bfloat16 through
    :mod:`iokernels.torch`; d a multiple of 8 up to 256; grouped-query attention), each document tiled on its own
    (iokernels.plan.varlen.make_documents_plan), forward and backward (:func:`attention_backward` takes the same
    documents). Other algorithms, schedules, masks, windows, dropout or graph raise ValueError before any launch.

    block_mask: an :class:`iokernels.plan.masks.BlockMask` (block-sparse attention, the paper's Algorithm
    5; e.g. ``iokernels.plan.masks.pattern("local", 0.25, n_q=N_q, n_k=N_k)``), the same for every batch
    and head: key j is visible to query i iff its block is nonzero (and causal allows it). Flash
    (q_outer, kv_outer) and two_pass skip the zero blocks; the tensor-core path and standard
    attention do not take it (flash runs "q_outer" when no schedule is given). Rows that see no key
    give 0 and lse −inf.

    mask: an explicit mask, a numpy or cupy array broadcastable to (..., N_q, N_k): boolean (False hides the
    key) or floating point (added to scale * q kᵀ; −inf hides the key). A numpy mask's values are checked (NaN
    and +inf are refused); a cupy mask stays on the device, unread by the host (NaN or +inf in it give NaN rows,
    as in torch's SDPA). On sm_90 GPUs a float16 (or bfloat16, through :mod:`iokernels.torch`) call with d a
    multiple of 8 up to 128, flash with no schedule, no dropout, window, softcap or ALiBi runs the tma kernels
    with the mask read where it lies, in its dtype (:mod:`iokernels.library.explicit`: a programmable variant,
    ``mask[i] != 0`` or ``score + mask[i]``; its bytes are the variant's "captures"); elsewhere flash "q_outer"
    (forward) and "kv_outer" (backward) read it as float32 or bytes, one element per computed score and
    batch-head (counted and modelled; a mask with no leading dims, or all 1, stored once and shared). It combines
    with causal and block_mask. Rows that see no key give 0 and lse −inf.

    dropout: dropout on the attention probabilities, ``softmax(...) ∘ Z`` with Z 0 where an element
    is dropped and 1/(1 − p) where kept (the paper's P^dropped): a probability p in [0, 1) (0, the
    default: none), drawn from the library's Philox stream (its seed, random per process unless
    :func:`iokernels.plan.dropout.manual_seed` set it, and the next offset), or an
    :class:`iokernels.plan.dropout.Dropout` (p, seed, offset) used as given. The mask is a pure function of
    (seed, offset, batch·head, row, column), never stored: the backward regenerates it from the
    Dropout the forward used, which ``return_dropout=True`` returns; every algorithm draws the same
    mask for one Dropout. lse is that of the undropped probabilities.

    scale: the softmax scale, a number > 0, default 1/sqrt(d). sram: M, the shared memory per thread block the
    plan may use (bytes, or a size such as "96KB"; default 96 KB, for "fast" the device's limit;
    never above the device's limit; with no schedule given, an M too small for the tensor-core tiles runs
    the research schedule in that M). return_lse: also return the row logsumexp (..., N_q), float32.

    graph: capture the call's kernel launches into a CUDA graph the first time these plans meet
    inputs at these device addresses, and replay it when they meet them again (a loop over the same
    or recycled buffers): one launch instead of one per kernel stage, for the multi-kernel plans
    (standard, two_pass, kv_outer) at small N. The outputs are copied out of the graph's buffers.
    Up to ``MAX_GRAPHS`` graphs (and their workspace) are kept; :func:`clear_graphs` drops them. Not
    inside :func:`iokernels.count_io`, and not for concurrent calls on several streams.

    Returns O (..., N_q, d) in the input dtype; with return_lse (O, lse); with return_dropout also the
    Dropout used (None without dropout) last: (O, dropout) or (O, lse, dropout).

    Bad input raises TypeError or ValueError before anything reaches the GPU.

    Example (GPU):

    >>> import cupy as cp, iokernels
    >>> rng = cp.random.default_rng(0)
    >>> q = rng.standard_normal((2, 8, 1000, 64), dtype=cp.float32).astype(cp.float16)
    >>> k, v = (rng.standard_normal((2, 2, 1000, 64), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    >>> o, lse = iokernels.attention(q, k, v, causal=True, return_lse=True)   # 8 query heads, 2 K/V heads
    >>> o.shape, o.dtype, lse.shape
    ((2, 8, 1000, 64), dtype('float16'), (2, 8, 1000))
    >>> import numpy as np
    >>> want, _ = iokernels.simulate.reference.forward(*(np.repeat(cp.asnumpy(x).astype(np.float64), r, axis=1)
    ...                                         for x, r in ((q, 1), (k, 4), (v, 4))), causal=True)
    >>> bool(np.abs(cp.asnumpy(o) - want).max() < 1e-2)
    True
    """
    if documents is not None:
        documents_only(algorithm=algorithm, schedule=schedule, sram=sram, graph=graph, block_mask=block_mask,
                       mask=mask, dropout=dropout, return_dropout=return_dropout, window=window, softcap=softcap,
                       alibi_slopes=alibi_slopes)
        scale = _check_options(scale, return_lse=return_lse)
        return attention_documents(q, k, v, documents, causal=causal, scale=scale, return_lse=return_lse,
                                   dense=attention_arrays)
    return attention_arrays(q, k, v, algorithm=algorithm, schedule=schedule, causal=causal, scale=scale, sram=sram,
                            return_lse=return_lse, graph=graph, block_mask=block_mask, mask=mask, dropout=dropout,
                            return_dropout=return_dropout, window=window, softcap=softcap,
                            alibi_slopes=alibi_slopes)


def forward_call(q: Any, k: Any, v: Any, *, algorithm: str, schedule: str | None, causal: str, scale: float | None,
                 sram: Any, bfloat16: bool, block_mask: Any, mask: Any, dropout: Any, window: Any = None,
                 softcap: float | None = None, alibi: tuple[float, ...] | None = None) -> Dispatch:
    """The :class:`Dispatch` of a forward call (``causal`` and ``window`` normalized, ``scale`` checked): planned
    and checked at its signature's first call, from the cache after."""
    def plan_call() -> Dispatch:  # the checks and the plan, once per call signature (.dispatch)
        group = _kv_group(q, k, v)
        mod, dtype, lead, n_q, n_k, d = _check({"q": q, "k": k, "v": v}, {"q": "q", "k": "k", "v": "k"}, group,
                                               bfloat16)
        spec = mask_spec(mask, lead, n_q, n_k)
        plan, expand = choose_plan("fwd", algorithm, schedule, n_q, n_k, d, dtype, lead, sram, group, causal,
                                   block_mask=block_mask, mask=spec, dropout=_forward_dropout(dropout, draw=False),
                                   window=window, softcap=softcap, alibi=alibi_for(alibi, lead))
        return Dispatch(mod, dtype, lead, n_q, n_k, d, group, expand, (plan,),
                        needed_bytes([plan], expand, group) + copied_bytes([q, k, v]),
                        reference.default_scale(d) if scale is None else scale,
                        fast_ok([q, k, v] if mask is None else [q, k, v, mask], (plan,), expand))

    key = call_key("fwd", (q, k, v), mask, algorithm=algorithm, schedule=schedule, causal=causal, scale=scale,
                   sram=sram, bfloat16=bfloat16, block_mask=block_mask, dropout=dropout_present(dropout), window=window,
                   softcap=softcap, alibi=alibi)
    return CACHE.lookup(key, plan_call)


def _checked(arrays: tuple[Any, ...], causal: Any, scale: Any, bfloat16: bool) -> tuple[str, float | None]:
    """A routed call's inputs checked as any call's (:func:`iokernels.library.explicit.run`); its causal and scale
    normalized."""
    q, k, v = arrays[:3]
    _check({"q": q, "k": k, "v": v}, {"q": "q", "k": "k", "v": "k"}, _kv_group(q, k, v), bfloat16)
    return normalize_causal(causal), _check_options(scale)


def attention_arrays(q: Any, k: Any, v: Any, *, algorithm: str = "flash", schedule: str | None = None,
                     causal: bool | str = False, scale: float | None = None, sram: int | str | None = None,
                     return_lse: bool = False, graph: bool = False, bfloat16: bool = False, block_mask: Any = None,
                     mask: Any = None, dropout: float | Dropout = 0.0, return_dropout: bool = False,
                     window: Any = None, softcap: Any = None, alibi_slopes: Any = None) -> Any:
    if window is not None:  # normalized first: a bad window fails here, and windows equal once normalized share keys
        window = normalize_window(window)
    softcap, alibi = check_softcap(softcap), alibi_values(alibi_slopes)
    if not return_dropout and explicit.takes(q, mask, algorithm=algorithm, schedule=schedule, graph=graph,
                                             dropout=dropout, window=window, softcap=softcap, alibi=alibi,
                                             bfloat16=bfloat16):
        routed = explicit.run("fwd", (q, k, v), mask, causal, scale, block_mask, bfloat16, _checked)
        if routed is not None:
            return routed if return_lse else routed[0]
    memo = None  # a call with no mask, dropout or graph: its arguments as given find its fast path (CUPY_CALLS)
    if mask is None and block_mask is None and not graph and type(dropout) in (float, int) and dropout == 0:
        memo = memo_key((q, k, v), ("fwd", algorithm, schedule, causal, scale, sram, return_lse, bfloat16,
                                    return_dropout, window, softcap, alibi))
    call = memo_call(memo)  # found: checked at its first call, and it has a fast path
    if call is None:
        causal = normalize_causal(causal)
        scale = _check_options(scale, return_lse=return_lse, graph=graph, return_dropout=return_dropout)
        call = forward_call(q, k, v, algorithm=algorithm, schedule=schedule, causal=causal, scale=scale, sram=sram,
                            bfloat16=bfloat16, block_mask=block_mask, mask=mask, dropout=dropout, window=window,
                            softcap=softcap, alibi=alibi)
        if memo is not None and call.fast is not None:
            CUPY_CALLS.put(memo, call)
    if call.fast is not None and not graph and not launch.counting_active():  # the fast path
        drop = None if memo is not None else _forward_dropout(dropout)  # a memo's call has no dropout
        device_mask = mask_array(mask, call.chain[0].mask, call.lead, call.n_q, call.n_k)
        given = (q.data.ptr, k.data.ptr, v.data.ptr, 0 if device_mask is None else device_mask.data.ptr)
        arrays = run_fast(call, given, cupy_empty(require_cupy()), launch.current_stream(), drop)
        return forward_result(call, {n: arrays[i] for n, i in call.outputs.items()}, return_lse, return_dropout,
                              drop)
    lead, n_q, n_k, d, group = call.lead, call.n_q, call.n_k, call.d, call.group
    drop = _forward_dropout(dropout)
    chain = call.chain_for(drop)
    plan = chain[0]
    device_mask = mask_array(mask, plan.mask, lead, n_q, n_k)
    cp = require_cupy()
    require_memory(chain, call.needed_bytes + (0 if device_mask is None else device_mask.nbytes), lead)
    rows_kv = plan.bh_kv // group if call.expand else plan.bh_kv
    inputs = {"Q": _to_device(cp, q, (plan.bh, n_q, d)), "K": _to_device(cp, k, (rows_kv, n_k, d)),
              "V": _to_device(cp, v, (rows_kv, n_k, d))}
    if call.expand:
        inputs["K"], inputs["V"] = (cp.repeat(inputs[n], group, axis=0) for n in ("K", "V"))
    if device_mask is not None:
        inputs["mask"] = device_mask
    out = execute(chain, inputs, call.scale, graph, ("O", "lse", "m", "l") if return_lse else ("O",), call.raws)
    if call.fast_ok and call.fast is None and not launch.counting_active():
        prepare_fast(call, FWD_INPUTS, {"O": (*lead, n_q, d), "lse": (*lead, n_q)}, FWD_OUTPUTS)
    result = forward_result(call, out, return_lse, return_dropout, drop)
    if call.module == "numpy":
        return tuple(cp.asnumpy(x) if i < 1 + return_lse else x for i, x in enumerate(result)) \
            if isinstance(result, tuple) else cp.asnumpy(result)
    return result


def attention_backward(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any, *, algorithm: str = "flash",
                       causal: bool | str = False, scale: float | None = None, sram: int | str | None = None,
                       deterministic: bool = False, graph: bool = False, block_mask: Any = None, mask: Any = None,
                       dropout: Dropout | None = None, window: tuple[int | None, int | None] | None = None,
                       documents: Any = None, softcap: float | None = None, alibi_slopes: Any = None
                       ) -> tuple[Any, Any, Any]:
    """Gradients (dq, dk, dv) of ``o = attention(q, k, v)`` given ``do = dL/do``.

    Shapes as :func:`attention` (grouped-query attention included): q, o and do (..., N_q, d); k and
    v (..., N_k, d) or (..., H_kv, N_k, d); lse (..., N_q) float32, from
    ``attention(..., return_lse=True)`` with the same causal and scale. dtypes, numpy/cupy, streams,
    sram, graph and the memory check as :func:`attention`.

    algorithm: "flash" (default; the FlashAttention-2 backward: a D = rowsum(dO∘O) pre-pass, a
    K/V-outer pass that recomputes P from lse and adds dQ in float32 with atomics, and dQ rounded) or
    "standard" (the paper's Algorithm 3, through HBM; it first reruns the standard forward to get
    P). Flash uses the tensor-core backward (schedule "fast") for float16 with d of 64 or 128 (on sm_90 every
    multiple of 8 up to 256), else the research kernel ("kv_outer"). deterministic=True (the tensor-core path
    only, d of 64 or 128, not causal): dQ from a query-outer kernel instead of float32 atomics, so gradients
    are bitwise identical run to run (about 25% slower).

    causal: as :func:`attention` (True is the bottom-right alignment), the same as the forward that
    produced o and lse; queries that see no key get dq = 0 and add nothing to dk, dv. Causal runs
    the tensor-core backward's sm_90 kernel (tma); elsewhere (its mma.sync kernel has no mask)
    causal gradients come from "kv_outer". block_mask: as :func:`attention`, the same as the
    forward's; block-sparse gradients come from "kv_outer" (not deterministic=True). mask: as
    :func:`attention`, the same as the forward's (gradients from "kv_outer", not deterministic=True).
    dropout: the :class:`iokernels.plan.dropout.Dropout` the forward used (``attention(...,
    return_dropout=True)``), or None; the backward regenerates its mask (not deterministic=True). window: as
    :func:`attention`, the same as the forward's: the sm_90 tma backward (float16, d up to 256; not
    deterministic=True) skips the key/query tile pairs outside the band; keys no query sees get dk = dv = 0.
    documents: as :func:`attention`, the same as the forward's (the variable-length tma backward on the arrays where
    they lie; lse shaped as q's leading dims and N). softcap: as :func:`attention`, the forward's (dS times 1 − tanh²;
    the tma backward up to d 128, not deterministic=True). alibi_slopes: as :func:`attention`, the forward's (the tma
    backward, at most 32 query heads per K/V head, not deterministic=True).

    Grouped-query attention: natively on the tensor-core backward where its kernel takes it (sm_90);
    elsewhere K and V are expanded to q's heads, the ordinary backward runs, and dk, dv are the sums
    of the expanded gradients over each group of query heads (float32 sums of the per-head
    gradients, rounded once), with the time and bytes of the expanded problem.

    Returns dq (..., N_q, d) and dk, dv shaped like k and v, in the input dtype, numpy or cupy like
    the inputs.

    Example (GPU):

    >>> import cupy as cp, iokernels
    >>> rng = cp.random.default_rng(0)
    >>> q, k, v, do = (rng.standard_normal((4, 500, 64), dtype=cp.float32) for _ in range(4))
    >>> o, lse = iokernels.attention(q, k, v, return_lse=True)
    >>> dq, dk, dv = iokernels.attention_backward(q, k, v, o, do, lse)
    >>> import numpy as np
    >>> want = iokernels.simulate.reference.backward(*(cp.asnumpy(x).astype(np.float64) for x in (q, k, v, do)))
    >>> [bool(np.abs(cp.asnumpy(g) - w).max() < 1e-4 * np.abs(w).max()) for g, w in zip((dq, dk, dv), want)]
    [True, True, True]
    """
    if documents is not None:
        documents_only(algorithm=algorithm, sram=sram, graph=graph, block_mask=block_mask, mask=mask,
                       dropout=dropout, window=window, deterministic=deterministic, softcap=softcap,
                       alibi_slopes=alibi_slopes)
        return attention_documents_backward(do, q, k, v, o, lse, documents, causal=causal, scale=check_scale(scale),
                                            dense=attention_backward_arrays)
    return attention_backward_arrays(q, k, v, o, do, lse, algorithm=algorithm, causal=causal, scale=scale, sram=sram,
                                     deterministic=deterministic, graph=graph, block_mask=block_mask, mask=mask,
                                     dropout=dropout, window=window, softcap=softcap, alibi_slopes=alibi_slopes)


def backward_call(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any, *, algorithm: str, causal: str,
                  scale: float | None, sram: Any, deterministic: bool, bfloat16: bool, block_mask: Any, mask: Any,
                  dropout: Any, window: Any = None, softcap: float | None = None,
                  alibi: tuple[float, ...] | None = None) -> Dispatch:
    """The :class:`Dispatch` of a backward call, as :func:`forward_call`."""
    def plan_call() -> Dispatch:  # the checks and the plans, once per call signature (.dispatch)
        group = _kv_group(q, k, v)
        mod, dtype, lead, n_q, n_k, d = _check({"q": q, "k": k, "v": v, "o": o, "do": do},
                                               {"q": "q", "k": "k", "v": "k", "o": "q", "do": "q"}, group, bfloat16)
        module_of(lse)
        lse_shape = (*lead, n_q)
        if tuple(lse.shape) != lse_shape or str(lse.dtype) != "float32":
            raise ValueError(f"lse must be float32 of shape {lse_shape}, got {lse.dtype} {tuple(lse.shape)}")
        if deterministic and (causal or window is not None):
            raise ValueError(f"deterministic=True has no {'causal' if causal else 'sliding-window'} kernel: its "
                             "kernels (mma.sync) take no mask")
        if deterministic and (block_mask is not None or mask is not None):
            raise ValueError("deterministic=True has no masked kernel: its kernels (mma.sync) take no block or "
                             "explicit mask")
        spec = mask_spec(mask, lead, n_q, n_k)
        drop = _backward_dropout(dropout)
        if deterministic and drop is not None:
            raise ValueError("deterministic=True has no dropout kernel: its kernels (mma.sync) take no dropout")
        if deterministic and not (algorithm == "flash" and dtype in FAST_DTYPES and d in FAST_HEAD_DIMS):
            raise ValueError("deterministic=True needs the tensor-core flash backward: float16 with d in "
                             f"{FAST_HEAD_DIMS} (the other backward passes add dQ with float atomics)")
        plan, expand = choose_plan("bwd", algorithm, None, n_q, n_k, d, dtype, lead, sram, group, causal,
                                   deterministic, block_mask, spec, drop, window, softcap, alibi_for(alibi, lead))
        chain = plan_chain(plan, algorithm, n_q, n_k, d, dtype, lead, sram, causal, window)
        arrays = [q, k, v, o, do, lse] if mask is None else [q, k, v, o, do, lse, mask]
        return Dispatch(mod, dtype, lead, n_q, n_k, d, group, expand, tuple(chain),
                        needed_bytes(chain, expand, group) + copied_bytes([q, k, v, o, do, lse]),
                        reference.default_scale(d) if scale is None else scale, fast_ok(arrays, tuple(chain), expand))

    key = call_key("bwd", (q, k, v, o, do, lse), mask, algorithm=algorithm, causal=causal, scale=scale, sram=sram,
                   deterministic=deterministic, bfloat16=bfloat16, block_mask=block_mask,
                   dropout=dropout is not None, window=window, softcap=softcap, alibi=alibi)
    return CACHE.lookup(key, plan_call)


def attention_backward_arrays(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any, *, algorithm: str = "flash",
                        causal: bool | str = False, scale: float | None = None, sram: int | str | None = None,
                        deterministic: bool = False, graph: bool = False, bfloat16: bool = False,
                        block_mask: Any = None, mask: Any = None, dropout: Dropout | None = None, window: Any = None,
                        softcap: Any = None, alibi_slopes: Any = None) -> tuple[Any, Any, Any]:
    if window is not None:  # as attention_arrays's
        window = normalize_window(window)
    softcap, alibi = check_softcap(softcap), alibi_values(alibi_slopes)
    if explicit.takes(q, mask, algorithm=algorithm, schedule=None, graph=graph, dropout=dropout, window=window,
                      softcap=softcap, alibi=alibi, deterministic=deterministic, bfloat16=bfloat16):
        routed = explicit.run("bwd", (q, k, v, o, do, lse), mask, causal, scale, block_mask, bfloat16, _checked)
        if routed is not None:
            return routed
    memo = None  # as attention_arrays's
    if mask is None and block_mask is None and not graph and dropout is None:
        memo = memo_key((q, k, v, o, do, lse), ("bwd", algorithm, causal, scale, sram, deterministic, bfloat16,
                                                window, softcap, alibi))
    call = memo_call(memo)
    if call is None:
        causal = normalize_causal(causal)
        scale = _check_options(scale, deterministic=deterministic, graph=graph)
        call = backward_call(q, k, v, o, do, lse, algorithm=algorithm, causal=causal, scale=scale, sram=sram,
                             deterministic=deterministic, bfloat16=bfloat16, block_mask=block_mask, mask=mask,
                             dropout=dropout, window=window, softcap=softcap, alibi=alibi)
        if memo is not None and call.fast is not None:
            CUPY_CALLS.put(memo, call)
    if call.fast is not None and not graph and not launch.counting_active():  # the fast path
        device_mask = mask_array(mask, call.chain[0].mask, call.lead, call.n_q, call.n_k)
        given = (q.data.ptr, k.data.ptr, v.data.ptr, do.data.ptr, o.data.ptr, lse.data.ptr,
                 0 if device_mask is None else device_mask.data.ptr)
        arrays = run_fast(call, given, cupy_empty(require_cupy()), launch.current_stream(), _backward_dropout(dropout))
        return tuple(arrays[call.outputs[n]] for n in ("dQ", "dK", "dV"))
    kv_shape = (*k.shape[:-2], call.n_k, call.d)
    mod, dtype, lead, n_q, n_k, d, group, expand = (call.module, call.dtype, call.lead, call.n_q, call.n_k,
                                                    call.d, call.group, call.expand)
    chain = call.chain_for(_backward_dropout(dropout))
    plan = chain[-1]
    device_mask = mask_array(mask, plan.mask, lead, n_q, n_k)
    cp = require_cupy()
    require_memory(chain, call.needed_bytes + (0 if device_mask is None else device_mask.nbytes), lead)
    bh, rows_kv = plan.bh, plan.bh_kv // group if expand else plan.bh_kv
    inputs = {"Q": _to_device(cp, q, (bh, n_q, d)), "K": _to_device(cp, k, (rows_kv, n_k, d)),
              "V": _to_device(cp, v, (rows_kv, n_k, d)), "dO": _to_device(cp, do, (bh, n_q, d))}
    if expand:
        inputs["K"], inputs["V"] = (cp.repeat(inputs[n], group, axis=0) for n in ("K", "V"))
    if device_mask is not None:
        inputs["mask"] = device_mask
    if algorithm != "standard":
        inputs["O"] = _to_device(cp, o, (bh, n_q, d))
        inputs["lse"] = _to_device(cp, lse, (bh, n_q))
    out = execute(chain, inputs, call.scale, graph, ("dQ", "dK", "dV"), call.raws)
    if call.fast_ok and call.fast is None and not launch.counting_active():
        prepare_fast(call, BWD_INPUTS, {"dQ": (*lead, n_q, d), "dK": kv_shape, "dV": kv_shape}, BWD_OUTPUTS)
    dk, dv = out["dK"], out["dV"]
    if expand:
        dk, dv = (_group_sum(cp, x, group, dtype) for x in (dk, dv))
    grads = (out["dQ"].reshape((*lead, n_q, d)), dk.reshape(kv_shape), dv.reshape(kv_shape))
    return tuple(cp.asnumpy(g) for g in grads) if mod == "numpy" else grads
