"""Document masking on the GPU (issue #22; iokernels.plan.varlen.make_documents_plan: the variable-length tma kernels
built with VARLEN_HEAD_MAJOR on the dense (B·H, N, d) layout): counters == model.exact; O, and dQ, dK, dV, equal the
dense float64 reference with the document mask (built here element by element) within flash-attention's
same-precision tolerance, for empty and one-row documents, lengths that are not multiples of the tiles, causal,
grouped-query attention, d inside a wider tile and past 128; ``iokernels.attention(..., documents=)``,
``attention_backward`` and ``iokernels.torch.attention`` (autograd) run the same plans.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_documents.py`` (skips without an sm_90 device).
"""

import zlib

import numpy as np
import pytest

import iokernels
from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.varlen import make_documents_plan
from iokernels.simulate import reference
from iokernels.simulate.varlen import other_layout

from .helpers import assert_within_naive, varlen_naive

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.usefixtures("sm90")

# (documents, d, dtype, batch, heads, kv_heads, causal)
CASES = [
    ((1, 113, 0, 239, 1023), 64, "float16", 2, 4, 2, False),
    ((300, 17, 4097), 128, "bfloat16", 1, 2, 2, True),
    ((200, 64, 7), 96, "float16", 2, 3, 1, True),
    ((130, 1, 257), 256, "bfloat16", 1, 2, 2, False),
]
IDS = ["-".join(map(str, (len(c[0]), *c[1:]))) for c in CASES]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def document_mask(documents, causal):
    """(N, N) bool: key j visible to query i (the same document; causal: j <= i)."""
    ids = np.repeat(np.arange(len(documents)), documents)
    mask = ids[:, None] == ids[None, :]
    return mask & np.tri(len(ids), dtype=bool) if causal else mask


def _plan(case, direction):
    documents, d, dtype, batch, heads, kv_heads, causal = case
    return make_documents_plan(documents, d=d, dtype=dtype, batch=batch, heads=heads, kv_heads=kv_heads,
                               causal=causal, direction=direction)


def _dense(plan, host, documents, causal):
    """The float64 reference on the dense layout with the document mask, and the same-precision naive outputs."""
    group = plan.heads // plan.kv_heads
    q, k, v = host["Q"], np.repeat(host["K"], group, axis=0), np.repeat(host["V"], group, axis=0)
    mask = document_mask(documents, causal)
    naive = other_layout(plan, varlen_naive(plan, other_layout(plan, host), reference.default_scale(plan.d)))
    if "dO" not in host:
        return {"O": reference.forward(q, k, v, mask=mask)[0]}, naive
    dq, dk, dv = reference.backward(q, k, v, host["dO"], mask=mask)
    dk, dv = (x.reshape(plan.kv_heads, group, *x.shape[1:]).sum(axis=1) for x in (dk, dv))
    return {"dQ": np.nan_to_num(dq), "dK": dk, "dV": dv}, naive


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_counters_and_outputs(case):
    plan = _plan(case, "fwd")
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case))
    want, naive = _dense(plan, host, case[0], case[-1])
    for counting in (True, False):
        run = launch.run_plan(plan, inputs, counting=counting)
        if counting:
            assert run.counts == model.exact(plan)
        o = launch.to_float64(run.buffers["O"], plan.dtype)
        assert o.shape == want["O"].shape == (plan.heads, sum(case[0]), plan.d)
        assert_within_naive({"O": o}, want, {"O": naive["O"]})


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward_counters_and_gradients(case):
    plan = _plan(case, "bwd")
    inputs, host = launch.make_device_inputs(plan, seed=_seed("bwd", case))
    want, naive = _dense(plan, host, case[0], case[-1])
    for counting in (True, False):
        run = launch.run_plan(plan, inputs, counting=counting)
        if counting:
            assert run.counts == model.exact(plan)
        got = {n: launch.to_float64(run.buffers[n], plan.dtype) for n in want}
        assert_within_naive(got, want, {n: naive[n] for n in want})


@pytest.mark.parametrize("causal", [False, True])
def test_library_forward_and_backward(causal):
    """iokernels.attention and attention_backward with documents on (B, H, N, d) cupy arrays (grouped-query): the
    dense masked reference, twice (the second call on the fast path), and inside count_io the model's bytes."""
    documents = (17, 0, 500, 129, 1)
    n, rng = sum(documents), np.random.default_rng(_seed("library", causal))
    q, k, v, do = (rng.standard_normal(s).astype(np.float16) for s in ((2, 4, n, 128), (2, 2, n, 128),
                                                                      (2, 2, n, 128), (2, 4, n, 128)))
    want_o, _ = reference.forward(q.astype(np.float64), *(np.repeat(x.astype(np.float64), 2, axis=1) for x in (k, v)),
                                  mask=document_mask(documents, causal))
    want = reference.backward(q.astype(np.float64), *(np.repeat(x.astype(np.float64), 2, axis=1) for x in (k, v)),
                              do.astype(np.float64), mask=document_mask(documents, causal))
    dq_w, dk_w, dv_w = np.nan_to_num(want[0]), *(x.reshape(2, 2, 2, n, 128).sum(axis=2) for x in want[1:])
    qd, kd, vd = (cp.asarray(x) for x in (q, k, v))
    for _ in range(2):
        o, lse = iokernels.attention(qd, kd, vd, documents=documents, causal=causal, return_lse=True)
        assert o.shape == q.shape and lse.shape == q.shape[:-1]
        assert np.max(np.abs(cp.asnumpy(o).astype(np.float64) - want_o)) < 2e-2
        grads = iokernels.attention_backward(qd, kd, vd, o, cp.asarray(do), lse, documents=documents,
                                             causal=causal)
        for g, w in zip(grads, (dq_w, dk_w, dv_w), strict=True):
            assert g.shape == w.shape
            assert np.max(np.abs(cp.asnumpy(g).astype(np.float64) - w)) < 2e-2 * max(1.0, np.max(np.abs(w)))
    fwd = make_documents_plan(documents, d=128, dtype="float16", batch=2, heads=4, kv_heads=2, causal=causal)
    with iokernels.count_io() as records:
        iokernels.attention(qd, kd, vd, documents=documents, causal=causal)
    assert {r["tensor"]: (r["read_bytes"], r["write_bytes"]) for r in records} == model.exact(fwd)["main"]


def test_torch_autograd():
    """iokernels.torch.attention(documents=) under autograd against torch's float64 SDPA with the boolean mask."""
    torch = pytest.importorskip("torch")
    itorch = pytest.importorskip("iokernels.torch")  # (imported here: the test passed only after another had)
    documents, causal = (300, 1, 211), True
    n = sum(documents)
    gen = torch.Generator(device="cuda").manual_seed(_seed("torch"))
    q, k, v = (torch.randn(*s, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_()
               for s in ((2, 4, n, 64), (2, 2, n, 64), (2, 2, n, 64)))
    o = itorch.attention(q, k, v, documents=documents, causal=causal)
    o.float().square().sum().backward()
    mask = torch.as_tensor(document_mask(documents, causal), device="cuda")
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, attn_mask=mask, enable_gqa=True)
    want.square().sum().backward()
    assert (o.double() - want).abs().max().item() < 3e-2
    for got, ref in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert got.shape == ref.shape
        assert (got.double() - ref).abs().max().item() < 5e-2 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize(("causal", "d"), [(False, 128), (True, 128), (False, 64)])
def test_documents_of_one_length_run_as_a_batch(causal, d):
    """Documents of one length (iokernels.library.varlen.uniform_documents) run the dense path on (B, H, D, L, d) views:
    the dense masked reference forward and backward, and inside count_io the bytes of the dense plan of that batch (at
    d 64 the 192-row tiles' persistent grid)."""
    documents = (250,) * 4
    n, rng = sum(documents), np.random.default_rng(_seed("uniform", causal))
    q, k, v, do = (rng.standard_normal((2, 3, n, d)).astype(np.float16) for _ in range(4))
    mask = document_mask(documents, causal)
    want_o, _ = reference.forward(*(x.astype(np.float64) for x in (q, k, v)), mask=mask)
    want = reference.backward(*(x.astype(np.float64) for x in (q, k, v, do)), mask=mask)
    qd, kd, vd = (cp.asarray(x) for x in (q, k, v))
    o, lse = iokernels.attention(qd, kd, vd, documents=documents, causal=causal, return_lse=True)
    assert o.shape == q.shape and lse.shape == q.shape[:-1]
    assert np.max(np.abs(cp.asnumpy(o).astype(np.float64) - want_o)) < 2e-2
    grads = iokernels.attention_backward(qd, kd, vd, o, cp.asarray(do), lse, documents=documents, causal=causal)
    for g, w in zip(grads, want, strict=True):
        assert g.shape == w.shape
        assert np.max(np.abs(cp.asnumpy(g).astype(np.float64) - w)) < 2e-2 * max(1.0, np.max(np.abs(w)))
    dense = make_plan("flash", "fast", N_q=250, d=d, dtype="float16", sram=227 * 1024, batch=2 * 3 * 4,
                      causal="bottom_right" if causal else "")
    with iokernels.count_io() as records:
        iokernels.attention(qd, kd, vd, documents=documents, causal=causal)
    assert {r["tensor"]: (r["read_bytes"], r["write_bytes"]) for r in records} == model.exact(dense)["main"]
    torch = pytest.importorskip("torch")
    itorch = pytest.importorskip("iokernels.torch")
    qt, kt, vt = (torch.as_tensor(x, device="cuda").requires_grad_() for x in (q, k, v))
    ot = itorch.attention(qt, kt, vt, documents=documents, causal=causal)
    ot.backward(torch.as_tensor(do, device="cuda"))
    assert np.max(np.abs(ot.detach().double().cpu().numpy() - want_o)) < 2e-2
    for t, w in zip((qt, kt, vt), want, strict=True):
        assert np.max(np.abs(t.grad.double().cpu().numpy() - w)) < 2e-2 * max(1.0, np.max(np.abs(w)))


def test_bad_input():
    q = cp.zeros((2, 100, 64), cp.float16)
    with pytest.raises(ValueError, match="N = 90"):
        iokernels.attention(q, q, q, documents=(40, 50))
    with pytest.raises(ValueError, match="not window"):
        iokernels.attention(q, q, q, documents=(40, 60), window=(8, 0))
    with pytest.raises(ValueError, match="documents"):
        iokernels.attention(q, q, q, documents=(40, -1))
    with pytest.raises(ValueError, match="contiguous"):
        iokernels.attention(q[:, ::2], q[:, ::2], q[:, ::2], documents=(50,))
