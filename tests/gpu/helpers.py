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


def plan_naive_p(plan, q, k, scale):
    """A fast plan's same-precision P: S rounded to the dtype, the plan's causal mask and window applied, softmax
    in float64 (rows with no visible key 0), rounded. q (BH, N_q, d); k with the plan's K/V rows per query head."""
    s = round_to(scale * (q @ np.swapaxes(k, -1, -2)), plan.dtype)
    vis = plan.visible(np.arange(plan.N_q), np.arange(plan.N_k))
    if vis is not None:
        s = np.where(vis, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    l = e.sum(axis=-1, keepdims=True)
    return round_to(np.where(l > 0, e / np.where(l > 0, l, 1.0), 0.0), plan.dtype)


def group_sum(plan, x):
    """Grouped-query attention: a K/V head's gradient (BH_kv rows) sums those of the query heads that share it."""
    return x.reshape(plan.bh_kv, plan.heads // plan.kv_heads, *x.shape[1:]).sum(axis=1)


def plan_naive_grads(plan, q, k, v, do, z=1.0):
    """A fast plan's same-precision (dQ, dK, dV), rounding as the kernels store; ``z`` the dropout multipliers."""
    scale = reference.default_scale(plan.d)
    p = plan_naive_p(plan, q, k, scale)
    dv = round_to(np.swapaxes(p * z, -1, -2) @ do, plan.dtype)
    dp = round_to(z * (do @ np.swapaxes(v, -1, -2)), plan.dtype)
    ds = round_to(p * (dp - (p * dp).sum(axis=-1, keepdims=True)), plan.dtype)
    return {"dQ": round_to(scale * (ds @ k), plan.dtype),
            "dK": group_sum(plan, round_to(scale * (np.swapaxes(ds, -1, -2) @ q), plan.dtype)),
            "dV": group_sum(plan, dv)}


def assert_within_naive(got, want, naive, slack=5e-4):
    """flash-attention's idiom: each output's error against the float64 ``want`` at most twice a same-precision
    naive computation's, plus ``slack``; every value finite."""
    err_scale = problem_scale(want)
    for name in want:
        assert np.all(np.isfinite(got[name])), name
        bound = 2 * rel_err(naive[name], want[name], err_scale) + slack
        err = rel_err(got[name], want[name], err_scale)
        assert err <= bound, (name, err, bound)
