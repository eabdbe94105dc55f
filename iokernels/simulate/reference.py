"""Naive float64 attention on the CPU: the reference every other result is checked against.

``causal``: False, True (bottom-right alignment, the default), "bottom_right" or "top_left"; key j
is visible to query i iff j <= i + offset (offset N_k - N_q bottom-right, 0 top-left; see
:mod:`iokernels.plan`). ``mask``: an explicit mask broadcastable to (..., N_q, N_k), boolean (True:
visible; a block-sparse plan's :meth:`iokernels.plan.masks.BlockMask.element_mask`) or float (added to
the scaled scores; −inf hides). A query that sees no key outputs 0 with logsumexp −inf and zero
gradients. ``dropout``: Z, the dropout multipliers broadcastable to (..., N_q, N_k) (0 dropped,
1/(1 − p) kept; :meth:`iokernels.plan.dropout.Dropout.full_multiplier`): O = (Z ∘ P) V, the logsumexp
that of the undropped P, and the gradients of that O.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..plan import causal_offset, normalize_causal


def default_scale(d: int) -> float:
    """The softmax scale used when none is given: 1/sqrt(d). Decided here and nowhere else."""
    return 1.0 / math.sqrt(d)


def _check(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"expected arrays of shape (..., N, d) of equal rank, got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[:-2] != k.shape[:-2] or k.shape != v.shape or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"shape mismatch: q {q.shape}, k {k.shape}, v {v.shape}")


def causal_mask(n_q: int, n_k: int, causal: bool | str = True) -> np.ndarray | None:
    """Boolean (n_q, n_k): True where key j is visible to query i; None without a mask."""
    causal = normalize_causal(causal)
    if not causal:
        return None
    off = causal_offset(n_q, n_k, causal)
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + off


def capped(x: np.ndarray, softcap: float | None) -> np.ndarray:
    """Logits x through the softcap c: c · tanh(x / c) (Gemma 2's attention softcapping); x itself without one."""
    return x if softcap is None else softcap * np.tanh(x / softcap)


def alibi_bias(slopes: np.ndarray, n_q: int, n_k: int, rows: np.ndarray | None = None,
               cols: np.ndarray | None = None) -> np.ndarray:
    """ALiBi's bias −slope · |j − i − (N_k − N_q)| (FlashAttention-2's, the bottom-right offset) for slopes (BH,):
    (BH, len rows, len cols) float64 for queries ``rows`` and keys ``cols`` (default all: (BH, N_q, N_k))."""
    i = np.arange(n_q) if rows is None else np.asarray(rows)
    j = np.arange(n_k) if cols is None else np.asarray(cols)
    rel = np.abs(j[None, :] - i[:, None] - (n_k - n_q))
    return -np.asarray(slopes, dtype=np.float64)[:, None, None] * rel


def _scores(q: np.ndarray, k: np.ndarray, scale: float, causal: bool | str, mask: np.ndarray | None,
            softcap: float | None = None, alibi: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """scale * Q K^T (through the softcap, plus ALiBi's bias for slopes ``alibi`` (BH,) of q's flattened leading
    dims, then plus an additive mask) and the boolean visibility (None: all visible)."""
    s = capped(scale * (q @ np.swapaxes(k, -1, -2)), softcap)
    if alibi is not None:
        s = s + alibi_bias(alibi, s.shape[-2], s.shape[-1]).reshape(s.shape)
    visible = causal_mask(q.shape[-2], k.shape[-2], causal)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == np.bool_:
            visible = mask if visible is None else visible & mask
        else:
            s = s + mask.astype(np.float64)
            finite = ~np.isneginf(np.broadcast_to(mask, s.shape))
            visible = finite if visible is None else visible & finite
    return s, visible


def _probabilities(s: np.ndarray, visible: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """softmax over the last axis of s restricted to ``visible`` (rows with none: 0), and the row
    logsumexp (−inf for those rows)."""
    if visible is not None:
        s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)  # a row with no visible key: exp(-inf) = 0, l = 0
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        probs = np.where(l > 0, p / np.where(l > 0, l, 1.0), 0.0)
        lse = np.where(l > 0, m_safe + np.log(np.where(l > 0, l, 1.0)), -np.inf)
    return probs, lse[..., 0]


def probabilities(q: np.ndarray, k: np.ndarray, scale: float | None = None, causal: bool | str = False,
                  mask: np.ndarray | None = None, softcap: float | None = None,
                  alibi: np.ndarray | None = None) -> np.ndarray:
    """P = softmax(scale * Q K^T) in float64 (through the softcap), 0 where masked (and on rows with no visible
    key)."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    return _probabilities(*_scores(np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64), scale,
                                   causal, mask, softcap, alibi))[0]


# a programmable variant (iokernels.plan.mods.apply_mods on every element): logits -> (logits through the variant,
# −inf where hidden; d score_mod / d score)
Mods = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def _modded(s: np.ndarray, visible: np.ndarray | None, mods: Mods | None
            ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | float]:
    if mods is None:
        return s, visible, 1.0
    s, grad = mods(s)
    shown = ~np.isneginf(s)
    return s, shown if visible is None else visible & shown, grad


def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float | None = None,
            causal: bool | str = False, mask: np.ndarray | None = None, dropout: np.ndarray | None = None,
            softcap: float | None = None, alibi: np.ndarray | None = None, mods: Mods | None = None
            ) -> tuple[np.ndarray, np.ndarray]:
    """O = softmax(scale * Q K^T) V and the row logsumexp, for shapes (..., N, d), in float64
    (``causal``: see the module docstring; ``softcap`` c: the logits c · tanh(scale * Q K^T / c); ``alibi``: one slope
    per batch·head, :func:`alibi_bias`; ``mods``: a programmable variant on the logits, :data:`Mods`)."""
    _check(q, k, v)
    scale = default_scale(q.shape[-1]) if scale is None else scale
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s, visible, _ = _modded(*_scores(q, k, scale, causal, mask, softcap, alibi), mods)
    if visible is None:
        m = s.max(axis=-1, keepdims=True)
        p = np.exp(s - m)
        l = p.sum(axis=-1, keepdims=True)
        p, lse = p / l, (m + np.log(l))[..., 0]
    else:
        p, lse = _probabilities(s, visible)
    if dropout is not None:
        p = p * np.asarray(dropout, dtype=np.float64)
    return p @ v, lse


def backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, scale: float | None = None,
             causal: bool | str = False, mask: np.ndarray | None = None, dropout: np.ndarray | None = None,
             softcap: float | None = None, alibi: np.ndarray | None = None, mods: Mods | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) of O = softmax(scale * Q K^T) V given dO, in float64 (``causal``: see the
    module docstring; ``softcap`` as :func:`forward`'s, its derivative 1 − tanh² on dS; ``alibi`` as forward's, a
    constant bias with no derivative; ``mods`` as forward's, dS times its derivative)."""
    _check(q, k, v)
    scale = default_scale(q.shape[-1]) if scale is None else scale
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    s, visible, grad = _modded(*_scores(q, k, scale, causal, mask, softcap, alibi), mods)
    if visible is None:
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
    else:
        p = _probabilities(s, visible)[0]
    z = 1.0 if dropout is None else np.asarray(dropout, dtype=np.float64)
    dv = np.swapaxes(p * z, -1, -2) @ do
    dp = z * (do @ np.swapaxes(v, -1, -2))  # the gradient of the undropped P
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))  # rowsum(P ∘ dP) = rowsum(dO ∘ O)
    if softcap is not None:  # d(c tanh(x / c)) / dx = 1 − tanh²(x / c)
        ds = ds * (1.0 - np.tanh(scale * (q @ np.swapaxes(k, -1, -2)) / softcap) ** 2)
    ds = ds * grad
    return scale * (ds @ k), scale * (np.swapaxes(ds, -1, -2) @ q), dv
