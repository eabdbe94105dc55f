"""iokernels.fast on the CPU: the tensor-core plan is the q_outer schedule with its own tiles, so the
simulator's counts equal the exact model and its outputs the float64 reference."""

import numpy as np
import pytest

from iokernels import model, reference
from iokernels.fast import FAST_BR, make_fast_plan
from iokernels.simulate import make_inputs, simulate


@pytest.mark.parametrize("n_q, n_k, d, dtype", [(1, 1, 64, "float16"), (113, 300, 128, "bfloat16"),
                                                (200, 65, 64, "bfloat16")])
def test_simulator_counts_equal_model(n_q, n_k, d, dtype):
    plan = make_fast_plan(N_q=n_q, N_k=n_k, d=d, dtype=dtype, heads=2)
    assert plan.tile["Br"] == FAST_BR and plan.stages[0].grid[0] == -(-n_q // FAST_BR)
    host = make_inputs(plan, seed=1, rounded=True)
    run = simulate(plan, host)
    assert run.counts == model.exact(plan)
    want = reference.forward(host["Q"], host["K"], host["V"])[0]
    assert np.max(np.abs(run.outputs["O"] - want)) < 1e-10


def test_effective_m_is_the_kernels_shared_memory():
    plan = make_fast_plan(N_q=4096, d=128, dtype="float16")
    # Q: 64 x 128, K and V: two stages of 64 x 128, 2-byte elements
    assert plan.sram_bytes == plan.smem_bytes == 5 * 64 * 128 * 2


@pytest.mark.parametrize("kwargs, message", [({"d": 64, "dtype": "float32"}, "float16 or bfloat16"),
                                             ({"d": 96, "dtype": "float16"}, "d in"),
                                             ({"d": 64, "dtype": "int8"}, "dtype")])
def test_unsupported_problems_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_fast_plan(N_q=128, **kwargs)


def test_fast_is_a_schedule_of_flash():
    from iokernels.plan import SramTooSmall, Unsupported, all_plans, make_plan

    plan = make_plan("flash", "fast", N_q=300, d=64, dtype="bfloat16", sram=96 * 1024)
    # M given is a bound; the plan records the M its fixed tiles use (its effective M)
    assert plan.label == "flash/fast/fwd" and plan.sram_bytes == plan.smem_bytes == 5 * 64 * 64 * 2
    assert "flash/fast/fwd" in [p.label for p in all_plans(N_q=300, d=128, dtype="float16", sram=192 * 1024)]
    assert "flash/fast/fwd" not in [p.label for p in all_plans(N_q=300, d=128, sram=192 * 1024)]
    with pytest.raises(SramTooSmall, match="smallest M that works is 40960 bytes"):
        make_plan("flash", "fast", N_q=300, d=64, dtype="float16", sram=40959)
    with pytest.raises(Unsupported):
        make_plan("flash", "fast", N_q=300, d=64, sram=96 * 1024)
    with pytest.raises(ValueError, match="fixed"):
        make_plan("flash", "fast", N_q=300, d=64, dtype="float16", sram=96 * 1024, block_r=32)
