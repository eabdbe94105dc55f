"""Causal masks: alignments, and the (query block, key block) pairs a tiled schedule visits.

Causal attention (``make_plan(..., causal=True)``): key j is visible to query i iff
j <= i + offset, with offset = N_k - N_q for the **bottom-right** alignment (the default, like
FlashAttention-2 and torch's ``causal_lower_right``: the last query sees every key, as in decoding
with a KV cache) and offset = 0 for the **top-left** one (torch's ``is_causal=True``). With
bottom-right and N_q > N_k the first N_q - N_k queries see no key: their output is 0, their
logsumexp −inf and their gradients 0 (top-left never masks a whole row). Tiles do not change. The
tiled schedules (flash, two_pass) skip every (query block, key block) pair whose elements are all
masked, and load nothing for a query block (key block) with no visible pair; :func:`causal_sums`
gives what they then move. Standard attention computes every element of S (masked ones stored as
−inf, so P is 0 there): its bytes are those of the unmasked problem. Each causal kernel gets the
compile-time define ``CAUSAL`` (1 top-left, 2 bottom-right) as a stage parameter.
"""

from __future__ import annotations

import numpy as np

from .units import cdiv

# Plan.causal: "" (no mask) or one of these; CAUSAL_CODES: the kernels' CAUSAL define
CAUSAL_ALIGNMENTS = ("bottom_right", "top_left")
DEFAULT_CAUSAL_ALIGNMENT = "bottom_right"
CAUSAL_CODES = {"top_left": 1, "bottom_right": 2}


def normalize_causal(causal: bool | str | None) -> str:
    """The canonical alignment of a ``causal`` argument: False/None/"" -> "" (no mask), True -> the
    default (bottom-right), "bottom_right"/"bottom-right"/"top_left"/"top-left" -> that alignment."""
    if type(causal).__name__ in ("bool", "bool_"):  # Python's or numpy's
        causal = bool(causal)
    if causal is None or causal is False or causal == "":
        return ""
    if causal is True:
        return DEFAULT_CAUSAL_ALIGNMENT
    if isinstance(causal, str):
        name = causal.strip().lower().replace("-", "_")
        if name in CAUSAL_ALIGNMENTS:
            return name
    raise ValueError(f"unknown causal alignment {causal!r}: expected True, False, "
                     "'bottom_right' (the default for True) or 'top_left'")


def causal_offset(n_q: int, n_k: int, causal: str) -> int:
    """Key j is visible to query i iff j <= i + offset: N_k - N_q bottom-right, 0 top-left."""
    return n_k - n_q if causal == "bottom_right" else 0


def visible_key_blocks(n_q: int, n_k: int, br: int, bc: int, causal: str) -> list[int]:
    """For each query block i (rows [i·br, min((i+1)·br, n_q))), how many key blocks of bc it
    reads under the causal mask: those with any element visible to its last row, a prefix of the
    key blocks (0 when every element of the block's rows is masked; all of them without a mask)."""
    tc = cdiv(n_k, bc)
    if not causal:
        return [tc] * cdiv(n_q, br)
    off = causal_offset(n_q, n_k, causal)
    out = []
    for row0 in range(0, n_q, br):
        last = min(row0 + br, n_q) - 1 + off  # the largest key any row of the block sees
        out.append(0 if last < 0 else min(tc, last // bc + 1))
    return out


def causal_sums(n_q: int, n_k: int, br: int, bc: int, causal: str) -> dict[str, int]:
    """What the tiled schedules move under the causal mask, summed over the visible
    (query block i, key block j) pairs (rows_i, cols_j: the blocks' in-range rows):

    * ``R_K`` = Σ cols_j: key rows a query-block loop loads (q_outer, two_pass); N_k·T_r unmasked
    * ``R_Q`` = Σ rows_i: query rows a key-block loop loads (kv_outer, the backward); N_q·T_c
    * ``A_S`` = Σ rows_i·cols_j: elements of the visible S blocks (two_pass store); N_q·N_k
    * ``N_qv`` = Σ rows_i over query blocks with a visible pair; N_q
    * ``N_kv`` = Σ cols_j over key blocks with a visible pair; N_k
    """
    vis = visible_key_blocks(n_q, n_k, br, bc, causal)
    rows = [min(br, n_q - row0) for row0 in range(0, n_q, br)]
    keys = [min(n_k, v * bc) for v in vis]  # key rows of the visible prefix (only the last block is ragged)
    return {"R_K": sum(keys), "R_Q": sum(r * v for r, v in zip(rows, vis, strict=True)),
            "A_S": sum(r * k for r, k in zip(rows, keys, strict=True)),
            "N_qv": sum(r for r, v in zip(rows, vis, strict=True) if v), "N_kv": max(keys, default=0)}


def normalize_window(window: object) -> tuple[int | None, int | None] | None:
    """A sliding window (left, right), FlashAttention's ``window_size``: key j is visible to query i iff
    i + o − left <= j <= i + o + right, o = N_k − N_q (the bottom-right alignment); None for a side leaves it
    unbounded (-1 too, FlashAttention's convention). Returns None for no window (None, or both sides unbounded)."""
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"window must be (left, right), each an int >= 0 or None, got {window!r}")
    out = []
    for name, side in zip(("left", "right"), window, strict=True):
        if side is not None and (isinstance(side, bool) or not isinstance(side, (int, np.integer)) or side < -1):
            raise ValueError(f"window {name} must be an int >= 0, or None or -1 (unbounded), got {side!r}")
        out.append(None if side is None or side == -1 else int(side))
    return None if out == [None, None] else (out[0], out[1])


def normalize_documents(documents: object, n_q: int, n_k: int) -> tuple[int, ...] | None:
    """Document masking (FlexAttention's ``document_id[q] == document_id[kv]`` for packed, contiguous documents):
    ``documents`` the lengths of the documents one after another, summing to N_q = N_k; a query sees the keys of its
    own document only. None, or one document, is no mask."""
    if documents is None:
        return None
    if isinstance(documents, (str, bytes)) or not hasattr(documents, "__iter__"):
        raise ValueError(f"documents must be a sequence of lengths (ints >= 1), got {documents!r}")
    out = []
    for n in documents:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"documents must be lengths, ints >= 1, got {n!r} in {documents!r}")
        out.append(int(n))
    if n_q != n_k or sum(out) != n_q:
        raise ValueError(f"documents' lengths must sum to N_q = N_k (one packed sequence): they sum to {sum(out)}, "
                         f"N_q = {n_q}, N_k = {n_k}")
    return tuple(out) if len(out) > 1 else None


def key_intervals(n_q: int, n_k: int, causal: str, window: tuple[int | None, int | None] | None,
                  rows: np.ndarray, documents: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi): query rows[r] sees the keys lo[r] .. hi[r] under the causal mask, the window and the documents (all
    that are given), clipped to [0, N_k − 1]; hi < lo where it sees none. The one statement of the visibility
    rule."""
    i = np.asarray(rows, dtype=np.int64)
    lo_off, hi_off = band_offsets(n_q, n_k, causal, window)
    lo = np.zeros_like(i) if lo_off is None else np.maximum(0, i + lo_off)
    hi = np.full_like(i, n_k - 1) if hi_off is None else np.minimum(n_k - 1, i + hi_off)
    if documents is not None:  # a row's own document: [its start, its end)
        ends = np.cumsum(documents)
        doc = np.searchsorted(ends, i, side="right")
        lo, hi = np.maximum(lo, ends[doc] - np.asarray(documents)[doc]), np.minimum(hi, ends[doc] - 1)
    return lo, hi


def band_offsets(n_q: int, n_k: int, causal: str, window: tuple[int | None, int | None] | None
                 ) -> tuple[int | None, int | None]:
    """(lo, hi): query i sees the keys i + lo .. i + hi (before clipping to [0, N_k − 1]) under the causal mask and
    the window, both when both are given; None for an unbounded side. The kernels that take a window get these
    two offsets as arguments (the WINDOW define; kernels/common.cuh)."""
    lo = hi = None
    if causal:
        hi = causal_offset(n_q, n_k, causal)
    if window is not None:
        o, (left, right) = n_k - n_q, window
        if left is not None:
            lo = o - left
        if right is not None:
            hi = o + right if hi is None else min(hi, o + right)
    return lo, hi


def visible(n_q: int, n_k: int, causal: str, window: tuple[int | None, int | None] | None, rows: np.ndarray,
            cols: np.ndarray, documents: tuple[int, ...] | None = None) -> np.ndarray | None:
    """Boolean (len rows, len cols): where key cols[c] is visible to query rows[r] (:func:`key_intervals`); None
    when neither the causal mask, a window nor documents mask anything."""
    if not causal and window is None and documents is None:
        return None
    lo, hi = key_intervals(n_q, n_k, causal, window, rows, documents)
    j = np.asarray(cols)[None, :]
    return (j >= lo[:, None]) & (j <= hi[:, None])


def key_block_ranges(n_q: int, n_k: int, br: int, bc: int, causal: str,
                     window: tuple[int | None, int | None] | None = None,
                     documents: tuple[int, ...] | None = None) -> list[tuple[int, int]]:
    """For each query block of br rows, the key blocks of bc it visits: [start, stop), those with an element
    visible to one of its rows. Under the causal mask, a window and documents every row sees one interval of keys,
    whose ends never fall from one row to the next, so the blocks a query block sees form one range ((0, 0) when it
    sees none; (0, T_c) without a mask; causal alone: the prefixes of :func:`visible_key_blocks`)."""
    out = []
    for row0 in range(0, n_q, br):
        lo, hi = key_intervals(n_q, n_k, causal, window, np.arange(row0, min(row0 + br, n_q)), documents)
        seen = hi >= lo
        out.append((int(lo[seen].min()) // bc, int(hi[seen].max()) // bc + 1) if seen.any() else (0, 0))
    return out


def visible_area(n_q: int, n_k: int, causal: str, window: tuple[int | None, int | None] | None,
                 documents: tuple[int, ...] | None = None) -> int:
    """The number of visible elements of the N_q × N_k score matrix (N_q·N_k without a mask)."""
    lo, hi = key_intervals(n_q, n_k, causal, window, np.arange(n_q), documents)
    return int(np.maximum(0, hi - lo + 1).sum())


def pair_grid(plan) -> tuple[np.ndarray, np.ndarray]:
    """(computed, causal): boolean (T_r, T_c) grids of the (query block, key block) pairs of a tiled
    plan; ``causal`` the pairs its loops visit (those with a visible element under the causal mask and the
    window; all without them), ``computed`` those of them the block mask keeps (the same without one)."""
    tile = plan.tile
    br, bc = tile["Br"], tile["Bc"]
    ranges = np.array(key_block_ranges(plan.N_q, plan.N_k, br, bc, plan.causal, plan.window, plan.documents)
                      ).reshape(-1, 2)
    j = np.arange(cdiv(plan.N_k, bc))[None, :]
    causal = (j >= ranges[:, :1]) & (j < ranges[:, 1:])
    return (causal & plan.block_grid().astype(bool) if plan.block_mask is not None else causal), causal


def pair_sums(plan) -> dict[str, int]:
    """:func:`causal_sums` over the pairs a tiled plan computes (causal mask and block mask), and
    ``N_bm``: block-mask entries its kernels read per (batch, head), one per pair they visit (the
    causally visible pairs; T_r·T_c without a causal mask)."""
    computed, causal = pair_grid(plan)
    tile = plan.tile
    rows = np.minimum(tile["Br"], plan.N_q - np.arange(0, plan.N_q, tile["Br"]))
    cols = np.minimum(tile["Bc"], plan.N_k - np.arange(0, plan.N_k, tile["Bc"]))
    g = computed.astype(np.int64)
    return {"R_K": int((g * cols[None, :]).sum()), "R_Q": int((g * rows[:, None]).sum()),
            "A_S": int((g * rows[:, None] * cols[None, :]).sum()),
            "N_qv": int(rows[computed.any(axis=1)].sum()), "N_kv": int(cols[computed.any(axis=0)].sum()),
            "N_bm": int(causal.sum())}


