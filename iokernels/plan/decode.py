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

from .core import Plan, Stage, check_problem, layout, layout_bytes
from .units import cdiv, itemsize

DECODE_VARIANTS = ("split", "packed")  # Plan.variant of the decode plans: several splits and a combine, or one
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


# the query rows of a packed tile (the g query heads of a K/V head times N_q): one consumer warpgroup's 64, or 128
DECODE_ROWS = (64, 128)
DECODE_SMS = 132  # the SMs the split count is chosen for by default (an H100 SXM's, an H200's)


def make_decode_plan(*, N_q: int, N_k: int, d: int, dtype: str, batch: int = 1, heads: int = 1,
                     kv_heads: int | None = None, splits: int | None = None, sms: int = DECODE_SMS) -> Plan:
    """The split-KV decode plan (model and simulator only: no kernel yet; issue #23): the g = heads / kv_heads query
    heads of a K/V head and their N_q rows packed into one tile of B_r rows (64 or 128; more rows: several tiles),
    the key tiles (B_c 128, 64 past d 128) cut into S splits (``splits``, default :func:`num_splits` for ``sms``),
    each block (split, packed tile, batch·K/V head) reading its Q rows, its split's K and V, and writing a float32
    partial O and lse (Opart, lse_part) that the ``combine`` stage merges by their log-sum-exp into O and lse. One
    split: variant "packed", the block writes O and lse itself. Not causal (decode with N_q ≤ N_k sees every key)."""
    dtype = check_problem(N_q, N_k, d, dtype, batch, heads)
    kv_heads = heads if kv_heads is None else kv_heads
    if not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads must divide heads={heads}, got {kv_heads!r}")
    rows = heads // kv_heads * N_q  # packed query rows per K/V head
    block_r = DECODE_ROWS[0] if rows <= DECODE_ROWS[0] else DECODE_ROWS[1]
    block_c = 128 if d <= 128 else 64
    t_m, t_c = cdiv(rows, block_r), cdiv(N_k, block_c)
    blocks = t_m * batch * kv_heads
    if splits is None:
        splits = num_splits(blocks, sms, t_c, kv_head_bytes=2 * N_k * d * itemsize(dtype), rows_per_head_tiles=t_m)
    elif not isinstance(splits, int) or splits < 1:
        raise ValueError(f"splits must be an int >= 1, got {splits!r}")
    used = len(split_ranges(t_c, splits))  # splits with a key tile (none empty)
    e = itemsize(dtype)
    buffers = [("Q", block_r * d * e), ("K0", block_c * d * e), ("K1", block_c * d * e), ("V0", block_c * d * e),
               ("V1", block_c * d * e)]
    main = Stage("main", "flash_tma_decode", (used, t_m, batch * kv_heads), 2 * block_r + 128, layout(buffers),
                 (("SPLITS", used),))
    stages = (main,)
    if used > 1:
        per_block = max(1, 256 // d)  # rows per combine block: a warp per row at d 128
        stages += (Stage("combine", "flash_combine", (cdiv(batch * heads * N_q, per_block), 1, 1), 256, (), ()),)
    return Plan(algorithm="flash", schedule="fast", direction="fwd", N_q=N_q, N_k=N_k, d=d, dtype=dtype,
                sram_bytes=layout_bytes(buffers), batch=batch, heads=heads, kv_heads=kv_heads,
                variant="split" if used > 1 else "packed",
                tiles=(("Br", block_r), ("Bc", block_c), ("Tr", t_m), ("Tc", t_c), ("S", used)), stages=stages)
