"""Dropout in the research tiled kernels on the GPU: the device Philox stream == numpy's; every plan of
``plan.DROPOUT_STAGES`` with kernels here (flash q_outer/kv_outer forward, two_pass store/recompute, flash
kv_outer backward): counters == model == simulator byte for byte, outputs and gradients against the float64
reference given the same multipliers Z (fp32, fp16, bf16, ragged N, N_q != N_k, causal, block-sparse,
explicit masks); the kernel's own mask made observable (Q = 0, V or dO = identity) equals numpy's and keeps
the right fraction; the mean over many offsets is the undropped output; a forward's Dropout regenerates the
same mask in the backward.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_dropout.py`` (skips without a CUDA device).
"""

import math
import zlib

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.kernels.sources import build_source
from iokernels.plan import DROPOUT_STAGES, make_plan, supports_explicit_mask
from iokernels.plan.dropout import Dropout
from iokernels.plan.masks import ExplicitMask, pattern
from iokernels.plan.tensors import OUTPUTS
from iokernels.plan.units import round_to
from iokernels.simulate import reference, reference_mask, simulate

from .helpers import problem_scale, rel_err

cp = pytest.importorskip("cupy")

RESEARCH = [("flash", "q_outer", "fwd"), ("flash", "kv_outer", "fwd"), ("two_pass", "store", "fwd"),
            ("two_pass", "recompute", "fwd"), ("flash", "kv_outer", "bwd")]
KEYS = [k for k in RESEARCH if k in DROPOUT_STAGES]
FWD_KEYS = [k for k in KEYS if k[2] == "fwd"]
KB = 1024
# (N_q, N_k, d, dtype, M, batch, heads): odd tiles (37, 95, 231 keys) exercise groups of 4 keys cut by a tile
CASES = [
    (1, 1, 16, "float32", 48 * KB, 1, 1),
    (113, 113, 32, "float16", 64 * KB, 2, 2),
    (113, 1000, 64, "bfloat16", 192 * KB, 1, 3),
    (1000, 113, 128, "float32", 227 * KB, 1, 1),
    (300, 77, 256, "bfloat16", 100 * KB, 1, 2),
]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _dropout(*parts, p=0.2) -> Dropout:
    s = _seed("dropout", *parts)
    return Dropout(p, (s << 32) | (s ^ 0x9E3779B9), s % 1000)  # seeds with both halves in use


def _plan(key, case, dropout, **kw):
    n_q, n_k, d, dtype, sram, batch, heads = case
    algorithm, schedule, direction = key
    return make_plan(algorithm, schedule, N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=sram, batch=batch, heads=heads,
                     direction=direction, dropout=dropout, **kw)


def _z(plan):
    return plan.dropout.full_multiplier(plan.bh, plan.N_q, plan.N_k)


def _outputs(run, plan):
    return {name: launch.to_float64(run.buffers[name], plan.dtype) for name in OUTPUTS[plan.direction]}


def _naive(plan, host):
    """Same-precision attention with dropout: S and P rounded to dtype (masks applied), then Z ∘ P."""
    q, k, v, dt = host["Q"], host["K"], host["V"], plan.dtype
    scale = reference.default_scale(plan.d)
    s = round_to(scale * (q @ np.swapaxes(k, -1, -2)), dt)
    mask = reference_mask(plan, host)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else s + mask
    causal = reference.causal_mask(plan.N_q, plan.N_k, plan.causal)
    if causal is not None:
        s = np.where(causal, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    l = p.sum(axis=-1, keepdims=True)
    p = round_to(np.where(l > 0, p / np.where(l > 0, l, 1.0), 0.0), dt)
    z = _z(plan)
    if plan.direction == "fwd":
        return {"O": round_to((z * p) @ v, dt)}
    do = host["dO"]
    dv = round_to(np.swapaxes(z * p, -1, -2) @ do, dt)
    dp = round_to(z * (do @ np.swapaxes(v, -1, -2)), dt)
    ds = round_to(p * (dp - (p * dp).sum(axis=-1, keepdims=True)), dt)
    return {"dQ": round_to(scale * (ds @ k), dt), "dK": round_to(scale * (np.swapaxes(ds, -1, -2) @ q), dt), "dV": dv}


def _want(plan, host):
    mask, z = reference_mask(plan, host), _z(plan)
    if plan.direction == "fwd":
        return {"O": reference.forward(host["Q"], host["K"], host["V"], causal=plan.causal, mask=mask, dropout=z)[0]}
    grads = reference.backward(host["Q"], host["K"], host["V"], host["dO"], causal=plan.causal, mask=mask,
                               dropout=z)
    return dict(zip(("dQ", "dK", "dV"), grads, strict=True))


def _check_outputs(plan, host, got):
    for name, x in got.items():
        assert np.all(np.isfinite(x)), f"{name} has NaN/inf (unwritten, 0/0 or overflowed)"
    want = _want(plan, host)
    scale = problem_scale(want)
    errs = {}
    for name in want:
        errs[name] = rel_err(got[name], want[name], scale)
        if plan.dtype == "float32":
            assert errs[name] < 1e-5, (name, errs[name])
        else:  # flash-attention's idiom: at most 2x the error of a same-precision naive computation
            bound = 2 * rel_err(_naive(plan, host)[name], want[name], scale) + 1e-6
            assert errs[name] <= bound, (name, errs[name], bound)
    # not the undropped output: the kernel did apply a mask (p > 0 and more than a few elements)
    if plan.dropout.p > 0 and plan.N_q * plan.N_k >= 64:
        kw = dict(causal=plan.causal, mask=reference_mask(plan, host))
        if plan.direction == "fwd":
            plain = {"O": reference.forward(host["Q"], host["K"], host["V"], **kw)[0]}
        else:
            plain = dict(zip(("dQ", "dK", "dV"), reference.backward(host["Q"], host["K"], host["V"], host["dO"], **kw),
                             strict=True))
        assert max(rel_err(got[n], plain[n], scale) for n in plain) > 10 * max(max(errs.values()), 1e-3)
    return errs


def _run_and_check(plan, seed, simulate_limit=3_000_000):
    inputs, host = launch.make_device_inputs(plan, seed=seed)
    run = launch.run_plan(plan, inputs, counting=True)
    exact = model.exact(plan)
    assert run.counts == exact
    if plan.N_q * plan.N_k * plan.bh <= simulate_limit:
        assert simulate(plan, host).counts == exact
    got = _outputs(run, plan)
    _check_outputs(plan, host, got)
    return run, host, got


# ---------------------------------------------------------------------------------------------
# the stream


@pytest.fixture(scope="module")
def philox_kernel():
    module = cp.RawModule(code=build_source("selftest.cu", {"BLOCK_ROWS": 1}, counting=False),
                          options=("-std=c++17",))
    return module.get_function("iok_dropout_selftest")


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.99])
def test_device_philox_equals_numpy(philox_kernel, p):
    rng = np.random.default_rng(_seed("philox", p))
    n = 1 << 18
    bh = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    i = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    j = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    bh[:8], i[:8], j[:8] = 0, 0, np.arange(8)  # small indices, and the extremes
    bh[8:12], i[8:12], j[8:12] = 2**32 - 1, 2**32 - 1, 2**32 - 4 + np.arange(4)
    for d in (Dropout(p, 0, 0), Dropout(p, 2**64 - 1, 2**32 - 1), _dropout("philox", p, p=p)):
        keep, z = cp.empty(n, cp.uint32), cp.empty(n, cp.float32)
        t, s, seed, off = d.kernel_args()
        philox_kernel((256,), (256,), (cp.asarray(bh), cp.asarray(i), cp.asarray(j), keep, z, np.int32(n),
                                        t, s, seed, off))
        b, r, c = bh.astype(np.int64), i.astype(np.int64), j.astype(np.int64)
        group = (c >> 4) << 4  # the element's 16 keys: bit e of keep[x] is key group + e
        want = sum(d.keep(b, r, group + e).astype(np.uint32) << np.uint32(e) for e in range(16))
        np.testing.assert_array_equal(cp.asnumpy(keep), want)
        np.testing.assert_array_equal(cp.asnumpy(z), np.where(d.keep(b, r, c), s, np.float32(0)))


# ---------------------------------------------------------------------------------------------
# every plan: counters, outputs, gradients


@pytest.mark.parametrize("causal", ["", "bottom_right"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_counters_and_outputs(key, case, causal):
    plan = _plan(key, case, _dropout(key, case, causal), causal=causal)
    _run_and_check(plan, _seed(key, case, causal))


@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_top_left_causal_and_high_p(key):
    plan = _plan(key, (200, 333, 64, "float16", 96 * KB, 2, 1), _dropout(key, p=0.9), causal="top_left")
    _run_and_check(plan, _seed(key, "top_left"))


@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_with_a_block_mask(key):
    case = (300, 250, 64, "float16", 64 * KB, 1, 2)
    block = pattern("random", 0.5, n_q=300, n_k=250, block_q=64, block_k=64, seed=2)
    for causal in ("", "bottom_right"):
        plan = _plan(key, case, _dropout(key, "block", causal), causal=causal, block_mask=block)
        _run_and_check(plan, _seed("block", key, causal))


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("key", [k for k in KEYS if supports_explicit_mask(*k)], ids="/".join)
def test_with_an_explicit_mask(key, kind):
    for causal in ("", "bottom_right"):
        plan = _plan(key, (200, 150, 64, "bfloat16", 64 * KB, 1, 2), _dropout(key, kind, causal), causal=causal,
                     mask=ExplicitMask(kind, False))
        _, _, got = _run_and_check(plan, _seed("mask", key, kind, causal))
        assert np.all(got["O" if plan.direction == "fwd" else "dQ"][:, 3::7] == 0)  # rows that see no key


@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_p_zero_is_the_plain_kernel(key):
    """p = 0: every element kept with scale 1, so the dropout build's outputs are those without dropout."""
    case = (150, 130, 64, "float32", 64 * KB, 1, 2)
    plan = _plan(key, case, Dropout(0.0, 5, 5))
    inputs, _ = launch.make_device_inputs(plan, seed=3)
    with_dropout = _outputs(launch.run_plan(plan, inputs, counting=False), plan)
    plain_plan = _plan(key, case, None)
    plain = _outputs(launch.run_plan(plain_plan, inputs, counting=False), plain_plan)
    for name, x in plain.items():
        if name == "dQ":  # float atomics from several K/V blocks: any order
            np.testing.assert_allclose(with_dropout[name], x, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(with_dropout[name], x)


@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_plain_build_agrees(key):
    plan = _plan(key, (200, 150, 64, "float32", 64 * KB, 1, 1), _dropout(key, "plain"))
    inputs, _ = launch.make_device_inputs(plan, seed=3)
    counted = _outputs(launch.run_plan(plan, inputs, counting=True), plan)
    plain = launch.run_plan(plan, inputs, counting=False)
    assert plain.counts is None
    for name, x in _outputs(plain, plan).items():
        if name == "dQ":
            np.testing.assert_allclose(x, counted[name], rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(x, counted[name])


def test_the_backward_regenerates_the_forwards_mask():
    """flash forward (each schedule) with a Dropout, then the flash backward with the same Dropout on the
    forward's own O and lse: the float64 gradients of the dropped attention."""
    bwd_key = ("flash", "kv_outer", "bwd")
    if bwd_key not in KEYS or not FWD_KEYS:
        pytest.skip("no forward and backward with dropout")
    d = _dropout("round trip", p=0.3)
    n_q, n_k, dh = 257, 190, 64
    rng = np.random.default_rng(4)
    q, k, v, do = (round_to(rng.standard_normal((2, n, dh)), "float32") for n in (n_q, n_k, n_k, n_q))
    z = d.full_multiplier(2, n_q, n_k)
    want = reference.backward(q, k, v, do, dropout=z)
    for key in FWD_KEYS:
        fwd = make_plan(*key[:2], N_q=n_q, N_k=n_k, d=dh, sram=96 * KB, heads=2, dropout=d)
        dev = {name: launch.to_device(x, "float32") for name, x in (("Q", q), ("K", k), ("V", v))}
        run = launch.run_plan(fwd, dev)
        o = run.buffers["O"]
        lse = run.buffers["lse"] if "lse" in run.buffers else None
        if lse is None:  # kv_outer and two_pass keep m, l: lse = m + log l
            m, l = run.buffers["m"], run.buffers["l"]
            lse = (m + cp.log(l)).astype(cp.float32)
        bwd = make_plan("flash", "kv_outer", N_q=n_q, N_k=n_k, d=dh, sram=96 * KB, heads=2, direction="bwd",
                        dropout=d)
        grads = launch.run_plan(bwd, dict(dev, O=o, lse=lse, dO=launch.to_device(do, "float32")))
        got = [launch.to_float64(grads.buffers[n], "float32") for n in ("dQ", "dK", "dV")]
        scale = max(float(np.max(np.abs(w))) for w in want)
        for name, g, w in zip(("dQ", "dK", "dV"), got, want, strict=True):
            assert rel_err(g, w, scale) < 1e-5, (key, name, rel_err(g, w, scale))


# ---------------------------------------------------------------------------------------------
# the kernel's own mask, observed


def _observed_forward(key, p, n_q, d, bh):
    """Q = 0 (so P = 1/N_k everywhere), V = identity with N_k = d: O[bh, i, j] = Z[bh, i, j] / N_k."""
    plan = make_plan(*key[:2], N_q=n_q, N_k=d, d=d, sram=96 * KB, heads=bh, dropout=_dropout(key, "obs", p=p))
    q = np.zeros((bh, n_q, d))
    k = np.random.default_rng(1).standard_normal((bh, d, d))
    v = np.broadcast_to(np.eye(d), (bh, d, d))
    dev = {name: launch.to_device(np.ascontiguousarray(x), "float32") for name, x in (("Q", q), ("K", k), ("V", v))}
    o = launch.to_float64(launch.run_plan(plan, dev).buffers["O"], "float32")
    return plan, o * d


def _observed_backward(p, n_k, d, bh):
    """Q = 0 (P = 1/N_k), dO = identity with N_q = d: dV[bh, j, i] = Z[bh, i, j] / N_k."""
    key = ("flash", "kv_outer", "bwd")
    plan = make_plan(*key[:2], N_q=d, N_k=n_k, d=d, sram=96 * KB, heads=bh, direction="bwd",
                     dropout=_dropout(key, "obs", p=p))
    rng = np.random.default_rng(2)
    q = np.zeros((bh, d, d))
    k, v = rng.standard_normal((bh, n_k, d)), rng.standard_normal((bh, n_k, d))
    do = np.broadcast_to(np.eye(d), (bh, d, d))
    o = reference.forward(q, k, v, dropout=_z(plan))[0]
    lse = np.full((bh, d), math.log(n_k))
    dev = {name: launch.to_device(np.ascontiguousarray(x), "float32")
           for name, x in (("Q", q), ("K", k), ("V", v), ("dO", do), ("O", o), ("lse", lse))}
    dv = launch.to_float64(launch.run_plan(plan, dev).buffers["dV"], "float32")
    return plan, np.swapaxes(dv, -1, -2) * n_k


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_the_kernels_mask_is_numpys_and_keeps_the_right_fraction(key, p):
    d, bh = 64, 4
    if key[2] == "fwd":
        plan, zk = _observed_forward(key, p, 4096, d, bh)  # 4 x 4096 x 64: a million elements
    else:
        plan, zk = _observed_backward(p, 4096, d, bh)
    z = _z(plan)
    assert zk.shape == z.shape and z.size == 1 << 20
    np.testing.assert_allclose(zk, z, rtol=1e-6, atol=1e-6)
    kept = zk > 0.5 * plan.dropout.keep_scale
    np.testing.assert_array_equal(kept, z > 0)
    q = plan.dropout.keep_probability
    sigma = math.sqrt(z.size * q * (1 - q))
    assert abs(int(kept.sum()) - z.size * q) <= 5 * sigma, (int(kept.sum()), z.size * q, sigma)


@pytest.mark.parametrize("key", FWD_KEYS, ids="/".join)
def test_the_mean_over_offsets_is_the_undropped_output(key):
    """E[Z] = 1: the average of O over many offsets tends to the undropped O, within 6 standard errors per
    element (the variance of each element's mean, from Var Z = s² q (1 − q))."""
    p, runs, n_q, n_k, dh = 0.3, 256, 40, 56, 32
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, n, dh)) for n in (n_q, n_k, n_k))
    dev = {name: launch.to_device(x, "float32") for name, x in (("Q", q), ("K", k), ("V", v))}
    host = {name: launch.to_float64(x, "float32") for name, x in dev.items()}
    total = np.zeros((1, n_q, dh))
    for offset in range(runs):
        plan = make_plan(*key[:2], N_q=n_q, N_k=n_k, d=dh, sram=48 * KB, dropout=Dropout(p, 77, offset))
        total += launch.to_float64(launch.run_plan(plan, dev).buffers["O"], "float32")
    mean = total / runs
    o = reference.forward(host["Q"], host["K"], host["V"])[0]
    prob = reference.probabilities(host["Q"], host["K"], reference.default_scale(dh))
    d = Dropout(p, 77)
    s, qk = d.keep_scale, d.keep_probability
    bias = s * qk - 1.0  # E[Z] − 1: float32 rounding of the scale, ~1e-8
    var = (s * s * qk * (1 - qk)) * ((prob ** 2) @ (host["V"] ** 2))
    zscore = (mean - (1 + bias) * o) / np.sqrt(var / runs)
    assert np.max(np.abs(zscore)) < 6, np.max(np.abs(zscore))
    assert np.mean(zscore ** 2) < 2.0, np.mean(zscore ** 2)
