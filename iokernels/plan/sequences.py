"""A variable-length batch's sequences (iokernels.plan.varlen): the packed rows and, where known, each sequence's
lengths; the data a :class:`iokernels.plan.core.Plan` carries (``Plan.varlen``), apart from the plans themselves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Varlen:
    """A variable-length batch: the packed rows ``total_q`` and ``total_k``, where known each sequence's ``lengths_q``
    and ``lengths_k`` (None: a launch plan), and the layout of its tensors."""

    total_q: int
    total_k: int
    lengths_q: tuple[int, ...] | None = None
    lengths_k: tuple[int, ...] | None = None
    # the tensors' layout: (total, heads, d) packed, or with ``head_major`` (heads, total, d), the dense layout (a
    # sequence per document: document masking); the kernels' VARLEN_HEAD_MAJOR, the same bytes
    head_major: bool = False

    @property
    def known(self) -> bool:
        return self.lengths_q is not None

    def sequences(self) -> list[tuple[int, int, int, int]]:
        """(offset_q, length_q, offset_k, length_k) of each sequence (the lengths must be known)."""
        if not self.known:
            raise ValueError("a variable-length launch plan: the sequences' lengths are not known (no exact bytes)")
        out, oq, ok = [], 0, 0
        for lq, lk in zip(self.lengths_q, self.lengths_k, strict=True):
            out.append((oq, lq, ok, lk))
            oq, ok = oq + lq, ok + lk
        return out

    def cu_seqlens(self) -> tuple[np.ndarray, np.ndarray]:
        """``cu_seqlens_q`` and ``cu_seqlens_k`` as int32 arrays of B + 1 offsets."""
        if not self.known:
            raise ValueError("a variable-length launch plan: the sequences' lengths are not known")
        return offsets(self.lengths_q), offsets(self.lengths_k)


def offsets(lengths: Sequence[int]) -> np.ndarray:
    """Cumulative offsets of packed lengths: (len + 1,) int32 from 0 (``cu_seqlens``)."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def check_lengths(name: str, values: Sequence[int] | np.ndarray) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{name} must be a sequence of ints >= 0, got {values!r}")
    raw = np.asarray(values).reshape(-1)
    out = tuple(int(x) for x in raw)
    if not out or any(x < 0 for x in out) or any(float(x) != float(y) for x, y in zip(out, raw, strict=True)):
        raise ValueError(f"{name} must be a non-empty sequence of ints >= 0, got {values!r}")
    return out


def lengths_from_cu(cu_seqlens: Sequence[int] | np.ndarray, name: str = "cu_seqlens") -> tuple[int, ...]:
    """The lengths of cumulative offsets ``cu_seqlens`` (B + 1 non-decreasing ints from 0)."""
    cu = np.asarray(cu_seqlens).reshape(-1)
    if cu.size < 2 or cu[0] != 0 or np.any(np.diff(cu) < 0):
        raise ValueError(f"{name} must be B + 1 >= 2 non-decreasing offsets starting at 0, got {cu_seqlens!r}")
    return tuple(int(x) for x in np.diff(cu))
