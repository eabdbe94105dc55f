"""N = 1,048,576 (float16, one head, d = 64): flash forward and backward through the library, checked on
sampled rows against float64; standard attention is refused before launch. Slow: -m "not slow" skips it."""

import pytest

import iokernels
from iokernels.simulate import reference

from .helpers import rel_err

cp = pytest.importorskip("cupy")

N = 1 << 20
D = 64
ROWS = (0, 1, N // 2 + 3, N - 1)  # sampled queries (dq, o, lse) and keys (dk, dv)


def _f64(x):
    return x[0].astype(cp.float64)


@pytest.mark.slow
def test_flash_forward_and_backward_at_a_million_tokens():
    rs = cp.random.default_rng(13)
    q, k, v, do = (rs.standard_normal((1, N, D), dtype=cp.float32).astype(cp.float16) for _ in range(4))
    with pytest.raises(iokernels.DeviceMemoryError, match=r"needs \d+\.\d\d GB, device has \d+\.\d\d GB"):
        iokernels.attention(q, k, v, algorithm="standard")
    o, lse = iokernels.attention(q, k, v, return_lse=True)
    assert o.shape == (1, N, D) and not bool(cp.isnan(o).any()) and not bool(cp.isinf(lse).any())
    dq, dk, dv = iokernels.attention_backward(q, k, v, o, do, lse)
    assert not any(bool(cp.isnan(g).any()) for g in (dq, dk, dv))

    scale = reference.default_scale(D)
    Q, K, V, dO, O = (_f64(x) for x in (q, k, v, do, o))
    rows = cp.asarray(ROWS)
    # forward and dq for the sampled queries: their whole score rows, exactly
    s = scale * Q[rows] @ K.T
    m = s.max(axis=1, keepdims=True)
    p = cp.exp(s - m)
    l = p.sum(axis=1, keepdims=True)
    p /= l
    want_o, want_lse = p @ V, (m + cp.log(l))[:, 0]
    assert rel_err(cp.asnumpy(O[rows]), cp.asnumpy(want_o)) < 2e-2
    assert float(cp.max(cp.abs(lse[0, rows].astype(cp.float64) - want_lse))) < 1e-3
    D_all = (dO * O).sum(axis=1)  # D = rowsum(dO ∘ O), from the O the backward was given
    ds = p * (dO[rows] @ V.T - D_all[rows, None])
    assert rel_err(cp.asnumpy(dq[0, rows].astype(cp.float64)), cp.asnumpy(scale * ds @ K)) < 5e-2
    # dk, dv for the sampled keys: their whole score columns, with P from the (checked) lse
    pc = cp.exp(scale * Q @ K[rows].T - lse[0, :, None].astype(cp.float64))  # (N, keys)
    dsc = pc * (dO @ V[rows].T - D_all[:, None])
    assert rel_err(cp.asnumpy(dv[0, rows].astype(cp.float64)), cp.asnumpy(pc.T @ dO)) < 5e-2
    assert rel_err(cp.asnumpy(dk[0, rows].astype(cp.float64)), cp.asnumpy(scale * dsc.T @ Q)) < 5e-2
