"""Dropout and explicit masks in standard attention on the CPU (issue #6): the plan's defines, simulator ==
float64 reference (with the same dropout multipliers Z), counters == model byte for byte, the mask's bytes
in the qk stage, rows that see no key, and the simulated standard and flash attention agreeing for one seed.

Standard attention: the qk product's epilogue reads the explicit mask (every element of S, every batch·head),
rowsum and normalize give rows with no visible key P = 0; pv applies Z to P (O = (Z ∘ P) V, P stays the
undropped softmax); the backward's dv applies Z to P, rowdot and ds to the raw dP = dO Vᵀ. Z moves no bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from iokernels import model
from iokernels import simulate as sim
from iokernels.kernels.stages import plan_kernels
from iokernels.plan import Unsupported, make_plan, supports_dropout, supports_explicit_mask
from iokernels.plan.dropout import Dropout
from iokernels.plan.masks import ExplicitMask
from iokernels.simulate import reference, simulator

KB = 1024
DROPOUT = Dropout(0.3, seed=0x1234_5678_9ABC_DEF0, offset=7)
MASKS = {"none": None, "bool-shared": ExplicitMask("bool", True), "bool-per_bh": ExplicitMask("bool", False),
         "additive-shared": ExplicitMask("additive", True), "additive-per_bh": ExplicitMask("additive", False)}
# (N_q, N_k, batch, heads): ragged against every tile, N_q != N_k both ways, one element
SHAPES = [(1, 1, 1, 1), (70, 90, 2, 3), (129, 64, 1, 2), (64, 200, 3, 1), (33, 33, 1, 1)]


def _plan(direction, n_q, n_k, *, mask=None, dropout=None, causal="", batch=1, heads=1, d=16, sram=8 * KB,
          dtype="float32"):
    return make_plan("standard", N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=sram, batch=batch, heads=heads,
                     direction=direction, mask=mask, dropout=dropout, causal=causal)


def _z(plan):
    return None if plan.dropout is None else plan.dropout.full_multiplier(plan.bh, plan.N_q, plan.N_k)


def _want(plan, inputs):
    """The float64 reference with the plan's masks and dropout multipliers."""
    mask, z = sim.reference_mask(plan, inputs), _z(plan)
    q, k, v = inputs["Q"], inputs["K"], inputs["V"]
    if plan.direction == "fwd":
        return {"O": reference.forward(q, k, v, causal=plan.causal, mask=mask, dropout=z)[0]}
    grads = reference.backward(q, k, v, inputs["dO"], causal=plan.causal, mask=mask, dropout=z)
    return dict(zip(("dQ", "dK", "dV"), grads, strict=True))


# ---------------------------------------------------------------------------------------------
# plan


def test_standard_supports_both():
    for direction in ("fwd", "bwd"):
        assert supports_dropout("standard", "default", direction)
        assert supports_explicit_mask("standard", "default", direction)


@pytest.mark.parametrize("kind, shared, code, stride", [("bool", True, 1, 0), ("bool", False, 1, 1),
                                                        ("additive", True, 2, 0), ("additive", False, 2, 1)])
def test_plan_mask_defines(kind, shared, code, stride):
    mask = ExplicitMask(kind, shared)
    for direction in ("fwd", "bwd"):
        plain = _plan(direction, 300, 200, sram=16 * KB)
        plan = _plan(direction, 300, 200, mask=mask, sram=16 * KB)
        assert plan.mask == mask and plan.tiles == plain.tiles
        assert plan.as_dict()["mask"] == {"kind": kind, "shared": shared}
        masked = {"fwd": {"qk"}, "bwd": set()}[direction]  # the backward reads no mask: P is 0 where masked
        for stage in plan.stages:
            params = dict(stage.params)
            want = (code, stride) if stage.name in masked else (None, None)
            assert (params.get("MASK"), params.get("MASK_BH_STRIDE")) == want, stage.name
        for (stage, ref), (_, base) in zip(plan_kernels(plan), plan_kernels(plain), strict=True):
            assert (ref == base) == (stage.name not in masked)


def test_plan_dropout_defines():
    want = {"fwd": {"pv"}, "bwd": {"dv", "rowdot", "ds"}}
    for direction in ("fwd", "bwd"):
        plain = _plan(direction, 100, 80)
        plan = _plan(direction, 100, 80, dropout=DROPOUT)
        assert plan.dropout == DROPOUT and plan.tiles == plain.tiles
        assert {s.name for s in plan.stages if dict(s.params).get("DROPOUT") == 1} == want[direction]
        for (stage, ref), (_, base) in zip(plan_kernels(plan), plan_kernels(plain), strict=True):
            assert (ref == base) == (stage.name not in want[direction])


def test_plan_with_everything():
    plan = _plan("fwd", 100, 80, mask=ExplicitMask("additive", False), dropout=DROPOUT, causal="top_left")
    params = {s.name: dict(s.params) for s in plan.stages}
    assert params["qk"]["MASK"] == 2 and params["qk"]["MASK_BH_STRIDE"] == 1 and params["qk"]["CAUSAL"] == 1
    assert params["pv"]["DROPOUT"] == 1 and "MASK" not in params["pv"] and "DROPOUT" not in params["qk"]
    bwd = _plan("bwd", 100, 80, mask=ExplicitMask("bool", True), dropout=DROPOUT, causal=True)
    assert bwd.mask == ExplicitMask("bool", True) and bwd.causal == "bottom_right"
    assert not any("MASK" in dict(s.params) or "CAUSAL" in dict(s.params) for s in bwd.stages)


def test_block_sparse_standard_stays_unsupported():
    from iokernels.plan.masks import pattern

    block = pattern("local", 0.5, n_q=256, n_k=256, block_q=64)
    with pytest.raises(Unsupported, match="standard attention computes all of S"):
        make_plan("standard", N_q=256, d=16, sram=8 * KB, block_mask=block, mask=ExplicitMask())


# ---------------------------------------------------------------------------------------------
# simulator == reference, counts == model


@pytest.mark.parametrize("causal", ["", "bottom_right", "top_left"])
@pytest.mark.parametrize("dropout", [None, DROPOUT], ids=["no_dropout", "dropout"])
@pytest.mark.parametrize("mask", list(MASKS), ids=list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_simulator_equals_model_and_reference(direction, shape, mask, dropout, causal):
    n_q, n_k, batch, heads = shape
    plan = _plan(direction, n_q, n_k, mask=MASKS[mask], dropout=dropout, causal=causal, batch=batch, heads=heads)
    inputs = sim.make_inputs(plan, seed=n_q * 31 + n_k)
    result = sim.simulate(plan, inputs)
    exact = model.exact(plan)
    assert result.counts == exact
    # dropout moves nothing; the mask adds its reads to the forward's qk stage only
    plain = model.exact(_plan(direction, n_q, n_k, causal=causal, batch=batch, heads=heads))
    if plan.mask is not None and direction == "fwd":
        itemsize = plan.mask.itemsize
        assert exact["qk"]["mask"] == (plan.bh * n_q * n_k * itemsize, 0)  # every element, shared or not
        exact = {s: {t: rw for t, rw in ts.items() if t != "mask"} for s, ts in exact.items()}
    assert exact == plain
    for name, x in result.outputs.items():
        assert np.all(np.isfinite(x)), name
    assert sim.max_relative_error(result.outputs, _want(plan, inputs)) < 1e-10


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_dropout_changes_the_result_and_p_zero_does_not(direction):
    plan = _plan(direction, 64, 48, dropout=DROPOUT, heads=2)
    inputs = sim.make_inputs(plan, seed=5)
    out = sim.simulate(plan, inputs).outputs
    plain = _plan(direction, 64, 48, heads=2)
    base = sim.simulate(plain, inputs).outputs
    assert sim.max_relative_error(out, base) > 1e-2
    zero = _plan(direction, 64, 48, dropout=Dropout(0.0, seed=3), heads=2)
    assert sim.max_relative_error(sim.simulate(zero, inputs).outputs, base) < 1e-14
    # another seed, another result
    other = _plan(direction, 64, 48, dropout=Dropout(0.3, seed=DROPOUT.seed + 1, offset=DROPOUT.offset), heads=2)
    assert sim.max_relative_error(sim.simulate(other, inputs).outputs, out) > 1e-2


@pytest.mark.parametrize("dropout", [None, DROPOUT], ids=["no_dropout", "dropout"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_rows_that_see_no_key(kind, dropout):
    """sim.random_mask hides every 7th query row (from row 3): O and dQ are exactly 0 there, never NaN, and
    the forward's m = −inf, l = 0, P = 0 on those rows (lse = m + log l = −inf)."""
    rows = np.arange(3, 64, 7)
    fwd = _plan("fwd", 64, 48, mask=ExplicitMask(kind, False), dropout=dropout, heads=2)
    inputs = sim.make_inputs(fwd, seed=2)
    hbm = sim.Hbm(fwd)
    # run the forward by hand to look at the intermediate rows
    for name, array in inputs.items():
        hbm.put(name, array)
    hbm.put("mask", np.broadcast_to(inputs["mask"], (fwd.bh, 64, 48)))
    for name in ("S", "P"):
        hbm.alloc(name, (fwd.bh, 64, 48))
    for name in ("m", "l"):
        hbm.alloc(name, (fwd.bh, 64))
    hbm.alloc("O", (fwd.bh, 64, 16))
    simulator._standard_fwd(hbm, reference.default_scale(16))
    a = hbm.arrays
    assert np.all(np.isneginf(a["m"][:, rows])) and np.all(a["l"][:, rows] == 0)
    assert np.all(a["P"][:, rows] == 0) and np.all(a["O"][:, rows] == 0)
    assert np.all(np.isfinite(a["P"])) and np.all(np.isfinite(a["O"]))
    assert np.all(np.isfinite(a["m"][:, :3])) and np.all(a["l"][:, :3] > 0)
    np.testing.assert_allclose(a["O"], _want(fwd, inputs)["O"], rtol=1e-10, atol=1e-13)
    bwd = _plan("bwd", 64, 48, mask=ExplicitMask(kind, False), dropout=dropout, heads=2)
    binputs = sim.make_inputs(bwd, seed=2)
    out = sim.simulate(bwd, binputs).outputs
    assert np.all(out["dQ"][:, rows] == 0)
    assert sim.max_relative_error(out, _want(bwd, binputs)) < 1e-10


def test_the_standard_backward_reads_no_mask():
    plan = _plan("bwd", 90, 70, mask=ExplicitMask("additive", False), batch=2)
    counts = sim.simulate(plan, sim.make_inputs(plan, seed=1)).counts
    assert all("mask" not in tensors for tensors in counts.values())
    assert model.exact(plan) == model.exact(_plan("bwd", 90, 70, batch=2)) == counts


# ---------------------------------------------------------------------------------------------
# the model


def test_model_expressions():
    table = model.io_exprs("standard", "default", "fwd", mask=True)
    assert table["qk"]["mask"] == (model.BH * model.N_q * model.N_k * model.e_m, 0)
    assert all("mask" not in tensors for stage, tensors in table.items() if stage != "qk")
    causal = model.io_exprs("standard", "default", "fwd", causal=True, mask=True)
    assert causal["qk"]["mask"] == (model.BH * model.N_q * model.N_k * model.e_m, 0)
    bwd = model.io_exprs("standard", "default", "bwd", mask=True)
    assert bwd == model.io_exprs("standard", "default", "bwd")
    theta = model.theta_expr("standard", "default", "fwd", mask=True) - model.theta_expr("standard", "default", "fwd")
    n = model.N
    import sympy as sp

    assert sp.simplify(theta.subs({model.N_q: n, model.N_k: n}) - model.BH * n**2 * model.e_m) == 0


def test_prediction_adds_the_mask_bytes_and_no_dropout_bytes():
    base = model.predict(_plan("fwd", 1000, 1000, d=64, sram=96 * KB, batch=2, dtype="float16"))
    plan = _plan("fwd", 1000, 1000, d=64, sram=96 * KB, batch=2, dtype="float16",
                 mask=ExplicitMask("additive", True), dropout=DROPOUT, causal=True)
    pred = model.predict(plan)
    assert pred.total_bytes - base.total_bytes == 2 * 1000 * 1000 * 4
    assert pred.stages["pv"] == base.stages["pv"]


# ---------------------------------------------------------------------------------------------
# standard and flash attention agree for one seed (the simulators; the kernels: tests/gpu)


def _flash_plan(direction, n_q, n_k, **kw):
    schedule = "q_outer" if direction == "fwd" else "kv_outer"
    try:
        return make_plan("flash", schedule, N_q=n_q, N_k=n_k, d=16, sram=8 * KB, direction=direction, **kw)
    except Unsupported as exc:
        pytest.skip(f"flash/{schedule}/{direction} has no dropout yet: {exc}")


@pytest.mark.parametrize("mask", [None, ExplicitMask("bool", False)], ids=["no_mask", "mask"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_standard_and_flash_agree_for_one_seed(direction, mask):
    flash = _flash_plan(direction, 70, 90, dropout=DROPOUT, mask=mask, heads=2)
    standard = _plan(direction, 70, 90, dropout=DROPOUT, mask=mask, heads=2)
    inputs = sim.make_inputs(standard, seed=11)  # Q, K, V, mask; the backward's P (undropped), dO
    if direction == "bwd":  # the flash backward reads O, the dropped one: D = rowsum(dO ∘ O)
        mask = sim.reference_mask(standard, inputs)
        inputs["O"] = reference.forward(inputs["Q"], inputs["K"], inputs["V"], mask=mask, dropout=_z(standard))[0]
    a, b = sim.simulate(standard, inputs).outputs, sim.simulate(flash, inputs).outputs
    assert sim.max_relative_error(a, b) < 1e-10
    assert sim.max_relative_error(a, _want(standard, inputs)) < 1e-10
