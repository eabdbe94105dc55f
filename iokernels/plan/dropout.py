"""Dropout on P (the paper's P^dropped): a counter-based Philox RNG shared by kernels and simulator.

Every element of P has its own random number, a pure function of (seed, offset, batch·head, row,
column), so any kernel can regenerate the mask of any element without storing it: the forward
returns the seed and offset it used, and the backward regenerates the identical mask from them.
Standard attention draws from the same stream, so standard and flash attention agree element for
element for one seed (to rounding).

The stream (``philox4x32_10`` is Random123's Philox4x32 with 10 rounds, checked against its
known-answer vectors in the tests) draws one byte per element, 16 elements per Philox call (as
FlashAttention does: the Philox rounds, not the matrix products, bounded the kernels with a word per
element):

* key = (seed mod 2³², seed div 2³²), a 64-bit seed;
* counter = (column div 16, row, batch·head, offset), a 32-bit offset;
* element (bh, i, j) takes byte j mod 4 (the low byte first) of word (j mod 16) div 4 of
  ``philox4x32_10(counter, key)``, r, in 0..255;
* it is **kept** iff r >= t, t = round(p · 256) (halves up) (:attr:`Dropout.threshold`), so P(keep) = 1 − t/256
  (:attr:`Dropout.keep_probability`): p takes effect rounded to a multiple of 1/256 (0.1 as 26/256 =
  0.1016), and a p that would round to 0 or to 1 is refused; a kept element is multiplied by
  256/(256 − t) rounded to float32 (:attr:`Dropout.keep_scale`, one over the exact keep probability, so
  E[Z] = 1), a dropped one by 0.

What dropout does to the algorithms (as in the paper's Algorithm 2 and 4): the softmax statistics
(m, l, lse) are those of the undropped P; O = (Z ∘ P) V with Z the mask times 1/(1 − p); in the
backward dV = (Z ∘ P)ᵀ dO, dP = Z ∘ (dO Vᵀ), dS = P ∘ (dP − D) with D = rowsum(dO ∘ O). The mask is
never stored, in any algorithm: dropout moves no HBM bytes (the seed, offset, threshold and scale
are kernel arguments), so the IO model of every plan is that of the plan without dropout.

Kernels take it as the compile-time define ``DROPOUT`` (a stage parameter: :func:`iokernels.plan.
with_dropout`) and four arguments after the masks: the threshold (uint32), the keep scale (float32),
the seed (uint64) and the offset (uint32) (``common.cuh``: ``IOK_DROPOUT_PARAM``, ``iok_dropout``).
"""

from __future__ import annotations

import math
import numbers
import secrets
import threading
from dataclasses import dataclass

import numpy as np

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUNDS = 10
_U32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(counter: tuple, key: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Philox4x32-10 (Random123) on arrays: ``counter`` four uint32-valued arrays (or ints), ``key`` two;
    returns the four output words as uint32 arrays (broadcast shape of the inputs)."""
    c = [np.asarray(x, dtype=np.uint64) & _U32 for x in counter]
    k0, k1 = (np.asarray(x, dtype=np.uint64) & _U32 for x in key)
    m0, m1 = np.uint64(PHILOX_M0), np.uint64(PHILOX_M1)
    w0, w1 = np.uint64(PHILOX_W0), np.uint64(PHILOX_W1)
    for r in range(PHILOX_ROUNDS):
        if r:
            k0, k1 = (k0 + w0) & _U32, (k1 + w1) & _U32
        p0, p1 = m0 * c[0], m1 * c[2]  # 32 x 32 -> 64 bits: exact in uint64
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _U32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _U32]
    return tuple(x.astype(np.uint32) for x in c)  # type: ignore[return-value]


def check_p(p: object) -> float:
    """The dropout probability as a float in [0, 1); ValueError/TypeError otherwise."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"dropout probability must be a real number in [0, 1), got {p!r}")
    p = float(p)
    if not (0.0 <= p < 1.0) or math.isnan(p):
        raise ValueError(f"dropout probability must be in [0, 1), got {p!r}")
    return p


def _threshold(p: float) -> int:
    """round(p · 256) (halves up): ValueError where that leaves no dropout for p > 0 or drops everything."""
    t = math.floor(p * 256 + 0.5)
    if p > 0 and not 1 <= t <= 255:
        raise ValueError(f"dropout probability {p!r} is outside what 8-bit draws resolve: p is rounded to a multiple "
                         "of 1/256, so it must be 0 or in [1/512, 255/256 + 1/512)")
    return t


def _check_word(name: str, value: object, bits: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < 2**bits:
        raise ValueError(f"dropout {name} must be an integer in [0, 2**{bits}), got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Dropout:
    """Dropout with probability ``p`` from the Philox stream of ``seed`` (64 bits) at ``offset``
    (32 bits); see the module docstring. What a forward returns and its backward takes."""

    p: float
    seed: int
    offset: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_p(self.p))
        _threshold(self.p)  # p within the draws' resolution
        object.__setattr__(self, "seed", _check_word("seed", self.seed, 64))
        object.__setattr__(self, "offset", _check_word("offset", self.offset, 32))

    @property
    def threshold(self) -> int:
        """t: an element is kept iff its random byte is >= t (round(p · 256), 0..255)."""
        return _threshold(self.p)

    @property
    def keep_scale(self) -> float:
        """What a kept element of P is multiplied by: 1 / keep_probability rounded to float32, as the kernels use
        it."""
        return float(np.float32(256.0 / (256 - self.threshold)))

    @property
    def keep_probability(self) -> float:
        """The exact probability that an element is kept: 1 − t/256."""
        return 1.0 - self.threshold / 256

    def kernel_args(self) -> tuple[np.uint32, np.float32, np.uint64, np.uint32]:
        """The four kernel arguments of a DROPOUT stage, in order (common.cuh IOK_DROPOUT_PARAM)."""
        return (np.uint32(self.threshold), np.float32(self.keep_scale), np.uint64(self.seed),
                np.uint32(self.offset))

    def random_bytes(self, bh: np.ndarray | int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """The random byte (0..255, uint32) of elements (bh, rows, cols) (broadcast)."""
        bh, rows, cols = np.broadcast_arrays(np.asarray(bh, dtype=np.int64), np.asarray(rows, dtype=np.int64),
                                             np.asarray(cols, dtype=np.int64))
        words = philox4x32_10((cols >> 4, rows, bh, self.offset), (self.seed & 0xFFFFFFFF, self.seed >> 32))
        word = np.choose((cols >> 2) & 3, words)
        return (word >> ((cols & 3) * 8).astype(np.uint32)) & np.uint32(0xFF)

    def keep(self, bh: np.ndarray | int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Boolean keep mask of elements (bh, rows, cols) (broadcast)."""
        return self.random_bytes(bh, rows, cols) >= np.uint32(self.threshold)

    def multiplier(self, bh: np.ndarray | int | slice, rows: slice | np.ndarray, cols: slice | np.ndarray,
                   shape: tuple[int, int, int] | None = None) -> np.ndarray:
        """Z (float64): keep_scale where kept, 0 where dropped, for the block (bh, rows, cols) of a problem
        of ``shape`` (batch·heads, N_q, N_k) (needed for slices); shape (len bh, len rows, len cols)."""
        def idx(s: slice | np.ndarray | int, n: int | None) -> np.ndarray:
            if isinstance(s, slice):
                assert n is not None, "slices need the problem's shape"
                return np.arange(n)[s]
            return np.atleast_1d(np.asarray(s))

        nb, nq, nk = shape if shape is not None else (None, None, None)
        b, r, c = idx(bh, nb), idx(rows, nq), idx(cols, nk)
        kept = self.keep(b[:, None, None], r[None, :, None], c[None, None, :])
        return np.where(kept, self.keep_scale, 0.0)

    def full_multiplier(self, bh: int, n_q: int, n_k: int) -> np.ndarray:
        """Z of a whole problem: (bh, n_q, n_k) float64."""
        return self.multiplier(slice(None), slice(None), slice(None), (bh, n_q, n_k))

    def as_dict(self) -> dict:
        return {"p": self.p, "seed": self.seed, "offset": self.offset}


# ---------------------------------------------------------------------------------------------
# the library's generator: a seed per process (or set by the user) and an offset per call

_LOCK = threading.Lock()
_STATE = {"seed": None, "offset": 0}


def manual_seed(seed: int) -> None:
    """Seed the library's dropout stream (each later call takes the next offset, from 0)."""
    seed = _check_word("seed", seed, 64)
    with _LOCK:
        _STATE["seed"], _STATE["offset"] = seed, 0


def next_dropout(p: float, seed: int | None = None, offset: int | None = None) -> Dropout:
    """The Dropout of one call: ``seed``/``offset`` as given, else the library's seed (random per process
    unless :func:`manual_seed` set it) and its next offset."""
    with _LOCK:
        if seed is None:
            if _STATE["seed"] is None:
                _STATE["seed"] = secrets.randbits(64)
            seed = _STATE["seed"]
        if offset is None:
            offset = _STATE["offset"]
            _STATE["offset"] = (_STATE["offset"] + 1) % 2**32
    return Dropout(p, seed, offset)
