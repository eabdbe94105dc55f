"""Dropout and explicit masks through the library on the GPU: iokernels.attention / attention_backward and
iokernels.torch against the float64 reference given the same mask Z, the seed/offset round trip, and
every algorithm drawing the same mask for one Dropout."""

import numpy as np
import pytest

import iokernels
from iokernels.simulate import reference

from .helpers import rel_err

cp = pytest.importorskip("cupy")

TOL = {np.float32: (1e-5, 1e-4), np.float16: (5e-3, 2e-2)}


def _z(dropout, lead, n_q, n_k):
    """The dropout multipliers of the whole problem, shaped (*lead, n_q, n_k) (batch·head index = flat lead)."""
    bh = int(np.prod(lead))
    return dropout.full_multiplier(bh, n_q, n_k).reshape(*lead, n_q, n_k)


def _inputs(dtype, shape_q, shape_kv, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape_q).astype(dtype)
    k, v = (rng.standard_normal(shape_kv).astype(dtype) for _ in range(2))
    do = rng.standard_normal(shape_q).astype(dtype)
    return q, k, v, do


@pytest.mark.parametrize("algorithm, dtype, d, causal", [
    ("flash", np.float16, 64, False), ("flash", np.float16, 128, True), ("flash", np.float32, 64, False),
    ("flash", np.float32, 40, "top_left"), ("standard", np.float32, 64, False), ("standard", np.float16, 64, True),
])
def test_dropout_forward_and_backward_match_float64_given_the_mask(algorithm, dtype, d, causal):
    lead, n_q, n_k = (2, 3), 150, 130
    q, k, v, do = _inputs(dtype, (*lead, n_q, d), (*lead, n_k, d))
    o, lse, drop = iokernels.attention(q, k, v, algorithm=algorithm, causal=causal, dropout=0.2, return_lse=True,
                                       return_dropout=True)
    assert isinstance(drop, iokernels.Dropout) and drop.p == 0.2
    z = _z(drop, lead, n_q, n_k)
    host = [x.astype(np.float64) for x in (q, k, v, do)]
    want_o, want_lse = reference.forward(*host[:3], causal=causal, dropout=z)
    tol_f, tol_b = TOL[dtype]
    assert rel_err(o.astype(np.float64), want_o) < tol_f
    finite = np.isfinite(want_lse)
    assert np.max(np.abs(lse[finite] - want_lse[finite])) < 1e-3
    grads = iokernels.attention_backward(q, k, v, o, do, lse, algorithm=algorithm, causal=causal, dropout=drop)
    want = reference.backward(*host, causal=causal, dropout=z)
    for name, got, w in zip("qkv", grads, want, strict=True):
        assert rel_err(got.astype(np.float64), w) < tol_b, name
    # without the Dropout the backward computes other gradients: the mask is really used
    plain = iokernels.attention_backward(q, k, v, o, do, lse, algorithm=algorithm, causal=causal)
    assert rel_err(plain[2].astype(np.float64), want[2]) > 10 * tol_b


def test_each_call_draws_a_new_offset_and_a_given_dropout_repeats():
    q, k, v, _ = _inputs(np.float16, (2, 4, 256, 64), (2, 4, 256, 64))
    iokernels.manual_seed(99)
    o1, d1 = iokernels.attention(q, k, v, dropout=0.1, return_dropout=True)
    o2, d2 = iokernels.attention(q, k, v, dropout=0.1, return_dropout=True)
    assert (d1.seed, d1.offset, d2.seed, d2.offset) == (99, 0, 99, 1)
    assert not np.array_equal(o1, o2)
    again = iokernels.attention(q, k, v, dropout=d1)
    assert np.array_equal(again, o1)
    none, d0 = iokernels.attention(q, k, v, dropout=0.0, return_dropout=True)
    assert d0 is None and np.array_equal(none, iokernels.attention(q, k, v))


def test_every_algorithm_draws_the_same_mask():
    """One Dropout: standard, two_pass and flash (research and tensor-core) give the same O to rounding."""
    lead, n = (2, 2), 200
    q, k, v, _ = _inputs(np.float32, (*lead, n, 64), (*lead, n, 64), seed=3)
    drop = iokernels.Dropout(0.3, 2**63 + 11, 7)
    want = reference.forward(*(x.astype(np.float64) for x in (q, k, v)), dropout=_z(drop, lead, n, n))[0]
    outs = {f"{a}/{s}": iokernels.attention(q, k, v, algorithm=a, schedule=s, dropout=drop)
            for a, s in (("standard", None), ("two_pass", "store"), ("two_pass", "recompute"), ("flash", "q_outer"),
                         ("flash", "kv_outer"))}
    for label, o in outs.items():
        assert rel_err(o.astype(np.float64), want) < 1e-5, label
    h = [x.astype(np.float16) for x in (q, k, v)]
    fast = iokernels.attention(*h, dropout=drop)  # the tensor-core path where it takes dropout
    assert rel_err(fast.astype(np.float64), want) < 5e-3


def test_grouped_query_dropout_uses_the_query_heads_mask():
    lead_q, n = (2, 4), 180
    q, k, v, do = _inputs(np.float16, (*lead_q, n, 64), (2, 2, n, 64), seed=5)
    o, lse, drop = iokernels.attention(q, k, v, dropout=0.25, return_lse=True, return_dropout=True)
    z = _z(drop, lead_q, n, n)
    host = [x.astype(np.float64) for x in (q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1), do)]
    assert rel_err(o.astype(np.float64), reference.forward(*host[:3], dropout=z)[0]) < 5e-3
    dq, dk, dv = iokernels.attention_backward(q, k, v, o, do, lse, dropout=drop)
    wq, wk, wv = reference.backward(*host, dropout=z)
    assert rel_err(dq.astype(np.float64), wq) < 2e-2
    assert rel_err(dk.astype(np.float64), wk.reshape(2, 2, 2, n, 64).sum(axis=2)) < 2e-2
    assert rel_err(dv.astype(np.float64), wv.reshape(2, 2, 2, n, 64).sum(axis=2)) < 2e-2


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_standard_attention_reads_explicit_masks(kind):
    lead, n_q, n_k = (2, 2), 96, 120
    q, k, v, do = _inputs(np.float32, (*lead, n_q, 32), (*lead, n_k, 32), seed=7)
    rng = np.random.default_rng(8)
    visible = rng.random((n_q, n_k)) < 0.7
    visible[5] = False  # a row that sees no key
    mask = visible if kind == "bool" else np.where(visible, rng.standard_normal((n_q, n_k)), -np.inf).astype(
        np.float32)
    o, lse = iokernels.attention(q, k, v, algorithm="standard", mask=mask, return_lse=True)
    host = [x.astype(np.float64) for x in (q, k, v, do)]
    want = reference.forward(*host[:3], mask=mask)[0]
    assert rel_err(o, want) < 1e-5 and np.all(o[..., 5, :] == 0) and np.all(np.isneginf(lse[..., 5]))
    flash = iokernels.attention(q, k, v, mask=mask)
    assert rel_err(flash, want) < 1e-5
    grads = iokernels.attention_backward(q, k, v, o, do, lse, algorithm="standard", mask=mask)
    for got, w in zip(grads, reference.backward(*host, mask=mask), strict=True):
        assert rel_err(got, w) < 1e-4


def test_torch_dropout_gradients_match_float64():
    torch = pytest.importorskip("torch")
    itorch = pytest.importorskip("iokernels.torch")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 3, 140, 64, device="cuda", dtype=torch.float16, generator=gen, requires_grad=True)
               for _ in range(3))
    iokernels.manual_seed(4242)  # the call takes offset 0 of seed 4242
    o = itorch.attention(q, k, v, dropout=0.15, causal=True)
    do = torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=gen)
    o.backward(do)
    z = _z(iokernels.Dropout(0.15, 4242, 0), (2, 3), 140, 140)
    host = [t.detach().double().cpu().numpy() for t in (q, k, v, do)]
    assert rel_err(o.detach().double().cpu().numpy(), reference.forward(*host[:3], causal=True, dropout=z)[0]) < 5e-3
    for t, w in zip((q, k, v), reference.backward(*host, causal=True, dropout=z), strict=True):
        assert rel_err(t.grad.double().cpu().numpy(), w) < 2e-2
