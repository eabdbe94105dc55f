"""simulate: the schedules executed tile by tile in numpy, counting bytes by the kernels' rules, and the
float64 reference (:mod:`.reference`). Imports only plan/.
"""

from . import reference
from .hbm import ALL, KV_TENSORS, Hbm
from .inputs import (
    cache_reference,
    make_inputs,
    max_relative_error,
    random_mask,
    reference_mask,
    reference_outputs,
)
from .simulator import SimResult, item_list_counts, kv_rows, reference_dropout, simulate

__all__ = [
    "ALL",
    "KV_TENSORS",
    "Hbm",
    "SimResult",
    "cache_reference",
    "item_list_counts",
    "kv_rows",
    "make_inputs",
    "max_relative_error",
    "random_mask",
    "reference",
    "reference_dropout",
    "reference_mask",
    "reference_outputs",
    "simulate"
]
