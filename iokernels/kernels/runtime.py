"""The one place that imports cupy, so that ``import iokernels`` never needs it; and the kernel cache folders."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
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


def cupy_cache_dir() -> Path:
    """cupy's on-disk kernel cache (``CUPY_CACHE_DIR``, default ``~/.cupy/kernel_cache``): RawModule
    compiles land here. Needs neither cupy nor a GPU."""
    root = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")
    with contextlib.suppress(ImportError, AttributeError):
        from cupy.cuda import compiler

        root = compiler.get_cache_dir()
    return Path(root)


def cubin_cache_dir() -> Path:
    """Where the sm_90a cubins that cupy's compile path does not take are kept (inside cupy's cache)."""
    return cupy_cache_dir() / "iokernels-arch"
