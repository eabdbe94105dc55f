"""iokernels.torch.attention on CUDA tensors: forward and autograd backward against float64, streams,
a training step."""

import numpy as np
import pytest

from iokernels.simulate import reference

from .helpers import rel_err

torch = pytest.importorskip("torch")
itorch = pytest.importorskip("iokernels.torch")
torch_ops = pytest.importorskip("iokernels.library.torch_ops")

TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (5e-3, 2e-2), torch.bfloat16: (3e-2, 8e-2)}


def _host(t):
    return t.detach().double().cpu().numpy()


@pytest.mark.parametrize("dtype, d, causal, kv_heads", [
    (torch.float16, 64, False, 4), (torch.float16, 128, True, 4), (torch.float32, 64, False, 4),
    (torch.bfloat16, 64, False, 4), (torch.bfloat16, 128, "top_left", 2), (torch.float16, 64, False, 2),
    (torch.float32, 32, True, 1),
])
def test_forward_and_backward_match_float64(dtype, d, causal, kv_heads):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 4, 200, d, device="cuda", dtype=dtype, generator=gen, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, 170, d, device="cuda", dtype=dtype, generator=gen, requires_grad=True)
            for _ in range(2))
    o = itorch.attention(q, k, v, causal=causal)
    assert o.dtype == dtype and o.shape == q.shape and o.device == q.device and o.grad_fn is not None
    do = torch.randn(o.shape, device="cuda", dtype=dtype, generator=gen)
    o.backward(do)
    group = 4 // kv_heads
    qh, kh, vh, doh = (_host(x) for x in (q, k, v, do))
    kx, vx = (np.repeat(x, group, axis=1) for x in (kh, vh))
    want_o = reference.forward(qh, kx, vx, causal=causal)[0]
    dq, dk, dv = reference.backward(qh, kx, vx, doh, causal=causal)
    dk, dv = (x.reshape(2, kv_heads, group, 170, d).sum(axis=2) for x in (dk, dv))
    tol_o, tol_g = TOLERANCE[dtype]
    assert rel_err(_host(o), want_o) < tol_o
    for t, want in ((q, dq), (k, dk), (v, dv)):
        assert t.grad.dtype == dtype and t.grad.shape == t.shape
        assert rel_err(_host(t.grad), want) < tol_g


def test_a_training_step_matches_sdpa():
    """Non-contiguous q, k, v (views of one projection) through autograd into a layer's weights."""
    torch.manual_seed(1)
    x = torch.randn(2, 128, 64, device="cuda")
    grads = {}
    for impl in ("iokernels", "sdpa"):
        torch.manual_seed(2)
        layer = torch.nn.Linear(64, 3 * 64, device="cuda")
        qkv = layer(x).view(2, 128, 3, 4, 16).permute(2, 0, 3, 1, 4)  # (3, batch, heads, N, d): not contiguous
        q, k, v = qkv[0], qkv[1], qkv[2]
        if impl == "iokernels":
            o = itorch.attention(q, k, v, causal="top_left")
        else:
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        loss = o.square().mean()
        loss.backward()
        grads[impl] = (loss.item(), layer.weight.grad.clone())
        before = layer.weight.detach().clone()
        torch.optim.SGD(layer.parameters(), lr=0.1).step()
        assert not torch.equal(before, layer.weight)
    assert abs(grads["iokernels"][0] - grads["sdpa"][0]) < 1e-5 * abs(grads["sdpa"][0])
    assert rel_err(_host(grads["iokernels"][1]), _host(grads["sdpa"][1])) < 1e-3


def test_runs_on_torchs_current_stream():
    gen = torch.Generator(device="cuda").manual_seed(3)
    src, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
    q = torch.zeros_like(src)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        itorch.attention(src, k, v)  # compile and fill both memory pools on this stream first
        side.synchronize()
        torch.cuda._sleep(300_000_000)  # the copy below, and what follows it on this stream, waits
        q.copy_(src)
        o = itorch.attention(q, k, v)
        pending = not side.query()
    side.synchronize()
    assert pending
    assert rel_err(_host(o), reference.forward(_host(src), _host(k), _host(v))[0]) < 5e-3


def test_no_copies_for_contiguous_inputs():
    """The forward reads the caller's memory: cupy's view of a tensor has the tensor's address, and the
    outputs live in torch's caching allocator (cupy's pool allocates nothing)."""
    import cupy as cp

    q = torch.randn(1, 64, 64, device="cuda", dtype=torch.float16)
    assert torch_ops.as_cupy(cp, q).data.ptr == q.data_ptr()
    b = q.to(torch.bfloat16)
    assert torch_ops.as_cupy(cp, b).data.ptr == b.data_ptr()
    itorch.attention(q, q, q)  # compiled, planned
    pool = cp.get_default_memory_pool()
    used = pool.used_bytes()
    with torch_ops.torch_stream(q.device) as (_, allocator):
        x = cp.empty((3, 5), dtype=cp.float32)
        assert torch.equal(allocator.tensor(x, torch.float32), torch.as_tensor(x, device="cuda"))
    o = itorch.attention(q, q, q)
    assert pool.used_bytes() == used and o.is_contiguous() and o.dtype == q.dtype
