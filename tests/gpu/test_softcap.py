"""The softcap on the GPU (issue #22; SOFTCAP on flash_tma.cu and flash_tma_bwd.cu): counters == model.exact, O and
the gradients within flash-attention's same-precision tolerance of the float64 reference with c · tanh(τ s / c), with
causal, windows, grouped-query attention, ragged N, N_q ≠ N_k, d inside a wider tile (and the forward past 128); the
plain build agrees with the counting one; ``iokernels.attention`` / ``attention_backward`` and
``iokernels.torch.attention`` (autograd) run the same plans. Inputs of magnitude 3, so that most logits are capped.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_softcap.py`` (skips without an sm_90 device).
"""

import zlib

import numpy as np
import pytest

import iokernels
from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.units import round_to
from iokernels.simulate import kv_rows, reference, reference_outputs

from .helpers import assert_within_naive, plan_naive_grads, plan_naive_p, ulp

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.usefixtures("sm90")
KB = 1024
GRADS = ("dQ", "dK", "dV")

# (N_q, N_k, d, dtype, heads, kv_heads, causal, window, softcap)
CASES = [
    (1000, 1000, 64, "float16", 2, 2, "", None, 5.0),
    (4097, 4097, 128, "bfloat16", 1, 1, "", None, 30.0),
    (1000, 1000, 64, "bfloat16", 4, 2, "bottom_right", (256, None), 8.0),  # window and causal, grouped-query
    (113, 1000, 128, "float16", 1, 1, "", (100, 20), 3.0),
    (1023, 517, 96, "bfloat16", 2, 1, "top_left", None, 10.0),  # d inside a wider tile
    (239, 239, 256, "float16", 2, 2, "top_left", None, 5.0),  # the forward only (the wide backward has none)
]
IDS = ["-".join(map(str, c)).replace(" ", "") for c in CASES]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _plan(case, direction):
    n_q, n_k, d, dtype, heads, kv_heads, causal, window, softcap = case
    return make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=227 * KB, heads=heads,
                     kv_heads=kv_heads, causal=causal, window=window, softcap=softcap, direction=direction)


def _run_both(plan, inputs, names):
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    got = {n: launch.to_float64(run.buffers[n], plan.dtype) for n in names}
    plain = launch.run_plan(plan, inputs, counting=False)
    for n in names:  # the same kernel less its counters: equal, or one ulp apart
        other = launch.to_float64(plain.buffers[n], plan.dtype)
        assert np.max(np.abs(other - got[n]), initial=0.0) <= ulp(plan.dtype) * np.max(np.abs(got[n]), initial=0.0)
    return got


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward(case):
    plan = _plan(case, "fwd")
    assert dict(plan.stage("main").params)["SOFTCAP"] == 1
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case, "fwd"), magnitude=3.0)
    got = _run_both(plan, inputs, ("O",))
    want = reference_outputs(plan, host)["O"]
    kv = kv_rows(plan)
    naive = round_to(plan_naive_p(plan, host["Q"], host["K"][kv], reference.default_scale(plan.d)) @ host["V"][kv],
                     plan.dtype)
    assert_within_naive(got, {"O": want}, {"O": naive})
    # the softcap mattered: without it the output differs by far more than the tolerance
    plain = reference.forward(host["Q"], host["K"][kv], host["V"][kv], causal=plan.causal,
                              mask=plan.visible(np.arange(plan.N_q), np.arange(plan.N_k)))[0]
    assert np.max(np.abs(plain - want)) > 0.05 * np.max(np.abs(want))


BWD = [(c, i) for c, i in zip(CASES, IDS, strict=True) if c[2] <= 128]


@pytest.mark.parametrize("case", [c for c, _ in BWD], ids=[i for _, i in BWD])
def test_backward(case):
    plan = _plan(case, "bwd")
    assert plan.stage("main").kernel == "flash_tma_bwd" and plan.tile["Br"] == 64
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case, "bwd"), magnitude=3.0)
    got = _run_both(plan, inputs, GRADS)
    kv = kv_rows(plan)
    naive = plan_naive_grads(plan, host["Q"], host["K"][kv], host["V"][kv], host["dO"])
    assert_within_naive(got, reference_outputs(plan, host), naive)


def test_library_and_torch():
    """iokernels.attention / attention_backward on cupy arrays (twice: the fast path) and iokernels.torch.attention
    under autograd, against the float64 reference with the softcap."""
    torch = pytest.importorskip("torch")
    from iokernels.torch import attention as torch_attention  # (an optional module)

    c, n = 4.0, 700
    rng = np.random.default_rng(_seed("library"))
    q, k, v, do = (3 * rng.standard_normal(s) for s in ((2, 4, n, 128), (2, 2, n, 128), (2, 2, n, 128),
                                                        (2, 4, n, 128)))
    q, k, v, do = (x.astype(np.float16).astype(np.float64) for x in (q, k, v, do))
    kx, vx = (np.repeat(x, 2, axis=1) for x in (k, v))
    o_w = reference.forward(q, kx, vx, causal=True, softcap=c)[0]
    dq_w, dk_w, dv_w = reference.backward(q, kx, vx, do, causal=True, softcap=c)
    dk_w, dv_w = (x.reshape(2, 2, 2, n, 128).sum(axis=2) for x in (dk_w, dv_w))
    qd, kd, vd, dod = (cp.asarray(x.astype(np.float16)) for x in (q, k, v, do))
    for _ in range(2):
        o, lse = iokernels.attention(qd, kd, vd, causal=True, softcap=c, return_lse=True)
        assert np.max(np.abs(cp.asnumpy(o) - o_w)) < 2e-2 * np.max(np.abs(o_w))
        grads = iokernels.attention_backward(qd, kd, vd, o, dod, lse, causal=True, softcap=c)
        for g, w in zip(grads, (dq_w, dk_w, dv_w), strict=True):
            assert np.max(np.abs(cp.asnumpy(g).astype(np.float64) - w)) < 2e-2 * np.max(np.abs(w))
    qt, kt, vt = (torch.tensor(x, dtype=torch.bfloat16, device="cuda", requires_grad=True) for x in (q, k, v))
    ot = torch_attention(qt, kt, vt, causal=True, softcap=c)
    ot.backward(torch.tensor(do, dtype=torch.bfloat16, device="cuda"))
    assert np.max(np.abs(ot.double().detach().cpu().numpy() - o_w)) < 3e-2 * np.max(np.abs(o_w))
    for g, w in ((qt.grad, dq_w), (kt.grad, dk_w), (vt.grad, dv_w)):
        assert np.max(np.abs(g.double().cpu().numpy() - w)) < 4e-2 * np.max(np.abs(w))
