"""Run-to-run determinism on the GPU: the counters of every kernel are identical across runs (and equal the
model); forward outputs are bitwise identical; backward passes without float atomics (the deterministic
tensor-core backward, standard attention) are bitwise identical, through the plans and through
``attention_backward(..., deterministic=True)``. Between the two runs another plan runs, so that
caches, allocator addresses and the GPU's scheduling differ."""

from __future__ import annotations

import pytest

import iokernels
from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import Plan

from .test_edge import KERNELS, Kernel

cp = pytest.importorskip("cupy")

SHAPES = [(1000, 700), (1, 77), (113, 1)]  # many blocks (and atomics in flight), one query, one key
# backward kernels that add nothing with float atomics: run to run bit for bit
ATOMIC_FREE_BACKWARD = ("standard/default/bwd", "flash/fast/bwd/mma/deterministic")
CASES = [pytest.param(k, t, id=f"{k.name}-{t}") for k in KERNELS for t in k.dtypes]


def _runs(plan: Plan, counting: bool) -> tuple:
    """Two runs of ``plan`` on the same inputs with another plan in between; their raw device buffers."""
    inputs, _ = launch.make_device_inputs(plan, seed=plan.N_q + plan.N_k)
    first = launch.run_plan(plan, inputs, counting=counting)
    other, _ = launch.make_device_inputs(plan, seed=1)
    launch.run_plan(plan, other, counting=counting)  # different values through the same kernels
    second = launch.run_plan(plan, inputs, counting=counting)
    return first, second


def _outputs(run, plan: Plan) -> dict:
    inputs = launch.INPUTS[plan.direction]
    return {n: run.buffers[n] for n in ("O", "lse", "m", "l", "dQ", "dK", "dV") if n in run.buffers and n not in inputs}


def _bitwise_equal(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(cp.all(a.view(cp.uint8) == b.view(cp.uint8)))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("kernel, dtype", CASES)
def test_counters_identical_run_to_run(kernel: Kernel, dtype, shape):
    plan = kernel.plan(*shape, dtype=dtype)
    first, second = _runs(plan, counting=True)
    assert first.counts == second.counts == model.exact(plan)


@pytest.mark.parametrize("causal", ["", "bottom_right"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("kernel, dtype", [p for p in CASES if p.values[0].direction == "fwd"])
def test_forward_outputs_bitwise_identical(kernel: Kernel, dtype, shape, causal):
    plan = kernel.plan(*shape, dtype=dtype, causal=causal)
    first, second = _runs(plan, counting=False)
    a, b = _outputs(first, plan), _outputs(second, plan)
    assert "O" in a
    for name in a:
        assert _bitwise_equal(a[name], b[name]), name


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("kernel, dtype", [p for p in CASES if p.values[0].name in ATOMIC_FREE_BACKWARD])
def test_atomic_free_backward_bitwise_identical(kernel: Kernel, dtype, shape):
    plan = kernel.plan(*shape, dtype=dtype, d=128 if dtype != "float32" else 64)
    first, second = _runs(plan, counting=False)
    a, b = _outputs(first, plan), _outputs(second, plan)
    assert set(a) == {"dQ", "dK", "dV"}
    for name in a:
        assert _bitwise_equal(a[name], b[name]), name


@pytest.mark.parametrize("d", [64, 128])
def test_attention_backward_deterministic_bitwise_identical(d):
    rs = cp.random.default_rng(d)
    q, do = (rs.standard_normal((2, 3, 1000, d), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    k, v = (rs.standard_normal((2, 3, 777, d), dtype=cp.float32).astype(cp.float16) for _ in range(2))
    o, lse = iokernels.attention(q, k, v, return_lse=True)
    o2, lse2 = iokernels.attention(q, k, v, return_lse=True)
    assert _bitwise_equal(o, o2) and _bitwise_equal(lse, lse2)
    first = iokernels.attention_backward(q, k, v, o, do, lse, deterministic=True)
    iokernels.attention_backward(k[:, :, :500], q[:, :, :500], v[:, :, :500], o[:, :, :500], do[:, :, :500],
                                 lse[:, :, :500], deterministic=True)  # something else in between
    second = iokernels.attention_backward(q, k, v, o, do, lse, deterministic=True)
    for name, a, b in zip(("dq", "dk", "dv"), first, second, strict=True):
        assert _bitwise_equal(a, b), name
        assert bool(cp.all(cp.isfinite(a))), name
    # the default backward (float atomics) agrees up to the order of its sums
    fast = iokernels.attention_backward(q, k, v, o, do, lse)
    for a, b in zip(first, fast, strict=True):
        diff = cp.abs(a.astype(cp.float32) - b.astype(cp.float32))
        assert float(cp.max(diff)) <= 2e-2 * max(float(cp.max(cp.abs(a.astype(cp.float32)))), 1.0)
