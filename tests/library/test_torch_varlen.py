"""iokernels.torch.attention_varlen on the CPU (needs torch, not a GPU): the operators' schemas, their fake
implementations' outputs, every bad argument refused with its value before anything is launched (front end, operators,
fake tensors), torch.compile tracing one node each way, the autograd formula end to end against per-sequence SDPA in
float64 (float64 reference kernels standing in for the cupy side), and the fast path of a signature's later calls (on
stand-ins for the cupy side)."""

import contextlib
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
itorch = pytest.importorskip("iokernels.torch")
ops = pytest.importorskip("iokernels.library.torch_ops")
vops = pytest.importorskip("iokernels.library.torch_varlen")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from iokernels.library import varlen  # noqa: E402
from iokernels.library.dispatch import TORCH_CALLS, Dispatch  # noqa: E402

from .fakes import PassAllocator, RawPlan, ViewCupy  # noqa: E402

FWD, BWD = torch.ops.iokernels.attention_varlen_fwd, torch.ops.iokernels.attention_varlen_bwd


def _tensors(q=(300, 8, 64), k=(200, 2, 64), v=None, cu_q=(4,), cu_k=None, dtype=torch.float16, device="meta",
             offsets_dtype=torch.int32):
    """q, k, v, cu_seqlens_q, cu_seqlens_k of these shapes (zeros)."""
    make = lambda shape, dt: torch.zeros(shape, dtype=dt, device=device)  # noqa: E731
    return (make(q, dtype), make(k, dtype), make(k if v is None else v, dtype), make(cu_q, offsets_dtype),
            make(cu_q if cu_k is None else cu_k, offsets_dtype))


def test_the_ops_are_registered_with_their_schemas():
    assert str(FWD.default._schema) == "iokernels::attention_varlen_fwd" + vops.VARLEN_FWD_SCHEMA
    assert str(BWD.default._schema) == "iokernels::attention_varlen_bwd" + vops.VARLEN_BWD_SCHEMA
    assert "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k" in vops.VARLEN_FWD_SCHEMA
    assert itorch.__all__ == ["attention", "attention_mods", "attention_varlen", "attention_with_kvcache"]


@pytest.mark.parametrize("q, k, batch, dtype", [
    ((300, 8, 64), (200, 2, 64), 3, torch.float16),  # grouped-query 4:1
    ((17, 2, 256), (1000, 2, 256), 1, torch.bfloat16),  # one sequence, d 256
])
def test_fake_implementations_give_shapes_and_dtypes(q, k, batch, dtype):
    with FakeTensorMode():
        args = _tensors(q, k, cu_q=(batch + 1,), dtype=dtype, device="cuda")
        out, lse = FWD(*args, 1, 0, "bottom_right", None)
        assert out.shape == q and out.dtype == dtype and out.device == args[0].device and out.is_contiguous()
        assert lse.shape == q[:2] and lse.dtype == torch.float32 and lse.is_contiguous()
        grads = BWD(out, args[0], args[1], args[2], out, lse, *args[3:], 1, 0, "", 0.5)
        for g, t in zip(grads, args[:3], strict=True):
            assert g.shape == t.shape and g.dtype == dtype and g.is_contiguous()
        o, lse2 = itorch.attention_varlen(*args, 1, 0, causal=True, return_lse=True)
        assert o.shape == out.shape and o.dtype == dtype and lse2.shape == lse.shape


@pytest.mark.parametrize("kw, error, message", [
    (dict(q=(300, 8, 60), k=(200, 2, 60)), ValueError, r"q \(300, 8, 60\): d must be a multiple of 8"),
    (dict(k=(200, 3, 64)), ValueError, "heads must divide"),
    (dict(k=(200, 2, 32)), ValueError, "head dim equal"),
    (dict(v=(201, 2, 64)), ValueError, r"one \(total_k, H_kv, d\) shape"),
    (dict(q=(8, 64)), ValueError, r"q must be \(total_q, H, d\)"),
    (dict(cu_k=(3,)), ValueError, r"of one shape, got int32 \(4,\) and int32 \(3,\)"),
    (dict(offsets_dtype=torch.int64), ValueError, r"int32 \(B \+ 1,\) offsets.*got int64 \(4,\)"),
    (dict(cu_q=(1,)), ValueError, r"B >= 1.*int32 \(1,\)"),
    (dict(cu_q=(2, 2)), ValueError, r"int32 \(B \+ 1,\) offsets"),
    (dict(dtype=torch.float32), TypeError, "torch.float16 or torch.bfloat16, got torch.float32"),
])
def test_bad_tensors_are_refused(kw, error, message):
    args = _tensors(**kw)
    with pytest.raises(error, match=message):
        itorch.attention_varlen(*args, 10, 10)
    with FakeTensorMode():
        fake = _tensors(**kw, device="cuda")
        with pytest.raises(error, match=message):
            FWD(*fake, 10, 10, "", None)


@pytest.mark.parametrize("max_q, max_k, message", [
    (301, 10, r"max_seqlen_q must be an int from 0 to the packed rows \(300\), got 301"),
    (10, -1, "max_seqlen_k must be an int .* got -1"),
    (True, 10, "max_seqlen_q .* got True"),
    (10, 2.0, "max_seqlen_k .* got 2.0"),
    (np.int64(10), 10, "max_seqlen_q .* got np.int64"),
])
def test_bad_longest_lengths_are_refused(max_q, max_k, message):
    args = _tensors()
    with pytest.raises(ValueError, match=message):
        itorch.attention_varlen(*args, max_q, max_k)
    if all(type(m) is int for m in (max_q, max_k)):  # (the schema's ints refuse the others themselves)
        with FakeTensorMode(), pytest.raises(ValueError, match=message):
            FWD(*_tensors(device="cuda"), max_q, max_k, "", None)


def test_mixed_dtypes_devices_non_tensors_and_strides_are_refused():
    q, k, v, cu_q, cu_k = _tensors()
    for args, error, message in [
        ((q, k, v.to(torch.bfloat16), cu_q, cu_k), TypeError, "one dtype.*torch.float16, torch.float16, "
                                                              "torch.bfloat16"),
        ((q, k, v, torch.zeros(4, dtype=torch.int32), cu_k), ValueError, "cu_seqlens_q is on cpu"),
        ((q, np.zeros((200, 2, 64), np.float16), v, cu_q, cu_k), TypeError, "k must be a torch.Tensor"),
        ((q, k, v, cu_q, [0, 1, 2, 3]), TypeError, "cu_seqlens_k must be a torch.Tensor, got builtins.list"),
        ((q.transpose(0, 1).contiguous().transpose(0, 1), k, v, cu_q, cu_k), ValueError,
         r"q must be contiguous.*strides \(64, 19200, 1\)"),
        ((q, k, v, torch.zeros(8, dtype=torch.int32, device="meta")[::2], cu_k), ValueError,
         "cu_seqlens_q must be contiguous"),
    ]:
        with pytest.raises(error, match=message):
            itorch.attention_varlen(*args, 10, 10)
    with FakeTensorMode():
        q, k, v, cu_q, cu_k = _tensors(device="cuda")
        with pytest.raises(ValueError, match=r"one device, got q on cuda:0, .* cu_seqlens_k on cuda:1"):
            itorch.attention_varlen(q, k, v, cu_q, cu_k.to("cuda:1"), 10, 10)


def test_cpu_tensors_are_refused_by_the_front_end_and_the_ops():
    args = _tensors(device="cpu")
    with pytest.raises(ValueError, match="q is on cpu: iokernels runs on CUDA tensors"):
        itorch.attention_varlen(*args, 10, 10)
    with pytest.raises(ValueError, match="q is on cpu"):
        FWD(*args, 10, 10, "", None)
    q, k, v, cu_q, cu_k = args
    lse = torch.zeros(300, 8)
    with pytest.raises(ValueError, match="q is on cpu"):
        BWD(q, q, k, v, q, lse, cu_q, cu_k, 10, 10, "", None)


@pytest.mark.parametrize("kw, error, message", [
    (dict(scale=0.0), ValueError, "scale must be > 0"),
    (dict(scale="x"), TypeError, "scale must be a finite real number"),
    (dict(return_lse=1), TypeError, "return_lse must be True or False, got 1"),
    (dict(causal="left"), ValueError, "unknown causal alignment 'left'"),
])
def test_bad_options_are_refused(kw, error, message):
    with pytest.raises(error, match=message):
        itorch.attention_varlen(*_tensors(), 10, 10, **kw)


def test_the_fake_implementations_check_the_options_and_the_backwards_tensors():
    with FakeTensorMode():
        q, k, v, cu_q, cu_k = _tensors(device="cuda")
        with pytest.raises(ValueError, match="unknown causal alignment 'left'"):
            FWD(q, k, v, cu_q, cu_k, 10, 10, "left", None)
        with pytest.raises(ValueError, match="scale must be > 0"):
            FWD(q, k, v, cu_q, cu_k, 10, 10, "", -1.0)
        out, lse = FWD(q, k, v, cu_q, cu_k, 10, 10, "top_left", None)
        make = lambda shape, dtype=torch.float32, device="cuda": torch.empty(shape, dtype=dtype, device=device)  # noqa
        for args, error, message in [
            ((out, q, k, v, out, make((299, 8))), ValueError, r"lse float32 \(300, 8\).* lse float32 \(299, 8\)"),
            ((out, q, k, v, out, make((300, 8), torch.float16)), ValueError,
             r"lse float32 \(300, 8\).* lse float16 \(300, 8\)"),
            ((make((299, 8, 64), q.dtype), q, k, v, out, lse), ValueError, r"shaped as q .* do \(299, 8, 64\)"),
            ((out, q, k, v, make((300, 8, 64)), lse), TypeError, "dout and out must have q's dtype torch.float16"),
            ((out, q, k, v, out, make((300, 8), device="cuda:1")), ValueError, "lse on cuda:1"),
        ]:
            with pytest.raises(error, match=message):
                BWD(*args, cu_q, cu_k, 10, 10, "", None)
        with pytest.raises(ValueError, match=r"of one shape, got int32 \(4,\) and int32 \(5,\)"):
            BWD(out, q, k, v, out, lse, cu_q, torch.zeros(5, dtype=torch.int32, device="cuda"), 10, 10, "", None)


def _loss(q, k, v, cu_q, cu_k):
    o, lse = itorch.attention_varlen(q, k, v, cu_q, cu_k, 150, 120, causal=True, scale=0.1, return_lse=True)
    return o.float().square().sum() + lse.sum()


def _meta_inputs():
    q = torch.zeros(300, 8, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    k, v = (torch.zeros(200, 2, 64, dtype=torch.bfloat16, device="meta", requires_grad=True) for _ in range(2))
    return q, k, v, *(torch.zeros(4, dtype=torch.int32, device="meta") for _ in range(2))


def test_dynamo_sees_one_graph_and_no_break():
    explained = torch._dynamo.explain(_loss)(*_meta_inputs())
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def test_the_compiled_backward_calls_the_backward_op_with_the_forwards_options():
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_function

    graphs = []

    def keep(gm, _):
        graphs.append(gm.code)
        return make_boxed_func(gm.forward)

    inputs = _meta_inputs()
    aot_function(_loss, fw_compiler=keep, bw_compiler=keep)(*inputs).backward()
    forward, backward = graphs
    assert forward.count("iokernels.attention_varlen_fwd") == 1
    assert backward.count("iokernels.attention_varlen_bwd") == 1
    assert "150, 120, 'bottom_right', 0.1)" in forward and "150, 120, 'bottom_right', 0.1)" in backward
    for t in inputs[:3]:
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype
    torch._dynamo.reset()
    loss = torch.compile(_loss, fullgraph=True, backend="aot_eager")(*_meta_inputs())
    assert loss.shape == () and loss.requires_grad


# ---------------------------------------------------------------------------------------------
# the autograd formula end to end on the CPU: float64 reference kernels in place of varlen_forward and varlen_backward

def _sequences(cu_q, cu_k):
    oq, ok = cu_q.tolist(), cu_k.tolist()
    return [(oq[b], oq[b + 1], ok[b], ok[b + 1]) for b in range(len(oq) - 1)]


def _scores(q, k, causal, scale):
    """One sequence's scores (H, L_q, L_k) in float64 from q (L_q, H, d) and k (L_k, H_kv, d), causal masked."""
    group = q.shape[1] // k.shape[1]
    s = scale * q.double().transpose(0, 1) @ k.double().repeat_interleave(group, dim=1).permute(1, 2, 0)
    if causal:
        n_q, n_k = s.shape[-2:]
        offset = n_k - n_q if causal == "bottom_right" else 0
        s = s.masked_fill(torch.arange(n_k)[None, :] > torch.arange(n_q)[:, None] + offset, -math.inf)
    return s, group


def _ref_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, keep_lse=True, head_major=False):
    assert not head_major  # (the packed layout here; head-major: tests/gpu/test_documents.py)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float64)
    for q0, q1, k0, k1 in _sequences(cu_q, cu_k):
        if q1 == q0 or k1 == k0:
            continue
        s, group = _scores(q[q0:q1], k[k0:k1], causal, scale)
        lse[q0:q1] = torch.logsumexp(s, dim=-1).T
        p = torch.nan_to_num(torch.exp(s - lse[q0:q1].T[..., None]))
        out[q0:q1] = (p @ v[k0:k1].double().repeat_interleave(group, dim=1).transpose(0, 1)).transpose(0, 1)
    return out.to(q.dtype), lse.float()


def _ref_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, head_major=False):
    assert not head_major
    assert dout.is_contiguous()  # as the kernels read it
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float64) for t in (q, k, v))
    for q0, q1, k0, k1 in _sequences(cu_q, cu_k):
        if q1 == q0 or k1 == k0:
            continue
        s, group = _scores(q[q0:q1], k[k0:k1], causal, scale)
        p = torch.nan_to_num(torch.exp(s - lse[q0:q1].T.double()[..., None]))
        do = dout[q0:q1].double().transpose(0, 1)
        kx, vx = (t[k0:k1].double().repeat_interleave(group, dim=1).transpose(0, 1) for t in (k, v))
        dp = do @ vx.transpose(-1, -2)
        ds = p * (dp - (p * dp).sum(-1, keepdim=True))
        dq[q0:q1] = (scale * ds @ kx).transpose(0, 1)
        heads_kv = k.shape[1]
        dk[k0:k1] = (scale * ds.transpose(-1, -2) @ q[q0:q1].double().transpose(0, 1)).unflatten(
            0, (heads_kv, group)).sum(1).transpose(0, 1)
        dv[k0:k1] = (p.transpose(-1, -2) @ do).unflatten(0, (heads_kv, group)).sum(1).transpose(0, 1)
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)


@pytest.fixture
def cpu_ops(monkeypatch):
    """The operators on CPU tensors, their implementations the float64 references (recording their options)."""
    calls = []

    def forward(*args, **kw):
        calls.append(("fwd", args[5:9]))
        return _ref_forward(*args, **kw)

    def backward(*args):
        calls.append(("bwd", args[8:12]))  # (then head_major, which _ref_backward checks)
        return _ref_backward(*args)

    monkeypatch.setattr(ops, "DEVICE_TYPES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(vops, "varlen_forward", forward)
    monkeypatch.setattr(vops, "varlen_backward", backward)
    return calls


def _sdpa(q, k, v, cu_q, cu_k, causal, scale):
    """Per-sequence SDPA (float64 on whatever dtype comes in), packed as the varlen output; no query or no key: 0."""
    out = torch.zeros(q.shape, dtype=q.dtype)
    for q0, q1, k0, k1 in _sequences(cu_q, cu_k):
        if q1 == q0 or k1 == k0:
            continue
        qb, kb, vb = (t.transpose(0, 1)[None] for t in (q[q0:q1], k[k0:k1], v[k0:k1]))
        n_q, n_k = q1 - q0, k1 - k0
        offset = n_k - n_q if causal == "bottom_right" else 0
        mask = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + offset if causal else None
        o = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=True)
        out = out.index_put((torch.arange(q0, q1),), o[0].transpose(0, 1))
    return out


@pytest.mark.parametrize("lengths_q, lengths_k, heads, kv_heads, causal, compiled", [
    ((5, 0, 17, 9), (7, 3, 17, 0), 4, 2, False, False),  # a sequence with no query, one with no key
    ((5, 11, 17), (7, 11, 30), 4, 1, True, True),  # bottom-right: L_q <= L_k, every row sees a key
    ((12, 1, 8), (5, 9, 8), 2, 2, "top_left", False),
    ((3, 20), (20, 3), 6, 3, "top_left", True),
])
def test_gradients_through_the_ops_match_per_sequence_sdpa(cpu_ops, lengths_q, lengths_k, heads, kv_heads, causal,
                                                           compiled):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    cu_q, cu_k = (torch.tensor(np.concatenate([[0], np.cumsum(n)]), dtype=torch.int32) for n in (lengths_q, lengths_k))
    q = torch.randn(sum(lengths_q), heads, 16, generator=gen).half().requires_grad_()
    k, v = (torch.randn(sum(lengths_k), kv_heads, 16, generator=gen).half().requires_grad_() for _ in range(2))
    do = torch.randn(q.shape, generator=gen).half()

    def ours(q, k, v, cu_q, cu_k):
        return itorch.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal, scale=0.3)

    fn = torch.compile(ours, fullgraph=True, backend="aot_eager") if compiled else ours
    o = fn(q, k, v, cu_q, cu_k)
    (o.float() * do.float()).sum().backward()
    alignment = {False: "", True: "bottom_right", "top_left": "top_left"}[causal]
    assert [c for c in cpu_ops if c[0] == "fwd"][-1][1] == (max(lengths_q), max(lengths_k), alignment, 0.3)
    assert cpu_ops[-1] == ("bwd", (max(lengths_q), max(lengths_k), alignment, 0.3))  # the forward's options
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = _sdpa(q64, k64, v64, cu_q, cu_k, alignment, 0.3)
    (want * do.double()).sum().backward()
    assert o.dtype == torch.float16 and o.grad_fn is not None
    assert torch.allclose(o.double(), want, atol=2e-3)
    for t, ref in ((q, q64), (k, k64), (v, v64)):
        assert t.grad.dtype == torch.float16 and torch.allclose(t.grad.double(), ref.grad, atol=5e-3)


def test_a_broadcast_gradient_reaches_the_backward_contiguous(cpu_ops):
    """o.sum().backward() hands the backward a stride-0 gradient: made contiguous (the reference asserts it)."""
    gen = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 6, 10], dtype=torch.int32)
    q, k, v = (torch.randn(10, 2, 16, generator=gen).half().requires_grad_() for _ in range(3))
    o, lse = itorch.attention_varlen(q, k, v, cu, cu, 6, 6, return_lse=True)
    assert not lse.requires_grad
    o.sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    _sdpa(q64, k64, v64, cu, cu, "", None).sum().backward()
    for t, ref in ((q, q64), (k, k64), (v, v64)):
        assert torch.allclose(t.grad.double(), ref.grad, atol=5e-3)
    with torch.no_grad():
        assert not itorch.attention_varlen(q, k, v, cu, cu, 6, 6).requires_grad


def test_opcheck_with_gradients(cpu_ops):
    """torch.library.opcheck on both operators (schema, autograd registration, fake implementation against the real
    one, and AOT dispatch with dynamic shapes, gradients included)."""
    gen = torch.Generator().manual_seed(2)
    cu_q, cu_k = torch.tensor([0, 5, 5, 22], dtype=torch.int32), torch.tensor([0, 7, 10, 27], dtype=torch.int32)
    q = torch.randn(22, 4, 16, generator=gen).half().requires_grad_()
    k, v = (torch.randn(27, 2, 16, generator=gen).half().requires_grad_() for _ in range(2))
    options = (17, 17, "bottom_right", 0.3)
    torch.library.opcheck(FWD.default, (q, k, v, cu_q, cu_k, *options))
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = FWD(q, k, v, cu_q, cu_k, *options)
    do = torch.randn(out.shape, generator=gen).half()
    torch.library.opcheck(BWD.default, (do, q, k, v, out, lse, cu_q, cu_k, *options))

# ---------------------------------------------------------------------------------------------
# the implementation's fast path: a signature's first call through the cupy functions (stand-ins here), later calls
# on raw addresses

@pytest.fixture
def stand_ins(monkeypatch):
    """The cupy side replaced (torch_ops.as_cupy kept): the cupy functions record the views they are given,
    varlen_call gives a Dispatch with a RawPlan of the outputs' shapes."""
    first_calls = []

    def forward(q, k, v, cu_q, cu_k, max_q, max_k, **options):
        first_calls.append(("fwd", (q, k, v, cu_q, cu_k), (max_q, max_k), options))
        return torch.zeros(q.shape), torch.zeros(q.shape[:-1])

    def backward(do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, **options):
        first_calls.append(("bwd", (q, k, v, o, do, lse, cu_q, cu_k), (max_q, max_k), options))
        return torch.zeros(q.shape), torch.zeros(k.shape), torch.zeros(v.shape)

    def call_of(arrays, max_q, max_k, *, causal, scale, bfloat16, direction="fwd", head_major=False):
        q, k = arrays["Q"], arrays["K"]
        call = Dispatch("cupy", "float16", tuple(q.shape[:2]), max_q, max_k, q.shape[2], 4, False, (), 0, 0.125)
        if direction == "fwd":
            call.fast = RawPlan(((q.shape, q.dtype), (q.shape[:-1], np.dtype(np.float32))))
            call.outputs = {"O": 0, "lse": 1}
        else:
            call.fast = RawPlan(((q.shape, q.dtype), (k.shape, q.dtype), (k.shape, q.dtype)))
            call.outputs = {"dQ": 0, "dK": 1, "dV": 2}
        return call

    monkeypatch.setattr(ops, "DEVICE_TYPES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(ops, "torch_stream", lambda device: contextlib.nullcontext((ViewCupy, PassAllocator())))
    monkeypatch.setattr(ops, "raw_stream", lambda device: 0)
    monkeypatch.setattr(varlen, "attention_varlen", forward)
    monkeypatch.setattr(varlen, "attention_varlen_backward", backward)
    monkeypatch.setattr(varlen, "varlen_call", call_of)
    TORCH_CALLS.clear()
    yield first_calls
    TORCH_CALLS.clear()


def _assert_views(views, tensors):
    for view, t in zip(views, tensors, strict=True):  # views of the tensors' memory, no copy
        strides = tuple(t.element_size() * s for s in t.stride())
        assert (view.ptr, view.shape, view.strides) == (t.data_ptr(), tuple(t.shape), strides)


def test_later_calls_launch_on_the_tensors_addresses(stand_ins):
    q, k, v, cu_q, cu_k = _tensors(dtype=torch.bfloat16, device="cpu")
    options = (150, 120, "bottom_right", None)
    vops.varlen_forward(q, k, v, cu_q, cu_k, *options)  # the first call: the cupy function, the fast path stored
    ((direction, views, lengths, kw),) = stand_ins
    assert direction == "fwd" and lengths == (150, 120)
    assert kw == {"return_lse": True, "causal": "bottom_right", "scale": None, "bfloat16": True, "head_major": False}
    _assert_views(views, (q, k, v, cu_q, cu_k))
    assert [str(x.dtype) for x in views] == ["uint16"] * 3 + ["int32"] * 2  # bfloat16 as its bits
    out, lse = vops.varlen_forward(q, k, v, cu_q, cu_k, *options)
    (entry,) = TORCH_CALLS.entries.values()
    assert len(stand_ins) == 1 and entry.call.fast.given == [tuple(t.data_ptr() for t in (q, k, v, cu_q, cu_k))]
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (300, 8) and lse.dtype == torch.float32
    out, none = vops.varlen_forward(q, k, v, cu_q, cu_k, *options, keep_lse=False)  # lse to a scratch buffer
    assert none is None and out.shape == q.shape and len(entry.call.fast.given) == 2
    again = torch.zeros_like(cu_q)  # other offsets of the same signature: their address
    vops.varlen_forward(q, k, v, again, cu_k, *options)
    assert entry.call.fast.given[-1][3] == again.data_ptr() and len(stand_ins) == 1

    grads = vops.varlen_backward(out, q, k, v, out, lse, cu_q, cu_k, *options)  # the backward: the cupy function
    direction, views, lengths, kw = stand_ins[-1]
    assert direction == "bwd" and lengths == (150, 120) and "return_lse" not in kw and kw["bfloat16"]
    _assert_views(views, (q, k, v, out, out, lse, cu_q, cu_k))
    dout = torch.zeros_like(out)
    dq, dk, dv = vops.varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, *options)
    bwd = list(TORCH_CALLS.entries.values())[-1].call.fast
    # the addresses in the fast path's input order: Q, K, V, O, dO, lse, the offsets
    assert len(stand_ins) == 2 and bwd.given == [tuple(t.data_ptr() for t in (q, k, v, out, dout, lse, cu_q, cu_k))]
    for g, t in zip((dq, dk, dv), (q, k, v), strict=True):
        assert g.shape == t.shape and g.dtype == t.dtype
    assert len(grads) == 3


@pytest.mark.parametrize("change", ["max_seqlen_q", "max_seqlen_k=True", "causal", "scale", "dtype"])
def test_another_signature_takes_the_first_call_path(stand_ins, change):
    """max_seqlen_k=True equals 1 in Python but is refused by the check: the key keeps its type, so it is checked."""
    q, k, v, cu_q, cu_k = _tensors(device="cpu")
    vops.varlen_forward(q, k, v, cu_q, cu_k, 10, 1, "", None)
    args = {"max_seqlen_q": (q, k, v, cu_q, cu_k, 11, 1, "", None),
            "max_seqlen_k=True": (q, k, v, cu_q, cu_k, 10, True, "", None),
            "causal": (q, k, v, cu_q, cu_k, 10, 1, "top_left", None),
            "scale": (q, k, v, cu_q, cu_k, 10, 1, "", 0.5),
            "dtype": (*(t.bfloat16() for t in (q, k, v)), cu_q, cu_k, 10, 1, "", None)}[change]
    if change == "max_seqlen_k=True":
        with pytest.raises(ValueError, match=r"max_seqlen_k .* got True"):
            vops.varlen_forward(*args)
        assert len(stand_ins) == 1
    else:
        vops.varlen_forward(*args)
        assert len(stand_ins) == 2


# ---------------------------------------------------------------------------------------------
# the docs

def test_every_argument_is_documented():
    import ast
    from pathlib import Path

    from iokernels.library import apidoc

    doc = apidoc.docstring("library/torch.py", "attention_varlen")
    tree = ast.parse(Path(ops.__file__).with_name("torch.py").read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "attention_varlen")
    names = [a.arg for a in (*node.args.args, *node.args.kwonlyargs)]
    assert len(names) == 11
    for name in names:
        assert name in doc, name
    assert "flash_attn_varlen_func" in doc and "torch.ops.iokernels.attention_varlen_bwd" in doc


def test_a_batch_without_rows_is_refused():
    """No packed key (or query) row at all: refused with a message (the kernels' tensor maps need a row)."""
    with FakeTensorMode():
        args = _tensors((5, 3, 96), (0, 3, 96), cu_q=(6,), device="cuda")
        with pytest.raises(ValueError, match="packed rows"):
            FWD(*args, 1, 0, "", None)
