"""The one place that imports cupy, so that ``import iokernels`` never needs it."""

from __future__ import annotations

from types import ModuleType

INSTALL_HINT = "pip install 'iokernels[cuda13]' (or '[cuda12]' for a CUDA 12 driver)"


def require_cupy() -> ModuleType:
    """Return cupy with a usable CUDA device, or raise RuntimeError saying what is missing."""
    try:
        import cupy
    except ImportError as exc:
        raise RuntimeError(f"this needs cupy and a CUDA GPU; cupy is not installed: {INSTALL_HINT}") from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # the CUDA driver is missing or broken
        raise RuntimeError(f"this needs a CUDA GPU; cupy found no usable driver ({exc})") from exc
    if count == 0:
        raise RuntimeError("this needs a CUDA GPU; cupy sees no device")
    return cupy
