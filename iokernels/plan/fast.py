"""Tensor-core FlashAttention forward for float16 / bfloat16 (issue #5, in progress).

``make_fast_plan`` builds the plan of the schedule ``flash/fast``: the FlashAttention-2 loop order of
``flash/q_outer`` (so the model's exact bytes and the simulator of that schedule apply unchanged),
with a tensor-core kernel's own tiles. Its effective M is the shared memory its buffers take
(``plan.smem_bytes``); ``make_plan("flash", "fast", ...)`` requires it to fit the M given, like every plan.

Three kernels:

- ``"tma"`` (``kernels/flash_tma.cu``, sm_90a only: H100/H200; the default there): the wgmma kernel's matrix
  products and softmax in B_r / 64 consumer warpgroups (64 rows each) that take turns issuing them, each
  overlapping one key block's softmax with the next block's Q Kᵀ and the last block's P V, fed by a producer
  warpgroup that only issues bulk tensor copies (TMA: Q once, K and V through a two-stage ring of shared-memory
  buffers completing on mbarriers), registers moved to the consumers with ``setmaxnreg``; tiles
  :data:`TMA_TILES`. It takes every d that is a multiple of 8 up to 256, in the tile of the next multiple of 64.
- ``"wgmma"`` (``kernels/flash_wgmma.cu``, sm_90a only): warpgroup matrix products (PTX
  ``wgmma``) reading Q and K from 128-byte-swizzled shared memory, P from registers, V transposed by
  the instruction; B_r = 128 (two warpgroups of 64 rows), B_c = 64 (d = 64) or 128 (d = 128), K and V
  double-buffered, loaded by the same threads that compute.
- ``"mma"`` (``kernels/flash_tc.cu``, sm_80 and newer): ``mma.sync`` m16n8k16 with ldmatrix;
  B_r = B_c = 64, 4 warps of 16 query rows.

``kernel=None`` picks ``"tma"`` on a compute-capability 9.0 GPU and when no GPU is visible (the
model's default target is the H200), ``"mma"`` on other GPUs. The three read and write the same bytes
(the schedule's): the counting builds count each copy where it is issued.

Grouped-query attention (``kv_heads`` < ``heads``): each query head z reads K/V head
z // (heads / kv_heads); the bytes per query head are those of ordinary attention.

Dropout on P (:func:`iokernels.plan.variants.with_dropout`, the ``DROPOUT`` define) is implemented by the
sm_90 kernels (tma, wgmma) only; ``make_plan("flash", "fast", dropout=...)`` takes no mma plan.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

import numpy as np

from .causal import key_block_ranges
from .core import Plan, Stage, Unsupported, check_problem, layout, layout_bytes
from .units import cdiv, itemsize

FAST_DTYPES = ("float16", "bfloat16")
FAST_HEAD_DIMS = (64, 128)  # the tile widths; every kernel takes these d
# the tma kernel's d: every multiple of 8 up to 256, in the tile of the next multiple of 64 (the copy engine
# zero-fills the columns past d; kernels/flash_tma.cu)
TMA_HEAD_DIMS = tuple(range(16, 257, 8))
# (tile width, causal) -> the tma kernel's (B_r, B_c), timed on an H100 (results/h100/issue21/tma-ab-820a93d.txt):
# three consumer warpgroups at d 64 unless causal (where the diagonal's masked work grows with B_r); 176 keys a tile at
# d 72-128 without a mask (FlashAttention-3's tile: fewer softmax rescales per key; results/h100/issue21/bc176/); past
# d 128, S, O and P fit the registers at 128 x 64 only
TMA_TILES = {(64, False): (192, 128), (64, True): (128, 128), (128, False): (128, 176), (128, True): (128, 128),
             (192, False): (128, 64), (192, True): (128, 64), (256, False): (128, 64), (256, True): (128, 64)}
# the tma forward's persistent grid (B_r 128, not causal alone): at most this many blocks, each taking work items (query
# block, head) in turn (kernels/flash_tma.cu); the SMs of an H100 SXM and an H200. The plan does not know the device:
# a part with fewer SMs (H100 PCIe 114) runs the blocks that do not fit as a second wave as long as the first. Causal
# items shrink along the rows: taken in turn, the blocks end unevenly (causal d 128 N 16384 ran 1.98 ms against 1.73
# for a block per item, results/h100/issue22/persist-1a15069/probe-persist.txt), so a causal plan's blocks take
# item_list's entries (ITEM_LIST, below); a window's items are all alike
TMA_FWD_CTAS = 132
# a plain tma forward in 192-row tiles (three consumer warpgroups, d up to 64) takes the persistent grid where its
# items are short, up to this many keys (16 key tiles): at d 64, B·N 16384, H 16 it ran 1.20× / 1.06× / 1.01× a block
# per item at N 512 / 1024 / 2048 (best of 4 alternating rounds; medians 1.26× / 1.12× / 1.07×), 0.96× / 0.92× at 4096
# / 16384 (results/h200/issue22/p192-d6f8ed2/ab.txt; with_wide_persistent)
TMA_WIDE_PERSISTENT_KEYS = 2048
# a causal tma grid of a block per (query or key block, head) is taken in bands of heads (kernels/common.cuh IOK_GRID_X:
# each band's blocks longest first across its heads), a band at least this many waves of TMA_FWD_CTAS blocks: the grid
# then ends on short blocks (one head after another ends on the last head's longest), and the blocks in flight share a
# few heads' tiles in the L2 (every head's longest first, one band, ran the causal backward 25 % slower:
# results/h100/issue21/README.md). A list schedule of the items (steps + 2 each, 132 SMs) puts one head after another
# at 0.94 of the ideal at N 4096 (B 4, H 16, 128 rows), bands of 8 at 0.997; 0.999 either way at N 16384
HEAD_BAND_WAVES = 1.5
HEAD_BAND_MAX_WAVES = 4  # a band past this (no divisor of B·H between): one head after another instead
TMA_KERNEL = "flash_tma_fwd"
FAST_KERNELS = ("tma", "wgmma", "mma")
SM90_KERNELS = ("tma", "wgmma")  # the kernels with dropout (sm_90a)
# kernel -> (stage kernel name, default (B_r, B_c) per d; tma's per (tile width, causal)); wgmma and mma run
# 2 B_r threads per block (a warp per 16 rows, or a warpgroup per 64), tma a producer warpgroup besides
_KERNELS = {
    "wgmma": ("flash_wgmma_fwd", {64: (128, 64), 128: (128, 128)}),
    "mma": ("flash_tc_fwd", {64: (64, 64), 128: (64, 64)}),
    "tma": (TMA_KERNEL, TMA_TILES),
}
# (d, B_r, B_c) tile variants that compile without spills, timed by scripts/fast_probe.py
FAST_TUNING = ((64, 128, 64), (128, 128, 64), (64, 128, 128), (64, 64, 128))
# make_plan's tiles where the defaults do not fit M: tma's, then wgmma's (then the mma kernel)
TMA_FALLBACK = {"block_r": 128, "block_c": 64}
# tma's tiles with dropout (tile width -> B_r, B_c): at d = 128 the counting build of B_c = 128 with Philox would
# spill
TMA_DROPOUT_TILES = {64: (128, 128), 128: (128, 64), 192: (128, 64), 256: (128, 64)}
WGMMA_FALLBACK = {"block_r": 128, "block_c": 64}
WGMMA_TUNING = ((64, 192, 64), (64, 256, 64), (64, 128, 128), (64, 192, 128), (128, 128, 64), (128, 64, 128))


def default_kernel() -> str:
    """``"tma"`` on a compute-capability 9.x GPU or with no GPU visible, else ``"mma"``."""
    try:
        import cupy as cp

        major = int(cp.cuda.Device().compute_capability[:-1])
    except Exception:  # no cupy, no driver, no device: the model's default target (H200)
        return "tma"
    return "tma" if major == 9 else "mma"


def tile_head_dim(d: int) -> int:
    """The tile width that holds d columns: the next multiple of 64 (d itself where it is one)."""
    return -(-d // 64) * 64


def tile_params(d: int) -> tuple[tuple[str, int], ...]:
    """The stage parameter of a kernel that runs d inside a wider tile: ``HEAD_D_TILE`` where the tile width is not
    d (kernels/wg.cuh's TILE_D), none where it is."""
    tile_d = tile_head_dim(d)
    return () if tile_d == d else (("HEAD_D_TILE", tile_d),)


def fast_buffers(d: int, e: int, block_r: int = 64, block_c: int = 64) -> list[tuple[str, int]]:
    """Shared memory of both kernels: Q_i, and two stages of K_j and V_j."""
    tile = block_c * d * e
    return [("Q", block_r * d * e), ("K0", tile), ("K1", tile), ("V0", tile), ("V1", tile)]


def persistent_grid(items: int) -> tuple[int, int, int]:
    """The grid of a persistent tma stage over ``items`` work items: one block per item up to :data:`TMA_FWD_CTAS`."""
    return (min(items, TMA_FWD_CTAS), 1, 1)


def make_fast_plan(*, N_q: int, N_k: int | None = None, d: int, dtype: str, batch: int = 1,
                   heads: int = 1, block_r: int | None = None, block_c: int | None = None,
                   kernel: str | None = None, kv_heads: int | None = None, causal: bool = False,
                   persistent: bool | None = None, dropout: bool = False) -> Plan:
    """The plan of a tensor-core forward kernel for one problem (:class:`iokernels.plan.core.Unsupported`,
    a ValueError, when the kernel does not take the problem).

    ``kernel``: ``"tma"``, ``"wgmma"`` or ``"mma"`` (default :func:`default_kernel`). ``block_r`` and
    ``block_c`` override the tiles, for tuning: mma takes multiples of 16 (16 rows per warp), wgmma
    B_r a multiple of 64 up to 256 (64 rows per warpgroup) and B_c of 64 or 128, tma B_r 128 (or 192 at d up to
    64) and B_c 64 or 128 (64 past d 128; 176 at B_r 128 and d up to 128 without dropout). ``kv_heads``:
    grouped-query attention, K and V with that many heads
    (dividing ``heads``; default ``heads``). ``causal``: a causal plan's default tiles (:data:`TMA_TILES`; the mask
    itself is added by :func:`iokernels.plan.variants.with_causal`) and, for tma, a block per work item.
    ``persistent``: tma's persistent grid (:data:`TMA_FWD_CTAS`; B_r 128, or 192 asked for, without causal or dropout:
    :func:`with_wide_persistent` is the default's rule); None: at B_r 128 always, with ``causal`` its
    blocks taking the items of :func:`item_list` (not with dropout: a block per item).
    ``dropout``: a plan for dropout (past d 128 a block per item: the persistent counting build would spill)."""
    N_k = N_q if N_k is None else N_k
    dtype = check_problem(N_q, N_k, d, dtype, batch, heads)
    kernel = default_kernel() if kernel is None else kernel
    if kernel not in _KERNELS:
        raise ValueError(f"kernel must be one of {FAST_KERNELS}, got {kernel!r}")
    if dtype not in FAST_DTYPES:
        raise Unsupported(f"flash/fast (tensor cores) takes {' or '.join(FAST_DTYPES)}, got {dtype}")
    if d not in (TMA_HEAD_DIMS if kernel == "tma" else FAST_HEAD_DIMS):
        raise Unsupported(f"flash/fast (tensor cores) takes d in {FAST_HEAD_DIMS} (the tma kernel on sm_90: a "
                          f"multiple of 8 from 16 to 256), got d={d} with kernel {kernel}")
    tile_d = tile_head_dim(d)
    name, defaults = _KERNELS[kernel]
    tiles = defaults[tile_d, bool(causal)] if kernel == "tma" else defaults[tile_d]
    block_r = tiles[0] if block_r is None else block_r
    block_c = tiles[1] if block_c is None else block_c
    if kernel == "tma":
        if block_r not in (128, 192) or block_c not in (64, 128, 176):
            raise ValueError(f"tma tiles: block_r 128 or 192 and block_c in (64, 128, 176), got {block_r!r}, "
                             f"{block_c!r}")
        if block_r == 192 and tile_d > 64:
            raise ValueError(f"tma tiles: block_r 192 (three consumer warpgroups, 160 registers each) takes d up to "
                             f"64, got d={d}")
        if block_c == 176 and (block_r != 128 or tile_d > 128 or dropout):
            raise ValueError(f"tma tiles: block_c 176 takes block_r 128, d up to 128 and no dropout, got block_r "
                             f"{block_r!r}, d={d}, dropout={dropout}")
        if tile_d > 128 and (block_r, block_c) != (128, 64):
            raise ValueError(f"tma tiles past d 128: block_r 128 and block_c 64 (S, O and P in the registers), got "
                             f"{block_r!r}, {block_c!r} at d={d}")
    elif kernel == "wgmma":
        if block_r not in (64, 128, 192, 256) or block_c not in (64, 128):
            raise ValueError(f"wgmma tiles: block_r in (64, 128, 192, 256) and block_c in (64, 128), "
                             f"got {block_r!r}, {block_c!r}")
    else:
        for label, value, top in (("block_r", block_r, 256), ("block_c", block_c, 128)):
            if not isinstance(value, int) or value % 16 or not 16 <= value <= top:
                raise ValueError(f"{label} must be a multiple of 16 from 16 to {top}, got {value!r}")
    buffers = fast_buffers(tile_d, itemsize(dtype), block_r, block_c)
    tr, tc = cdiv(N_q, block_r), cdiv(N_k, block_c)
    threads = 2 * block_r + (128 if kernel == "tma" else 0)  # tma: and the producer warpgroup
    params = tile_params(d)
    grid = (tr, 1, batch * heads)
    if kernel == "tma":  # one work item (query block, head) per block, or a persistent grid at B_r 128
        listed = causal and persistent is None and block_r == 128 and not dropout  # (the causal grid: item_list)
        persistent = ((block_r == 128 and (listed or (not causal if persistent is None else persistent)))
                      or (block_r == 192 and persistent is True and not causal and not dropout))
        persistent = persistent and not (dropout and tile_d > 128)  # (its counting build would spill)
        grid = persistent_grid(tr * batch * heads) if persistent else grid
        params = (*params, ("PERSISTENT", 1), *((("ITEM_LIST", 1),) if listed else ())) if persistent else params
    stage = Stage("main", name, grid, threads, layout(buffers), params)
    return Plan(algorithm="flash", schedule="fast", direction="fwd", N_q=N_q, N_k=N_k, d=d, dtype=dtype,
                sram_bytes=layout_bytes(buffers), batch=batch, heads=heads,
                tiles=(("Br", block_r), ("Bc", block_c), ("Tr", tr), ("Tc", tc)), stages=(stage,),
                kv_heads=heads if kv_heads is None else kv_heads)


def make_fast_plan_within(sram: int, *, dropout: bool = False, causal: bool = False, window: bool = False,
                          per_item: bool = False, **problem) -> Plan:
    """The fastest tensor-core plan whose shared memory fits ``sram`` bytes: the default kernel's
    default tiles, else (tma) B_c = 64, else wgmma with B_c = 64, else the mma kernel's tiles. Raises ValueError
    naming the smallest M that works when none fits (the caller turns it into SramTooSmall). ``dropout``: the
    sm_90 kernels' plans only (Unsupported where the kernel is mma), tma with :data:`TMA_DROPOUT_TILES`. ``causal``:
    a masked plan's default tiles (:data:`TMA_TILES`; make_plan passes it for a window too). ``window``: a sliding
    window's plan, tma's tilings only (the kernel that takes one), persistent (its items are alike). ``per_item``: a
    block mask's or ALiBi's, tma's tilings only, a block per work item (its list of kept key tiles, its slope read
    first)."""
    kernel = problem.pop("kernel", None) or default_kernel()
    d = problem["d"]
    if dropout and kernel not in SM90_KERNELS:
        raise Unsupported("dropout in the tensor-core forward is implemented by the sm_90 kernels (flash_tma.cu, "
                          "flash_wgmma.cu); the mma.sync kernel (flash_tc.cu) has none")
    options = [{"kernel": kernel}]
    if kernel == "tma":
        if dropout:
            tiles = TMA_DROPOUT_TILES[tile_head_dim(d)]
            options = [{"kernel": "tma", "block_r": tiles[0], "block_c": tiles[1]}]
        options += [{"kernel": "tma", **TMA_FALLBACK}]
    # the other kernels: no d inside a wider tile, and no window
    if kernel in SM90_KERNELS and d in FAST_HEAD_DIMS and not ((window or per_item) and kernel == "tma"):
        options += [{"kernel": "wgmma", **WGMMA_FALLBACK}] + ([] if dropout else [{"kernel": "mma"}])
    persistent = False if per_item else True if window else None
    plans = [make_fast_plan(**problem, **o, causal=causal, persistent=persistent, dropout=dropout) for o in options]
    for plan in plans:
        if plan.smem_bytes <= sram:
            return plan
    smallest = min(plans, key=lambda p: p.smem_bytes)
    raise NoFastTilingFits(smallest, f"d={d}, tiles {smallest.describe_tiles()}")


def with_wide_persistent(plan: Plan) -> Plan:
    """``plan`` on the persistent grid if it is a plain tma forward (no mask, window, softcap, ALiBi, mods, dropout or
    documents) in 192-row tiles with at most :data:`TMA_WIDE_PERSISTENT_KEYS` keys; any other plan as it is. The
    bytes do not change (each item's as a block per item's)."""
    if plan.schedule != "fast" or plan.direction != "fwd" or plan.variant or plan.tile.get("Br") != 192:
        return plan
    stage = plan.stage("main")
    plain = set(dict(stage.params)) <= {"HEAD_D_TILE"} and not plan.causal and plan.window is None \
        and plan.documents is None and plan.dropout is None
    if stage.kernel != TMA_KERNEL or not plain or plan.N_k > TMA_WIDE_PERSISTENT_KEYS:
        return plan
    grid = persistent_grid(plan.tile["Tr"] * plan.bh)
    return replace(plan, stages=(replace(stage, grid=grid, params=(*stage.params, ("PERSISTENT", 1))),))


class NoFastTilingFits(ValueError):
    """No tensor-core forward tiling fits M; ``plan`` is the smallest one (make_plan turns this into SramTooSmall)."""

    def __init__(self, plan: Plan, detail: str) -> None:
        super().__init__(detail)
        self.plan, self.detail = plan, detail



def head_band(blocks_per_head: int, heads: int) -> int:
    """Heads per band of a causal tma grid (:data:`HEAD_BAND_WAVES`): the smallest divisor of ``heads`` (the grid's
    batch·heads) whose bands hold HEAD_BAND_WAVES · TMA_FWD_CTAS blocks or more, else ``heads``; 1 (one head after
    another, the kernels' order without bands) where that band would hold more than HEAD_BAND_MAX_WAVES waves."""
    need = HEAD_BAND_WAVES * TMA_FWD_CTAS
    band = next(b for b in range(1, heads + 1) if heads % b == 0 and (b * blocks_per_head >= need or b == heads))
    return band if band * blocks_per_head <= HEAD_BAND_MAX_WAVES * TMA_FWD_CTAS else 1


# a causal tma plan's persistent grid (ITEM_LIST: the forward's, kernels/flash_tma.cu, and the narrow backward's,
# kernels/flash_tma_bwd.cu) takes its items (query block or key block, head) from a list made here: in the order a grid
# of a block per item hands them out (each head's longest first, in bands of heads: head_band), each to the block that
# is free first when an item costs its steps (key tiles, or query tiles times the heads sharing the K/V head) plus this
# many (the list schedule the hardware makes of a block per item). A block then loads an item's first tiles while it
# finishes the one before
ITEM_OVERHEAD_STEPS = 1


def listed(plan: Plan) -> bool:
    """Whether a stage of ``plan`` takes a persistent grid's list of items (``ITEM_LIST``, :func:`item_list`)."""
    return any(dict(s.params).get("ITEM_LIST") for s in plan.stages)


def list_items(plan: Plan) -> tuple[int, int]:
    """(T, heads) of an ``ITEM_LIST`` plan's items, z · T + x each: (T_r, batch·heads) forward, (T_c, batch·K/V heads)
    backward."""
    if plan.direction == "fwd":
        return plan.tile["Tr"], plan.bh
    return plan.tile["Tc"], plan.bh_kv


def item_steps(plan: Plan) -> list[int]:
    """The steps of each item of a causal tma plan, by its block index along the rows (forward: query blocks, the key
    tiles each visits; with a block mask, the kept ones of them) or columns (backward: key blocks, the query tiles of
    every query head sharing its K/V head)."""
    br, bc = plan.tile["Br"], plan.tile["Bc"]
    ranges = key_block_ranges(plan.N_q, plan.N_k, br, bc, plan.causal, plan.window)
    if plan.direction == "fwd":
        if plan.block_mask is not None:
            grid = plan.block_grid()
            return [int(np.count_nonzero(grid[x, a:b])) for x, (a, b) in enumerate(ranges)]
        return [b - a for a, b in ranges]
    group = plan.heads // plan.kv_heads
    return [group * sum(a <= kb < b for a, b in ranges) for kb in range(plan.tile["Tc"])]


def item_list(plan: Plan) -> np.ndarray:
    """The list an ``ITEM_LIST`` stage reads (int32): G + 1 offsets (G = its grid's blocks; block b takes the entries
    [offsets[b], offsets[b + 1])), then the entries, z · T + (block along the rows or columns) each (T = T_r and z the
    batch·head forward, T = T_c and z the batch·K/V head backward), every item once."""
    steps, (t, heads) = item_steps(plan), list_items(plan)
    blocks = plan.stage("main").grid[0]
    band = head_band(t, heads)
    # forward: row block t - 1 - x first (a causal grid's longest); backward: key block x; each band's items longest
    # first (a stable sort: the causal plans' order as it is, a block mask's rows by their kept tiles)
    order = [(z0 + h, t - 1 - x if plan.direction == "fwd" else x) for z0 in range(0, heads, band) for x in range(t)
             for h in range(band)]
    order.sort(key=lambda item: (item[0] // band, -steps[item[1]]))
    lists: list[list[int]] = [[] for _ in range(blocks)]
    finish = [(0, b) for b in range(blocks)]  # (when it is free, block): a heap
    for z, r in order:
        free, b = heapq.heappop(finish)
        lists[b].append(z * t + r)
        heapq.heappush(finish, (free + steps[r] + ITEM_OVERHEAD_STEPS, b))
    offsets = np.cumsum([0] + [len(x) for x in lists])
    return np.concatenate([offsets, *map(np.asarray, lists)]).astype(np.int32)


def with_listed_blocks(plan: Plan) -> Plan:
    """A block-sparse tma forward (a block per item) as a persistent grid taking :func:`item_list` (``ITEM_LIST``; its
    items' steps the kept tiles of their rows, so the list balances them); unchanged where the kernel keeps a block per
    item (dropout, ALiBi, a programmable variant or an explicit mask, B_r other than 128) and for any other plan."""
    main = next((s for s in plan.stages if s.name == "main"), None)
    params = {} if main is None else dict(main.params)
    if plan.block_mask is None or plan.direction != "fwd" or main is None or main.kernel != "flash_tma_fwd" \
            or plan.tile["Br"] != 128 or "PERSISTENT" in params \
            or {"DROPOUT", "ALIBI", "MASK_MOD", "SCORE_MOD", "MOD_STAGE"} & set(params):
        return plan
    kept = tuple((k, v) for k, v in main.params if k != "HEAD_BAND")  # (the list keeps the bands' order)
    return on_item_list(plan, (*kept, ("PERSISTENT", 1)))


def on_item_list(plan: Plan, params: tuple[tuple[str, object], ...]) -> Plan:
    """``plan`` with its main stage a persistent grid taking :func:`item_list`'s entries: ``params`` and
    ``ITEM_LIST``, at most :data:`TMA_FWD_CTAS` blocks (one per item where there are fewer)."""
    main = plan.stage("main")
    t, heads = list_items(plan)
    stage = replace(main, grid=persistent_grid(t * heads), params=(*params, ("ITEM_LIST", 1)))
    return replace(plan, stages=tuple(stage if s is main else s for s in plan.stages))


def list_readers(plan: Plan) -> int:
    """The reads of each entry of :func:`item_list` by an ``ITEM_LIST`` stage: forward, the producer's thread and lane
    0 of each consumer warp (2 B_r / 32); backward, lane 0 of the loader's warp, of the dQ writer's and of each
    consumer warp (2 B_c / 32)."""
    if plan.direction == "fwd":
        return 1 + 2 * plan.tile["Br"] // 32
    return 2 + 2 * plan.tile["Bc"] // 32


def item_list_bytes(plan: Plan) -> int:
    """The bytes of :func:`item_list` an ``ITEM_LIST`` stage reads: two offsets per block (its thread 0), and each
    entry :func:`list_readers` times."""
    t, heads = list_items(plan)
    return 4 * (2 * plan.stage("main").grid[0] + t * heads * list_readers(plan))
