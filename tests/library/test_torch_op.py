"""iokernels.torch.attention as torch custom operators (needs torch, not a GPU): registration, the fake
implementations' shapes and errors, torch.compile tracing with no graph break on meta tensors, and the
autograd formula end to end on the CPU with float64 reference kernels registered for the test."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
itorch = pytest.importorskip("iokernels.torch")
ops = pytest.importorskip("iokernels.library.torch_ops")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from iokernels.plan.dropout import Dropout  # noqa: E402


def test_the_ops_are_registered_with_their_schemas():
    fwd, bwd = torch.ops.iokernels.attention_fwd, torch.ops.iokernels.attention_bwd
    assert str(fwd.default._schema) == "iokernels::attention_fwd" + ops.FWD_SCHEMA
    assert str(bwd.default._schema) == "iokernels::attention_bwd" + ops.BWD_SCHEMA
    assert "Tensor? mask" in ops.FWD_SCHEMA and "int dropout_seed, int dropout_offset" in ops.FWD_SCHEMA
    for schema in (ops.FWD_SCHEMA, ops.BWD_SCHEMA):  # the window, the softcap, the block mask and ALiBi last,
        # defaulting to none (older calls still fit)
        assert ("bool deterministic, int window_left=-1, int window_right=-1, float? softcap=None, Tensor? "
                "block_levels=None, int block_q=0, int block_k=0, float[]? alibi=None) ->") in schema


def test_the_window_crosses_the_schema_as_two_ints():
    assert ops.window_ints(None) == (-1, -1) and ops.op_window(-1, -1) is None
    for window in ((3, 4), (None, 0), (7, None), (0, 0)):
        assert ops.op_window(*ops.window_ints(window)) == window
    with pytest.raises(ValueError, match="window left"):
        ops.op_window(-2, 3)


CASES = [  # q shape, k/v shape, mask shape or None, dtype, causal
    ((2, 4, 100, 64), (2, 4, 100, 64), None, torch.float16, ""),
    ((2, 8, 100, 64), (2, 2, 130, 64), None, torch.bfloat16, "bottom_right"),  # grouped-query
    ((3, 77, 128), (3, 50, 128), (77, 50), torch.float32, "top_left"),
    ((1, 2, 33, 32), (1, 2, 40, 32), (1, 2, 33, 40), torch.float16, ""),
]


@pytest.mark.parametrize("q_shape, kv_shape, mask_shape, dtype, causal", CASES)
def test_fake_implementations_give_shapes_dtypes_and_strides(q_shape, kv_shape, mask_shape, dtype, causal):
    with FakeTensorMode():
        q = torch.empty(q_shape, dtype=dtype, device="cuda")
        k, v = (torch.empty(kv_shape, dtype=dtype, device="cuda") for _ in range(2))
        mask = None if mask_shape is None else torch.empty(mask_shape, dtype=torch.bool, device="cuda")
        out, lse, rng = torch.ops.iokernels.attention_fwd(q, k, v, mask, 0.0, 0, -1, causal, None, "flash", None,
                                                          None, False)
        assert out.shape == q.shape and out.dtype == dtype and out.device == q.device and out.is_contiguous()
        assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32 and lse.is_contiguous()
        assert rng.shape == (2,) and rng.dtype == torch.int64 and rng.device.type == "cpu"
        dq, dk, dv = torch.ops.iokernels.attention_bwd(out, q, k, v, out, lse, mask, 0.0, rng, causal, None, "flash",
                                                       None, False)
        for g, t in ((dq, q), (dk, k), (dv, v)):
            assert g.shape == t.shape and g.dtype == dtype and g.is_contiguous()
        o = itorch.attention(q.transpose(-1, -2).transpose(-1, -2), k, v, attn_mask=mask, causal=causal)
        assert o.shape == q.shape and o.dtype == dtype


@pytest.mark.parametrize("q_shape, kv_shape, mask_shape, error, message", [
    ((2, 4, 64, 60), (2, 4, 64, 60), None, ValueError, "head dimension d=60"),
    ((2, 8, 64, 64), (2, 3, 64, 64), None, ValueError, "shape mismatch"),
    ((2, 8, 64, 64), (2, 8, 64, 32), None, ValueError, "head dim 32"),
    ((2, 8, 64, 64), (2, 8, 64, 64), (3, 64, 64), ValueError, "not broadcastable"),
    ((2, 8, 64, 64), (2, 8, 64, 64), (64,), ValueError, "not broadcastable"),
    ((2, 8, 0, 64), (2, 8, 64, 64), None, ValueError, "sequence lengths"),
])
def test_fake_implementations_refuse_bad_shapes(q_shape, kv_shape, mask_shape, error, message):
    with FakeTensorMode():
        q = torch.empty(q_shape, dtype=torch.float16, device="cuda")
        k = torch.empty(kv_shape, dtype=torch.float16, device="cuda")
        mask = None if mask_shape is None else torch.empty(mask_shape, dtype=torch.bool, device="cuda")
        with pytest.raises(error, match=message):
            torch.ops.iokernels.attention_fwd(q, k, k, mask, 0.0, 0, -1, "", None, "flash", None, None, False)
        with pytest.raises(error, match=message):
            itorch.attention(q, k, k, mask=mask)


def test_bad_options_and_mixed_inputs_are_refused():
    q = torch.empty(1, 2, 16, 64, dtype=torch.float16, device="meta")
    for kwargs, error, message in [
        ({"attn_mask": torch.ones(16, 16, dtype=torch.bool, device="meta"),
          "mask": torch.ones(16, 16, dtype=torch.bool, device="meta")}, TypeError, "attn_mask or mask"),
        ({"is_causal": True, "causal": True}, TypeError, "is_causal or causal"),
        ({"dropout_p": 0.1, "dropout": 0.2}, TypeError, "dropout or dropout_p"),
        ({"dropout_p": 1.5}, ValueError, "dropout probability"),
        ({"scale": "x"}, TypeError, "scale must be"),
        ({"algorithm": "fast"}, ValueError, "unknown algorithm"),
        ({"causal": "left"}, ValueError, "unknown causal alignment"),
        ({"mask": torch.ones(16, 16, dtype=torch.int32, device="meta")}, TypeError, "boolean or floating"),
        ({"mask": torch.ones(16, 16, dtype=torch.bool)}, ValueError, "pass the mask on q's device"),
    ]:
        with pytest.raises(error, match=message):
            itorch.attention(q, q, q, **kwargs)
    with pytest.raises(TypeError, match="mixed dtypes"):
        itorch.attention(q, q.float(), q)


def _meta_inputs(dtype=torch.float16):
    q = torch.empty(2, 8, 100, 64, dtype=dtype, device="meta", requires_grad=True)
    k, v = (torch.empty(2, 2, 120, 64, dtype=dtype, device="meta", requires_grad=True) for _ in range(2))
    return q, k, v, torch.empty(100, 120, dtype=torch.bool, device="meta")


def _loss(q, k, v, mask):
    o = itorch.attention(q, k, v, attn_mask=mask, dropout_p=0.1, scale=0.1)
    o = o + itorch.attention(q, k, v, is_causal=True, enable_gqa=True, window=(16, 0))
    return o.float().square().sum()


def test_dynamo_sees_one_graph_and_no_break():
    explained = torch._dynamo.explain(_loss)(*_meta_inputs())
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph_traces_forward_and_backward(backend):
    torch._dynamo.reset()
    q, k, v, mask = _meta_inputs(torch.bfloat16)
    loss = torch.compile(_loss, fullgraph=True, backend=backend)(q, k, v, mask)
    loss.backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype


def test_the_compiled_backward_calls_the_backward_op():
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_function

    graphs = []

    def keep(gm, _):
        graphs.append(gm.code)
        return make_boxed_func(gm.forward)

    aot_function(_loss, fw_compiler=keep, bw_compiler=keep)(*_meta_inputs()).backward()
    forward, backward = graphs
    assert forward.count("iokernels.attention_fwd") == 2 and backward.count("iokernels.attention_bwd") == 2
    assert "0.1, 0, -1," in forward  # the dropout offset is drawn inside the op at run time, not traced
    assert ", 16, 0)" in forward and ", 16, 0)" in backward  # the backward gets the forward's window


# ---------------------------------------------------------------------------------------------
# the autograd formula end to end, on the CPU: float64 reference kernels registered for CPU tensors

def _scores(q, k, mask, causal, scale, window=(-1, -1)):
    group = q.shape[-3] // k.shape[-3] if q.dim() >= 3 and k.shape[:-2] != q.shape[:-2] else 1
    k = k.repeat_interleave(group, dim=-3) if group > 1 else k
    s = scale * q.double() @ k.double().transpose(-1, -2)
    n_q, n_k = s.shape[-2:]
    if causal:
        offset = n_k - n_q if causal == "bottom_right" else 0
        visible = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + offset
        s = s.masked_fill(~visible, -math.inf)
    left, right = window  # FlashAttention's window_size: -1 unbounded, the bottom-right offset
    i, j, offset = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :], n_k - n_q
    if left >= 0:
        s = s.masked_fill(j < i + offset - left, -math.inf)
    if right >= 0:
        s = s.masked_fill(j > i + offset + right, -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.double()
    return s, group


def _multiplier(p, rng, shape):
    if p == 0:
        return None
    seed, offset = rng.tolist()
    z = Dropout(p, seed % 2**64, offset).full_multiplier(math.prod(shape[:-2]), *shape[-2:])
    return torch.from_numpy(z).reshape(shape)


def _ref_fwd(q, k, v, mask, p, seed, offset, causal, scale, algorithm, schedule, sram, deterministic, window_left=-1,
             window_right=-1, softcap=None, block_levels=None, block_q=0, block_k=0, alibi=None):
    drop = ops.forward_dropout(p, seed, offset)
    rng = ops.rng_tensor(drop)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s, group = _scores(q, k, mask, causal, scale, (window_left, window_right))
    lse = torch.logsumexp(s, dim=-1)
    prob = torch.nan_to_num(torch.exp(s - lse[..., None]))
    z = _multiplier(p, rng, prob.shape)
    vx = v.double().repeat_interleave(group, dim=-3) if group > 1 else v.double()
    out = (prob if z is None else prob * z) @ vx
    return out.to(q.dtype), lse.float(), rng


def _ref_bwd(dout, q, k, v, out, lse, mask, p, rng, causal, scale, algorithm, sram, deterministic, window_left=-1,
             window_right=-1, softcap=None, block_levels=None, block_q=0, block_k=0, alibi=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s, group = _scores(q, k, mask, causal, scale, (window_left, window_right))
    prob = torch.nan_to_num(torch.exp(s - lse.double()[..., None]))
    z = _multiplier(p, rng, prob.shape)
    kx, vx = ((t.double().repeat_interleave(group, dim=-3) if group > 1 else t.double()) for t in (k, v))
    dropped = prob if z is None else prob * z
    do = dout.double()
    dv = dropped.transpose(-1, -2) @ do
    dprob = do @ vx.transpose(-1, -2)
    dprob = dprob if z is None else dprob * z
    ds = prob * (dprob - (prob * dprob).sum(-1, keepdim=True))
    dq, dk = scale * ds @ kx, scale * ds.transpose(-1, -2) @ q.double()
    if group > 1:
        dk, dv = (g.unflatten(-3, (-1, group)).sum(-3) for g in (dk, dv))
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)


@pytest.fixture(scope="module")
def cpu_reference_kernels():
    torch.library.register_kernel("iokernels::attention_fwd", "cpu", _ref_fwd)
    torch.library.register_kernel("iokernels::attention_bwd", "cpu", _ref_bwd)


@pytest.fixture
def cpu_ops(cpu_reference_kernels, monkeypatch):
    monkeypatch.setattr(ops, "DEVICE_TYPES", ("cuda", "meta", "cpu"))


def _sdpa(q, k, v, **kwargs):
    group = q.shape[-3] // k.shape[-3]
    k, v = (t.repeat_interleave(group, dim=-3) for t in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)


@pytest.mark.parametrize("kv_heads, mask_kind, causal, compiled", [
    (4, None, "is_causal", False), (2, None, "is_causal", True), (1, "bool", "", False), (4, "float", "", True),
    (2, None, "bottom_right", False), (4, "bool", "top_left", True),
])
def test_gradients_through_the_ops_match_sdpa(cpu_ops, kv_heads, mask_kind, causal, compiled):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 24, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, 24 if causal == "is_causal" else 31, 16, dtype=torch.float64, generator=gen,
                        requires_grad=True) for _ in range(2))
    n_k = k.shape[-2]
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(24, n_k, generator=gen) > 0.3
        mask[:, 0] = True
    elif mask_kind == "float":
        mask = torch.randn(2, 1, 24, n_k, dtype=torch.float32, generator=gen)
    do = torch.randn(2, 4, 24, 16, dtype=torch.float64, generator=gen)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))

    def ours(q, k, v):
        if causal == "is_causal":
            return itorch.attention(q, k, v, mask, is_causal=True, scale=0.3)
        return itorch.attention(q, k, v, mask=mask, causal=causal, scale=0.3)

    fn = torch.compile(ours, fullgraph=True, backend="aot_eager") if compiled else ours
    o = fn(q32, k32, v32)
    o.backward(do.float())
    want_mask = mask if mask is None or mask.dtype == torch.bool else mask.double()  # SDPA: the mask in q's dtype
    if causal in ("bottom_right", "top_left"):
        offset = n_k - 24 if causal == "bottom_right" else 0
        visible = torch.arange(n_k)[None, :] <= torch.arange(24)[:, None] + offset
        want_mask = visible if mask is None else visible & mask
    want = _sdpa(q, k, v, attn_mask=want_mask, is_causal=causal == "is_causal", scale=0.3)
    want.backward(do)
    assert o.dtype == torch.float32 and o.grad_fn is not None
    assert torch.allclose(o.double(), want, atol=1e-5)
    for t, ref in ((q32, q), (k32, k), (v32, v)):
        assert torch.allclose(t.grad.double(), ref.grad, atol=1e-4)


@pytest.mark.parametrize("kv_heads, causal, window, compiled", [
    (4, "", (5, 3), False), (2, "bottom_right", (6, None), True), (4, "top_left", (10, None), False),
    (1, "is_causal", (3, 0), True), (2, "", (0, -1), True),
])
def test_windowed_gradients_through_the_ops_match_sdpa_with_the_band_as_a_mask(cpu_ops, kv_heads, causal, window,
                                                                               compiled):
    """The window reaches the forward and (the same one) the backward, eager and compiled: SDPA with the band written
    out as a boolean mask (query i sees key j iff i + o - left <= j <= i + o + right, o = N_k - N_q) agrees."""
    gen = torch.Generator().manual_seed(2)
    n_q, n_k = 24, 24 if causal == "is_causal" else 31
    q = torch.randn(2, 4, n_q, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, n_k, 16, dtype=torch.float64, generator=gen, requires_grad=True)
            for _ in range(2))
    do = torch.randn(2, 4, n_q, 16, dtype=torch.float64, generator=gen)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))

    masks = {"is_causal": True} if causal == "is_causal" else {"causal": causal}

    def ours(q, k, v):
        return itorch.attention(q, k, v, window=window, **masks)

    fn = torch.compile(ours, fullgraph=True, backend="aot_eager") if compiled else ours
    o = fn(q32, k32, v32)
    o.backward(do.float())
    i, j, o_ = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :], n_k - n_q
    left, right = (-1 if w is None else w for w in window)
    band = ((j >= i + o_ - left) if left >= 0 else True) & ((j <= i + o_ + right) if right >= 0 else True)
    if causal:
        band = band & (j <= i + (0 if causal in ("top_left", "is_causal") else o_))
    assert band.any(dim=1).all()  # every row sees a key (SDPA gives NaN for one that sees none)
    want = _sdpa(q, k, v, attn_mask=band)
    want.backward(do)
    assert torch.allclose(o.double(), want, atol=1e-5)
    for t, ref in ((q32, q), (k32, k), (v32, v)):
        assert torch.allclose(t.grad.double(), ref.grad, atol=1e-4)
    assert not torch.allclose(itorch.attention(q32, k32, v32, window=(-1, -1), **masks), o)  # the window masks


def test_bad_windows_are_refused_by_the_front_end_and_the_ops():
    q = torch.empty(1, 2, 16, 64, dtype=torch.float16, device="meta")
    for window in ((1,), (-2, 0), (0.5, 1), (True, 0), "ab"):
        with pytest.raises(ValueError, match="window"):
            itorch.attention(q, q, q, window=window)
    with pytest.raises(ValueError, match="window right"):
        torch.ops.iokernels.attention_fwd(q, q, q, None, 0.0, 0, -1, "", None, "flash", None, None, False, 3, -7)
    with FakeTensorMode():
        q = torch.empty(1, 2, 16, 64, dtype=torch.float16, device="cuda")
        out, lse, rng = torch.ops.iokernels.attention_fwd(q, q, q, None, 0.0, 0, -1, "", None, "flash", None, None,
                                                          False, 4, 0)
        assert out.shape == q.shape and lse.shape == q.shape[:-1]
        with pytest.raises(ValueError, match="window left"):
            torch.ops.iokernels.attention_bwd(out, q, q, q, out, lse, None, 0.0, rng, "", None, "flash", None, False,
                                              -3, 0)


def test_dropout_draws_a_new_offset_per_call_and_the_backward_regenerates_it(cpu_ops):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 20, 16, generator=gen, requires_grad=True) for _ in range(3))
    compiled = torch.compile(lambda q, k, v: itorch.attention(q, k, v, dropout_p=0.3), fullgraph=True,
                             backend="aot_eager")
    first, second = compiled(q, k, v), compiled(q, k, v)
    assert not torch.allclose(first, second)  # not one mask baked into the graph
    out, _, rng = torch.ops.iokernels.attention_fwd(q, k, v, None, 0.3, 0, -1, "", None, "flash", None, None, False)
    seed, offset = rng.tolist()
    again, _, rng_again = torch.ops.iokernels.attention_fwd(q, k, v, None, 0.3, seed, offset, "", None, "flash", None,
                                                            None, False)
    assert torch.equal(out, again) and torch.equal(rng, rng_again)
    drop = Dropout(0.3, seed % 2**64, offset)
    o = itorch.attention(q, k, v, dropout=drop)
    assert torch.equal(o, out)
    do = torch.randn(o.shape, generator=gen)
    o.backward(do)
    z = torch.from_numpy(drop.full_multiplier(2, 20, 20)).reshape(1, 2, 20, 20)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    p = torch.softmax(qd @ kd.transpose(-1, -2) / 4, dim=-1)
    ((p * z) @ vd).backward(do.double())
    for t, ref in ((q, qd), (k, kd), (v, vd)):
        assert np.allclose(t.grad.numpy(), ref.grad.numpy(), atol=1e-5)


def test_a_seed_above_2_63_round_trips_through_the_schema():
    drop = Dropout(0.5, 2**64 - 5, 7)
    assert ops.signed_seed(drop.seed) == -5
    rng = ops.rng_tensor(drop)
    assert ops.backward_dropout(0.5, rng) == drop
    assert ops.forward_dropout(0.5, ops.signed_seed(drop.seed), 7) == drop


def test_a_block_mask_crosses_the_operators_as_its_bytes():
    """block_mask_args and op_block_mask: a BlockMask (levels 0, 1, 2, blocks of 128 x 256) round-trips through the
    operators' arguments, the same blocks for the q and k it is made for."""
    from iokernels.plan.masks import BlockMask

    levels = np.array([[1, 0, 2], [0, 2, 1]], dtype=np.uint8)
    mask = BlockMask.from_levels(levels, n_q=200, n_k=600, block_q=128, block_k=256)
    tensor, block_q, block_k = ops.block_mask_args(mask)
    assert tensor.dtype == torch.uint8 and tensor.device.type == "cpu" and (block_q, block_k) == (128, 256)
    q, k = torch.empty(1, 200, 16, device="meta"), torch.empty(1, 600, 16, device="meta")
    back = ops.op_block_mask(tensor, block_q, block_k, q, k)
    assert back.bits == mask.bits and (back.n_q, back.n_k, back.block_q, back.block_k) == (200, 600, 128, 256)
    assert ops.op_block_mask(None, 0, 0, q, k) is None


def test_small_workspaces_are_kept_per_stream_and_fresh_while_capturing(monkeypatch):
    """torch_ops.workspace: a block up to WORKSPACE_KEPT_BYTES is kept per (device, stream, size) and the same tensor
    returned to every call on that stream (their kernels run in its order); another stream or size gets its own; a
    larger block, or any while the current stream is being captured into a graph, is a new tensor each call."""
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(ops, "WORKSPACES", {})
    cpu = torch.device("cpu")
    a = ops.workspace(cpu, 7, 1024)
    assert a.dtype == torch.uint8 and a.shape == (1024,)
    assert ops.workspace(cpu, 7, 1024) is a
    assert ops.workspace(cpu, 8, 1024) is not a and ops.workspace(cpu, 7, 2048) is not a
    big = ops.WORKSPACE_KEPT_BYTES + 16
    assert ops.workspace(cpu, 7, big) is not ops.workspace(cpu, 7, big)
    capturing[0] = True
    assert ops.workspace(cpu, 7, 1024) is not a and ops.workspace(cpu, 7, 1024) is not ops.workspace(cpu, 7, 1024)
    capturing[0] = False
    assert ops.workspace(cpu, 7, 1024) is a
