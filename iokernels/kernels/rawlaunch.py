"""Kernel launches on raw device addresses: one stage's parameter block built once, its buffer slots set and
the driver's ``cuLaunchKernel`` called through ctypes at each launch.

A cached call (:class:`RawPlan`, prepared by ``launch.prepare_raw``) sets a few slots and calls the driver
per stage, where cupy's launch converts every argument again (7.4–8.1 µs a launch on the H200's host,
``results/h200/bench/host-probe/pieces-7fd39ff.txt``). A plain launch calls ``cuLaunchKernel`` through cupy's Cython
binding (``cupy.cuda.driver.launchKernel``) where cupy has it: 4.0 µs on the H100's host against 6.6 µs for the same
call through ctypes (``results/h100/issue23/d12-12b3578/``); a programmatic dependent launch calls
``cuLaunchKernelEx`` through ctypes. Without the driver library (``libcuda.so.1``) the stage falls back to cupy's
launch of the same function on the same stream. :func:`fill_nan` is the debug poisoning of
``launch.DEBUG_POISON`` on raw addresses (an asynchronous memset on the stream).
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .driver import CUDA_ERROR_INVALID_CONTEXT, check, dependent_launch_config, driver, make_current
from .tensormap import MapArg

# NaN bit patterns, per storage itemsize (float16 and bfloat16 share the 2-byte size: both have one)
NAN_WORDS = {np.dtype(np.float16): (0x7E00, 2), np.dtype(np.uint16): (0x7FC0, 2),
             np.dtype(np.float32): (0x7FC00000, 4)}
_CTYPES = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
           np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
           np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}
def scalar_slot(value: Any) -> Any:
    """A ctypes value of a kernel argument's type (numpy scalars: their own width)."""
    dtype = np.asarray(value).dtype
    if dtype not in _CTYPES:
        raise TypeError(f"kernel argument {value!r} of dtype {dtype}: no parameter type for it")
    return _CTYPES[dtype](value.item() if hasattr(value, "item") else value)


# maps kept per map argument, by address: a decode step's K/V caches and its rotating buffers (a benchmark's
# L2-sized rotation, the allocator's reuse of a few addresses for q and the outputs) re-encode nothing
RECENT_MAPS = 64


class RawStage:
    """One kernel launch whose parameters are built once: ``args`` holds, in the kernel's order, ints for the
    buffers (the index of the address in the pointer list each launch gets), numpy scalars for the
    constants and bytes for a structure passed by value (a tensor map); with ``dropout``, the four
    parameters of the call's Dropout (``Dropout.kernel_args``) follow them; the counters' address, null
    (the plain build), comes last. ``function``: the compiled function (a cupy RawKernel) on ``device``."""

    __slots__ = ("binding", "buffers", "config", "counters", "device", "drops", "function", "launcher", "lock", "maps",
                 "params", "params_address", "params_slots", "prefix", "values")

    def __init__(self, function: Any, device: int, grid: Sequence[int], block: Sequence[int], smem: int,
                 args: Sequence[Any], dropout: bool, dependent: bool = False) -> None:
        """``dependent``: a programmatic dependent launch (PDL; the kernel waits for the previous one on the stream in
        ``griddepcontrol.wait``), where the driver has ``cuLaunchKernelEx``."""
        self.function, self.device = function, device
        slots: list[Any] = []
        self.buffers: list[tuple[Any, int]] = []  # (slot, pointer index)
        # [slot, MapArg, the address its map was encoded for, the maps encoded for recent addresses]
        self.maps: list[list[Any]] = []
        self.values: list[Any] = []  # the arguments in order, a buffer as its index (cupy's fallback)
        for a in args:
            if isinstance(a, int) and not isinstance(a, (bool, np.integer)):
                slot = ctypes.c_uint64(0)
                self.buffers.append((slot, a))
            elif isinstance(a, bytes):  # a structure passed by value (a TMA tensor map, tensormap.py)
                slot = (ctypes.c_ubyte * len(a)).from_buffer_copy(a)
            elif isinstance(a, MapArg):  # encoded at launch, again only when its buffer moves
                slot = (ctypes.c_ubyte * 128)()
                self.maps.append([slot, a, None, OrderedDict()])
            else:
                slot = scalar_slot(a)
            self.values.append(a)
            slots.append(slot)
        self.drops = [ctypes.c_uint32(0), ctypes.c_float(0), ctypes.c_uint64(0), ctypes.c_uint32(0)] if dropout \
            else []
        self.counters = ctypes.c_uint64(0)  # the counters' address: none (the plain build)
        slots += [*self.drops, self.counters]
        self.params = (ctypes.c_void_p * len(slots))(*(ctypes.addressof(s) for s in slots))
        self.params_slots = slots
        kernel = getattr(function, "kernel", None)  # cupy's Function on the current device (the plan's)
        handle = getattr(kernel, "ptr", None)
        lib = driver()
        self.launcher = None if lib is None or handle is None else lib.cuLaunchKernel
        self.prefix = (handle, *(int(x) for x in (*grid, 1, 1)[:3]), *(int(x) for x in (*block, 1, 1)[:3]), int(smem))
        self.config = None  # PDL: the configuration of cuLaunchKernelEx
        if dependent and self.launcher is not None and hasattr(lib, "cuLaunchKernelEx"):
            self.config = dependent_launch_config(grid, block, smem)
            self.launcher = lib.cuLaunchKernelEx
        # a plain launch: cuLaunchKernel through cupy's binding where it has one (module docstring)
        self.binding = cupy_launch_kernel() if self.launcher is not None and self.config is None else None
        self.params_address = ctypes.addressof(self.params)
        self.lock = threading.Lock()  # one parameter block: concurrent launches of this stage take turns

    def launch(self, pointers: Sequence[int], stream: int, dropout: Any = None, counters: int = 0) -> None:
        """Enqueue on ``stream`` (a raw CUstream handle) with the buffers at ``pointers`` (``counters``: the
        counting build's counters, else 0)."""
        if self.launcher is None:
            self._cupy_launch(pointers, stream, dropout, counters)
            return
        with self.lock:
            for slot, i in self.buffers:
                slot.value = pointers[i]
            for entry in self.maps:
                slot, arg, encoded_for, recent = entry
                pointer = pointers[arg.buffer]
                if encoded_for != pointer:  # a buffer that moved: its map again (one of the last few, or encoded)
                    encoded = recent.pop(pointer, None) or arg.encode(pointer)
                    recent[pointer] = encoded
                    if len(recent) > RECENT_MAPS:
                        recent.popitem(last=False)
                    ctypes.memmove(slot, encoded, 128)
                    entry[2] = pointer
            self.counters.value = counters
            if self.drops:
                for slot, value in zip(self.drops, dropout.kernel_args(), strict=True):
                    slot.value = value.item()
            code = self._launch(stream)
            if code == CUDA_ERROR_INVALID_CONTEXT:  # a thread without a current context
                make_current(self.device)
                code = self._launch(stream)
        if code:
            check(code, f"cuLaunchKernel of {getattr(self.function, 'name', 'a kernel')}")

    def _launch(self, stream: int) -> int:
        """The driver's launch of the stage on ``stream``: its CUresult (0, or the error's code)."""
        if self.binding is not None:
            try:
                self.binding(*self.prefix, stream, self.params_address, 0)
            except RuntimeError as exc:  # (cupy's CUDADriverError: its CUresult as status)
                code = getattr(exc, "status", None)
                if not isinstance(code, int) or code == 0:
                    raise
                return code
            return 0
        if self.config is None:
            return self.launcher(*self.prefix, stream, self.params, None)
        self.config.hStream = stream
        return self.launcher(ctypes.byref(self.config), self.prefix[0], self.params, None)

    def _cupy_launch(self, pointers: Sequence[int], stream: int, dropout: Any, counters: int) -> None:
        import cupy as cp

        if any(isinstance(a, (bytes, MapArg)) for a in self.values):
            raise RuntimeError("a kernel that takes a structure by value (a tensor map) needs the driver library")

        values = [np.uint64(pointers[a]) if isinstance(a, int) and not isinstance(a, (bool, np.integer)) else a
                  for a in self.values]
        if self.drops:
            values += list(dropout.kernel_args())
        values.append(np.uint64(counters))
        _, gx, gy, gz, bx, by, bz, smem = self.prefix
        with cp.cuda.ExternalStream(stream):
            self.function((gx, gy, gz), (bx, by, bz), tuple(values), shared_mem=smem)


def cupy_launch_kernel() -> Callable[..., None] | None:
    """cupy's Cython binding of cuLaunchKernel (f, grid x y z, block x y z, shared bytes, stream, kernelParams, extra:
    addresses as ints; raises cupy's CUDADriverError, whose ``status`` is the CUresult), or None without cupy."""
    try:
        from cupy.cuda import driver as cupy_driver
    except Exception:  # no cupy, or no CUDA for it
        return None
    return getattr(cupy_driver, "launchKernel", None)


def fill_nan(pointer: int, dtype: np.dtype, count: int, stream: int, device: int | None = None) -> None:
    """Fill ``count`` elements of ``dtype`` at ``pointer`` with NaN, asynchronously on ``stream``; integer
    buffers are left as they are. ``device``: the buffer's, bound first on a thread with no current context (the
    runtime's current device when None)."""
    word = NAN_WORDS.get(np.dtype(dtype))
    if word is None or not count:
        return
    lib = driver()
    if lib is None:
        import cupy as cp

        mem = cp.cuda.UnownedMemory(pointer, count * word[1], None)
        array = cp.ndarray((count,), np.uint16 if word[1] == 2 else np.uint32, cp.cuda.MemoryPointer(mem, 0))
        with cp.cuda.ExternalStream(stream):
            array.fill(word[0])
        return
    setter = lib.cuMemsetD16Async if word[1] == 2 else lib.cuMemsetD32Async
    code = setter(pointer, word[0], count, stream)
    if code == CUDA_ERROR_INVALID_CONTEXT:  # a thread without a current context (autograd's worker), as launches
        from cupy.cuda import runtime

        make_current(runtime.getDevice() if device is None else device)
        code = setter(pointer, word[0], count, stream)
    check(code, "NaN fill")


@dataclass(frozen=True)
class RawPlan:
    """A plan's launches prepared once for raw device addresses (``launch.prepare_raw``): every buffer the plan
    touches in ``names`` order, which is the caller's ``inputs`` (those the plan reads), then the outputs a run
    allocates (``allocations``: shape and storage dtype each), then its workspace (the other tensors it writes,
    at ``workspace`` offsets in one block), then the plan's own constants (the block mask's tile grid, on the
    device once). :meth:`launch` enqueues every stage; :meth:`run` allocates and launches."""

    names: tuple[str, ...]
    inputs: tuple[int, ...]  # positions, in the caller's input tuple, of the inputs the plan reads
    allocations: tuple[tuple[tuple[int, ...], np.dtype], ...]
    workspace: tuple[tuple[int, int, np.dtype], ...]  # (byte offset, elements, storage dtype) per tensor
    workspace_bytes: int
    constants: tuple[Any, ...]  # device arrays, kept alive here
    constant_pointers: tuple[int, ...]
    stages: tuple[Any, ...]  # RawStage

    def launch(self, pointers: list[int], stream: int, dropout: Any) -> None:
        """Enqueue the plain build on ``stream`` with the buffers at ``pointers`` (``names`` order, constants
        included), ``dropout`` the plan's Dropout (or None)."""
        for stage in self.stages:
            stage.launch(pointers, stream, dropout)

    def run(self, given: tuple[int, ...], allocate: Callable[[int | None, tuple[int, ...], np.dtype], tuple[Any, int]],
            stream: int, dropout: Any, poison: bool = False) -> list[Any]:
        """Allocate the outputs and the workspace block (``allocate(position, shape, dtype)`` gives an array and
        its address; position None for the workspace, uint8; NaN-filled first with ``poison``,
        ``launch.DEBUG_POISON`` for the library's calls),
        launch on the caller's inputs at addresses ``given``, and return the outputs in ``allocations`` order.
        The workspace block is released on return: the allocators reuse it only after the stream's work."""
        pointers = [given[i] for i in self.inputs]
        device = self.stages[0].device if self.stages else None
        arrays = []
        for position, (shape, dtype) in enumerate(self.allocations):
            array, pointer = allocate(position, shape, dtype)
            arrays.append(array)
            pointers.append(pointer)
            if poison:
                fill_nan(pointer, dtype, math.prod(shape), stream, device)
        if self.workspace:
            _block, base = allocate(None, (self.workspace_bytes,), np.dtype(np.uint8))  # alive until launched
            for offset, elements, dtype in self.workspace:
                pointers.append(base + offset)
                if poison:
                    fill_nan(base + offset, dtype, elements, stream, device)
        pointers += self.constant_pointers
        self.launch(pointers, stream, dropout)
        return arrays
