"""The simulator's global memory (:class:`Hbm`: named float64 arrays, every load and store counted by DESIGN.md's
rules) and the tile helpers the schedules share (:mod:`.simulator`, :mod:`.decode`): row blocks, the last two axes
swapped, the online softmax's safe rescaling."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..plan import Plan

ALL = slice(None)


# tensors with one row per K/V head (batch * kv_heads rows; batch * heads without grouped-query attention)
KV_TENSORS = ("K", "V", "dK", "dV")


class Hbm:
    """Global memory of one simulated run: named float64 arrays and per-stage byte counters."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.arrays: dict[str, np.ndarray] = {}
        self.counts: dict[str, dict[str, list[int]]] = {}
        self._stage: dict[str, list[int]] | None = None
        self.captures: dict[str, np.ndarray] = {}  # a programmable variant's captured arrays, as given

    def put(self, name: str, array: np.ndarray) -> None:
        """Place an input in HBM (the upload is not a kernel access, so it is not counted)."""
        self.arrays[name] = np.array(array, dtype=np.float64)

    def alloc(self, name: str, shape: tuple[int, ...]) -> None:
        """Allocate an output poisoned with NaN, so an element no stage writes shows up."""
        self.arrays[name] = np.full(shape, np.nan)

    def begin(self, stage: str) -> None:
        self._stage = self.counts.setdefault(stage, defaultdict(lambda: [0, 0]))

    def _count(self, name: str, elements: int, read: int, write: int) -> None:
        size = elements * self.plan.tensor_itemsize(name)
        self._stage[name][0] += read * size
        self._stage[name][1] += write * size

    def read_bytes(self, name: str, n: int) -> None:
        """Count n bytes read of ``name`` (a programmable variant's captured arrays, read element by element)."""
        if n:
            self._stage[name][0] += n

    def load(self, name: str, index: tuple) -> np.ndarray:
        tile = np.array(self.arrays[name][index])
        self._count(name, tile.size, 1, 0)
        return tile

    def store(self, name: str, index: tuple, value: np.ndarray) -> None:
        target = self.arrays[name][index]
        target[...] = value
        self._count(name, target.size, 0, 1)

    def atomic_add(self, name: str, index: tuple, value: np.ndarray) -> None:
        target = self.arrays[name][index]
        target += value
        self._count(name, target.size, 1, 1)


def blocks(n: int, b: int) -> list[slice]:
    return [slice(i, min(i + b, n)) for i in range(0, n, b)]


def transpose(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


def finite(m: np.ndarray) -> np.ndarray:
    """m with −inf (a row that has seen no visible key yet) as 0, so exp(s − m) is 0, never NaN."""
    return np.where(np.isneginf(m), 0.0, m)


def rescale(m_old: np.ndarray, m_new: np.ndarray) -> np.ndarray:
    """e^{m_old − m_new}, 0 where m_old is −inf (nothing to rescale)."""
    return np.where(np.isneginf(m_old), 0.0, np.exp(finite(m_old) - finite(m_new)))


def divide(x: np.ndarray, l: np.ndarray) -> np.ndarray:
    """x / l per row, 0 on rows with l = 0 (no visible key); NaN stays NaN, as in the kernels."""
    return np.where(l[..., None] == 0, 0.0, x / np.where(l == 0, 1.0, l)[..., None])
