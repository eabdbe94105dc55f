"""Block-sparse masks (the FlashAttention paper's Algorithm 5): which blocks of S are computed.

A :class:`BlockMask` is a boolean matrix of blocks of ``block_q`` queries by ``block_k`` keys: key j is
visible to query i iff ``blocks[i // block_q, j // block_k]`` (and the causal mask, when there is one).
It is the same for every batch and head. A plan that takes a block mask (``make_plan(block_mask=)``)
uses tiles that divide ``(block_q, block_k)``, so each of its (query block, key block) pairs lies in one
mask block: its kernels skip the pairs whose mask block is zero and compute the others in full, and
the result does not depend on the plan. The kernels read the mask refined to the plan's tiles
(:meth:`BlockMask.refine`, T_r x T_c bytes), one byte per pair they visit.

Patterns (:func:`pattern`, ``--block-sparse DENSITY --block-pattern``) on the mask's block grid:

* ``local``: a sliding window of round(density * key blocks) key blocks around each query block's
  diagonal position (clamped at the edges, so every row has the same number);
* ``strided``: every round(1 / density)-th key block, counted from the query block's diagonal position;
* ``random``: round(density * blocks) blocks chosen uniformly with ``seed`` (rows may be empty: their
  output is 0 and their logsumexp −inf, as with causal rows that see no key).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .units import cdiv

PATTERNS = ("local", "strided", "random")
DEFAULT_BLOCK = 128  # the mask's block size (queries and keys) when none is given


def _check_positive(name: str, value: object) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class BlockMask:
    """A boolean (ceil(n_q / block_q), ceil(n_k / block_k)) matrix of blocks (module docstring).

    Frozen and hashable (the blocks are kept as bytes), so plans can carry it."""

    n_q: int
    n_k: int
    block_q: int
    block_k: int
    bits: bytes  # row-major, one byte per block: 0 hidden, 1 kept, 2 kept and full (a mask_mod's, from_levels)
    label: str = ""  # how it was made, for reports: "random(density=0.25, seed=0)", "array"

    def __post_init__(self) -> None:
        for name in ("n_q", "n_k", "block_q", "block_k"):
            object.__setattr__(self, name, _check_positive(name, getattr(self, name)))
        want = self.shape[0] * self.shape[1]
        if len(self.bits) != want or any(b > 2 for b in self.bits):
            raise ValueError(f"BlockMask.bits must hold {want} bytes of 0, 1 or 2, got {len(self.bits)}")

    @classmethod
    def from_array(cls, blocks: object, *, n_q: int, n_k: int, block_q: int, block_k: int,
                   label: str = "array") -> BlockMask:
        """A block mask from a boolean array of shape (ceil(n_q / block_q), ceil(n_k / block_k))."""
        a = np.asarray(blocks)
        if a.dtype != np.bool_:
            raise TypeError(f"a block mask is a boolean array, got dtype {a.dtype}")
        for name, value in (("n_q", n_q), ("n_k", n_k), ("block_q", block_q), ("block_k", block_k)):
            _check_positive(name, value)
        want = (cdiv(n_q, block_q), cdiv(n_k, block_k))
        if a.shape != want:
            raise ValueError(f"block mask of shape {a.shape} does not match N_q={n_q}, N_k={n_k} in blocks of "
                             f"{block_q}x{block_k}: expected {want}")
        return cls(n_q, n_k, block_q, block_k, a.astype(np.uint8).tobytes(), label)

    @classmethod
    def from_levels(cls, levels: object, *, n_q: int, n_k: int, block_q: int, block_k: int,
                    label: str = "levels") -> BlockMask:
        """A block mask whose blocks are 0 (hidden), 1 (kept: a mask_mod evaluated in it) or 2 (kept, every element
        visible: mask_mod skipped); iokernels.plan.mods.mod_block_mask makes one."""
        a = np.asarray(levels)
        if a.dtype != np.uint8 or np.any(a > 2):
            raise TypeError(f"block levels are uint8 values 0, 1 or 2, got dtype {a.dtype}")
        cls.from_array(a != 0, n_q=n_q, n_k=n_k, block_q=block_q, block_k=block_k, label=label)
        return cls(n_q, n_k, block_q, block_k, a.tobytes(), label)

    @property
    def levels(self) -> np.ndarray:
        """The block matrix as its bytes: 0 hidden, 1 kept, 2 kept and full."""
        return np.frombuffer(self.bits, dtype=np.uint8).reshape(self.shape)

    @classmethod
    def from_elements(cls, mask: object, *, block_q: int, block_k: int) -> BlockMask:
        """An element mask (n_q, n_k) reduced to blocks: a block is visible iff any of its elements is."""
        a = np.asarray(mask)
        if a.dtype != np.bool_ or a.ndim != 2:
            raise TypeError(f"an element mask is a 2-d boolean array, got {a.dtype} of shape {a.shape}")
        n_q, n_k = a.shape
        rows, cols = cdiv(n_q, _check_positive("block_q", block_q)), cdiv(n_k, _check_positive("block_k", block_k))
        padded = np.zeros((rows * block_q, cols * block_k), bool)
        padded[:n_q, :n_k] = a
        blocks = padded.reshape(rows, block_q, cols, block_k).any(axis=(1, 3))
        return cls.from_array(blocks, n_q=n_q, n_k=n_k, block_q=block_q, block_k=block_k, label="elements")

    @property
    def shape(self) -> tuple[int, int]:
        return cdiv(self.n_q, self.block_q), cdiv(self.n_k, self.block_k)

    @property
    def blocks(self) -> np.ndarray:
        """The boolean block matrix."""
        return np.frombuffer(self.bits, dtype=np.uint8).reshape(self.shape).astype(bool)

    @property
    def density(self) -> float:
        """The fraction of nonzero blocks (the paper's s)."""
        return float(np.mean(self.blocks))

    def element_mask(self) -> np.ndarray:
        """Boolean (n_q, n_k): True where key j is visible to query i."""
        rows = np.arange(self.n_q) // self.block_q
        cols = np.arange(self.n_k) // self.block_k
        return self.blocks[rows[:, None], cols[None, :]]

    def refine(self, br: int, bc: int) -> np.ndarray:
        """The mask on a plan's tile grid (ceil(n_q / br), ceil(n_k / bc)); br, bc divide the block sizes."""
        if self.block_q % br or self.block_k % bc:
            raise ValueError(f"tiles {br}x{bc} do not divide the block mask's blocks {self.block_q}x{self.block_k}")
        rows = np.arange(cdiv(self.n_q, br)) * br // self.block_q
        cols = np.arange(cdiv(self.n_k, bc)) * bc // self.block_k
        return self.levels[rows[:, None], cols[None, :]]

    def describe(self) -> str:
        return (f"{self.label or 'block mask'}: {self.shape[0]}x{self.shape[1]} blocks of "
                f"{self.block_q}x{self.block_k}, density {self.density:.3f}")

    def as_dict(self) -> dict:
        return {"label": self.label, "block_q": self.block_q, "block_k": self.block_k,
                "blocks": list(self.shape), "density": self.density}


def check_density(density: object) -> float:
    if isinstance(density, bool) or not isinstance(density, (int, float, np.floating)) \
            or not 0.0 < float(density) <= 1.0:
        raise ValueError(f"block-sparse density must be in (0, 1], got {density!r}")
    return float(density)


def pattern(kind: str, density: float, *, n_q: int, n_k: int, block_q: int = DEFAULT_BLOCK,
            block_k: int | None = None, seed: int = 0) -> BlockMask:
    """A block mask of the named pattern (module docstring) with about ``density`` nonzero blocks."""
    if kind not in PATTERNS:
        raise ValueError(f"unknown block pattern {kind!r}: expected one of {', '.join(PATTERNS)}")
    density = check_density(density)
    block_k = block_q if block_k is None else block_k
    rows, cols = cdiv(n_q, _check_positive("block size", block_q)), cdiv(n_k, _check_positive("block size", block_k))
    # the key block on query block a's diagonal (N_q and N_k scaled to each other)
    diag = np.minimum(cols - 1, np.floor((np.arange(rows) + 0.5) * cols / rows)).astype(int)
    b = np.arange(cols)[None, :]
    if kind == "local":
        width = max(1, min(cols, round(density * cols)))
        start = np.clip(diag - (width - 1) // 2, 0, cols - width)[:, None]
        blocks = (b >= start) & (b < start + width)
    elif kind == "strided":
        stride = max(1, round(1 / density))
        blocks = (b - diag[:, None]) % stride == 0
    else:
        count = max(1, min(rows * cols, round(density * rows * cols)))
        flat = np.zeros(rows * cols, bool)
        flat[np.random.default_rng(seed).choice(rows * cols, size=count, replace=False)] = True
        blocks = flat.reshape(rows, cols)
    label = f"{kind}(density={density:g}" + (f", seed={seed})" if kind == "random" else ")")
    return BlockMask.from_array(blocks, n_q=n_q, n_k=n_k, block_q=block_q, block_k=block_k, label=label)


# ---------------------------------------------------------------------------------------------
# explicit masks: an element mask the kernels read from HBM

MASK_KINDS = ("bool", "additive")
MASK_CODES = {"bool": 1, "additive": 2}  # the kernels' MASK define


@dataclass(frozen=True)
class ExplicitMask:
    """What an explicit mask tensor a plan reads looks like (``make_plan(mask=)``); the values are data,
    given with the inputs as the tensor ``mask``: shape (1, N_q, N_k) when ``shared`` by every batch·head
    (batch-row stride 0), else (batch·heads, N_q, N_k) (stride 1). ``kind`` "bool": uint8, nonzero where
    key j is visible to query i; "additive": float32 added to the scaled scores (−inf hides).

    Every batch·head reads the elements of the (query block, key block) pairs it computes, shared or not:
    BH × (elements of the computed pairs) × itemsize bytes."""

    kind: str = "bool"
    shared: bool = True

    def __post_init__(self) -> None:
        if self.kind not in MASK_KINDS:
            raise ValueError(f"mask kind must be one of {', '.join(MASK_KINDS)}, got {self.kind!r}")
        if not isinstance(self.shared, bool):
            raise TypeError(f"ExplicitMask.shared must be a bool, got {self.shared!r}")

    @property
    def itemsize(self) -> int:
        return 1 if self.kind == "bool" else 4

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint8 if self.kind == "bool" else np.float32)

    @property
    def code(self) -> int:
        return MASK_CODES[self.kind]

    @property
    def bh_stride(self) -> int:
        return 0 if self.shared else 1

    def shape(self, bh: int, n_q: int, n_k: int) -> tuple[int, int, int]:
        return (1 if self.shared else bh, n_q, n_k)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "shared": self.shared}


def mask_layout(dtype: Any, shape: tuple[int, ...], lead: tuple[int, ...], n_q: int, n_k: int
                ) -> tuple[ExplicitMask, tuple[int, ...]]:
    """The plan's :class:`ExplicitMask` of a mask of ``dtype`` and ``shape`` (bool or float, broadcastable to
    (*lead, n_q, n_k)) and the shape of the array the kernels read, (1 or prod(lead), n_q, n_k). Reads no
    values. TypeError for a dtype that is neither bool nor float, ValueError for a shape that does not broadcast."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        kind = "bool"
    elif dtype.kind == "f":
        kind = "additive"
    else:
        raise TypeError(f"mask must be a boolean or floating-point array, got dtype {dtype}")
    shape, want = tuple(shape), (*lead, n_q, n_k)
    if len(shape) < 2 or len(shape) > len(want):
        raise ValueError(f"mask of shape {shape} is not broadcastable to {want}")
    try:
        full = np.broadcast_shapes(shape, want)
    except ValueError:
        full = None
    if full != want:
        raise ValueError(f"mask of shape {shape} is not broadcastable to {want}")
    shared = all(x == 1 for x in shape[:-2])
    return ExplicitMask(kind, shared), (1 if shared else math.prod(lead), n_q, n_k)


def dense_mask(xp: Any, mask: Any, spec: ExplicitMask, lead: tuple[int, ...], n_q: int, n_k: int) -> Any:
    """The array the kernels read (:func:`mask_layout`'s shape, uint8 or float32, C-contiguous) of a mask
    already checked by :func:`mask_layout`, in the mask's own array module ``xp`` (numpy, or cupy on the
    device: no copy when the mask already has that layout)."""
    dense = xp.broadcast_to(mask, ((1,) * len(lead) if spec.shared else lead) + (n_q, n_k))
    dense = dense.reshape(1 if spec.shared else math.prod(lead), n_q, n_k)
    if spec.kind == "bool" and dense.dtype == np.bool_ and dense.flags.c_contiguous:
        return dense.view(np.uint8)
    return xp.ascontiguousarray(dense, dtype=spec.dtype)


def explicit_mask(mask: object, lead: tuple[int, ...], n_q: int, n_k: int) -> tuple[ExplicitMask, np.ndarray]:
    """A user's host mask (a numpy array, bool or float, broadcastable to (*lead, n_q, n_k)) as the plan's
    :class:`ExplicitMask` and the array the kernels read (:func:`dense_mask`), its values checked: an additive
    mask holding NaN or +inf is refused (ValueError), as are the dtypes and shapes :func:`mask_layout` refuses."""
    a = np.asarray(mask)
    spec, _ = mask_layout(a.dtype, a.shape, lead, n_q, n_k)
    if spec.kind == "additive" and np.any(np.isnan(a)):
        raise ValueError("an additive mask must not hold NaN")
    if spec.kind == "additive" and np.any(np.isposinf(a)):
        raise ValueError("an additive mask must not hold +inf")
    return spec, dense_mask(np, a, spec, lead, n_q, n_k)
