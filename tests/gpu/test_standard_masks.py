"""Dropout and explicit masks in standard attention on the GPU (issue #6): counters == model == simulator byte
for byte, outputs and gradients against the float64 reference with the same mask and dropout multipliers Z (the
same-precision idiom of test_mask.py), float32/float16/bfloat16, ragged N, N_q != N_k, rows that see no key,
and standard and flash attention agreeing element for element for one seed.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_standard_masks.py`` (skips without a CUDA device).
"""

import zlib

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import Unsupported, make_plan
from iokernels.plan.dropout import Dropout
from iokernels.plan.masks import ExplicitMask
from iokernels.plan.tensors import OUTPUTS
from iokernels.plan.units import round_to
from iokernels.simulate import reference, reference_mask, simulate

from .helpers import problem_scale, rel_err

KB = 1024
# (N_q, N_k, d, dtype, M, batch, heads)
CASES = [
    (1, 1, 16, "float32", 48 * KB, 1, 1),
    (113, 113, 32, "float16", 64 * KB, 2, 2),
    (113, 1000, 64, "bfloat16", 192 * KB, 1, 3),
    (1000, 113, 128, "float32", 227 * KB, 1, 1),
    (300, 77, 64, "float16", 2 * KB, 1, 2),  # 32 x 32 x 8 product tiles: the 16-bit SIMT path
    (77, 301, 256, "bfloat16", 100 * KB, 1, 2),
]
# (mask kind, shared, dropout p, causal)
VARIANTS = {
    "dropout": (None, None, 0.2, ""),
    "bool-shared": ("bool", True, None, ""),
    "additive-per_bh-causal": ("additive", False, None, "bottom_right"),
    "bool-per_bh-dropout": ("bool", False, 0.5, ""),
    "additive-shared-dropout-causal": ("additive", True, 0.1, "top_left"),
}


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _plan(direction, case, kind=None, shared=True, p=None, causal="", seed=0, algorithm="standard", schedule=None):
    n_q, n_k, d, dtype, sram, batch, heads = case
    return make_plan(algorithm, schedule, N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=sram, batch=batch, heads=heads,
                     direction=direction, causal=causal, mask=None if kind is None else ExplicitMask(kind, shared),
                     dropout=None if p is None else Dropout(p, seed=seed, offset=seed % 1000))


def _outputs(run, plan):
    return {name: launch.to_float64(run.buffers[name], plan.dtype) for name in OUTPUTS[plan.direction]}


def _z(plan):
    return None if plan.dropout is None else plan.dropout.full_multiplier(plan.bh, plan.N_q, plan.N_k)


def _want(plan, host):
    mask, z = reference_mask(plan, host), _z(plan)
    if plan.direction == "fwd":
        return {"O": reference.forward(host["Q"], host["K"], host["V"], causal=plan.causal, mask=mask, dropout=z)[0]}
    grads = reference.backward(host["Q"], host["K"], host["V"], host["dO"], causal=plan.causal, mask=mask, dropout=z)
    return dict(zip(("dQ", "dK", "dV"), grads, strict=True))


def _naive(plan, host):
    """Same-precision standard attention as the kernels round it: S, P, Z ∘ P, dP, dS and the outputs stored in
    the dtype (the backward's P is its input, rounded already)."""
    dt, scale = plan.dtype, reference.default_scale(plan.d)
    q, k, v = host["Q"], host["K"], host["V"]
    z = 1.0 if plan.dropout is None else _z(plan)
    if plan.direction == "fwd":
        s = round_to(scale * (q @ np.swapaxes(k, -1, -2)), dt)
        mask = reference_mask(plan, host)
        if mask is not None:
            s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else round_to(s + mask, dt)
        causal = reference.causal_mask(plan.N_q, plan.N_k, plan.causal)
        if causal is not None:
            s = np.where(causal, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        pr = np.exp(s - np.where(np.isfinite(m), m, 0.0))
        l = pr.sum(axis=-1, keepdims=True)
        pr = round_to(np.where(l > 0, pr / np.where(l > 0, l, 1.0), 0.0), dt)
        return {"O": round_to(round_to(z * pr, dt) @ v, dt)}
    pr, do = host["P"], host["dO"]
    dv = round_to(np.swapaxes(round_to(z * pr, dt), -1, -2) @ do, dt)
    dp = z * round_to(do @ np.swapaxes(v, -1, -2), dt)
    ds = round_to(pr * (dp - (pr * dp).sum(axis=-1, keepdims=True)), dt)
    return {"dQ": round_to(scale * (ds @ k), dt), "dK": round_to(scale * (np.swapaxes(ds, -1, -2) @ q), dt), "dV": dv}


def _check_outputs(plan, host, got):
    for name, x in got.items():
        assert np.all(np.isfinite(x)), f"{name} has NaN/inf (unwritten, 0/0 or overflowed)"
    want = _want(plan, host)
    scale = problem_scale(want)
    if plan.dtype == "float32":
        for name in want:
            assert rel_err(got[name], want[name], scale) < 2e-5, name
    else:  # at most a few times the error of the same-precision naive computation
        naive = _naive(plan, host)
        for name in want:
            bound = 3 * rel_err(naive[name], want[name], scale) + 1e-6
            err = rel_err(got[name], want[name], scale)
            assert err <= bound, (name, err, bound)


def _run_and_check(plan, seed):
    inputs, host = launch.make_device_inputs(plan, seed=seed)
    run = launch.run_plan(plan, inputs, counting=True)
    exact = model.exact(plan)
    assert run.counts == exact
    if plan.mask is not None and plan.direction == "fwd":
        assert exact["qk"]["mask"] == (plan.bh * plan.N_q * plan.N_k * plan.mask.itemsize, 0)
    if plan.N_q * plan.N_k * plan.bh <= 2_000_000:
        assert simulate(plan, host).counts == exact
    got = _outputs(run, plan)
    _check_outputs(plan, host, got)
    return run, host, got


# each case with two variants (compiles stay few): every variant on two or three dtypes
PAIRS = [(CASES[0], "bool-shared"), (CASES[0], "bool-per_bh-dropout"),
         (CASES[1], "dropout"), (CASES[1], "additive-per_bh-causal"),
         (CASES[2], "bool-per_bh-dropout"), (CASES[2], "additive-shared-dropout-causal"),
         (CASES[3], "dropout"), (CASES[3], "additive-shared-dropout-causal"),
         (CASES[4], "bool-per_bh-dropout"), (CASES[4], "additive-shared-dropout-causal"),
         (CASES[5], "bool-shared"), (CASES[5], "additive-per_bh-causal")]


@pytest.mark.parametrize("case, variant", PAIRS, ids=[f"{'-'.join(map(str, c))}-{v}" for c, v in PAIRS])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_counters_and_outputs(direction, case, variant):
    seed = _seed(direction, case, variant)
    kind, shared, p, causal = VARIANTS[variant]
    _run_and_check(_plan(direction, case, kind, shared, p, causal, seed), seed)


@pytest.mark.parametrize("p", [None, 0.3])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_rows_that_see_no_key(kind, p):
    """sim.random_mask hides every 7th query row (from row 3): P, O and dQ exactly 0 there, m = −inf, l = 0,
    so lse = m + log l = −inf; nothing NaN."""
    case = (200, 150, 64, "float16", 64 * KB, 1, 2)
    rows = np.arange(3, 200, 7)
    fwd = _plan("fwd", case, kind, False, p, seed=5)
    run, _, got = _run_and_check(fwd, _seed("empty", kind, p))
    assert np.all(got["O"][:, rows] == 0)
    prob = launch.to_float64(run.buffers["P"], fwd.dtype)
    m, l = (launch.to_float64(run.buffers[name], "float32") for name in ("m", "l"))
    assert np.all(np.isfinite(prob)) and np.all(prob[:, rows] == 0)
    assert np.all(np.isneginf(m[:, rows])) and np.all(l[:, rows] == 0)
    assert np.all(np.isfinite(m[:, :3])) and np.all(l[:, :3] > 0)
    with np.errstate(divide="ignore"):
        assert np.all(np.isneginf(m[:, rows] + np.log(l[:, rows])))
    bwd = _plan("bwd", case, kind, False, p, seed=5)
    _, _, grads = _run_and_check(bwd, _seed("empty-bwd", kind, p))
    assert np.all(grads["dQ"][:, rows] == 0)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_plain_build_agrees(direction):
    plan = _plan(direction, (300, 200, 64, "float16", 64 * KB, 1, 2), "additive", False, 0.25, "bottom_right", 9)
    inputs, _ = launch.make_device_inputs(plan, seed=3)
    counted = _outputs(launch.run_plan(plan, inputs, counting=True), plan)
    plain = launch.run_plan(plan, inputs, counting=False)
    assert plain.counts is None
    for name, x in _outputs(plain, plan).items():
        np.testing.assert_array_equal(x, counted[name])


# ---------------------------------------------------------------------------------------------
# standard and flash attention agree element for element for one seed


def _flash(direction, case, **kw):
    schedule = "q_outer" if direction == "fwd" else "kv_outer"
    try:
        return _plan(direction, case, algorithm="flash", schedule=schedule, **kw)
    except Unsupported as exc:
        pytest.skip(f"flash/{schedule}/{direction} takes no dropout yet: {exc}")


AGREE = [(257, 300, 64, "float32", 96 * KB, 1, 2), (300, 257, 64, "float16", 96 * KB, 2, 1),
         (129, 129, 128, "bfloat16", 192 * KB, 1, 2)]


@pytest.mark.parametrize("kind", [None, "bool"], ids=["no_mask", "bool_mask"])
@pytest.mark.parametrize("case", AGREE, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_standard_and_flash_agree_for_one_seed(direction, case, kind):
    """The same Dropout (seed, offset) in standard attention (P through HBM) and flash attention (P on chip):
    O of standard/default equals O of flash/q_outer, and the gradients of the standard backward those of
    flash/kv_outer, to rounding; a different seed would change them by O(1) (p = 0.5 drops half of P)."""
    flash = _flash(direction, case, kind=kind, shared=False, p=0.5, seed=1234)
    standard = _plan(direction, case, kind, False, 0.5, seed=1234)
    assert standard.dropout == flash.dropout
    seed = _seed("agree", direction, case, kind)
    inputs, host = launch.make_device_inputs(standard, seed=seed)  # the same Q, K, V, mask, dO (and O, lse, P)
    flash_inputs, flash_host = launch.make_device_inputs(flash, seed=seed)
    for name in set(host) & set(flash_host):
        np.testing.assert_array_equal(host[name], flash_host[name], err_msg=name)
    a = _outputs(launch.run_plan(standard, inputs), standard)
    b = _outputs(launch.run_plan(flash, flash_inputs), flash)
    want = _want(standard, host)
    scale = problem_scale(want)
    if case[3] == "float32":
        tol = 2e-5
    else:  # standard rounds S and P to the dtype, flash keeps them in float32: a few naive errors apart
        tol = 3 * max(rel_err(x, want[name], scale) for name, x in _naive(standard, host).items()) + 1e-3
    for name in want:
        assert rel_err(a[name], b[name], scale) < tol, (name, rel_err(a[name], b[name], scale), tol)
    other = _plan(direction, case, kind, False, 0.5, seed=1235)
    c = _outputs(launch.run_plan(other, inputs), other)
    assert max(rel_err(c[name], a[name], scale) for name in want) > 0.05  # another seed: another result
