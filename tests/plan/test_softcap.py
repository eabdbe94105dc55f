"""The softcap (issue #22; iokernels.plan.variants.with_softcap) on the CPU: the plans that take it (flash/fast on the
tma kernels, SOFTCAP on the main stage; the backward on B_r 64 tiles), the ones refused, and the simulator's outputs
and gradients against the float64 reference (whose softcap is checked here against a finite difference and by
hand), its bytes the model's (unchanged by the softcap)."""

from dataclasses import replace

import numpy as np
import pytest

from iokernels import model
from iokernels.plan import Unsupported, make_plan
from iokernels.simulate import make_inputs, reference, simulate
from iokernels.simulate.inputs import reference_outputs

KB = 1024


def _plan(direction, **kw):
    args = dict(N_q=300, N_k=300, d=64, dtype="float16", sram=227 * KB, heads=2, softcap=5.0, direction=direction)
    return make_plan("flash", "fast", **{**args, **kw})


def test_plans_and_refusals():
    fwd, bwd = _plan("fwd"), _plan("bwd", causal=True)
    assert fwd.softcap == bwd.softcap == 5.0
    assert dict(fwd.stage("main").params)["SOFTCAP"] == 1 and fwd.stage("main").kernel == "flash_tma_fwd"
    assert dict(bwd.stage("main").params)["SOFTCAP"] == 1 and bwd.stage("main").kernel == "flash_tma_bwd"
    assert bwd.tile["Br"] == 64  # at 128 the backward's 1 − tanh² per element spills
    assert model.exact(fwd) == model.exact(replace(fwd, softcap=None))  # the bytes do not change
    with pytest.raises(Unsupported, match="softcap"):
        _plan("bwd", d=256)  # the wide backward
    with pytest.raises(Unsupported, match="softcap"):
        make_plan("flash", "q_outer", N_q=300, d=64, dtype="float16", sram=96 * KB, softcap=5.0)
    with pytest.raises(ValueError, match="> 0"):
        _plan("fwd", softcap=-1.0)
    with pytest.raises(TypeError, match="finite"):
        _plan("fwd", softcap=float("inf"))


def test_reference_softcap_by_hand_and_by_finite_difference():
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((1, 5, 8)) * 2 for _ in range(4))
    c, scale = 1.5, 0.7
    s = c * np.tanh(scale * (q @ k.swapaxes(-1, -2)) / c)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    assert np.allclose(reference.forward(q, k, v, scale, softcap=c)[0], p @ v, atol=1e-13)
    dq = reference.backward(q, k, v, do, scale, softcap=c)[0]
    eps, num = 1e-6, np.zeros_like(q)
    for idx in np.ndindex(q.shape):
        qp, qm = q.copy(), q.copy()
        qp[idx] += eps
        qm[idx] -= eps
        num[idx] = ((reference.forward(qp, k, v, scale, softcap=c)[0] - reference.forward(qm, k, v, scale,
                                                                                         softcap=c)[0]) * do).sum()
    assert np.allclose(dq, num / (2 * eps), atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, (40, 0)])
def test_simulator_equals_reference_and_model(causal, window):
    for direction in ("fwd", "bwd"):
        plan = _plan(direction, causal=causal, window=window, N_q=200, N_k=333, kv_heads=1, d=128)
        inputs = make_inputs(plan, seed=5)
        sim = simulate(plan, inputs)
        assert sim.counts == model.exact(plan)
        want = reference_outputs(plan, inputs)
        for name, x in want.items():
            assert np.max(np.abs(sim.outputs[name] - x)) < 1e-10 * max(1.0, np.max(np.abs(x))), name
        # and the softcap changes the outputs (a capped logit differs from an uncapped one at these scores)
        plain = reference_outputs(_plan(direction, causal=causal, window=window, N_q=200, N_k=333, kv_heads=1,
                                        d=128, softcap=None), inputs)
        assert any(np.max(np.abs(plain[n] - want[n])) > 1e-3 for n in want)
