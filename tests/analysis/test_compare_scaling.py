"""The simulator counts one batch-head and scales by batch*heads: exactly the full simulation's counts and
model.exact, for plans with every feature that could make batch-heads differ."""

import pytest

from iokernels import model
from iokernels.analysis.compare import (
    SIM_MEMORY_LIMIT,
    check_simulator_size,
    one_batch_head,
    run_simulated,
    simulator_memory_bytes,
)
from iokernels.plan import all_plans, make_plan
from iokernels.plan.dropout import Dropout
from iokernels.plan.masks import ExplicitMask
from iokernels.plan.masks import pattern as block_pattern


def nonzero(counts):
    return {s: {t: rw for t, rw in ts.items() if rw != (0, 0)} for s, ts in counts.items()}


def problems():
    base = {"N_q": 100, "N_k": 72, "d": 32, "sram": 48 * 1024, "batch": 2, "heads": 3}
    yield "float32", all_plans(dtype="float32", backward=True, **base)
    yield "causal", all_plans(dtype="float32", causal=True, **base)
    yield "block-sparse", all_plans(dtype="float32", block_mask=block_pattern(n_q=100, n_k=72, kind="local",
                                                                              density=0.5, seed=0, block_q=32),
                                    **{**base, "sram": 64 * 1024})
    yield "mask per head", all_plans(dtype="float32", mask=ExplicitMask("bool", shared=False), backward=True, **base)
    yield "dropout", all_plans(dtype="float16", dropout=Dropout(0.2, 3), N_q=64, N_k=64, d=64, sram=227 * 1024,
                               batch=2, heads=2)
    yield "float16 backward", all_plans(dtype="float16", backward=True, N_q=64, N_k=80, d=64, sram=227 * 1024,
                                        batch=3, heads=2)
    # the causal tma plans' list of items belongs to the whole grid (compare counts the whole plan's walk of it)
    yield "float16 causal", all_plans(dtype="float16", causal=True, backward=True, N_q=300, N_k=300, d=64,
                                      sram=227 * 1024, batch=3, heads=2)


@pytest.mark.parametrize("name,plans", list(problems()), ids=[n for n, _ in problems()])
def test_scaled_one_batch_head_equals_full_simulation_and_model(name, plans):
    assert plans
    for plan in plans:
        one = one_batch_head(plan)
        assert one is not None and (one.batch, one.heads, one.kv_heads) == (1, 1, 1)
        assert all(s.grid[2] == 1 for s in one.stages)
        assert [s.grid[:2] for s in one.stages] == [s.grid[:2] for s in plan.stages]
        scaled = nonzero(run_simulated(plan).counts)
        full = nonzero(run_simulated(plan, scale=False).counts)
        assert scaled == full == model.exact(plan), plan.label


def test_scaling_multiplies_by_batch_heads():
    plan = make_plan("flash", "q_outer", N_q=64, N_k=64, d=32, sram=48 * 1024, batch=3, heads=5)
    one = run_simulated(one_batch_head(plan), scale=False).counts
    scaled = run_simulated(plan).counts
    q_one = one["main"]["Q"][0]
    assert q_one == 64 * 32 * 4  # Q read once: N_q x d floats of one batch-head
    assert scaled["main"]["Q"][0] == 15 * q_one


def test_grouped_query_attention_is_simulated_in_full():
    plan = make_plan("flash", "fast", N_q=64, N_k=64, d=64, dtype="float16", sram=227 * 1024, batch=2, heads=4,
                     kv_heads=2, direction="bwd")
    assert one_batch_head(plan) is None
    assert nonzero(run_simulated(plan).counts) == model.exact(plan)


def test_single_batch_head_is_not_copied():
    plan = make_plan("standard", N_q=32, N_k=32, d=16, sram=16 * 1024)
    assert one_batch_head(plan) is None


def test_size_check_uses_the_simulated_batch_head():
    plan = make_plan("flash", "q_outer", N_q=2048, N_k=2048, d=64, sram=192 * 1024, batch=64, heads=16)
    assert simulator_memory_bytes(plan) > SIM_MEMORY_LIMIT  # in full it would not fit
    check_simulator_size([plan])  # one batch-head does
    big = make_plan("flash", "fast", N_q=2048, N_k=2048, d=64, dtype="float16", sram=227 * 1024, batch=64,
                    heads=16, kv_heads=8)
    with pytest.raises(ValueError, match="GiB of float64"):
        check_simulator_size([big])


def test_gpu_inputs_repeat_one_batch_head(monkeypatch):
    """With numpy standing in for cupy: every batch-head gets batch-head 0's inputs, a shared mask stays one."""
    import numpy as np

    from iokernels.analysis import compare
    from iokernels.kernels import launch, runtime
    from iokernels.simulate import make_inputs

    made = []

    def fake_device_inputs(plan, seed=0):
        made.append(plan)
        host = make_inputs(plan, seed, rounded=True)
        return {k: v.copy() for k, v in host.items()}, host

    monkeypatch.setattr(launch, "make_device_inputs", fake_device_inputs)
    monkeypatch.setattr(runtime, "require_cupy", lambda: np)
    for shared in (True, False):
        plan = make_plan("standard", N_q=40, N_k=24, d=16, sram=16 * 1024, batch=2, heads=3, direction="bwd",
                         mask=ExplicitMask("bool", shared=shared))
        inputs, host, checked = compare.gpu_inputs(plan, seed=1)
        assert made[-1] is checked and checked.bh == 1 and host["Q"].shape == (1, 40, 16)
        for name in ("Q", "K", "V", "O", "dO", "lse", "P"):
            assert inputs[name].shape[0] == 6 and all((inputs[name][i] == host[name][0]).all() for i in range(6))
        assert inputs["mask"].shape[0] == (1 if shared else 6)
    gqa = make_plan("flash", "fast", N_q=64, N_k=64, d=64, dtype="float16", sram=227 * 1024, batch=2, heads=4,
                    kv_heads=2)
    _, _, checked = compare.gpu_inputs(gqa)
    assert checked is gqa
