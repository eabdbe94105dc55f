"""PyTorch front end: ``iokernels.torch.attention(q, k, v)``, differentiable, on CUDA tensors, the decode step
``iokernels.torch.attention_with_kvcache(q, k_cache, v_cache, ...)``, forward only, and variable-length batches
``iokernels.torch.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)``, differentiable
(``torch.ops.iokernels.attention_varlen_fwd`` / ``_bwd``).

An optional module: ``import iokernels`` never imports torch, and this module needs it. The call is the
custom operator ``torch.ops.iokernels.attention_fwd`` (:mod:`iokernels.library.torch_ops`), with a fake
implementation and an autograd formula (``torch.ops.iokernels.attention_bwd``), so ``torch.compile``
traces it without a graph break (the decode step: ``torch.ops.iokernels.attention_with_kvcache``). Its kernels run
on torch's current CUDA stream of the tensors' device, on the tensors' memory (no copies for contiguous tensors),
with outputs and workspace from torch's caching allocator.
"""

from __future__ import annotations

import functools
from typing import Any

try:
    import torch
except ImportError as exc:  # an optional dependency: say how to get it
    raise ImportError("iokernels.torch needs PyTorch, which is not installed: pip install torch "
                      "(iokernels itself does not depend on it)") from exc

from ..plan import normalize_causal, normalize_window
from ..plan.dropout import Dropout, check_p
from ..plan.masks import BlockMask
from ..plan.sequences import offsets
from ..plan.units import parse_size
from ..plan.variants import check_softcap
from .dispatch import check_scale
from .kvcache import check_options
from .planning import alibi_values
from .torch_kvcache import KV_NO_BACKWARD, check_in_place, check_kv_tensors, kvcache_forward
from .torch_ops import (
    backward,
    block_mask_args,
    check_tensors,
    forward,
    forward_dropout,
    signed_seed,
    window_ints,
)
from .torch_varlen import check_varlen_tensors, varlen_forward
from .varlen import documents_only

ALGORITHMS = ("flash", "two_pass", "standard")


def _options(algorithm: Any, schedule: Any, scale: Any, sram: Any, deterministic: Any) -> tuple[Any, ...]:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}: expected one of {', '.join(ALGORITHMS)}")
    if schedule is not None and not isinstance(schedule, str):
        raise TypeError(f"schedule must be a string or None, got {schedule!r}")
    scale = check_scale(scale)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be True or False, got {deterministic!r}")
    return algorithm, schedule, scale, None if sram is None else parse_size(sram), deterministic


def _dropout(dropout: Any, dropout_p: Any) -> tuple[float, int, int]:
    """(p, seed, offset) for the op: offset -1 draws the library's next offset inside it."""
    if isinstance(dropout, Dropout):
        if dropout_p:
            raise TypeError("pass dropout or dropout_p, not both")
        return dropout.p, signed_seed(dropout.seed), dropout.offset
    p, q = check_p(dropout), check_p(dropout_p)
    if p and q:
        raise TypeError("pass dropout or dropout_p, not both")
    return p or q, 0, -1


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
              dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, *,
              enable_gqa: bool = False, causal: bool | str = False, algorithm: str = "flash",
              schedule: str | None = None, sram: int | str | None = None, deterministic: bool = False,
              mask: Any = None, dropout: float | Dropout = 0.0,
              window: tuple[int | None, int | None] | None = None, documents: Any = None,
              softcap: float | None = None, block_mask: Any = None, alibi_slopes: Any = None) -> torch.Tensor:
    """Exact attention ``softmax(scale * q kᵀ) v`` on CUDA tensors, with autograd; torch's
    ``scaled_dot_product_attention`` signature (attn_mask, dropout_p, is_causal, scale, enable_gqa) and
    the library's options.

    Shapes as :func:`iokernels.attention`: q (..., N_q, d), k and v (..., N_k, d) with equal leading
    dims, or grouped-query attention with k, v (..., H_kv, N_k, d), H_kv dividing H_q (with or without
    enable_gqa, which is taken for SDPA's signature); d a multiple of 8 from 16 to 256. dtypes:
    torch.float32, torch.float16 or torch.bfloat16, one for all, on one CUDA device. bfloat16 crosses to
    cupy as raw 16-bit words (cupy has no bfloat16), with the same kernels as float16: the tensor-core
    flash path for d of 64 or 128 (on sm_90 every multiple of 8: up to 256 forward, 128 backward), the research
    kernels elsewhere.

    The call is the operator ``torch.ops.iokernels.attention_fwd`` (:mod:`iokernels.library.torch_ops`):
    :func:`iokernels.attention` on the tensors' memory, on torch's current stream, outputs from torch's
    caching allocator; it saves q, k, v, O and the row logsumexp, and its backward,
    ``torch.ops.iokernels.attention_bwd``, runs :func:`iokernels.attention_backward` (algorithm
    "standard" for a standard forward, "flash" otherwise) on them. ``torch.compile(fullgraph=True)``
    traces it as one node each way.

    is_causal: torch's causal mask, the top-left alignment (causal="top_left"). causal: as
    :func:`iokernels.attention` (True is bottom-right; the two agree for N_q = N_k); pass one of them. scale,
    algorithm, schedule and sram as :func:`iokernels.attention`; deterministic as
    :func:`iokernels.attention_backward`. attn_mask (or mask, the same; pass one): a boolean (False hides the
    key, as SDPA's) or floating tensor (added to the scores) on q's device, broadcastable to (..., N_q, N_k); it
    gets no gradient, and stays on the device (a masked call is capturable in a CUDA graph; NaN or +inf in an
    additive mask give NaN rows, as in SDPA). On sm_90, float16 and bfloat16 with d up to 128 and no dropout,
    window, softcap or ALiBi, it runs on the tma kernels, read in its own dtype (a bfloat16 one widened to float32
    first), as :func:`iokernels.attention`'s. dropout_p (or dropout, the same; pass one): the probability p in
    [0, 1) of dropping an attention probability (pass 0 for evaluation): each call draws the library's next
    Philox offset (:mod:`iokernels.plan.dropout`) inside the operator, and its backward regenerates the same
    mask; a :class:`iokernels.plan.dropout.Dropout` as dropout is used as given.

    window: a sliding window (left, right), FlashAttention's ``window_size``: query i sees key j iff
    i + N_k − N_q − left <= j <= i + N_k − N_q + right (the bottom-right offset), −1 or None for an unbounded side,
    None or (−1, −1) for none; with causal (or is_causal) both apply. As :func:`iokernels.attention`: it runs on the
    tensor-core path of sm_90 GPUs (H100, H200) for float16 and bfloat16, d a multiple of 8 up to 256, forward and
    backward (the backward takes the forward's window); anything else raises ValueError (bad window) or
    :class:`iokernels.plan.Unsupported` (float32, algorithm "standard", ...). The operators take it as two ints,
    ``window_left`` and ``window_right`` (−1: unbounded).

    softcap: a number c > 0 caps the logits, c · tanh(scale · q kᵀ / c), forward and backward (Gemma 2's attention
    softcapping), as :func:`iokernels.attention`'s: the sm_90 tma kernels only (float16 or bfloat16, d up to 256
    forward and 128 backward, causal and windows included; not dropout or masks: Unsupported).

    documents: document masking, the lengths of documents packed along N (N_q = N_k = their sum, the same for every
    batch row and head): a row sees the keys of its own document only (and with causal or is_causal, j <= i). As
    :func:`iokernels.attention`'s: the sm_90 variable-length tma kernels on the tensors' memory (contiguous, float16
    or bfloat16), through :func:`attention_varlen` with ``head_major`` (its operators, its autograd); it takes causal,
    is_causal, scale and enable_gqa only (ValueError otherwise).

    block_mask: block-sparse attention (the paper's Algorithm 5), an :class:`iokernels.BlockMask` made once for
    (N_q, N_k) (``iokernels.plan.masks.pattern``, ``BlockMask.from_array``): as :func:`iokernels.attention`'s, on the
    sm_90 tma kernels where its blocks are multiples of 128 (the research kernels elsewhere), forward and backward,
    with causal, dropout and softcap. A traced call (torch.compile) passes it to the operator as its bytes (a uint8
    CPU tensor) and block sizes, turned into them outside the trace (a graph break there).

    alibi_slopes: ALiBi, as :func:`iokernels.attention`'s: H or B·H numbers (a sequence, or a tensor, read on the host
    at each call: constants of the model, best given as a tuple), the logits plus −slope · |j − i − (N_k − N_q)|,
    forward and backward, on the sm_90 tma kernels; the operators take them as a list of floats.

    Returns O (..., N_q, d), a tensor of q's dtype on q's device, with a grad_fn when an input
    requires grad (meta tensors in: meta tensors of those shapes out, nothing run). Raises ImportError
    at import without torch, TypeError/ValueError on bad input (non-tensors, other dtypes, CPU tensors,
    the shape errors of :func:`iokernels.attention`).

    Example (GPU and torch):

    >>> import torch, iokernels.torch
    >>> q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    ...            for _ in range(3))
    >>> o = iokernels.torch.attention(q, k, v, is_causal=True)
    >>> o.sum().backward()
    >>> o.shape, q.grad.shape, q.grad.dtype
    (torch.Size([2, 4, 300, 64]), torch.Size([2, 4, 300, 64]), torch.float16)
    >>> want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    >>> bool((o.double() - want).abs().max() < 1e-2)
    True
    """
    if documents is not None:  # the options checked as any call's, then those documents do not take refused
        p, _, _, causal, scale, algorithm, schedule, sram, deterministic, window, softcap = _checked_options(
            is_causal, causal, enable_gqa, algorithm, schedule, scale, sram, deterministic, dropout_p, dropout, window,
            softcap)
        documents_only(algorithm=algorithm, schedule=schedule, sram=sram, mask=attn_mask if mask is None else mask,
                       dropout=p, window=window, deterministic=deterministic, softcap=softcap,
                       block_mask=block_mask, alibi_slopes=alibi_slopes)
        return _documents(q, k, v, documents, causal, scale)
    if block_mask is not None and not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be an iokernels.BlockMask, got {type(block_mask).__name__}")
    alibi = None if alibi_slopes is None else alibi_values(alibi_slopes)
    if attn_mask is not None and mask is not None:
        raise TypeError("pass attn_mask or mask, not both")
    mask = attn_mask if mask is None else mask
    if mask is not None and not isinstance(mask, torch.Tensor):  # numpy or cupy: on q's device
        mask = torch.as_tensor(mask, device=q.device if isinstance(q, torch.Tensor) else None)
    if window is not None:  # normalized first (ValueError for a bad one): its ints, not as spelled, key OPTIONS
        window = normalize_window(window)
    raw = (is_causal, causal, enable_gqa, algorithm, schedule, scale, sram, deterministic, dropout_p, dropout, window,
           softcap, type(scale), type(sram), type(dropout_p), type(dropout), type(causal), type(softcap))
    # (True == 1 == 1.0: the types too)
    try:
        options = OPTIONS.get(raw)
    except TypeError:  # an unhashable option: checked below, and refused
        options = raw = None
    if options is None:
        options = _checked_options(is_causal, causal, enable_gqa, algorithm, schedule, scale, sram, deterministic,
                                   dropout_p, dropout, window, softcap)
        if raw is not None and not isinstance(dropout, Dropout):  # a Dropout is one call's: not kept
            if len(OPTIONS) >= MAX_OPTIONS:
                OPTIONS.clear()
            OPTIONS[raw] = options
    p, seed, offset, causal, scale, algorithm, schedule, sram, deterministic, window, softcap = options
    if not _plain_eager(q, k, v):  # traced (one node each way), fake or meta tensors (the fake implementation),
        # a dispatch mode that should see the operator, or what the operator's checks refuse
        check_tensors(q, k, v, mask)
        out, _, _ = torch.ops.iokernels.attention_fwd(q, k, v, mask, p, seed, offset, causal, scale, algorithm,
                                                      schedule, sram, deterministic, *window_ints(window), softcap,
                                                      *((None, 0, 0) if block_mask is None  # (no graph break)
                                                        else block_mask_args(block_mask)),
                                                      None if alibi is None else list(alibi))
        return out
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v)):
        return EagerAttention.apply(q, k, v, mask, options, block_mask, alibi)
    return forward(q, k, v, mask, forward_dropout(p, seed, offset), causal, scale, algorithm, schedule, sram,
                   keep_lse=False, window=window, softcap=softcap, block_mask=block_mask, alibi=alibi)[0]


def _plain_eager(q: Any, *more: Any) -> bool:
    """Whether the call may skip the dispatcher: plain CUDA tensors (``more``: None for an optional one not given),
    not traced, no dispatch mode active."""
    return (type(q) is torch.Tensor and all(t is None or type(t) is torch.Tensor for t in more)
            and q.is_cuda and not torch.compiler.is_compiling() and not _dispatch_modes())


def attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                           cache_seqlens: torch.Tensor | None = None, page_table: torch.Tensor | None = None,
                           k: torch.Tensor | None = None, v: torch.Tensor | None = None,
                           causal: bool | str = False, scale: float | None = None, num_splits: int = 0,
                           return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One decode step on CUDA tensors: :func:`iokernels.attention_with_kvcache` (its arguments, shapes and meaning)
    with torch tensors, float16 or bfloat16, forward only.

    Shapes: q (B, H, N_q, d); the cache contiguous, k_cache and v_cache (B, H_kv, N_cap, d) with ``cache_seqlens``
    (B,) int32 (each sequence's keys) or None (N_cap keys each), or paged, k_cache and v_cache (pages, H_kv,
    page_size, d), page_size one of 8, 16, ..., 256, with ``page_table`` (B, max_pages) int32 (key n of sequence b:
    row n % page_size of page page_table[b, n // page_size]) and ``cache_seqlens`` required. H_kv divides H; d a
    multiple of 8 from 16 to 256. q, k_cache and v_cache one dtype (torch.float16 or torch.bfloat16), every tensor
    contiguous (read in place: a cache is never copied) on one CUDA device. The lengths and the page table stay on
    the device: a call reads nothing back, so a decode step can be captured in a CUDA graph (``torch.cuda.graph``) and
    replayed after the cache, the lengths or the page table change in place. Rows of the cache past a sequence's
    length may hold anything (NaN included); a sequence of no key gives O = 0 and lse −inf. A length past the capacity
    counts as the capacity and an appended row past it is not written; a page number past the pool is not checked.

    k, v: new keys and values (B, H_kv, N_new, d) written into the caches (in place) right after each sequence's
    ``cache_seqlens`` keys (required; not advanced) before the step attends to them too (the operator
    ``torch.ops.iokernels.attention_with_kvcache_append``, which declares the caches mutated).

    causal: False, or True / "bottom_right": query i of N_q sees the keys up to n − N_q + i of its sequence's n keys
    (with N_q = 1 every key); top-left raises :class:`iokernels.plan.Unsupported`. scale: 1/sqrt(d) by default.
    num_splits: the splits of the keys (0: the plan's choice; at most 128). return_lse: also return lse (B, H, N_q),
    float32.

    The call is the operator ``torch.ops.iokernels.attention_with_kvcache`` (:mod:`iokernels.library.torch_kvcache`),
    with a fake implementation: ``torch.compile(fullgraph=True)`` traces it as one node. It runs on torch's current
    stream, outputs from torch's caching allocator (a graph capture's pool while capturing); a signature's later calls
    allocate and launch, nothing else. Forward only: with grad mode on and q, k_cache or v_cache requiring grad, the
    output has a grad_fn whose backward raises RuntimeError (and ``torch.compile`` of such a call fails when it traces
    the backward): decode under ``torch.no_grad()`` or ``torch.inference_mode()``. Runs on sm_90 GPUs (H100, H200).

    Returns O (B, H, N_q, d) in q's dtype, and lse with ``return_lse``. Raises TypeError/ValueError for what a user
    can get wrong (non-tensors, CPU tensors, other dtypes, int64 lengths, non-contiguous tensors, shapes that do not
    fit, a bad num_splits, scale or return_lse), before anything is launched.
    """
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be True or False, got {return_lse!r}")
    causal, scale = normalize_causal(causal), check_scale(scale)
    tensors = (q, k_cache, v_cache, cache_seqlens, page_table)
    grad = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k_cache, v_cache, k, v))
    if grad and (k is not None or v is not None):  # (the append operator mutates the caches: no autograd formula)
        raise RuntimeError(KV_NO_BACKWARD)
    if _plain_eager(*tensors, k, v) and not grad:
        out, lse = kvcache_forward(*tensors, causal, scale, num_splits, keep_lse=return_lse, k_new=k, v_new=v)
    else:  # traced, fake or meta tensors, a dispatch mode, under autograd (the operator's backward raises), or refused
        check_kv_tensors(*tensors, k, v)
        check_options(q.shape[2], causal, num_splits)
        if k is None and v is None:
            out, lse = torch.ops.iokernels.attention_with_kvcache(*tensors, causal, scale, num_splits)
        else:
            out, lse = torch.ops.iokernels.attention_with_kvcache_append(*tensors, k, v, causal, scale, num_splits)
    return (out, lse) if return_lse else out


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool | str = False,
                     scale: float | None = None, return_lse: bool = False, head_major: bool = False
                     ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of B sequences packed without padding on CUDA tensors, with autograd:
    :func:`iokernels.attention_varlen` (FlashAttention's ``flash_attn_varlen_func``) with torch tensors, float16 or
    bfloat16.

    Shapes: q (total_q, H, d), k and v (total_k, H_kv, d), the rows of every sequence one after another;
    ``cu_seqlens_q`` and ``cu_seqlens_k`` (B + 1,) int32 on the same device: sequence b's queries are rows
    [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q, its keys rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k and v, and
    its queries see its keys only (``head_major``: q (H, total_q, d), k and v (H_kv, total_k, d), each head's rows
    together, lse (H, total_q)). ``max_seqlen_q``, ``max_seqlen_k``: ints, the longest sequences (the grid's length:
    at least the longest, or a longer sequence's rows past them are not computed). H_kv divides H (grouped-query
    attention); d a multiple of 8 from 16 to 256. q, k and v one dtype (torch.float16 or torch.bfloat16), every tensor
    contiguous (read in place, never copied) on one CUDA device. The offsets stay on the device and are not checked
    there (they must be non-decreasing from 0 to total_q and total_k: an offset past the packed rows makes the kernels
    write out of bounds): a call reads nothing back, so the forward and the backward can be captured in a CUDA graph
    (``torch.cuda.graph``) and replayed after the offsets change in place (with the same longest lengths and totals).
    A sequence with no key gives O = 0, lse −inf and dq = 0; a key no query of its sequence sees gets dk = dv = 0. A
    NaN or inf in the next sequence's k or v rows that share a sequence's last key block reaches that sequence's dq
    (the forward keeps every sequence apart).

    causal: False, or True / "bottom_right" (FlashAttention's: query i of a sequence of L_q queries and L_k keys sees
    its keys up to L_k − L_q + i) or "top_left" (up to i), per sequence. scale: 1/sqrt(d) by default. return_lse: also
    return lse (total_q, H), float32 (it carries no gradient).

    The call is the operator ``torch.ops.iokernels.attention_varlen_fwd`` (:mod:`iokernels.library.torch_varlen`),
    with a fake implementation and an autograd formula: it saves q, k, v, O and lse, and its backward,
    ``torch.ops.iokernels.attention_varlen_bwd``, runs :func:`iokernels.attention_varlen_backward` on them (dk and dv
    shaped as k and v, each K/V head's the sum over its query heads); the offsets and the ints get no gradient.
    ``torch.compile(fullgraph=True)`` traces it as one node each way, specialized on ``max_seqlen_q`` and
    ``max_seqlen_k`` (a graph per value). It runs on torch's current stream, outputs from torch's caching allocator (a
    graph capture's pool while capturing); a signature's later calls allocate and launch, nothing else. Runs on sm_90
    GPUs (H100, H200).

    Returns O (total_q, H, d) in q's dtype, with a grad_fn when q, k or v requires grad, and lse with ``return_lse``
    (meta tensors in: meta tensors out, nothing run). Raises TypeError/ValueError for what a user can get wrong
    (non-tensors, CPU tensors, other dtypes, int64 or mismatched offsets, non-contiguous tensors, shapes that do not
    fit, a bad max_seqlen, causal, scale or return_lse), before anything is launched.
    """
    for name, flag in (("return_lse", return_lse), ("head_major", head_major)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    causal, scale = normalize_causal(causal), check_scale(scale)
    tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k)
    grad = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v))
    if _plain_eager(*tensors) and not grad:
        out, lse = varlen_forward(*tensors, max_seqlen_q, max_seqlen_k, causal, scale, keep_lse=return_lse,
                                  head_major=head_major)
    else:  # traced, fake or meta tensors, a dispatch mode, under autograd (the operator's formula), or refused
        check_varlen_tensors(*tensors, max_seqlen_q, max_seqlen_k, head_major)
        out, lse = torch.ops.iokernels.attention_varlen_fwd(*tensors, max_seqlen_q, max_seqlen_k, causal, scale,
                                                            head_major)
    return (out, lse) if return_lse else out


@functools.lru_cache(maxsize=64)
def _document_offsets(documents: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The documents' offsets (D + 1,) int32 on ``device``, made once per documents and device."""
    return torch.from_numpy(offsets(documents)).to(device)


def _documents(q: Any, k: Any, v: Any, documents: Any, causal: str, scale: float | None) -> torch.Tensor:
    """:func:`attention` with ``documents``: :func:`attention_varlen` with ``head_major`` on the flattened views of q,
    k and v (contiguous: read in place), the documents' offsets made once per documents and device; documents of one
    length (:func:`iokernels.library.varlen.uniform_documents`), the dense path on the views (..., D, L, d)."""
    from .varlen import documents_shapes, uniform_documents

    check_in_place({"q": q, "k": k, "v": v})
    documents, heads, kv_heads, n, _ = documents_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape), documents)
    if uniform_documents(documents, heads, kv_heads):  # a batch of documents of one length: the dense path on the view
        shape = (*q.shape[:-2], len(documents), documents[0], q.shape[-1])
        return attention(q.view(shape), k.view(shape), v.view(shape), causal=causal or False, scale=scale).view(q.shape)
    offsets = _document_offsets(documents, q.device)
    out = attention_varlen(q.view(-1, n, q.shape[-1]), k.view(-1, n, k.shape[-1]), v.view(-1, n, v.shape[-1]),
                           offsets, offsets, max(documents), max(documents), causal=causal, scale=scale,
                           head_major=True)
    return out.view(q.shape)


_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
OPTIONS: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # a call's options as given -> as checked
MAX_OPTIONS = 1024


def _checked_options(is_causal: Any, causal: Any, enable_gqa: Any, algorithm: Any, schedule: Any, scale: Any,
                     sram: Any, deterministic: Any, dropout_p: Any, dropout: Any, window: Any = None,
                     softcap: Any = None) -> tuple[Any, ...]:
    """The options as the implementation takes them: (p, seed, offset, causal, scale, algorithm, schedule,
    sram, deterministic, window (normalized), softcap (checked)); TypeError/ValueError for what is wrong."""
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be True or False, got {is_causal!r}")
    if is_causal and normalize_causal(causal):
        raise TypeError("pass is_causal or causal, not both")
    causal = "top_left" if is_causal else normalize_causal(causal)
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be True or False, got {enable_gqa!r}")
    algorithm, schedule, scale, sram, deterministic = _options(algorithm, schedule, scale, sram, deterministic)
    p, seed, offset = _dropout(dropout, dropout_p)
    return p, seed, offset, causal, scale, algorithm, schedule, sram, deterministic, window, check_softcap(softcap)


class EagerAttention(torch.autograd.Function):
    """The eager call with gradients: the operator's forward and backward implementations
    (:func:`iokernels.library.torch_ops.forward`, ``backward``) without the dispatcher's cost per call."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                options: tuple[Any, ...], block_mask: Any = None, alibi: Any = None) -> torch.Tensor:
        p, seed, offset, causal, scale, algorithm, schedule, sram, _, window, softcap = options
        drop = forward_dropout(p, seed, offset)
        out, lse = forward(q, k, v, mask, drop, causal, scale, algorithm, schedule, sram, window=window,
                           softcap=softcap, block_mask=block_mask, alibi=alibi)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.drop, ctx.options, ctx.block_mask, ctx.alibi = drop, options, block_mask, alibi
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse, mask = ctx.saved_tensors
        _, _, _, causal, scale, algorithm, _, sram, deterministic, window, softcap = ctx.options
        dq, dk, dv = backward(dout, q, k, v, out, lse, mask, ctx.drop, causal, scale,
                              "standard" if algorithm == "standard" else "flash", sram, deterministic, window,
                              softcap, ctx.block_mask, ctx.alibi)
        return dq, dk, dv, None, None, None, None
