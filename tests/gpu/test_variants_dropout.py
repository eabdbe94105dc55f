"""Dropout with a block mask and with ALiBi on the sm_90 tma kernels (issue #22; BLOCK_SPARSE or ALIBI with DROPOUT):
counters == model.exact; outputs and gradients equal the float64 reference given the same multipliers Z
(Dropout.full_multiplier) within flash-attention's same-precision tolerance, causal or not, grouped-query, ragged N.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_variants_dropout.py`` (skips without an sm_90 device).
"""

import zlib

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.dropout import Dropout
from iokernels.plan.masks import pattern
from iokernels.plan.units import round_to
from iokernels.simulate import kv_rows, reference, reference_outputs

from .helpers import assert_within_naive, plan_naive_grads, plan_naive_p

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.usefixtures("sm90")
KB = 1024
GRADS = ("dQ", "dK", "dV")

# (N_q, N_k, d, dtype, heads, kv_heads, causal, variant)
CASES = [
    (1000, 1000, 128, "float16", 2, 2, "", "block_mask"),
    (700, 517, 64, "bfloat16", 4, 2, "bottom_right", "block_mask"),
    (1000, 1000, 64, "float16", 2, 1, "top_left", "alibi"),
    (517, 700, 128, "bfloat16", 2, 2, "", "alibi"),
]
IDS = ["-".join(map(str, c)) for c in CASES]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _plan(case, direction):
    n_q, n_k, d, dtype, heads, kv_heads, causal, variant = case
    s = _seed(case, direction)
    extra = ({"block_mask": pattern("random", 0.5, n_q=n_q, n_k=n_k, seed=2)} if variant == "block_mask"
             else {"alibi": [2.0 ** (-8 * (h + 1) / heads) for h in range(heads)]})
    return make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=227 * KB, heads=heads,
                     kv_heads=kv_heads, causal=causal, direction=direction,
                     dropout=Dropout(0.2, (s << 32) | (s ^ 0x9E3779B9), s % 1000), **extra)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward(case):
    plan = _plan(case, "fwd")
    params = dict(plan.stage("main").params)
    assert params["DROPOUT"] and ("BLOCK_SPARSE" in params or "ALIBI" in params)
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case))
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    o = launch.to_float64(run.buffers["O"], plan.dtype)
    kv = kv_rows(plan)
    z = plan.dropout.full_multiplier(plan.bh, plan.N_q, plan.N_k)
    naive = round_to((plan_naive_p(plan, host["Q"], host["K"][kv], reference.default_scale(plan.d)) * z)
                     @ host["V"][kv], plan.dtype)
    assert_within_naive({"O": o}, reference_outputs(plan, host), {"O": naive})


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward(case):
    plan = _plan(case, "bwd")
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case, "bwd"))
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    got = {n: launch.to_float64(run.buffers[n], plan.dtype) for n in GRADS}
    assert all(np.all(np.isfinite(g)) for g in got.values())
    kv = kv_rows(plan)
    naive = plan_naive_grads(plan, host["Q"], host["K"][kv], host["V"][kv], host["dO"],
                             plan.dropout.full_multiplier(plan.bh, plan.N_q, plan.N_k))
    assert_within_naive(got, reference_outputs(plan, host), naive)
