"""Block-sparse attention on the CPU: block masks, plan, simulator == model byte for byte, simulator ==
float64 reference, the model's dependence on the density, CLI and bad input."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import sympy as sp
from click.testing import CliRunner

from iokernels import model
from iokernels import simulate as sim
from iokernels.cli import cli
from iokernels.kernels.stages import plan_kernels
from iokernels.plan import (
    SCHEDULES,
    Unsupported,
    all_plans,
    make_plan,
    pair_sums,
    supports_block_sparse,
    with_block_mask,
)
from iokernels.plan.masks import PATTERNS, BlockMask, pattern
from iokernels.simulate import reference

KB = 1024
# the research schedules' (float32 problems, blocks of any size); flash/fast's: tests/plan/test_block_sparse_fast.py
SPARSE_KEYS = [(a, s, p) for (a, p), ss in SCHEDULES.items() for s in ss
               if supports_block_sparse(a, s, p) and s != "fast"]


def _plan(key, n_q, n_k, block_mask, d=16, sram=8 * KB, **kw):
    algorithm, schedule, direction = key
    return make_plan(algorithm, schedule, N_q=n_q, N_k=n_k, d=d, sram=sram, direction=direction,
                     block_mask=block_mask, **kw)


def _random_mask(n_q, n_k, block_q, block_k, density, seed):
    blocks = np.random.default_rng(seed).random((-(-n_q // block_q), -(-n_k // block_k))) < density
    return BlockMask.from_array(blocks, n_q=n_q, n_k=n_k, block_q=block_q, block_k=block_k)


# ---------------------------------------------------------------------------------------------
# block masks


def test_block_mask_round_trips_and_expands():
    mask = _random_mask(70, 50, 16, 8, 0.5, 1)
    assert mask.shape == (5, 7) and mask.blocks.dtype == bool
    elements = mask.element_mask()
    assert elements.shape == (70, 50)
    for i in range(70):
        for j in range(50):
            assert elements[i, j] == mask.blocks[i // 16, j // 8]
    assert BlockMask.from_elements(elements, block_q=16, block_k=8).blocks.tolist() == mask.blocks.tolist()
    assert mask.density == pytest.approx(mask.blocks.mean())
    assert hash(mask) == hash(BlockMask.from_array(mask.blocks, n_q=70, n_k=50, block_q=16, block_k=8))


def test_element_mask_reduced_to_blocks_keeps_any_visible_element():
    rng = np.random.default_rng(2)
    elements = rng.random((37, 29)) < 0.02
    mask = BlockMask.from_elements(elements, block_q=8, block_k=4)
    for a in range(mask.shape[0]):
        for b in range(mask.shape[1]):
            assert mask.blocks[a, b] == elements[8 * a:8 * a + 8, 4 * b:4 * b + 4].any()
    assert np.all(mask.element_mask()[elements])  # a superset of the element mask


@pytest.mark.parametrize("br, bc", [(16, 8), (8, 4), (4, 1), (1, 8)])
def test_refine_is_the_mask_on_a_finer_grid(br, bc):
    mask = _random_mask(70, 50, 16, 8, 0.4, 3)
    grid = mask.refine(br, bc)
    assert grid.shape == (-(-70 // br), -(-50 // bc))
    expanded = np.repeat(np.repeat(grid, br, axis=0), bc, axis=1)[:70, :50]
    np.testing.assert_array_equal(expanded, mask.element_mask())
    with pytest.raises(ValueError, match="do not divide"):
        mask.refine(3, 8)


@pytest.mark.parametrize("kind", PATTERNS)
@pytest.mark.parametrize("density", [0.1, 0.25, 0.5, 1.0])
def test_patterns_have_about_the_density(kind, density):
    mask = pattern(kind, density, n_q=2048, n_k=2048, block_q=64, seed=4)
    assert mask.shape == (32, 32)
    assert abs(mask.density - density) <= 0.04
    if kind == "local":  # every row has the same window
        assert len(set(mask.blocks.sum(axis=1).tolist())) == 1
        assert mask.blocks[np.arange(32), np.arange(32)].all()
    if kind == "random":
        assert mask.blocks.sum() == round(density * 32 * 32)
        assert pattern(kind, density, n_q=2048, n_k=2048, block_q=64, seed=4) == mask
        assert density == 1.0 or pattern(kind, density, n_q=2048, n_k=2048, block_q=64, seed=5) != mask


@pytest.mark.parametrize("bad, message", [
    ({"density": 0.0}, "density must be in"), ({"density": 1.5}, "density must be in"),
    ({"density": -0.1}, "density must be in"), ({"kind": "butterfly"}, "unknown block pattern"),
    ({"block_q": 0}, "block size must be an integer"),
])
def test_pattern_bad_input(bad, message):
    args = {"kind": "local", "density": 0.5, "n_q": 100, "n_k": 100, "block_q": 16, **bad}
    with pytest.raises(ValueError, match=message):
        pattern(args.pop("kind"), args.pop("density"), **args)


def test_block_mask_bad_input():
    with pytest.raises(TypeError, match="boolean"):
        BlockMask.from_array(np.ones((2, 2), dtype=np.float32), n_q=32, n_k=32, block_q=16, block_k=16)
    with pytest.raises(ValueError, match="expected \\(2, 3\\)"):
        BlockMask.from_array(np.ones((2, 2), bool), n_q=32, n_k=40, block_q=16, block_k=16)
    with pytest.raises(ValueError, match="must hold 4 bytes"):
        BlockMask(32, 32, 16, 16, b"\x01\x00\x03\x01")  # (2: a full block of a mask_mod, allowed)


# ---------------------------------------------------------------------------------------------
# plan


@pytest.mark.parametrize("key", SPARSE_KEYS, ids="/".join)
def test_block_sparse_plan_tiles_divide_the_blocks_and_carry_the_define(key):
    mask = _random_mask(300, 200, 48, 32, 0.5, 5)
    plain = _plan(key, 300, 200, None, sram=16 * KB)
    plan = _plan(key, 300, 200, mask, sram=16 * KB)
    tile = plan.tile
    assert 48 % tile["Br"] == 0 and 32 % tile["Bc"] == 0
    assert tile["Br"] <= plain.tile["Br"] and tile["Bc"] <= plain.tile["Bc"]
    assert plan.block_mask == mask and plan.as_dict()["block_mask"]["density"] == mask.density
    assert plan.block_grid().shape == (tile["Tr"], tile["Tc"])
    sparse = {"flash": {"main"}, "two_pass": {"stats", "output"}}[key[0]]
    for stage in plan.stages:
        assert ("BLOCK_SPARSE" in dict(stage.params)) == (stage.name in sparse), stage.name
    # the sparse stages are kernels of their own; the others are the unmasked ones
    forced = _plan(key, 300, 200, None, sram=16 * KB, block_r=tile["Br"], block_c=tile["Bc"])
    for (stage, ref), (_, base) in zip(plan_kernels(plan), plan_kernels(forced), strict=True):
        assert (ref == base) == (stage.name not in sparse)


def test_block_sparse_unsupported_and_bad_input():
    mask = _random_mask(256, 256, 64, 64, 0.5, 6)
    for algorithm, schedule, direction in [("standard", None, "fwd"), ("standard", None, "bwd")]:
        with pytest.raises(Unsupported, match="standard attention computes all of S"):
            make_plan(algorithm, schedule, N_q=256, d=16, sram=8 * KB, direction=direction, block_mask=mask)
    for direction in ("fwd", "bwd"):
        with pytest.raises(Unsupported, match="tiles divide blocks of a multiple of 128, not the block mask's 64x64"):
            make_plan("flash", "fast", N_q=256, d=64, dtype="float16", sram=227 * KB, direction=direction,
                      block_mask=mask)
    with pytest.raises(ValueError, match="N_q=256, N_k=256 given to a problem with N_q=200"):
        make_plan("flash", "q_outer", N_q=200, N_k=256, d=16, sram=8 * KB, block_mask=mask)
    with pytest.raises(ValueError, match="block_r=48 does not divide"):
        make_plan("flash", "q_outer", N_q=256, d=16, sram=64 * KB, block_mask=mask, block_r=48)
    with pytest.raises(TypeError, match="BlockMask"):
        make_plan("flash", "q_outer", N_q=256, d=16, sram=8 * KB, block_mask=np.ones((4, 4), bool))
    plan = make_plan("flash", "q_outer", N_q=256, d=16, sram=8 * KB, block_r=3, block_c=5)
    with pytest.raises(ValueError, match="do not divide"):
        with_block_mask(plan, mask)
    labels = {p.label for p in all_plans(N_q=256, d=64, dtype="float16", sram=227 * KB, backward=True,
                                         block_mask=mask)}
    assert labels == {"/".join(k) for k in SPARSE_KEYS}
    assert supports_block_sparse("flash", "fast", "fwd") and not supports_block_sparse("standard", "default", "fwd")


@pytest.mark.parametrize("causal", ["", "top_left", "bottom_right"])
def test_pair_sums_against_the_element_masks(causal):
    rng = random.Random(7)
    for _ in range(60):
        n_q, n_k = rng.randint(1, 150), rng.randint(1, 150)
        mask = _random_mask(n_q, n_k, rng.choice([8, 16, 24]), rng.choice([8, 16]), rng.random(), rng.randint(0, 99))
        plan = make_plan("flash", "q_outer", N_q=n_q, N_k=n_k, d=16, sram=rng.choice([4, 8]) * KB, causal=causal,
                         block_mask=mask)
        br, bc = plan.tile["Br"], plan.tile["Bc"]
        vis = mask.element_mask()
        cmask = reference.causal_mask(n_q, n_k, causal)
        full = vis if cmask is None else vis & cmask
        pairs, visited = {}, 0
        for i, r0 in enumerate(range(0, n_q, br)):
            for j, c0 in enumerate(range(0, n_k, bc)):
                pairs[i, j] = bool(full[r0:r0 + br, c0:c0 + bc].any())
                visited += cmask is None or bool(cmask[r0:r0 + br, c0:c0 + bc].any())
        rows = [min(br, n_q - r0) for r0 in range(0, n_q, br)]
        cols = [min(bc, n_k - c0) for c0 in range(0, n_k, bc)]
        kept = [(i, j) for (i, j), v in pairs.items() if v]
        sums = pair_sums(plan)
        assert sums["R_K"] == sum(cols[j] for _, j in kept)
        assert sums["R_Q"] == sum(rows[i] for i, _ in kept)
        assert sums["A_S"] == sum(rows[i] * cols[j] for i, j in kept)
        assert sums["N_qv"] == sum(rows[i] for i in {i for i, _ in kept})
        assert sums["N_kv"] == sum(cols[j] for j in {j for _, j in kept})
        assert sums["N_bm"] == visited


# ---------------------------------------------------------------------------------------------
# simulator == model, simulator == reference


@pytest.mark.parametrize("causal", ["", "top_left", "bottom_right"])
@pytest.mark.parametrize("key", SPARSE_KEYS, ids="/".join)
def test_simulator_bytes_equal_the_model_exactly(key, causal):
    rng = random.Random(hash((key, causal)) % 1000)
    shapes = [(1, 1), (1, 77), (77, 1), (128, 128), (100, 37), (37, 100), (257, 3)]
    shapes += [(rng.randint(1, 250), rng.randint(1, 250)) for _ in range(5)]
    for n_q, n_k in shapes:
        kind = rng.choice(PATTERNS)
        mask = pattern(kind, rng.choice([0.1, 0.3, 0.6, 1.0]), n_q=n_q, n_k=n_k, block_q=rng.choice([16, 32, 48]),
                       block_k=rng.choice([16, 32]), seed=rng.randint(0, 9))
        plan = _plan(key, n_q, n_k, mask, d=rng.choice([16, 32]), sram=rng.choice([6, 8, 16]) * KB,
                     dtype=rng.choice(["float32", "float16"]), batch=rng.choice([1, 2]), causal=causal)
        result = sim.simulate(plan, sim.make_inputs(plan, seed=n_q))
        assert result.counts == model.exact(plan), (n_q, n_k, kind)


@pytest.mark.parametrize("causal", ["", "bottom_right"])
@pytest.mark.parametrize("key", SPARSE_KEYS, ids="/".join)
def test_simulator_matches_the_float64_reference(key, causal):
    for n_q, n_k, kind in [(100, 37, "random"), (37, 100, "strided"), (130, 130, "local"), (1, 7, "random")]:
        mask = pattern(kind, 0.4, n_q=n_q, n_k=n_k, block_q=16, seed=8)
        plan = _plan(key, n_q, n_k, mask, batch=2, causal=causal)
        inputs = sim.make_inputs(plan, seed=3)
        with np.errstate(all="raise"):  # no NaN or inf on the way, rows with no kept block included
            result = sim.simulate(plan, inputs)
        for name, x in result.outputs.items():
            assert np.all(np.isfinite(x)), name
        assert sim.max_relative_error(result.outputs, sim.reference_outputs(plan, inputs)) < 1e-10


@pytest.mark.parametrize("key", SPARSE_KEYS, ids="/".join)
def test_rows_with_no_kept_block_are_zero_and_load_nothing(key):
    blocks = np.ones((4, 4), bool)
    blocks[1] = False  # query rows 32..63 see no key
    mask = BlockMask.from_array(blocks, n_q=128, n_k=128, block_q=32, block_k=32)
    plan = _plan(key, 128, 128, mask)
    inputs = sim.make_inputs(plan, seed=4)
    out = sim.simulate(plan, inputs).outputs
    rows = slice(32, 64)
    assert np.all(out["O" if plan.direction == "fwd" else "dQ"][:, rows] == 0)
    if plan.direction == "fwd":
        _, lse = reference.forward(inputs["Q"], inputs["K"], inputs["V"], mask=mask.element_mask())
        assert np.all(np.isneginf(lse[:, rows])) and np.all(np.isfinite(lse[:, :32]))
    # a column of zero blocks: nothing of those keys is read, dK = dV = 0 there
    blocks = np.ones((4, 4), bool)
    blocks[:, 2] = False
    plan = _plan(key, 128, 128, BlockMask.from_array(blocks, n_q=128, n_k=128, block_q=32, block_k=32))
    inputs = sim.make_inputs(plan, seed=5)
    dense = _plan(key, 128, 128, None, block_r=plan.tile["Br"], block_c=plan.tile["Bc"])
    counts, base = model.per_tensor(model.exact(plan)), model.per_tensor(model.exact(dense))
    assert counts["V"][0] < base["V"][0]
    if plan.direction == "bwd":
        out = sim.simulate(plan, inputs).outputs
        assert np.all(out["dK"][:, 64:96] == 0) and np.all(out["dV"][:, 64:96] == 0)


@pytest.mark.parametrize("key", SPARSE_KEYS, ids="/".join)
def test_a_full_mask_moves_the_unmasked_bytes_plus_the_mask(key):
    mask = pattern("local", 1.0, n_q=200, n_k=150, block_q=32, block_k=16)
    assert mask.density == 1.0
    plan = _plan(key, 200, 150, mask, batch=3)
    dense = _plan(key, 200, 150, None, batch=3, block_r=plan.tile["Br"], block_c=plan.tile["Bc"])
    got, want = model.exact(plan), model.exact(dense)
    tile = plan.tile
    for stage, tensors in got.items():
        rest = {t: rw for t, rw in tensors.items() if t != "block_mask"}
        assert rest == want[stage]
        if "block_mask" in tensors:  # one byte per pair, per batch*head
            assert tensors["block_mask"] == (3 * tile["Tr"] * tile["Tc"], 0)


# ---------------------------------------------------------------------------------------------
# the model: bytes and FLOPs follow the density, Θ(Nd + N²d²M⁻¹s)


@pytest.mark.parametrize("schedule, direction, streamed", [("q_outer", "fwd", "K"), ("kv_outer", "fwd", "Q"),
                                                           ("kv_outer", "bwd", "Q")])
def test_block_reads_scale_with_the_density(schedule, direction, streamed):
    kw = dict(N_q=4096, d=64, sram=192 * KB, direction=direction)
    dense = make_plan("flash", schedule, block_mask=pattern("local", 1.0, n_q=4096, n_k=4096), **kw)
    base = model.per_tensor(model.exact(dense))[streamed][0]
    for density in (0.125, 0.25, 0.5):
        plan = make_plan("flash", schedule, block_mask=pattern("local", density, n_q=4096, n_k=4096), **kw)
        assert plan.tiles == dense.tiles
        pred = model.predict(plan)
        # the streamed operand is re-read once per kept pair: exactly the kept fraction of the pairs
        assert model.per_tensor(pred.stages)[streamed][0] / base == pytest.approx(plan.block_mask.density)
        assert pred.flops / model.predict(dense).flops == pytest.approx(plan.block_mask.density)
        assert pred.total_bytes < model.predict(dense).total_bytes
    theta = model.theta_expr("flash", schedule, direction, block_sparse=True)
    assert model.s_density in theta.free_symbols
    n = model.N
    poly = sp.Poly(sp.expand(theta.subs({model.N_q: n, model.N_k: n})), n)
    lead = poly.coeff_monomial(n**2)  # Θ(N²d²M⁻¹s): the quadratic term is proportional to s (and the mask's bytes)
    dense_lead = sp.Poly(sp.expand(model.theta_expr("flash", schedule, direction).subs(
        {model.N_q: n, model.N_k: n})), n).coeff_monomial(n**2)
    mask_bytes = (model.BH_kv if direction == "bwd" else model.BH) / (model.B_r * model.B_c)  # (per K/V head)
    assert sp.simplify(lead - model.s_density * dense_lead - mask_bytes.subs(
        model.ideal_tiles("flash", schedule, direction))) == 0


def test_theta_follows_the_exact_bytes_in_the_density():
    """The Θ form takes the paper's tiles (M/4d), not the divisors of the mask's blocks the plan uses, so
    its value is off by their ratio; its dependence on s follows the exact bytes."""
    preds = {density: model.predict(make_plan("flash", "q_outer", N_q=8192, d=64, sram=192 * KB,
                                              block_mask=pattern("random", density, n_q=8192, n_k=8192, seed=1)))
             for density in (0.25, 1.0)}
    exact_ratio = preds[0.25].total_bytes / preds[1.0].total_bytes
    theta_ratio = preds[0.25].theta_bytes / preds[1.0].theta_bytes
    assert 0.25 < exact_ratio < 0.4
    assert theta_ratio == pytest.approx(exact_ratio, rel=0.1)


def test_formulas_show_the_block_sparse_symbols():
    text = "\n".join(f for _, f in model.formulas("flash", "q_outer", "fwd", block_sparse=True, latex=True))
    assert "N_{bm}" in text and "R_{K}" in text and "s" in text


# ---------------------------------------------------------------------------------------------
# CLI


def _invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_cli_compare_block_sparse_simulated_json():
    result = _invoke("compare", "--simulate", "--Nq", "300", "--Nk", "200", "--d", "16", "--sram", "8KB",
                     "--block-sparse", "0.3", "--block-pattern", "random", "--block-seed", "3", "--block-size", "32",
                     "--causal", "--backward", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    header = doc["header"]
    assert header["block_mask"]["block_q"] == 32 and header["block_mask"]["label"].startswith("random")
    assert header["causal"] == "bottom_right"
    totals = [r for r in doc["rows"] if r["tensor"] == "total"]
    assert {f"{r['algorithm']}/{r['schedule']}/{r['pass']}" for r in totals} == {"/".join(k) for k in SPARSE_KEYS}
    for r in totals:
        assert r["measured_bytes"] == r["predicted_bytes"]
        assert r["max_rel_err"] < 1e-10
    assert any(r["tensor"] == "block_mask" and r["measured_read_bytes"] > 0 for r in doc["rows"])


def test_cli_model_block_sparse_text():
    result = _invoke("model", "--N", "4096", "--block-sparse", "0.25", "--detail")
    assert result.exit_code == 0, result.output
    assert "block-sparse local(density=0.25)" in result.output and "N_bm" in result.output
    dense = json.loads(_invoke("model", "--N", "4096", "--json").stdout)
    sparse = json.loads(_invoke("model", "--N", "4096", "--block-sparse", "0.25", "--json").stdout)
    q = {(d["rows"][i]["schedule"]): d["rows"][i]["predicted_bytes"] for d in (dense,) for i in range(len(d["rows"]))
         if d["rows"][i]["tensor"] == "total" and d["rows"][i]["algorithm"] == "flash"}
    qs = {r["schedule"]: r["predicted_bytes"] for r in sparse["rows"]
          if r["tensor"] == "total" and r["algorithm"] == "flash"}
    assert qs["q_outer"] < 0.5 * q["q_outer"]


@pytest.mark.parametrize("args, message", [
    (["--block-sparse", "0"], "density must be in (0, 1], got 0.0"),
    (["--block-sparse", "1.5"], "density must be in (0, 1], got 1.5"),
    (["--block-sparse", "0.5", "--block-pattern", "butterfly"], "unknown block pattern 'butterfly'"),
    (["--block-pattern", "random"], "--block-pattern needs --block-sparse DENSITY"),
    (["--block-seed", "3"], "--block-seed needs --block-sparse DENSITY"),
    (["--block-sparse", "0.5", "--block-size", "0"], "block size must be an integer >= 1, got 0"),
])
def test_cli_bad_block_sparse_options(args, message):
    result = CliRunner().invoke(cli, ["compare", "--simulate", "--N", "64", "--d", "16", "--sram", "8KB", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_cli_sweep_density_simulated():
    pytest.importorskip("scipy")
    result = _invoke("sweep", "--vary", "density", "--values", "0.125,0.25,0.5,1", "--N", "512", "--d", "16",
                     "--sram", "8KB", "--block-size", "32", "--block-pattern", "strided", "--simulate", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["header"]["block_sparse"] == {"density": None, "pattern": "strided", "seed": 0, "block_size": 32}
    by_plan: dict = {}
    for p in doc["points"]:
        assert p["algorithm"] == "flash" and p["measured_bytes"] == p["predicted_bytes"]
        assert p["block_density"] == pytest.approx(p["value"], abs=0.07)
        by_plan.setdefault(p["schedule"], []).append(p["measured_bytes"])
    for measured in by_plan.values():  # more kept blocks, more bytes
        assert measured == sorted(measured) and measured[0] < measured[-1] / 3
    for f in doc["fits"]:  # the quadratic part is ∝ s, the O(Nd) part is not: a slope a little under 1
        assert 0.6 < f["exponent"] < 1.0
        assert f["model_exponent"] == pytest.approx(f["exponent"])


@pytest.mark.parametrize("args, message", [
    (["--vary", "density", "--values", "0,0.5"], "density must be in (0, 1], got 0.0"),
    (["--vary", "density", "--values", "0.5", "--block-sparse", "0.5"], "--vary density sets the density"),
    (["--vary", "N", "--values", "64,128", "--block-pattern", "local"], "--block-pattern needs --block-sparse"),
])
def test_cli_sweep_bad_density(args, message):
    result = CliRunner().invoke(cli, ["sweep", "--N", "64", "--d", "16", "--sram", "8KB", "--simulate", "--no-fit",
                                      *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_cli_sweep_n_with_a_fixed_density():
    result = _invoke("sweep", "--vary", "N", "--values", "128,256", "--d", "16", "--sram", "8KB", "--algorithms",
                     "flash", "--block-sparse", "0.5", "--block-size", "32", "--simulate", "--no-fit", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["header"]["block_sparse"]["density"] == 0.5
    assert all(p["block_density"] == 0.5 and p["measured_bytes"] == p["predicted_bytes"] for p in doc["points"])
