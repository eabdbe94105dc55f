"""Explicit masks on the CPU: ExplicitMask and the array conversion (bad input included), plan, simulator ==
model byte for byte, simulator == float64 reference, rows that see no key, and the mask's bytes."""

from __future__ import annotations

import numpy as np
import pytest

from iokernels import model
from iokernels import simulate as sim
from iokernels.kernels.stages import plan_kernels
from iokernels.plan import SCHEDULES, Unsupported, make_plan, pair_sums, supports_explicit_mask, with_mask
from iokernels.plan.masks import ExplicitMask, explicit_mask, pattern
from iokernels.simulate import reference

KB = 1024
# the tiled schedules (their "main" stage reads the mask); standard attention: tests/plan/test_standard_masks.py
KEYS = [(a, s, p) for (a, p), ss in SCHEDULES.items() for s in ss
        if supports_explicit_mask(a, s, p) and a != "standard"]


def _plan(key, n_q, n_k, kind="bool", shared=True, d=16, sram=8 * KB, **kw):
    algorithm, schedule, direction = key
    return make_plan(algorithm, schedule, N_q=n_q, N_k=n_k, d=d, sram=sram, direction=direction,
                     mask=ExplicitMask(kind, shared), **kw)


# ---------------------------------------------------------------------------------------------
# ExplicitMask and explicit_mask()


def test_explicit_mask_properties():
    b, a = ExplicitMask("bool", True), ExplicitMask("additive", False)
    assert (b.itemsize, b.dtype, b.code, b.bh_stride) == (1, np.uint8, 1, 0)
    assert (a.itemsize, a.dtype, a.code, a.bh_stride) == (4, np.float32, 2, 1)
    assert b.shape(6, 10, 20) == (1, 10, 20) and a.shape(6, 10, 20) == (6, 10, 20)
    assert hash(b) == hash(ExplicitMask("bool", True)) and b != a
    with pytest.raises(ValueError, match="mask kind must be one of bool, additive, got 'int'"):
        ExplicitMask("int")


@pytest.mark.parametrize("shape, shared", [((10, 20), True), ((1, 1, 10, 20), True), ((1, 10, 1), True),
                                           ((2, 3, 10, 20), False), ((2, 1, 10, 20), False), ((3, 1, 20), False)])
@pytest.mark.parametrize("dtype", [np.bool_, np.float64, np.float16])
def test_explicit_mask_broadcasts(shape, shared, dtype):
    rng = np.random.default_rng(0)
    raw = rng.random(shape) < 0.5 if dtype == np.bool_ else rng.standard_normal(shape).astype(dtype)
    spec, arr = explicit_mask(raw, (2, 3), 10, 20)
    assert spec == ExplicitMask("bool" if dtype == np.bool_ else "additive", shared)
    assert arr.dtype == spec.dtype and arr.flags.c_contiguous and arr.shape == spec.shape(6, 10, 20)
    full = np.broadcast_to(raw, (2, 3, 10, 20)).reshape(6, 10, 20)
    np.testing.assert_array_equal(np.broadcast_to(arr, (6, 10, 20)), full.astype(spec.dtype))


@pytest.mark.parametrize("raw, error, message", [
    (np.ones((10, 21), bool), ValueError, r"mask of shape \(10, 21\) is not broadcastable to \(2, 3, 10, 20\)"),
    (np.ones((20,), bool), ValueError, r"mask of shape \(20,\) is not broadcastable"),
    (np.ones((1, 2, 3, 10, 20), bool), ValueError, "not broadcastable"),
    (np.ones((3, 3, 10, 20), bool), ValueError, "not broadcastable"),
    (np.ones((10, 20), np.int32), TypeError, "boolean or floating-point array, got dtype int32"),
    (np.full((10, 20), np.nan), ValueError, "must not hold NaN"),
    (np.full((10, 20), np.inf), ValueError, r"must not hold \+inf"),
])
def test_explicit_mask_bad_input(raw, error, message):
    with pytest.raises(error, match=message):
        explicit_mask(raw, (2, 3), 10, 20)


# ---------------------------------------------------------------------------------------------
# plan


@pytest.mark.parametrize("key", KEYS, ids="/".join)
@pytest.mark.parametrize("kind, shared, code, stride", [("bool", True, 1, 0), ("additive", False, 2, 1)])
def test_plan_carries_the_mask_and_its_defines(key, kind, shared, code, stride):
    plain = make_plan(key[0], key[1], N_q=300, N_k=200, d=16, sram=16 * KB, direction=key[2])
    plan = _plan(key, 300, 200, kind, shared, sram=16 * KB)
    assert plan.tiles == plain.tiles and plan.mask == ExplicitMask(kind, shared)
    assert plan.as_dict()["mask"] == {"kind": kind, "shared": shared}
    assert plan.tensor_itemsize("mask") == (1 if kind == "bool" else 4)
    for stage in plan.stages:
        params = dict(stage.params)
        assert (params.get("MASK"), params.get("MASK_BH_STRIDE")) == ((code, stride) if stage.name == "main"
                                                                      else (None, None))
    for (stage, ref), (_, base) in zip(plan_kernels(plan), plan_kernels(plain), strict=True):
        assert (ref == base) == (stage.name != "main")
    assert with_mask(plain, ExplicitMask(kind, shared)) == plan and with_mask(plain, None) == plain


def test_unsupported_schedules_and_bad_plan_input():
    mask = ExplicitMask()
    for algorithm, schedule, direction in [("two_pass", "store", "fwd"), ("flash", "kv_outer", "fwd")]:
        with pytest.raises(Unsupported, match=r"explicit masks are not implemented by .*use flash/q_outer"):
            make_plan(algorithm, schedule, N_q=256, d=16, sram=8 * KB, direction=direction, mask=mask)
    for direction in ("fwd", "bwd"):
        with pytest.raises(Unsupported, match=rf"explicit masks are not implemented by flash/fast/{direction}"):
            make_plan("flash", "fast", N_q=256, d=64, dtype="float16", sram=227 * KB, direction=direction, mask=mask)
    with pytest.raises(TypeError, match=r"mask must be an iokernels\.plan\.masks\.ExplicitMask, got ndarray"):
        make_plan("flash", "q_outer", N_q=256, d=16, sram=8 * KB, mask=np.ones((256, 256), bool))


# ---------------------------------------------------------------------------------------------
# simulator == model, simulator == reference


SHAPES = [(1, 1, 1, 1), (70, 90, 2, 3), (129, 64, 1, 2), (64, 200, 3, 1), (33, 33, 1, 1)]


@pytest.mark.parametrize("causal", ["", "bottom_right", "top_left"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per_bh"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_simulator_equals_model_and_reference(key, shape, kind, shared, causal):
    n_q, n_k, batch, heads = shape
    plan = _plan(key, n_q, n_k, kind, shared, batch=batch, heads=heads, causal=causal)
    inputs = sim.make_inputs(plan, seed=n_q + n_k)
    result = sim.simulate(plan, inputs)
    exact = model.exact(plan)
    assert result.counts == exact
    # every batch·head reads the mask elements of the pairs it computes, shared or not
    assert exact["main"]["mask"] == (plan.bh * pair_sums(plan)["A_S"] * plan.mask.itemsize, 0)
    if not causal:
        assert exact["main"]["mask"][0] == plan.bh * n_q * n_k * plan.mask.itemsize
    for name, x in result.outputs.items():
        assert np.all(np.isfinite(x)), name
    assert sim.max_relative_error(result.outputs, sim.reference_outputs(plan, inputs)) < 1e-10


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_with_a_block_mask_and_causal(key, kind):
    block = pattern("random", 0.5, n_q=200, n_k=150, block_q=32, block_k=16, seed=3)
    plan = _plan(key, 200, 150, kind, False, batch=2, causal="bottom_right", block_mask=block)
    assert "BLOCK_SPARSE" in dict(plan.stage("main").params) and "MASK" in dict(plan.stage("main").params)
    inputs = sim.make_inputs(plan, seed=7)
    result = sim.simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    assert model.exact(plan)["main"]["mask"][0] == 2 * pair_sums(plan)["A_S"] * plan.mask.itemsize
    assert sim.max_relative_error(result.outputs, sim.reference_outputs(plan, inputs)) < 1e-10


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_the_mask_changes_the_result_and_empty_rows_are_zero(key, kind):
    plan = _plan(key, 64, 48, kind, False, heads=2)
    inputs = sim.make_inputs(plan, seed=2)
    out = sim.simulate(plan, inputs).outputs
    unmasked = {"fwd": lambda: {"O": reference.forward(inputs["Q"], inputs["K"], inputs["V"])[0]},
                "bwd": lambda: dict(zip(("dQ", "dK", "dV"), reference.backward(inputs["Q"], inputs["K"], inputs["V"],
                                                                             inputs["dO"]), strict=True))}
    assert sim.max_relative_error(out, unmasked[plan.direction]()) > 1e-3
    rows = np.arange(3, 64, 7)  # sim.random_mask hides every 7th query row
    assert np.all(out["O" if plan.direction == "fwd" else "dQ"][:, rows] == 0)
    if plan.direction == "fwd":
        _, lse = reference.forward(inputs["Q"], inputs["K"], inputs["V"], mask=sim.reference_mask(plan, inputs))
        assert np.all(np.isneginf(lse[:, rows])) and np.all(np.isfinite(lse[:, :3]))


def test_additive_mask_shifts_the_scores():
    """An additive mask of a constant per row changes nothing (softmax is shift-invariant); the simulator
    reads it all the same."""
    plan = _plan(KEYS[0], 40, 30, "additive", True)
    inputs = sim.make_inputs(plan, seed=1)
    inputs["mask"] = np.broadcast_to(np.arange(40, dtype=np.float32)[None, :, None], (1, 40, 30)).copy()
    result = sim.simulate(plan, inputs)
    o, _ = reference.forward(inputs["Q"], inputs["K"], inputs["V"])
    np.testing.assert_allclose(result.outputs["O"], o, rtol=1e-10, atol=1e-12)
    assert result.counts["main"]["mask"] == (40 * 30 * 4, 0)


# ---------------------------------------------------------------------------------------------
# the model


def test_model_expressions_and_theta():
    table = model.io_exprs("flash", "q_outer", "fwd", mask=True)
    assert table["main"]["mask"] == (model.BH * model.N_q * model.N_k * model.e_m, 0)
    causal = model.io_exprs("flash", "kv_outer", "bwd", causal=True, mask=True)
    assert causal["main"]["mask"] == (model.BH * model.A_S * model.e_m, 0)
    n = model.N
    theta = model.theta_expr("flash", "q_outer", "fwd", mask=True) - model.theta_expr("flash", "q_outer", "fwd")
    assert sp_simplify(theta.subs({model.N_q: n, model.N_k: n}) - model.BH * n**2 * model.e_m) == 0
    plan = _plan(KEYS[0], 1000, 1000, "additive", True, d=64, sram=96 * KB, batch=2)
    plain = make_plan("flash", "q_outer", N_q=1000, d=64, sram=96 * KB, batch=2)
    pred, base = model.predict(plan), model.predict(plain)
    assert pred.total_bytes - base.total_bytes == 2 * 1000 * 1000 * 4
    assert pred.flops == base.flops


def sp_simplify(x):
    import sympy as sp

    return sp.simplify(x)


def test_dense_mask_views_a_mask_already_in_the_kernels_layout():
    from iokernels.plan.masks import dense_mask, mask_layout

    a = np.random.default_rng(0).random((2, 3, 10, 20)) > 0.5
    spec, shape = mask_layout(a.dtype, a.shape, (2, 3), 10, 20)
    dense = dense_mask(np, a, spec, (2, 3), 10, 20)
    assert shape == dense.shape == (6, 10, 20) and dense.dtype == np.uint8 and np.shares_memory(dense, a)
    assert np.array_equal(dense.astype(bool), a.reshape(6, 10, 20))


def test_dense_mask_broadcasts_and_widens():
    from iokernels.plan.masks import dense_mask, mask_layout

    a = np.arange(20, dtype=np.float16).reshape(1, 20)  # one row for every query, every batch-head
    spec, shape = mask_layout(a.dtype, a.shape, (2, 3), 10, 20)
    dense = dense_mask(np, a, spec, (2, 3), 10, 20)
    assert spec.shared and shape == dense.shape == (1, 10, 20) and dense.dtype == np.float32
    assert np.array_equal(dense[0], np.broadcast_to(a.astype(np.float32), (10, 20)))
    b = np.ones((3, 1, 20), dtype=bool)  # per head: broadcast over the batch
    spec, shape = mask_layout(b.dtype, b.shape, (2, 3), 10, 20)
    assert not spec.shared and dense_mask(np, b, spec, (2, 3), 10, 20).shape == shape == (6, 10, 20)
