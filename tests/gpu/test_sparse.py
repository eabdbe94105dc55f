"""Block-sparse attention on the GPU: counters == model == simulator byte for byte, outputs against the float64
reference with the block mask's element mask (the same-precision idiom of test_causal.py), with and without
the causal mask, ragged N, N_q != N_k, rows with no kept block; bytes that follow the density.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_sparse.py`` (skips without a CUDA device).
"""

import zlib

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import SCHEDULES, make_plan, supports_block_sparse
from iokernels.plan.masks import PATTERNS, BlockMask, pattern
from iokernels.plan.tensors import OUTPUTS
from iokernels.plan.units import round_to
from iokernels.simulate import reference, simulate

from .helpers import problem_scale, rel_err

# The research schedules (their block masks take any block size and float32); flash/fast takes blocks of a multiple of
# 128 in float16/bfloat16 only, and tests/gpu/test_block_sparse_fast.py tests it
KEYS = [(a, s, p) for (a, p), ss in SCHEDULES.items() for s in ss if supports_block_sparse(a, s, p) and s != "fast"]
KB = 1024
# (N_q, N_k, d, dtype, M, batch, heads, block_q, block_k)
CASES = [
    (1, 1, 16, "float32", 48 * KB, 1, 1, 16, 16),
    (113, 113, 32, "float16", 64 * KB, 2, 2, 32, 16),
    (113, 1000, 64, "bfloat16", 192 * KB, 1, 3, 64, 128),
    (1000, 113, 128, "float32", 227 * KB, 1, 1, 128, 64),
    (1000, 1000, 256, "float16", 227 * KB, 1, 1, 64, 64),
    (4097, 1000, 64, "float32", 96 * KB, 1, 1, 128, 128),
    (300, 77, 256, "bfloat16", 100 * KB, 1, 2, 48, 32),
]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _plan(key, case, kind, causal=""):
    n_q, n_k, d, dtype, sram, batch, heads, bq, bk = case
    mask = pattern(kind, 0.4, n_q=n_q, n_k=n_k, block_q=bq, block_k=bk, seed=_seed(case) % 100)
    algorithm, schedule, direction = key
    return make_plan(algorithm, schedule, N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=sram, batch=batch, heads=heads,
                     direction=direction, causal=causal, block_mask=mask)


def _outputs(run, plan):
    return {name: launch.to_float64(run.buffers[name], plan.dtype) for name in OUTPUTS[plan.direction]}


def _visible(plan):
    mask = plan.element_mask()
    causal = reference.causal_mask(plan.N_q, plan.N_k, plan.causal)
    return mask if causal is None else mask & causal


def _naive_probs(q, k, dtype, visible):
    """Same-precision masked softmax: S rounded to dtype, masked, P rounded to dtype (rows with no key: 0)."""
    s = round_to(reference.default_scale(q.shape[-1]) * (q @ np.swapaxes(k, -1, -2)), dtype)
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    l = p.sum(axis=-1, keepdims=True)
    return round_to(np.where(l > 0, p / np.where(l > 0, l, 1.0), 0.0), dtype)


def _naive(plan, host):
    q, k, v = host["Q"], host["K"], host["V"]
    p = _naive_probs(q, k, plan.dtype, _visible(plan))
    if plan.direction == "fwd":
        return {"O": round_to(p @ v, plan.dtype)}
    do, scale = host["dO"], reference.default_scale(plan.d)
    dt = plan.dtype
    dv = round_to(np.swapaxes(p, -1, -2) @ do, dt)
    dp = round_to(do @ np.swapaxes(v, -1, -2), dt)
    ds = round_to(p * (dp - (p * dp).sum(axis=-1, keepdims=True)), dt)
    return {"dQ": round_to(scale * (ds @ k), dt), "dK": round_to(scale * (np.swapaxes(ds, -1, -2) @ q), dt), "dV": dv}


def _want(plan, host):
    mask = plan.element_mask()
    if plan.direction == "fwd":
        return {"O": reference.forward(host["Q"], host["K"], host["V"], causal=plan.causal, mask=mask)[0]}
    grads = reference.backward(host["Q"], host["K"], host["V"], host["dO"], causal=plan.causal, mask=mask)
    return dict(zip(("dQ", "dK", "dV"), grads, strict=True))


def _check_outputs(plan, host, got):
    for name, x in got.items():
        assert np.all(np.isfinite(x)), f"{name} has NaN/inf (unwritten, 0/0 or overflowed)"
    want = _want(plan, host)
    scale = problem_scale(want)
    if plan.dtype == "float32":
        for name in want:
            assert rel_err(got[name], want[name], scale) < 1e-5, name
    else:  # flash-attention's idiom: at most 2x the error of a same-precision naive computation
        naive = _naive(plan, host)
        for name in want:
            bound = 2 * rel_err(naive[name], want[name], scale) + 1e-6
            err = rel_err(got[name], want[name], scale)
            assert err <= bound, (name, err, bound)


@pytest.mark.parametrize("causal", ["", "bottom_right"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_counters_and_outputs(key, case, causal):
    kind = PATTERNS[CASES.index(case) % len(PATTERNS)]  # each pattern on several shapes
    plan = _plan(key, case, kind, causal)
    inputs, host = launch.make_device_inputs(plan, seed=_seed(key, case, kind, causal))
    run = launch.run_plan(plan, inputs, counting=True)

    exact = model.exact(plan)
    assert run.counts == exact
    if plan.N_q * plan.N_k * plan.bh <= 4_000_000:
        assert simulate(plan, host).counts == exact
    _check_outputs(plan, host, _outputs(run, plan))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_rows_and_columns_with_no_kept_block(key, dtype):
    """Query blocks 1 and key block 2 are zero: those O rows exactly 0 (lse −inf), dK, dV rows 0; nothing NaN."""
    blocks = np.ones((5, 4), bool)
    blocks[1] = False
    blocks[:, 2] = False
    mask = BlockMask.from_array(blocks, n_q=300, n_k=250, block_q=64, block_k=64)
    algorithm, schedule, direction = key
    plan = make_plan(algorithm, schedule, N_q=300, N_k=250, d=64, dtype=dtype, sram=64 * KB, heads=2,
                     direction=direction, block_mask=mask)
    inputs, host = launch.make_device_inputs(plan, seed=_seed("empty", key, dtype))
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    got = _outputs(run, plan)
    _check_outputs(plan, host, got)
    if direction == "fwd":
        assert np.all(got["O"][:, 64:128] == 0)
        if "lse" in run.buffers:
            lse = launch.to_float64(run.buffers["lse"], "float32")
            assert np.all(np.isneginf(lse[:, 64:128])) and np.all(np.isfinite(lse[:, :64]))
    else:
        assert np.all(got["dQ"][:, 64:128] == 0)
        assert np.all(got["dK"][:, 128:192] == 0) and np.all(got["dV"][:, 128:192] == 0)


@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_plain_build_agrees(key):
    plan = _plan(key, (200, 150, 64, "float32", 64 * KB, 1, 1, 32, 32), "random")
    inputs, _ = launch.make_device_inputs(plan, seed=3)
    counted = _outputs(launch.run_plan(plan, inputs, counting=True), plan)
    plain = launch.run_plan(plan, inputs, counting=False)
    assert plain.counts is None
    for name, x in _outputs(plain, plan).items():
        if name == "dQ":  # float atomics from several K/V blocks: any order
            np.testing.assert_allclose(x, counted[name], rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(x, counted[name])


@pytest.mark.parametrize("schedule, direction", [("q_outer", "fwd"), ("kv_outer", "fwd"), ("kv_outer", "bwd")])
def test_bytes_follow_the_density_on_the_gpu(schedule, direction):
    measured = {}
    for density in (0.25, 1.0):
        mask = pattern("local", density, n_q=2048, n_k=2048, block_q=64)
        plan = make_plan("flash", schedule, N_q=2048, d=64, dtype="float16", sram=96 * KB, direction=direction,
                         block_mask=mask)
        inputs, _ = launch.make_device_inputs(plan, seed=5)
        run = launch.run_plan(plan, inputs, counting=True)
        assert run.counts == model.exact(plan)
        measured[density] = sum(r + w for tensors in run.counts.values() for r, w in tensors.values())
    assert measured[0.25] < 0.5 * measured[1.0]
