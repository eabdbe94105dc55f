"""The device memory a library call needs: its figure, the check every call makes against the free memory
before it launches anything, and the error it raises (:class:`DeviceMemoryError`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..kernels import launch
from ..plan import Plan
from ..plan.tensors import APPEND_TENSORS, CACHE_TENSORS, VARLEN_TENSORS

GB = 1024**3  # binary, as everywhere in iokernels


class DeviceMemoryError(MemoryError):
    """A call would need more device memory than the device has free; raised before any launch, with
    the message "<plan> needs X GB, device has Y GB free of Z GB" and the byte counts as ``needed``,
    ``free`` (the device's free memory plus what cupy's pool holds unused) and ``total``."""

    def __init__(self, what: str, needed: int, free: int, total: int, hint: str = "") -> None:
        self.needed, self.free, self.total = needed, free, total
        super().__init__(f"{what} needs {needed / GB:.2f} GB, device has {free / GB:.2f} GB free "
                         f"of {total / GB:.2f} GB{hint}")


def needed_bytes(chain: list[Plan], expand: bool, group: int) -> int:
    """Device bytes the plans allocate beyond the inputs they are given (a plan's buffers are released
    before the next plan's, but for those it passes on), plus the expanded K, V (and the dK, dV
    sums) of grouped-query attention run on expanded heads."""
    # a decode's lengths, page table and new keys, a variable-length batch's offsets: inputs too
    given = set(CACHE_TENSORS) | set(APPEND_TENSORS) | set(VARLEN_TENSORS)
    peak = max(launch.plan_device_bytes(plan, (set(launch.INPUTS[plan.direction]) - {"P"}) | given) for plan in chain)
    if expand:
        last = chain[-1]
        elements = math.prod(launch.tensor_shape(last, "K"))  # of one expanded K (or V)
        peak += 2 * elements * last.itemsize
        if last.direction == "bwd":  # dK, dV summed over each group: float32 sums, then rounded
            peak += 2 * (elements // group) * (4 + last.itemsize)
    return peak


def memory_error(chain: Sequence[Plan], needed: int, lead: tuple[int, ...], free: int | None = None
                 ) -> DeviceMemoryError:
    """The error of a call whose ``needed`` bytes do not fit (``free``: the device's free bytes, read when None)."""
    free_now, total = launch.free_device_bytes()
    free = free_now if free is None else free
    plan = chain[-1]
    hint = "" if all(p.algorithm == "flash" for p in chain) else \
        "; standard and two_pass store N_q x N_k scores per head: algorithm='flash' needs O(N) memory"
    return DeviceMemoryError(f"{plan.label} at N_q={plan.N_q}, N_k={plan.N_k}, d={plan.d}, {plan.dtype}, "
                             f"batch/heads {lead}", needed, free, total, hint)


def require_memory(chain: Sequence[Plan], needed: int, lead: tuple[int, ...]) -> None:
    free, _ = launch.free_device_bytes()
    if needed > free:
        raise memory_error(chain, needed, lead, free)


def copied_bytes(arrays: list[Any]) -> int:
    """Bytes of the device copies the call makes of numpy or non-contiguous inputs."""
    return sum(x.nbytes for x in arrays if type(x).__module__.split(".")[0] == "numpy" or not x.flags.c_contiguous)
