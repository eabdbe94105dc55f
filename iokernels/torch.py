"""``iokernels.torch.attention`` and ``iokernels.torch.attention_with_kvcache`` (the decode step): the torch front
end of the library (:mod:`iokernels.library.torch`).

An optional module: ``import iokernels`` never imports torch, and this one needs it.
"""

from .library.torch import attention, attention_with_kvcache

__all__ = ["attention", "attention_with_kvcache"]
