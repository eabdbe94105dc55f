"""Variable-length batches on the GPU (issue #23; flash_tma.cu and flash_tma_bwd.cu built with VARLEN;
iokernels/plan/varlen.py): counters == model.exact; O and lse, and dQ, dK, dV, equal the float64 reference of each
sequence alone within flash-attention's same-precision tolerance, for empty sequences, one-row sequences, lengths that
are not multiples of the tiles, N_q ≠ N_k per sequence, causal in both alignments, grouped-query attention and d inside
a wider tile and past 128; the plain build agrees with the counting one; NaN in one sequence never reaches another;
``iokernels.attention_varlen`` and ``attention_varlen_backward`` run the same plans (and their fast paths twice).

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_varlen.py`` (skips without an sm_90 device).
"""

import zlib

import numpy as np
import pytest

import iokernels
from iokernels import model
from iokernels.kernels import launch
from iokernels.plan.varlen import make_varlen_plan
from iokernels.simulate import reference
from iokernels.simulate.varlen import varlen_reference, varlen_reference_grads

from .helpers import assert_within_naive, ulp, varlen_naive

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.usefixtures("sm90")

# (lengths_q, lengths_k or None, d, dtype, heads, kv_heads, causal)
CASES = [
    ((1, 113, 0, 239, 1023), None, 64, "float16", 4, 2, False),
    ((1, 113, 0, 239, 1023), None, 64, "float16", 4, 2, True),
    ((5, 300, 17, 4097), (300, 0, 129, 4097), 128, "bfloat16", 2, 2, False),
    ((5, 300, 17, 129), (300, 1, 129, 5), 128, "float16", 2, 1, "bottom_right"),  # rows with no key (L_q > L_k)
    ((200, 64, 7), (100, 640, 7), 96, "float16", 3, 3, "top_left"),
    ((130, 1, 257), None, 256, "bfloat16", 2, 2, True),  # B_c 64
    ((333,), (1000,), 32, "float16", 1, 1, False),  # one sequence
]
IDS = ["-".join(map(str, (len(c[0]), c[2], c[3], c[6], c[4], c[5]))) for c in CASES]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _plan(case):
    lq, lk, d, dtype, heads, kv_heads, causal = case
    return make_varlen_plan(d=d, dtype=dtype, heads=heads, kv_heads=kv_heads, lengths_q=lq, lengths_k=lk,
                            causal=causal)


def _assert_outputs(plan, buffers, host, scale=None):
    scale = reference.default_scale(plan.d) if scale is None else scale
    o_want, lse_want = varlen_reference(plan, host, scale)
    o = launch.to_float64(buffers["O"], plan.dtype)
    assert o.shape == o_want.shape
    assert_within_naive({"O": o}, {"O": o_want}, {"O": varlen_naive(plan, host, scale)["O"]})
    lse = cp.asnumpy(buffers["lse"]).astype(np.float64)
    empty = np.isneginf(lse_want)
    assert np.array_equal(np.isneginf(lse), empty) and np.all(o[empty] == 0)
    assert np.max(np.abs(lse[~empty] - lse_want[~empty]), initial=0.0) < 1e-2


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_counters_outputs_and_lse(case):
    plan = _plan(case)
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case))
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    _assert_outputs(plan, run.buffers, host)
    plain = launch.run_plan(plan, inputs, counting=False)
    _assert_outputs(plan, plain.buffers, host)
    o, o_plain = (launch.to_float64(b["O"], plan.dtype) for b in (run.buffers, plain.buffers))
    assert np.max(np.abs(o_plain - o)) <= ulp(plan.dtype) * np.max(np.abs(o))  # the same kernels less counters


def test_nan_stays_in_its_sequence():
    """A NaN in every K and V row of sequence 1 (and in Q and K of sequence 2) makes those sequences' O NaN and nothing
    else: sequence 0's last tiles load sequence 1's rows (V's zeroed in shared memory, K's masked), sequence 1's load
    2's."""
    plan = make_varlen_plan(d=64, dtype="float16", heads=2, lengths_q=(100, 150, 90), lengths_k=(70, 200, 60),
                            causal=False)
    inputs, host = launch.make_device_inputs(plan, seed=3)
    (first, _, ok1, lk1), (oq2, lq2, ok2, lk2) = plan.varlen.sequences()[1:]
    inputs["V"][ok1:ok1 + lk1] = cp.nan
    inputs["K"][ok1:ok1 + lk1] = cp.nan
    inputs["Q"][oq2:oq2 + lq2] = cp.nan
    inputs["K"][ok2:ok2 + lk2] = cp.nan
    run = launch.run_plan(plan, inputs, counting=False)
    o = launch.to_float64(run.buffers["O"], plan.dtype)
    assert np.all(np.isfinite(o[:first])) and np.all(np.isnan(o[first:]))
    o_want = varlen_reference(plan, host)[0][:first]
    assert np.max(np.abs(o[:first] - o_want)) < 1e-2


@pytest.mark.parametrize("causal", [False, True])
def test_library_call(causal):
    """iokernels.attention_varlen on cupy arrays: the reference's O and lse, twice (the second call on the fast path),
    and inside count_io the counting build with the model's bytes."""
    lengths = (17, 0, 500, 129, 1)
    plan = make_varlen_plan(d=128, dtype="float16", heads=8, kv_heads=2, lengths_q=lengths, causal=causal)
    inputs, host = launch.make_device_inputs(plan, seed=_seed("library", causal))
    args = (inputs["Q"], inputs["K"], inputs["V"], inputs["cu_seqlens_q"], inputs["cu_seqlens_k"], max(lengths),
            max(lengths))
    for _ in range(2):
        o, lse = iokernels.attention_varlen(*args, causal=causal, return_lse=True)
        _assert_outputs(plan, {"O": o, "lse": lse}, host)
    with iokernels.count_io() as records:
        o = iokernels.attention_varlen(*args, causal=causal)
    counted = {}
    for r in records:
        counted[r["tensor"]] = (r["read_bytes"], r["write_bytes"])
    assert counted == model.exact(plan)["main"]
    _assert_outputs(plan, {"O": o, "lse": lse}, host)


def _assert_grads(plan, buffers, host):
    scale = reference.default_scale(plan.d)
    want = varlen_reference_grads(plan, host, scale)
    got = {n: launch.to_float64(buffers[n], plan.dtype) for n in want}
    assert all(got[n].shape == want[n].shape for n in want)
    naive = varlen_naive(plan, host, scale)
    assert_within_naive(got, want, {n: naive[n] for n in want})


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward_counters_and_gradients(case):
    lq, lk, d, dtype, heads, kv_heads, causal = case
    plan = make_varlen_plan(d=d, dtype=dtype, heads=heads, kv_heads=kv_heads, lengths_q=lq, lengths_k=lk,
                            causal=causal, direction="bwd")
    inputs, host = launch.make_device_inputs(plan, seed=_seed("bwd", case))
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    _assert_grads(plan, run.buffers, host)
    plain = launch.run_plan(plan, inputs, counting=False)
    _assert_grads(plan, plain.buffers, host)


@pytest.mark.parametrize("d", [64, 256])
def test_backward_nan_stays_in_its_sequence(d):
    """NaN in sequence 1's Q, dO, K and V: its gradients are NaN, sequence 0's (whose last query block loads sequence
    1's Q and dO rows, and its last key block sequence 1's K and V rows, all zeroed in shared memory) and sequence
    2's are not."""
    plan = make_varlen_plan(d=d, dtype="float16", heads=2, lengths_q=(100, 150, 90), lengths_k=(70, 200, 60),
                            direction="bwd")
    inputs, host = launch.make_device_inputs(plan, seed=5)
    (oq1, lq1, ok1, lk1), (oq2, _, ok2, _) = plan.varlen.sequences()[1:]
    for name, first, rows in (("Q", oq1, lq1), ("dO", oq1, lq1), ("K", ok1, lk1), ("V", ok1, lk1)):
        inputs[name][first:first + rows] = cp.nan
    run = launch.run_plan(plan, inputs, counting=False)
    got = {n: launch.to_float64(run.buffers[n], plan.dtype) for n in ("dQ", "dK", "dV")}
    assert np.all(np.isfinite(got["dQ"][:oq1])) and np.all(np.isfinite(got["dQ"][oq2:]))
    for n in ("dK", "dV"):
        assert np.all(np.isfinite(got[n][:ok1])) and np.all(np.isfinite(got[n][ok2:]))
        assert np.all(np.isnan(got[n][ok1:ok1 + lk1]))
    want = varlen_reference_grads(plan, host)
    for n, rows in (("dQ", slice(0, oq1)), ("dK", slice(0, ok1)), ("dV", slice(0, ok1))):
        assert np.max(np.abs(got[n][rows] - want[n][rows])) < 2e-2 * max(1.0, np.max(np.abs(want[n][rows])))


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_offsets_out_of_range_stay_inside_the_tensors(direction):
    """Offsets past the packed rows, or out of order (bad input: the host never reads them), are clamped on the device:
    sequence 1 then runs to the last packed row (longer than max_seqlen: its rows past the grid are not computed) and
    sequence 2 is empty; nothing is read or written outside the tensors (compute-sanitizer's memcheck runs this test)
    and sequence 0's outputs are the reference's."""
    plan = make_varlen_plan(d=64, dtype="float16", heads=2, lengths_q=(100, 150, 90), lengths_k=(70, 200, 60),
                            direction=direction)
    inputs, host = launch.make_device_inputs(plan, seed=7)
    inputs["cu_seqlens_q"][2:] = cp.asarray([2**30, -7], dtype=cp.int32)
    inputs["cu_seqlens_k"][3] = 2**31 - 1
    buffers = launch.run_plan(plan, inputs, counting=False).buffers
    names = ("O",) if direction == "fwd" else ("dQ", "dK", "dV")
    got = {n: launch.to_float64(buffers[n], plan.dtype) for n in names}
    if direction == "fwd":
        want = {"O": varlen_reference(plan, host)[0]}
    else:
        want = varlen_reference_grads(plan, host)
    first_rows = {"O": 100, "dQ": 100, "dK": 70, "dV": 70}
    for n in names:
        rows = slice(0, first_rows[n])
        assert np.max(np.abs(got[n][rows] - want[n][rows])) < 2e-2 * max(1.0, np.max(np.abs(want[n][rows])))


@pytest.mark.parametrize("causal", [False, True])
def test_library_backward(causal):
    """attention_varlen_backward on attention_varlen's O and lse: the reference's gradients, twice (the fast path), and
    inside count_io the model's bytes per stage."""
    lengths = (17, 0, 500, 129, 1)
    plan = make_varlen_plan(d=96, dtype="float16", heads=4, kv_heads=2, lengths_q=lengths, causal=causal,
                            direction="bwd")
    inputs, host = launch.make_device_inputs(plan, seed=_seed("library-bwd", causal))
    cu = (inputs["cu_seqlens_q"], inputs["cu_seqlens_k"], max(lengths), max(lengths))
    o, lse = iokernels.attention_varlen(inputs["Q"], inputs["K"], inputs["V"], *cu, causal=causal, return_lse=True)
    host["O"] = launch.to_float64(o, plan.dtype)
    host["lse"] = cp.asnumpy(lse).astype(np.float64)
    for _ in range(2):
        dq, dk, dv = iokernels.attention_varlen_backward(inputs["dO"], inputs["Q"], inputs["K"], inputs["V"], o, lse,
                                                         *cu, causal=causal)
        _assert_grads(plan, {"dQ": dq, "dK": dk, "dV": dv}, host)
    with iokernels.count_io() as records:
        iokernels.attention_varlen_backward(inputs["dO"], inputs["Q"], inputs["K"], inputs["V"], o, lse, *cu,
                                            causal=causal)
    counted: dict = {}
    for r in records:
        counted.setdefault(r["stage"], {})[r["tensor"]] = (r["read_bytes"], r["write_bytes"])
    assert counted == model.exact(plan)
