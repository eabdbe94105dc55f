"""iokernels.torch.attention_with_kvcache on the CPU (needs torch, not a GPU): the operator's schema, its fake
implementation's outputs (contiguous and paged caches), every bad argument refused with its value before anything is
launched (front end, operator, fake tensors), torch.compile tracing one node, the arguments reaching the operator in
order, the backward's error, and the fast path of a signature's later calls (on stand-ins for the cupy side)."""

import ast
import contextlib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
itorch = pytest.importorskip("iokernels.torch")
ops = pytest.importorskip("iokernels.library.torch_ops")
kvops = pytest.importorskip("iokernels.library.torch_kvcache")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from iokernels.library import kvcache  # noqa: E402
from iokernels.library.dispatch import TORCH_CALLS, Dispatch  # noqa: E402
from iokernels.plan import Unsupported  # noqa: E402

from .fakes import PassAllocator, RawPlan, ViewCupy  # noqa: E402

OP = torch.ops.iokernels.attention_with_kvcache


def _tensors(q=(2, 8, 1, 64), k=(2, 2, 512, 64), v=None, seqlens=(2,), table=None, dtype=torch.float16,
             device="meta", lengths_dtype=torch.int32):
    """q, k_cache, v_cache, cache_seqlens, page_table of these shapes (None for an absent one)."""
    make = lambda shape, dt: None if shape is None else torch.zeros(shape, dtype=dt, device=device)  # noqa: E731
    return (make(q, dtype), make(k, dtype), make(k if v is None else v, dtype), make(seqlens, lengths_dtype),
            make(table, lengths_dtype))


def test_the_op_is_registered_with_its_schema():
    assert str(OP.default._schema) == "iokernels::attention_with_kvcache" + kvops.KV_SCHEMA
    assert "Tensor? cache_seqlens, Tensor? page_table, str causal, float? scale, int num_splits" in kvops.KV_SCHEMA
    assert itorch.__all__ == ["attention", "attention_mods", "attention_varlen", "attention_with_kvcache"]


@pytest.mark.parametrize("q, k, seqlens, table, dtype", [
    ((2, 8, 1, 64), (2, 2, 512, 64), (2,), None, torch.float16),  # contiguous, per-sequence lengths
    ((3, 4, 5, 128), (3, 4, 100, 128), None, None, torch.bfloat16),  # contiguous, every sequence N_cap keys
    ((2, 48, 3, 96), (80, 2, 16, 96), (2,), (2, 32), torch.float16),  # paged
    ((1, 2, 1, 256), (9, 1, 256, 256), (1,), (1, 4), torch.bfloat16),  # pages of 256, d 256
])
def test_fake_implementation_gives_shapes_and_dtypes(q, k, seqlens, table, dtype):
    with FakeTensorMode():
        args = _tensors(q, k, seqlens=seqlens, table=table, dtype=dtype, device="cuda")
        out, lse = OP(*args, "", None, 0)
        assert out.shape == args[0].shape and out.dtype == dtype and out.device == args[0].device
        assert out.is_contiguous() and lse.is_contiguous()
        assert lse.shape == args[0].shape[:-1] and lse.dtype == torch.float32
        o, lse2 = itorch.attention_with_kvcache(args[0], args[1], args[2], cache_seqlens=args[3], page_table=args[4],
                                                return_lse=True)
        assert o.shape == out.shape and o.dtype == dtype and lse2.shape == lse.shape


@pytest.mark.parametrize("kw, error, message", [
    (dict(q=(2, 8, 1, 60), k=(2, 2, 512, 60)), ValueError, r"q \(2, 8, 1, 60\): d must be a multiple of 8"),
    (dict(k=(2, 3, 512, 64)), ValueError, "heads must divide"),
    (dict(k=(3, 2, 512, 64)), ValueError, r"contiguous cache is \(B, H_kv, N_cap, d\) with q's B = 2"),
    (dict(v=(2, 2, 256, 64)), ValueError, "one 4-d shape"),
    (dict(q=(8, 1, 64)), ValueError, r"q must be \(B, H, N_q, d\)"),
    (dict(seqlens=(3,)), ValueError, r"cache_seqlens must be int32 with 1 dim\(s\) and 2 rows.*int32 \(3,\)"),
    (dict(lengths_dtype=torch.int64), ValueError, r"cache_seqlens must be int32.*got int64 \(2,\)"),
    (dict(k=(40, 2, 64, 64), seqlens=None, table=(2, 8)), ValueError, "needs cache_seqlens"),
    (dict(k=(40, 2, 48, 64), table=(2, 8)), ValueError, "page size .* got 48"),
    (dict(k=(40, 2, 64, 64), table=(2,)), ValueError, r"page_table must be int32 with 2 dim\(s\)"),
    (dict(dtype=torch.float32), TypeError, "torch.float16 or torch.bfloat16, got torch.float32"),
])
def test_bad_tensors_are_refused(kw, error, message):
    args = _tensors(**kw)
    with pytest.raises(error, match=message):
        itorch.attention_with_kvcache(*args[:3], cache_seqlens=args[3], page_table=args[4])
    with FakeTensorMode():
        fake = _tensors(**kw, device="cuda")
        with pytest.raises(error, match=message):
            OP(*fake, "", None, 0)


def test_mixed_dtypes_devices_non_tensors_and_strides_are_refused():
    q, k, v, seqlens, _ = _tensors()
    for args, error, message in [
        ((q, k, v.to(torch.bfloat16), seqlens), TypeError, "one dtype.*torch.float16, torch.float16, torch.bfloat16"),
        ((q, k, v, torch.zeros(2, dtype=torch.int32)), ValueError, "cache_seqlens is on cpu"),
        ((q, np.zeros((2, 2, 512, 64), np.float16), v, seqlens), TypeError, "k_cache must be a torch.Tensor"),
        ((q, k, v, [300, 200]), TypeError, "cache_seqlens must be a torch.Tensor, got builtins.list"),
        ((q, k.transpose(2, 3).contiguous().transpose(2, 3), v, seqlens), ValueError,
         r"k_cache must be contiguous.*strides \(65536, 32768, 1, 512\)"),
        ((q.expand(2, 8, 3, 64), k, v, seqlens), ValueError, "q must be contiguous"),
    ]:
        with pytest.raises(error, match=message):
            itorch.attention_with_kvcache(*args[:3], cache_seqlens=args[3])
    with FakeTensorMode():
        q, k, v, seqlens, _ = _tensors(device="cuda")
        with pytest.raises(ValueError, match=r"one device, got q on cuda:0, .* cache_seqlens on cuda:1"):
            itorch.attention_with_kvcache(q, k, v, cache_seqlens=seqlens.to("cuda:1"))


def test_cpu_tensors_are_refused_by_the_front_end_and_the_op():
    args = _tensors(device="cpu")
    with pytest.raises(ValueError, match="q is on cpu: iokernels runs on CUDA tensors"):
        itorch.attention_with_kvcache(*args[:3], cache_seqlens=args[3])
    with pytest.raises(ValueError, match="q is on cpu"):
        OP(*args, "", None, 0)


@pytest.mark.parametrize("kw, error, message", [
    (dict(num_splits=129), ValueError, "num_splits must be an int from 0 .* to 128, got 129"),
    (dict(num_splits=-1), ValueError, "got -1"),
    (dict(num_splits=True), ValueError, "num_splits .* got True"),
    (dict(num_splits=2.0), ValueError, "num_splits .* got 2.0"),
    (dict(scale=0.0), ValueError, "scale must be > 0"),
    (dict(scale="x"), TypeError, "scale must be a finite real number"),
    (dict(return_lse=1), TypeError, "return_lse must be True or False, got 1"),
    (dict(causal="left"), ValueError, "unknown causal alignment 'left'"),
    (dict(causal="top_left"), Unsupported, "bottom-right"),
])
def test_bad_options_are_refused(kw, error, message):
    args = _tensors()
    with pytest.raises(error, match=message):
        itorch.attention_with_kvcache(*args[:3], cache_seqlens=args[3], **kw)


def test_the_fake_implementation_checks_the_options_too():
    """The cupy function's option checks (kvcache.check_options), at trace time."""
    with FakeTensorMode():
        args = _tensors(device="cuda")
        with pytest.raises(ValueError, match=r"num_splits .* got 129"):
            OP(*args, "", None, 129)
        with pytest.raises(Unsupported, match="causal='top_left'"):
            OP(*args, "top_left", None, 0)
        out, _ = OP(*args, "bottom_right", None, 128)
        assert out.shape == (2, 8, 1, 64)


def _decode(q, k, v, seqlens, table):
    return itorch.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table, causal=True) * 2


def test_dynamo_sees_one_graph_and_no_break():
    explained = torch._dynamo.explain(_decode)(*_tensors(k=(40, 2, 64, 64), table=(2, 8)))
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def test_compile_fullgraph_traces_the_op_with_dynamic_shapes():
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_function

    graphs = []

    def keep(gm, _):
        graphs.append(gm.code)
        return make_boxed_func(gm.forward)

    with torch.no_grad():
        out = aot_function(_decode, fw_compiler=keep)(*_tensors(k=(40, 2, 64, 64), table=(2, 8)))
    assert out.shape == (2, 8, 1, 64) and graphs and graphs[0].count("iokernels.attention_with_kvcache") == 1
    assert "'bottom_right', None, 0)" in graphs[0]  # causal normalized before the op
    compiled = torch.compile(_decode, fullgraph=True, backend="aot_eager", dynamic=True)
    for batch in (2, 3):
        out = compiled(*_tensors(q=(batch, 8, 1, 64), k=(40, 2, 64, 64), seqlens=(batch,), table=(batch, 8)))
        assert out.shape == (batch, 8, 1, 64)


# ---------------------------------------------------------------------------------------------
# the operator on CPU tensors with a recording implementation: what the front end hands it, and the backward's error

@pytest.fixture
def cpu_op(monkeypatch):
    """The operator on CPU tensors, its implementation (torch_kvops.kvcache_forward) recording its arguments."""
    calls = []

    def record(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits):
        calls.append((q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, num_splits))
        return q * 2, torch.full(q.shape[:-1], 7.0)

    monkeypatch.setattr(ops, "DEVICE_TYPES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(kvops, "kvcache_forward", record)
    return calls


def test_the_arguments_reach_the_op_in_order(cpu_op):
    q, k, v, seqlens, table = _tensors(k=(40, 2, 64, 64), table=(2, 8), device="cpu")
    q.normal_()
    out, lse = itorch.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table, causal=True,
                                             scale=0.25, num_splits=3, return_lse=True)
    assert torch.equal(out, q * 2) and torch.equal(lse, torch.full((2, 8, 1), 7.0))
    (got,) = cpu_op
    assert [t.data_ptr() for t in got[:5]] == [t.data_ptr() for t in (q, k, v, seqlens, table)]
    assert got[5:] == ("bottom_right", 0.25, 3)
    compiled = torch.compile(lambda *a: itorch.attention_with_kvcache(*a[:3], cache_seqlens=a[3]), fullgraph=True,
                             backend="aot_eager")
    assert torch.equal(compiled(q, k[:2], v[:2], seqlens), q * 2)
    assert cpu_op[-1][3].data_ptr() == seqlens.data_ptr() and cpu_op[-1][4] is None and cpu_op[-1][5:] == ("", None, 0)


def test_the_backward_raises_and_no_grad_gives_a_plain_output(cpu_op):
    q, k, v, seqlens, _ = _tensors(device="cpu")
    q.requires_grad_()
    out = itorch.attention_with_kvcache(q, k, v, cache_seqlens=seqlens)
    assert out.grad_fn is not None  # forward works under autograd ...
    with pytest.raises(RuntimeError, match=r"has no backward .* torch.no_grad"):
        out.sum().backward()  # ... and the backward says why it cannot
    with torch.no_grad():
        assert not itorch.attention_with_kvcache(q, k, v, cache_seqlens=seqlens).requires_grad


# ---------------------------------------------------------------------------------------------
# the implementation's fast path: a signature's first call through the cupy function (stand-ins here), later calls
# on raw addresses

@pytest.fixture
def stand_ins(monkeypatch):
    """The cupy side replaced (torch_ops.as_cupy kept): the cupy function records the views it is given,
    kvcache_call gives a Dispatch with a RawPlan."""
    first_calls = []

    def first_call(q, k_cache, v_cache, cache_seqlens, page_table, k=None, v=None, **options):
        assert k is None and v is None  # (no append in these calls)
        first_calls.append(((q, k_cache, v_cache, cache_seqlens, page_table), options))
        return torch.zeros(q.shape), torch.zeros(q.shape[:-1])

    def call_of(q, *_, **__):
        call = Dispatch("cupy", "float16", tuple(q.shape[:2]), q.shape[2], 512, q.shape[3], 4, False, (), 0, 0.125)
        call.fast = RawPlan(((tuple(q.shape), q.dtype), (tuple(q.shape[:-1]), np.dtype(np.float32))))
        call.outputs = {"O": 0, "lse": 1}
        return call

    monkeypatch.setattr(ops, "DEVICE_TYPES", ("cuda", "meta", "cpu"))
    monkeypatch.setattr(ops, "torch_stream", lambda device: contextlib.nullcontext((ViewCupy, PassAllocator())))
    monkeypatch.setattr(ops, "raw_stream", lambda device: 0)
    monkeypatch.setattr(kvcache, "attention_with_kvcache", first_call)
    monkeypatch.setattr(kvcache, "kvcache_call", call_of)
    TORCH_CALLS.clear()
    yield first_calls
    TORCH_CALLS.clear()


def test_later_calls_launch_on_the_tensors_addresses(stand_ins):
    q, k, v, seqlens, table = _tensors(k=(40, 2, 64, 64), table=(2, 8), dtype=torch.bfloat16, device="cpu")
    options = ("bottom_right", None, 0)
    kvops.kvcache_forward(q, k, v, seqlens, table, *options)  # the first call: the cupy function, the fast path stored
    ((views, kw),) = stand_ins
    assert kw == {"causal": "bottom_right", "scale": None, "num_splits": 0, "return_lse": True, "bfloat16": True}
    for view, t in zip(views, (q, k, v, seqlens, table), strict=True):  # views of the tensors' memory, no copy
        strides = tuple(t.element_size() * s for s in t.stride())
        assert (view.ptr, view.shape, view.strides) == (t.data_ptr(), tuple(t.shape), strides)
    assert [str(x.dtype) for x in views] == ["uint16"] * 3 + ["int32"] * 2  # bfloat16 as its bits
    out, lse = kvops.kvcache_forward(q, k, v, seqlens, table, *options)
    (entry,) = TORCH_CALLS.entries.values()
    # the addresses in the fast path's input order, the new keys' and values' slots 0 (no append)
    assert len(stand_ins) == 1 and entry.call.fast.given == [(*(t.data_ptr() for t in (q, k, v, seqlens, table)), 0, 0)]
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (2, 8, 1) and lse.dtype == torch.float32
    out, none = kvops.kvcache_forward(q, k, v, seqlens, table, *options, keep_lse=False)  # lse to a scratch buffer
    assert none is None and out.shape == q.shape and len(entry.call.fast.given) == 2
    again = torch.zeros_like(q)  # another q of the same signature: its address
    kvops.kvcache_forward(again, k, v, seqlens, table, *options)
    assert entry.call.fast.given[-1][0] == again.data_ptr() and len(stand_ins) == 1
    kvops.kvcache_forward(q, k[:2], v[:2], None, None, "", None, 0)  # contiguous, no lengths: another signature
    kvops.kvcache_forward(q, k[:2], v[:2], None, None, "", None, 0)
    assert len(stand_ins) == 2 and list(TORCH_CALLS.entries.values())[-1].call.fast.given[-1][3:] == (0, 0, 0, 0)


@pytest.mark.parametrize("change", ["num_splits=True", "strides", "no lengths", "causal"])
def test_another_signature_takes_the_first_call_path(stand_ins, change):
    """num_splits=True equals 1 in Python but is refused by the cupy function's check: the key keeps its type."""
    q, k, v, seqlens, _ = _tensors(device="cpu")
    kvops.kvcache_forward(q, k, v, seqlens, None, "", None, 1)
    args = {"num_splits=True": (q, k, v, seqlens, None, "", None, True),
            "strides": (torch.zeros(2, 1, 8, 64, dtype=q.dtype).transpose(1, 2), k, v, seqlens, None, "", None, 1),
            "no lengths": (q, k, v, None, None, "", None, 1),
            "causal": (q, k, v, seqlens, None, "bottom_right", None, 1)}[change]
    if change == "strides":  # a q of the same shape, strides of another layout (contiguous: N_q is 1)
        assert args[0].is_contiguous() and args[0].stride() != q.stride()
    kvops.kvcache_forward(*args)
    assert len(stand_ins) == 2


# ---------------------------------------------------------------------------------------------
# the docs

def test_every_option_is_documented():
    from iokernels.library import apidoc

    doc = apidoc.examples("iokernels.torch.attention_with_kvcache")
    tree = ast.parse(Path(ops.__file__).with_name("torch.py").read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "attention_with_kvcache")
    assert len(node.args.kwonlyargs) == 8
    for parameter in node.args.kwonlyargs:
        assert parameter.arg in doc, parameter.arg
    assert "iokernels.attention_with_kvcache" in [name for name, _, _ in apidoc.ENTRIES]
