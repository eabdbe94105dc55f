"""``iokernels.torch.attention``, ``iokernels.torch.attention_with_kvcache`` (the decode step) and
``iokernels.torch.attention_varlen`` (variable-length batches, with autograd): the torch front end of the library
(:mod:`iokernels.library.torch`).

An optional module: ``import iokernels`` never imports torch, and this one needs it.
"""

from .library.torch import attention, attention_varlen, attention_with_kvcache

__all__ = ["attention", "attention_varlen", "attention_with_kvcache"]
