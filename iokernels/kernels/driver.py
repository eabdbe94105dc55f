"""The CUDA driver library (``libcuda.so.1``) through ctypes: the few entry points the raw launches
(:mod:`.rawlaunch`) and the tensor maps (:mod:`.tensormap`) call, loaded once, and its error codes as exceptions."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

CUDA_ERROR_INVALID_CONTEXT = 201
_DRIVER: list[Any] = []  # [the ctypes library or None], loaded once


# cuLaunchKernelEx's configuration (cuda.h, CUDA 12): a launch attribute is an id, 4 bytes of padding and a 64-byte
# value union; PROGRAMMATIC_STREAM_SERIALIZATION (value: an int, 1) lets the kernel start while the one before it on
# the stream finishes (programmatic dependent launch: it waits in griddepcontrol.wait for that kernel's memory)
LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def dependent_launch_config(grid: Sequence[int], block: Sequence[int], smem: int) -> LaunchConfig:
    """A launch configuration with programmatic stream serialization on (the stream is set at each launch)."""
    attribute = LaunchAttribute(LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    attribute.value[0] = 1
    config = LaunchConfig(*(int(x) for x in (*grid, 1, 1)[:3]), *(int(x) for x in (*block, 1, 1)[:3]), int(smem), None,
                          ctypes.pointer(attribute), 1)
    config._attribute = attribute  # kept alive with the configuration
    return config


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
            if hasattr(lib, "cuLaunchKernelEx"):  # CUDA 12 drivers and newer: launches with attributes (PDL)
                lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), p, p, p]
                lib.cuLaunchKernelEx.restype = ctypes.c_int
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
