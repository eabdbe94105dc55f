"""Dropout in the tensor-core path flash/fast (issue #6), on the CPU: its plans (the wgmma kernels only; the
mma.sync kernels and the deterministic backward refuse it), the model's bytes unchanged, the simulator's
outputs equal the float64 reference with the same dropout multipliers, and the NVRTC compile of the dropout
wgmma variants for sm_90a (both builds, with and without the causal mask, float16 and bfloat16, d 64 and 128)."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels.sources import CompileVariant
from iokernels.plan import Unsupported, make_plan, supports_dropout, with_causal, with_dropout
from iokernels.plan.dropout import Dropout
from iokernels.plan.fast import (
    FAST_DTYPES,
    FAST_HEAD_DIMS,
    TMA_DROPOUT_TILES,
    TMA_FALLBACK,
    WGMMA_FALLBACK,
    make_fast_plan,
    make_fast_plan_within,
)
from iokernels.plan.fast_bwd import (
    FAST_BWD_WGMMA_DROPOUT_TILES,
    FAST_BWD_WGMMA_FALLBACK,
    fit_fast_backward_plan,
    make_fast_backward_plan,
)
from iokernels.simulate import make_inputs, max_relative_error, reference_outputs, simulate

from ..kernels.nvrtc_variants import needs_nvrtc, plan_variants

KB = 1024
DROPOUT = Dropout(0.25, seed=0x1234_5678_9ABC, offset=5)


def _fast(direction, **kw):
    problem = {"N_q": 300, "N_k": 200, "d": 64, "dtype": "float16", "sram": 227 * KB, **kw}
    return make_plan("flash", "fast", direction=direction, dropout=DROPOUT, **problem)


def test_fast_plans_take_dropout():
    assert supports_dropout("flash", "fast", "fwd") and supports_dropout("flash", "fast", "bwd")
    fwd, bwd = _fast("fwd"), _fast("bwd")
    assert fwd.stage("main").kernel == "flash_tma_fwd" and bwd.stage("main").kernel == "flash_tma_bwd"
    for plan in (fwd, bwd):
        assert plan.dropout == DROPOUT
        assert dict(plan.stage("main").params)["DROPOUT"] == 1
        assert all("DROPOUT" not in dict(s.params) for s in plan.stages if s.name != "main")  # prep, dq
    # the backward's dropout tiles (B_r = 64: the dropout build at d = 64, B_r = 128 would spill)
    for d in FAST_HEAD_DIMS:
        for dtype in FAST_DTYPES:
            plan = _fast("bwd", d=d, dtype=dtype)
            assert (plan.tile["Br"], plan.tile["Bc"]) == FAST_BWD_WGMMA_DROPOUT_TILES[d, dtype]
            # the forward's: tma's dropout tiles (d = 128: B_c = 64, whose counting build does not spill)
            fwd = _fast("fwd", d=d, dtype=dtype)
            assert (fwd.tile["Br"], fwd.tile["Bc"]) == TMA_DROPOUT_TILES[d]


@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_dropout_combines_with_causal_and_grouped_query(direction, causal):
    plan = _fast(direction, causal=causal, batch=2, heads=4, kv_heads=2)
    params = dict(plan.stage("main").params)
    assert params["DROPOUT"] == 1 and ("CAUSAL" in params) == bool(causal)
    assert plan.kv_heads == 2


def test_bytes_do_not_change():
    for direction in ("fwd", "bwd"):
        plan = _fast(direction, causal=True)
        undropped = replace(plan, dropout=None, stages=tuple(
            replace(s, params=tuple(p for p in s.params if p[0] != "DROPOUT")) for s in plan.stages))
        assert model.exact(plan) == model.exact(undropped)


def test_mma_kernels_refuse_dropout():
    with pytest.raises(Unsupported, match="wgmma"):
        with_dropout(make_fast_plan(N_q=100, d=64, dtype="float16", kernel="mma"), DROPOUT)
    with pytest.raises(Unsupported, match="wgmma"):
        with_dropout(make_fast_backward_plan(N_q=100, d=64, dtype="float16", kernel="mma"), DROPOUT)
    with pytest.raises(Unsupported):
        with_dropout(make_fast_backward_plan(N_q=100, d=64, dtype="float16", deterministic=True), DROPOUT)
    with pytest.raises(Unsupported, match="wgmma"):
        make_fast_backward_plan(N_q=100, d=64, dtype="float16", kernel="mma", dropout=True)
    with pytest.raises(Unsupported, match="wgmma"):
        make_fast_backward_plan(N_q=100, d=64, dtype="float16", deterministic=True, dropout=True)
    with pytest.raises(Unsupported, match="wgmma"):
        fit_fast_backward_plan(sram=227 * KB, kernel="mma", dropout=True, N_q=100, d=64, dtype="float16")
    with pytest.raises(Unsupported, match="wgmma"):
        make_fast_plan_within(227 * KB, dropout=True, kernel="mma", N_q=100, d=64, dtype="float16")


def test_make_plan_never_falls_back_to_mma_with_dropout():
    """Where M is too small for the wgmma tiles, make_plan would take the mma kernel; with dropout it says
    SramTooSmall instead (the mma kernels have no dropout)."""
    for direction in ("fwd", "bwd"):
        for sram in (227 * KB, 120 * KB, 100 * KB, 80 * KB):
            try:
                plan = _fast(direction, d=128, sram=sram)
            except ValueError as exc:
                assert not isinstance(exc, Unsupported), exc
                plain = make_plan("flash", "fast", N_q=300, N_k=200, d=128, dtype="float16", sram=sram,
                                  direction=direction)
                assert plain.stage("main").kernel.startswith("flash_tc")  # only the mma kernel would fit
                continue
            assert not plan.stage("main").kernel.startswith("flash_tc")  # an sm_90 kernel


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("causal", [False, "top_left"])
def test_simulator_equals_reference_with_the_same_mask(direction, causal):
    plan = _fast(direction, N_q=150, N_k=260, causal=causal, batch=1, heads=4, kv_heads=2)
    inputs = make_inputs(plan, seed=3)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    want = reference_outputs(plan, inputs)
    assert max_relative_error(result.outputs, want) < 1e-12
    # ... and dropout changed them
    undropped = reference_outputs(make_plan("flash", "fast", N_q=150, N_k=260, d=64, dtype="float16", sram=227 * KB,
                                            batch=1, heads=4, kv_heads=2, causal=causal, direction=direction), inputs)
    assert max_relative_error(result.outputs, undropped) > 1e-3


# ---------------------------------------------------------------------------------------------
# NVRTC: the dropout variants of the wgmma kernels (sm_90a), what make_plan takes for d 64 and 128, float16
# and bfloat16 (one module each), with and without the causal mask, and the smaller tiles it falls back to.

def _compile_plans() -> list:
    plans = []
    for d in FAST_HEAD_DIMS:
        for dtype in FAST_DTYPES:
            for causal in (False, "bottom_right"):
                for direction in ("fwd", "bwd"):
                    plans.append(_fast(direction, d=d, dtype=dtype, causal=causal))
            for direction in ("fwd", "bwd"):  # d inside a wider tile (the tma kernels): 32 and 96
                plans.append(_fast(direction, d=d - 32, dtype=dtype))
            plans.append(_fast("bwd", d=d + 128, dtype=dtype))  # the tma backward's wide tiles: d 192, 256
            for causal in (False, "bottom_right"):  # the wgmma backward's, as the tma backward's above
                for dd in (d, d - 32):
                    plans.append(with_dropout(with_causal(make_fast_backward_plan(
                        N_q=300, N_k=200, d=dd, dtype=dtype, kernel="wgmma", dropout=True), causal), DROPOUT))
            # make_plan's smaller fallbacks (forward B_c = 64, tma's and wgmma's; backward 64 x 64)
            plans.append(with_dropout(make_fast_plan(N_q=300, d=d, dtype=dtype, kernel="tma", **TMA_FALLBACK), DROPOUT))
            plans.append(with_dropout(make_fast_plan(N_q=300, d=d, dtype=dtype, kernel="wgmma", **WGMMA_FALLBACK),
                                      DROPOUT))
            plans.append(with_dropout(make_fast_backward_plan(N_q=300, d=d, dtype=dtype, kernel="wgmma", dropout=True,
                                                              **FAST_BWD_WGMMA_FALLBACK), DROPOUT))
    return plans


@functools.cache
def dropout_variants() -> dict[str, list[CompileVariant]]:
    return plan_variants(_compile_plans(), "DROPOUT")


def test_dropout_variants_cover_the_sm90_kernels():
    variants = dropout_variants()
    assert set(variants) == {"flash_tma.cu", "flash_wgmma.cu", "flash_tma_bwd.cu", "flash_wgmma_bwd.cu"}
    for source, vs in variants.items():
        if source != "flash_wgmma.cu":  # the wgmma forward: make_plan's fallback tiles only, without the mask
            assert any("CAUSAL" in v.defines for v in vs) and any("CAUSAL" not in v.defines for v in vs)
        # d inside a wider tile: the tma forward's and both backwards'
        wider = {32, 96} if source in ("flash_tma.cu", "flash_tma_bwd.cu", "flash_wgmma_bwd.cu") else set()
        wider |= {192, 256} if source == "flash_tma_bwd.cu" else set()  # its wide tiles
        assert {v.defines["HEAD_D"] for v in vs} == set(FAST_HEAD_DIMS) | wider
        assert all(len(v.name_expressions) == 2 for v in vs)  # float16 and bfloat16
    assert sum(len(vs) for vs in variants.values()) <= 36  # a few dozen compiles in all


@needs_nvrtc
def test_plain_builds_without_dropout_have_no_philox():
    """The DROPOUT code is all under #ifdef: the ordinary build of the wgmma forward has no Philox (its
    multiplier 0xD2511F53, its mul.hi) in its PTX, the dropout build has it."""
    from iokernels.kernels.nvrtc import compile_to_cubin
    from iokernels.kernels.sources import build_source

    source, variants = "flash_wgmma.cu", dropout_variants()["flash_wgmma.cu"]
    v = variants[0]
    plain = {k: x for k, x in v.defines.items() if k != "DROPOUT"}
    ptx = {name: compile_to_cubin(build_source(source, defines, False), arch="sm_90a", name=source,
                                  name_expressions=v.name_expressions[:1]).ptx
           for name, defines in (("plain", plain), ("dropout", v.defines))}
    assert "mul.hi.u32" not in ptx["plain"] and "-766435501" not in ptx["plain"]  # 0xD2511F53 as a signed int
    assert "mul.hi.u32" in ptx["dropout"] and "-766435501" in ptx["dropout"]


def test_dropout_multipliers_are_those_of_the_module():
    """The GPU tests compare against Dropout.full_multiplier; spot-check it against the keep rule."""
    z = DROPOUT.full_multiplier(2, 5, 9)
    kept = DROPOUT.keep(np.arange(2)[:, None, None], np.arange(5)[None, :, None], np.arange(9)[None, None, :])
    assert np.array_equal(z > 0, kept) and np.all(z[kept] == DROPOUT.keep_scale)
