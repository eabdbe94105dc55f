"""Tensor-core FlashAttention backward for float16 / bfloat16 (issue #5, backward half).

``make_fast_backward_plan`` builds the plan of the schedule ``flash/fast`` in the ``bwd`` direction,
with one of three kernels for its main stage:

* ``"tma"`` (``kernels/flash_tma_bwd.cu``, sm_90a only): the wgmma kernel's math, tiles, variants and bytes with
  a producer warpgroup: TMA copies of Q_i, dO_i into a two-stage mbarrier ring (K_j, V_j once), register
  reallocation, dQ added by the copy engine's bulk tensor reduction instead of per-thread atomics; past d 128
  (tile widths 192 and 256, :data:`TMA_BWD_HEAD_DIMS`) its wide tiles (kernel ``flash_tma_bwd_wide``, B_r = B_c =
  64): two consumer warpgroups share the block's keys and split Sᵀ, dPᵀ by queries and dK, dV, dQ by columns, dQ
  added by float32 reductions;
* ``"wgmma"`` (``kernels/flash_wgmma_bwd.cu``, sm_90a only: H100/H200): warpgroup matrix products, a
  warpgroup per 64 keys; B_r = 128 (d = 64, float16) or 64, B_c = 128; every d that is a multiple of 8 from
  16 to 128 (:data:`WGMMA_BWD_HEAD_DIMS`), in the tile of the next width (64 or 128, the stage parameter
  ``HEAD_D_TILE`` where it is not d; the columns past d are zero-filled, never read, added or stored);
* ``"mma"`` (``kernels/flash_tc_bwd.cu``, sm_80 and newer): ``mma.sync`` m16n8k16, a warp per 16 keys; d 64
  and 128 only (:data:`FAST_BWD_HEAD_DIMS`).

``kernel=None`` picks ``"tma"`` on a compute-capability 9.x GPU and with no GPU visible, else
``"mma"`` (:func:`default_backward_kernel`); the deterministic variant is ``"mma"`` only. Two
variants:

* default (``deterministic=False``), the FlashAttention-2 arrangement of the research backward
  ``flash/kv_outer/bwd``: the research ``prep`` stage (D = rowsum(dO∘O), dQacc zeroed), a main stage
  (grid (T_c, 1, BH): a block owns B_c keys and loops over the query blocks with Q_i, dO_i, lse_i,
  D_i double-buffered; dK_j, dV_j in float32 registers; dQacc_i += τ dS K_j by float32 atomics), and
  the research ``dq`` stage (dQacc rounded to dQ). The bytes are exactly those of the research
  backward's model with this kernel's tiles (B_r, B_c).
* ``deterministic=True``: no atomics, so gradients are bit-identical run to run. A stage ``dq``
  (``flash_tc_bwd_dq``, grid (T_r, 1, BH), query-outer: a block owns B_r query rows, computes and
  writes D_i, recomputes P and dS for every key block and writes dQ_i once) and a stage ``dkdv``
  (``flash_tc_bwd_dkdv``: the main kernel without dQ). Recorded in the plan as
  ``plan.variant == "deterministic"``; the model and the simulator have its own stages.

The plan's effective M is the largest shared memory of its stages (``plan.smem_bytes``), as for the
forward ``flash/fast``.

Dropout on P (:func:`iokernels.plan.variants.with_dropout`, the ``DROPOUT`` define) is implemented by the wgmma
kernel only, with its own default tiles (:data:`FAST_BWD_WGMMA_DROPOUT_TILES`: at B_r = 128 the dropout
build would spill registers); ``make_fast_backward_plan(dropout=True)`` picks them.
"""

from __future__ import annotations

from dataclasses import replace

from .core import Plan, Stage, Unsupported, check_problem, layout, rowwise_stage
from .fast import SM90_KERNELS, default_kernel, on_item_list, tile_head_dim, tile_params
from .units import ACC_ITEMSIZE, cdiv, itemsize


def default_backward_kernel() -> str:
    """``"tma"`` where the forward's default kernel is an sm_90 one (a compute-capability 9.x GPU, or none
    visible), else ``"mma"``."""
    return "tma" if default_kernel() in SM90_KERNELS else "mma"


FAST_BWD_DTYPES = ("float16", "bfloat16")
FAST_BWD_HEAD_DIMS = (64, 128)  # the mma kernels' d (the tile widths)
# the wgmma kernel's d: every multiple of 8 up to 128, in the tile of the next width (tile_head_dim)
WGMMA_BWD_HEAD_DIMS = tuple(range(16, 129, 8))
# the tma kernel's: up to 256 (past 128 its wide tiles, 192 or 256 wide)
TMA_BWD_HEAD_DIMS = tuple(range(16, 257, 8))
FAST_BWD_BR = {64: 128, 128: 64}  # d -> query rows per step of the K/V-outer loop (timed on an H200)
FAST_BWD_BC = 128  # keys per block (a warp per 16 keys: 8 warps)
FAST_BWD_DETERMINISTIC_BR = 64  # the deterministic plan's (its dK/dV kernel at d = 64, B_r = 128 would spill)
# make_plan's choices, in order, where the default tiles do not fit in M (its sram): B_c = 64 halves
# K_j, V_j and dSᵀ; then the query blocks single-buffered
FAST_BWD_FALLBACKS = ({}, {"block_r": 64, "block_c": 64},
                      {"block_r": 64, "block_c": 64, "q_stages": 1, "ds_stages": 1})
# make_plan's wgmma tiles where the defaults do not fit M (then the mma kernel with FAST_BWD_FALLBACKS)
FAST_BWD_WGMMA_FALLBACK = {"block_r": 64, "block_c": 64}
FAST_BWD_KV_BLOCK = 64  # keys per step of the deterministic dq kernel (does not change its bytes)
DETERMINISTIC = "deterministic"
KERNEL = "flash_tc_bwd"
KERNEL_WGMMA = "flash_wgmma_bwd"
KERNEL_TMA = "flash_tma_bwd"
KERNEL_TMA_WIDE = "flash_tma_bwd_wide"  # flash_tma_bwd.cu built with a tile width past 128
SM90_BWD_KERNEL_NAMES = (KERNEL_TMA, KERNEL_TMA_WIDE, KERNEL_WGMMA)
FAST_BWD_KERNELS = ("tma", "wgmma", "mma")
SM90_BWD_KERNELS = ("tma", "wgmma")  # the same tiles, d, causal, dropout and grouped-query support
# (tile width, dtype) -> (B_r, B_c) of the wgmma kernel (timed on an H200 at d = the tile width)
FAST_BWD_WGMMA_TILES = {(64, "float16"): (128, 128), (64, "bfloat16"): (128, 128),
                        (128, "float16"): (64, 128), (128, "bfloat16"): (64, 128)}
FAST_BWD_WIDE_TILES = (64, 64)  # the tma kernel's wide tiles (tile widths 192, 256): the only ones
# the same for dropout plans (the DROPOUT build at d = 64, B_r = 128 spills registers)
FAST_BWD_WGMMA_DROPOUT_TILES = {(64, "float16"): (64, 128), (64, "bfloat16"): (64, 128),
                                (128, "float16"): (64, 128), (128, "bfloat16"): (64, 128)}
# (d, B_r, B_c) variants of the wgmma kernel compiled (CPU test) and timed besides the defaults
FAST_BWD_WGMMA_TUNING = ((64, 64, 128), (128, 64, 64))
KERNEL_DKDV = "flash_tc_bwd_dkdv"
KERNEL_DQ = "flash_tc_bwd_dq"
# (d, B_r, B_c, ds_stages) variants compiled (CPU test) and timed besides the defaults and FALLBACKS
FAST_BWD_TUNING = ((64, 64, 128, 2), (64, 128, 128, 1), (128, 64, 128, 1))
# The launcher's argument names of each kernel (iokernels.kernels.launch.ARGS has the same entries).
FAST_BWD_ARGS: dict[str, tuple[str, ...]] = {
    KERNEL: ("Q", "K", "V", "dO", "lse", "D", "dQacc", "dK", "dV", "n_q", "n_k", "scale"),
    KERNEL_WGMMA: ("Q", "K", "V", "dO", "lse", "D", "dQacc", "dK", "dV", "n_q", "n_k", "scale", "kv_group"),
    KERNEL_TMA: ("map:Q", "map:K", "map:V", "map:dO", "lse", "D", "map:dQacc", "dK", "dV", "n_q", "n_k", "scale",
                 "kv_group"),  # TMA maps
    KERNEL_TMA_WIDE: ("map:Q", "map:K", "map:V", "map:dO", "lse", "D", "dQacc", "dK", "dV", "n_q", "n_k", "scale",
                      "kv_group"),  # dQacc by float32 reductions
    KERNEL_DKDV: ("Q", "K", "V", "dO", "lse", "D", "dK", "dV", "n_q", "n_k", "scale"),
    KERNEL_DQ: ("Q", "K", "V", "O", "dO", "lse", "D", "dQ", "n_q", "n_k", "scale"),
}


def kv_outer_buffers(d: int, e: int, block_r: int, block_c: int, dq: bool = True,
                     q_stages: int = 2, ds_stages: int = 2) -> list[tuple[str, int]]:
    """Shared memory of flash_tc_bwd (dq) and flash_tc_bwd_dkdv: K_j, V_j; ``q_stages`` (2: double
    buffered, 1: not) of Q_i, dO_i, lse_i, D_i; with dq, ``ds_stages`` of dSᵀ (B_c x B_r of T) for the dQ
    product across the warps' keys (2: block i's dQ runs in step i + 1, one barrier per step)."""
    q, row = block_r * d * e, block_r * ACC_ITEMSIZE
    out = [("K", block_c * d * e), ("V", block_c * d * e)]
    for name, size in (("Q", q), ("dO", q), ("lse", row), ("D", row)):
        out += [(f"{name}{k}", size) for k in range(q_stages)]
    if dq:
        out += [(f"dS{k}", block_c * block_r * e) for k in range(ds_stages)]
    return out


def sm90_buffers(kernel: str, d: int, e: int, block_r: int, block_c: int) -> list[tuple[str, int]]:
    """Shared memory of the sm_90 backwards: K_j, V_j; two stages of Q_i and dO_i; dSᵀ (B_c x B_r of T: one buffer
    for flash_wgmma_bwd, two for flash_tma_bwd, which also has the dQ buffer, B_r x d float32 in boxes of 64 rows x
    32 columns, or with its wide tiles (d past 128) two Pᵀ buffers instead); two stages of lse_i and D_i (last, so
    that every tile stays 1024-byte aligned). ``d``: the tiles' width (:func:`iokernels.plan.fast.tile_head_dim` of
    the problem's d)."""
    q, kv, row, ds = block_r * d * e, block_c * d * e, block_r * ACC_ITEMSIZE, block_c * block_r * e
    out = [("K", kv), ("V", kv), ("Q0", q), ("Q1", q), ("dO0", q), ("dO1", q)]
    if kernel == "wgmma":
        out += [("dS", ds)]
    elif d > 128:
        out += [("dS0", ds), ("dS1", ds), ("P0", ds), ("P1", ds)]
    else:
        out += [("dS0", ds), ("dS1", ds), ("dQ", block_r * d * ACC_ITEMSIZE)]
    return [*out, ("lse0", row), ("lse1", row), ("D0", row), ("D1", row)]


def dq_buffers(d: int, e: int, block_r: int, kv_block: int = FAST_BWD_KV_BLOCK) -> list[tuple[str, int]]:
    """Shared memory of flash_tc_bwd_dq: Q_i, dO_i, O_i; two stages of K and V sub-blocks; lse_i, D_i."""
    q, kv, row = block_r * d * e, kv_block * d * e, block_r * ACC_ITEMSIZE
    return [("Q", q), ("dO", q), ("O", q), ("K0", kv), ("K1", kv), ("V0", kv), ("V1", kv),
            ("lse", row), ("D", row)]


def dq_stage(main_kernel: str, n_rows: int, d: int, bh: int) -> Stage:
    """The stage that rounds dQacc into dQ after ``main_kernel``: with the narrow tma kernel dQacc holds each 8 columns
    in its pair order (0, 2, 4, 6, then 1, 3, 5, 7: its dQ tiles written by stmatrix, kernels/flash_tma_bwd.cu), which
    ``DQ_PAIRED`` puts back; the bytes are the same."""
    stage = rowwise_stage("dq", "flash_bwd_dq", n_rows, d, bh)
    if main_kernel == KERNEL_TMA:
        stage = replace(stage, params=(*stage.params, ("DQ_PAIRED", 1)))
    return stage


def _check_tiles(block_r: int, block_c: int) -> None:
    for name, value, allowed in (("block_r", block_r, (64, 128)), ("block_c", block_c, (64, 128))):
        if value not in allowed or isinstance(value, bool):
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def make_fast_backward_plan(*, N_q: int, N_k: int | None = None, d: int, dtype: str, batch: int = 1,
                            heads: int = 1, block_r: int | None = None, block_c: int | None = None,
                            q_stages: int = 2, ds_stages: int = 2, deterministic: bool = False,
                            kernel: str | None = None, kv_heads: int | None = None, dropout: bool = False) -> Plan:
    """The plan of the tensor-core backward for one problem (:class:`iokernels.plan.core.Unsupported`, a
    ValueError, when the kernels do not take it: float32; d other than 64 and 128 with the mma kernels or
    deterministic; with wgmma, d not a multiple of 8 from 16 to 128).

    ``block_r`` (query rows per step; default :data:`FAST_BWD_BR` of d, deterministic 64) and
    ``block_c`` (keys per block, 16 per warp) are 64 or 128, with ``block_r <= block_c`` unless
    deterministic (the warps split dQ by rows). ``q_stages``: 2 double-buffers the query blocks of the
    K/V-outer kernel, 1 does not (less memory); ``ds_stages``: the same for its dSᵀ (2: one barrier
    per step instead of two). ``deterministic``: no atomics (a query-outer dQ stage and a dK/dV
    stage), bit-identical results. ``kernel``: ``"wgmma"`` or ``"mma"`` (default: see the module);
    the wgmma kernel takes B_r <= B_c of 64 or 128 (default :data:`FAST_BWD_WGMMA_TILES`), with
    double-buffered query blocks (``q_stages``/``ds_stages`` apply to mma only). ``kv_heads``
    (grouped-query attention, K and V with fewer heads than Q; wgmma only): the main stage's grid has
    one block per key block of each K/V head, which loops over the heads / kv_heads query heads that
    share it, so K_j, V_j are read and dK_j, dV_j written once per K/V head. ``dropout``: the plan is for
    dropout (:func:`iokernels.plan.variants.with_dropout` adds it): the wgmma kernel (Unsupported for mma or
    deterministic) with :data:`FAST_BWD_WGMMA_DROPOUT_TILES` by default."""
    N_k = N_q if N_k is None else N_k
    dtype = check_problem(N_q, N_k, d, dtype, batch, heads)
    if dtype not in FAST_BWD_DTYPES:
        raise Unsupported(f"flash/fast backward (tensor cores) takes {' or '.join(FAST_BWD_DTYPES)}, got {dtype}")
    if d not in TMA_BWD_HEAD_DIMS:
        raise Unsupported(f"flash/fast backward (tensor cores) takes d in {FAST_BWD_HEAD_DIMS} (the sm_90 kernels: a "
                          f"multiple of 8 from 16 to 128, and up to 256 with tma), got d={d}")
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be True or False, got {deterministic!r}")
    if kernel is None:
        kernel = "mma" if deterministic else default_backward_kernel()
    if kernel not in FAST_BWD_KERNELS:
        raise ValueError(f"kernel must be one of {FAST_BWD_KERNELS}, got {kernel!r}")
    if d not in FAST_BWD_HEAD_DIMS and (kernel not in SM90_BWD_KERNELS or deterministic):
        raise Unsupported(_mma_head_dims(d))
    if d not in WGMMA_BWD_HEAD_DIMS and kernel != "tma":
        raise Unsupported(f"flash/fast backward: d={d} past 128 is taken by the tma kernel (sm_90) only, without "
                          "deterministic=True")
    if dropout and (kernel not in SM90_BWD_KERNELS or deterministic):
        raise Unsupported(_NO_MMA_DROPOUT)
    kv_heads = heads if kv_heads is None else kv_heads
    if not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads must divide heads={heads}, got {kv_heads!r}")
    if kv_heads != heads and (kernel not in SM90_BWD_KERNELS or deterministic):
        raise Unsupported(f"grouped-query attention (kv_heads={kv_heads} < heads={heads}) in the backward is "
                          "implemented by the sm_90 kernels (tma, wgmma), without deterministic=True")
    for name, value in (("q_stages", q_stages), ("ds_stages", ds_stages)):
        if value not in (1, 2) or isinstance(value, bool):
            raise ValueError(f"{name} must be 1 or 2, got {value!r}")
    if kernel in SM90_BWD_KERNELS:
        if deterministic:
            raise ValueError(f"deterministic=True runs the mma kernels (the {kernel} backward adds dQ with atomics)")
        if (q_stages, ds_stages) != (2, 2):
            raise ValueError("q_stages and ds_stages are options of the mma kernel (the sm_90 kernels: "
                             "double-buffered query blocks)")
        return _sm90_plan(kernel, N_q, N_k, d, dtype, batch, heads, kv_heads, block_r, block_c, dropout)
    if block_r is None:
        block_r = FAST_BWD_DETERMINISTIC_BR if deterministic else FAST_BWD_BR[d]
    block_c = FAST_BWD_BC if block_c is None else block_c
    _check_tiles(block_r, block_c)
    if not deterministic and block_r > block_c:
        raise ValueError(f"block_r={block_r} > block_c={block_c}: the dQ product needs a warp per 16 query rows")
    e, bh = itemsize(dtype), batch * heads
    tr, tc = cdiv(N_q, block_r), cdiv(N_k, block_c)
    kv_threads = 32 * block_c // 16
    if deterministic:
        dq = Stage("dq", KERNEL_DQ, (tr, 1, bh), 32 * block_r // 16, layout(dq_buffers(d, e, block_r)),
                   (("KV_BLOCK", FAST_BWD_KV_BLOCK),))
        main = Stage("dkdv", KERNEL_DKDV, (tc, 1, bh), kv_threads,
                     layout(kv_outer_buffers(d, e, block_r, block_c, dq=False, q_stages=q_stages)))
        stages: tuple[Stage, ...] = (dq, main)
    else:
        main = Stage("main", KERNEL, (tc, 1, bh), kv_threads,
                     layout(kv_outer_buffers(d, e, block_r, block_c, q_stages=q_stages, ds_stages=ds_stages)))
        stages = (rowwise_stage("prep", "flash_bwd_prep", N_q, d, bh), main,
                  rowwise_stage("dq", "flash_bwd_dq", N_q, d, bh))
    sram = max(s.smem_bytes for s in stages)
    return Plan(algorithm="flash", schedule="fast", direction="bwd", N_q=N_q, N_k=N_k, d=d, dtype=dtype,
                sram_bytes=sram, batch=batch, heads=heads,
                tiles=(("Br", block_r), ("Bc", block_c), ("Tr", tr), ("Tc", tc)), stages=stages,
                variant=DETERMINISTIC if deterministic else "")


def _mma_head_dims(d: int) -> str:
    return (f"flash/fast backward: d={d} inside a wider tile is taken by the sm_90 kernels (tma, wgmma) only, without "
            f"deterministic=True; the mma.sync backward kernels take d in {FAST_BWD_HEAD_DIMS}")


_NO_MMA_DROPOUT = ("dropout in the tensor-core backward is implemented by the sm_90 kernels (tma, wgmma); the mma.sync "
                   "backward kernels (flash_tc_bwd.cu, and deterministic=True) have none")


def _sm90_plan(kernel: str, N_q: int, N_k: int, d: int, dtype: str, batch: int, heads: int, kv_heads: int,
               block_r: int | None, block_c: int | None, dropout: bool = False) -> Plan:
    tile_d = tile_head_dim(d)
    wide = tile_d > 128
    if wide:
        default_r, default_c = FAST_BWD_WIDE_TILES
    else:
        default_r, default_c = (FAST_BWD_WGMMA_DROPOUT_TILES if dropout else FAST_BWD_WGMMA_TILES)[tile_d, dtype]
    block_r = default_r if block_r is None else block_r
    block_c = default_c if block_c is None else block_c
    _check_tiles(block_r, block_c)
    if wide and (block_r, block_c) != FAST_BWD_WIDE_TILES:
        raise ValueError(f"the tma backward past d 128 (tile width {tile_d}) has tiles {FAST_BWD_WIDE_TILES}, got "
                         f"block_r={block_r}, block_c={block_c}")
    if block_r > block_c:  # never planned, and a timing of it on an H100 (2026-11-25, d 32) did not finish
        raise ValueError(f"wgmma backward tiles: block_r <= block_c, got block_r={block_r} > block_c={block_c}")
    e, bh = itemsize(dtype), batch * heads
    tr, tc = cdiv(N_q, block_r), cdiv(N_k, block_c)
    # a warpgroup per 64 keys (wide: two for the 64) and, for tma, the producer's
    threads = (256 if wide else 2 * block_c) + (128 if kernel == "tma" else 0)
    name = KERNEL_WGMMA if kernel == "wgmma" else KERNEL_TMA_WIDE if wide else KERNEL_TMA
    main = Stage("main", name, (tc, 1, batch * kv_heads), threads,
                 layout(sm90_buffers(kernel, tile_d, e, block_r, block_c)), tile_params(d))
    stages = (rowwise_stage("prep", "flash_bwd_prep", N_q, d, bh), main, dq_stage(name, N_q, d, bh))
    return Plan(algorithm="flash", schedule="fast", direction="bwd", N_q=N_q, N_k=N_k, d=d, dtype=dtype,
                sram_bytes=max(s.smem_bytes for s in stages), batch=batch, heads=heads, kv_heads=kv_heads,
                tiles=(("Br", block_r), ("Bc", block_c), ("Tr", tr), ("Tc", tc)), stages=stages)


def fit_fast_backward_plan(*, sram: int, kernel: str | None = None, wgmma_only: bool = False,
                           dropout: bool = False, window: bool = False, **problem) -> Plan:
    """The fastest backward plan whose shared memory fits in ``sram`` bytes: the tma kernel's default tiles, then
    its 64 x 64 tiles, then the same two of the wgmma kernel (from the kernel asked for on), then the mma kernel with
    :data:`FAST_BWD_FALLBACKS` in order (the last, the smallest, when none fits: the caller checks
    that the result fits). ``wgmma_only`` (causal plans), grouped-query attention and d inside a wider tile
    (not in :data:`FAST_BWD_HEAD_DIMS`) leave the mma kernels out (Unsupported where the kernel is not wgmma).
    ``dropout``: a plan for dropout (:func:`make_fast_backward_plan`'s ``dropout``; wgmma only). ``window``: a sliding
    window's plan, tma's tilings only (the kernel that takes one)."""
    if kernel is None:
        kernel = "mma" if problem.get("deterministic") else default_backward_kernel()
    options: list[dict] = []
    if dropout:
        if kernel not in SM90_BWD_KERNELS or problem.get("deterministic"):
            raise Unsupported(_NO_MMA_DROPOUT)
        problem = {**problem, "dropout": True}
        wgmma_only = True
    if kernel in SM90_BWD_KERNELS:  # tma's extra buffers (dQ, a second dSᵀ) cost shared memory: then wgmma's
        wide = problem.get("d", 0) not in WGMMA_BWD_HEAD_DIMS  # past d 128: tma only, one tile shape
        options += [{"kernel": k, **tiles} for k in SM90_BWD_KERNELS[SM90_BWD_KERNELS.index(kernel):]
                    for tiles in ({}, FAST_BWD_WGMMA_FALLBACK)
                    if not (wide and (k != "tma" or tiles)) and not (window and k != "tma")]
    elif wgmma_only:
        raise Unsupported("the causal tensor-core backward is the sm_90 kernels (tma, wgmma); the mma.sync backward "
                          "kernels have no causal mask")
    grouped = problem.get("kv_heads") not in (None, problem.get("heads", 1))
    # grouped-query, causal, d inside a wider tile: wgmma only (mma raises)
    wgmma_only = wgmma_only or grouped or problem.get("d") not in FAST_BWD_HEAD_DIMS
    if not wgmma_only or kernel not in SM90_BWD_KERNELS:
        options += [{"kernel": "mma", **o} for o in FAST_BWD_FALLBACKS]
    if not options:  # d past 128 with kernel="wgmma": its own error (past d 128 the tma kernel only)
        return make_fast_backward_plan(**problem, kernel=kernel)
    for option in options:
        plan = make_fast_backward_plan(**problem, **option)
        if plan.smem_bytes <= sram:
            break
    return plan


def with_item_list(plan: Plan) -> Plan:
    """A causal or sliding-window backward plan whose main stage is the narrow tma kernel as a persistent grid (at
    most :data:`iokernels.plan.fast.TMA_FWD_CTAS` blocks) taking the entries of :func:`iokernels.plan.fast.item_list`
    (``ITEM_LIST``; a causal grid's ``HEAD_BAND`` dropped: the list orders the items); any other plan unchanged, among
    them those with a variant the list's kernel refuses (dropout, a softcap, a block mask, ALiBi, mods: a block per
    item). make_plan applies it last, once every variant is on the plan."""
    main = next((s for s in plan.stages if s.name == "main"), None)
    if main is None or main.kernel != KERNEL_TMA or not (plan.causal or plan.window is not None):
        return plan
    params = tuple(p for p in main.params if p[0] != "HEAD_BAND")
    if set(dict(params)) - {"HEAD_D", "HEAD_D_TILE", "CAUSAL", "WINDOW"}:
        return plan
    return on_item_list(plan, params)
