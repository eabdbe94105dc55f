"""Same-precision naive attention on the host: the yardstick of flash-attention's tolerance idiom."""

import numpy as np

from iokernels.plan.units import round_to
from iokernels.simulate import reference


def naive_forward(q, k, v, dtype, scale=None):
    """Standard attention storing S, P and O in ``dtype`` (accumulating in higher precision)."""
    scale = reference.default_scale(q.shape[-1]) if scale is None else scale
    s = round_to(scale * (q @ np.swapaxes(k, -1, -2)), dtype)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = round_to(p / p.sum(axis=-1, keepdims=True), dtype)
    return round_to(p @ v, dtype)


def naive_backward(q, k, v, do, dtype, scale=None):
    scale = reference.default_scale(q.shape[-1]) if scale is None else scale
    s = round_to(scale * (q @ np.swapaxes(k, -1, -2)), dtype)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = round_to(p / p.sum(axis=-1, keepdims=True), dtype)
    dv = round_to(np.swapaxes(p, -1, -2) @ do, dtype)
    dp = round_to(do @ np.swapaxes(v, -1, -2), dtype)
    ds = round_to(p * (dp - (p * dp).sum(axis=-1, keepdims=True)), dtype)
    return round_to(scale * (ds @ k), dtype), round_to(scale * (np.swapaxes(ds, -1, -2) @ q), dtype), dv


def rel_err(got, want, scale=None):
    """max |got - want| over the output's scale (default max |want|; a degenerate output such as
    dQ with a single key, exactly 0 in theory, is measured against its siblings' scale instead)."""
    scale = float(np.max(np.abs(want))) if scale is None else scale
    return float(np.max(np.abs(got - want)) / max(scale, 1e-30))


def problem_scale(wants):
    return max(float(np.max(np.abs(w))) for w in wants.values())


def ulp(dtype: str) -> float:
    """One unit in the last place of ``dtype``, relative: the largest it is for a value of that type."""
    return {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype]
