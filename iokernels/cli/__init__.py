"""cli: the ``iokernels`` command, thin click commands over library/, analysis/ and bench/ (the top layer:
it may import every layer below it). One module per command group (:mod:`.research`, :mod:`.bench`,
:mod:`.library`); :mod:`.options` holds what they share.
"""

from . import bench, library, paper, research  # noqa: F401  (each adds its commands to the group)
from .app import cli, main

__all__ = ["cli", "main"]
