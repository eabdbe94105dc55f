"""iokernels.attention / attention_backward / count_io on the GPU."""

import numpy as np
import pytest

import iokernels
from iokernels import model
from iokernels.plan import make_plan
from iokernels.simulate import reference

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
    # float32 has no native grouped-query kernel: K and V are expanded, with the same result as repeating them
    q32, k32, v32 = (x.astype(cp.float32) for x in (q, k, v))
    o32 = iokernels.attention(q32, k32, v32)
    assert cp.array_equal(o32, iokernels.attention(q32, cp.repeat(k32, 4, axis=1), cp.repeat(v32, 4, axis=1)))


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


# ---------------------------------------------------------------------------------------------
# grouped-query backward, streams, CUDA graphs, the memory check, the per-device memo

def _grouped_reference(q, k, v, do, causal):
    """float64 (o, dq, dk, dv) of grouped-query attention: K/V heads repeated, dK/dV summed per group."""
    host = [cp.asnumpy(x).astype(np.float64) for x in (q, k, v, do)]
    batch, kv_heads = k.shape[:2]
    group = q.shape[1] // kv_heads
    kx, vx = (np.repeat(x, group, axis=1) for x in host[1:3])  # query head h reads K/V head h // group
    o = reference.forward(host[0], kx, vx, causal=causal)[0]
    dq, dk, dv = reference.backward(host[0], kx, vx, host[3], causal=causal)
    return o, dq, *(x.reshape(batch, kv_heads, group, *x.shape[2:]).sum(axis=2) for x in (dk, dv))


@pytest.mark.parametrize("dtype, d, algorithm, causal", [
    ("float16", 64, "flash", False), ("float16", 128, "flash", False), ("float16", 64, "flash", True),
    ("float32", 64, "flash", False), ("float32", 32, "flash", True), ("float16", 64, "standard", False),
])
def test_grouped_query_backward_equals_summed_repeated_heads(dtype, d, algorithm, causal):
    rs = cp.random.default_rng(8)
    q, do = (rs.standard_normal((2, 6, 150, d), dtype=cp.float32).astype(dtype) for _ in range(2))
    k, v = (rs.standard_normal((2, 2, 170, d), dtype=cp.float32).astype(dtype) for _ in range(2))
    o, lse = iokernels.attention(q, k, v, causal=causal, return_lse=True)
    dq, dk, dv = iokernels.attention_backward(q, k, v, o, do, lse, algorithm=algorithm, causal=causal)
    assert dq.shape == q.shape and dk.shape == dv.shape == k.shape and dk.dtype == dv.dtype == q.dtype
    want_o, *wants = _grouped_reference(q, k, v, do, causal)
    tol_o, tol_g = (5e-3, 2e-2) if dtype == "float16" else (1e-5, 1e-4)
    assert rel_err(cp.asnumpy(o).astype(np.float64), want_o) < tol_o
    for got, want in zip((dq, dk, dv), wants, strict=True):
        assert rel_err(cp.asnumpy(got).astype(np.float64), want) < tol_g


def test_grouped_query_backward_numpy_in_numpy_out():
    rng = np.random.default_rng(9)
    q, do = (rng.standard_normal((3, 4, 64, 64)).astype(np.float16) for _ in range(2))
    k, v = (rng.standard_normal((3, 1, 80, 64)).astype(np.float16) for _ in range(2))
    o, lse = iokernels.attention(q, k, v, return_lse=True)
    grads = iokernels.attention_backward(q, k, v, o, do, lse)
    assert all(isinstance(g, np.ndarray) for g in grads) and grads[1].shape == k.shape
    for got, want in zip(grads, _grouped_reference(*(cp.asarray(x) for x in (q, k, v, do)), False)[1:], strict=True):
        assert rel_err(got.astype(np.float64), want) < 2e-2


# copies n 32-bit words after spinning ``cycles`` clocks: work queued behind it on a stream waits
_DELAYED_COPY = r"""
extern "C" __global__ void delayed_copy(const unsigned int* src, unsigned int* dst, long long n, long long cycles)
{
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""
DELAY_CYCLES = 300_000_000  # about 0.15 s at 2 GHz


@pytest.mark.parametrize("algorithm, schedule, dtype, backward, graph", [
    ("flash", None, "float16", False, False), ("flash", "q_outer", "float32", False, False),
    ("standard", None, "float32", False, False), ("two_pass", "store", "float32", False, True),
    ("flash", None, "float16", True, False), ("flash", None, "float32", True, True),
])
def test_kernels_run_on_the_callers_current_stream(algorithm, schedule, dtype, backward, graph):
    rs = cp.random.default_rng(10)
    src, k, v, do = (rs.standard_normal((2, 3, 200, 64), dtype=cp.float32).astype(dtype) for _ in range(4))
    q = cp.zeros_like(src)  # filled by the delayed copy on the stream: a kernel elsewhere would read zeros
    delayed_copy = cp.RawKernel(_DELAYED_COPY, "delayed_copy")
    o, lse = iokernels.attention(src, k, v, return_lse=True)

    def call():
        if backward:
            return iokernels.attention_backward(q, k, v, o, do, lse, graph=graph)[0]
        return iokernels.attention(q, k, v, algorithm=algorithm, schedule=schedule, graph=graph)

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        call()  # compiles, loads and fills the pool on this stream first: no implicit synchronization below
        stream.synchronize()
        q.fill(0)
        delayed_copy((132,), (256,), (src, q, np.int64(src.nbytes // 4), np.int64(DELAY_CYCLES)))
        out = call()
        pending = not stream.done
    stream.synchronize()
    assert pending, "the call waited for the stream: it synchronized, or its kernels ran elsewhere"
    host = [cp.asnumpy(x).astype(np.float64) for x in (src, k, v, do)]
    want = reference.backward(*host)[0] if backward else reference.forward(*host[:3])[0]
    assert rel_err(cp.asnumpy(out).astype(np.float64), want) < (2e-2 if dtype == "float16" else 1e-4)


@pytest.mark.parametrize("fn, algorithm, schedule, dtype, n", [
    ("fwd", "standard", None, "float32", 128), ("fwd", "two_pass", "store", "float32", 256),
    ("fwd", "two_pass", "recompute", "float16", 200), ("fwd", "flash", "kv_outer", "float32", 128),
    ("fwd", "flash", None, "float16", 256), ("bwd", "standard", None, "float32", 128),
    ("bwd", "flash", None, "float32", 256), ("bwd", "flash", None, "float16", 128),
])
def test_graph_replays_equal_plain_launches(fn, algorithm, schedule, dtype, n):
    from iokernels.library import execute

    rs = cp.random.default_rng(11)
    q, k, v, do = (rs.standard_normal((4, n, 64), dtype=cp.float32).astype(dtype) for _ in range(4))
    o, lse = iokernels.attention(q, k, v, return_lse=True)

    def call(graph):
        if fn == "fwd":
            return iokernels.attention(q, k, v, algorithm=algorithm, schedule=schedule, graph=graph)
        return iokernels.attention_backward(q, k, v, o, do, lse, algorithm=algorithm, graph=graph)

    exact = fn == "fwd"  # the backward adds dQ with float atomics: equal up to summation order
    execute.clear_graphs()
    plain, first, second = call(False), call(True), call(True)
    assert len(execute._GRAPHS) == 1  # captured once, then replayed
    for a, b in ((plain, first), (first, second)):
        for x, y in zip(*(t if isinstance(t, tuple) else (t,) for t in (a, b)), strict=True):
            if exact:
                assert cp.array_equal(x, y)
            else:
                assert float(cp.max(cp.abs(x.astype(cp.float32) - y.astype(cp.float32)))) < 1e-2
    # new values in the same buffers: the same graph, new results; the earlier results are copies, unchanged
    snapshot = (first if isinstance(first, tuple) else (first,))[0].copy()
    q[...] = rs.standard_normal(q.shape, dtype=cp.float32).astype(dtype)
    if fn == "bwd":
        o[...], lse[...] = iokernels.attention(q, k, v, return_lse=True)
    third, replain = call(True), call(False)
    assert len(execute._GRAPHS) == 1
    assert cp.array_equal((first if isinstance(first, tuple) else (first,))[0], snapshot)
    for x, y in zip(*(t if isinstance(t, tuple) else (t,) for t in (third, replain)), strict=True):
        assert float(cp.max(cp.abs(x.astype(cp.float32) - y.astype(cp.float32)))) < (1e-2 if not exact else 1e-30)
    execute.clear_graphs()


def test_graph_is_refused_inside_count_io():
    q = cp.zeros((1, 64, 64), cp.float32)
    with iokernels.count_io(), pytest.raises(ValueError, match="graph=True"):
        iokernels.attention(q, q, q, algorithm="standard", graph=True)


def test_standard_attention_too_large_fails_before_allocating():
    q = cp.zeros((1, 1 << 20, 64), cp.float16)
    pool = cp.get_default_memory_pool()
    before = pool.used_bytes()
    with pytest.raises(iokernels.DeviceMemoryError, match=r"needs 4096\.\d\d GB, device has \d+\.\d\d GB free"):
        iokernels.attention(q, q, q, algorithm="standard")
    with pytest.raises(MemoryError, match="needs"):
        iokernels.attention(q, q, q, algorithm="two_pass", schedule="store")
    assert pool.used_bytes() == before


def test_compiled_kernels_are_memoized_per_device():
    from iokernels.kernels import launch

    q = cp.random.default_rng(12).standard_normal((2, 100, 64), dtype=cp.float32)
    want = iokernels.attention(q, q, q, algorithm="standard")
    before = launch._function.cache_info()
    again = iokernels.attention(q, q, q, algorithm="standard")
    after = launch._function.cache_info()
    assert after.misses == before.misses and cp.array_equal(want, again)  # (the second call: launched as prepared)
    if cp.cuda.runtime.getDeviceCount() > 1:
        with cp.cuda.Device(1):
            other = iokernels.attention(cp.asarray(q), cp.asarray(q), cp.asarray(q), algorithm="standard")
            assert other.device.id == 1
        assert launch._function.cache_info().misses > after.misses  # the same kernels, compiled for device 1
        assert cp.array_equal(cp.asarray(other), want)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_attention_and_backward(dtype, causal):
    """block_mask= through the library: a random block pattern with empty rows, forward and backward
    against the float64 reference under the same element mask (rows that see no key: 0, never NaN)."""
    from iokernels.plan.masks import pattern

    rng = np.random.default_rng(11)
    n_q, n_k, d = 300, 517, 64
    mask = pattern("random", 0.3, n_q=n_q, n_k=n_k, block_q=64, seed=3)
    host = [rng.standard_normal((2, n, d)) for n in (n_q, n_k, n_k, n_q)]
    q, k, v, do = (cp.asarray(x.astype(dtype)) for x in host)
    o, lse = iokernels.attention(q, k, v, block_mask=mask, causal=causal, return_lse=True)
    grads = iokernels.attention_backward(q, k, v, o, do, lse, block_mask=mask, causal=causal)
    x64 = [cp.asnumpy(x).astype(np.float64) for x in (q, k, v, do)]
    want_o, _ = reference.forward(*x64[:3], causal=causal, mask=mask.element_mask())
    want_g = reference.backward(*x64, causal=causal, mask=mask.element_mask())
    tol = 1e-4 if dtype == "float32" else 2e-2
    assert np.all(np.isfinite(cp.asnumpy(o).astype(np.float64)))
    assert rel_err(cp.asnumpy(o).astype(np.float64), want_o) < tol
    for got, want in zip(grads, want_g, strict=True):
        assert rel_err(cp.asnumpy(got).astype(np.float64), want) < tol
    with pytest.raises(ValueError, match="deterministic"):
        iokernels.attention_backward(q, k, v, o, do, lse, block_mask=mask, deterministic=True)


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("shared", [True, False])
def test_explicit_mask_attention_and_backward(kind, shared):
    """mask= through the library (cupy in, cupy out): a boolean or additive mask, shared or per batch-head,
    with causal; forward and backward against the float64 reference under the same mask, and the
    numpy mask equal to the cupy one."""
    rng = np.random.default_rng(5)
    lead, n_q, n_k, d = (2, 3), 200, 333, 64
    shape = (n_q, n_k) if shared else (*lead, n_q, n_k)
    visible = rng.random(shape) < 0.7
    host_mask = visible if kind == "bool" else np.where(visible, rng.standard_normal(shape), -np.inf)
    host = [rng.standard_normal((*lead, n, d)) for n in (n_q, n_k, n_k, n_q)]
    q, k, v, do = (cp.asarray(x.astype(np.float32)) for x in host)
    mask = cp.asarray(host_mask.astype(bool if kind == "bool" else np.float32))
    o, lse = iokernels.attention(q, k, v, mask=mask, causal=True, return_lse=True)
    o_np = iokernels.attention(*(cp.asnumpy(x) for x in (q, k, v)), mask=host_mask, causal=True)
    grads = iokernels.attention_backward(q, k, v, o, do, lse, mask=mask, causal=True)
    x64 = [cp.asnumpy(x).astype(np.float64) for x in (q, k, v, do)]
    ref_mask = np.broadcast_to(host_mask.astype(bool if kind == "bool" else np.float64), (*lead, n_q, n_k))
    want_o, _ = reference.forward(*x64[:3], causal=True, mask=ref_mask)
    want_g = reference.backward(*x64, causal=True, mask=ref_mask)
    got_o = cp.asnumpy(o).astype(np.float64)
    assert np.all(np.isfinite(got_o)) and rel_err(got_o, want_o) < 1e-4
    assert np.array_equal(o_np, cp.asnumpy(o))
    for got, want in zip(grads, want_g, strict=True):
        assert rel_err(cp.asnumpy(got).astype(np.float64), want) < 1e-4
