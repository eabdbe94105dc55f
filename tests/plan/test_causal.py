"""Causal attention on the CPU: plan, the float64 reference, simulator == model byte for byte, CLI, library."""

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
    CAUSAL_ALIGNMENTS,
    DEFAULT_CAUSAL_ALIGNMENT,
    SCHEDULES,
    Plan,
    Unsupported,
    all_plans,
    causal_sums,
    make_plan,
    normalize_causal,
    supports_causal,
    visible_key_blocks,
)
from iokernels.simulate import reference

KB = 1024
RESEARCH_KEYS = [(a, s, p) for (a, p), ss in SCHEDULES.items() for s in ss if s != "fast"]


def _plan(key, n_q, n_k, causal, d=16, sram=8 * KB, **kw):
    algorithm, schedule, direction = key
    return make_plan(algorithm, schedule, N_q=n_q, N_k=n_k, d=d, sram=sram, direction=direction, causal=causal, **kw)


# ---------------------------------------------------------------------------------------------
# plan


@pytest.mark.parametrize("value, want", [
    (False, ""), (None, ""), ("", ""), (np.bool_(False), ""),
    (True, DEFAULT_CAUSAL_ALIGNMENT), (np.bool_(True), DEFAULT_CAUSAL_ALIGNMENT),
    ("bottom_right", "bottom_right"), ("bottom-right", "bottom_right"), ("Top-Left", "top_left"),
    ("top_left", "top_left"),
])
def test_normalize_causal(value, want):
    assert normalize_causal(value) == want


def test_default_alignment_is_bottom_right():
    assert DEFAULT_CAUSAL_ALIGNMENT == "bottom_right"
    assert make_plan("flash", "q_outer", N_q=10, N_k=20, d=16, sram=8 * KB, causal=True).causal_offset == 10


@pytest.mark.parametrize("value", ["diagonal", "lower", 1.5, 2, "bottom"])
def test_unknown_alignment_is_a_value_error(value):
    with pytest.raises(ValueError, match="unknown causal alignment"):
        normalize_causal(value)
    with pytest.raises(ValueError, match="unknown causal alignment"):
        make_plan("flash", "q_outer", N_q=10, d=16, sram=8 * KB, causal=value)


def test_plan_validates_its_causal_field():
    plan = make_plan("flash", "q_outer", N_q=10, d=16, sram=8 * KB)
    with pytest.raises(ValueError, match=r"Plan\.causal"):
        Plan(**{**plan.__dict__, "causal": "yes"})


@pytest.mark.parametrize("causal, code", [("top_left", 1), ("bottom_right", 2)])
@pytest.mark.parametrize("key", RESEARCH_KEYS, ids="/".join)
def test_causal_stages_carry_the_define(key, causal, code):
    plain = _plan(key, 100, 70, False)
    plan = _plan(key, 100, 70, causal)
    assert plan.causal == causal and plan.tiles == plain.tiles
    assert plan.as_dict()["causal"] == causal and "causal" not in plain.as_dict()
    masked = {"standard": {"fwd": {"qk", "rowsum", "normalize"}, "bwd": set()},
              "two_pass": {"fwd": {"stats", "output"}}, "flash": {"fwd": {"main"}, "bwd": {"main"}}}[key[0]][key[2]]
    for stage, base in zip(plan.stages, plain.stages, strict=True):
        assert (stage.name, stage.grid, stage.smem) == (base.name, base.grid, base.smem)
        want = {**dict(base.params), "CAUSAL": code} if stage.name in masked else dict(base.params)
        assert dict(stage.params) == want, stage.name
    # compile-time variety: the defines of the masked kernels differ, the others are the unmasked kernels
    refs, base_refs = plan_kernels(plan), plan_kernels(plain)
    for (stage, ref), (_, base_ref) in zip(refs, base_refs, strict=True):
        assert (ref == base_ref) == ("CAUSAL" not in dict(stage.params))


@pytest.mark.parametrize("causal", CAUSAL_ALIGNMENTS)
@pytest.mark.parametrize("n_q, n_k, heads, kv_heads", [(300, 200, 4, 2), (200, 300, 1, 1), (1, 77, 2, 1),
                                                       (77, 1, 1, 1), (129, 129, 3, 3)])
def test_fast_backward_causal_is_the_wgmma_kernel(n_q, n_k, heads, kv_heads, causal):
    """The causal tensor-core backward: the wgmma kernel with the CAUSAL define (grouped-query too); its
    bytes are the kv_outer backward's causal sums with its tiles; the mma kernels refuse the mask."""
    from iokernels.plan import with_causal
    from iokernels.plan.fast_bwd import fit_fast_backward_plan, make_fast_backward_plan

    assert supports_causal("flash", "fast", "bwd") and supports_causal("flash", "kv_outer", "bwd")
    plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=64, dtype="float16", sram=227 * KB, direction="bwd",
                     causal=causal, heads=heads, kv_heads=kv_heads)
    assert dict(plan.stage("main").params)["CAUSAL"] == (1 if causal == "top_left" else 2)
    assert plan.stage("main").kernel == "flash_tma_bwd" and plan.causal == causal
    inputs = sim.make_inputs(plan, seed=5)
    result = sim.simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    assert sim.max_relative_error(result.outputs, sim.reference_outputs(plan, inputs)) < 1e-10
    for kwargs in ({"kernel": "mma"}, {"deterministic": True}):
        with pytest.raises(Unsupported, match="causal"):
            with_causal(make_fast_backward_plan(N_q=n_q, N_k=n_k, d=64, dtype="float16", **kwargs), causal)
    with pytest.raises(Unsupported, match="causal"):
        fit_fast_backward_plan(sram=227 * KB, kernel="mma", wgmma_only=True, N_q=n_q, d=64, dtype="float16")


def test_all_plans_causal_skips_what_has_no_causal_kernel():
    plans = all_plans(N_q=256, d=64, dtype="float16", sram=227 * KB, backward=True, causal="top_left")
    labels = {p.label for p in plans}
    assert "flash/kv_outer/bwd" in labels and "flash/fast/bwd" in labels
    assert all(p.causal == "top_left" for p in plans)
    for p in plans:
        assert supports_causal(p.algorithm, p.schedule, p.direction)


def _brute_visible_blocks(n_q, n_k, br, bc, causal):
    vis = reference.causal_mask(n_q, n_k, causal)
    if vis is None:
        vis = np.ones((n_q, n_k), bool)
    out = {}
    for i, r0 in enumerate(range(0, n_q, br)):
        for j, c0 in enumerate(range(0, n_k, bc)):
            out[i, j] = bool(vis[r0:r0 + br, c0:c0 + bc].any())
    return out


@pytest.mark.parametrize("causal", ["", *CAUSAL_ALIGNMENTS])
def test_causal_sums_against_the_element_mask(causal):
    rng = random.Random(5)
    for _ in range(200):
        n_q, n_k = rng.randint(1, 120), rng.randint(1, 120)
        br, bc = rng.randint(1, 40), rng.randint(1, 40)
        pairs = _brute_visible_blocks(n_q, n_k, br, bc, causal)
        rows = [min(br, n_q - r0) for r0 in range(0, n_q, br)]
        cols = [min(bc, n_k - c0) for c0 in range(0, n_k, bc)]
        # the visible key blocks of a query block are a prefix (the skip is a loop bound)
        vis = visible_key_blocks(n_q, n_k, br, bc, causal)
        for i in range(len(rows)):
            assert [pairs[i, j] for j in range(len(cols))] == [j < vis[i] for j in range(len(cols))]
        sums = causal_sums(n_q, n_k, br, bc, causal)
        vp = [(i, j) for (i, j), v in pairs.items() if v]
        assert sums["R_K"] == sum(cols[j] for i, j in vp)
        assert sums["R_Q"] == sum(rows[i] for i, j in vp)
        assert sums["A_S"] == sum(rows[i] * cols[j] for i, j in vp)
        assert sums["N_qv"] == sum(rows[i] for i in {i for i, _ in vp})
        assert sums["N_kv"] == sum(cols[j] for j in {j for _, j in vp})


# ---------------------------------------------------------------------------------------------
# reference


def _loop_forward(q, k, v, scale, causal):
    """Row by row, only the visible keys: the definition of the mask, written out."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    off = n_k - n_q if normalize_causal(causal) == "bottom_right" else 0
    o, lse = np.zeros(q.shape), np.full(q.shape[:-1], -np.inf)
    for i in range(n_q):
        keys = [j for j in range(n_k) if j <= i + off]
        if keys:
            s = scale * np.einsum("bd,bkd->bk", q[:, i], k[:, keys])
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            o[:, i] = np.einsum("bk,bkd->bd", p / p.sum(axis=-1, keepdims=True), v[:, keys])
            lse[:, i] = np.log(np.exp(s).sum(axis=-1))
    return o, lse


@pytest.mark.parametrize("causal", [True, "bottom_right", "top_left"])
@pytest.mark.parametrize("n_q, n_k", [(7, 7), (5, 9), (9, 5), (1, 4), (4, 1)])
def test_reference_forward_is_the_mask_definition(n_q, n_k, causal):
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, n_q, 8)), rng.standard_normal((2, n_k, 8)), rng.standard_normal((2, n_k, 8))
    o, lse = reference.forward(q, k, v, causal=causal)
    want_o, want_lse = _loop_forward(q, k, v, reference.default_scale(8), causal)
    np.testing.assert_allclose(o, want_o, atol=1e-13)
    np.testing.assert_allclose(lse, want_lse, atol=1e-13)


def test_which_alignment_masks_whole_rows():
    # bottom-right with N_q > N_k: the first N_q - N_k queries see nothing; top-left never masks a row
    assert (~reference.causal_mask(9, 5, "bottom_right")).all(axis=1).tolist() == [True] * 4 + [False] * 5
    for n_q, n_k in [(9, 5), (5, 9), (6, 6)]:
        assert reference.causal_mask(n_q, n_k, "top_left").any(axis=1).all()
    assert reference.causal_mask(5, 9, "bottom_right").any(axis=1).all()


def test_fully_masked_rows_give_zero_output_minus_inf_lse_and_zero_gradients():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((9, 8)), rng.standard_normal((5, 8)), rng.standard_normal((5, 8))
    with np.errstate(all="raise"):
        o, lse = reference.forward(q, k, v, causal=True)
        dq, dk, dv = reference.backward(q, k, v, rng.standard_normal((9, 8)), causal=True)
    assert np.all(o[:4] == 0) and np.all(np.isneginf(lse[:4])) and np.all(np.isfinite(lse[4:]))
    assert np.all(dq[:4] == 0)
    assert all(np.all(np.isfinite(x)) for x in (o, dq, dk, dv))


@pytest.mark.parametrize("causal", CAUSAL_ALIGNMENTS)
def test_reference_backward_is_the_gradient(causal):
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((6, 8)), rng.standard_normal((4, 8)), rng.standard_normal((4, 8))
    do = rng.standard_normal((6, 8))
    grads = reference.backward(q, k, v, do, causal=causal)

    def loss(q, k, v):
        return float(np.sum(reference.forward(q, k, v, causal=causal)[0] * do))

    eps = 1e-6
    for g, which in zip(grads, range(3), strict=True):
        args = [q, k, v]
        num = np.zeros_like(args[which])
        for idx in np.ndindex(num.shape):
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            num[idx] = (loss(*plus) - loss(*minus)) / (2 * eps)
        np.testing.assert_allclose(g, num, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# simulator == model, simulator == reference

def _shapes(count, seed):
    rng = random.Random(seed)
    fixed = [(1, 1), (1, 37), (37, 1), (64, 64), (100, 37), (37, 100), (130, 129), (257, 3), (3, 257)]
    return fixed + [(rng.randint(1, 300), rng.randint(1, 300)) for _ in range(count)]


@pytest.mark.parametrize("causal", CAUSAL_ALIGNMENTS)
@pytest.mark.parametrize("key", RESEARCH_KEYS, ids="/".join)
def test_simulator_bytes_equal_the_model_exactly(key, causal):
    rng = random.Random(hash((key, causal)) % 1000)
    for n_q, n_k in _shapes(6, hash(key) % 100):
        d = rng.choice([16, 32])
        sram = rng.choice([6, 8, 16, 48]) * KB
        dtype = rng.choice(["float32", "float16"])
        plan = _plan(key, n_q, n_k, causal, d=d, sram=sram, dtype=dtype, batch=rng.choice([1, 2]))
        result = sim.simulate(plan, sim.make_inputs(plan, seed=n_q))
        assert result.counts == model.exact(plan), (n_q, n_k, d, sram, dtype)


@pytest.mark.parametrize("causal", CAUSAL_ALIGNMENTS)
@pytest.mark.parametrize("key", RESEARCH_KEYS, ids="/".join)
def test_simulator_matches_the_float64_reference(key, causal):
    for n_q, n_k in [(100, 37), (37, 100), (65, 65), (1, 7), (7, 1)]:
        plan = _plan(key, n_q, n_k, causal, batch=2)
        inputs = sim.make_inputs(plan, seed=3)
        with np.errstate(all="raise"):  # no NaN or inf on the way, fully masked rows included
            result = sim.simulate(plan, inputs)
        for name, x in result.outputs.items():
            assert np.all(np.isfinite(x)), name
        assert sim.max_relative_error(result.outputs, sim.reference_outputs(plan, inputs)) < 1e-12


def test_simulated_fully_masked_rows_are_zero():
    for key in RESEARCH_KEYS:
        plan = _plan(key, 90, 30, "bottom_right")
        inputs = sim.make_inputs(plan, seed=4)
        out = sim.simulate(plan, inputs).outputs
        if plan.direction == "fwd":
            assert np.all(out["O"][:, :60] == 0), key
        else:
            assert np.all(out["dQ"][:, :60] == 0), key


@pytest.mark.parametrize("key", RESEARCH_KEYS, ids="/".join)
def test_unmasked_counts_unchanged(key):
    plan = _plan(key, 100, 37, False)
    assert model.exact(plan) == sim.simulate(plan, sim.make_inputs(plan)).counts


# ---------------------------------------------------------------------------------------------
# the model: skipped blocks, Θ forms, FLOPs


@pytest.mark.parametrize("schedule, direction", [("q_outer", "fwd"), ("kv_outer", "fwd"), ("kv_outer", "bwd")])
def test_flash_causal_moves_about_half(schedule, direction):
    plain = make_plan("flash", schedule, N_q=4096, d=64, sram=192 * KB, direction=direction)
    causal = make_plan("flash", schedule, N_q=4096, d=64, sram=192 * KB, direction=direction, causal=True)
    ratio = model.predict(causal).total_bytes / model.predict(plain).total_bytes
    assert 0.5 < ratio < 0.6
    # the quadratic (block re-read) part alone is about halved; the O(N d) part stays
    theta = model.theta_expr("flash", schedule, direction, causal=True)
    theta0 = model.theta_expr("flash", schedule, direction)
    n = model.N
    lead = sp.Poly(sp.expand(theta.subs({model.N_q: n, model.N_k: n})), n).coeff_monomial(n**2)
    lead0 = sp.Poly(sp.expand(theta0.subs({model.N_q: n, model.N_k: n})), n).coeff_monomial(n**2)
    assert sp.simplify(lead / lead0) == sp.Rational(1, 2)
    assert model.theta_leading(causal)[0] == 2


def test_standard_causal_bytes_are_the_unmasked_ones():
    for direction in ("fwd", "bwd"):
        plain = make_plan("standard", N_q=300, N_k=200, d=64, sram=96 * KB, direction=direction)
        causal = make_plan("standard", N_q=300, N_k=200, d=64, sram=96 * KB, direction=direction, causal=True)
        assert model.exact(causal) == model.exact(plain)


@pytest.mark.parametrize("causal", CAUSAL_ALIGNMENTS)
def test_flops_are_halved(causal):
    for key in RESEARCH_KEYS:
        plain, masked = _plan(key, 128, 96, False), _plan(key, 128, 96, causal)
        assert 2 * model.predict(masked).flops == model.predict(plain).flops


def test_visible_area():
    n_q, n_k = model.N_q, model.N_k
    for causal, vals, want in [("top_left", {n_q: 4, n_k: 10}, 8), ("top_left", {n_q: 10, n_k: 4}, 32),
                               ("bottom_right", {n_q: 4, n_k: 10}, 32), ("bottom_right", {n_q: 10, n_k: 4}, 8)]:
        assert model.visible_area_expr(causal).subs(vals) == want
    assert model.visible_area_expr(True).subs({n_q: model.N, n_k: model.N}) == model.N**2 / 2


def test_causal_exprs_use_the_causal_symbols_and_reduce_to_the_unmasked_ones():
    for key in RESEARCH_KEYS:
        masked = model.total_exprs(*key, causal=True)
        plain = model.total_exprs(*key)
        unmasked_values = {model.R_K: model.N_k * model.T_r, model.R_Q: model.N_q * model.T_c,
                           model.A_S: model.N_q * model.N_k, model.N_qv: model.N_q, model.N_kv: model.N_k}
        for m, p in zip(masked, plain, strict=True):
            assert sp.simplify(m.subs(unmasked_values) - p) == 0


def test_formulas_show_causal_symbols():
    text = "\n".join(f for _, f in model.formulas("flash", "q_outer", "fwd", causal=True, latex=True))
    assert "R_{K}" in text and "N_{qv}" in text


# ---------------------------------------------------------------------------------------------
# CLI


def _invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_cli_compare_causal_simulated_json():
    result = _invoke("compare", "--simulate", "--Nq", "90", "--Nk", "40", "--d", "16", "--sram", "8KB",
                     "--causal", "--backward", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["header"]["causal"] == "bottom_right"
    totals = [r for r in doc["rows"] if r["tensor"] == "total"]
    assert {f"{r['algorithm']}/{r['schedule']}/{r['pass']}" for r in totals} >= {"flash/q_outer/fwd",
                                                                               "flash/kv_outer/bwd"}
    for r in totals:
        assert r["measured_bytes"] == r["predicted_bytes"]
        assert r["max_rel_err"] < 1e-12


def test_cli_causal_alignment_and_text():
    top = _invoke("model", "--Nq", "300", "--Nk", "1000", "--causal", "--causal-align", "top-left", "--json")
    bottom = _invoke("model", "--Nq", "300", "--Nk", "1000", "--causal", "--json")
    assert top.exit_code == bottom.exit_code == 0
    assert json.loads(top.stdout)["header"]["causal"] == "top_left"
    t = {r["schedule"]: r["predicted_bytes"] for r in json.loads(top.stdout)["rows"]
         if r["tensor"] == "total" and r["algorithm"] == "flash"}
    b = {r["schedule"]: r["predicted_bytes"] for r in json.loads(bottom.stdout)["rows"]
         if r["tensor"] == "total" and r["algorithm"] == "flash"}
    assert t["q_outer"] < b["q_outer"]  # top-left with N_q < N_k hides most keys
    text = _invoke("model", "--N", "512", "--causal")
    assert text.exit_code == 0 and "causal (bottom-right aligned)" in text.output and "R_K" in text.output


@pytest.mark.parametrize("args, message", [
    (["--causal", "--causal-align", "diagonal"], "unknown causal alignment 'diagonal'"),
    (["--causal-align", "top-left"], "--causal-align top-left needs --causal"),
])
def test_cli_bad_causal_options(args, message):
    result = CliRunner().invoke(cli, ["compare", "--simulate", "--N", "64", "--d", "16", "--sram", "8KB", *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_cli_sweep_causal():
    """sweep --causal: every point's simulated bytes equal the causal model; flash moves about half of its
    unmasked bytes once N spans many blocks (the visible area is N²/2); standard moves the same."""
    args = ["sweep", "--vary", "N", "--values", "128,512", "--d", "16", "--sram", "8KB", "--simulate", "--no-fit",
            "--json", "--algorithms", "flash,standard", "--schedules", "q_outer,default"]
    docs = {}
    for flag in ((), ("--causal",)):
        result = CliRunner().invoke(cli, [*args, *flag])
        assert result.exit_code == 0, result.output
        docs[bool(flag)] = json.loads(result.stdout)
    assert docs[True]["header"]["causal"] == "bottom_right" and not docs[False]["header"]["causal"]
    points = {(causal, p["algorithm"], p["value"]): p for causal, doc in docs.items() for p in doc["points"]}
    for (causal, _, _), p in points.items():
        assert p["measured_bytes"] == p["predicted_bytes"] and p["causal"] == ("bottom_right" if causal else "")
    ratio = points[True, "flash", 512]["measured_bytes"] / points[False, "flash", 512]["measured_bytes"]
    assert 0.45 < ratio < 0.7, ratio
    assert points[True, "standard", 512]["measured_bytes"] == points[False, "standard", 512]["measured_bytes"]


# ---------------------------------------------------------------------------------------------
# the tensor-core forward (flash/fast/fwd): the tma, wgmma and mma.sync kernels take the mask


@pytest.mark.parametrize("causal", CAUSAL_ALIGNMENTS)
@pytest.mark.parametrize("n_q, n_k", [(300, 200), (200, 300), (1, 77), (77, 1), (129, 129)])
def test_fast_forward_causal_plan_and_bytes(n_q, n_k, causal):
    from iokernels.plan import with_causal
    from iokernels.plan.fast import make_fast_plan

    plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=64, dtype="float16", sram=227 * KB, causal=causal,
                     heads=4, kv_heads=2)
    (stage,) = plan.stages  # without a GPU the default kernel is tma
    assert stage.kernel == "flash_tma_fwd" and dict(stage.params)["CAUSAL"] == (1 if causal == "top_left" else 2)
    inputs = sim.make_inputs(plan, seed=2)
    result = sim.simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    assert sim.max_relative_error(result.outputs, sim.reference_outputs(plan, inputs)) < 1e-12
    mma = with_causal(make_fast_plan(N_q=n_q, N_k=n_k, d=64, dtype="float16", kernel="mma"), causal)
    assert mma.stages[0].kernel == "flash_tc_fwd" and dict(mma.stages[0].params)["CAUSAL"] in (1, 2)
    assert sim.simulate(mma, sim.make_inputs(mma, seed=2)).counts == model.exact(mma)


def test_head_band_is_the_smallest_divisor_filling_the_waves():
    from iokernels.plan.fast import HEAD_BAND_WAVES, TMA_FWD_CTAS, head_band

    need = HEAD_BAND_WAVES * TMA_FWD_CTAS  # 198 blocks on the 132 SMs
    assert need == 198
    assert head_band(32, 64) == 8  # 4 heads: 128 blocks, short of 198; 8: 256
    assert head_band(64, 32) == 4  # 2: 128; 4: 256
    assert head_band(128, 16) == 2  # 1: 128; 2: 256
    assert head_band(256, 4) == 1  # one head fills the waves: each head's blocks in turn
    assert head_band(47, 48) == 6  # divisors only: 5 heads would fill them (235) but leave a short last band
    assert head_band(3, 8) == 8  # a small grid: every head in one band
    assert head_band(5, 7) == 7
    assert head_band(16, 25) == 25  # no divisor between 1 and 25: one band of 400 blocks, 3.0 waves
    assert head_band(16, 67) == 1  # a prime: one band would be 1072 blocks, 8.1 waves (the L2 lost): no bands


def test_band_params_go_to_the_causal_tma_grids_of_a_block_per_item():
    from iokernels.plan import with_causal
    from iokernels.plan.fast import make_fast_plan
    from iokernels.plan.fast_bwd import make_fast_backward_plan

    def band(plan):
        return dict(plan.stage("main").params).get("HEAD_BAND")

    kw = dict(N_q=4096, d=128, dtype="float16", batch=4, heads=16)
    per_item = dict(kw, kernel="tma", causal=True, persistent=False)  # (the forward's causal default: item_list)
    assert band(with_causal(make_fast_plan(**per_item), True)) == 8  # (32, 1, 64): 8 heads
    assert band(with_causal(make_fast_backward_plan(**kw, kernel="tma"), True)) == 8
    assert band(make_fast_plan(**kw, kernel="tma")) is None  # not causal: persistent, no band
    assert band(with_causal(make_fast_plan(**kw, kernel="tma", causal=True), True)) is None  # persistent, a list
    assert band(with_causal(make_fast_plan(**kw, kernel="tma", causal=True, persistent=True), True)) is None
    assert band(with_causal(make_fast_plan(**kw, kernel="wgmma", causal=True), True)) is None  # tma kernels only
    assert band(with_causal(make_fast_backward_plan(**kw, kernel="wgmma"), True)) is None
    long = dict(per_item, N_q=65536, batch=1, heads=4)  # 512 blocks a head: one head after another
    assert band(with_causal(make_fast_plan(**long), True)) is None
    one_row = dict(per_item, N_q=100)  # a block per head: nothing to order
    assert band(with_causal(make_fast_plan(**one_row), True)) is None


def test_variants_keep_the_bands():
    """Dropout and programmable variants (explicit masks among them) keep the causal grid's HEAD_BAND (their kernels
    take a block's head and rows from its item, as the plain causal ones do; results/h100/issue21/band/README.md);
    the plain causal forward is a persistent grid taking item_list's entries (in the bands' order), no HEAD_BAND."""
    from iokernels.plan import make_plan
    from iokernels.plan.dropout import Dropout
    from iokernels.plan.modspec import Mods

    kw = dict(N_q=4096, d=64, dtype="float16", sram=227 * 1024, batch=4, heads=16, causal="bottom_right")
    for direction in ("fwd", "bwd"):
        def band(plan):
            return dict(plan.stage("main").params).get("HEAD_BAND")
        assert band(make_plan("flash", "fast", **kw, direction=direction)) is None  # (a persistent grid's list)
        assert band(make_plan("flash", "fast", **kw, direction=direction, dropout=Dropout(0.1, 1, 0))) == 8
        assert band(make_plan("flash", "fast", **kw, direction=direction, mods=Mods(mask_mod="q_idx >= kv_idx"))) \
            == 8
