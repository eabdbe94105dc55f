"""``make_plan``: one entry point for every algorithm, schedule and direction, and ``all_plans``."""

from __future__ import annotations

from collections.abc import Mapping

from .causal import normalize_causal, normalize_window
from .core import (
    ALGORITHMS,
    SCHEDULES,
    Plan,
    SramTooSmall,
    Unsupported,
    check_block,
    check_problem,
    check_schedule,
)
from .dropout import Dropout
from .fast import NoFastTilingFits, make_fast_plan_within, with_listed_blocks, with_wide_persistent
from .fast_bwd import fit_fast_backward_plan, with_item_list
from .masks import BlockMask, ExplicitMask
from .mods import Mods, with_mods
from .research import research_plan
from .units import itemsize
from .variants import (
    FAST_SPARSE_BLOCK,
    check_block_mask,
    check_dropout,
    check_explicit_mask,
    check_softcap,
    with_alibi,
    with_block_mask,
    with_causal,
    with_documents,
    with_dropout,
    with_mask,
    with_softcap,
    with_window,
)


def make_plan(
    algorithm: str,
    schedule: str | None = None,
    *,
    N_q: int,
    N_k: int | None = None,
    d: int,
    dtype: str = "float32",
    sram: int,
    batch: int = 1,
    heads: int = 1,
    direction: str = "fwd",
    smem_limit: int | None = None,
    block_r: int | None = None,
    block_c: int | None = None,
    kv_heads: int | None = None,
    causal: bool | str = False,
    block_mask: BlockMask | None = None,
    mask: ExplicitMask | None = None,
    dropout: Dropout | None = None,
    window: tuple[int | None, int | None] | None = None,
    documents: tuple[int, ...] | None = None,
    softcap: float | None = None,
    alibi: object = None,
    mods: Mods | None = None,
    capture_values: Mapping[str, object] | None = None,
) -> Plan:
    """Decide the tiles of one algorithm/schedule/direction for a problem and an SRAM size.

    ``sram`` is M in bytes; ``smem_limit`` is the GPU's per-block shared-memory limit (bytes).
    ``block_r``/``block_c`` force B_r/B_c of flash and two_pass (see the module docstring).
    Raises ValueError (SramTooSmall when no tiling fits, naming the smallest M that works;
    TilesDoNotFit when forced tiles do not fit in M). ``kv_heads`` (grouped-query attention: K and
    V with fewer heads, each shared by heads / kv_heads query heads) is taken by flash/fast only (the
    backward by its wgmma kernel, sm_90).
    ``causal``: False, True (bottom-right alignment, the default), "bottom_right" or "top_left"
    (module docstring); flash/fast/bwd takes causal with its wgmma kernel only (sm_90; Unsupported
    elsewhere).
    ``block_mask``: block-sparse attention (:class:`iokernels.plan.masks.BlockMask`, the paper's Algorithm 5)
    by the research tiled schedules and flash/fast's tma kernels (:func:`supports_block_sparse`; Unsupported
    elsewhere). The research tiles are the largest ones up to the usual ones that divide the mask's blocks (forced
    tiles must divide them), flash/fast's its causal tiles (Unsupported where they do not divide the blocks), so each
    (query block, key block) pair lies in one mask block; with ``causal`` both masks apply.
    ``mask``: an explicit element mask (:class:`iokernels.plan.masks.ExplicitMask`) read from HBM by the
    schedules of :func:`supports_explicit_mask` (Unsupported elsewhere); it combines with the others.
    ``dropout``: dropout on P (:class:`iokernels.plan.dropout.Dropout`), by the stages of
    :func:`supports_dropout` (Unsupported elsewhere); tiles and bytes do not change.
    ``window``: a sliding window (left, right) (:func:`iokernels.plan.causal.normalize_window`) on the tiled
    schedules, alone or with ``causal``: the model and the simulator take it (pairs with no visible element
    skipped, as causal); of the kernels, flash/fast's tma forward and backward (sm_90) apply it, and launching a
    research plan with a window raises Unsupported. ``documents``: document masking, the lengths of packed documents
    summing to N_q = N_k (:func:`iokernels.plan.causal.normalize_documents`): the model and the simulator take it, no
    kernel runs this tiling (the library runs documents as variable-length sequences, ``make_documents_plan``).
    ``softcap``: the logits c · tanh(τ s / c) (:func:`iokernels.plan.variants.with_softcap`): flash/fast on the tma
    kernels only (as a window, the plan takes their tiles), Unsupported elsewhere. ``alibi``: ALiBi slopes, one per
    head or per batch·head (:func:`iokernels.plan.variants.with_alibi`): flash/fast on the tma kernels only (a block
    per work item), Unsupported elsewhere. ``mods``: a programmable variant (:func:`iokernels.plan.mods.check_mods`:
    mask_mod / score_mod C expressions), on the same kernels (:func:`iokernels.plan.mods.with_mods`);
    ``capture_values``: its captured arrays on the host, by name, for the model's bytes.
    """
    N_k = N_q if N_k is None else N_k
    dtype = check_problem(N_q, N_k, d, dtype, batch, heads)
    schedule = check_schedule(algorithm, schedule, direction)
    causal = normalize_causal(causal)
    args = dict(N_q=N_q, N_k=N_k, d=d, dtype=dtype, sram=sram, batch=batch, heads=heads, direction=direction,
                smem_limit=smem_limit, kv_heads=kv_heads, causal=causal)
    # a mask or dropout no kernel of this schedule takes is refused before any tiling (whatever M)
    if mask is not None:
        check_explicit_mask((algorithm, schedule, direction), mask)
    if dropout is not None:
        check_dropout((algorithm, schedule, direction), dropout)
    if block_mask is not None and schedule == "fast":  # its kernels' own tiles (block_sparse below), which must divide
        check_block_mask((algorithm, schedule, direction), block_mask, N_q, N_k)
        if block_mask.block_q % FAST_SPARSE_BLOCK or block_mask.block_k % FAST_SPARSE_BLOCK:  # before any tiling
            raise Unsupported(f"flash/fast: its tiles divide blocks of a multiple of {FAST_SPARSE_BLOCK}, not the "
                              f"block mask's {block_mask.block_q}x{block_mask.block_k}")
        if normalize_window(window) is not None:
            raise Unsupported("flash/fast: a block mask and a sliding window together are not implemented")
    elif block_mask is not None:
        block_r, block_c = _block_sparse_tiles(algorithm, schedule, block_mask, block_r, block_c, args)
    capped = check_softcap(softcap) is not None
    # a softcap's backward and a variant's take the dropout tiles (B_r 64: at 128 the per-element 1 − tanh² or the
    # user's expressions spill)
    plan = base_plan(algorithm, schedule, block_r=block_r, block_c=block_c,
                     dropout=dropout is not None or ((capped or mods is not None) and direction == "bwd"),
                     banded=normalize_window(window) is not None or capped,
                     per_item=block_mask is not None or alibi is not None or mods is not None, **args)
    plan = with_dropout(with_mask(with_block_mask(with_causal(plan, causal), block_mask), mask), dropout)
    plan = with_alibi(with_softcap(with_documents(with_window(plan, window), documents), softcap), alibi)
    # the persistent grids on a list of items: a block-sparse forward's, a causal or windowed backward's
    # ... and a plain forward's short items in 192-row tiles
    return with_wide_persistent(with_item_list(with_listed_blocks(with_mods(plan, mods, capture_values))))




def _largest_divisor(n: int, upper: int) -> int:
    return next(x for x in range(min(n, upper), 0, -1) if n % x == 0)


def _block_sparse_tiles(algorithm: str, schedule: str, block_mask: BlockMask, block_r: int | None,
                        block_c: int | None, args: dict) -> tuple[int, int]:
    """(B_r, B_c) for a block-sparse plan: forced ones as given (they must divide the mask's blocks),
    free ones the largest divisors of the blocks up to the usual tiles."""
    check_block_mask((algorithm, schedule, args["direction"]), block_mask, args["N_q"], args["N_k"])
    for name, value, block in (("block_r", block_r, block_mask.block_q), ("block_c", block_c, block_mask.block_k)):
        check_block(name, value)
        if value is not None and block % value:
            raise ValueError(f"{name}={value} does not divide the block mask's block size {block}: "
                             "block-sparse tiles must lie inside one mask block")
    if block_r is not None and block_c is not None:
        return block_r, block_c
    tile = base_plan(algorithm, schedule, block_r=block_r, block_c=block_c, **args).tile
    return (block_r or _largest_divisor(block_mask.block_q, tile["Br"]),
            block_c or _largest_divisor(block_mask.block_k, tile["Bc"]))


def base_plan(
    algorithm: str,
    schedule: str,
    *,
    N_q: int,
    N_k: int,
    d: int,
    dtype: str,
    sram: int,
    batch: int,
    heads: int,
    direction: str,
    smem_limit: int | None,
    block_r: int | None,
    block_c: int | None,
    kv_heads: int | None,
    causal: str,
    dropout: bool = False,
    banded: bool = False,
    per_item: bool = False,
) -> Plan:
    """The plan of one schedule before its variants (causal, masks, dropout) are applied. ``banded``: a sliding
    window will be applied (flash/fast: the tiles of a causal plan, and an sm_90 backward kernel). ``per_item``: a
    variant that reads its data before a block's work (a block mask, ALiBi) will be (flash/fast: the tma kernels, the
    causal tiles, a block per work item)."""
    masked = bool(causal) or banded
    if kv_heads is not None and kv_heads != heads:
        if not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
            raise ValueError(f"kv_heads must divide heads={heads}, got {kv_heads!r}")
        if (algorithm, schedule) != ("flash", "fast"):
            raise Unsupported(f"grouped-query attention (kv_heads={kv_heads} < heads={heads}) is implemented by "
                              f"flash/fast only, not {algorithm}/{schedule}/{direction}")
    if not isinstance(sram, int) or sram <= 0:
        raise ValueError(f"sram must be a positive number of bytes, got {sram!r}")
    if smem_limit is not None and sram > smem_limit:
        raise ValueError(
            f"--sram {sram} bytes exceeds the GPU's per-block shared-memory limit of {smem_limit} bytes"
        )
    check_block("block_r", block_r)
    check_block("block_c", block_c)
    forced = block_r is not None or block_c is not None
    if schedule == "fast":
        # the tensor-core kernels (.fast, .fast_bwd): fixed tiles, which must fit in
        # M like any plan's; its plan records the M they use (its effective M), which the Θ form and
        # the model take
        if forced:
            raise ValueError("block_r/block_c do not apply to flash/fast: its tiles are fixed")
        if direction == "fwd":  # the fastest of the forward kernel's tilings that fits M
            try:
                return make_fast_plan_within(sram, N_q=N_q, N_k=N_k, d=d, dtype=dtype, batch=batch, heads=heads,
                                             kv_heads=kv_heads, dropout=dropout, causal=masked or per_item,
                                             window=banded, per_item=per_item)
            except NoFastTilingFits as exc:
                raise SramTooSmall("flash/fast/fwd", sram, exc.plan.smem_bytes,
                                   f"{exc.detail}, {itemsize(dtype)}-byte elements") from None
        # the backward: its default tiles, or B_c = 64 where those do not fit M
        plan = fit_fast_backward_plan(sram=sram, N_q=N_q, N_k=N_k, d=d, dtype=dtype, batch=batch, heads=heads,
                                      kv_heads=kv_heads, wgmma_only=masked, dropout=dropout,
                                      window=banded or per_item)
        if plan.smem_bytes > sram:
            raise SramTooSmall(f"flash/fast/{direction}", sram, plan.smem_bytes,
                               f"d={d}, {itemsize(dtype)}-byte elements, its fixed tiles {plan.describe_tiles()}")
        return plan
    return research_plan(algorithm, schedule, direction, N_q=N_q, N_k=N_k, d=d, dtype=dtype, sram=sram,
                         batch=batch, heads=heads, block_r=block_r, block_c=block_c)


def all_plans(
    *,
    N_q: int,
    N_k: int | None = None,
    d: int,
    dtype: str = "float32",
    sram: int,
    batch: int = 1,
    heads: int = 1,
    backward: bool = False,
    smem_limit: int | None = None,
    causal: bool | str = False,
    block_mask: BlockMask | None = None,
    kv_heads: int | None = None,
    mask: ExplicitMask | None = None,
    dropout: Dropout | None = None,
    window: tuple[int | None, int | None] | None = None,
    softcap: float | None = None,
    alibi: object = None,
    mods: Mods | None = None,
    capture_values: Mapping[str, object] | None = None,
) -> list[Plan]:
    """Every algorithm and schedule (forward, plus backward when asked), in display order; with
    ``causal``, those that implement the causal mask (flash/fast/bwd: its wgmma kernel only); with
    ``block_mask``, those that implement block-sparse attention; with ``kv_heads`` < ``heads``
    (grouped-query attention), flash/fast only; with an explicit ``mask`` or ``dropout``, those that
    implement it; with a sliding ``window``, every tiled plan (the research kernels' only in the model and the
    simulator: :func:`iokernels.plan.check_runnable` says which plans a GPU runs); with a ``softcap``, ``alibi``
    slopes or ``mods``, flash/fast's (the tma kernels)."""
    directions = ("fwd", "bwd") if backward else ("fwd",)
    plans, too_small = [], []
    for algorithm in ALGORITHMS:
        for direction in directions:
            for schedule in SCHEDULES.get((algorithm, direction), ()):
                try:
                    plans.append(make_plan(algorithm, schedule, N_q=N_q, N_k=N_k, d=d, dtype=dtype,
                                           sram=sram, batch=batch, heads=heads, direction=direction,
                                           smem_limit=smem_limit, causal=causal, block_mask=block_mask,
                                           kv_heads=kv_heads, mask=mask, dropout=dropout, window=window,
                                           softcap=softcap, alibi=alibi, mods=mods,
                                           capture_values=capture_values))
                except SramTooSmall as exc:
                    too_small.append((exc.min_bytes, f"{algorithm}/{schedule}/{direction}"))
                except Unsupported:
                    continue  # flash/fast takes float16/bfloat16 and d of 64 or 128 only
    if too_small:
        need, label = max(too_small)
        raise SramTooSmall(f"every algorithm (largest need: {label})", sram, need, f"d={d}, {dtype}")
    return plans


def min_sram(algorithm: str, schedule: str | None = None, *, d: int, dtype: str = "float32",
             direction: str = "fwd") -> int:
    """The smallest M (bytes) for which :func:`make_plan` finds a tiling."""
    try:
        make_plan(algorithm, schedule, N_q=1, d=d, dtype=dtype, sram=1, direction=direction)
    except SramTooSmall as exc:
        return exc.min_bytes
    return 1  # pragma: no cover

