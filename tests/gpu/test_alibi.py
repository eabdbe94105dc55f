"""ALiBi on the GPU (issue #22; ALIBI on flash_tma.cu and flash_tma_bwd.cu): counters == model.exact (the slopes'
floats included), O and the gradients within flash-attention's same-precision tolerance of the float64 reference with
the bias −slope · |j − i − (N_k − N_q)|, with causal both ways, a window, a block mask, dropout's absence, grouped-query
attention, ragged N, N_q ≠ N_k, d inside a wider tile; the plain build agrees with the counting one;
``iokernels.attention`` / ``attention_backward`` and ``iokernels.torch.attention`` (autograd) take the slopes.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_alibi.py`` (skips without an sm_90 device).
"""

import zlib
from dataclasses import replace

import numpy as np
import pytest

import iokernels
from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.masks import pattern
from iokernels.plan.units import round_to
from iokernels.simulate import kv_rows, reference, reference_outputs

from .helpers import assert_within_naive, plan_naive_grads, plan_naive_p, ulp

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.usefixtures("sm90")
KB = 1024
GRADS = ("dQ", "dK", "dV")

# (N_q, N_k, d, dtype, batch, heads, kv_heads, causal, window, sparse)
CASES = [
    (1000, 1000, 64, "float16", 2, 2, 2, "", None, False),
    (4097, 4097, 128, "bfloat16", 1, 1, 1, "bottom_right", None, False),
    (1000, 1000, 64, "bfloat16", 1, 4, 2, "top_left", None, False),  # grouped-query
    (113, 1000, 128, "float16", 1, 1, 1, "", (100, 20), False),  # a window, N_q < N_k
    (1023, 517, 96, "bfloat16", 2, 2, 1, "top_left", None, False),  # d inside a wider tile, N_q > N_k
    (600, 600, 128, "float16", 1, 2, 2, "bottom_right", None, True),  # with a block mask
]
IDS = ["-".join(map(str, c)).replace(" ", "") for c in CASES]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _plan(case, direction):
    n_q, n_k, d, dtype, batch, heads, kv_heads, causal, window, sparse = case
    slopes = [2.0 ** (-8 * (h + 1) / heads) for h in range(heads)]  # (ALiBi's geometric slopes)
    mask = pattern("random", 0.5, n_q=n_q, n_k=n_k, seed=3) if sparse else None
    return make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=227 * KB, batch=batch, heads=heads,
                     kv_heads=kv_heads, causal=causal, window=window, block_mask=mask, alibi=slopes,
                     direction=direction)


def _run_both(plan, inputs, names):
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    assert run.counts["main"]["alibi"][0] > 0
    got = {n: launch.to_float64(run.buffers[n], plan.dtype) for n in names}
    plain = launch.run_plan(plan, inputs, counting=False)
    for n in names:  # the same kernel less its counters: equal, or one ulp apart
        other = launch.to_float64(plain.buffers[n], plan.dtype)
        assert np.max(np.abs(other - got[n]), initial=0.0) <= ulp(plan.dtype) * np.max(np.abs(got[n]), initial=0.0)
    return got


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward(case):
    plan = _plan(case, "fwd")
    assert dict(plan.stage("main").params)["ALIBI"] > 0
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case, "fwd"))
    got = _run_both(plan, inputs, ("O",))
    want = reference_outputs(plan, host)["O"]
    kv = kv_rows(plan)
    naive = round_to(plan_naive_p(plan, host["Q"], host["K"][kv], reference.default_scale(plan.d)) @ host["V"][kv],
                     plan.dtype)
    assert_within_naive(got, {"O": want}, {"O": naive})
    # the bias mattered: without it the output differs by far more than the tolerance
    plain = reference_outputs(replace(plan, alibi=None), host)["O"]
    assert np.max(np.abs(plain - want)) > 0.05 * np.max(np.abs(want))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward(case):
    plan = _plan(case, "bwd")
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case, "bwd"))
    got = _run_both(plan, inputs, GRADS)
    kv = kv_rows(plan)
    naive = plan_naive_grads(plan, host["Q"], host["K"][kv], host["V"][kv], host["dO"])
    assert_within_naive(got, reference_outputs(plan, host), naive)


def test_library_and_torch():
    """iokernels.attention / attention_backward on cupy arrays (twice: the fast path) and iokernels.torch.attention
    under autograd, against the float64 reference with the bias, per-head slopes (every batch row alike)."""
    torch = pytest.importorskip("torch")
    from iokernels.torch import attention as torch_attention  # (an optional module)

    n, slopes = 700, (0.5, 0.25, 0.125, 0.0625)
    rng = np.random.default_rng(_seed("library"))
    q, k, v, do = (rng.standard_normal(s) for s in ((2, 4, n, 128), (2, 2, n, 128), (2, 2, n, 128), (2, 4, n, 128)))
    q, k, v, do = (x.astype(np.float16).astype(np.float64) for x in (q, k, v, do))
    kx, vx = (np.repeat(x, 2, axis=1) for x in (k, v))
    per_row = np.tile(slopes, 2)
    o_w = reference.forward(q, kx, vx, causal=True, alibi=per_row)[0]
    dq_w, dk_w, dv_w = reference.backward(q, kx, vx, do, causal=True, alibi=per_row)
    dk_w, dv_w = (x.reshape(2, 2, 2, n, 128).sum(axis=2) for x in (dk_w, dv_w))
    qd, kd, vd, dod = (cp.asarray(x.astype(np.float16)) for x in (q, k, v, do))
    for _ in range(2):
        o, lse = iokernels.attention(qd, kd, vd, causal=True, alibi_slopes=slopes, return_lse=True)
        assert np.max(np.abs(cp.asnumpy(o) - o_w)) < 2e-2 * np.max(np.abs(o_w))
        grads = iokernels.attention_backward(qd, kd, vd, o, dod, lse, causal=True, alibi_slopes=slopes)
        for g, w in zip(grads, (dq_w, dk_w, dv_w), strict=True):
            assert np.max(np.abs(cp.asnumpy(g).astype(np.float64) - w)) < 2e-2 * np.max(np.abs(w))
    qt, kt, vt = (torch.tensor(x, dtype=torch.bfloat16, device="cuda", requires_grad=True) for x in (q, k, v))
    ot = torch_attention(qt, kt, vt, causal=True, alibi_slopes=slopes)
    ot.backward(torch.tensor(do, dtype=torch.bfloat16, device="cuda"))
    assert np.max(np.abs(ot.double().detach().cpu().numpy() - o_w)) < 3e-2 * np.max(np.abs(o_w))
    for g, w in ((qt.grad, dq_w), (kt.grad, dk_w), (vt.grad, dv_w)):
        assert np.max(np.abs(g.double().cpu().numpy() - w)) < 4e-2 * np.max(np.abs(w))


def test_torch_compile_takes_a_block_mask_and_alibi():
    """iokernels.torch.attention with block_mask= and alibi_slopes= under torch.compile (the operator takes them:
    the block mask as its bytes, the slopes as floats) gives the eager call's output and gradients."""
    torch = pytest.importorskip("torch")
    from iokernels.torch import attention as torch_attention

    n, d = 512, 64
    gen = torch.Generator(device="cuda").manual_seed(_seed("compile"))
    leaves = [torch.randn(1, 4, n, d, device="cuda", dtype=torch.float16, generator=gen).requires_grad_()
              for _ in range(3)]
    blocks = pattern("random", 0.5, n_q=n, n_k=n, seed=1)
    slopes = (0.5, 0.25, 0.125, 0.0625)

    def call(q, k, v):
        return torch_attention(q, k, v, causal=True, block_mask=blocks, alibi_slopes=slopes)

    results = []
    for fn in (call, torch.compile(call)):
        for x in leaves:
            x.grad = None
        out = fn(*leaves)
        out.float().square().sum().backward()
        results.append((out.detach(), [x.grad.clone() for x in leaves]))
    (o1, g1), (o2, g2) = results
    assert torch.equal(o1, o2)
    for a, b in zip(g1, g2, strict=True):
        assert torch.equal(a, b)
