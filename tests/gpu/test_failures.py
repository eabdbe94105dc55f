"""Failures on the GPU: out of memory and launch failures raise a Python exception, leave the process usable and
leak no device memory (cupy's pool back to its level before the call); a bad plan or bad input never reaches the
GPU (no compile, no launch, no allocation)."""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest

import iokernels
from iokernels.kernels import launch
from iokernels.plan import TilesDoNotFit, make_plan
from iokernels.simulate import reference

from .helpers import rel_err

cp = pytest.importorskip("cupy")

KB = 1024
MAX_GRID_Z = 65535  # CUDA's limit on gridDim.z, where every kernel puts batch * heads


@pytest.fixture
def pool():
    p = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    p.free_all_blocks()
    yield p
    gc.collect()
    p.free_all_blocks()


def _free_bytes(pool) -> int:
    return cp.cuda.runtime.memGetInfo()[0] + pool.free_bytes()


def _still_usable(pool) -> None:
    """A normal call works and gives the right answer, and leaves nothing behind."""
    before = pool.used_bytes()
    q = cp.random.standard_normal((2, 100, 64), dtype=cp.float32)
    out = iokernels.attention(q, q, q, algorithm="flash", schedule="q_outer")
    host = cp.asnumpy(q).astype(np.float64)
    assert rel_err(cp.asnumpy(out).astype(np.float64), reference.forward(host, host, host)[0]) < 1e-5
    del q, out
    gc.collect()
    assert pool.used_bytes() == before


def _fails(call, expected=Exception) -> BaseException:
    """Run ``call``, which must raise ``expected``; return the exception with its traceback dropped (the
    traceback's frames would keep the call's device buffers alive)."""
    try:
        call()
    except expected as exc:
        exc.__traceback__ = exc.__context__ = exc.__cause__ = None
        return exc
    pytest.fail(f"{call} raised nothing")


# ---------------------------------------------------------------------------------------------
# out of memory

def test_a_call_too_big_for_the_device_raises_and_leaks_nothing(pool):
    total = cp.cuda.runtime.memGetInfo()[1]
    n = math.isqrt(total) + 1  # standard attention keeps S and P, N x N float16 each: 4 x the device at bh = 1
    q = cp.random.standard_normal((1, n, 64), dtype=cp.float32).astype(cp.float16)
    before = pool.used_bytes()
    exc = _fails(lambda: iokernels.attention(q, q, q, algorithm="standard"), MemoryError)
    gc.collect()
    assert pool.used_bytes() == before, f"{type(exc).__name__} left {pool.used_bytes() - before} bytes in use"
    _still_usable(pool)


def test_out_of_memory_midway_through_allocation_frees_what_was_taken(pool):
    # below the library's check: run_plan itself, on a plan whose S fits the free memory and whose P then does not
    free = _free_bytes(pool)
    n = math.isqrt(int(0.6 * free) // 2)  # S and P: 0.6 x the free memory each, in float16
    plan = make_plan("standard", N_q=n, N_k=n, d=16, dtype="float16", sram=96 * KB)
    inputs = {name: cp.zeros(launch.tensor_shape(plan, name), dtype=cp.float16) for name in ("Q", "K", "V")}
    before = pool.used_bytes()
    exc = _fails(lambda: launch.run_plan(plan, inputs), cp.cuda.memory.OutOfMemoryError)
    gc.collect()
    assert pool.used_bytes() == before, f"{type(exc).__name__} left {pool.used_bytes() - before} bytes in use"
    inputs.clear()
    _still_usable(pool)


# ---------------------------------------------------------------------------------------------
# launch failures

def test_batch_heads_over_the_grid_limit_fail_cleanly_or_work(pool):
    # batch * heads over CUDA's grid limit (gridDim.z): refused, or failed by the driver at launch, leaving the
    # process usable and no memory behind; or, should the library split the grid, right
    q = cp.random.standard_normal((MAX_GRID_Z + 1, 8, 16), dtype=cp.float32)
    before = pool.used_bytes()
    try:
        out = iokernels.attention(q, q, q, algorithm="flash", schedule="q_outer")
    except Exception as exc:
        exc.__traceback__ = exc.__context__ = exc.__cause__ = None
        del exc
    else:
        for head in (0, MAX_GRID_Z):
            x = cp.asnumpy(q[head]).astype(np.float64)
            assert rel_err(cp.asnumpy(out[head]).astype(np.float64), reference.forward(x, x, x)[0]) < 1e-5
        del out
    gc.collect()
    assert pool.used_bytes() == before
    _still_usable(pool)


def test_more_shared_memory_than_the_device_has_raises_and_leaves_the_process_usable(pool):
    limit = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["sharedMemPerBlockOptin"]
    plan = make_plan("flash", "q_outer", N_q=300, d=64, sram=2 * limit)  # no smem_limit given: the plan allows it
    assert plan.smem_bytes > limit
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    before = pool.used_bytes()
    _fails(lambda: launch.run_plan(plan, inputs))
    gc.collect()
    assert pool.used_bytes() == before
    inputs.clear()
    _still_usable(pool)


# ---------------------------------------------------------------------------------------------
# a bad plan or bad input never reaches the GPU

@pytest.fixture
def no_gpu_work(monkeypatch, pool):
    """Arrays for the calls; then compiling, loading or launching a kernel fails the test, and so does any
    device allocation made after the arrays."""
    q = cp.random.standard_normal((2, 3, 100, 64), dtype=cp.float32)
    arrays = {"q": q, "h": q.astype(cp.float16), "q64": q.astype(cp.float64), "o": cp.zeros_like(q),
              "lse": cp.zeros(q.shape[:-1], dtype=cp.float32), "narrow": cp.zeros((6, 100, 32), dtype=cp.float32),
              "wide": cp.zeros((MAX_GRID_Z + 1, 8, 16), dtype=cp.float32)}

    def reached(*args, **kwargs):
        raise AssertionError("a kernel was compiled or launched")

    for name in ("launch_stage", "kernel_function", "compile_plan", "capture_plans"):
        if hasattr(launch, name):
            monkeypatch.setattr(launch, name, reached)
    before = pool.used_bytes()
    yield arrays
    gc.collect()
    assert pool.used_bytes() == before, "device memory was allocated"


def _bad_calls(a):
    q, h, q64, o, lse = a["q"], a["h"], a["q64"], a["o"], a["lse"]
    attention, backward = iokernels.attention, iokernels.attention_backward
    yield "sram over the device's limit", ValueError, lambda: attention(q, q, q, sram="1MB")
    yield "sram under the smallest M", ValueError, lambda: attention(q, q, q, schedule="q_outer", sram=64)
    yield "k with another head dim", ValueError, lambda: attention(q, q[..., :32], q)
    yield "v with another length", ValueError, lambda: attention(q, q, q[..., :50, :])
    yield "other leading dims", ValueError, lambda: attention(q, q[:1], q[:1])
    yield "d not a multiple of 8", ValueError, lambda: attention(q[..., :20], q[..., :20], q[..., :20])
    yield "float64", TypeError, lambda: attention(q64, q64, q64)
    yield "mixed dtypes", TypeError, lambda: attention(q, h, q)
    yield "numpy and cupy mixed", TypeError, lambda: attention(q, np.zeros(q.shape, np.float32), q)
    yield "lse of the wrong shape", ValueError, lambda: backward(q, q, q, o, q, lse[..., :5])
    yield "deterministic on float32", ValueError, lambda: backward(q, q, q, o, q, lse, deterministic=True)
    yield "unknown algorithm", ValueError, lambda: attention(q, q, q, algorithm="sparse")
    yield "unknown schedule", ValueError, lambda: attention(q, q, q, schedule="diagonal")
    yield "unknown causal alignment", ValueError, lambda: attention(q, q, q, causal="diagonal")
    plan = make_plan("flash", "q_outer", N_q=100, d=64, sram=96 * KB, batch=6)
    wrong = {"Q": a["narrow"], "K": q.reshape(6, 100, 64), "V": q.reshape(6, 100, 64)}
    yield "run_plan with a wrongly shaped input", ValueError, lambda: launch.run_plan(plan, wrong)
    yield "forced tiles that do not fit", TilesDoNotFit, lambda: make_plan("flash", "q_outer", N_q=100, d=64,
                                                                           sram=48 * KB, block_r=4096)


def test_bad_plans_and_inputs_raise_before_anything_reaches_the_gpu(no_gpu_work):
    for what, expected, call in _bad_calls(no_gpu_work):
        exc = _fails(call, Exception)
        assert isinstance(exc, expected), f"{what}: {type(exc).__name__}: {exc}"
        assert str(exc), what


def test_batch_heads_over_the_grid_limit_is_refused_before_launch(no_gpu_work):
    q = no_gpu_work["wide"]
    with pytest.raises(ValueError, match="65535"):
        iokernels.attention(q, q, q, algorithm="flash", schedule="q_outer")
