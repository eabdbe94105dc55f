"""library: the attention functions users call (numpy/cupy in :mod:`.api`, torch in :mod:`.torch`, on the
custom operators of :mod:`.torch_ops`), their plan choice (kept per call signature by :mod:`.dispatch`) and
execution, :mod:`.warmup`, and the generated API reference (:mod:`.apidoc`).
Imports plan/, simulate/ and kernels/.
"""

from .api import attention, attention_backward, memory_needed
from .execute import clear_graphs
from .memory import DeviceMemoryError

__all__ = ["DeviceMemoryError", "attention", "attention_backward", "clear_graphs", "memory_needed"]
