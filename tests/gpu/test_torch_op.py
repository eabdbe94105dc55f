"""iokernels.torch.attention as torch custom operators on CUDA: torch.library.opcheck, torch.compile
(fullgraph, forward and backward), torch.cuda.graph capture on the first try (forward and backward),
and gradients equal to the library's own (iokernels.attention / attention_backward on the same memory)."""

import pytest

torch = pytest.importorskip("torch")
itorch = pytest.importorskip("iokernels.torch")
ops = pytest.importorskip("iokernels.library.torch_ops")

import iokernels  # noqa: E402
from iokernels.plan.dropout import Dropout  # noqa: E402


@pytest.fixture(autouse=True)
def plain_outputs(monkeypatch):
    """opcheck and graph replays compare runs: no NaN poisoning (a fill kernel per buffer) here."""
    from iokernels.kernels import launch

    monkeypatch.setattr(launch, "DEBUG_POISON", False)


def _inputs(shape=(2, 4, 128, 64), kv_heads=None, dtype=torch.float16, seed=0, grad=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kv_shape = shape if kv_heads is None else (*shape[:-3], kv_heads, *shape[-2:])
    q = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(kv_shape, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def _fwd_args(q, k, v, mask=None, causal="", deterministic=False):
    return (q, k, v, mask, 0.0, 0, -1, causal, None, "flash", None, None, deterministic)


@pytest.mark.parametrize("causal, kv_heads", [("", None), ("top_left", 2)])
def test_opcheck_forward(causal, kv_heads):
    q, k, v = _inputs((1, 4, 64, 64), kv_heads)
    torch.library.opcheck(torch.ops.iokernels.attention_fwd.default, _fwd_args(q, k, v, causal=causal))


def test_opcheck_forward_with_gradients():
    """deterministic=True: the backward (mma.sync, dQ without atomics) gives the same bits run to run, so
    opcheck's eager and compiled gradients compare exactly."""
    q, k, v = _inputs((1, 2, 64, 64), grad=True)
    torch.library.opcheck(torch.ops.iokernels.attention_fwd.default, _fwd_args(q, k, v, deterministic=True))


def test_opcheck_backward():
    q, k, v = _inputs((1, 2, 64, 64))
    out, lse, rng = torch.ops.iokernels.attention_fwd(*_fwd_args(q, k, v))
    do = torch.randn_like(out)
    torch.library.opcheck(torch.ops.iokernels.attention_bwd.default,
                          (do, q, k, v, out, lse, None, 0.0, rng, "", None, "flash", None, True))


def _library_grads(q, k, v, do, causal="", mask=None, dropout=None):
    """The library's own forward and backward on the same memory (what the autograd formula must equal)."""
    import cupy as cp

    views = [ops.as_cupy(cp, t.detach().contiguous()) for t in (q, k, v, do)]
    mask_view = None if mask is None else ops.as_cupy(cp, mask)
    with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        o, lse = iokernels.attention(*views[:3], causal=causal, return_lse=True, mask=mask_view, dropout=dropout)
        grads = iokernels.attention_backward(*views[:3], o, views[3], lse, causal=causal, mask=mask_view,
                                             dropout=dropout)
    return [torch.as_tensor(x, device="cuda") for x in (o, *grads)]


@pytest.mark.parametrize("causal, kv_heads, masked", [("", None, False), ("bottom_right", 2, False),
                                                      ("", None, True)])
def test_gradients_equal_the_librarys(causal, kv_heads, masked):
    q, k, v = _inputs((2, 4, 200, 64), kv_heads, grad=True)
    mask = (torch.rand(200, 200, device="cuda") > 0.2) if masked else None
    do = torch.randn(q.shape, device="cuda", dtype=q.dtype)
    o = itorch.attention(q, k, v, causal=causal, mask=mask)
    o.backward(do)
    want = _library_grads(q, k, v, do, causal, mask)
    assert torch.equal(o, want[0])
    for t, w in zip((q, k, v), want[1:], strict=True):
        assert torch.allclose(t.grad, w, atol=2e-3, rtol=1e-2)  # dQ sums in float32 atomics: order varies


def test_dropout_backward_regenerates_the_forwards_mask():
    q, k, v = _inputs((1, 2, 128, 64), grad=True)
    do = torch.randn(q.shape, device="cuda", dtype=q.dtype)
    drop = Dropout(0.2, 2**64 - 3, 11)  # a seed above 2**63 crosses the schema as a negative int64
    o = itorch.attention(q, k, v, dropout=drop)
    o.backward(do)
    want = _library_grads(q, k, v, do, dropout=drop)
    assert torch.equal(o, want[0])
    for t, w in zip((q, k, v), want[1:], strict=True):
        assert torch.allclose(t.grad, w, atol=2e-3, rtol=1e-2)
    assert not torch.equal(itorch.attention(q, k, v, dropout_p=0.2), itorch.attention(q, k, v, dropout_p=0.2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compile_fullgraph_forward_and_backward(dtype):
    torch._dynamo.reset()

    def step(q, k, v):
        return itorch.attention(q, k, v, is_causal=True).float().square().mean()

    compiled = torch.compile(step, fullgraph=True)
    q, k, v = _inputs((2, 8, 256, 64), 2, dtype, grad=True)
    loss = compiled(q, k, v)
    loss.backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    want = step(q, k, v)
    want.backward()
    assert torch.allclose(loss, want, rtol=1e-3)
    for g, t in zip(got, (q, k, v), strict=True):
        assert torch.allclose(g.float(), t.grad.float(), atol=5e-3, rtol=2e-2)


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_cuda_graph_capture_works_on_the_first_try(kv_heads):
    """The usual recipe (warm up on a side stream, then capture once): forward and backward captured, then
    replayed on new inputs copied into the static ones, equal to eager calls."""
    q, k, v = _inputs((2, 4, 256, 64), kv_heads, grad=True)
    do = torch.randn(q.shape, device="cuda", dtype=q.dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            itorch.attention(q, k, v, causal=True).backward(do)
    torch.cuda.current_stream().wait_stream(side)
    for t in (q, k, v):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_o = itorch.attention(q, k, v, causal=True)
        static_o.backward(do)
    fresh = _inputs((2, 4, 256, 64), kv_heads, seed=5)
    with torch.no_grad():
        for t, x in zip((q, k, v), fresh, strict=True):
            t.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    got = [static_o.clone(), *(t.grad.clone() for t in (q, k, v))]
    eager = [x.detach().clone().requires_grad_() for x in fresh]
    o = itorch.attention(*eager, causal=True)
    o.backward(do)
    assert torch.equal(got[0], o)
    for g, t in zip(got[1:], eager, strict=True):
        assert torch.allclose(g, t.grad, atol=2e-3, rtol=1e-2)


def test_bad_input_fails_clearly_on_the_op_too():
    q, k, v = _inputs((1, 2, 64, 64))
    with pytest.raises(ValueError, match="is on cpu"):
        torch.ops.iokernels.attention_fwd(*_fwd_args(q, k.cpu(), v))
    with pytest.raises(TypeError, match="mixed dtypes"):
        torch.ops.iokernels.attention_fwd(*_fwd_args(q, k.float(), v))
    with pytest.raises(ValueError, match="head dimension"):
        torch.ops.iokernels.attention_fwd(*_fwd_args(q[..., :60], k[..., :60], v[..., :60]))
