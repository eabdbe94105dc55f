"""The tensor-core backward (flash_wgmma_bwd.cu on sm_90, flash_tc_bwd.cu, iokernels.plan.fast_bwd): counters ==
model == simulator byte for byte; gradients within flash-attention's same-precision tolerance (ragged N,
N_q != N_k included; the wgmma kernel's d inside a wider tile, causal or not); the plain build agrees with the
counting build; the deterministic variant is bit-identical run to run."""

import zlib

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.fast_bwd import (
    FAST_BWD_FALLBACKS,
    FAST_BWD_TUNING,
    FAST_BWD_WGMMA_TUNING,
    fit_fast_backward_plan,
    make_fast_backward_plan,
)
from iokernels.simulate import reference, simulate

from .helpers import naive_backward, problem_scale, rel_err, ulp
from .test_causal import naive_backward as naive_causal_backward

cp = pytest.importorskip("cupy")

CASES = [  # (N_q, N_k, d, dtype, batch, heads)
    (1, 1, 64, "float16", 1, 1),
    (113, 1000, 64, "bfloat16", 1, 3),
    (1000, 113, 128, "float16", 2, 1),
    (1000, 1000, 64, "bfloat16", 1, 2),
    (128, 128, 128, "float16", 1, 1),
    (4097, 1000, 64, "float16", 1, 1),
    (257, 4097, 128, "bfloat16", 1, 1),
]
GRADS = ("dQ", "dK", "dV")
# (kernel, deterministic): the wgmma kernel (sm_90 only) and the mma kernels, atomic and deterministic
KERNELS = [("tma", False), ("wgmma", False), ("mma", False), ("mma", True)]
KERNEL_IDS = ["tma", "wgmma", "mma-atomic", "mma-deterministic"]


def _need(kernel: str) -> None:
    if kernel in ("tma", "wgmma") and cp.cuda.Device().compute_capability != "90":
        pytest.skip(f"the {kernel} backward runs on sm_90 only")


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _grads(run, plan):
    return {name: launch.to_float64(run.buffers[name], plan.dtype) for name in GRADS}


def _check_counts(plan, run, host):
    """Counters == model, and == the simulator where the problem is small."""
    exact = model.exact(plan)
    assert run.counts == exact
    if plan.N_q * plan.N_k * plan.bh <= 4_000_000:
        assert simulate(plan, host).counts == exact


def _check_plain_build(plan, inputs, counted):
    """The plain build as the counting build: dK, dV bit for bit, dQ (float32 sums in another order, rounded to T)
    within one unit in the last place."""
    plain = _grads(launch.run_plan(plan, inputs, counting=False), plan)
    np.testing.assert_array_equal(plain["dK"], counted["dK"])
    np.testing.assert_array_equal(plain["dV"], counted["dV"])
    np.testing.assert_allclose(plain["dQ"], counted["dQ"], rtol=ulp(plan.dtype), atol=1e-4)


def _check_grads(got, host, dtype, causal="", plan=None):
    """Gradients against the float64 reference within flash-attention's idiom. ``plan`` with kv_heads < heads
    (grouped-query): K, V expanded to the query heads, dK and dV of a K/V head the sums over its query heads."""
    for name, x in got.items():
        assert np.all(np.isfinite(x)), f"{name} has NaN/inf (unwritten or overflowed)"
    q, k, v, do = (host[name] for name in ("Q", "K", "V", "dO"))
    group = 1 if plan is None else plan.heads // plan.kv_heads
    if group > 1:
        kv = np.arange(plan.bh) // group
        k, v = k[kv], v[kv]
    want = dict(zip(GRADS, reference.backward(q, k, v, do, causal=causal), strict=True))
    naive = dict(zip(GRADS, naive_causal_backward(q, k, v, do, dtype, causal) if causal
                     else naive_backward(q, k, v, do, dtype), strict=True))
    for name in ("dK", "dV") if group > 1 else ():  # per K/V head: the sum over its query heads
        for source in (want, naive):
            source[name] = source[name].reshape(plan.bh_kv, group, *source[name].shape[1:]).sum(axis=1)
    scale = problem_scale(want)
    for name in GRADS:  # flash-attention's idiom: at most 2x the error of a same-precision naive computation
        bound = 2 * rel_err(naive[name], want[name], scale) + 1e-6
        err = rel_err(got[name], want[name], scale)
        assert err <= bound, (name, err, bound)


@pytest.mark.parametrize("kernel, deterministic", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_counters_and_gradients(case, kernel, deterministic):
    _need(kernel)
    n_q, n_k, d, dtype, batch, heads = case
    plan = make_fast_backward_plan(N_q=n_q, N_k=n_k, d=d, dtype=dtype, batch=batch, heads=heads,
                                   deterministic=deterministic, kernel=kernel)
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case))
    run = launch.run_plan(plan, inputs, counting=True)
    exact = model.exact(plan)
    assert run.counts == exact
    if plan.N_q * plan.N_k * plan.bh <= 4_000_000:
        assert simulate(plan, host).counts == exact
    _check_grads(_grads(run, plan), host, dtype)


VARIANTS = ([{"kernel": "mma", "block_r": br, "block_c": bc, "ds_stages": ds, "d": d}
             for d, br, bc, ds in FAST_BWD_TUNING]
            + [{"kernel": "mma", **options, "d": d} for options in FAST_BWD_FALLBACKS[1:] for d in (64, 128)]
            + [{"kernel": k, "block_r": br, "block_c": bc, "d": d} for d, br, bc in FAST_BWD_WGMMA_TUNING
               for k in ("tma", "wgmma")]
            + [{"kernel": k, "block_r": 64, "block_c": 64, "d": d} for d in (64, 128, 40, 104)
               for k in ("tma", "wgmma")])


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}{x}" for k, x in v.items()))
def test_tile_variants(variant):
    _need(variant["kernel"])
    dtype = "bfloat16" if variant.get("q_stages") == 1 else "float16"
    plan = make_fast_backward_plan(N_q=300, N_k=517, dtype=dtype, heads=2, **variant)
    inputs, host = launch.make_device_inputs(plan, seed=_seed(variant))
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    _check_grads(_grads(run, plan), host, dtype)


# the wgmma kernel's d inside a wider tile (HEAD_D_TILE 64 or 128: the columns past d zero-filled, never read,
# added or stored): awkward N, N_q != N_k, a ragged last block of both
WIDER_CASES = [  # (N_q, N_k, d, dtype, batch, heads)
    (239, 239, 16, "float16", 1, 2),
    (239, 517, 32, "bfloat16", 2, 1),
    (1000, 239, 96, "float16", 1, 2),
    (239, 1000, 120, "bfloat16", 1, 1),
    (1, 239, 96, "bfloat16", 1, 1),
]


@pytest.mark.parametrize("causal", ["", "bottom_right", "top_left"])
@pytest.mark.parametrize("case", WIDER_CASES, ids=lambda c: "-".join(map(str, c)))
def test_head_dims_inside_a_wider_tile(case, causal):
    """d 16, 32, 96, 120 in the wgmma backward: counters == model (d's bytes: the padded columns are neither read
    nor written), gradients against the float64 reference within flash-attention's same-precision idiom, the
    plain build as the counting build (dK, dV bit for bit; dQ to the order of its float atomics)."""
    _need("wgmma")
    n_q, n_k, d, dtype, batch, heads = case
    plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=227 * 1024, batch=batch,
                     heads=heads, direction="bwd", causal=causal)
    main = plan.stage("main")
    assert main.kernel == "flash_tma_bwd" and dict(main.params)["HEAD_D_TILE"] == (64 if d <= 64 else 128)
    inputs, host = launch.make_device_inputs(plan, seed=_seed("wider", case, causal))
    run = launch.run_plan(plan, inputs, counting=True)
    _check_counts(plan, run, host)
    counted = _grads(run, plan)
    _check_grads(counted, host, dtype, causal)
    _check_plain_build(plan, inputs, counted)


# past d 128: the tma kernel's wide tiles (64 x 64; two consumer warpgroups share the keys, the tile 192 or 256
# wide), grouped-query K/V, awkward N and N_q != N_k
WIDE_CASES = [  # (N_q, N_k, d, dtype, batch, heads, kv_heads)
    (239, 1000, 256, "float16", 1, 2, 1),
    (1000, 239, 136, "bfloat16", 1, 2, 2),
    (1, 113, 192, "float16", 1, 1, 1),
    (4097, 257, 256, "bfloat16", 1, 1, 1),
    (300, 517, 200, "float16", 2, 4, 2),
]


@pytest.mark.parametrize("causal", ["", "bottom_right", "top_left"])
@pytest.mark.parametrize("case", WIDE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_wide_tiles_past_d_128(case, causal):
    """d 136-256 (flash_tma_bwd_wide): counters == model (== simulator where small), gradients against the float64
    reference within flash-attention's same-precision idiom (dK, dV of a K/V head summed over its query heads), the
    plain build as the counting build (dK, dV bit for bit; dQ to the order of its float reductions)."""
    _need("tma")
    n_q, n_k, d, dtype, batch, heads, kv_heads = case
    plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=227 * 1024, batch=batch,
                     heads=heads, kv_heads=kv_heads, direction="bwd", causal=causal)
    assert plan.stage("main").kernel == "flash_tma_bwd_wide"
    inputs, host = launch.make_device_inputs(plan, seed=_seed("wide", case, causal))
    run = launch.run_plan(plan, inputs, counting=True)
    _check_counts(plan, run, host)
    counted = _grads(run, plan)
    _check_grads(counted, host, dtype, causal, plan)
    _check_plain_build(plan, inputs, counted)


@pytest.mark.parametrize("sram_kb", [227, 140, 100])
def test_fit_takes_the_fastest_plan_that_fits(sram_kb):
    plan = fit_fast_backward_plan(sram=sram_kb * 1024, N_q=333, N_k=250, d=128, dtype="float16", heads=2)
    assert plan.smem_bytes <= sram_kb * 1024
    inputs, host = launch.make_device_inputs(plan, seed=sram_kb)
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    _check_grads(_grads(run, plan), host, "float16")


def test_make_plan_takes_the_fallback_that_fits_m():
    plan = make_plan("flash", "fast", N_q=200, N_k=150, d=64, dtype="float16", sram=48 * 1024, direction="bwd")
    assert plan.smem_bytes <= 48 * 1024
    inputs, host = launch.make_device_inputs(plan, seed=4)
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    _check_grads(_grads(run, plan), host, "float16")


@pytest.mark.parametrize("kernel, deterministic", KERNELS, ids=KERNEL_IDS)
def test_plain_build_matches_counting_build(kernel, deterministic):
    _need(kernel)
    plan = make_fast_backward_plan(N_q=300, N_k=200, d=64, dtype="float16", heads=2, deterministic=deterministic,
                                   kernel=kernel)
    inputs, _ = launch.make_device_inputs(plan, seed=5)
    counted = _grads(launch.run_plan(plan, inputs, counting=True), plan)
    plain_run = launch.run_plan(plan, inputs, counting=False)
    assert plain_run.counts is None
    plain = _grads(plain_run, plan)
    for name in GRADS:
        if name == "dQ" and not deterministic:  # float atomics from several K/V blocks: any order
            np.testing.assert_allclose(plain[name], counted[name], rtol=ulp(plan.dtype), atol=1e-4)
        else:
            np.testing.assert_array_equal(plain[name], counted[name])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
def test_deterministic_is_bit_identical(d, dtype):
    plan = make_fast_backward_plan(N_q=1500, N_k=700, d=d, dtype=dtype, heads=3, deterministic=True)
    inputs, _ = launch.make_device_inputs(plan, seed=_seed("det", d, dtype))
    runs = [{n: cp.asnumpy(x) for n, x in launch.run_plan(plan, inputs, counting=False).buffers.items() if n in GRADS}
            for _ in range(3)]
    for name in GRADS:
        assert runs[0][name].tobytes() == runs[1][name].tobytes() == runs[2][name].tobytes(), name
    # and the same gradients as the atomic plan, up to the order of the float additions of dQ
    atomic = make_fast_backward_plan(N_q=1500, N_k=700, d=d, dtype=dtype, heads=3, kernel="mma")
    other = _grads(launch.run_plan(atomic, inputs, counting=False), atomic)
    mine = {n: launch.to_float64(cp.asarray(x), dtype) for n, x in runs[0].items()}
    for name in GRADS:
        ref = np.max(np.abs(mine[name]))
        assert np.max(np.abs(mine[name] - other[name])) <= 2 ** -6 * ref, name


@pytest.mark.parametrize("kernel, deterministic", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_large_logits_stay_finite(dtype, kernel, deterministic):
    _need(kernel)
    plan = make_fast_backward_plan(N_q=300, N_k=200, d=128, dtype=dtype, heads=2, deterministic=deterministic,
                                   kernel=kernel)
    inputs, _ = launch.make_device_inputs(plan, seed=9, magnitude=10.0)  # logits about x100
    got = _grads(launch.run_plan(plan, inputs, counting=False), plan)
    for name, x in got.items():
        assert np.all(np.isfinite(x)), name


@pytest.mark.parametrize("batch, heads, kv_heads, n_q, n_k, d, dtype", [
    (2, 6, 2, 300, 517, 64, "float16"), (1, 8, 1, 129, 64, 128, "bfloat16"), (1, 4, 2, 1000, 1000, 128, "float16")])
def test_grouped_query_attention(batch, heads, kv_heads, n_q, n_k, d, dtype):
    """Grouped-query backward (wgmma): counters == model (K, V read and dK, dV written once per K/V head);
    dK, dV of a K/V head are the sums over its query heads of the ungrouped gradients."""
    _need("wgmma")
    plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=227 * 1024, batch=batch,
                     heads=heads, kv_heads=kv_heads, direction="bwd")
    inputs, host = launch.make_device_inputs(plan, seed=_seed(heads, kv_heads, n_q))
    assert inputs["K"].shape == (batch * kv_heads, n_k, d)
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    got = _grads(run, plan)
    assert got["dK"].shape == (batch * kv_heads, n_k, d)
    _check_grads(got, host, dtype, "", plan)
