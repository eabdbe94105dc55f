"""The library's dispatch cache: what a call decides before it launches (the checked shapes, the plans, the
device bytes they need, and, after the first run, the prepared kernel launches), kept per call signature.

A call's key (:func:`call_key`) holds everything those decisions read: each array's type, shape, dtype and
strides, the options (algorithm, schedule, causal, the sliding window (normalized), scale, sram, deterministic,
block mask, the explicit mask's type/shape/dtype, whether there is dropout, bfloat16) and the current device.
Equal keys give equal decisions, so a hit skips the checks and the planning; a call whose key has never succeeded
is checked and planned in full (its errors are raised then, and nothing is stored). What changes from call to call
with the same key is not cached: the mask's values, the dropout's seed and offset (:meth:`Dispatch.chain_for`),
the device's free memory, the buffers.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..plan import Plan

CACHE_SIZE = 256  # call signatures kept (least recently used dropped first)


@dataclass
class Dispatch:
    """One call signature's decisions. ``raws``: one slot per plan of ``chain``, the plan's prepared kernel
    launches (``kernels.rawlaunch.RawPlan``), filled at its first run on the device. ``fast``: for a call that
    can run on raw addresses (one plan, no expanded K/V, contiguous device inputs: ``fast_ok``), that plan's
    RawPlan with the library's input order and the outputs in the caller's shapes, filled after its first
    run; later calls allocate the outputs and launch it, nothing else (``api``'s fast paths)."""

    module: str  # "numpy" or "cupy"
    dtype: str  # the plans' dtype
    lead: tuple[int, ...]
    n_q: int
    n_k: int
    d: int
    group: int  # query heads per K/V head
    expand: bool  # K and V expanded to q's heads (grouped-query attention the plan does not take)
    chain: tuple[Plan, ...]  # the plans run in order (with the Dropout of the call that built it)
    needed_bytes: int  # device bytes beyond the inputs, copies of numpy/non-contiguous inputs included
    scale: float  # the softmax scale the kernels take
    fast_ok: bool = False
    raws: list[Any] = field(default_factory=list)
    fast: Any = None  # kernels.rawlaunch.RawPlan
    outputs: dict[str, int] = field(default_factory=dict)  # fast's allocated tensors: name -> position

    def __post_init__(self) -> None:
        if not self.raws:
            self.raws = [None] * len(self.chain)

    def chain_for(self, dropout: Any) -> tuple[Plan, ...]:
        """The plans with this call's Dropout (its seed and offset), in the plans that apply dropout."""
        if (dropout is None) != all(p.dropout is None for p in self.chain):
            raise RuntimeError("dispatch cache: a call with and one without dropout share a key")
        if dropout is None:
            return self.chain
        return tuple(p if p.dropout is None or p.dropout == dropout else replace(p, dropout=dropout)
                     for p in self.chain)


def array_key(x: Any) -> tuple[Any, ...]:
    """What a call reads of an array before it launches: type, shape, dtype, strides (contiguity), and the device
    of a cupy array (None for numpy's). AttributeError for what is not a numpy or cupy array."""
    return (type(x), x.shape, x.dtype, x.strides, getattr(x.data, "device_id", None))


def dropout_present(dropout: Any) -> bool:
    """Whether a call's ``dropout`` gives a Dropout (a probability other than 0, or a Dropout). An invalid
    value counts as present: the call checks it either way."""
    if dropout is None:
        return False
    if isinstance(dropout, numbers.Real) and not isinstance(dropout, bool):
        return dropout != 0
    return True


def device_id() -> int | None:
    """The current CUDA device (cupy's), or None without cupy or a device."""
    try:
        from cupy.cuda import runtime

        return runtime.getDevice()
    except Exception:  # no cupy, no driver, no device
        return None


def call_key(direction: str, arrays: tuple[Any, ...], mask: Any, **options: Any) -> tuple[Any, ...] | None:
    """The cache key of a call: ``direction``, :func:`array_key` of each array and of the mask (None
    without one), the options in keyword order, and the current device. None when an array is not
    numpy or cupy (the call is then checked in full, and fails)."""
    try:
        shapes = tuple(array_key(x) for x in arrays)
        mask_key = None if mask is None else array_key(mask)
    except AttributeError:
        return None
    return (direction, shapes, mask_key, *options.items(), device_id())


class DispatchCache:
    """An LRU map from :func:`call_key` to :class:`Dispatch`, with hit and miss counts."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self.entries: OrderedDict[tuple, Dispatch] = OrderedDict()
        self.hits = self.misses = 0
        self.lock = threading.Lock()  # calls from several threads: no entry is moved after its eviction

    def lookup(self, key: tuple[Any, ...] | None, build: Callable[[], Dispatch]) -> Dispatch:
        """The entry of ``key``, else ``build()`` stored under it (not stored when ``key`` is None or
        unhashable, or when ``build`` raises)."""
        try:
            hash(key)
        except TypeError:  # an unhashable option: the call checks it
            key = None
        if key is not None:
            with self.lock:
                entry = self.entries.get(key)
                if entry is not None:
                    self.entries.move_to_end(key)
                    self.hits += 1
                    return entry
        entry = build()  # outside the lock: it may compile, and raises for a bad call
        with self.lock:
            self.misses += 1
            if key is not None:
                self.entries[key] = entry
                while len(self.entries) > self.size:
                    self.entries.popitem(last=False)
        return entry

    def get(self, key: tuple[Any, ...]) -> Any:
        """The entry stored under ``key``, or None (no lock and no reordering: one dictionary read, atomic;
        entries stored with :meth:`put` leave in the order they came)."""
        return self.entries.get(key)

    def put(self, key: tuple[Any, ...], entry: Any) -> None:
        with self.lock:
            self.entries[key] = entry
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.hits = self.misses = 0


def memo_key(arrays: tuple[Any, ...], options: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The key of a cupy call in :data:`CUPY_CALLS`, made from its arguments as given (before any check or
    normalization): :func:`array_key` of each array, each option with its type (so ``True`` and ``1``, ``0`` and
    ``0.0`` differ: each spelling is checked once, at its first call), and the current device. None when an array
    is not an array or an option is unhashable."""
    try:
        key = (*map(array_key, arrays), *((type(o), o) for o in options), device_id())
        hash(key)
    except (AttributeError, TypeError):
        return None
    return key


CACHE = DispatchCache()
TORCH_CALLS = DispatchCache()  # iokernels.torch: a torch call's signature -> the Dispatch its first call used
CUPY_CALLS = DispatchCache()  # memo_key of a cupy call with no mask, dropout or graph -> its Dispatch with .fast
ROUTED_CALLS = DispatchCache()  # call_key of a cupy call with an explicit mask on the tma kernels -> its fast Dispatch


def clear_dispatch_cache() -> None:
    """Forget every call signature's plans (the next call of each plans again)."""
    CACHE.clear()
    TORCH_CALLS.clear()
    CUPY_CALLS.clear()
    ROUTED_CALLS.clear()


def check_scale(scale: Any) -> float | None:
    """The softmax scale as a float (None: 1/sqrt(d)): a finite real number > 0. The kernels mask a score (−inf)
    before they scale it, so a scale of 0 or less would turn masked scores into NaN or +inf."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise TypeError(f"scale must be a finite real number or None (1/sqrt(d)), got {scale!r}")
    if scale <= 0:
        raise ValueError(f"scale must be > 0 (the kernels mask scores before scaling them), got {scale!r}")
    return float(scale)
