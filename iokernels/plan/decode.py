"""Split-KV decoding (issue #23; docs/notes/issue23-inference.md): how many splits of the key sequence a decode call
runs, and which key tiles each split owns. A decode call has few query rows per K/V head (N_q·g, g query heads per
K/V head, packed into one tile): one block per (query tile, K/V head) leaves most SMs idle, so the key tiles are cut
into S splits, each block writes a partial O and lse, and a combine pass merges them by their log-sum-exp. Decode is
bound by the K/V bytes, every key tile costs an SM the same time, and a block holds its SM alone (the tma tile's
registers): so S is the split count with the least modelled time per SM (:func:`num_splits`: whole waves of blocks
times the tiles of each, plus the combine's launch and its partials), not FlashAttention-3's "smallest S within 85 %
of the best wave efficiency" (hopper/heuristics.h), which left 12 of 132 SMs idle in the design note's case (15 splits
of 8 K/V heads; 16 run it in 8 tiles a block instead of 9). Splits are then made even (FlashAttention-2's rule: no
split is left empty). The plan, the model and the simulator of the split schedule build on these; the kernels are
flash_tma.cu built with SPLIT and combine.cu.
"""

from __future__ import annotations

from .core import Plan, Stage, Unsupported, check_problem, layout, layout_bytes
from .fast import FAST_DTYPES, TMA_HEAD_DIMS, fast_buffers, persistent_grid, tile_head_dim, tile_params
from .kvcache import KvCache
from .units import ACC_ITEMSIZE, cdiv, itemsize

DECODE_VARIANTS = ("split", "packed")  # Plan.variant of the decode plans: several splits and a combine, or one
MAX_SPLITS = 128  # the combine's cap (its weights in shared memory), FlashAttention-3's too
# the combine is a second launch: about one K/V tile pair's time on an SM (measured on an H100: the combine stage 2.1
# to 3.3 µs; an SM streams a 64 KB tile pair in about 2.8 µs at its share of ~3 TB/s)
COMBINE_LAUNCH_TILES = 1.0
# a block's own start and end (its barriers, Q, the pipeline's filling and draining, the epilogue), in tile pairs: on
# an H200 (d 128, fp16, graph replays of the public call, results/h200/issue23/split-58dd68b/) B 4 x 8 K/V heads at
# N_k 131072 took 492.9 µs in one wave of 128 blocks of 256 tiles and 502.6 in ten waves of 41 splits of 25 tiles,
# about one tile pair more per block; B 1 the same: 16 splits (one wave of 64 tiles) 131.7 µs, 49 (three of 21)
# 136.4. (On an H100, 32 splits of one tile over B 64 took 483 µs where the same bytes in 512 blocks of 32 tiles took
# 357, about 0.2 of a tile pair more per block: results/h100/issue23/.)
BLOCK_TILES = 1.0


def num_splits(blocks: int, sms: int, key_tiles: int, *, partial_tiles: float = 0.0,
               max_splits: int = MAX_SPLITS) -> int:
    """The splits S of a decode call with the least modelled time: ``blocks`` the blocks without splitting (packed
    query tiles × batch·K/V heads), ``sms`` the GPU's SMs (one block each at a time), ``key_tiles`` T_c the key tiles
    of a sequence, ``partial_tiles`` what one split's partials cost an SM (written and read back, over the SMs), in
    K/V tile pairs. With S' = ⌈T_c / ⌈T_c / S⌉⌉ non-empty splits of ⌈T_c / S⌉ tiles, the time in tile pairs per SM
    is ⌈blocks·S' / sms⌉ · (⌈T_c / S⌉ + :data:`BLOCK_TILES`), plus, when S' > 1, :data:`COMBINE_LAUNCH_TILES` +
    S'·``partial_tiles``; the smallest S of the least time."""
    for name, value in (("blocks", blocks), ("sms", sms), ("key_tiles", key_tiles), ("max_splits", max_splits)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")

    def cost(s: int) -> float:
        chunk = cdiv(key_tiles, s)
        used = cdiv(key_tiles, chunk)
        waves = cdiv(blocks * used, sms) * (chunk + BLOCK_TILES)
        return waves + (COMBINE_LAUNCH_TILES + used * partial_tiles if used > 1 else 0.0)

    return min(range(1, min(max_splits, key_tiles) + 1), key=lambda s: (cost(s), s))


def split_ranges(key_tiles: int, splits: int) -> list[tuple[int, int]]:
    """The key tiles [start, stop) of each split: c = ⌈T_c / S⌉ tiles each, the last the rest; the splits are
    ⌈T_c / c⌉ ≤ S, so none is empty (S = 1: the whole range)."""
    if key_tiles < 0 or splits < 1:
        raise ValueError(f"key_tiles must be >= 0 and splits >= 1, got {key_tiles!r}, {splits!r}")
    if key_tiles == 0:
        return []
    chunk = cdiv(key_tiles, splits)
    return [(start, min(start + chunk, key_tiles)) for start in range(0, key_tiles, chunk)]


# the query rows of a packed tile (the g query heads of a K/V head times N_q): flash_tma.cu's tile, two consumer
# warpgroups of 64 rows; one of 64 rows (DECODE_BLOCK_R_SMALL) where the packed rows fit it, d ≤ 128 and the grid is
# not the persistent one (which keeps two): the products of the rows left empty cost as much time as reading the
# tile's K and V on an H200 (docs/notes/issue23-inference.md)
DECODE_BLOCK_R = 128
DECODE_BLOCK_R_SMALL = 64
DECODE_SMS = 132  # the SMs the split count is chosen for by default (an H100 SXM's, an H200's)
COMBINE_THREADS = 256  # the combine kernel: a warp per output row
APPEND_THREADS = 256  # the append kernel: a warp per new row


def make_decode_plan(*, N_q: int, N_k: int, d: int, dtype: str, batch: int = 1, heads: int = 1,
                     kv_heads: int | None = None, splits: int | None = None, sms: int = DECODE_SMS,
                     kv_cache: KvCache | None = None, causal: bool = False) -> Plan:
    """The split-KV decode plan (issue #23): the g = heads / kv_heads query heads of a K/V head and their N_q rows
    packed into tiles of B_r = 128 rows (the Q and O of a K/V head are one contiguous (g·N_q, d) slab in the
    (batch, heads, N_q, d) layout), the key tiles (B_c 128, 64 past d 128) cut into S splits (``splits``, default
    :func:`num_splits` for ``sms``); each block (packed tile, split, batch·K/V head) of ``flash_tma.cu`` built with
    SPLIT reads its Q rows and its split's K and V and writes a float32 partial O and lse (Opart, lse_part), which
    the ``combine`` stage (``combine.cu``, launched as a programmatic dependent launch: PDL) merges by their
    log-sum-exp into O and lse. One split: variant "packed",
    the tma forward itself on the packed rows (a persistent grid) writes O and lse.

    ``causal``: the bottom-right causal mask (Plan.causal "bottom_right"; the kernels' PACKED_CAUSAL): query i of N_q
    sees the keys up to N_k − N_q + i (with a cache: its sequence's length for N_k); every key tile is read as without
    it (the last query sees them all). With N_q = 1 it masks nothing and is left out.

    ``kv_cache`` (:mod:`iokernels.plan.kvcache`): sequences of their own lengths, N_k the capacity (the splits are
    cut from its tiles; a split past a sequence's end does nothing), contiguous or paged; the kernels read the lengths
    (RAGGED) and the page table (PAGED) at run time, one block per work item. With ``append`` new keys a stage
    ``append`` (``kvcache.cu``, a warp per new row) first writes them after each sequence's keys, which the attention
    then sees too."""
    dtype = check_problem(N_q, N_k, d, dtype, batch, heads)
    kv_heads = heads if kv_heads is None else kv_heads
    if not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads must divide heads={heads}, got {kv_heads!r}")
    if d not in TMA_HEAD_DIMS or dtype not in FAST_DTYPES:
        raise Unsupported(f"the split-KV decode runs on the sm_90 tma kernel: float16 or bfloat16, d a multiple of 8 "
                          f"from 16 to 256; got d={d}, {dtype}")
    rows = heads // kv_heads * N_q  # packed query rows per K/V head
    tile_d = tile_head_dim(d)
    block_c = 128 if tile_d <= 128 else 64
    block_r = DECODE_BLOCK_R_SMALL if rows <= DECODE_BLOCK_R_SMALL and tile_d <= 128 else DECODE_BLOCK_R
    t_m, t_c = cdiv(rows, block_r), cdiv(N_k, block_c)
    bh_kv = batch * kv_heads
    if splits is None:  # one split's partials (float32 O and lse, written and read), over the SMs, in tile pairs
        partial = 2 * batch * heads * N_q * (d + 1) * ACC_ITEMSIZE / (sms * 2 * block_c * d * itemsize(dtype))
        splits = num_splits(t_m * bh_kv, sms, t_c, partial_tiles=partial)
    elif not isinstance(splits, int) or splits < 1:
        raise ValueError(f"splits must be an int >= 1, got {splits!r}")
    # the splits with a key tile (none empty): c = ⌈T_c / S⌉ tiles each, the last the rest; S := ⌈T_c / c⌉, for which
    # ⌈T_c / S⌉ is c again (the kernel's split s takes tiles [s c, s c + c))
    used = len(split_ranges(t_c, splits))
    if used == 1 and kv_cache is None:  # the persistent grid: two consumer warpgroups
        block_r = DECODE_BLOCK_R
        t_m = cdiv(rows, block_r)
    buffers = fast_buffers(tile_d, itemsize(dtype), block_r, block_c)
    threads = 2 * block_r + 128  # and the producer warpgroup
    params = tile_params(d)
    cache: tuple[tuple[str, int], ...] = ()
    if kv_cache is not None:
        cache = (("RAGGED", 1),) + ((("PAGED", kv_cache.page_size),) if kv_cache.paged else ())
    causal = bool(causal) and N_q > 1
    mask = (("PACKED_CAUSAL", 1),) if causal else ()
    first: tuple[Stage, ...] = ()
    if kv_cache is not None and kv_cache.append:
        rows_per_block = APPEND_THREADS // 32
        first = (Stage("append", "kv_append", (cdiv(kv_cache.append, rows_per_block), 1, bh_kv), APPEND_THREADS,
                       (), cache),)  # no shared memory
    if used > 1:
        stages: tuple[Stage, ...] = (
            Stage("main", "flash_tma_split", (t_m, used, bh_kv), threads, layout(buffers),
                  (*params, ("SPLIT", 1), *cache, *mask)),
            Stage("combine", "flash_combine", (cdiv(batch * heads * N_q, COMBINE_THREADS // 32), 1, 1),
                  COMBINE_THREADS, layout([("weights", COMBINE_THREADS // 32 * MAX_SPLITS * 4)]),
                  (("PDL", 1), *cache[:1])),
        )
    elif kv_cache is not None:  # the tma forward on the packed rows, a block per item (its lengths read first)
        stages = (Stage("main", "flash_tma_fwd", (t_m, 1, bh_kv), threads, layout(buffers),
                        (*params, *cache, *mask)),)
    else:  # the tma forward on the packed rows, persistent as its dense plans
        stages = (Stage("main", "flash_tma_fwd", persistent_grid(t_m * bh_kv), threads, layout(buffers),
                        (*params, ("PERSISTENT", 1), *mask)),)
    return Plan(algorithm="flash", schedule="fast", direction="fwd", N_q=N_q, N_k=N_k, d=d, dtype=dtype,
                sram_bytes=layout_bytes(buffers), batch=batch, heads=heads, kv_heads=kv_heads,
                variant="split" if used > 1 else "packed",
                tiles=(("Br", block_r), ("Bc", block_c), ("Tr", t_m), ("Tc", t_c), ("S", used)),
                stages=first + stages, kv_cache=kv_cache, causal="bottom_right" if causal else "")


def sequence_splits(plan: Plan, length: int) -> int:
    """The non-empty splits of a sequence of ``length`` keys: the plan's splits of c tiles (cut from the capacity's
    T_c) that hold one of its ⌈length / B_c⌉ tiles (0 for an empty sequence)."""
    t = plan.tile
    chunk = cdiv(t["Tc"], t["S"])
    return cdiv(cdiv(length, t["Bc"]), chunk)


def decode_sums(plan: Plan) -> dict[str, int]:
    """A decode plan's per-sequence sums, over the batch, for the model and the simulator: ``rows`` the key rows each
    K/V head's copies load (a tile past a sequence's end is not loaded; a contiguous cache's last tile loads its rows
    up to the capacity, a paged one its pages' rows: whole boxes of min(page size, B_c) rows; the lengths with the
    appended keys), ``splits`` the non-empty splits, ``entries`` the page-table entries a K/V head's K (or V) copies
    read (one per box), ``batch`` the sequences. Without a cache: every sequence N_k keys in every split."""
    t, cache = plan.tile, plan.kv_cache
    if cache is None:
        return {"rows": plan.batch * plan.N_k, "splits": plan.batch * t["S"], "entries": 0, "batch": plan.batch}
    if cache.lengths is None:
        raise ValueError(f"{plan.label}: the cache's lengths are not known (a launch plan): no exact bytes")
    box = min(cache.page_size, t["Bc"]) if cache.paged else t["Bc"]
    rows = entries = 0
    lengths = [cache.keys(n) for n in cache.lengths]  # with the appended keys
    for n in lengths:
        boxes = cdiv(n, box)
        rows += boxes * box if cache.paged else min(cdiv(n, t["Bc"]) * t["Bc"], plan.N_k)
        entries += boxes if cache.paged else 0
    return {"rows": rows, "splits": sum(sequence_splits(plan, n) for n in lengths), "entries": entries,
            "batch": plan.batch}


def packed_rows(plan: Plan) -> int:
    """The query rows of one K/V head in a decode plan's packed tiles (g·N_q): the n_q its main kernel sees."""
    return plan.heads // plan.kv_heads * plan.N_q
