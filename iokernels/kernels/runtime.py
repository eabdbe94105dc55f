"""The one place that imports cupy, so that ``import iokernels`` never needs it; the kernel cache folders; the
source commit that results record."""

from __future__ import annotations

import contextlib
import os
import subprocess
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


def source_commit() -> str | None:
    """The git commit of the source tree this package runs from, short, with "-dirty" when tracked files are
    modified (None outside a checkout); ``IOKERNELS_COMMIT`` overrides it, for copies of the tree whose .git is
    stale (``scripts/gpu_suite.sh`` sets it from COMMIT). Every result file's header takes it from here."""
    if os.environ.get("IOKERNELS_COMMIT"):
        return os.environ["IOKERNELS_COMMIT"]
    root = str(Path(__file__).resolve().parents[1])
    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=False)
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
