"""Same-precision naive attention on the host: the yardstick of flash-attention's tolerance idiom."""

import numpy as np

from iokernels.plan.causal import causal_offset
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
    """A fast plan's same-precision P: S (through the plan's softcap) rounded to the dtype, plus ALiBi's bias, the
    plan's causal mask, window and block mask applied, softmax in float64 (rows with no visible key 0), rounded.
    q (BH, N_q, d); k with the plan's K/V rows per query head."""
    s = round_to(reference.capped(scale * (q @ np.swapaxes(k, -1, -2)), plan.softcap), plan.dtype)
    if plan.alibi is not None:  # (added in float32 by the kernels)
        s = s + reference.alibi_bias(plan.alibi, plan.N_q, plan.N_k).reshape(s.shape)
    vis = plan.visible(np.arange(plan.N_q), np.arange(plan.N_k))
    if plan.block_mask is not None:
        vis = plan.element_mask() if vis is None else vis & plan.element_mask()
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
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    if plan.softcap is not None:  # through the softcap: 1 − tanh²
        ds = ds * (1.0 - np.tanh(scale * (q @ np.swapaxes(k, -1, -2)) / plan.softcap) ** 2)
    ds = round_to(ds, plan.dtype)
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


def varlen_naive(plan, host, scale):
    """A variable-length plan's same-precision naive outputs, each sequence alone (S, P, O and, when ``host`` has dO,
    dP, dS and the gradients rounded to the dtype, as :func:`naive_backward`; the plan's causal mask; rows with no
    visible key 0), packed as the kernels' outputs: O (total_q, heads, d), dQ, and dK, dV (total_k, kv_heads, d) summed
    over the query heads of each K/V head. host: the packed float64 Q, K, V (and dO)."""
    v, group, dt = plan.varlen, plan.heads // plan.kv_heads, plan.dtype
    grads = "dO" in host
    out = {"O": np.zeros((v.total_q, plan.heads, plan.d))}
    if grads:
        out.update(dQ=np.zeros((v.total_q, plan.heads, plan.d)), dK=np.zeros((v.total_k, plan.kv_heads, plan.d)),
                   dV=np.zeros((v.total_k, plan.kv_heads, plan.d)))
    for oq, lq, ok, lk in v.sequences():
        if lq == 0 or lk == 0:
            continue
        q = np.swapaxes(host["Q"][oq:oq + lq], 0, 1)
        k, vv = (np.repeat(np.swapaxes(host[n][ok:ok + lk], 0, 1), group, axis=0) for n in ("K", "V"))
        s = round_to(scale * (q @ np.swapaxes(k, -1, -2)), dt)
        if plan.causal:
            off = causal_offset(lq, lk, plan.causal)
            s = np.where(np.arange(lk)[None, :] <= np.arange(lq)[:, None] + off, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
        l = e.sum(axis=-1, keepdims=True)
        p = round_to(np.where(l > 0, e / np.where(l > 0, l, 1.0), 0.0), dt)
        out["O"][oq:oq + lq] = np.swapaxes(round_to(p @ vv, dt), 0, 1)
        if not grads:
            continue
        do = np.swapaxes(host["dO"][oq:oq + lq], 0, 1)
        dv = round_to(np.swapaxes(p, -1, -2) @ do, dt)
        dp = round_to(do @ np.swapaxes(vv, -1, -2), dt)
        ds = round_to(p * (dp - (p * dp).sum(axis=-1, keepdims=True)), dt)
        out["dQ"][oq:oq + lq] = np.swapaxes(round_to(scale * (ds @ k), dt), 0, 1)
        dk = round_to(scale * (np.swapaxes(ds, -1, -2) @ q), dt)
        for name, x in (("dK", dk), ("dV", dv)):
            out[name][ok:ok + lk] = np.swapaxes(x.reshape(plan.kv_heads, group, lk, plan.d).sum(axis=1), 0, 1)
    return out


def per_item(plan):
    """``plan``'s main stage as a grid of a block per item ((T_r, 1, BH) forward, (T_c, 1, BH_kv) backward), in bands
    of heads when causal, as before the list: ITEM_LIST (and the forward's PERSISTENT) removed, HEAD_BAND as
    with_causal adds it."""
    from dataclasses import replace

    from iokernels.plan.variants import band_params

    def one(s):
        if s.name != "main":
            return s
        grid = (plan.tile["Tr"], 1, plan.bh) if plan.direction == "fwd" else (plan.tile["Tc"], 1, plan.bh_kv)
        s = replace(s, grid=grid, params=tuple(p for p in s.params if p[0] not in ("ITEM_LIST", "PERSISTENT")))
        return replace(s, params=(*s.params, *(band_params(s) if plan.causal else ())))
    return replace(plan, stages=tuple(one(s) for s in plan.stages))

