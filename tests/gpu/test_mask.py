"""Explicit masks on the GPU: counters == model == simulator byte for byte, outputs and gradients against the
float64 reference with the same mask (the same-precision idiom of test_sparse.py), boolean and additive,
shared and per batch·head, with the causal mask and a block mask, ragged N, N_q != N_k, rows that see no key.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_mask.py`` (skips without a CUDA device).
"""

import zlib

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.masks import ExplicitMask, pattern
from iokernels.plan.tensors import OUTPUTS
from iokernels.plan.units import round_to
from iokernels.simulate import reference, reference_mask, simulate

from .helpers import problem_scale, rel_err

KEYS = [("flash", "q_outer", "fwd"), ("flash", "kv_outer", "bwd")]
KB = 1024
# (N_q, N_k, d, dtype, M, batch, heads)
CASES = [
    (1, 1, 16, "float32", 48 * KB, 1, 1),
    (113, 113, 32, "float16", 64 * KB, 2, 2),
    (113, 1000, 64, "bfloat16", 192 * KB, 1, 3),
    (1000, 113, 128, "float32", 227 * KB, 1, 1),
    (300, 77, 256, "bfloat16", 100 * KB, 1, 2),
]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _plan(key, case, kind, shared, causal="", block_mask=None):
    n_q, n_k, d, dtype, sram, batch, heads = case
    algorithm, schedule, direction = key
    return make_plan(algorithm, schedule, N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=sram, batch=batch, heads=heads,
                     direction=direction, causal=causal, block_mask=block_mask, mask=ExplicitMask(kind, shared))


def _outputs(run, plan):
    return {name: launch.to_float64(run.buffers[name], plan.dtype) for name in OUTPUTS[plan.direction]}


def _naive_probs(plan, host):
    """Same-precision masked softmax: S rounded to dtype, the mask applied, P rounded to dtype (empty rows: 0)."""
    q, k = host["Q"], host["K"]
    s = round_to(reference.default_scale(q.shape[-1]) * (q @ np.swapaxes(k, -1, -2)), plan.dtype)
    mask = reference_mask(plan, host)
    if mask.dtype == np.bool_:
        s = np.where(mask, s, -np.inf)
    else:
        s = s + mask
    causal = reference.causal_mask(plan.N_q, plan.N_k, plan.causal)
    if causal is not None:
        s = np.where(causal, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    l = p.sum(axis=-1, keepdims=True)
    return round_to(np.where(l > 0, p / np.where(l > 0, l, 1.0), 0.0), plan.dtype)


def _naive(plan, host):
    p, v = _naive_probs(plan, host), host["V"]
    if plan.direction == "fwd":
        return {"O": round_to(p @ v, plan.dtype)}
    q, k, do, scale, dt = host["Q"], host["K"], host["dO"], reference.default_scale(plan.d), plan.dtype
    dv = round_to(np.swapaxes(p, -1, -2) @ do, dt)
    dp = round_to(do @ np.swapaxes(v, -1, -2), dt)
    ds = round_to(p * (dp - (p * dp).sum(axis=-1, keepdims=True)), dt)
    return {"dQ": round_to(scale * (ds @ k), dt), "dK": round_to(scale * (np.swapaxes(ds, -1, -2) @ q), dt), "dV": dv}


def _want(plan, host):
    mask = reference_mask(plan, host)
    if plan.direction == "fwd":
        return {"O": reference.forward(host["Q"], host["K"], host["V"], causal=plan.causal, mask=mask)[0]}
    grads = reference.backward(host["Q"], host["K"], host["V"], host["dO"], causal=plan.causal, mask=mask)
    return dict(zip(("dQ", "dK", "dV"), grads, strict=True))


def _check_outputs(plan, host, got):
    for name, x in got.items():
        assert np.all(np.isfinite(x)), f"{name} has NaN/inf (unwritten, 0/0 or overflowed)"
    want = _want(plan, host)
    scale = problem_scale(want)
    if plan.dtype == "float32":
        for name in want:
            assert rel_err(got[name], want[name], scale) < 1e-5, name
    else:  # flash-attention's idiom: at most 2x the error of a same-precision naive computation
        naive = _naive(plan, host)
        for name in want:
            bound = 2 * rel_err(naive[name], want[name], scale) + 1e-6
            err = rel_err(got[name], want[name], scale)
            assert err <= bound, (name, err, bound)


def _run_and_check(plan, seed):
    inputs, host = launch.make_device_inputs(plan, seed=seed)
    run = launch.run_plan(plan, inputs, counting=True)
    exact = model.exact(plan)
    assert run.counts == exact
    assert exact["main"]["mask"][0] > 0
    if plan.N_q * plan.N_k * plan.bh <= 4_000_000:
        assert simulate(plan, host).counts == exact
    got = _outputs(run, plan)
    _check_outputs(plan, host, got)
    return run, host, got


@pytest.mark.parametrize("causal", ["", "bottom_right"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per_bh"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_counters_and_outputs(key, case, kind, shared, causal):
    _run_and_check(_plan(key, case, kind, shared, causal), _seed(key, case, kind, shared, causal))


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_with_a_block_mask(key, kind):
    case = (300, 250, 64, "float16", 64 * KB, 1, 2)
    block = pattern("random", 0.5, n_q=300, n_k=250, block_q=64, block_k=64, seed=2)
    _run_and_check(_plan(key, case, kind, False, "", block), _seed("block", key, kind))


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_rows_that_see_no_key(key, kind):
    """The random masks hide every 7th query row (from row 3): O, dQ exactly 0 there, lse −inf."""
    plan = _plan(key, (200, 150, 64, "float32", 64 * KB, 1, 2), kind, False)
    run, _, got = _run_and_check(plan, _seed("empty", key, kind))
    rows = np.arange(3, 200, 7)
    assert np.all(got["O" if plan.direction == "fwd" else "dQ"][:, rows] == 0)
    if plan.direction == "fwd":
        lse = launch.to_float64(run.buffers["lse"], "float32")
        assert np.all(np.isneginf(lse[:, rows])) and np.all(np.isfinite(lse[:, 0:3]))


@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_plain_build_agrees(key):
    plan = _plan(key, (200, 150, 64, "float32", 64 * KB, 1, 1), "additive", True)
    inputs, _ = launch.make_device_inputs(plan, seed=3)
    counted = _outputs(launch.run_plan(plan, inputs, counting=True), plan)
    plain = launch.run_plan(plan, inputs, counting=False)
    assert plain.counts is None
    for name, x in _outputs(plain, plan).items():
        if name == "dQ":  # float atomics from several K/V blocks: any order
            np.testing.assert_allclose(x, counted[name], rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(x, counted[name])


def test_a_wrong_mask_input_is_rejected_before_launch():
    plan = _plan(KEYS[0], (64, 64, 16, "float32", 48 * KB, 1, 2), "bool", False)
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    inputs["mask"] = inputs["mask"].astype("float32")
    with pytest.raises(ValueError, match="input mask: expected a C-contiguous uint8 array of shape \\(2, 64, 64\\)"):
        launch.run_plan(plan, inputs)
