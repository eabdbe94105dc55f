"""The CUDA driver library (``libcuda.so.1``) through ctypes: the few entry points the raw launches
(:mod:`.rawlaunch`) and the tensor maps (:mod:`.tensormap`) call, loaded once, and its error codes as exceptions."""

from __future__ import annotations

import ctypes
from typing import Any

CUDA_ERROR_INVALID_CONTEXT = 201
_DRIVER: list[Any] = []  # [the ctypes library or None], loaded once


def driver() -> Any:
    """The CUDA driver library through ctypes (None where it cannot be loaded), with the prototypes used here."""
    if not _DRIVER:
        try:
            lib = ctypes.PyDLL("libcuda.so.1")  # PyDLL keeps the GIL across a call (a launch takes microseconds;
            # handing the GIL back and forth from autograd's worker thread cost more than the launch)
        except OSError:
            lib = None
        if lib is not None:
            u, p = ctypes.c_uint, ctypes.c_void_p
            lib.cuLaunchKernel.argtypes = [p, u, u, u, u, u, u, u, p, p, p]
            lib.cuLaunchKernel.restype = ctypes.c_int
            lib.cuMemsetD16Async.argtypes = [ctypes.c_uint64, ctypes.c_ushort, ctypes.c_size_t, p]
            lib.cuMemsetD16Async.restype = ctypes.c_int
            lib.cuMemsetD32Async.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, p]
            lib.cuMemsetD32Async.restype = ctypes.c_int
            lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            if hasattr(lib, "cuTensorMapEncodeTiled"):  # CUDA 12 drivers and newer (tensormap.py)
                u32p, u64p, i = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64), ctypes.c_int
                lib.cuTensorMapEncodeTiled.argtypes = [p, i, ctypes.c_uint32, p, u64p, u64p, u32p, u32p, i, i, i, i]
                lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
        _DRIVER.append(lib)
    return _DRIVER[0]


class CudaError(RuntimeError):
    """A driver call returned an error code."""


def check(code: int, what: str) -> None:
    if code:
        text = ctypes.c_char_p()
        lib = driver()
        if lib is not None:
            lib.cuGetErrorString(code, ctypes.byref(text))
        raise CudaError(f"{what} failed: CUDA error {code} ({(text.value or b'?').decode()})")


def make_current(device: int) -> None:
    """Make ``device``'s primary context current on this thread (a thread that never used the runtime has none)."""
    from cupy.cuda import runtime

    runtime.setDevice(device)
    runtime.free(0)  # a runtime call that binds the primary context
