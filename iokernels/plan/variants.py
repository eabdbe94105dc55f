"""Variants of a plan: causal, dropout, explicit masks and block masks, each a transform of a :class:`Plan`
that sets its field and adds the compile-time defines to the stages whose kernels apply it.

Block-sparse attention (``make_plan(..., block_mask=)``, :mod:`iokernels.plan.masks`): the tiles are the
largest up to the usual ones that divide the mask's blocks; the stages that skip zero blocks carry
``BLOCK_SPARSE``; :func:`pair_sums` gives what they move.

Explicit masks (``make_plan(..., mask=ExplicitMask(...))``, :mod:`iokernels.plan.masks`): a boolean or
additive element mask read from HBM as the tensor ``mask`` (shared by every batch·head or one per
batch·head). Tiles do not change; every computed (query block, key block) pair reads its mask elements
(the stages of :func:`supports_explicit_mask` carry ``MASK`` = 1 bool, 2 additive and
``MASK_BH_STRIDE`` = 0 shared, 1 per batch·head). Rows that see no key give O = 0, lse = −inf.

"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .causal import CAUSAL_CODES, normalize_causal, normalize_documents, normalize_window
from .core import Plan, Stage, Unsupported
from .dropout import Dropout
from .fast import TMA_KERNEL, head_band, item_list, listed
from .fast_bwd import KERNEL_TMA, KERNEL_TMA_WIDE, SM90_BWD_KERNEL_NAMES
from .masks import BlockMask, ExplicitMask

# the stages whose kernels apply dropout to P (DROPOUT define; .dropout): every stage that uses
# the dropped P (Z ∘ P) or the dropped dP (Z ∘ dO Vᵀ)
DROPOUT_STAGES: dict[tuple[str, str, str], tuple[str, ...]] = {
    # standard: pv reads P and applies Z (O = (Z ∘ P) V); the backward's dv applies it to P, rowdot and ds to
    # the stored raw dP = dO Vᵀ (D = rowsum(P ∘ Z ∘ dP), dS = P ∘ (Z ∘ dP − D)); P itself stays undropped
    ("standard", "default", "fwd"): ("pv",),
    ("standard", "default", "bwd"): ("dv", "rowdot", "ds"),
    ("flash", "q_outer", "fwd"): ("main",),
    ("flash", "kv_outer", "fwd"): ("main",),
    ("two_pass", "store", "fwd"): ("output",),
    ("two_pass", "recompute", "fwd"): ("output",),
    ("flash", "kv_outer", "bwd"): ("main",),
    # flash/fast: the wgmma kernels only (flash_wgmma.cu, flash_wgmma_bwd.cu); with_dropout refuses the mma.sync
    # ones (flash_tc.cu, flash_tc_bwd.cu and the deterministic variant)
    ("flash", "fast", "fwd"): ("main",),
    ("flash", "fast", "bwd"): ("main",),
}


def supports_dropout(algorithm: str, schedule: str, direction: str) -> bool:
    """Whether ``make_plan(algorithm, schedule, direction=direction, dropout=...)`` has kernels."""
    return (algorithm, schedule, direction) in DROPOUT_STAGES


def check_dropout(key: tuple[str, str, str], dropout: object) -> None:
    if not isinstance(dropout, Dropout):
        raise TypeError(f"dropout must be an iokernels.plan.dropout.Dropout, got {type(dropout).__name__}")
    if key not in DROPOUT_STAGES:
        have = ", ".join("/".join(k) for k in DROPOUT_STAGES) or "none yet"
        raise Unsupported(f"dropout is not implemented by {'/'.join(key)} (plans with dropout: {have})")


def with_dropout(plan: Plan, dropout: Dropout | None) -> Plan:
    """``plan`` with dropout on P: its ``dropout`` field set and the ``DROPOUT`` define added to the stages
    that apply it. A dropout of p = 0 is kept (the kernels then keep every element)."""
    if dropout is None:
        return plan
    key = (plan.algorithm, plan.schedule, plan.direction)
    check_dropout(key, dropout)
    if plan.variant:
        raise Unsupported(f"dropout is not implemented by {plan.label}")
    if plan.schedule == "fast" and plan.stage("main").kernel not in ("flash_wgmma_fwd", "flash_tma_fwd",
                                                                     *SM90_BWD_KERNEL_NAMES):
        raise Unsupported(f"dropout in flash/fast is implemented by the wgmma kernels (sm_90); the mma.sync kernel "
                          f"{plan.stage('main').kernel} has none")
    stages = tuple(replace(s, params=(*s.params, ("DROPOUT", 1))) if s.name in DROPOUT_STAGES[key]
                   else s for s in plan.stages)
    return replace(plan, dropout=dropout, stages=stages)


# the stages whose kernels read an explicit mask (MASK, MASK_BH_STRIDE defines)
MASK_STAGES: dict[tuple[str, str, str], tuple[str, ...]] = {
    # standard: the qk epilogue reads the mask element of every S element it stores (rowsum and normalize
    # give rows with no visible key P = 0 in every build); the backward reads none (P is 0 where masked)
    ("standard", "default", "fwd"): ("qk",),
    ("standard", "default", "bwd"): (),
    ("flash", "q_outer", "fwd"): ("main",),
    ("flash", "kv_outer", "bwd"): ("main",),
}


def supports_explicit_mask(algorithm: str, schedule: str, direction: str) -> bool:
    """Whether ``make_plan(algorithm, schedule, direction=direction, mask=...)`` has kernels."""
    return (algorithm, schedule, direction) in MASK_STAGES


def check_explicit_mask(key: tuple[str, str, str], mask: object) -> None:
    if not isinstance(mask, ExplicitMask):
        raise TypeError(f"mask must be an iokernels.plan.masks.ExplicitMask, got {type(mask).__name__}")
    if key not in MASK_STAGES:
        raise Unsupported(f"explicit masks are not implemented by {'/'.join(key)}: use flash/q_outer "
                          "(forward) or flash/kv_outer (backward)")


def with_mask(plan: Plan, mask: ExplicitMask | None) -> Plan:
    """``plan`` with an explicit mask: its ``mask`` field set and the ``MASK`` (1 bool, 2 additive) and
    ``MASK_BH_STRIDE`` (0 shared, 1 per batch·head) defines added to the stages that read it."""
    if mask is None:
        return plan
    key = (plan.algorithm, plan.schedule, plan.direction)
    check_explicit_mask(key, mask)
    if plan.variant:
        raise Unsupported(f"explicit masks are not implemented by {plan.label}")
    stages = tuple(replace(s, params=(*s.params, ("MASK", mask.code), ("MASK_BH_STRIDE", mask.bh_stride)))
                   if s.name in MASK_STAGES[key] else s for s in plan.stages)
    return replace(plan, mask=mask, stages=stages)


# the stages whose kernels skip the zero blocks of a block mask (BLOCK_SPARSE define)
BLOCK_SPARSE_STAGES: dict[tuple[str, str, str], tuple[str, ...]] = {
    ("two_pass", "store", "fwd"): ("stats", "output"),
    ("two_pass", "recompute", "fwd"): ("stats", "output"),
    ("flash", "kv_outer", "fwd"): ("main",),
    ("flash", "q_outer", "fwd"): ("main",),
    ("flash", "kv_outer", "bwd"): ("main",),
    ("flash", "fast", "fwd"): ("main",),  # the sm_90 tma kernels only (BLOCK_LIST's)
    ("flash", "fast", "bwd"): ("main",),
}
# flash/fast's kernels that take a block mask: the tma forward (a block per work item) and backward, which read their
# row (column) of the grid into a list of the kept blocks in shared memory, of BLOCK_LIST entries (a define; 2 bytes
# each): 1024, and 512 for the wide backward (d past 128), whose buffers leave 2 KB of the 227 KB a block takes
BLOCK_LIST = {"flash_tma_fwd": 1024, KERNEL_TMA: 1024, KERNEL_TMA_WIDE: 512}
FAST_SPARSE_BLOCK = 128  # their tiles (128 or 64 a side) divide a block mask's blocks of a multiple of this


def supports_block_sparse(algorithm: str, schedule: str, direction: str) -> bool:
    """Whether ``make_plan(algorithm, schedule, direction=direction, block_mask=...)`` has kernels."""
    return (algorithm, schedule, direction) in BLOCK_SPARSE_STAGES


def check_block_mask(key: tuple[str, str, str], block_mask: object, n_q: int, n_k: int) -> None:
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be an iokernels.plan.masks.BlockMask, got {type(block_mask).__name__}")
    if key not in BLOCK_SPARSE_STAGES:
        why = {"standard": "standard attention computes all of S (it has no blocks to skip)"}
        raise Unsupported(f"block-sparse attention is not implemented by {'/'.join(key)}: "
                          f"{why.get(key[0], why.get(key[1], 'no kernel'))}")
    if (block_mask.n_q, block_mask.n_k) != (n_q, n_k):
        raise ValueError(f"block mask made for N_q={block_mask.n_q}, N_k={block_mask.n_k} given to a problem "
                         f"with N_q={n_q}, N_k={n_k}")




def with_block_mask(plan: Plan, block_mask: BlockMask | None) -> Plan:
    """``plan`` with a block mask: its ``block_mask`` field set and the ``BLOCK_SPARSE`` define added
    to the stages whose kernels skip zero blocks. The plan's tiles must divide the mask's blocks."""
    if block_mask is None:
        return plan
    key = (plan.algorithm, plan.schedule, plan.direction)
    check_block_mask(key, block_mask, plan.N_q, plan.N_k)
    if plan.variant:
        raise Unsupported(f"block-sparse attention is not implemented by {plan.label}")
    if plan.schedule == "fast" and (block_mask.block_q % plan.tile["Br"] or block_mask.block_k % plan.tile["Bc"]):
        raise Unsupported(f"{plan.label}: its tiles {plan.tile['Br']}x{plan.tile['Bc']} do not divide the block mask's "
                          f"blocks {block_mask.block_q}x{block_mask.block_k} (blocks of a multiple of "
                          f"{FAST_SPARSE_BLOCK} divide them)")
    block_mask.refine(plan.tile["Br"], plan.tile["Bc"])  # ValueError unless the tiles divide its blocks
    sparse = BLOCK_SPARSE_STAGES[key]
    params: tuple[tuple[str, int], ...] = (("BLOCK_SPARSE", 1),)
    if plan.schedule == "fast":
        main = next(s for s in plan.stages if s.name in sparse)
        if main.kernel not in BLOCK_LIST or dict(main.params).get("PERSISTENT"):
            persistent = " (persistent)" if main.kernel in BLOCK_LIST else ""
            raise Unsupported(f"block-sparse attention on the tensor cores is the sm_90 tma kernels' (a block per "
                              f"work item), not {main.kernel}{persistent}")
        forward = plan.direction == "fwd"
        listed = -(-(plan.N_k if forward else plan.N_q) // plan.tile["Bc" if forward else "Br"])
        if listed > BLOCK_LIST[main.kernel]:
            raise Unsupported(f"block-sparse {plan.label}: a {'row' if plan.direction == 'fwd' else 'column'} of "
                              f"{listed} blocks of the tile grid; its kernel lists at most {BLOCK_LIST[main.kernel]}")
        params += (("BLOCK_LIST", BLOCK_LIST[main.kernel]),)
    stages = tuple(replace(s, params=(*s.params, *params)) if s.name in sparse else s for s in plan.stages)
    return replace(plan, block_mask=block_mask, stages=stages)


# the stages whose kernels take the causal mask (CAUSAL define); the others are the unmasked ones
CAUSAL_STAGES: dict[tuple[str, str, str], tuple[str, ...]] = {
    ("standard", "default", "fwd"): ("qk", "rowsum", "normalize"),  # S = -inf where masked; rows with none
    ("standard", "default", "bwd"): (),  # P is 0 where masked: the backward's products need no mask
    ("two_pass", "store", "fwd"): ("stats", "output"),
    ("two_pass", "recompute", "fwd"): ("stats", "output"),
    ("flash", "kv_outer", "fwd"): ("main",),
    ("flash", "q_outer", "fwd"): ("main",),
    ("flash", "fast", "fwd"): ("main",),  # flash_wgmma.cu and the mma.sync flash_tc.cu
    ("flash", "kv_outer", "bwd"): ("main",),
    ("flash", "fast", "bwd"): ("main",),  # the sm_90 backwards (flash_tma_bwd.cu, flash_wgmma_bwd.cu) only
}


def supports_causal(algorithm: str, schedule: str, direction: str) -> bool:
    """Whether ``make_plan(algorithm, schedule, direction=direction, causal=True)`` has kernels."""
    return (algorithm, schedule, direction) in CAUSAL_STAGES


def with_causal(plan: Plan, causal: bool | str) -> Plan:
    """``plan`` with the causal mask: its ``causal`` field set and the ``CAUSAL`` define (1 top-left,
    2 bottom-right) added to the parameters of the stages whose kernels apply the mask."""
    causal = normalize_causal(causal)
    if not causal:
        return plan
    key = (plan.algorithm, plan.schedule, plan.direction)
    if key not in CAUSAL_STAGES or plan.variant:
        raise Unsupported(f"causal attention is not implemented by {plan.label} yet")
    masked = CAUSAL_STAGES[key]
    if key == ("flash", "fast", "bwd") and plan.stage("main").kernel not in SM90_BWD_KERNEL_NAMES:
        raise Unsupported("the causal tensor-core backward is the sm_90 kernels (tma, wgmma); the mma.sync backward "
                          "kernels (flash_tc_bwd.cu, and deterministic=True) have no causal mask")
    stages = tuple(replace(s, params=(*s.params, ("CAUSAL", CAUSAL_CODES[causal]), *band_params(s)))
                   if s.name in masked else s for s in plan.stages)
    return replace(plan, causal=causal, stages=stages)


def band_params(stage: Stage) -> tuple[tuple[str, int], ...]:
    """A causal tma stage's ``HEAD_BAND`` (:func:`iokernels.plan.fast.head_band`): a grid of a block per (query or
    key block, head), not persistent; none where the band is one head."""
    params = dict(stage.params)
    if stage.kernel not in (TMA_KERNEL, KERNEL_TMA, KERNEL_TMA_WIDE) or stage.grid[0] == 1 or stage.grid[1] != 1 or \
            {"PERSISTENT", "VARLEN", "ITEM_LIST"} & set(params):
        return ()
    band = head_band(stage.grid[0], stage.grid[2])
    return (("HEAD_BAND", band),) if band > 1 else ()




# the kernels that take a sliding window (WINDOW define; the band's two offsets as arguments, kernels/common.cuh):
# the sm_90 tma forward and backward. The research tiled schedules model and simulate a window, and the launcher
# refuses to run one (no kernel)
WINDOW_KERNELS = ("flash_tma_fwd", KERNEL_TMA, KERNEL_TMA_WIDE)


def with_window(plan: Plan, window: object) -> Plan:
    """``plan`` with a sliding window (left, right) (:func:`iokernels.plan.causal.normalize_window`; None: the plan
    unchanged). The tiled schedules' model and simulator take it (pairs with no visible element skipped, as for
    causal); standard attention computes S in full (−inf where masked). On flash/fast the tma kernels apply it
    (``WINDOW`` on the main stage; Unsupported with another kernel); the research kernels do not, and launching such
    a plan raises Unsupported (iokernels.kernels.launch)."""
    window = normalize_window(window)
    if window is None:
        return plan
    if plan.variant:
        raise Unsupported(f"a sliding window is not implemented by {plan.label}")
    stages = plan.stages
    if plan.schedule == "fast":
        if plan.stage("main").kernel not in WINDOW_KERNELS:
            raise Unsupported(f"a sliding window on the tensor-core path is implemented by the tma kernels (sm_90), "
                              f"not {plan.stage('main').kernel}")
        stages = tuple(replace(s, params=(*s.params, ("WINDOW", 1))) if s.name == "main" else s for s in stages)
    return replace(plan, window=window, stages=stages)


# the kernels that take a softcap (SOFTCAP, one runtime float after the window's offsets, kernels/common.cuh): the sm_90
# tma forward and the narrow tma backward, without dropout or a variable-length batch
SOFTCAP_KERNELS = ("flash_tma_fwd", KERNEL_TMA)


def check_softcap(softcap: object) -> float | None:
    """A softcap as a float: None (none) or a finite real number > 0 (ValueError/TypeError otherwise)."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap):
        raise TypeError(f"softcap must be a finite number > 0 or None, got {softcap!r}")
    if softcap <= 0:
        raise ValueError(f"softcap must be > 0, got {softcap!r}")
    return float(softcap)


def with_softcap(plan: Plan, softcap: object) -> Plan:
    """``plan`` with the logits capped: c · tanh(τ s / c) for a softcap c (Gemma 2's attention softcapping; None:
    the plan unchanged), forward and backward (dS times 1 − tanh²). The sm_90 tma kernels apply it (``SOFTCAP`` on
    the main stage: flash/fast with the tma kernels, d up to 256 forward and 128 backward, no dropout, a block mask
    or not); any other plan raises Unsupported. Bytes do not change."""
    softcap = check_softcap(softcap)
    if softcap is None:
        return plan
    kernel = next((s.kernel for s in plan.stages if s.name == "main"), None)
    if plan.schedule != "fast" or plan.variant or plan.dropout is not None or plan.mask is not None \
            or kernel not in SOFTCAP_KERNELS:
        raise Unsupported(f"a softcap runs on the sm_90 tma kernels (flash/fast forward, and the backward up to d 128) "
                          f"without dropout or explicit masks, not {plan.label}" + (f" ({kernel})" if kernel else ""))
    stages = tuple(replace(s, params=(*s.params, ("SOFTCAP", 1))) if s.name == "main" else s for s in plan.stages)
    return replace(plan, softcap=softcap, stages=stages)


# the kernels that take ALiBi slopes (ALIBI, the slopes' address after the softcap, kernels/common.cuh): the sm_90 tma
# forward (a block per work item: its slope read before the roles part) and narrow backward (the slopes of a K/V
# head's query heads, at most ALIBI_GROUP of them), d up to 128 (past it the forward's counting build spills 44 bytes
# with the bias), no softcap, no variable-length batch
ALIBI_KERNELS = ("flash_tma_fwd", KERNEL_TMA)
ALIBI_D_MAX = 128
ALIBI_GROUP = 32


def geometric_slopes(heads: int) -> tuple[float, ...]:
    """ALiBi's slopes for ``heads`` heads as the paper gives them for a power of two: 2^(−8(h + 1) / heads), h = 0, 1,
    ... (the CLI's and the bench's; any other numbers >= 0 may be given to the library)."""
    return tuple(2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads))


def alibi_floats(slopes: object) -> np.ndarray:
    """ALiBi slopes as given (numbers, a sequence or an array on the host) as a float64 array of their shape: TypeError
    for what is not numbers, ValueError unless there is one at least and every one is finite and >= 0."""
    try:
        a = np.asarray(slopes, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"alibi slopes must be numbers, got {type(slopes).__name__}") from None
    if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError("alibi slopes must be finite numbers >= 0, at least one")
    return a


def check_alibi(slopes: object, heads: int, batch: int) -> tuple[float, ...] | None:
    """ALiBi slopes as one float per batch·head (row b·heads + h): None (none), or ``heads`` numbers (every batch
    row alike) or ``batch · heads`` (numbers or a (batch, heads) array), each finite and >= 0 (FlashAttention-2's
    ``alibi_slopes``; :func:`alibi_floats`); TypeError/ValueError otherwise."""
    if slopes is None:
        return None
    a = alibi_floats(slopes)
    if a.size not in (heads, batch * heads) or a.ndim > 2:
        raise ValueError(f"alibi slopes: {heads} (heads) or {batch * heads} (batch x heads) numbers, got shape "
                         f"{a.shape}")
    a = np.tile(a.reshape(-1), batch) if a.size == heads else a.reshape(-1)
    return tuple(float(x) for x in a)


def with_alibi(plan: Plan, slopes: object) -> Plan:
    """``plan`` with ALiBi: the logits τ s plus −slope · |j − i − (N_k − N_q)| for query i and key j (the bottom-right
    offset, FlashAttention-2's), one slope per batch·head (:func:`check_alibi`; None: the plan unchanged), forward
    and backward. The sm_90 tma kernels apply it (``ALIBI`` on the main stage: flash/fast, d up to
    :data:`ALIBI_D_MAX`, a block per work item forward, at most :data:`ALIBI_GROUP` query heads per K/V head
    backward, no softcap); any other plan raises
    Unsupported. The kernels read the slopes: one float per block forward (BH·T_r), one per block and query head
    backward (BH·T_c)."""
    slopes = check_alibi(slopes, plan.heads, plan.batch)
    if slopes is None:
        return plan
    main = next((s for s in plan.stages if s.name == "main"), None)
    kernel = None if main is None else main.kernel
    if plan.schedule != "fast" or plan.variant or plan.softcap is not None or kernel not in ALIBI_KERNELS \
            or dict(main.params).get("PERSISTENT") or plan.d > ALIBI_D_MAX:
        raise Unsupported(f"ALiBi runs on the sm_90 tma kernels (flash/fast, a block per work item, d up to "
                          f"{ALIBI_D_MAX}) without a softcap, not {plan.label} at d={plan.d}"
                          + (f" ({kernel})" if kernel else ""))
    if plan.direction == "bwd" and plan.heads // plan.kv_heads > ALIBI_GROUP:
        raise Unsupported(f"ALiBi's backward takes at most {ALIBI_GROUP} query heads per K/V head, got "
                          f"{plan.heads // plan.kv_heads}")
    # (ALIBI: the most query heads whose slopes a backward block keeps)
    stages = tuple(replace(s, params=(*s.params, ("ALIBI", ALIBI_GROUP))) if s.name == "main" else s
                   for s in plan.stages)
    return replace(plan, alibi=slopes, stages=stages)


def with_documents(plan: Plan, documents: object) -> Plan:
    """``plan`` with document masking (:func:`iokernels.plan.causal.normalize_documents`; None or one document: the
    plan unchanged). The tiled schedules' model and simulator take it (pairs with no visible element skipped);
    standard attention computes S in full. No kernel implements it yet: launching it raises Unsupported."""
    documents = normalize_documents(documents, plan.N_q, plan.N_k)
    if documents is None:
        return plan
    if plan.variant:
        raise Unsupported(f"document masking is not implemented by {plan.label}")
    return replace(plan, documents=documents)


def plan_arrays(plan: Plan) -> dict[str, np.ndarray]:
    """The arrays that are part of a plan, which its kernels read as tensors (the launcher puts them on the device
    once): its block mask on the tile grid (T_r x T_c bytes), ALiBi's slopes (a float32 per batch·head), a causal tma
    plan's list of items (int32, plan.fast.item_list)."""
    out = {}
    if plan.block_mask is not None:
        out["block_mask"] = plan.block_grid()
    if plan.alibi is not None:
        out["alibi"] = np.asarray(plan.alibi, dtype=np.float32)
    if listed(plan):
        out["work"] = item_list(plan)
    return out


def check_runnable(plan: Plan) -> None:
    """Unsupported when ``plan`` has something its kernels do not do: a sliding window none of them applies (a
    research schedule's), or documents: no kernel takes those yet."""
    if plan.documents is not None:
        raise Unsupported(f"document masking on {plan.label} runs in the model and the simulator only: no kernel "
                          "takes it yet")
    if plan.window is not None and not any(dict(s.params).get("WINDOW") for s in plan.stages):
        raise Unsupported(f"a sliding window on {plan.label} runs in the model and the simulator only: its kernels "
                          "do not take one (flash/fast's tma kernels do)")
