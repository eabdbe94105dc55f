"""iokernels.attention / attention_backward / count_io on the GPU."""

import numpy as np
import pytest

import iokernels
from iokernels import model, reference
from iokernels.plan import make_plan

from .helpers import rel_err

cp = pytest.importorskip("cupy")


@pytest.mark.parametrize("algorithm, schedule", [("flash", None), ("flash", "kv_outer"), ("two_pass", "store"),
                                                 ("two_pass", "recompute"), ("standard", None)])
def test_attention_numpy_in_numpy_out(algorithm, schedule):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 100, 64)).astype(np.float32)
    k = rng.standard_normal((2, 3, 77, 64)).astype(np.float32)
    v = rng.standard_normal((2, 3, 77, 64)).astype(np.float32)
    out, lse = iokernels.attention(q, k, v, algorithm=algorithm, schedule=schedule, return_lse=True)
    assert isinstance(out, np.ndarray) and out.shape == q.shape and out.dtype == np.float32
    want, want_lse = reference.forward(q, k, v)
    assert rel_err(out, want) < 1e-5
    assert np.max(np.abs(lse - want_lse)) < 1e-4


def test_attention_cupy_float16_and_backward():
    rng = np.random.default_rng(2)
    q, k, v, do = (cp.asarray(rng.standard_normal((4, 129, 128)), dtype=cp.float16) for _ in range(4))
    out, lse = iokernels.attention(q, k, v, return_lse=True)
    assert isinstance(out, cp.ndarray) and out.dtype == cp.float16
    host = [cp.asnumpy(x).astype(np.float64) for x in (q, k, v, do)]
    assert rel_err(cp.asnumpy(out).astype(np.float64), reference.forward(*host[:3])[0]) < 5e-3
    dq, dk, dv = iokernels.attention_backward(q, k, v, out, do, lse)
    for got, want in zip((dq, dk, dv), reference.backward(*host), strict=True):
        assert isinstance(got, cp.ndarray) and got.dtype == cp.float16
        assert rel_err(cp.asnumpy(got).astype(np.float64), want) < 2e-2
    standard = iokernels.attention_backward(q, k, v, out, do, lse, algorithm="standard")
    for got, want in zip(standard, reference.backward(*host), strict=True):
        assert rel_err(cp.asnumpy(got).astype(np.float64), want) < 2e-2


def test_non_contiguous_input_is_copied_not_misread():
    rng = np.random.default_rng(3)
    base = rng.standard_normal((64, 2, 32)).astype(np.float32)
    q = base.transpose(1, 0, 2)  # (2, 64, 32), not contiguous
    out = iokernels.attention(q, q, q)
    assert rel_err(out, reference.forward(q, q, q)[0]) < 1e-5


def test_count_io_collects_exact_counts():
    q = cp.random.standard_normal((1, 300, 64), dtype=cp.float32)
    with iokernels.count_io() as records:
        iokernels.attention(q, q, q, algorithm="flash", schedule="q_outer", sram="96KB")
    plan = make_plan("flash", "q_outer", N_q=300, d=64, sram=96 * 1024)
    got = {(r["stage"], r["tensor"]): (r["read_bytes"], r["write_bytes"]) for r in records}
    want = {(s, t): rw for s, ts in model.exact(plan).items() for t, rw in ts.items()}
    assert got == want
    iokernels.attention(q, q, q)  # outside the block: nothing more is recorded
    assert len(records) == len(want)


def test_sram_over_the_device_limit_fails_before_launch():
    q = cp.zeros((1, 16, 64), dtype=cp.float32)
    with pytest.raises(ValueError, match="per-block shared-memory limit"):
        iokernels.attention(q, q, q, sram="1MB")


def test_grouped_query_attention_equals_repeated_heads():
    rs = cp.random.default_rng(4)
    q = rs.standard_normal((2, 8, 300, 128), dtype=cp.float32).astype(cp.float16)
    k, v = (rs.standard_normal((2, 2, 257, 128), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    o, lse = iokernels.attention(q, k, v, return_lse=True)
    assert o.shape == (2, 8, 300, 128) and lse.shape == (2, 8, 300)
    o_full, lse_full = iokernels.attention(q, cp.repeat(k, 4, axis=1), cp.repeat(v, 4, axis=1), return_lse=True)
    # the same kernel reading the same K/V rows: identical results
    assert cp.array_equal(o, o_full) and cp.array_equal(lse, lse_full)
    with pytest.raises(ValueError, match="grouped-query"):
        iokernels.attention(q.astype(cp.float32), k.astype(cp.float32), v.astype(cp.float32))


def test_deterministic_backward_is_bitwise_repeatable():
    rs = cp.random.default_rng(6)
    q, k, v, do = (rs.standard_normal((3, 500, 64), dtype=cp.float32).astype(cp.float16) for _ in range(4))
    o, lse = iokernels.attention(q, k, v, return_lse=True)
    first = iokernels.attention_backward(q, k, v, o, do, lse, deterministic=True)
    second = iokernels.attention_backward(q, k, v, o, do, lse, deterministic=True)
    assert all(cp.array_equal(a, b) for a, b in zip(first, second, strict=True))
    fast = iokernels.attention_backward(q, k, v, o, do, lse)  # atomics: equal up to summation order
    for a, b in zip(first, fast, strict=True):
        assert float(cp.max(cp.abs(a.astype(cp.float32) - b.astype(cp.float32)))) < 2e-2
    with pytest.raises(ValueError, match="deterministic"):
        iokernels.attention_backward(*(x.astype(cp.float32) for x in (q, k, v, o, do)), lse, deterministic=True)
