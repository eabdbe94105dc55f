"""iokernels: the FlashAttention paper's IO argument, measured.

Layers, lowest first (a module imports only from its own layer or lower ones):
plan ← model, simulate, kernels ← library, analysis, bench ← cli. docs/ARCHITECTURE.md has the tour.

Import is cheap and works without cupy or a GPU: plans, the model and the simulator run on the CPU.
"""

from __future__ import annotations

from .kernels.launch import count_io
from .library import (
    DeviceMemoryError,
    attention,
    attention_backward,
    attention_mods,
    attention_mods_backward,
    attention_varlen,
    attention_varlen_backward,
    attention_with_kvcache,
    clear_graphs,
    create_block_mask,
    memory_needed,
)
from .plan import (
    ALGORITHMS,
    SCHEDULES,
    BlockMask,
    Dropout,
    Plan,
    SramTooSmall,
    all_plans,
    make_plan,
    manual_seed,
    min_sram,
)
from .plan.units import parse_size
from .simulate.reference import default_scale

__version__ = "0.1.0"

__all__ = [
    "ALGORITHMS",
    "SCHEDULES",
    "BlockMask",
    "DeviceMemoryError",
    "Dropout",
    "Plan",
    "SramTooSmall",
    "__version__",
    "all_plans",
    "attention",
    "attention_backward",
    "attention_mods",
    "attention_mods_backward",
    "attention_varlen",
    "attention_varlen_backward",
    "attention_with_kvcache",
    "clear_graphs",
    "count_io",
    "create_block_mask",
    "default_scale",
    "make_plan",
    "manual_seed",
    "memory_needed",
    "min_sram",
    "parse_size",
]
