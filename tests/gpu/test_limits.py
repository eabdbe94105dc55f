"""Sizes past 2^31 elements (``-m slow``): 64-bit indexing and 64-bit counters.

- standard attention with B·H·N_q·N_k > 2^31 (S, P, dP and dS of 4+ GB in float16), and with N_q·N_k alone
  past 2^31 in one head: counters equal the model (S moves more than 4 GB: the counters must be 64-bit), and
  sampled rows of O, lse, dS, dQ and columns of dV, dK equal a float64 reference;
- flash with B·H·N·d > 2^31 (Q, K, V, O of 4+ GB each), research and tensor-core kernels, forward and
  backward: counters equal the model, and whole heads at the start, middle and end equal the reference.

Each test needs up to ~45 GB of device memory (skipped where the device has less free) and runs in well
under a minute on an H200.
"""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import FLOAT32_TENSORS, Plan, make_plan
from iokernels.plan.fast import make_fast_plan
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.units import round_to
from iokernels.simulate import reference

from .test_edge import check_close

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.slow

KB = 1024
TWO_31 = 2**31
TWO_32 = 2**32


@pytest.fixture(autouse=True)
def _release():
    yield
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()


def _plan_bytes(plan: Plan) -> int:
    """Device bytes of every tensor the plan touches, inputs included."""
    return sum(int(np.prod(launch.tensor_shape(plan, n))) * (4 if n in FLOAT32_TENSORS else plan.itemsize)
               for n in launch.plan_tensors(plan))


def _need(plan: Plan, extra: int = 0) -> None:
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    free = cp.cuda.runtime.memGetInfo()[0]
    need = _plan_bytes(plan) + extra
    if need > 0.9 * free:
        pytest.skip(f"needs {need / 2**30:.0f} GB of device memory, {free / 2**30:.0f} GB free")


def _random(shape: tuple[int, ...], seed: int) -> object:
    """float16 normal values on the device, made a slice at a time (no float32 copy of the whole)."""
    out = cp.empty(shape, dtype=cp.float16)
    rng = cp.random.default_rng(seed)
    step = max(1, 2**28 // int(np.prod(shape[1:])))
    for i in range(0, shape[0], step):
        out[i:i + step] = rng.standard_normal((min(step, shape[0] - i), *shape[1:]), dtype=cp.float32)
    return out


def _host(x, *index) -> np.ndarray:
    return cp.asnumpy(x[index]).astype(np.float64)


def _counts_past_4gb(counts: dict) -> bool:
    return any(r > TWO_32 or w > TWO_32 for stage in counts.values() for r, w in stage.values())


def _bound(naive: np.ndarray, exact: np.ndarray, got: np.ndarray, slack: float = 1e-6) -> None:
    """flash-attention's idiom on sampled rows: the error at most 2x a same-precision computation's."""
    scale = max(float(np.max(np.abs(exact))), 1e-30)
    err, yard = np.max(np.abs(got - exact)) / scale, np.max(np.abs(naive - exact)) / scale
    assert err <= 2 * yard + slack, (err, yard)


def _f16(x: np.ndarray) -> np.ndarray:
    return round_to(x, "float16")


# ---------------------------------------------------------------------------------------------
# standard attention: S of more than 2^31 elements

@pytest.mark.parametrize("heads, n_q, n_k", [(2, 41_000, 27_000), (1, 46_341, 46_341)],
                         ids=["bh2-41000x27000", "bh1-46341x46341"])
def test_standard_attention_past_2_31_elements(heads, n_q, n_k):
    assert heads * n_q * n_k > TWO_31
    d, scale = 64, reference.default_scale(64)
    fwd = make_plan("standard", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=96 * KB, heads=heads)
    bwd = make_plan("standard", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=96 * KB, heads=heads, direction="bwd")
    _need(bwd, extra=_plan_bytes(fwd))
    q, k, v = _random((heads, n_q, d), 1), _random((heads, n_k, d), 2), _random((heads, n_k, d), 3)
    run = launch.run_plan(fwd, {"Q": q, "K": k, "V": v}, counting=True)
    assert run.counts == model.exact(fwd)
    assert _counts_past_4gb(run.counts), "S should move more than 4 GB"
    b = run.buffers
    h = heads - 1
    rows = [0, 1, n_q // 2, n_q - 2, n_q - 1]  # the last rows of the last head sit past 2^31 elements
    kh, vh = _host(k, h), _host(v, h)
    for i in rows:
        s = scale * (kh @ _host(q, h, i))
        p = np.exp(s - s.max())
        lse = s.max() + np.log(p.sum())
        p16 = _f16(np.exp(_f16(s) - _f16(s).max()) / np.exp(_f16(s) - _f16(s).max()).sum())
        _bound(_f16(_f16(p16) @ vh), (p / p.sum()) @ vh, _host(b["O"], h, i))
        _bound(_f16(p16), p / p.sum(), _host(b["P"], h, i))
        assert abs(float(_host(b["m"], h, i)) + np.log(float(_host(b["l"], h, i))) - lse) < 1e-2

    # the backward on the forward's P: dS rows and dQ rows, dV columns (from P), dK columns (from the dS it made)
    do = _random((heads, n_q, d), 4)
    p_in = b["P"]
    del run, b
    gc.collect()
    grads = launch.run_plan(bwd, {"Q": q, "K": k, "V": v, "dO": do, "P": p_in}, counting=True)
    assert grads.counts == model.exact(bwd)
    g = grads.buffers
    for i in rows:
        p_row, dp = _host(p_in, h, i), vh @ _host(do, h, i)
        ds = p_row * (dp - p_row @ dp)
        ds16 = _f16(p_row * (_f16(dp) - p_row @ _f16(dp)))
        _bound(ds16, ds, _host(g["dS"], h, i))
        _bound(_f16(scale * (ds16 @ kh)), scale * (ds @ kh), _host(g["dQ"], h, i))
    qh, doh = _host(q, h), _host(do, h)
    for j in [0, n_k // 2, n_k - 1]:
        dv = _host(p_in, h, slice(None), j) @ doh
        _bound(_f16(dv), dv, _host(g["dV"], h, j), slack=1e-4)
        dk = scale * (_host(g["dS"], h, slice(None), j) @ qh)
        _bound(_f16(dk), dk, _host(g["dK"], h, j), slack=1e-4)
    for name in ("dQ", "dK", "dV"):
        assert bool(cp.all(cp.isfinite(g[name]))), name


# ---------------------------------------------------------------------------------------------
# flash: Q, K, V, O of more than 2^31 elements

BATCH, HEADS, N, D = 256, 128, 520, 128  # B·H = 32768 (under the 65535 grid limit), B·H·N·d = 2.18e9
SAMPLED_HEADS = (0, BATCH * HEADS // 2 + 1, BATCH * HEADS - 1)


def _flash_plans():
    common = dict(N_q=N, N_k=N, d=D, dtype="float16", batch=BATCH, heads=HEADS)
    yield "q_outer", make_plan("flash", "q_outer", sram=96 * KB, **common), \
        make_plan("flash", "kv_outer", sram=96 * KB, direction="bwd", **common)
    yield "fast", make_fast_plan(**common), make_fast_backward_plan(**common)


@pytest.mark.parametrize("name, fwd, bwd", list(_flash_plans()), ids=lambda x: x if isinstance(x, str) else "")
def test_flash_past_2_31_elements(name, fwd, bwd):
    assert fwd.bh * N * D > TWO_31
    if any(s.kernel.startswith("flash_wgmma") for s in (*fwd.stages, *bwd.stages)) and \
            cp.cuda.Device().compute_capability != "90":
        pytest.skip("the wgmma kernels run on sm_90 only")
    _need(bwd, extra=_plan_bytes(fwd))
    q, k, v, do = (_random((fwd.bh, N, D), seed) for seed in (5, 6, 7, 8))
    run = launch.run_plan(fwd, {"Q": q, "K": k, "V": v}, counting=True)
    assert run.counts == model.exact(fwd)
    assert _counts_past_4gb(run.counts), "Q should move more than 4 GB"
    o, lse = run.buffers["O"], run.buffers["lse"] if "lse" in run.buffers else None
    if lse is None:
        lse = run.buffers["m"] + cp.log(run.buffers["l"])
    del run
    gc.collect()
    grads = launch.run_plan(bwd, {"Q": q, "K": k, "V": v, "O": o, "dO": do, "lse": lse}, counting=True)
    assert grads.counts == model.exact(bwd)

    one = dataclasses.replace(fwd, batch=1, heads=1, kv_heads=1)  # a head at a time for the reference
    one_bwd = dataclasses.replace(bwd, batch=1, heads=1, kv_heads=1)
    for h in SAMPLED_HEADS:
        host = {n: _host(x, slice(h, h + 1)) for n, x in (("Q", q), ("K", k), ("V", v))}
        check_close(one, host, {"O": _host(o, slice(h, h + 1))})
        host.update(O=_host(o, slice(h, h + 1)), lse=_host(lse, slice(h, h + 1)), dO=_host(do, slice(h, h + 1)))
        check_close(one_bwd, host, {n: _host(grads.buffers[n], slice(h, h + 1)) for n in ("dQ", "dK", "dV")})
