"""Sliding-window attention on the sm_90 tensor-core kernels (flash_tma.cu, flash_tma_bwd.cu with WINDOW): counters
== model.exact; outputs, lse and gradients equal the float64 reference within flash-attention's same-precision
tolerance, for windows bounded on either side or both, with the causal mask in both alignments, ragged N, N_q !=
N_k (rows that see no key), grouped-query attention, d inside a wider tile and past 128 (the wide backward), and
with dropout; the plain build agrees with the counting one; Q = 0 and V = I make each row's visible keys
observable, element for element.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_window.py`` (skips without an sm_90 device).
"""

import zlib

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.dropout import Dropout
from iokernels.plan.units import round_to
from iokernels.simulate import kv_rows, reference, reference_outputs

from .helpers import assert_within_naive, per_item, plan_naive_grads, plan_naive_p, ulp

cp = pytest.importorskip("cupy")
KB = 1024
GRADS = ("dQ", "dK", "dV")


pytestmark = pytest.mark.usefixtures("sm90")


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


# (N_q, N_k, d, dtype, heads, kv_heads, causal, window, dropout p)
CASES = [
    (1000, 1000, 64, "float16", 2, 2, "", (128, 128), 0.0),
    (4097, 4097, 128, "bfloat16", 1, 1, "", (1024, 0), 0.0),
    (1000, 1000, 64, "bfloat16", 4, 2, "bottom_right", (256, None), 0.0),  # window and causal, grouped-query
    (113, 1000, 128, "float16", 1, 1, "", (100, 20), 0.0),
    (1000, 113, 64, "float16", 2, 1, "", (30, 5), 0.0),  # the first rows see no key
    (239, 239, 256, "float16", 2, 2, "top_left", (64, None), 0.0),  # the wide backward
    (1023, 517, 96, "bfloat16", 2, 1, "", (None, 0), 0.0),  # d inside a wider tile; causal through the window
    (517, 1023, 160, "bfloat16", 1, 1, "", (0, 300), 0.0),
    (1, 4097, 128, "float16", 1, 1, "", (256, 0), 0.0),
    (300, 300, 64, "float16", 1, 1, "top_left", (0, 0), 0.0),  # the diagonal alone
    (64, 300, 64, "float16", 1, 1, "top_left", (10, 10), 0.0),  # an empty band: no row sees a key
    (1000, 1000, 64, "float16", 2, 2, "", (128, 128), 0.2),
    (700, 1100, 128, "bfloat16", 2, 1, "bottom_right", (200, None), 0.1),
]
IDS = ["-".join(map(str, c)).replace(" ", "") for c in CASES]


def _plan(case, direction):
    n_q, n_k, d, dtype, heads, kv_heads, causal, window, p = case
    s = _seed(case)
    dropout = Dropout(p, (s << 32) | (s ^ 0x9E3779B9), s % 1000) if p else None
    return make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=227 * KB, heads=heads,
                     kv_heads=kv_heads, causal=causal, window=window, direction=direction, dropout=dropout)


def _z(plan):
    return 1.0 if plan.dropout is None else plan.dropout.full_multiplier(plan.bh, plan.N_q, plan.N_k)


def _run_both(plan, inputs, names):
    """The counting build's outputs (its counts checked against the model) and the plain build's."""
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    got = {n: launch.to_float64(run.buffers[n], plan.dtype) for n in names}
    plain = launch.run_plan(plan, inputs, counting=False)
    for n in names:  # the same kernel less its counters: equal, or one ulp apart (a reordered float sum)
        other = launch.to_float64(plain.buffers[n], plan.dtype)
        assert np.max(np.abs(other - got[n]), initial=0.0) <= ulp(plan.dtype) * np.max(np.abs(got[n]), initial=0.0)
    return run, got


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_counters_outputs_and_lse(case):
    plan = _plan(case, "fwd")
    assert plan.stage("main").kernel == "flash_tma_fwd" and dict(plan.stage("main").params)["WINDOW"] == 1
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case, "fwd"))
    run, got = _run_both(plan, inputs, ("O",))
    o = got["O"]
    assert np.all(np.isfinite(o))
    want = reference_outputs(plan, host)["O"]
    kv = kv_rows(plan)
    q, k, v = host["Q"], host["K"][kv], host["V"][kv]
    naive = round_to((plan_naive_p(plan, q, k, reference.default_scale(plan.d)) * _z(plan)) @ v, plan.dtype)
    assert_within_naive({"O": o}, {"O": want}, {"O": naive})
    # lse of the undropped P; -inf exactly for the rows that see no key, whose O is 0
    vis = plan.visible(np.arange(plan.N_q), np.arange(plan.N_k))
    lse_want = reference.forward(q, k, v, mask=vis)[1]
    lse = cp.asnumpy(run.buffers["lse"]).astype(np.float64)
    finite = np.isfinite(lse_want)
    assert np.array_equal(np.isfinite(lse), finite) and np.all(lse[~finite] == -np.inf)
    assert np.max(np.abs(lse[finite] - lse_want[finite]), initial=0.0) < 1e-2
    assert np.all(o[:, ~vis.any(axis=1)] == 0)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward_counters_and_gradients(case):
    plan = _plan(case, "bwd")
    assert plan.stage("main").kernel == ("flash_tma_bwd_wide" if case[2] > 128 else "flash_tma_bwd")
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case, "bwd"))
    _, got = _run_both(plan, inputs, GRADS)
    kv = kv_rows(plan)
    naive = plan_naive_grads(plan, host["Q"], host["K"][kv], host["V"][kv], host["dO"], _z(plan))
    assert_within_naive(got, reference_outputs(plan, host), naive)


@pytest.mark.parametrize("d, causal, window", [(64, "", (300, 0)), (128, "", (128, 128)),
                                               (64, "bottom_right", (256, None)), (128, "top_left", (None, 40))])
def test_the_backward_on_the_list_changes_the_order_only(d, causal, window):
    """A window's narrow backward on the persistent grid of its list of items (ITEM_LIST) against the same plan as a
    block per item: dK and dV bitwise equal, dQ (added in another order) within a bfloat16-level tolerance; each run's
    counters equal its own plan's model (the list's reads in the first)."""
    plan = make_plan("flash", "fast", N_q=1100, N_k=1300, d=d, dtype="bfloat16", sram=227 * KB, batch=2, heads=4,
                     kv_heads=2, causal=causal, window=window, direction="bwd")
    assert dict(plan.stage("main").params).get("ITEM_LIST") == 1
    inputs, _ = launch.make_device_inputs(plan, seed=_seed("list", d, causal, window))
    got = {}
    for label, p in (("list", plan), ("per item", per_item(plan))):
        run = launch.run_plan(p, inputs, counting=True)
        assert run.counts == model.exact(p), label
        got[label] = {n: launch.to_float64(run.buffers[n], p.dtype) for n in GRADS}
    assert "work" in model.exact(plan)["main"] and "work" not in model.exact(per_item(plan))["main"]
    for name in ("dK", "dV"):
        assert np.array_equal(got["list"][name], got["per item"][name]), name
    a, b = got["list"]["dQ"], got["per item"]["dQ"]
    assert np.allclose(a, b, rtol=1e-2, atol=1e-3 * np.abs(b).max())


@pytest.mark.parametrize("d, dtype, causal, window", [
    (64, "float16", "", (5, 9)), (128, "bfloat16", "", (0, None)), (64, "bfloat16", "top_left", (17, 3)),
    (256, "float16", "bottom_right", (40, 40)), (128, "float16", "", (None, 2))])
def test_each_rows_visible_keys_equal_the_rule(d, dtype, causal, window):
    """Q = 0 makes P uniform over each row's visible keys and V = I (N_k = d keys) makes O_ij = 1 / count where key
    j is visible to row i and 0 elsewhere: the kernel's band, element for element, against Plan.visible."""
    plan = make_plan("flash", "fast", N_q=333, N_k=d, d=d, dtype=dtype, sram=227 * KB, batch=1, heads=2,
                     causal=causal, window=window)
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    inputs["Q"] = cp.zeros_like(inputs["Q"])
    inputs["V"] = launch.to_device(np.broadcast_to(np.eye(d), (plan.bh, d, d)), dtype)
    o = launch.to_float64(launch.run_plan(plan, inputs, counting=False).buffers["O"], dtype)
    vis = plan.visible(np.arange(plan.N_q), np.arange(plan.N_k))
    assert np.array_equal(o > 0, np.broadcast_to(vis, o.shape))
    expect = np.where(vis, 1.0 / np.maximum(vis.sum(axis=-1, keepdims=True), 1), 0.0)
    assert np.max(np.abs(o - expect)) <= 4e-3 * np.max(expect)


def test_a_narrow_window_moves_fewer_bytes_than_causal_on_the_gpu():
    """The counted bytes of a 256-key window are those the model predicts, and under a quarter of causal's."""
    kw = dict(N_q=4096, d=64, dtype="float16", sram=227 * KB, heads=2, causal=True)
    bytes_of = {}
    for window in (None, (256, 0)):
        plan = make_plan("flash", "fast", window=window, **kw)
        inputs, _ = launch.make_device_inputs(plan, seed=3)
        counts = launch.run_plan(plan, inputs, counting=True).counts
        assert counts == model.exact(plan)
        bytes_of[window] = sum(r + w for stage in counts.values() for r, w in stage.values())
    assert bytes_of[(256, 0)] < bytes_of[None] / 4
