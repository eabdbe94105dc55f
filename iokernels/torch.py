"""``iokernels.torch.attention``, ``iokernels.torch.attention_with_kvcache`` (the decode step) and
``iokernels.torch.attention_varlen`` (variable-length batches, with autograd) and ``iokernels.torch.attention_mods``
(a user's mask_mod / score_mod in CUDA C, with autograd): the torch front end of the library
(:mod:`iokernels.library.torch`, :mod:`iokernels.library.torch_mods`).

An optional module: ``import iokernels`` never imports torch, and this one needs it.
"""

from .library.torch import attention, attention_varlen, attention_with_kvcache
from .library.torch_mods import attention_mods

__all__ = ["attention", "attention_mods", "attention_varlen", "attention_with_kvcache"]
