"""iokernels.plan.fast_bwd on the CPU: the tensor-core backward's plans (atomic and deterministic), the model's
exact bytes equal the simulator's counts (ragged N, N_q != N_k), outputs equal the float64 reference."""

import math

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels.sources import compile_variants
from iokernels.kernels.stages import SOURCES, plan_kernels
from iokernels.plan import SramTooSmall, Unsupported, all_plans, make_plan, min_sram
from iokernels.plan.dropout import Dropout
from iokernels.plan.fast import tile_head_dim
from iokernels.plan.fast_bwd import (
    DETERMINISTIC,
    FAST_BWD_ARGS,
    FAST_BWD_BC,
    FAST_BWD_BR,
    FAST_BWD_TUNING,
    FAST_BWD_WGMMA_TILES,
    FAST_BWD_WGMMA_TUNING,
    WGMMA_BWD_HEAD_DIMS,
    fit_fast_backward_plan,
    make_fast_backward_plan,
)
from iokernels.simulate import make_inputs, max_relative_error, reference_outputs, simulate

KB = 1024


@pytest.mark.parametrize("kernel, deterministic", [("mma", False), ("mma", True), ("wgmma", False)])
def test_plan_shapes(kernel, deterministic):
    plan = make_fast_backward_plan(N_q=1000, N_k=300, d=128, dtype="bfloat16", batch=2, heads=3,
                                   deterministic=deterministic, kernel=kernel)
    br = FAST_BWD_BR[128] if kernel == "mma" else FAST_BWD_WGMMA_TILES[128, "bfloat16"][0]
    tr, tc = math.ceil(1000 / br), math.ceil(300 / FAST_BWD_BC)
    assert plan.label == "flash/fast/bwd" + ("+deterministic" if deterministic else "")
    assert plan.variant == (DETERMINISTIC if deterministic else "")
    assert plan.tile == {"Br": br, "Bc": FAST_BWD_BC, "Tr": tr, "Tc": tc}
    assert plan.sram_bytes == plan.smem_bytes  # its effective M
    names = [(s.name, s.kernel) for s in plan.stages]
    if deterministic:
        assert names == [("dq", "flash_tc_bwd_dq"), ("dkdv", "flash_tc_bwd_dkdv")]
        assert plan.stage("dq").grid == (tr, 1, 6) and plan.stage("dq").threads == 2 * br
        assert plan.stage("dkdv").grid == (tc, 1, 6) and plan.stage("dkdv").threads == 2 * FAST_BWD_BC
        assert plan.as_dict()["variant"] == DETERMINISTIC
    else:
        main = {"mma": "flash_tc_bwd", "wgmma": "flash_wgmma_bwd"}[kernel]
        assert names == [("prep", "flash_bwd_prep"), ("main", main), ("dq", "flash_bwd_dq")]
        assert plan.stage("main").grid == (tc, 1, 6) and plan.stage("main").threads == 2 * FAST_BWD_BC
        # the research backward's prep and dq stages, unchanged
        research = make_plan("flash", "kv_outer", N_q=1000, N_k=300, d=128, dtype="bfloat16", sram=227 * KB,
                             batch=2, heads=3, direction="bwd")
        assert plan.stage("prep") == research.stage("prep") and plan.stage("dq") == research.stage("dq")
        assert "variant" not in plan.as_dict()
    for stage, ref in plan_kernels(plan):
        assert stage.kernel in SOURCES
        if ref.source in ("flash_tc_bwd.cu", "flash_wgmma_bwd.cu"):
            assert stage.kernel in FAST_BWD_ARGS
            defines = ref.define_dict
            assert (defines["BR"], defines["BC"], defines["HEAD_D"]) == (br, FAST_BWD_BC, 128)


def test_buffers_fit_a_block_of_every_variant():
    for d in (64, 128):
        for det in (False, True):
            for dtype in ("float16", "bfloat16"):
                plan = make_fast_backward_plan(N_q=4096, d=d, dtype=dtype, deterministic=det)
                assert plan.smem_bytes <= 227 * KB
    # d = 128: K, V (128 x 128), two stages of Q, dO (64 x 128), of dSᵀ (128 x 64) (mma; wgmma: one), of
    # lse and D (64 floats)
    plan = make_fast_backward_plan(N_q=4096, d=128, dtype="float16", kernel="mma")
    assert plan.stage("main").smem_bytes == 2 * 2 * 128 * 128 + 4 * 2 * 64 * 128 + 2 * 2 * 128 * 64 + 4 * 4 * 64
    plan = make_fast_backward_plan(N_q=4096, d=128, dtype="float16", kernel="wgmma")
    assert plan.stage("main").smem_bytes == 2 * 2 * 128 * 128 + 4 * 2 * 64 * 128 + 2 * 128 * 64 + 4 * 4 * 64
    # its tiles 1024-byte aligned (wgmma's 128-byte swizzle repeats every 1024 bytes)
    assert all(off % 1024 == 0 for name, off, _ in plan.stage("main").smem if name[0] != "l" and name[0] != "D")
    # d = 64: 128 query rows per step
    assert make_fast_backward_plan(N_q=4096, d=64, dtype="float16").tile["Br"] == FAST_BWD_BR[64] == 128
    assert make_fast_backward_plan(N_q=4096, d=64, dtype="float16", deterministic=True).tile["Br"] == 64


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("n_q, n_k, d, dtype, block_r, block_c", [
    (1, 1, 64, "float16", 64, 128),
    (113, 300, 128, "bfloat16", 64, 128),
    (300, 65, 64, "bfloat16", 64, 128),
    (200, 200, 64, "float16", 128, 128),
    (129, 257, 128, "float16", 64, 64),
])
def test_simulator_counts_equal_model(n_q, n_k, d, dtype, block_r, block_c, deterministic):
    plan = make_fast_backward_plan(N_q=n_q, N_k=n_k, d=d, dtype=dtype, heads=2, block_r=block_r,
                                   block_c=block_c, deterministic=deterministic)
    host = make_inputs(plan, seed=n_q + n_k)  # float64 values: D from the exact O
    run = simulate(plan, host)
    assert run.counts == model.exact(plan)
    want = reference_outputs(plan, host)
    for name, w in want.items():
        assert np.max(np.abs(run.outputs[name] - w)) < 1e-10, name


def test_exact_bytes_by_hand():
    nq, nk, d, bh, e = 1000, 777, 64, 6, 2
    for det in (False, True):
        plan = make_fast_backward_plan(N_q=nq, N_k=nk, d=d, dtype="float16", batch=2, heads=3, deterministic=det)
        tr, tc = math.ceil(nq / plan.tile["Br"]), math.ceil(nk / plan.tile["Bc"])
        kv_outer = {"K": (bh * nk * d * e, 0), "V": (bh * nk * d * e, 0), "Q": (bh * nq * d * e * tc, 0),
                    "dO": (bh * nq * d * e * tc, 0), "lse": (bh * nq * 4 * tc, 0), "D": (bh * nq * 4 * tc, 0),
                    "dK": (0, bh * nk * d * e), "dV": (0, bh * nk * d * e)}
        exact = model.exact(plan)
        if det:
            dq = {"Q": (bh * nq * d * e, 0), "K": (bh * nk * d * e * tr, 0), "V": (bh * nk * d * e * tr, 0),
                  "O": (bh * nq * d * e, 0), "lse": (bh * nq * 4, 0), "dO": (bh * nq * d * e, 0),
                  "D": (0, bh * nq * 4), "dQ": (0, bh * nq * d * e)}
            assert exact == {"dq": dq, "dkdv": kv_outer}
            assert model.predict(plan).flops == 2 * 7 * bh * nq * nk * d
            assert model.predict(plan).footprint_bytes == bh * nq * 4  # D only
        else:
            main = kv_outer | {"dQacc": (bh * nq * d * 4 * tc, bh * nq * d * 4 * tc)}
            assert exact["main"] == main and set(exact) == {"prep", "main", "dq"}
            assert model.predict(plan).flops == 2 * 5 * bh * nq * nk * d  # 2.5x the forward's


def test_theta_and_formulas():
    plan = make_fast_backward_plan(N_q=2**16, d=64, dtype="float16")
    pred = model.predict(plan)
    assert 0.99 < pred.total_bytes / pred.theta_bytes < 3.5
    assert model.theta_leading(plan)[0] == 2
    det = make_fast_backward_plan(N_q=2**16, d=64, dtype="float16", deterministic=True)
    assert model.predict(det).theta_bytes > 0 and model.theta_leading(det)[0] == 2
    rows = dict(model.formulas("flash", "fast", "bwd", variant=DETERMINISTIC, per_tensor=True))
    assert "dq dQ write" in rows and "dkdv dK write" in rows


def test_fast_is_a_backward_schedule_of_flash():
    plan = make_plan("flash", "fast", N_q=300, d=64, dtype="bfloat16", sram=227 * KB, direction="bwd")
    assert plan == make_fast_backward_plan(N_q=300, d=64, dtype="bfloat16")
    labels = [p.label for p in all_plans(N_q=300, d=128, dtype="float16", sram=227 * KB, backward=True)]
    assert "flash/fast/bwd" in labels and "flash/fast/fwd" in labels
    assert "flash/fast/bwd" not in [p.label for p in all_plans(N_q=300, d=128, sram=227 * KB, backward=True)]
    # where the default tiles do not fit in M: B_c = 64, then single-buffered query blocks
    smaller = make_plan("flash", "fast", N_q=300, d=64, dtype="bfloat16", sram=plan.smem_bytes - 1, direction="bwd")
    assert smaller.tile["Bc"] == 64 and smaller.stage("main").smem_bytes < plan.smem_bytes
    need = min_sram("flash", "fast", d=64, dtype="bfloat16", direction="bwd")
    smallest = make_plan("flash", "fast", N_q=300, d=64, dtype="bfloat16", sram=need, direction="bwd")
    assert smallest.smem_bytes == need < smaller.smem_bytes and "Q1" not in dict(
        (n, o) for n, o, _ in smallest.stage("main").smem)
    with pytest.raises(SramTooSmall, match=f"smallest M that works is {need} bytes"):
        make_plan("flash", "fast", N_q=300, d=64, dtype="bfloat16", sram=need - 1, direction="bwd")
    with pytest.raises(Unsupported):
        make_plan("flash", "fast", N_q=300, d=64, sram=192 * KB, direction="bwd")


@pytest.mark.parametrize("kwargs, message", [
    ({"d": 64, "dtype": "float32"}, "float16 or bfloat16"),
    ({"d": 96, "dtype": "float16", "kernel": "mma"}, "d in"),
    ({"d": 264, "dtype": "bfloat16"}, "from 16 to 256"),
    ({"d": 136, "dtype": "float16", "kernel": "wgmma"}, "past 128 is taken by the tma kernel"),
    ({"d": 256, "dtype": "float16", "kernel": "tma", "block_c": 128}, "has tiles"),
    ({"d": 60, "dtype": "float16", "kernel": "wgmma"}, "multiple of 8"),
    ({"d": 64, "dtype": "int8"}, "dtype"),
    ({"d": 64, "dtype": "float16", "block_r": 32}, "block_r must be one of"),
    ({"d": 64, "dtype": "float16", "block_c": 96}, "block_c must be one of"),
    ({"d": 64, "dtype": "float16", "deterministic": 1}, "deterministic must be"),
    ({"d": 64, "dtype": "float16", "q_stages": 3}, "q_stages must be 1 or 2"),
    ({"d": 64, "dtype": "float16", "ds_stages": 0}, "ds_stages must be 1 or 2"),
    ({"d": 64, "dtype": "float16", "ds_stages": 1, "kernel": "wgmma"}, "options of the mma kernel"),
    ({"d": 64, "dtype": "float16", "block_r": 128, "block_c": 64, "kernel": "mma"}, "block_r=128 > block_c=64"),
    ({"d": 32, "dtype": "float16", "block_r": 128, "block_c": 64, "kernel": "wgmma"}, "block_r=128 > block_c=64"),
    ({"d": 64, "dtype": "float16", "kernel": "wmma"}, "kernel must be one of"),
    ({"d": 64, "dtype": "float16", "kernel": "wgmma", "deterministic": True}, "deterministic=True runs the mma"),
    ({"d": 64, "dtype": "float16", "N_k": 0}, "N_k must be"),
])
def test_unsupported_problems_are_refused(kwargs, message):
    args = {"N_q": 128} | kwargs
    with pytest.raises(ValueError, match=message):
        make_fast_backward_plan(**args)


def test_float32_and_other_d_are_unsupported_not_errors():
    for kwargs in ({"d": 64, "dtype": "float32"}, {"d": 32, "dtype": "float16", "kernel": "mma"},
                   {"d": 136, "dtype": "float16", "kernel": "wgmma"}):
        with pytest.raises(Unsupported):
            make_fast_backward_plan(N_q=10, **kwargs)


def test_every_variant_is_compiled():
    names = {n for v in compile_variants("flash_tc_bwd.cu") for n in v.name_expressions}
    for kernel in ("flash_tc_bwd", "flash_tc_bwd_dkdv", "flash_tc_bwd_dq"):
        for ctype in ("__half", "__nv_bfloat16"):
            assert f"{kernel}<{ctype}>" in names
    tiles = {(v.defines["HEAD_D"], v.defines["BR"], v.defines["BC"]) for v in compile_variants("flash_tc_bwd.cu")}
    want = {(64, FAST_BWD_BR[64], FAST_BWD_BC), (128, FAST_BWD_BR[128], FAST_BWD_BC), (64, 64, 64), (128, 64, 64)}
    assert want | {(d, br, bc) for d, br, bc, _ in FAST_BWD_TUNING} <= tiles



def test_wgmma_plans_and_the_fit_order():
    """The wgmma kernel: a warpgroup per 64 keys, its default tiles per d; fit_fast_backward_plan takes its
    default tiles, then 64 x 64, then the mma kernel's, as M shrinks."""
    for (d, dtype), (br, bc) in FAST_BWD_WGMMA_TILES.items():
        plan = make_fast_backward_plan(N_q=1000, d=d, dtype=dtype, kernel="wgmma")
        assert (plan.tile["Br"], plan.tile["Bc"]) == (br, bc) and plan.stage("main").threads == 2 * bc
    problem = {"N_q": 333, "N_k": 250, "d": 128, "dtype": "float16", "heads": 2}
    got = [(p.stage("main").kernel, p.tile["Br"], p.tile["Bc"])
           for p in (fit_fast_backward_plan(sram=m * KB, kernel="wgmma", **problem) for m in (227, 140, 100))]
    assert got == [("flash_wgmma_bwd", 64, 128), ("flash_wgmma_bwd", 64, 64), ("flash_tc_bwd", 64, 64)]
    assert fit_fast_backward_plan(sram=227 * KB, kernel="mma", **problem).stage("main").kernel == "flash_tc_bwd"
    det = fit_fast_backward_plan(sram=227 * KB, deterministic=True, **problem)
    assert det.variant == DETERMINISTIC and det.stage("dkdv").kernel == "flash_tc_bwd_dkdv"


def test_every_wgmma_variant_is_compiled():
    variants = compile_variants("flash_wgmma_bwd.cu")
    names = {n for v in variants for n in v.name_expressions}
    assert names == {"flash_wgmma_bwd<__half>", "flash_wgmma_bwd<__nv_bfloat16>"}
    tiles = {(v.defines["HEAD_D"], v.defines["BR"], v.defines["BC"]) for v in variants}
    want = {(d, *tiles) for (d, _), tiles in FAST_BWD_WGMMA_TILES.items()} | {(64, 64, 64), (128, 64, 64)}
    assert want | set(FAST_BWD_WGMMA_TUNING) <= tiles


@pytest.mark.parametrize("d, tile", [(16, 64), (32, 64), (56, 64), (64, 64), (72, 128), (96, 128), (120, 128),
                                     (128, 128)])
def test_wgmma_takes_d_inside_the_next_tile(d, tile):
    """The wgmma backward takes every multiple of 8 up to 128 in the tile of the next width: shared memory and the
    default tiles are the tile's, the kernel gets the width as HEAD_D_TILE where it differs from d, the bytes are
    d's (the model; the prep and dq stages are the research ones at d)."""
    assert WGMMA_BWD_HEAD_DIMS == tuple(range(16, 129, 8)) and tile_head_dim(d) == tile
    for dropout in (False, True):
        plan = make_fast_backward_plan(N_q=239, N_k=300, d=d, dtype="bfloat16", heads=2, kernel="wgmma",
                                       dropout=dropout)
        same = make_fast_backward_plan(N_q=239, N_k=300, d=tile, dtype="bfloat16", heads=2, kernel="wgmma",
                                       dropout=dropout)
        main = plan.stage("main")
        assert plan.d == d and main.kernel == "flash_wgmma_bwd" and plan.tiles == same.tiles
        assert dict(main.params).get("HEAD_D_TILE") == (None if d == tile else tile)
        assert main.smem == same.stage("main").smem and plan.smem_bytes == same.smem_bytes
        [defines] = [ref.define_dict for s, ref in plan_kernels(plan) if s.name == "main"]
        assert defines["HEAD_D"] == d and defines.get("HEAD_D_TILE") == (None if d == tile else tile)
        for name in ("prep", "dq"):
            assert "HEAD_D_TILE" not in dict(plan.stage(name).params)
        exact, wide = model.exact(plan), model.exact(same)
        for tensor in ("Q", "K", "V", "dO", "dK", "dV", "dQacc"):  # d of the tile's columns
            assert exact["main"][tensor] == tuple(x * d // tile for x in wide["main"][tensor]), tensor


@pytest.mark.parametrize("n_q, n_k, d, causal", [(239, 300, 32, ""), (300, 129, 96, "bottom_right"),
                                                 (65, 65, 120, "top_left"), (17, 113, 16, "")])
def test_wgmma_inside_a_wider_tile_model_equals_simulator(n_q, n_k, d, causal):
    plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * KB, heads=2,
                     direction="bwd", causal=causal)
    assert plan.stage("main").kernel == "flash_tma_bwd"
    inputs = make_inputs(plan, seed=d + n_q)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    assert max_relative_error(result.outputs, reference_outputs(plan, inputs)) < 1e-10


@pytest.mark.parametrize("d", [32, 96])
def test_d_inside_a_wider_tile_is_wgmma_only(d):
    """The mma kernels (and deterministic=True, which runs them) take d 64 and 128 only: Unsupported elsewhere, and
    fit_fast_backward_plan offers no mma option for such d (its smallest plan is wgmma's 64 x 64)."""
    problem = {"N_q": 300, "N_k": 200, "d": d, "dtype": "float16"}
    for kwargs in ({"kernel": "mma"}, {"deterministic": True}, {"kernel": "wgmma", "deterministic": True}):
        with pytest.raises(Unsupported, match="inside a wider tile is taken by the sm_90 kernels"):
            make_fast_backward_plan(**problem, **kwargs)
        with pytest.raises(Unsupported, match="inside a wider tile is taken by the sm_90 kernels"):
            fit_fast_backward_plan(sram=227 * KB, **problem, **kwargs)
    kernels = {fit_fast_backward_plan(sram=m * KB, kernel="wgmma", **problem).stage("main").kernel
               for m in (227, 100, 16)}
    assert kernels == {"flash_wgmma_bwd"}
    smallest = fit_fast_backward_plan(sram=16 * KB, kernel="wgmma", **problem)
    assert (smallest.tile["Br"], smallest.tile["Bc"]) == (64, 64)
    # make_plan (the default kernel with no GPU visible is tma): with and without dropout, causal
    for kwargs in ({}, {"dropout": Dropout(0.1, 1, 0)}, {"causal": "bottom_right"}):
        plan = make_plan("flash", "fast", sram=227 * KB, direction="bwd", **problem, **kwargs)
        assert plan.stage("main").kernel == "flash_tma_bwd" and plan.d == d
    with pytest.raises(SramTooSmall):
        make_plan("flash", "fast", sram=16 * KB, direction="bwd", **problem)
    labels = [p.label for p in all_plans(**problem, sram=227 * KB, backward=True)]
    assert "flash/fast/bwd" in labels


@pytest.mark.parametrize("n_q, n_k, d, causal, kv_heads", [(239, 300, 256, "", 2), (300, 129, 136, "bottom_right", 1),
                                                           (65, 113, 192, "top_left", 2), (1, 17, 200, "", 1)])
def test_wide_tiles_past_d_128(n_q, n_k, d, causal, kv_heads):
    """Past d 128 the backward is the tma kernel's wide tiles (64 x 64, two consumer warpgroups sharing the keys,
    the tile 192 or 256 wide): make_plan picks them, with dropout and causal; its bytes are the research
    backward's with these tiles (simulator == model), its gradients the float64 reference's; the other kernels
    refuse such d."""
    plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * KB, heads=2,
                     kv_heads=kv_heads, direction="bwd", causal=causal)
    main = plan.stage("main")
    assert main.kernel == "flash_tma_bwd_wide" and (plan.tile["Br"], plan.tile["Bc"]) == (64, 64)
    assert main.threads == 384 and dict(main.params).get("HEAD_D_TILE", d) == tile_head_dim(d)
    assert {name for name, _, _ in main.smem} >= {"P0", "P1", "dS0", "dS1"} and plan.smem_bytes <= 227 * KB
    inputs = make_inputs(plan, seed=d + n_q)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    assert max_relative_error(result.outputs, reference_outputs(plan, inputs)) < 1e-10
    dropped = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="bfloat16", sram=227 * KB, heads=2,
                        direction="bwd", dropout=Dropout(0.1, 1, 0))
    assert dropped.stage("main").kernel == "flash_tma_bwd_wide"
    for kwargs in ({"kernel": "wgmma"}, {"kernel": "mma"}, {"deterministic": True}):
        with pytest.raises(Unsupported):
            make_fast_backward_plan(N_q=n_q, N_k=n_k, d=d, dtype="float16", **kwargs)
        with pytest.raises(Unsupported):  # fit_fast_backward_plan: the same error (no option is left for it)
            fit_fast_backward_plan(sram=227 * KB, N_q=n_q, N_k=n_k, d=d, dtype="float16", **kwargs)
    with pytest.raises(Unsupported, match="past 128 is taken by the tma kernel"):
        fit_fast_backward_plan(sram=227 * KB, N_q=n_q, N_k=n_k, d=d, dtype="float16", kernel="wgmma", dropout=True)


def test_wgmma_model_equals_simulator():
    plan = make_fast_backward_plan(N_q=300, N_k=200, d=64, dtype="float16", heads=2, kernel="wgmma")
    inputs = make_inputs(plan, seed=3)
    assert simulate(plan, inputs).counts == model.exact(plan)


@pytest.mark.parametrize("batch, heads, kv_heads, n_q, n_k, d", [(2, 6, 2, 300, 200, 64), (1, 8, 1, 129, 257, 128),
                                                                  (1, 4, 4, 65, 65, 64)])
def test_grouped_query_backward_model_equals_simulator(batch, heads, kv_heads, n_q, n_k, d):
    """Grouped-query attention in the wgmma backward: one block per key block of each K/V head, looping over
    its query heads, so K, V are read and dK, dV written once per K/V head (BH_kv rows); the simulator's
    counts equal the model's and its gradients (dK, dV summed over each group) equal the float64 reference."""
    plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * KB, batch=batch,
                     heads=heads, kv_heads=kv_heads, direction="bwd")
    assert plan.kv_heads == kv_heads and plan.stage("main").kernel == "flash_tma_bwd"
    assert plan.stage("main").grid[2] == batch * kv_heads and plan.stage("prep").grid[2] == batch * heads
    inputs = make_inputs(plan, seed=heads + kv_heads)
    assert inputs["K"].shape == (batch * kv_heads, n_k, d)
    result = simulate(plan, inputs)
    exact = model.exact(plan)
    assert result.counts == exact
    kv_bytes = batch * kv_heads * n_k * d * 2
    assert exact["main"]["K"] == (kv_bytes, 0) and exact["main"]["dK"] == (0, kv_bytes)
    assert exact["main"]["Q"][0] == batch * heads * n_q * d * 2 * plan.tile["Tc"]
    assert max_relative_error(result.outputs, reference_outputs(plan, inputs)) < 1e-10
    assert result.outputs["dK"].shape == (batch * kv_heads, n_k, d)


def test_grouped_query_backward_refusals():
    problem = {"N_q": 100, "d": 64, "dtype": "float16", "heads": 4, "kv_heads": 2}
    for kwargs in ({"kernel": "mma"}, {"deterministic": True}):
        with pytest.raises(Unsupported, match="grouped-query"):
            make_fast_backward_plan(**problem, **kwargs)
    with pytest.raises(ValueError, match="kv_heads must divide"):
        make_fast_backward_plan(**{**problem, "kv_heads": 3})
    with pytest.raises(Unsupported, match="grouped-query"):
        fit_fast_backward_plan(sram=227 * KB, kernel="mma", **problem)
    with pytest.raises(Unsupported, match="flash/fast only"):
        make_plan("flash", "kv_outer", N_q=100, d=64, sram=96 * KB, heads=4, kv_heads=2, direction="bwd")
