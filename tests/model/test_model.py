import math

import numpy as np
import pytest
import sympy as sp

from iokernels import model
from iokernels.model.specs import get_spec
from iokernels.plan import SCHEDULES, make_plan

KEYS = [(a, s, p) for (a, p), ss in SCHEDULES.items() for s in ss]
KB = 1024


def total(algorithm, schedule, direction="fwd", **kw):
    args = {"d": 64, "dtype": "float16", "sram": 192 * KB} | kw
    return model.predict(make_plan(algorithm, schedule, direction=direction, **args)).total_bytes


def slope(xs, ys):
    return np.polyfit(np.log(xs), np.log(ys), 1)[0]


@pytest.mark.parametrize("algorithm, schedule, direction", [
    ("flash", "kv_outer", "fwd"), ("flash", "q_outer", "fwd"), ("flash", "kv_outer", "bwd"),
    ("standard", "default", "fwd"), ("standard", "default", "bwd"),
    ("two_pass", "store", "fwd"), ("two_pass", "recompute", "fwd"),
])
def test_bytes_grow_as_n_squared(algorithm, schedule, direction):
    ns = [2**15, 2**16, 2**17]
    s = slope(ns, [total(algorithm, schedule, direction, N_q=n) for n in ns])
    assert 1.95 < s <= 2.0 + 1e-9, s


FLASH_LIKE = [("flash", "kv_outer", "fwd"), ("flash", "q_outer", "fwd"), ("flash", "kv_outer", "bwd"),
              ("two_pass", "recompute", "fwd")]


@pytest.mark.parametrize("algorithm, schedule, direction", FLASH_LIKE)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_flash_bytes_fall_as_one_over_m(algorithm, schedule, direction, dtype):
    # d <= M <= Nd: far from both ends the fixed parts of the shared-memory layout vanish and the
    # slope tends to the paper's -1 (Theorem 2)
    ms = [512 * KB, 1024 * KB, 2048 * KB, 4096 * KB]
    s = slope(ms, [total(algorithm, schedule, direction, N_q=2**17, sram=m, dtype=dtype) for m in ms])
    assert -1.05 < s < -0.95, s


@pytest.mark.parametrize("algorithm, schedule, direction", FLASH_LIKE)
def test_flash_bytes_fall_with_m_on_real_gpus(algorithm, schedule, direction):
    # at 24-192 KB the layout's fixed part (B_r rows of Q and O) makes the fall a little steeper
    ms = [24 * KB, 48 * KB, 96 * KB, 192 * KB]
    s = slope(ms, [total(algorithm, schedule, direction, N_q=2**16, sram=m) for m in ms])
    assert -1.35 < s < -0.9, s


def test_standard_bytes_do_not_depend_on_m_beyond_its_tiles():
    assert total("standard", "default", N_q=4096, sram=96 * KB) == total("standard", "default", N_q=4096,
                                                                         sram=192 * KB)


def test_flash_beats_standard_by_the_predicted_factor_at_large_n():
    # Theorem 2: standard / flash grows like (Nd + N²) / (N²d²/M) = M/d² for large N
    ratio = total("standard", "default", N_q=2**16) / total("flash", "q_outer", N_q=2**16)
    assert ratio > 3


def test_theta_constants_follow_the_schedules():
    # leading N²d²/M term (M in elements): kv_outer re-reads Q once per K/V block (4 with B_c = M/4d);
    # q_outer re-reads K and V once per Q block (2 x 4 = 8)
    lead = model.N_q * model.N_k * model.d**2 * model.e / model.M
    for key, coefficient in {("flash", "kv_outer", "fwd"): 4, ("flash", "q_outer", "fwd"): 8,
                             ("two_pass", "recompute", "fwd"): 12, ("flash", "kv_outer", "bwd"): 8}.items():
        theta = sp.expand(model.theta_expr(*key) / model.BH)
        assert theta.coeff(lead) == coefficient, key
    # Algorithm 1's O round trips travel as a float32 accumulator: 2 x 4 bytes x 4 per K/V block
    kv = sp.expand(model.theta_expr("flash", "kv_outer", "fwd") / model.BH)
    assert kv.coeff(model.N_q * model.N_k * model.d**2 / model.M) == 32 + 4 * model.e  # Oacc + Q
    standard = sp.expand(model.theta_expr("standard", "default", "fwd").subs({model.BN: 128, model.BM: 128,
                                                                           model.d: 64}) / model.BH)
    # S written, read 3x, P written and read once (d <= BN); Q, K and V re-read once per 128-wide tile
    assert standard.coeff(model.N_q * model.N_k * model.e) == 6 + 3 * sp.Rational(64, 128)
    assert not standard.has(model.M)


def test_exact_tends_to_theta():
    for algorithm, schedule, direction in KEYS:
        ratios = []
        for n in (2**14, 2**16):
            dtype = "float16" if schedule == "fast" else "float32"  # flash/fast: half precision only
            pred = model.predict(make_plan(algorithm, schedule, N_q=n, d=64, dtype=dtype, sram=192 * KB,
                                           direction=direction))
            ratios.append(pred.total_bytes / pred.theta_bytes)
        # flash/fast's tiles are its kernel's (B_r > M/4d when B_c is small), not the paper's rule
        low = 0.5 if schedule == "fast" else 0.99
        assert low < ratios[1] < 3.5, (algorithm, schedule, direction, ratios)
        assert abs(ratios[1] - ratios[0]) < 0.05 * ratios[1]


def test_exact_matches_hand_count_for_q_outer():
    # FlashAttention-2 order: Q read once, K and V once per Q block, O and lse written once
    nq, nk, d, bh = 1000, 777, 64, 6
    p = make_plan("flash", "q_outer", N_q=nq, N_k=nk, d=d, dtype="bfloat16", sram=96 * KB, batch=2, heads=3)
    tr = math.ceil(nq / p.tile["Br"])
    want = {"Q": (bh * nq * d * 2, 0), "K": (bh * nk * d * 2 * tr, 0), "V": (bh * nk * d * 2 * tr, 0),
            "O": (0, bh * nq * d * 2), "lse": (0, bh * nq * 4)}
    assert model.exact(p) == {"main": want}


def test_flops_footprint_intensity_roofline():
    h200 = get_spec("h200")
    small, large = (make_plan(a, None, N_q=n, d=64, sram=192 * KB) for a, n in (("flash", 2048), ("flash", 4096)))
    ps, pl = model.predict(small), model.predict(large)
    assert pl.flops == 4 * 4096 * 4096 * 64 == 4 * ps.flops
    assert pl.footprint_bytes == 2 * ps.footprint_bytes  # flash: O(N) extra memory
    std = [model.predict(make_plan("standard", None, N_q=n, d=64, sram=192 * KB)) for n in (2048, 4096)]
    assert std[1].footprint_bytes == pytest.approx(4 * std[0].footprint_bytes, rel=1e-3)  # O(N²)
    assert pl.intensity == pl.flops / pl.total_bytes
    t = pl.roofline_seconds(h200)
    assert t == max(pl.flops / h200.fp32_flops, pl.total_bytes / h200.hbm_bytes_per_s)
    bwd = model.predict(make_plan("flash", None, N_q=4096, d=64, sram=192 * KB, direction="bwd"))
    assert bwd.flops == 2.5 * pl.flops


@pytest.mark.parametrize("algorithm, schedule, direction", KEYS)
def test_formulas_print(algorithm, schedule, direction):
    pretty = dict(model.formulas(algorithm, schedule, direction))
    latex = dict(model.formulas(algorithm, schedule, direction, latex=True, per_tensor=True))
    assert "N_q" in pretty["read"] or "N" in pretty["read"]
    assert any(k.startswith("theta") for k in latex)
    assert any("\\" in v or "N_{q}" in v for v in latex.values())
    assert len(latex) > 3


@pytest.mark.parametrize("d", [16, 64, 256])
def test_theta_leading_term(d):
    # FlashAttention-2 order: 8·BH·N²·d²·e/M with M in elements; standard: degree 2 in N as well
    plan = make_plan("flash", "q_outer", N_q=1000, d=d, dtype="float16", sram=192 * KB, batch=2, heads=3)
    degree, coefficient = model.theta_leading(plan)
    assert degree == 2 and coefficient == pytest.approx(8 * 6 * d**2 * 2 / (192 * KB / 2))
    assert model.theta_leading(make_plan("standard", N_q=1000, d=d, sram=192 * KB))[0] == 2


def test_square_tiling_bound_meets_flash_at_m_equals_d_squared():
    d, n = 256, 2048
    for sram, below in ((64 * KB, True), (128 * KB, False), (227 * KB, False)):  # float16: d² = 128 KB
        plan = make_plan("flash", "q_outer", N_q=n, d=d, dtype="float16", sram=sram)
        m = sram / 2
        square = model.bound_bytes(model.square_tiling_expr(), plan)
        assert square == pytest.approx(2 * n * n * d / math.sqrt(m))
        bound = model.bound_bytes(model.io_lower_bound_expr(), plan)
        flash_order = 2 * n * n * d * d / m
        assert bound == pytest.approx(min(square, flash_order))
        assert (flash_order > square) == below  # below M = d² square tiling's order is the smaller
