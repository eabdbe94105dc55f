"""Split-KV decoding (issue #23, first CPU step; docs/notes/issue23-inference.md): how many splits of the key
sequence a decode call runs, and which key tiles each split owns. A decode call has few query rows per K/V head
(N_q·g, g query heads per K/V head, packed into one tile): one block per (query tile, K/V head) leaves most SMs
idle, so the key tiles are cut into S splits, each block writes a partial O and lse, and a combine pass merges them
by their log-sum-exp. The rule is FlashAttention-3's (hopper/heuristics.h, read, not copied): the smallest S
within 85 % of the best wave efficiency, with no split when the tiles already fill the SMs (unless one K/V head
outgrows the L2 and many query tiles reread it), or when there are 4 key tiles or fewer. Splits are then made even
(FlashAttention-2's rule: no split is left empty). The plan, the model and the simulator of the split schedule build
on these; nothing launches them yet.
"""

from __future__ import annotations

import math

from .units import cdiv

MAX_SPLITS = 128  # FlashAttention-3's cap
L2_SPLIT_BYTES = 50 * 2**20  # the nominal L2 that one K/V head must outgrow for a full grid to split anyway
FILL = 0.8  # the fraction of the SMs that query tiles alone must fill for no split
EFFICIENCY = 0.85  # of the best wave efficiency: the smallest S that reaches it


def num_splits(query_tiles: int, sms: int, key_tiles: int, *, kv_head_bytes: int = 0, masked: bool = False,
               rows_per_head_tiles: int = 1, max_splits: int = MAX_SPLITS) -> int:
    """The splits S of a decode call: ``query_tiles`` the blocks without splitting (query tiles × K/V heads ×
    batch), ``sms`` the GPU's SMs, ``key_tiles`` the key tiles of one sequence, ``kv_head_bytes`` one K/V head's K and
    V bytes, ``masked`` a causal or local mask (never split a full grid then), ``rows_per_head_tiles`` the query tiles
    per K/V head (split a full grid only when K/V would be read at least twice per SM anyway)."""
    for name, value in (("query_tiles", query_tiles), ("sms", sms), ("key_tiles", key_tiles)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if query_tiles >= FILL * sms:
        if kv_head_bytes > L2_SPLIT_BYTES and rows_per_head_tiles >= 2 * sms and not masked:
            return min(cdiv(kv_head_bytes, L2_SPLIT_BYTES), max_splits)
        return 1
    if key_tiles <= 4:
        return 1
    top = min(max_splits, sms, key_tiles)
    efficiency = []
    for s in range(1, top + 1):
        waves = query_tiles * s / sms
        efficiency.append(waves / math.ceil(waves))
    best = max(efficiency)
    return next(s for s, e in enumerate(efficiency, start=1) if e >= EFFICIENCY * best)


def split_ranges(key_tiles: int, splits: int) -> list[tuple[int, int]]:
    """The key tiles [start, stop) of each split: c = ⌈T_c / S⌉ tiles each, the last the rest; the splits are
    ⌈T_c / c⌉ ≤ S, so none is empty (S = 1: the whole range)."""
    if key_tiles < 0 or splits < 1:
        raise ValueError(f"key_tiles must be >= 0 and splits >= 1, got {key_tiles!r}, {splits!r}")
    if key_tiles == 0:
        return []
    chunk = cdiv(key_tiles, splits)
    return [(start, min(start + chunk, key_tiles)) for start in range(0, key_tiles, chunk)]
