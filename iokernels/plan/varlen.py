"""Variable-length batches (issue #23; FlashAttention's ``flash_attn_varlen_func``): B sequences packed one after
another without padding, Q and O as (total_q, heads, d), K and V as (total_k, kv_heads, d), sequence b holding query
rows [cu_q[b], cu_q[b + 1]) and key rows [cu_k[b], cu_k[b + 1]) (``cu_seqlens_q``, ``cu_seqlens_k``: (B + 1,) int32,
read by the kernels at run time); lse as (total_q, heads) float32. Sequence b's queries see its keys only (causal: per
sequence, in the plan's alignment).

The tiles are each sequence's own: block (query tile m, sequence b, head z) of the tma forward (flash_tma.cu built
with VARLEN) takes rows [m B_r, m B_r + B_r) of its sequence (the grid is ⌈max_q / B_r⌉ tiles long; a tile past its
sequence's end does nothing) and its sequence's key tiles. A tile's copies are boxes of the packed tensor: its last
rows past the sequence are the next sequence's (read, counted, never stored; keys past the end are masked and the
rows of V past it zeroed in shared memory), past the packed tensor's end they are zero-filled (nothing read).

The backward (flash_tma_bwd.cu built with VARLEN): block (key block x, sequence b, K/V head z) takes its sequence's
key block x and the query blocks of the g query heads that see it; the loader zeroes the rows of a sequence's last
query block past its end in Q and dO, so they add nothing to dK, dV or dQ (dQacc's boxes past the end add zeros). Its
D = rowsum(dO ∘ O) and dQ stages are the row-wise kernels over the total_q · heads packed rows.

The lengths are values for the model and the simulator only: the grid and the kernels depend on the batch, the
longest sequences and the totals, so one launch serves every set of lengths with those (a plan without them launches;
the model then has no exact bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .causal import CAUSAL_CODES, causal_offset, normalize_causal
from .core import Plan, Stage, Unsupported, check_problem, layout, layout_bytes, rowwise_stage
from .fast import FAST_DTYPES, TMA_HEAD_DIMS, TMA_TILES, fast_buffers, tile_head_dim, tile_params
from .fast_bwd import dq_stage, make_fast_backward_plan
from .sequences import Varlen, check_lengths
from .units import cdiv, itemsize

VARLEN_VARIANT = "varlen"  # Plan.variant of the variable-length plans
# tile width -> the varlen forward's (B_r, B_c), causal or not: three consumer warpgroups (192 rows) at d up to 64, as
# the dense forward's (timed on bench --varlen's batch, H100: 417 -> 459 TFLOP/s, causal 385 -> 402, against 128 rows;
# results/h100/issue23/varlen/), else the causal plans' 128 x 128 (a sequence's last tile wastes fewer keys than at 176)
VARLEN_TILES = {64: TMA_TILES[64, False], **{w: TMA_TILES[w, True] for w in (128, 192, 256)}}


def _problem(d: int, dtype: str, heads: int, kv_heads: int | None, lengths_q: Sequence[int] | None,
             lengths_k: Sequence[int] | None, batch: int | None, max_q: int | None, max_k: int | None,
             total_q: int | None, total_k: int | None, head_major: bool) -> tuple[Varlen, int, int, int, str, int]:
    """(varlen, batch, the grid's N_q and N_k, dtype, kv_heads) of a variable-length problem, checked."""
    if lengths_q is not None:
        lq = check_lengths("lengths_q", lengths_q)
        lk = lq if lengths_k is None else check_lengths("lengths_k", lengths_k)
        if len(lk) != len(lq):
            raise ValueError(f"lengths_q and lengths_k must name the same sequences: {len(lq)} and {len(lk)}")
        varlen = Varlen(sum(lq), sum(lk), lq, lk, head_major)
        batch, max_q, max_k = len(lq), max(lq), max(lk)
    else:
        for name, value in (("batch", batch), ("max_q", max_q), ("max_k", max_k), ("total_q", total_q),
                            ("total_k", total_k)):
            if value is None:
                raise ValueError(f"a variable-length plan needs lengths_q, or {name} (with batch, max_q, max_k, "
                                 "total_q and total_k)")
        varlen = Varlen(total_q, total_k, head_major=head_major)
    # the longest sequences fix the grid and the tiles; a batch of only empty ones still has a tile
    n_q, n_k = max(max_q, 1), max(max_k, 1)
    dtype = check_problem(n_q, n_k, d, dtype, batch, heads)
    check_problem(max(varlen.total_q, 1), max(varlen.total_k, 1), d, dtype)
    if max_q > varlen.total_q or max_k > varlen.total_k:
        raise ValueError(f"the longest sequences ({max_q}, {max_k}) exceed the packed rows ({varlen.total_q}, "
                         f"{varlen.total_k})")
    kv_heads = heads if kv_heads is None else kv_heads
    if not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads must divide heads={heads}, got {kv_heads!r}")
    if d not in TMA_HEAD_DIMS or dtype not in FAST_DTYPES:
        raise Unsupported(f"variable-length batches run on the sm_90 tma kernels: float16 or bfloat16, d a multiple "
                          f"of 8 from 16 to 256; got d={d}, {dtype}")
    return varlen, batch, n_q, n_k, dtype, kv_heads


def make_varlen_plan(*, d: int, dtype: str, heads: int = 1, kv_heads: int | None = None,
                     lengths_q: Sequence[int] | None = None, lengths_k: Sequence[int] | None = None,
                     batch: int | None = None, max_q: int | None = None, max_k: int | None = None,
                     total_q: int | None = None, total_k: int | None = None, causal: bool | str = False,
                     direction: str = "fwd", block_r: int | None = None, head_major: bool = False) -> Plan:
    """The variable-length forward or backward (``direction``; :mod:`iokernels.plan.varlen`) on the sm_90 tma kernels:
    ``lengths_q`` and ``lengths_k`` (B each; ``lengths_k`` default ``lengths_q``) for an exact plan, or, for a launch
    plan, ``batch``, ``max_q``, ``max_k`` (the longest sequences) and ``total_q``, ``total_k`` (the packed rows).
    ``causal``: per sequence, "bottom_right" (FlashAttention's, the default for True) or "top_left". ``block_r``: the
    forward's B_r, for tuning (128, or 192 at d up to 64; default :data:`VARLEN_TILES`). ``head_major``: the tensors
    as (heads, total, d) instead of (total, heads, d), the dense layout with the sequences a head's documents
    (:func:`make_documents_plan`)."""
    if direction not in ("fwd", "bwd"):
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    if not isinstance(head_major, bool):
        raise TypeError(f"head_major must be True or False, got {head_major!r}")
    varlen, batch, n_q, n_k, dtype, kv_heads = _problem(d, dtype, heads, kv_heads, lengths_q, lengths_k, batch,
                                                         max_q, max_k, total_q, total_k, head_major)
    alignment = normalize_causal(causal)
    mask = ((("VARLEN", 1),) + ((("VARLEN_HEAD_MAJOR", 1),) if head_major else ())
            + ((("CAUSAL", CAUSAL_CODES[alignment]),) if alignment else ()))
    if direction == "bwd":  # the dense tma backward's tiles and kernel; its stages over the packed rows
        if block_r is not None:
            raise ValueError("block_r: the varlen backward takes the dense tma backward's tiles")
        dense = make_fast_backward_plan(N_q=n_q, N_k=n_k, d=d, dtype=dtype, batch=batch, heads=heads,
                                        kv_heads=kv_heads, kernel="tma")
        main = dense.stage("main")
        stages = (rowwise_stage("prep", "flash_bwd_prep", max(varlen.total_q, 1), d, heads),
                  replace(main, grid=(main.grid[0], batch, kv_heads), params=(*main.params, *mask)),
                  dq_stage(main.kernel, max(varlen.total_q, 1), d, heads))
        return replace(dense, variant=VARLEN_VARIANT, stages=stages, causal=alignment, varlen=varlen,
                       sram_bytes=max(st.smem_bytes for st in stages))
    tile_d = tile_head_dim(d)
    default_r, block_c = VARLEN_TILES[tile_d]
    block_r = default_r if block_r is None else block_r
    if block_r not in ((128, 192) if tile_d == 64 else (128,)):
        raise ValueError(f"varlen forward tiles: block_r 128 (or 192 at d up to 64), got {block_r!r} at d={d}")
    buffers = fast_buffers(tile_d, itemsize(dtype), block_r, block_c)
    tr, tc = cdiv(n_q, block_r), cdiv(n_k, block_c)
    stage = Stage("main", "flash_tma_fwd", (tr, batch, heads), 2 * block_r + 128, layout(buffers),
                  (*tile_params(d), *mask))
    return Plan(algorithm="flash", schedule="fast", direction="fwd", N_q=n_q, N_k=n_k, d=d, dtype=dtype,
                sram_bytes=layout_bytes(buffers), batch=batch, heads=heads, kv_heads=kv_heads,
                variant=VARLEN_VARIANT, tiles=(("Br", block_r), ("Bc", block_c), ("Tr", tr), ("Tc", tc)),
                stages=(stage,), causal=alignment, varlen=varlen)


def make_documents_plan(documents: Sequence[int], *, d: int, dtype: str, batch: int = 1, heads: int = 1,
                        kv_heads: int | None = None, causal: bool | str = False, direction: str = "fwd",
                        block_r: int | None = None) -> Plan:
    """Document masking on the dense layout (FlexAttention's ``document_id[q_idx] == document_id[kv_idx]``): Q, K, V
    as (batch, heads, N, d) with N = sum(``documents``), each row seeing the keys of its own document only (causal: in
    it, per ``causal``'s alignment; N_q = N_k, so both alignments agree), the same documents in every batch row and
    head. The variable-length plan of the documents with ``head_major`` (:func:`make_varlen_plan`): batch · heads heads
    (batch · kv_heads K/V heads), each document tiled on its own, its tiles' rows past its end the next document's
    (masked or zeroed, as a variable-length batch's). Its bytes: ``varlen_sums`` / ``varlen_backward_sums``.
    ``block_r``: the forward's B_r, as :func:`make_varlen_plan`'s."""
    documents = check_lengths("documents", documents)
    kv_heads = heads if kv_heads is None else kv_heads
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    if not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads must divide heads={heads}, got {kv_heads!r}")
    return make_varlen_plan(d=d, dtype=dtype, heads=batch * heads, kv_heads=batch * kv_heads, lengths_q=documents,
                            causal=causal, direction=direction, block_r=block_r, head_major=True)


def query_tile_keys(plan: Plan, length_q: int, length_k: int, row0: int) -> int:
    """The keys the query tile at ``row0`` of a sequence of (``length_q``, ``length_k``) visits: every key without a
    causal mask, else up to its last row's last visible key (0: a tile with no visible key reads nothing)."""
    if not plan.causal:
        return length_k
    rows = min(plan.tile["Br"], length_q - row0)
    return max(0, min(length_k, row0 + rows + causal_offset(length_q, length_k, plan.causal)))


def varlen_sums(plan: Plan) -> dict[str, int]:
    """A variable-length forward's sums over its sequences, per query head, for the model and the simulator: ``rows_q``
    the query rows its copies load (each non-empty tile's B_r rows inside the packed tensor), ``rows_k`` the key rows
    (each visited key tile's B_c rows inside the packed tensor, for K and again for V), ``blocks`` the grid's blocks
    (each reads its sequence's two offsets in cu_seqlens_q and two in cu_seqlens_k), ``area`` Σ L_q·L_k (the products
    of real tokens: the FLOPs' count, halved when causal)."""
    v, t = plan.varlen, plan.tile
    rows_q = rows_k = area = 0
    for oq, lq, ok, lk in v.sequences():
        area += lq * lk
        for row0 in range(0, lq, t["Br"]):
            keys = query_tile_keys(plan, lq, lk, row0)
            if keys == 0:
                continue
            rows_q += min(t["Br"], v.total_q - oq - row0)
            rows_k += sum(min(t["Bc"], v.total_k - ok - k0) for k0 in range(0, keys, t["Bc"]))
    return {"rows_q": rows_q, "rows_k": rows_k, "blocks": t["Tr"] * plan.batch, "area": area}


def key_block_queries(plan: Plan, length_q: int, length_k: int, col0: int) -> range:
    """The query blocks the backward's key block at ``col0`` of a sequence of (``length_q``, ``length_k``) visits
    (empty: a block past the sequence's keys, or one no query sees): every one, or from the first whose last row sees
    its first key when causal (flash_tma_bwd.cu's schedule)."""
    br = plan.tile["Br"]
    if col0 >= length_k or length_q == 0:
        return range(0)
    q_lo = max(0, col0 - causal_offset(length_q, length_k, plan.causal)) if plan.causal else 0
    return range(q_lo // br, cdiv(length_q, br)) if length_q > q_lo else range(0)


def varlen_backward_sums(plan: Plan) -> dict[str, int]:
    """A variable-length backward's sums over its sequences, per K/V head, for the model and the simulator: ``rows_k``
    the key rows its copies load (each key block with a step, B_c rows inside the packed tensor, for K and again for
    V), ``rows_q`` the query rows (each step's B_r rows inside the packed tensor, for Q and again for dO), ``scalars``
    the lse (and D) floats its steps read (their rows inside the sequence), ``dq`` the dQacc rows it adds (d floats
    each, read and written: the bulk reduce-add's 64-row boxes inside the packed tensor; the wide tiles' float32
    reductions, the rows inside the sequence), ``blocks`` the grid's blocks (each reads its sequence's two offsets of
    each)."""
    v, t = plan.varlen, plan.tile
    group, br, bc = plan.heads // plan.kv_heads, t["Br"], t["Bc"]
    wide = plan.stage("main").kernel != "flash_tma_bwd"
    rows_k = rows_q = scalars = dq = 0
    for oq, lq, ok, lk in v.sequences():
        for col0 in range(0, lk, bc):
            blocks = key_block_queries(plan, lq, lk, col0)
            if not blocks:
                continue
            rows_k += min(bc, v.total_k - ok - col0)
            for i in blocks:
                q0 = i * br
                rows_q += group * min(br, v.total_q - oq - q0)
                scalars += group * min(br, lq - q0)
                if wide:
                    dq += group * min(br, lq - q0)
                else:
                    dq += group * sum(max(0, min(64, v.total_q - oq - q0 - r)) for r in range(0, br, 64))
    return {"rows_k": rows_k, "rows_q": rows_q, "scalars": scalars, "dq": dq, "blocks": t["Tc"] * plan.batch}
