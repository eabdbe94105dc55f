"""library: the attention functions users call (numpy/cupy in :mod:`.api`, torch in :mod:`.torch`, on the
custom operators of :mod:`.torch_ops`, :mod:`.torch_kvcache` and :mod:`.torch_varlen`), their plan choice (kept per
call signature by :mod:`.dispatch`) and execution, the KV-cache decode step (:mod:`.kvcache`), variable-length batches
(:mod:`.varlen`), :mod:`.warmup`, and the generated API reference (:mod:`.apidoc`).
Imports plan/, simulate/ and kernels/.
"""

from .api import attention, attention_backward, memory_needed
from .execute import clear_graphs
from .kvcache import attention_with_kvcache
from .memory import DeviceMemoryError
from .mods import attention_mods, attention_mods_backward, create_block_mask
from .varlen import attention_varlen, attention_varlen_backward

__all__ = ["DeviceMemoryError", "attention", "attention_backward", "attention_mods", "attention_mods_backward",
           "attention_varlen", "attention_varlen_backward", "attention_with_kvcache", "clear_graphs",
           "create_block_mask", "memory_needed"]
