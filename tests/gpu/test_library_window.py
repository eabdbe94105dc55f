"""The sliding window through the library on the GPU (sm_90: the tma kernels apply it): iokernels.attention /
attention_backward on cupy and numpy float16 inputs and iokernels.torch.attention with autograd and torch.compile,
against the float64 reference given the band as a boolean mask written out here from the definition (query i sees
key j iff i + o - left <= j <= i + o + right, o = N_k - N_q, and the causal mask when given); rows that see no key;
and calls with and without a window on the same arrays, each getting its own plans (cache and memo keys).

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_library_window.py`` (skips without cupy or an sm_90 device; the
torch tests also without torch).
"""

import numpy as np
import pytest

import iokernels
from iokernels.simulate import reference

from .helpers import rel_err

cp = pytest.importorskip("cupy")
try:  # the torch tests need it, the others do not
    import torch

    import iokernels.torch as itorch
except ImportError:
    torch = itorch = None

TOL_FWD, TOL_BWD = 5e-3, 2e-2  # float16, as tests/gpu/test_library_dropout.py (relative to max |want|)


pytestmark = pytest.mark.usefixtures("sm90")


def band(n_q, n_k, window, causal=False):
    """The visibility rule, from its definition: boolean (n_q, n_k)."""
    i, j, o = np.arange(n_q)[:, None], np.arange(n_k)[None, :], n_k - n_q
    left, right = (-1 if w is None else w for w in window)
    visible = np.ones((n_q, n_k), bool)
    if left >= 0:
        visible &= j >= i + o - left
    if right >= 0:
        visible &= j <= i + o + right
    if causal:
        visible &= j <= i + (0 if causal == "top_left" else o)
    return visible


def _inputs(q_shape, kv_shape, seed=0, dtype=np.float16):
    rng = np.random.default_rng(seed)
    q, do = (rng.standard_normal(q_shape).astype(dtype) for _ in range(2))
    k, v = (rng.standard_normal(kv_shape).astype(dtype) for _ in range(2))
    return q, k, v, do


def _want(q, k, v, do, visible):
    """float64 O, lse and (dq, dk, dv), K/V heads repeated for grouped-query attention and their grads summed."""
    host = [np.asarray(x, np.float64) for x in (q, k, v, do)]
    group = q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1
    kx, vx = (np.repeat(x, group, axis=-3) for x in host[1:3])
    o, lse = reference.forward(host[0], kx, vx, mask=visible)
    dq, dk, dv = reference.backward(host[0], kx, vx, host[3], mask=visible)
    if group > 1:
        dk, dv = (x.reshape(*k.shape[:-3], k.shape[-3], group, *k.shape[-2:]).sum(axis=-3) for x in (dk, dv))
    return o, lse, (dq, dk, dv)


def _host(x):
    return (cp.asnumpy(x) if isinstance(x, cp.ndarray) else np.asarray(x)).astype(np.float64)


CASES = [  # q shape, k/v shape, window, causal
    ((2, 2, 1000, 64), (2, 2, 1000, 64), (128, 128), False),
    ((1, 2, 113, 128), (1, 2, 1000, 128), (100, 20), True),  # with causal (bottom-right): the intersection
    ((1, 4, 300, 64), (1, 2, 300, 64), (50, 50), False),  # grouped-query
    ((1, 2, 1000, 64), (1, 2, 113, 64), (30, 5), False),  # the first 882 rows see no key
    ((2, 1, 517, 96), (2, 1, 517, 96), (None, 0), "top_left"),  # d inside a wider tile
    ((1, 1, 239, 256), (1, 1, 239, 256), (64, -1), False),  # d 256: the wide backward
]
IDS = [f"{q[-2]}x{k[-2]}x{q[-1]}-h{q[-3]}.{k[-3]}-{w[0]},{w[1]}-{c}" for q, k, w, c in CASES]


@pytest.mark.parametrize("q_shape, kv_shape, window, causal", CASES, ids=IDS)
def test_forward_and_backward_match_float64_given_the_band(q_shape, kv_shape, window, causal):
    q, k, v, do = (cp.asarray(x) for x in _inputs(q_shape, kv_shape))
    visible = band(q_shape[-2], kv_shape[-2], window, causal)
    want_o, want_lse, want_grads = _want(*(cp.asnumpy(x) for x in (q, k, v, do)), visible)
    o, lse = iokernels.attention(q, k, v, window=window, causal=causal, return_lse=True)
    assert isinstance(o, cp.ndarray) and o.dtype == cp.float16 and o.shape == q.shape
    got_o, got_lse = _host(o), _host(lse)
    assert rel_err(got_o, want_o) < TOL_FWD
    finite = np.isfinite(want_lse)
    assert np.array_equal(np.isfinite(got_lse), finite) and np.all(np.isneginf(got_lse[~finite]))
    assert np.max(np.abs(got_lse[finite] - want_lse[finite])) < 1e-2
    blind = ~visible.any(axis=1)  # rows that see no key: O = 0
    assert np.all(got_o[..., blind, :] == 0)
    grads = iokernels.attention_backward(q, k, v, o, do, lse, window=window, causal=causal)
    for name, got, want in zip(("dq", "dk", "dv"), grads, want_grads, strict=True):
        assert got.shape == want.shape and got.dtype == cp.float16, name
        assert rel_err(_host(got), want) < TOL_BWD, name
    assert np.all(_host(grads[0])[..., blind, :] == 0)
    unseen = ~visible.any(axis=0)  # keys no query sees: dk = dv = 0
    assert np.all(_host(grads[1])[..., unseen, :] == 0) and np.all(_host(grads[2])[..., unseen, :] == 0)


def test_numpy_in_numpy_out_with_a_window():
    q, k, v, do = _inputs((2, 3, 200, 64), (2, 3, 260, 64), seed=1)
    visible = band(200, 260, (40, 10))
    want_o, _, want_grads = _want(q, k, v, do, visible)
    o, lse = iokernels.attention(q, k, v, window=(40, 10), return_lse=True)
    assert isinstance(o, np.ndarray) and rel_err(o.astype(np.float64), want_o) < TOL_FWD
    grads = iokernels.attention_backward(q, k, v, o, do, lse, window=[40, 10])
    for got, want in zip(grads, want_grads, strict=True):
        assert isinstance(got, np.ndarray) and rel_err(got.astype(np.float64), want) < TOL_BWD


def test_calls_with_and_without_a_window_on_the_same_arrays_are_each_masked_right():
    """Each signature's second call takes the fast path (its memo): a plain call after a window call, and the
    reverse, must not reuse the other's plans."""
    q, k, v, do = (cp.asarray(x) for x in _inputs((2, 4, 512, 64), (2, 4, 512, 64), seed=3))
    wants = {w: _want(*(cp.asnumpy(x) for x in (q, k, v, do)), band(512, 512, w or (-1, -1)))
             for w in (None, (64, 64), (64, 0))}
    for window in (None, (64, 64), None, (64, 64), (-1, -1), (64, 0), None, (64, 0), (64, 64)):
        want_o, _, want_grads = wants[None if window == (-1, -1) else window]
        o, lse = iokernels.attention(q, k, v, window=window, return_lse=True)
        assert rel_err(_host(o), want_o) < TOL_FWD, window
        grads = iokernels.attention_backward(q, k, v, o, do, lse, window=window)
        for got, want in zip(grads, want_grads, strict=True):
            assert rel_err(_host(got), want) < TOL_BWD, window
    plain, banded = wants[None][0], wants[(64, 64)][0]
    assert rel_err(banded, plain) > 100 * TOL_FWD  # the windows change O: the checks above tell them apart


# ---------------------------------------------------------------------------------------------
# iokernels.torch

@pytest.fixture
def torch_ready(monkeypatch):
    """Skip without torch; and no NaN poisoning: the backward runs in torch's autograd thread, where the first raw
    launch may find no current CUDA context, and the poisoning's fill (kernels/rawlaunch.fill_nan) does not make one
    current as the kernel launches do (tests/gpu/test_torch_op.py runs unpoisoned too)."""
    if torch is None:
        pytest.skip("needs torch")
    from iokernels.kernels import launch

    monkeypatch.setattr(launch, "DEBUG_POISON", False)


def _torch_inputs(q_shape, kv_shape, dtype, seed=0):
    q, k, v, do = _inputs(q_shape, kv_shape, seed, np.float32)
    return [torch.tensor(x, device="cuda", dtype=dtype, requires_grad=i < 3) for i, x in enumerate((q, k, v, do))]


def _t64(t):
    return t.detach().double().cpu().numpy()


@pytest.mark.parametrize("dtype_name, q_shape, kv_shape, window, causal", [
    ("float16", (2, 2, 1000, 64), (2, 2, 1000, 64), (128, 128), False),
    ("bfloat16", (1, 4, 300, 64), (1, 2, 300, 64), (50, None), "bottom_right"),
    ("float16", (1, 2, 113, 128), (1, 2, 1000, 128), (100, 20), True),
])
@pytest.mark.usefixtures("torch_ready")
def test_torch_autograd_matches_float64(dtype_name, q_shape, kv_shape, window, causal):
    dtype = getattr(torch, dtype_name)
    q, k, v, do = _torch_inputs(q_shape, kv_shape, dtype)
    o = itorch.attention(q, k, v, window=window, causal=causal)
    o.backward(do)
    visible = band(q_shape[-2], kv_shape[-2], window, causal)
    want_o, _, want_grads = _want(*(_t64(t) for t in (q, k, v, do)), visible)
    scale = 4 if dtype == torch.bfloat16 else 1  # bfloat16: 3 fewer mantissa bits than float16
    assert o.dtype == dtype and rel_err(_t64(o), want_o) < scale * TOL_FWD
    for name, t, want in zip("qkv", (q, k, v), want_grads, strict=True):
        assert t.grad.dtype == dtype and rel_err(_t64(t.grad), want) < scale * TOL_BWD, name
    # FlashAttention's spelling of an unbounded side, -1, is the same window as None
    again = itorch.attention(q, k, v, window=tuple(-1 if w is None else w for w in window), causal=causal)
    assert torch.equal(again, o)


@pytest.mark.usefixtures("torch_ready")
def test_torch_plain_after_window_is_not_masked():
    q, k, v, do = _torch_inputs((2, 4, 512, 64), (2, 4, 512, 64), torch.float16, seed=4)
    wants = {w: _want(*(_t64(t) for t in (q, k, v, do)), band(512, 512, w or (-1, -1))) for w in (None, (32, 32))}
    for window in (None, (32, 32), None, (32, 32), None):
        for t in (q, k, v):
            t.grad = None
        o = itorch.attention(q, k, v, window=window)
        o.backward(do)
        want_o, _, want_grads = wants[window]
        assert rel_err(_t64(o), want_o) < TOL_FWD, window
        assert rel_err(_t64(k.grad), want_grads[1]) < TOL_BWD, window
        with torch.no_grad():  # the no-grad eager path has its own fast-path key
            assert rel_err(_t64(itorch.attention(q, k, v, window=window)), want_o) < TOL_FWD, window


@pytest.mark.usefixtures("torch_ready")
def test_torch_compile_traces_a_window_without_a_graph_break():
    torch._dynamo.reset()

    def step(q, k, v):
        return itorch.attention(q, k, v, is_causal=True, window=(96, 0)).float().square().mean()

    q, k, v, _ = _torch_inputs((2, 8, 256, 64), (2, 2, 256, 64), torch.bfloat16, seed=5)
    explained = torch._dynamo.explain(step)(q, k, v)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    loss = torch.compile(step, fullgraph=True)(q, k, v)
    loss.backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    want = step(q, k, v)
    want.backward()
    assert torch.allclose(loss, want, rtol=1e-3)
    for g, t in zip(got, (q, k, v), strict=True):
        assert torch.allclose(g.float(), t.grad.float(), atol=5e-3, rtol=2e-2)
    plain = itorch.attention(q, k, v, is_causal=True).float().square().mean()
    assert not torch.allclose(plain, want, rtol=1e-3)  # the compiled call did apply the window
