"""plan: the one place where tiles, grids, threads and shared memory are decided (the lowest layer).

Owns the :class:`Plan` type, each kernel family's tile choice (:mod:`.research`, :mod:`.fast`,
:mod:`.fast_bwd`), the variants as plan transforms (:mod:`.variants`, :mod:`.causal`, :mod:`.masks`,
:mod:`.dropout`), and the problem's units and tensor names. Imports nothing else of iokernels.
"""

from .causal import (
    CAUSAL_ALIGNMENTS,
    CAUSAL_CODES,
    DEFAULT_CAUSAL_ALIGNMENT,
    band_offsets,
    causal_offset,
    causal_sums,
    key_block_ranges,
    normalize_causal,
    normalize_documents,
    normalize_window,
    pair_grid,
    pair_sums,
    visible_area,
    visible_key_blocks,
)
from .core import (
    ALGORITHMS,
    BYTE_TENSORS,
    D_MAX,
    D_MIN,
    D_MULTIPLE,
    DEFAULT_SCHEDULE,
    FLOAT32_TENSORS,
    SCHEDULES,
    Plan,
    SramTooSmall,
    Stage,
    TilesDoNotFit,
    Unsupported,
    check_problem,
    check_schedule,
)
from .dropout import Dropout, manual_seed
from .make import all_plans, make_plan, min_sram
from .masks import BlockMask, ExplicitMask
from .variants import (
    BLOCK_SPARSE_STAGES,
    CAUSAL_STAGES,
    DROPOUT_STAGES,
    MASK_STAGES,
    WINDOW_KERNELS,
    check_runnable,
    supports_block_sparse,
    supports_causal,
    supports_dropout,
    supports_explicit_mask,
    with_block_mask,
    with_causal,
    with_documents,
    with_dropout,
    with_mask,
    with_softcap,
    with_window,
)

__all__ = [
    "ALGORITHMS", "BLOCK_SPARSE_STAGES", "BYTE_TENSORS", "CAUSAL_ALIGNMENTS", "CAUSAL_CODES", "CAUSAL_STAGES",
    "DEFAULT_CAUSAL_ALIGNMENT", "DEFAULT_SCHEDULE", "DROPOUT_STAGES", "D_MAX", "D_MIN", "D_MULTIPLE", "FLOAT32_TENSORS",
    "MASK_STAGES", "SCHEDULES", "WINDOW_KERNELS", "BlockMask", "Dropout", "ExplicitMask", "Plan", "SramTooSmall",
    "Stage", "TilesDoNotFit", "Unsupported", "all_plans", "band_offsets", "causal_offset", "causal_sums",
    "check_problem", "check_runnable", "check_schedule", "key_block_ranges", "make_plan", "manual_seed",
    "min_sram", "normalize_causal", "normalize_documents", "normalize_window", "pair_grid", "pair_sums",
    "supports_block_sparse", "supports_causal", "supports_dropout", "supports_explicit_mask", "visible_area",
    "visible_key_blocks", "with_block_mask", "with_causal", "with_documents", "with_dropout", "with_mask",
    "with_softcap",
    "with_window",
]
