"""Tiles of the research schedules: standard attention, two_pass, flash kv_outer / q_outer and the flash
backward (CUDA-core kernels, every dtype and head dimension).

Tile rules (M_el = M / itemsize, the paper's M in elements):

* ``flash``/``kv_outer`` (paper Algorithm 1) and the ``flash`` backward: B_c = ceil(M_el / 4d),
  B_r = min(B_c, d); when the buffers do not fit in M, B_c shrinks first, keeping B_c >= B_r, then B_r.
* ``flash``/``q_outer`` (FlashAttention-2 order) and ``two_pass``: the same rule with the roles
  swapped (the Q block is the resident one): B_r = ceil(M_el / 4d), B_c = min(B_r, d).
* ``standard``: tiled matrix products with square output tiles (128, 64, 32 or 16, the largest
  that fits) and row-wise softmax kernels; its traffic does not depend on M beyond that.

``make_plan(..., block_r=, block_c=)`` forces B_r and/or B_c (the block-size study of the paper's
Figure 2): a forced tile is used as given, and a tile left free follows the rule above relative to
it (the streamed block at most min(forced, d), the resident block at most ceil(M_el / 4d)), shrunk
until the buffers fit. A forced tiling that does not fit in M raises ValueError.
"""

from __future__ import annotations

from collections.abc import Callable

from .core import (
    THREADS,
    Plan,
    SramTooSmall,
    Stage,
    TilesDoNotFit,
    layout,
    layout_bytes,
    rowwise_buffers,
    rowwise_stage,
)
from .units import ACC_ITEMSIZE, cdiv, itemsize

GEMM_TILES = (128, 64, 32, 16)
GEMM_BK = 32
GEMM_PIPELINE_STAGES = 2

# Forced tiles (``make_plan(block_r=, block_c=)``) of the block-size study (``sweep --vary block``,
# ``PARTS=sweeps scripts/gpu_suite.sh``): its most lopsided shapes, a 512-row resident block at the H200's largest M,
# where the other tile shrinks to fit (kv_outer: B_r = 41; q_outer: B_c = 13).
FORCED_TILE_PROBLEMS: tuple[dict, ...] = (
    {"algorithm": "flash", "schedule": "kv_outer", "d": 64, "dtype": "float16", "sram": 227 * 1024, "block_c": 512},
    {"algorithm": "flash", "schedule": "q_outer", "d": 64, "dtype": "float16", "sram": 227 * 1024, "block_r": 512},
)


# ---------------------------------------------------------------------------------------------
# shared-memory layouts per kernel family (bytes as functions of tiles)

def _gemm_buffers(bm: int, bn: int, bk: int, e: int) -> list[tuple[str, int]]:
    # A and B tiles, double-buffered so the next k-slice loads while this one multiplies
    return [("A", GEMM_PIPELINE_STAGES * bm * bk * e), ("B", GEMM_PIPELINE_STAGES * bk * bn * e)]


def _flash_fwd_buffers(br: int, bc: int, d: int, e: int) -> list[tuple[str, int]]:
    f = ACC_ITEMSIZE
    return [("Q", br * d * e), ("K", bc * d * e), ("V", bc * d * e), ("O", br * d * f),
            ("S", br * bc * f), ("m", br * f), ("l", br * f)]


def _two_pass_stats_buffers(br: int, bc: int, d: int, e: int) -> list[tuple[str, int]]:
    f = ACC_ITEMSIZE
    return [("Q", br * d * e), ("K", bc * d * e), ("S", br * bc * f), ("m", br * f), ("l", br * f)]


def _two_pass_store_output_buffers(br: int, bc: int, d: int, e: int) -> list[tuple[str, int]]:
    f = ACC_ITEMSIZE
    return [("S", br * bc * f), ("V", bc * d * e), ("O", br * d * f), ("m", br * f), ("l", br * f)]


def _flash_bwd_buffers(br: int, bc: int, d: int, e: int) -> list[tuple[str, int]]:
    f = ACC_ITEMSIZE
    return [("K", bc * d * e), ("V", bc * d * e), ("dK", bc * d * f), ("dV", bc * d * f),
            ("Q", br * d * e), ("dO", br * d * e), ("P", br * bc * f), ("dS", br * bc * f),
            ("lse", br * f), ("D", br * f)]


_BLOCK_BUFFERS: dict[tuple[str, str, str], list[Callable[[int, int, int, int], list]]] = {
    ("flash", "kv_outer", "fwd"): [_flash_fwd_buffers],
    ("flash", "q_outer", "fwd"): [_flash_fwd_buffers],
    ("two_pass", "store", "fwd"): [_two_pass_stats_buffers, _two_pass_store_output_buffers],
    ("two_pass", "recompute", "fwd"): [_two_pass_stats_buffers, _flash_fwd_buffers],
    ("flash", "kv_outer", "bwd"): [_flash_bwd_buffers],
}
_Q_RESIDENT = {("flash", "q_outer", "fwd"), ("two_pass", "store", "fwd"),
               ("two_pass", "recompute", "fwd")}


# ---------------------------------------------------------------------------------------------
# tile selection

def _fit_largest(upper: int, fits: Callable[[int], bool]) -> int:
    """Largest x in [1, upper] with fits(x) (monotone: fits(x) implies fits(x - 1)), else 0."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _block_tiles(key: tuple[str, str, str], d: int, e: int, sram: int) -> tuple[int, int]:
    """(B_r, B_c) by the paper's rule, shrunk until every stage's buffers fit in ``sram``."""
    families = _BLOCK_BUFFERS[key]

    def smem(br: int, bc: int) -> int:
        return max(layout_bytes(f(br, bc, d, e)) for f in families)

    label = "/".join(key)
    min_bytes = smem(1, 1)
    if min_bytes > sram:
        raise SramTooSmall(label, sram, min_bytes, f"d={d}, {e}-byte elements, tiles B_r=B_c=1")
    big = max(1, cdiv(sram // e, 4 * d))
    small = min(big, d)
    if key in _Q_RESIDENT:
        # the Q block (B_r rows) is resident; K/V stream in blocks of B_c <= B_r
        for bc in range(small, 0, -1):
            br = _fit_largest(big, lambda r, bc=bc: smem(r, bc) <= sram)
            if br >= bc:
                return br, bc
    else:
        # the K/V block (B_c rows) is resident; Q/O stream in blocks of B_r <= B_c
        for br in range(small, 0, -1):
            bc = _fit_largest(big, lambda c, br=br: smem(br, c) <= sram)
            if bc >= br:
                return br, bc
    raise AssertionError("unreachable: B_r = B_c = 1 fits")  # pragma: no cover




def _forced_block_tiles(key: tuple[str, str, str], d: int, e: int, sram: int, block_r: int | None,
                        block_c: int | None) -> tuple[int, int]:
    """(B_r, B_c) with one or both forced; the free one by the paper's rule relative to the forced
    one, shrunk until the buffers fit. ValueError when the forced tiling does not fit in ``sram``."""
    families = _BLOCK_BUFFERS[key]

    def smem(br: int, bc: int) -> int:
        return max(layout_bytes(f(br, bc, d, e)) for f in families)

    big = max(1, cdiv(sram // e, 4 * d))
    resident_is_r = key in _Q_RESIDENT
    br, bc = block_r, block_c
    if br is None:
        # B_r free: the streamed block (kv_outer, backward) at most min(B_c, d); else the resident one
        upper = big if resident_is_r else min(bc, d)
        br = _fit_largest(upper, lambda r: smem(r, bc) <= sram)
    elif bc is None:
        upper = min(br, d) if resident_is_r else big
        bc = _fit_largest(upper, lambda c: smem(br, c) <= sram)
    if br == 0 or bc == 0 or smem(br, bc) > sram:
        forced = ", ".join(f"{n}={v}" for n, v in (("B_r", block_r), ("B_c", block_c)) if v is not None)
        need = smem(max(br, 1), max(bc, 1))
        raise TilesDoNotFit(
            f"forced tiles {forced} do not fit in --sram {sram} bytes for {'/'.join(key)} "
            f"(d={d}, {e}-byte elements): B_r={max(br, 1)}, B_c={max(bc, 1)} need {need} bytes of shared memory"
        )
    return br, bc


def _gemm_tiles(e: int, sram: int, label: str) -> tuple[int, int, int]:
    for t in GEMM_TILES:
        for bk in (GEMM_BK, 16, 8):
            if max(layout_bytes(_gemm_buffers(t, t, bk, e)), layout_bytes(rowwise_buffers())) <= sram:
                return t, t, bk
    t, bk = GEMM_TILES[-1], 8
    need = max(layout_bytes(_gemm_buffers(t, t, bk, e)), layout_bytes(rowwise_buffers()))
    raise SramTooSmall(label, sram, need, f"{e}-byte elements, tiles {t}x{t}x{bk}")




def research_plan(algorithm: str, schedule: str, direction: str, *, N_q: int, N_k: int, d: int, dtype: str,
                  sram: int, batch: int, heads: int, block_r: int | None, block_c: int | None) -> Plan:
    """The plan of a research schedule; ``block_r``/``block_c`` force B_r/B_c (flash and two_pass only)."""
    forced = block_r is not None or block_c is not None
    if forced and algorithm == "standard":
        raise ValueError("block_r/block_c set the B_r x B_c attention tiles of flash and two_pass; "
                         "standard attention has none (its matrix-product tiles follow M)")
    e = itemsize(dtype)
    bh = batch * heads
    key = (algorithm, schedule, direction)
    common = dict(algorithm=algorithm, schedule=schedule, direction=direction, N_q=N_q, N_k=N_k,
                  d=d, dtype=dtype, sram_bytes=sram, batch=batch, heads=heads)

    if algorithm == "standard":
        bm, bn, bk = _gemm_tiles(e, sram, "/".join(key))
        gemm_smem = layout(_gemm_buffers(bm, bn, bk, e))

        def gemm(name: str, m: int, n: int) -> Stage:
            return Stage(name, "gemm", (cdiv(n, bn), cdiv(m, bm), bh), THREADS, gemm_smem)

        def rowwise(name: str) -> Stage:
            return rowwise_stage(name, name, N_q, N_k, bh)

        if direction == "fwd":
            stages = (gemm("qk", N_q, N_k), rowwise("rowmax"), rowwise("rowsum"),
                      rowwise("normalize"), gemm("pv", N_q, d))
        else:
            stages = (gemm("dv", N_k, d), gemm("dp", N_q, N_k), rowwise("rowdot"), rowwise("ds"),
                      gemm("dq", N_q, d), gemm("dk", N_k, d))
        tiles = (("BM", bm), ("BN", bn), ("BK", bk))
        return Plan(**common, tiles=tiles, stages=stages)

    # flash kv_outer's forward and the flash backward also run row-wise stages, whose buffers must fit M too
    rowwise_need = layout_bytes(rowwise_buffers()) if schedule == "kv_outer" else 0
    try:
        if forced:
            br, bc = _forced_block_tiles(key, d, e, sram, block_r, block_c)
        else:
            br, bc = _block_tiles(key, d, e, sram)
    except SramTooSmall as exc:
        if exc.min_bytes >= rowwise_need:
            raise
        raise SramTooSmall("/".join(key), sram, rowwise_need, f"its row-wise stages, d={d}, {e}-byte elements"
                           ) from None
    if sram < rowwise_need:
        raise SramTooSmall("/".join(key), sram, rowwise_need,
                           f"its row-wise stages' {rowwise_need}-byte buffers, d={d}, {e}-byte elements")
    tr, tc = cdiv(N_q, br), cdiv(N_k, bc)
    fams = [layout(f(br, bc, d, e)) for f in _BLOCK_BUFFERS[key]]
    if key == ("flash", "kv_outer", "fwd"):
        # Algorithm 1 literally: one block per (batch, head) owns the sequential j loop, so K_j and
        # V_j are read once; O, l, m start in HBM (the init stage) and make a round trip per j.
        # O travels as a float32 accumulator (Oacc), so float16/bfloat16 runs accumulate in float32
        # like every other schedule; the finalize stage rounds it to the output dtype once.
        stages = (rowwise_stage("init", "flash_init", N_q, d, bh),
                  Stage("main", "flash_kv_outer", (1, 1, bh), THREADS, fams[0]),
                  rowwise_stage("finalize", "flash_finalize", N_q, d, bh))
    elif key == ("flash", "q_outer", "fwd"):
        stages = (Stage("main", "flash_q_outer", (tr, 1, bh), THREADS, fams[0]),)
    elif algorithm == "two_pass":
        second = "two_pass_store_output" if schedule == "store" else "two_pass_recompute_output"
        stages = (Stage("stats", f"two_pass_stats_{schedule}", (tr, 1, bh), THREADS, fams[0]),
                  Stage("output", second, (tr, 1, bh), THREADS, fams[1]))
    else:  # flash backward
        stages = (rowwise_stage("prep", "flash_bwd_prep", N_q, d, bh),
                  Stage("main", "flash_bwd_kv_outer", (tc, 1, bh), THREADS, fams[0]),
                  rowwise_stage("dq", "flash_bwd_dq", N_q, d, bh))
    tiles = (("Br", br), ("Bc", bc), ("Tr", tr), ("Tc", tc))
    plan = Plan(**common, tiles=tiles, stages=stages)
    assert plan.smem_bytes <= sram, (plan.smem_bytes, sram)
    return plan


