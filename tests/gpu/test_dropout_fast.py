"""Dropout in the tensor-core path flash/fast on an sm_90 GPU (the wgmma kernels, flash_wgmma.cu and
flash_wgmma_bwd.cu): counters == model; outputs and gradients equal the float64 reference given the same
multipliers Z (Dropout.full_multiplier) within flash-attention's same-precision tolerance (float16/bfloat16,
d 64 and 128 and inside a wider tile (96, 40), ragged N, N_q != N_k, causal in both alignments, grouped-query
attention); the kernels' own masks, made observable (Q = 0 so P is uniform, V or dO the identity), equal numpy's
element for element; p = 0 gives the plain kernels' results bit for bit.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_dropout_fast.py`` (skips without an sm_90 device).
"""

import zlib

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import make_plan, with_causal, with_dropout
from iokernels.plan.dropout import Dropout
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.units import round_to
from iokernels.simulate import kv_rows, reference, reference_outputs

from .helpers import assert_within_naive, group_sum, plan_naive_grads, plan_naive_p, rel_err, ulp

cp = pytest.importorskip("cupy")
KB = 1024
GRADS = ("dQ", "dK", "dV")


pytestmark = pytest.mark.usefixtures("sm90")


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _dropout(*parts, p=0.2) -> Dropout:
    s = _seed("dropout", *parts)
    return Dropout(p, (s << 32) | (s ^ 0x9E3779B9), s % 1000)  # both halves of the seed in use, an offset


# (N_q, N_k, d, dtype, batch, heads, kv_heads, causal)
CASES = [
    (1, 1, 64, "float16", 1, 1, 1, False),
    (113, 1000, 64, "bfloat16", 1, 3, 3, False),
    (1000, 113, 128, "float16", 2, 1, 1, "bottom_right"),  # rows that see no key
    (300, 517, 128, "bfloat16", 1, 4, 2, "top_left"),
    (257, 1030, 64, "float16", 2, 6, 2, "bottom_right"),
    (700, 700, 128, "float16", 1, 2, 1, False),
    (129, 64, 64, "bfloat16", 1, 2, 2, "top_left"),
    (239, 517, 96, "bfloat16", 1, 4, 2, "bottom_right"),  # d inside a wider tile (HEAD_D_TILE 128, 64)
    (300, 239, 40, "float16", 2, 2, 2, False),
]
IDS = ["-".join(map(str, c)) for c in CASES]
# the forward also at d inside a wider tile and past 128 (the tma kernel's 128 x 64 tiles)
FWD_CASES = [*CASES, (239, 1000, 256, "float16", 1, 2, 1, "bottom_right"), (1000, 239, 96, "bfloat16", 1, 2, 1, False),
             (300, 300, 160, "bfloat16", 1, 2, 2, "top_left")]


def _plan(case, direction, dropout):
    n_q, n_k, d, dtype, batch, heads, kv_heads, causal = case
    return make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=227 * KB, batch=batch, heads=heads,
                     kv_heads=kv_heads, causal=causal, direction=direction, dropout=dropout)


def _expanded(plan, host):
    kv = kv_rows(plan)
    return host["Q"], host["K"][kv], host["V"][kv]


@pytest.mark.parametrize("case", FWD_CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_counters_and_outputs(case):
    plan = _plan(case, "fwd", _dropout(case, "fwd"))
    assert plan.stage("main").kernel == "flash_tma_fwd"  # make_plan's sm_90 default
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case))
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    o = launch.to_float64(run.buffers["O"], plan.dtype)
    assert np.all(np.isfinite(o))
    want = reference_outputs(plan, host)["O"]
    q, k, v = _expanded(plan, host)
    z = plan.dropout.full_multiplier(plan.bh, plan.N_q, plan.N_k)
    scale = reference.default_scale(plan.d)
    naive = round_to((plan_naive_p(plan, q, k, scale) * z) @ v, plan.dtype)
    assert_within_naive({"O": o}, {"O": want}, {"O": naive})
    # lse is that of the undropped P
    lse_want = reference.forward(q, k, v, causal=plan.causal)[1]
    lse = cp.asnumpy(run.buffers["lse"]).astype(np.float64)
    finite = np.isfinite(lse_want)
    assert np.array_equal(np.isfinite(lse), finite)
    assert np.max(np.abs(lse[finite] - lse_want[finite]), initial=0.0) < 1e-2


# the backward also past d 128 (the tma kernel's wide tiles, 64 x 64)
BWD_CASES = [*CASES, (239, 1000, 256, "float16", 1, 2, 1, "bottom_right"), (300, 300, 160, "bfloat16", 1, 2, 2, False)]


@pytest.mark.parametrize("case", BWD_CASES, ids=lambda c: "-".join(map(str, c)))
def test_backward_counters_and_gradients(case):
    plan = _plan(case, "bwd", _dropout(case, "bwd"))
    assert plan.stage("main").kernel == ("flash_tma_bwd_wide" if case[2] > 128 else "flash_tma_bwd")
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case, "bwd"))  # O: the dropped forward's output
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    got = {n: launch.to_float64(run.buffers[n], plan.dtype) for n in GRADS}
    q, k, v = _expanded(plan, host)
    naive = plan_naive_grads(plan, q, k, v, host["dO"], plan.dropout.full_multiplier(plan.bh, plan.N_q, plan.N_k))
    assert_within_naive(got, reference_outputs(plan, host), naive)


@pytest.mark.parametrize("d, dtype, causal", [(64, "float16", False), (128, "bfloat16", False),
                                              (64, "bfloat16", "top_left"), (128, "float16", "bottom_right")])
def test_forward_mask_equals_numpy(d, dtype, causal):
    """Q = 0 makes P uniform over each row's visible keys and V = I (N_k = d keys) makes O_ij = Z_ij / count:
    the kernel's mask, element for element, for every query row and batch·head."""
    dropout = _dropout(d, dtype, causal, "mask", p=0.3)
    plan = make_plan("flash", "fast", N_q=333, N_k=d, d=d, dtype=dtype, sram=227 * KB, batch=2, heads=3,
                     causal=causal, dropout=dropout)
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    inputs["Q"] = cp.zeros_like(inputs["Q"])
    inputs["V"] = launch.to_device(np.broadcast_to(np.eye(d), (plan.bh, d, d)), dtype)
    run = launch.run_plan(plan, inputs, counting=False)
    o = launch.to_float64(run.buffers["O"], dtype)
    keep = dropout.keep(np.arange(plan.bh)[:, None, None], np.arange(plan.N_q)[None, :, None],
                        np.arange(d)[None, None, :])
    vis = plan.visible(np.arange(plan.N_q), np.arange(plan.N_k))
    if vis is not None:
        keep = keep & vis
    assert np.array_equal(o > 0, keep)
    count = plan.N_k if vis is None else np.maximum(vis.sum(axis=-1), 1)[:, None]
    expect = np.where(keep, dropout.keep_scale / count, 0.0)
    assert np.max(np.abs(o - expect)) <= 4e-3 * np.max(expect)
    assert abs(keep.sum() / (vis.sum() * plan.bh if vis is not None else keep.size) - 0.7) < 0.03


@pytest.mark.parametrize("d, dtype, kv_heads", [(64, "float16", 3), (128, "bfloat16", 3), (64, "bfloat16", 1),
                                               (96, "float16", 3), (256, "bfloat16", 3), (192, "float16", 1)])
def test_backward_mask_equals_numpy(d, dtype, kv_heads):
    """Q = 0 (P = 1 / N_k), dO = I over N_q = d queries: dV_jc = sum over the query heads of a K/V head of
    Z_cj / N_k, the transposed mask of every key (ragged N_k: many key blocks and 4-groups)."""
    dropout = _dropout(d, dtype, kv_heads, "bwd-mask", p=0.3)
    n_k = 300
    plan = make_plan("flash", "fast", N_q=d, N_k=n_k, d=d, dtype=dtype, sram=227 * KB, batch=1, heads=3,
                     kv_heads=kv_heads, direction="bwd", dropout=dropout)
    inputs, _ = launch.make_device_inputs(plan, seed=2)
    inputs["Q"] = cp.zeros_like(inputs["Q"])
    inputs["dO"] = launch.to_device(np.broadcast_to(np.eye(d), (plan.bh, d, d)), dtype)
    inputs["lse"] = cp.full(inputs["lse"].shape, np.log(n_k), dtype=cp.float32)
    run = launch.run_plan(plan, inputs, counting=False)
    dv = launch.to_float64(run.buffers["dV"], dtype)  # (bh_kv, N_k, d)
    z = dropout.full_multiplier(plan.bh, d, n_k) / n_k  # (bh, queries, keys)
    expect = group_sum(plan, np.swapaxes(z, -1, -2))
    assert np.max(np.abs(dv - expect)) <= 4e-3 * np.max(expect)
    if kv_heads == plan.heads:  # one query head per K/V head: the mask itself
        keep = dropout.keep(np.arange(plan.bh)[:, None, None], np.arange(d)[None, :, None],
                            np.arange(n_k)[None, None, :])
        assert np.array_equal(np.swapaxes(dv, -1, -2) > 0, keep)


@pytest.mark.parametrize("d, dtype", [(64, "float16"), (128, "bfloat16")])
def test_zero_probability_is_the_plain_kernel(d, dtype):
    """p = 0 keeps every element with scale 1: the forward and dK, dV bit for bit those of the same tiles
    without dropout (dQ is summed by float atomics, in no fixed order)."""
    fwd = make_plan("flash", "fast", N_q=500, N_k=300, d=d, dtype=dtype, sram=227 * KB, heads=2, causal=True)
    bwd = make_fast_backward_plan(N_q=500, N_k=300, d=d, dtype=dtype, heads=2, kernel="wgmma", dropout=True)
    for plan in (fwd, bwd):
        inputs, _ = launch.make_device_inputs(plan, seed=4)
        plain = launch.run_plan(plan, inputs, counting=False)
        dropped = launch.run_plan(with_dropout(plan, Dropout(0.0, 99)), inputs, counting=False)
        names = ("O", "lse") if plan.direction == "fwd" else ("dK", "dV")
        for name in names:
            assert cp.array_equal(plain.buffers[name], dropped.buffers[name]), name
        if plan.direction == "bwd":
            a, b = (launch.to_float64(r.buffers["dQ"], dtype) for r in (plain, dropped))
            assert rel_err(b, a) < 1e-2


@pytest.mark.parametrize("d, dtype, causal", [(128, "bfloat16", "bottom_right"), (96, "float16", False)])
def test_wgmma_backward_equals_the_tma_backward(d, dtype, causal):
    """The wgmma backward (kernel="wgmma": its dropout bits drawn after a step's products) on the tma backward's
    tiles and mask: the same dK, dV to one unit in the last place and dQ to float-atomic order, counters == model."""
    dropout = _dropout(d, dtype, causal, "wgmma")
    problem = {"N_q": 300, "N_k": 239, "d": d, "dtype": dtype, "heads": 2, "dropout": True}
    plans = [with_dropout(with_causal(make_fast_backward_plan(**problem, kernel=k), causal), dropout)
             for k in ("wgmma", "tma")]
    assert plans[0].tiles == plans[1].tiles
    inputs, _ = launch.make_device_inputs(plans[1], seed=_seed(d, dtype, causal, "wgmma"))
    runs = [launch.run_plan(plan, inputs, counting=True) for plan in plans]
    for plan, run in zip(plans, runs, strict=True):
        assert run.counts == model.exact(plan)
    for name in GRADS:
        a, b = (launch.to_float64(r.buffers[name], dtype) for r in runs)
        np.testing.assert_allclose(a, b, rtol=ulp(dtype), atol=1e-4, err_msg=name)
