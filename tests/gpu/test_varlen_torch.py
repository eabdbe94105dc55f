"""iokernels.torch.attention_varlen on an sm_90 device (issue #23): O, lse and the gradients of ``loss.backward()``
equal the float64 reference of each sequence alone (iokernels.simulate.varlen) within flash-attention's same-precision
tolerance, for float16 and bfloat16, causal in both alignments and not, grouped-query attention, sequences with no
query or no key, a broadcast gradient (``o.sum()``) and a scale; a per-sequence torch SDPA loop (float32, math
backend) as a second reference; a signature's later calls (the fast path, with and without autograd);
torch.library.opcheck on both operators; a forward and backward captured in a CUDA graph replay correctly after q, k,
v, dO and the offsets change in place; torch.compile(fullgraph=True) equals eager; count_io counts a torch call.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_varlen_torch.py`` (skips without an sm_90 device).
"""

import math

import numpy as np
import pytest

import iokernels
from iokernels import model
from iokernels.plan.causal import causal_offset
from iokernels.plan.varlen import make_varlen_plan
from iokernels.simulate.varlen import varlen_reference, varlen_reference_grads

from .helpers import assert_within_naive, varlen_naive

torch = pytest.importorskip("torch")
itorch = pytest.importorskip("iokernels.torch")

pytestmark = pytest.mark.usefixtures("sm90")


@pytest.fixture
def plain_outputs(monkeypatch):
    """opcheck and graph replays compare runs: no NaN poisoning (a fill kernel per buffer) here."""
    from iokernels.kernels import launch

    monkeypatch.setattr(launch, "DEBUG_POISON", False)


# (lengths_q, lengths_k or None (the same), d, dtype, heads, kv_heads, causal)
CASES = [
    ((1, 113, 0, 239, 300), None, 64, torch.float16, 4, 2, False),  # a sequence with no query and no key
    ((1, 113, 0, 239, 300), None, 64, torch.bfloat16, 4, 2, True),
    ((5, 300, 17, 129), (300, 0, 129, 200), 128, torch.float16, 2, 2, "bottom_right"),  # sequence 1: no key
    ((200, 64, 7), (100, 640, 7), 96, torch.bfloat16, 6, 2, "top_left"),
]
IDS = [f"{len(c[0])}seq-d{c[2]}-{str(c[3])[6:]}-{c[4]}:{c[5]}-{c[6] or 'full'}" for c in CASES]


def _lengths(case):
    return case[0], case[0] if case[1] is None else case[1]


def _inputs(case, seed=0):
    """q, k, v and a gradient dO, random, packed; the offsets (int32 on the device); the longest lengths."""
    lengths_q, lengths_k = _lengths(case)
    _, _, d, dtype, heads, kv_heads, _ = case
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(sum(lengths_q), heads, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    k, v = (torch.randn(sum(lengths_k), kv_heads, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    cu_q, cu_k = (torch.tensor(np.concatenate([[0], np.cumsum(n)]), dtype=torch.int32, device="cuda")
                  for n in (lengths_q, lengths_k))
    return q, k, v, do, cu_q, cu_k, max(lengths_q), max(lengths_k)


def _plan(case):
    """The exact plan of a case: the sequences the float64 reference and the model walk."""
    lengths_q, lengths_k = _lengths(case)
    _, _, d, dtype, heads, kv_heads, causal = case
    return make_varlen_plan(d=d, dtype=str(dtype).removeprefix("torch."), heads=heads, kv_heads=kv_heads,
                            lengths_q=lengths_q, lengths_k=lengths_k, causal=causal)


def _host(t):
    return t.detach().double().cpu().numpy()


def _assert_match_float64(case, q, k, v, do, o, lse, grads, scale=None):
    """O, lse and (dq, dk, dv) against the float64 reference of each sequence, the same-precision naive's error the
    yardstick; a row that sees no key: O = 0, lse −inf."""
    plan = _plan(case)
    scale = 1 / math.sqrt(plan.d) if scale is None else scale
    host = {"Q": _host(q), "K": _host(k), "V": _host(v), "dO": _host(do)}
    naive = varlen_naive(plan, host, scale)
    o_want, lse_want = varlen_reference(plan, host, scale)
    assert_within_naive({"O": _host(o)}, {"O": o_want}, {"O": naive["O"]})
    got_lse = _host(lse)
    empty = np.isneginf(lse_want)
    assert np.array_equal(np.isneginf(got_lse), empty) and np.all(_host(o)[empty] == 0)
    assert np.max(np.abs(got_lse[~empty] - lse_want[~empty]), initial=0.0) < 1e-2
    want = varlen_reference_grads(plan, host, scale)
    got = {n: _host(g) for n, g in zip(("dQ", "dK", "dV"), grads, strict=True)}
    assert all(got[n].shape == want[n].shape for n in want)
    assert_within_naive(got, want, {n: naive[n] for n in want})


def _forward_backward(case, q, k, v, do, cu_q, cu_k, max_q, max_k, **kw):
    """O and lse of a call under autograd, and the gradients of loss = Σ O ∘ dO (whose gradient into O is dO)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o, lse = itorch.attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, causal=case[6], return_lse=True, **kw)
    assert o.grad_fn is not None and not lse.requires_grad
    loss = (o.float() * do.float()).sum()
    loss.backward()
    return o.detach(), lse, [t.grad for t in leaves]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_backward_match_float64(case):
    q, k, v, do, cu_q, cu_k, max_q, max_k = _inputs(case)
    o, lse, grads = _forward_backward(case, q, k, v, do, cu_q, cu_k, max_q, max_k)
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == q.shape[:2] and lse.dtype == torch.float32
    for g, t in zip(grads, (q, k, v), strict=True):
        assert g.shape == t.shape and g.dtype == t.dtype
    _assert_match_float64(case, q, k, v, do, o, lse, grads)
    again, lse_again, grads_again = _forward_backward(case, q, k, v, do, cu_q, cu_k, max_q, max_k)  # the fast path
    assert torch.equal(again, o) and torch.equal(lse_again, lse)
    for g, g_again in zip(grads, grads_again, strict=True):  # (dQ's float32 reductions: their order varies)
        assert torch.allclose(g_again, g, atol=2e-3, rtol=1e-2)
    with torch.no_grad():  # the eager call without autograd: its own signature, and lse only when asked
        plain, plain_lse = itorch.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=case[6], return_lse=True)
        alone = itorch.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=case[6])
    assert torch.equal(plain, o) and torch.equal(plain_lse, lse) and torch.equal(alone, o)


def test_a_broadcast_gradient_and_a_scale():
    """o.sum().backward(): the gradient autograd hands the backward is a stride-0 view of ones (made contiguous)."""
    case = CASES[0]
    q, k, v, _, cu_q, cu_k, max_q, max_k = _inputs(case, seed=1)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o, lse = itorch.attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, scale=0.3, return_lse=True)
    o.sum().backward()
    _assert_match_float64(case, q, k, v, torch.ones_like(q), o.detach(), lse, [t.grad for t in leaves], scale=0.3)


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[3]], ids=[IDS[1], IDS[2], IDS[3]])
def test_equals_a_per_sequence_sdpa_loop(case):
    """The second reference: torch SDPA (float32, math backend) on each sequence alone, K/V heads repeated for GQA, the
    causal mask as a boolean one; forward and autograd backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, do, cu_q, cu_k, max_q, max_k = _inputs(case, seed=3)
    o, _, grads = _forward_backward(case, q, k, v, do, cu_q, cu_k, max_q, max_k)
    q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
    group, alignment = q.shape[1] // k.shape[1], _plan(case).causal
    pieces = []
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    with sdpa_kernel(SDPBackend.MATH):
        for b in range(len(bounds_q) - 1):
            (q0, q1), (k0, k1) = bounds_q[b:b + 2], bounds_k[b:b + 2]
            if q1 == q0 or k1 == k0:  # no query, or no key: O = 0
                pieces.append(torch.zeros(q1 - q0, *q.shape[1:], device="cuda"))
                continue
            qb = q32[q0:q1].transpose(0, 1)
            kb, vb = (t[k0:k1].transpose(0, 1).repeat_interleave(group, dim=0) for t in (k32, v32))
            mask = None
            if alignment:
                offset = causal_offset(q1 - q0, k1 - k0, alignment)
                mask = (torch.arange(k1 - k0, device="cuda")[None, :]
                        <= torch.arange(q1 - q0, device="cuda")[:, None] + offset)
            pieces.append(torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask).transpose(0, 1))
    want = torch.cat(pieces)
    (want * do.float()).sum().backward()
    plan = _plan(case)
    naive = varlen_naive(plan, {"Q": _host(q), "K": _host(k), "V": _host(v), "dO": _host(do)}, 1 / math.sqrt(plan.d))
    assert_within_naive({"O": _host(o)}, {"O": _host(want)}, {"O": naive["O"]})
    names = ("dQ", "dK", "dV")
    assert_within_naive({n: _host(g) for n, g in zip(names, grads, strict=True)},
                        {n: _host(t.grad) for n, t in zip(names, (q32, k32, v32), strict=True)},
                        {n: naive[n] for n in names})


@pytest.mark.usefixtures("plain_outputs")
def test_opcheck():
    q, k, v, do, cu_q, cu_k, max_q, max_k = _inputs(CASES[2])
    args = (q, k, v, cu_q, cu_k, max_q, max_k, "bottom_right", None)
    torch.library.opcheck(torch.ops.iokernels.attention_varlen_fwd.default, args)
    out, lse = torch.ops.iokernels.attention_varlen_fwd(*args)
    # the backward's dQ sums float32 reductions in a varying order: not compared run to run, only its schema, its
    # fake implementation and its (absent) autograd
    torch.library.opcheck(torch.ops.iokernels.attention_varlen_bwd.default,
                          (do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, "bottom_right", None),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.usefixtures("plain_outputs")
def test_a_captured_forward_and_backward_replay_after_the_offsets_change():
    """The usual recipe (warm up on a side stream, capture once): the replay reads q, k, v, dO and the offsets where
    they lie, so after they change in place (the sequences reversed: the same totals and longest lengths) it gives the
    reference's outputs and gradients of the new batch, and equals an eager call on it."""
    case = CASES[2]
    q, k, v, do, cu_q, cu_k, max_q, max_k = _inputs(case)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            itorch.attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, causal=True).backward(do)
    torch.cuda.current_stream().wait_stream(side)
    for t in leaves:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_o, static_lse = itorch.attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, causal=True,
                                                       return_lse=True)
        static_o.backward(do)
    reversed_case = (case[0][::-1], case[1][::-1], *case[2:])
    fresh = _inputs(reversed_case, seed=5)
    assert fresh[6:] == (max_q, max_k)
    with torch.no_grad():
        for t, x in zip((q, k, v, do, cu_q, cu_k), fresh[:6], strict=True):
            t.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    got = [static_o.detach().clone(), static_lse.clone(), *(t.grad.clone() for t in leaves)]
    _assert_match_float64(reversed_case, *fresh[:4], got[0], got[1], got[2:])
    o, lse, grads = _forward_backward(reversed_case, *fresh)
    assert torch.equal(got[0], o) and torch.equal(got[1], lse)
    for g, want in zip(got[2:], grads, strict=True):
        assert torch.allclose(g, want, atol=2e-3, rtol=1e-2)


def test_compile_fullgraph_forward_and_backward_equal_eager():
    torch._dynamo.reset()
    case = CASES[1]
    q, k, v, _, cu_q, cu_k, max_q, max_k = _inputs(case, seed=4)

    def step(q, k, v, cu_q, cu_k):
        return itorch.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True).float().square().mean()

    leaves = [t.requires_grad_() for t in (q, k, v)]
    loss = torch.compile(step, fullgraph=True)(*leaves, cu_q, cu_k)
    loss.backward()
    got = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    want = step(*leaves, cu_q, cu_k)
    want.backward()
    assert torch.allclose(loss, want, rtol=1e-3)
    for g, t in zip(got, leaves, strict=True):
        assert torch.allclose(g.float(), t.grad.float(), atol=5e-3, rtol=2e-2)


def test_count_io_counts_a_torch_call():
    """Inside count_io the torch call runs the counting build (reading the offsets on the device): the model's bytes
    of the exact plan."""
    case = CASES[0]
    q, k, v, _, cu_q, cu_k, max_q, max_k = _inputs(case)
    plain = itorch.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    with iokernels.count_io() as records:
        counted = itorch.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    assert {r["tensor"]: (r["read_bytes"], r["write_bytes"]) for r in records} == model.exact(_plan(case))["main"]
    assert torch.allclose(counted.float(), plain.float(), atol=2e-3, rtol=0)
