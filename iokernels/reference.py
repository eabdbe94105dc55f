"""Naive float64 attention on the CPU: the reference every other result is checked against."""

from __future__ import annotations

import math

import numpy as np


def default_scale(d: int) -> float:
    """The softmax scale used when none is given: 1/sqrt(d). Decided here and nowhere else."""
    return 1.0 / math.sqrt(d)


def _check(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"expected arrays of shape (..., N, d) of equal rank, got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[:-2] != k.shape[:-2] or k.shape != v.shape or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"shape mismatch: q {q.shape}, k {k.shape}, v {v.shape}")


def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float | None = None
            ) -> tuple[np.ndarray, np.ndarray]:
    """O = softmax(scale * Q K^T) V and the row logsumexp, for shapes (..., N, d), in float64."""
    _check(q, k, v)
    scale = default_scale(q.shape[-1]) if scale is None else scale
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = scale * (q @ np.swapaxes(k, -1, -2))
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    return (p / l) @ v, (m + np.log(l))[..., 0]


def backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, scale: float | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) of O = softmax(scale * Q K^T) V given dO, in float64."""
    _check(q, k, v)
    scale = default_scale(q.shape[-1]) if scale is None else scale
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    s = scale * (q @ np.swapaxes(k, -1, -2))
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    return scale * (ds @ k), scale * (np.swapaxes(ds, -1, -2) @ q), dv
