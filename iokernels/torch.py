"""``iokernels.torch.attention``: the torch front end of the library (:mod:`iokernels.library.torch`).

An optional module: ``import iokernels`` never imports torch, and this one needs it.
"""

from .library.torch import attention

__all__ = ["attention"]
