"""Tensor maps for the bulk tensor copy engine (TMA, sm_90): the 128-byte ``CUtensorMap`` a kernel takes by value
(``const __grid_constant__ IokTensorMap``, kernels/tma.cuh), encoded on the host by the driver's
``cuTensorMapEncodeTiled`` through ctypes.

:func:`attention_map` is the one layout the attention kernels load: a row-major (BH, N, d) tensor seen as 3-D
{d, N, BH} (innermost first), boxes of ``rows`` x 128 bytes (64 2-byte elements, or 32 float32 for the backward's
dQacc; the 128-byte swizzle) inside one head, so rows past N are zero-filled instead of read from the next head.
A variable-length batch's (n, bh, d) tensors (``packed``) are the same boxes with the strides of that
layout: a box's rows past n are zero-filled, those past a sequence's end inside n are the next sequence's. A tile is
ceil(d / 64) boxes of 2-byte elements, one per slab (column coordinate 64 s); the columns of the last box past d are
zero-filled too. :func:`check_tiled` states the driver's rules, so a bad map fails here with a message instead of
inside the driver.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .driver import CUDA_ERROR_INVALID_CONTEXT, driver, make_current

MAP_BYTES = 128
MAP_ALIGN = 64
# CUtensorMapDataType, CUtensorMapSwizzle (cuda.h)
DATA_TYPES = {"uint8": 0, "float16": 6, "float32": 7, "bfloat16": 9}
ITEMSIZE = {"uint8": 1, "float16": 2, "float32": 4, "bfloat16": 2}
SWIZZLE_BYTES = {0: 0, 32: 1, 64: 2, 128: 3}  # bytes of the swizzle span -> the enum
BOX_MAX = 256
SWIZZLE_SPAN = 128  # bytes: the attention maps' boxes are one 128-byte swizzle span wide


class TensorMapError(ValueError):
    """A tensor map the driver would refuse (or did refuse)."""


def check_tiled(pointer: int, dtype: str, dims: Sequence[int], strides: Sequence[int], box: Sequence[int],
                swizzle: int) -> None:
    """The driver's rules for a tiled map (cuTensorMapEncodeTiled): ``dims`` innermost first, ``strides`` in
    bytes for dims 1.. (dim 0 is contiguous), ``box`` the elements copied per dim, ``swizzle`` 0/32/64/128 bytes."""
    if dtype not in DATA_TYPES:
        raise TensorMapError(f"tensor map dtype {dtype!r}: expected one of {', '.join(DATA_TYPES)}")
    rank = len(dims)
    if not 1 <= rank <= 5 or len(box) != rank or len(strides) != rank - 1:
        raise TensorMapError(f"tensor map of rank {rank}: dims, box ({len(box)}) and strides ({len(strides)}, one "
                             "fewer than dims) must agree, rank 1 to 5")
    if pointer % 16:
        raise TensorMapError(f"tensor map base address {pointer:#x} is not 16-byte aligned")
    if any(not 1 <= n <= 2**32 for n in dims):
        raise TensorMapError(f"tensor map dims {tuple(dims)}: each must be in 1..2^32")
    if any(s % 16 or not 0 < s < 2**40 for s in strides):
        raise TensorMapError(f"tensor map strides {tuple(strides)} (bytes): each a positive multiple of 16 below 2^40")
    if any(not 1 <= b <= BOX_MAX for b in box):
        raise TensorMapError(f"tensor map box {tuple(box)}: each extent in 1..{BOX_MAX}")
    inner = box[0] * ITEMSIZE[dtype]
    if inner % 16:
        raise TensorMapError(f"tensor map box inner extent {inner} bytes: must be a multiple of 16")
    if swizzle not in SWIZZLE_BYTES:
        raise TensorMapError(f"tensor map swizzle {swizzle}: expected 0, 32, 64 or 128 bytes")
    if swizzle and inner > swizzle:
        raise TensorMapError(f"tensor map box inner extent {inner} bytes exceeds the {swizzle}-byte swizzle span")


def attention_args(pointer: int, dtype: str, bh: int, n: int, d: int, rows: int, packed: bool = False
                   ) -> tuple[list[int], list[int], list[int], int]:
    """(dims, strides, box, swizzle) of :func:`attention_map`."""
    itemsize = ITEMSIZE[dtype]
    if (d * itemsize) % 16:
        raise TensorMapError(f"attention tensor map: rows of d={d} {dtype} elements are not a multiple of 16 bytes")
    strides = [bh * d * itemsize, d * itemsize] if packed else [d * itemsize, n * d * itemsize]
    return [d, n, bh], strides, [SWIZZLE_SPAN // itemsize, rows, 1], SWIZZLE_SPAN


def encode_tiled(pointer: int, dtype: str, dims: Sequence[int], strides: Sequence[int], box: Sequence[int],
                 swizzle: int) -> bytes:
    """The 128-byte map (checked by :func:`check_tiled`; out-of-bounds elements read as zero)."""
    return _encoder(dtype, tuple(dims), tuple(strides), tuple(box), swizzle)(pointer)


@functools.cache
def _encoder(dtype: str, dims: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...], swizzle: int
             ) -> Callable[[int], bytes]:
    """The encoder of one map shape: its rules checked and its arguments made once, the address at each call."""
    check_tiled(0, dtype, dims, strides, box, swizzle)
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    rank = len(dims)
    args = (DATA_TYPES[dtype], rank, (u64 * rank)(*dims), (u64 * max(rank - 1, 1))(*strides), (u32 * rank)(*box),
            (u32 * rank)(*([1] * rank)), 0, SWIZZLE_BYTES[swizzle], 0, 0)

    def encode(pointer: int) -> bytes:
        if pointer % 16:
            raise TensorMapError(f"tensor map base address {pointer:#x} is not 16-byte aligned")
        lib = driver()
        if lib is None or not hasattr(lib, "cuTensorMapEncodeTiled"):
            raise RuntimeError("tensor maps need the CUDA driver library (libcuda.so.1) of CUDA 12 or newer")
        raw = ctypes.create_string_buffer(MAP_BYTES + MAP_ALIGN)  # the driver writes a 64-byte aligned map
        start = (-ctypes.addressof(raw)) % MAP_ALIGN
        code = lib.cuTensorMapEncodeTiled(ctypes.addressof(raw) + start, args[0], args[1], pointer, *args[2:])
        if code == CUDA_ERROR_INVALID_CONTEXT:
            # a thread with no current context (autograd's worker before any runtime call of its own): bind the
            # current device's primary context and encode again
            from cupy.cuda import runtime

            make_current(runtime.getDevice())
            code = lib.cuTensorMapEncodeTiled(ctypes.addressof(raw) + start, args[0], args[1], pointer, *args[2:])
        if code:
            raise TensorMapError(f"cuTensorMapEncodeTiled refused the map (CUDA error {code}): dims {dims}, "
                                 f"strides {strides}, box {box}, swizzle {swizzle}")
        return raw.raw[start:start + MAP_BYTES]

    return encode


def attention_map(pointer: int, dtype: str, bh: int, n: int, d: int, rows: int, packed: bool = False) -> bytes:
    """The map of a (bh, n, d) row-major tensor at ``pointer`` (``packed``: an (n, bh, d) one, a variable-length
    batch's rows of every head side by side) loaded as boxes of ``rows`` x 128 bytes (64 2-byte elements, 32 float32),
    128-byte swizzled; box (slab s, first row r, head z) is at coordinates (64 s, r, z) for 2-byte elements, (32 s, r,
    z) for float32."""
    return encode_tiled(pointer, dtype, *attention_args(pointer, dtype, bh, n, d, rows, packed))


@dataclass(frozen=True)
class MapArg:
    """A kernel parameter that is the TMA tensor map of one of the launch's buffers (kernels/tma.cuh): the
    buffer (its name in a stage's layout, its index in the launch's pointers once prepared), the map's dtype,
    the tensor's (bh, n, d), the rows of one box and whether it is laid out (n, bh, d) (tensormap.attention_map);
    or, with ``layout`` (dims, strides, box: :func:`encode_tiled`'s, 128-byte swizzled), any other tiled map (an
    explicit mask's, iokernels.plan.mods.mask_layout; bh, n, d and rows unused)."""

    buffer: int | str
    dtype: str
    bh: int
    n: int
    d: int
    rows: int
    packed: bool = False
    layout: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None

    def encode(self, pointer: int) -> bytes:
        if self.layout is not None:
            return encode_tiled(pointer, self.dtype, *self.layout, SWIZZLE_SPAN)
        return attention_map(pointer, self.dtype, self.bh, self.n, self.d, self.rows, self.packed)
