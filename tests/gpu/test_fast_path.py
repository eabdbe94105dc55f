"""The library's fast path (a call signature's second and later calls: outputs allocated, kernels launched on
raw addresses) against its first call (planned and checked, through the general launcher): equal outputs for
cupy arrays and torch tensors, masks and dropout included, on the caller's stream; torch masked calls
captured in a CUDA graph on the first try."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

import iokernels  # noqa: E402
from iokernels.library import dispatch  # noqa: E402
from iokernels.plan.dropout import Dropout  # noqa: E402


def _arrays(shape, dtype="float16", seed=0):
    rng = cp.random.default_rng(seed)
    return [rng.standard_normal(shape, dtype=cp.float32).astype(dtype) for _ in range(3)]


@pytest.mark.parametrize("options", [
    {}, {"causal": True}, {"dropout": Dropout(0.2, 7, 3)}, {"schedule": "q_outer"},
    {"mask": "bool"}, {"mask": "additive"}], ids=lambda o: "-".join(map(str, o)) or "plain")
def test_the_fast_path_gives_the_first_calls_outputs(options):
    dispatch.clear_dispatch_cache()
    # (a float16 mask call runs the tma kernels as a variant, iokernels/library/explicit.py: float32 keeps these on
    # the research kernels' fast path)
    q, k, v = _arrays((2, 4, 200, 64), "float32" if "mask" in options else "float16")
    if "mask" in options:
        rng = cp.random.default_rng(3)
        options = {**options, "mask": rng.random((200, 200)) > 0.3 if options["mask"] == "bool"
                   else cp.where(rng.random((4, 200, 200)) > 0.3, 0.0, -cp.inf).astype(cp.float32)}
    first = iokernels.attention(q, k, v, return_lse=True, **options)
    call = next(iter(dispatch.CACHE.entries.values()))
    assert call.fast is not None  # prepared by the first call
    second = iokernels.attention(q, k, v, return_lse=True, **options)
    for a, b in zip(first, second, strict=True):
        assert cp.array_equal(a, b, equal_nan=True)
    do = _arrays((2, 4, 200, 64), q.dtype, seed=1)[0]
    backward = {n: x for n, x in options.items() if n != "schedule"}
    grads = [iokernels.attention_backward(q, k, v, first[0], do, first[1], **backward) for _ in range(2)]
    for a, b in zip(*grads, strict=True):  # dQ is summed with float atomics: equal to rounding
        assert not cp.isnan(b).any() and cp.allclose(a, b, atol=2e-3, rtol=1e-2)


def test_the_memo_serves_each_spelling_of_a_call_its_own_outputs():
    """A cupy call with no mask or dropout is found from its arguments as given (dispatch.CUPY_CALLS) from its
    third call on: each spelling of the options gets its own entry and the outputs of the checked path."""
    dispatch.clear_dispatch_cache()
    q, k, v = _arrays((2, 4, 200, 64))
    do = _arrays((2, 4, 200, 64), seed=1)[0]
    for options in ({}, {"causal": True}, {"causal": "top_left"}, {"scale": 0.25}, {"scale": 1}):
        runs = [iokernels.attention(q, k, v, return_lse=True, **options) for _ in range(4)]
        grads = [iokernels.attention_backward(q, k, v, runs[0][0], do, runs[0][1], **options) for _ in range(4)]
        for run in runs[1:]:
            assert all(cp.array_equal(a, b) for a, b in zip(runs[0], run, strict=True))
        for g in grads[1:]:
            assert all(cp.allclose(a, b, atol=2e-3, rtol=1e-2) for a, b in zip(grads[0], g, strict=True))
    assert len(dispatch.CUPY_CALLS.entries) == 10  # five spellings, forward and backward
    plain, quarter = iokernels.attention(q, k, v), iokernels.attention(q, k, v, scale=0.25)
    assert not cp.array_equal(plain, quarter)  # the memo did not hand one spelling another's plan
    assert not cp.array_equal(iokernels.attention(q, k, v, causal=True), plain)


def test_the_fast_path_runs_on_the_callers_stream():
    q, k, v = _arrays((1, 2, 300, 64))
    want = iokernels.attention(q, k, v)
    cp.cuda.get_current_stream().synchronize()  # q, k, v are written: the other stream does not wait for this one
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        got = [iokernels.attention(q, k, v) for _ in range(3)]
    stream.synchronize()
    assert all(cp.array_equal(g, want) for g in got)


def test_numpy_in_numpy_out_on_every_call():
    q, k, v = (cp.asnumpy(x) for x in _arrays((2, 128, 64), "float32"))
    outs = [iokernels.attention(q, k, v) for _ in range(3)]
    assert all(isinstance(o, np.ndarray) and np.array_equal(o, outs[0]) for o in outs)


def test_torch_eager_calls_equal_the_operators():
    torch = pytest.importorskip("torch")
    itorch = pytest.importorskip("iokernels.torch")
    q, k, v = (torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask = torch.rand(256, 256, device="cuda") > 0.2
    for kwargs in ({}, {"is_causal": True}, {"attn_mask": mask}):
        eager = [itorch.attention(q, k, v, **kwargs) for _ in range(3)]
        causal = "top_left" if kwargs.get("is_causal") else ""
        op, _, _ = torch.ops.iokernels.attention_fwd(q, k, v, kwargs.get("attn_mask"), 0.0, 0, -1, causal, None,
                                                     "flash", None, None, False)
        assert all(torch.equal(e, op) for e in eager)


def test_a_masked_torch_call_is_captured_on_the_first_try():
    torch = pytest.importorskip("torch")
    itorch = pytest.importorskip("iokernels.torch")
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    mask = torch.rand(4, 256, 256, device="cuda") > 0.3
    do = torch.randn_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            itorch.attention(q, k, v, attn_mask=mask).backward(do)
    torch.cuda.current_stream().wait_stream(side)
    for t in (q, k, v):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_o = itorch.attention(q, k, v, attn_mask=mask)
        static_o.backward(do)
    with torch.no_grad():
        mask.copy_(torch.rand(4, 256, 256, device="cuda") > 0.5)  # the graph reads the mask's memory
    graph.replay()
    torch.cuda.synchronize()
    got = [static_o.clone(), *(t.grad.clone() for t in (q, k, v))]
    eager = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = itorch.attention(*eager, attn_mask=mask)
    o.backward(do)
    assert torch.equal(got[0], o)
    for g, t in zip(got[1:], eager, strict=True):
        assert torch.allclose(g, t.grad, atol=2e-3, rtol=1e-2)


@pytest.mark.parametrize("d", [32, 96, 160, 256])
def test_head_dims_inside_a_wider_tile_run_the_tma_forward(d):
    """d 32, 96, 160, 256 through the public calls: the forward is the tma kernel on sm_90 (d in the tile of the next
    multiple of 64), the backward the tma kernel up to d 128 (the same tile) and the research kernels past it;
    outputs and gradients against float64 within the float16 idiom."""
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the tma kernel runs on sm_90 only")
    torch = pytest.importorskip("torch")
    itorch = pytest.importorskip("iokernels.torch")
    dispatch.clear_dispatch_cache()
    q, k, v = (torch.randn(2, 4, 300, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    o = itorch.attention(q, k, v, is_causal=True)
    kernels = [p.stages[0].kernel for e in dispatch.CACHE.entries.values() for p in e.chain]
    assert "flash_tma_fwd" in kernels
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    half = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (o.double() - want).abs().max() <= 2 * (half.double() - want).abs().max() + 1e-4
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    wants = torch.autograd.grad(want, (q64, k64, v64), do.double())
    halves = torch.autograd.grad(half, (q, k, v), do)
    for g, w, h in zip(grads, wants, halves, strict=True):
        assert (g.double() - w).abs().max() <= 2 * (h.double() - w).abs().max() + 1e-3
    stages = [s for e in dispatch.CACHE.entries.values() for p in e.chain for s in p.stages]
    sm90 = [dict(s.params) for s in stages if s.kernel == "flash_tma_bwd"]
    if d > 128:
        assert not sm90
        return
    assert sm90 and all(params["HEAD_D_TILE"] == (64 if d <= 64 else 128) and "CAUSAL" in params for params in sm90)
