"""iokernels: the FlashAttention paper's IO argument, measured.

Import is cheap and works without cupy or a GPU: plans, the model and the simulator run on the CPU.
"""

from __future__ import annotations

from .api import DeviceMemoryError, attention, attention_backward, memory_needed
from .dropout import Dropout, manual_seed
from .gpu import count_io
from .masks import BlockMask
from .plan import ALGORITHMS, SCHEDULES, Plan, SramTooSmall, all_plans, make_plan, min_sram
from .reference import default_scale
from .units import parse_size

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
    "count_io",
    "default_scale",
    "make_plan",
    "manual_seed",
    "memory_needed",
    "min_sram",
    "parse_size",
]
