"""Causal attention on the GPU: counters == model == simulator byte for byte, outputs against the float64
reference (the same-precision idiom of test_kernels.py), both alignments, ragged N and N_q != N_k, rows
that see no key, and the library's ``causal=``.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_causal.py`` (skips without a CUDA device).
"""

import zlib

import numpy as np
import pytest

import iokernels
from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import CAUSAL_ALIGNMENTS, SCHEDULES, SramTooSmall, Unsupported, make_plan, supports_causal
from iokernels.plan.tensors import OUTPUTS
from iokernels.plan.units import round_to
from iokernels.simulate import reference, simulate

from .helpers import per_item, problem_scale, rel_err

KEYS = [(a, s, p) for (a, p), ss in SCHEDULES.items() for s in ss if supports_causal(a, s, p)]
KB = 1024
# (N_q, N_k, d, dtype, M, batch, heads): ragged N, N_q < N_k and N_q > N_k (bottom-right: rows with no key)
CASES = [
    (1, 1, 16, "float32", 48 * KB, 1, 1),
    (113, 113, 32, "float16", 64 * KB, 2, 2),
    (113, 1000, 64, "bfloat16", 192 * KB, 1, 3),
    (1000, 113, 128, "float32", 227 * KB, 1, 1),
    (1000, 1000, 256, "float16", 227 * KB, 1, 1),
    (4097, 1000, 64, "float32", 96 * KB, 1, 1),
    (257, 4097, 16, "bfloat16", 32 * KB, 2, 1),
    (300, 77, 256, "bfloat16", 100 * KB, 1, 2),
    (1, 517, 128, "float16", 48 * KB, 1, 1),
    (517, 1, 64, "float16", 48 * KB, 1, 1),
]


def _plan(key, case, causal):
    n_q, n_k, d, dtype, sram, batch, heads = case
    algorithm, schedule, direction = key
    if schedule == "fast" and dtype not in ("float16", "bfloat16"):
        pytest.skip("flash/fast (tensor cores) takes float16/bfloat16")
    try:
        return make_plan(algorithm, schedule, N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=sram, batch=batch,
                         heads=heads, direction=direction, causal=causal)
    except (SramTooSmall, Unsupported) as exc:  # (the head dims a kernel does not take, on this GPU)
        if schedule != "fast":
            raise
        pytest.skip(f"flash/fast: {exc}")


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _outputs(run, plan):
    return {name: launch.to_float64(run.buffers[name], plan.dtype) for name in OUTPUTS[plan.direction]}


def _naive_probs(q, k, dtype, causal, scale=None):
    """Same-precision causal softmax: S rounded to dtype, masked, P rounded to dtype (rows with no key: 0)."""
    scale = reference.default_scale(q.shape[-1]) if scale is None else scale
    s = round_to(scale * (q @ np.swapaxes(k, -1, -2)), dtype)
    s = np.where(reference.causal_mask(q.shape[-2], k.shape[-2], causal), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    l = p.sum(axis=-1, keepdims=True)
    return round_to(np.where(l > 0, p / np.where(l > 0, l, 1.0), 0.0), dtype)


def naive_forward(q, k, v, dtype, causal):
    return round_to(_naive_probs(q, k, dtype, causal) @ v, dtype)


def naive_backward(q, k, v, do, dtype, causal):
    scale = reference.default_scale(q.shape[-1])
    p = _naive_probs(q, k, dtype, causal, scale)
    dv = round_to(np.swapaxes(p, -1, -2) @ do, dtype)
    dp = round_to(do @ np.swapaxes(v, -1, -2), dtype)
    ds = round_to(p * (dp - (p * dp).sum(axis=-1, keepdims=True)), dtype)
    return round_to(scale * (ds @ k), dtype), round_to(scale * (np.swapaxes(ds, -1, -2) @ q), dtype), dv


def _want(plan, host):
    if plan.direction == "fwd":
        return {"O": reference.forward(host["Q"], host["K"], host["V"], causal=plan.causal)[0]}
    dq, dk, dv = reference.backward(host["Q"], host["K"], host["V"], host["dO"], causal=plan.causal)
    return {"dQ": dq, "dK": dk, "dV": dv}


def _check_outputs(plan, host, got):
    for name, x in got.items():
        assert np.all(np.isfinite(x)), f"{name} has NaN/inf (unwritten, 0/0 or overflowed)"
    want = _want(plan, host)
    scale = problem_scale(want)
    if plan.dtype == "float32":
        for name in want:
            assert rel_err(got[name], want[name], scale) < 1e-5, name
    else:  # flash-attention's idiom: at most 2x the error of a same-precision naive computation
        if plan.direction == "fwd":
            naive = {"O": naive_forward(host["Q"], host["K"], host["V"], plan.dtype, plan.causal)}
        else:
            naive = dict(zip(("dQ", "dK", "dV"), naive_backward(host["Q"], host["K"], host["V"], host["dO"],
                                                                 plan.dtype, plan.causal), strict=True))
        for name in want:
            bound = 2 * rel_err(naive[name], want[name], scale) + 1e-6
            err = rel_err(got[name], want[name], scale)
            assert err <= bound, (name, err, bound)


@pytest.mark.parametrize("causal", CAUSAL_ALIGNMENTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_counters_and_outputs(key, case, causal):
    plan = _plan(key, case, causal)
    inputs, host = launch.make_device_inputs(plan, seed=_seed(key, case, causal))
    run = launch.run_plan(plan, inputs, counting=True)

    exact = model.exact(plan)
    assert run.counts == exact
    if plan.N_q * plan.N_k * plan.bh <= 4_000_000:
        assert simulate(plan, host).counts == exact
    _check_outputs(plan, host, _outputs(run, plan))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_rows_with_no_visible_key(key, dtype):
    """Bottom-right with N_q > N_k: the first N_q - N_k queries see nothing. O rows exactly 0, lse -inf,
    dQ rows exactly 0, nothing NaN; the other rows against the reference."""
    n_q, n_k = 300, 100
    case = (n_q, n_k, 64, dtype, 64 * KB, 1, 2)
    plan = _plan(key, case, "bottom_right")
    inputs, host = launch.make_device_inputs(plan, seed=_seed("empty", key, dtype))
    run = launch.run_plan(plan, inputs, counting=False)
    got = _outputs(run, plan)
    _check_outputs(plan, host, got)
    empty = n_q - n_k
    if plan.direction == "fwd":
        assert np.all(got["O"][:, :empty] == 0)
        b = {name: launch.to_float64(run.buffers[name], "float32") for name in ("lse", "m", "l")
             if name in launch.plan_tensors(plan)}
        if "lse" in b:
            assert np.all(np.isneginf(b["lse"][:, :empty])) and np.all(np.isfinite(b["lse"][:, empty:]))
        if "m" in b:
            assert np.all(np.isneginf(b["m"][:, :empty])) and np.all(b["l"][:, :empty] == 0)
            assert np.all(np.isfinite(b["m"][:, empty:])) and np.all(b["l"][:, empty:] > 0)
    else:
        assert np.all(got["dQ"][:, :empty] == 0)


@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_top_left_never_empties_a_row(key):
    plan = _plan(key, (300, 100, 32, "float32", 48 * KB, 1, 1), "top_left")
    inputs, host = launch.make_device_inputs(plan, seed=_seed("top", key))
    got = _outputs(launch.run_plan(plan, inputs), plan)
    _check_outputs(plan, host, got)
    if plan.direction == "fwd":
        assert np.all(np.any(got["O"] != 0, axis=-1))


@pytest.mark.parametrize("causal", CAUSAL_ALIGNMENTS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_large_logits_stay_finite(key, dtype, causal):
    plan = _plan(key, (300, 200, 64, dtype, 64 * KB, 1, 2), causal)
    inputs, host = launch.make_device_inputs(plan, seed=_seed("big", key, dtype, causal), magnitude=10.0)
    got = _outputs(launch.run_plan(plan, inputs), plan)
    for name, x in got.items():
        assert np.all(np.isfinite(x)), name
    if plan.direction == "fwd":
        want = reference.forward(host["Q"], host["K"], host["V"], causal=causal)[0]
        if dtype == "float32":
            assert rel_err(got["O"], want) < 1e-3
        else:
            naive = naive_forward(host["Q"], host["K"], host["V"], dtype, causal)
            assert rel_err(got["O"], want) <= 2 * rel_err(naive, want) + 1e-6


@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_plain_build_counts_nothing_and_agrees(key):
    plan = _plan(key, (200, 150, 64, "float16" if key[1] == "fast" else "float32", 64 * KB, 1, 1), True)
    inputs, _ = launch.make_device_inputs(plan, seed=3)
    counted = _outputs(launch.run_plan(plan, inputs, counting=True), plan)
    plain = launch.run_plan(plan, inputs, counting=False)
    assert plain.counts is None
    for name, x in _outputs(plain, plan).items():
        if name == "dQ" and plan.algorithm == "flash":  # float atomics from several K/V blocks: any order
            np.testing.assert_allclose(x, counted[name], rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(x, counted[name])


def test_flash_causal_moves_about_half_on_the_gpu():
    kw = dict(N_q=2048, d=64, dtype="float16", sram=96 * KB)
    plain, causal = make_plan("flash", "q_outer", **kw), make_plan("flash", "q_outer", causal=True, **kw)
    measured = []
    for plan in (plain, causal):
        inputs, _ = launch.make_device_inputs(plan, seed=5)
        run = launch.run_plan(plan, inputs, counting=True)
        assert run.counts == model.exact(plan)
        measured.append(sum(r + w for tensors in run.counts.values() for r, w in tensors.values()))
    assert 0.5 < measured[1] / measured[0] < 0.6


# ---------------------------------------------------------------------------------------------
# the library


@pytest.fixture
def cp():
    return pytest.importorskip("cupy")


@pytest.mark.parametrize("causal", [True, "top_left", "bottom_right"])
@pytest.mark.parametrize("algorithm, schedule", [("flash", None), ("flash", "kv_outer"), ("two_pass", "store"),
                                                 ("two_pass", "recompute"), ("standard", None)])
@pytest.mark.parametrize("n_q, n_k", [(100, 77), (77, 100)])
def test_attention_causal_float32(algorithm, schedule, causal, n_q, n_k):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, n_q, 64)).astype(np.float32)
    k = rng.standard_normal((2, 3, n_k, 64)).astype(np.float32)
    v = rng.standard_normal((2, 3, n_k, 64)).astype(np.float32)
    out, lse = iokernels.attention(q, k, v, algorithm=algorithm, schedule=schedule, causal=causal, return_lse=True)
    want, want_lse = reference.forward(q, k, v, causal=causal)
    assert np.all(np.isfinite(out))
    assert rel_err(out, want) < 1e-5
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
    finite = np.isfinite(want_lse)
    assert np.max(np.abs(lse[finite] - want_lse[finite])) < 1e-4


@pytest.mark.parametrize("causal", CAUSAL_ALIGNMENTS)
@pytest.mark.parametrize("d", [64, 128])
def test_attention_causal_float16_default_path_and_backward(causal, d, cp):
    """float16 with d 64/128: the forward's default flash schedule, and the backward routed to a causal
    kernel (not the tensor-core backward, which has none): no crash, gradients against the reference."""
    rng = np.random.default_rng(2)
    q, k, v, do = (cp.asarray(rng.standard_normal((2, 4, n, d)).astype(np.float16)) for n in (300, 200, 200, 300))
    o, lse = iokernels.attention(q, k, v, causal=causal, return_lse=True)
    q64, k64, v64, do64 = (cp.asnumpy(x).astype(np.float64) for x in (q, k, v, do))
    want, _ = reference.forward(q64, k64, v64, causal=causal)
    naive = naive_forward(q64, k64, v64, "float16", causal)
    assert rel_err(cp.asnumpy(o).astype(np.float64), want) <= 2 * rel_err(naive, want) + 1e-3
    grads = iokernels.attention_backward(q, k, v, o, do, lse, causal=causal)
    wants = reference.backward(q64, k64, v64, do64, causal=causal)
    scale = problem_scale(dict(zip("qkv", wants, strict=True)))
    for g, w in zip(grads, wants, strict=True):
        g = cp.asnumpy(g).astype(np.float64)
        assert np.all(np.isfinite(g))
        assert rel_err(g, w, scale) < 2e-2
    if causal == "bottom_right":
        assert bool(cp.all(grads[0][..., :100, :] == 0))
        assert bool(cp.all(o[..., :100, :] == 0)) and bool(cp.all(cp.isneginf(lse[..., :100])))


@pytest.mark.parametrize("algorithm", ["flash", "standard"])
@pytest.mark.parametrize("causal", CAUSAL_ALIGNMENTS)
def test_attention_backward_causal_float32(algorithm, causal):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 150, 32)).astype(np.float32)
    k = rng.standard_normal((2, 90, 32)).astype(np.float32)
    v = rng.standard_normal((2, 90, 32)).astype(np.float32)
    do = rng.standard_normal((2, 150, 32)).astype(np.float32)
    o, lse = iokernels.attention(q, k, v, causal=causal, return_lse=True)
    grads = iokernels.attention_backward(q, k, v, o, do, lse, algorithm=algorithm, causal=causal)
    wants = reference.backward(q, k, v, do, causal=causal)
    scale = problem_scale(dict(zip("qkv", wants, strict=True)))
    for g, w in zip(grads, wants, strict=True):
        assert np.all(np.isfinite(g))
        assert rel_err(g, w, scale) < 1e-4


def test_count_io_causal_matches_the_model():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 500, 64)).astype(np.float32)
    with iokernels.count_io() as records:
        iokernels.attention(q, q, q, algorithm="flash", schedule="q_outer", causal=True, sram="96KB")
    plan = make_plan("flash", "q_outer", N_q=500, d=64, sram=96 * KB, causal=True)
    want = {(stage, t): rw for stage, tensors in model.exact(plan).items() for t, rw in tensors.items()}
    got = {(r["stage"], r["tensor"]): (r["read_bytes"], r["write_bytes"]) for r in records}
    assert got == want


def _with_band(plan, band):
    """``plan`` with its stages' HEAD_BAND set to ``band`` (None: removed)."""
    from dataclasses import replace

    def params(s):
        kept = tuple(p for p in s.params if p[0] != "HEAD_BAND")
        return kept if band is None or "HEAD_BAND" not in dict(s.params) else (*kept, ("HEAD_BAND", band))
    return replace(plan, stages=tuple(replace(s, params=params(s)) for s in plan.stages))


@pytest.mark.parametrize("causal", CAUSAL_ALIGNMENTS)
@pytest.mark.parametrize("direction, d", [("bwd", 256)])
def test_head_bands_change_the_order_only(direction, d, causal):
    """A causal tma grid in bands of heads (HEAD_BAND: the plan's 6, and 2 and 3 of the 6 heads) against the same
    plan without them: every block computes the same item, so O, lse, dK and dV are bitwise equal and dQ (added by a
    head's blocks in another order) within a bfloat16-level tolerance; the counters equal the model each time, the
    outputs the float64 reference. The plain causal plans with bands: the wide backward's (the forward's and the
    narrow backward's take a list of items: test_item_list_changes_the_order_only)."""
    from iokernels.kernels.sources import build_source
    from iokernels.kernels.stages import kernel_ref

    plan = _plan(("flash", "fast", direction), (517, 700, d, "bfloat16", 227 * KB, 2, 3), causal)
    if "HEAD_BAND" not in dict(plan.stage("main").params):
        pytest.skip(f"no bands in this plan ({plan.stage('main').kernel}: not the sm_90 tma kernels)")
    assert dict(plan.stage("main").params)["HEAD_BAND"] == 6  # 5 or 6 blocks a head, 6 heads: one band
    ref = kernel_ref(plan, plan.stage("main"))
    assert "#define HEAD_BAND 6" in build_source(ref.source, ref.define_dict, False)  # the kernel gets it
    inputs, host = launch.make_device_inputs(plan, seed=_seed("bands", direction, d, causal))
    got = _bands_change_the_order_only(plan, inputs)
    _check_outputs(plan, host, {n: got[n] for n in OUTPUTS[direction]})


def _bands_change_the_order_only(plan, inputs):
    """``plan`` run (counting build) with HEAD_BAND removed and set to 6, 2 and 3: the counters equal the model each
    time, O, lse, dK and dV are bitwise equal to the unbanded run's and dQ (a head's blocks add to it in another order)
    within a bfloat16-level tolerance. The last banded run's outputs, in float64."""
    names = ("O", "lse") if plan.direction == "fwd" else OUTPUTS["bwd"]

    def run(band):
        r = launch.run_plan(_with_band(plan, band), inputs, counting=True)
        assert r.counts == model.exact(plan), band
        return {n: launch.to_float64(r.buffers[n], "float32" if n == "lse" else plan.dtype) for n in names}

    ref = run(None)
    for band in (6, 2, 3):
        got = run(band)
        for name in names:
            if name == "dQ":
                assert np.allclose(got[name], ref[name], rtol=1e-2, atol=1e-3 * np.abs(ref[name]).max()), band
            else:
                assert np.array_equal(got[name], ref[name]), (name, band)
    return got


@pytest.mark.parametrize("causal", CAUSAL_ALIGNMENTS)
@pytest.mark.parametrize("direction, d", [("fwd", 64), ("fwd", 128), ("fwd", 256), ("bwd", 64), ("bwd", 128)])
def test_item_list_changes_the_order_only(direction, d, causal):
    """A causal tma plan's persistent grid on its list of items (ITEM_LIST) against the same plan as a block per item
    in bands: every item is computed alike, so O, lse, dK and dV are bitwise equal and dQ within a bfloat16-level
    tolerance; each run's counters equal its own plan's model (the list's reads in the first), the outputs the float64
    reference. (The list's A/B timing: results/h100/issue21/list/.)"""
    plan = _plan(("flash", "fast", direction), (517, 700, d, "bfloat16", 227 * KB, 2, 3), causal)
    if "ITEM_LIST" not in dict(plan.stage("main").params):
        pytest.skip(f"no list in this plan ({plan.stage('main').kernel}: not the sm_90 tma kernels)")
    names = ("O", "lse") if direction == "fwd" else OUTPUTS["bwd"]
    inputs, host = launch.make_device_inputs(plan, seed=_seed("list", direction, d, causal))
    got = {}
    for label, p in (("list", plan), ("per item", per_item(plan))):
        r = launch.run_plan(p, inputs, counting=True)
        assert r.counts == model.exact(p), label
        got[label] = {n: launch.to_float64(r.buffers[n], "float32" if n == "lse" else p.dtype) for n in names}
    assert "work" in model.exact(plan)["main"] and "work" not in model.exact(per_item(plan))["main"]
    for name in names:
        a, b = got["list"][name], got["per item"][name]
        if name == "dQ":
            assert np.allclose(a, b, rtol=1e-2, atol=1e-3 * np.abs(b).max())
        else:
            assert np.array_equal(a, b), name
    _check_outputs(plan, host, {n: got["list"][n] for n in OUTPUTS[direction]})


@pytest.mark.parametrize("variant", ["dropout", "mask_mod"])
@pytest.mark.parametrize("direction, d", [("fwd", 64), ("fwd", 128), ("bwd", 64), ("bwd", 128)])
def test_variants_in_head_bands_change_the_order_only(direction, d, variant):
    """Dropout and a programmable mask (the variants that keep the causal grid's HEAD_BAND: a block takes its head and
    rows from its item, so the dropout stream and the mask see the same element) in bands of 6, 2 and 3 of 6 heads
    against the same plan without bands: O, lse, dK, dV bitwise equal, dQ within a bfloat16-level tolerance, the
    counters equal to the model each time."""
    from iokernels.plan.dropout import Dropout
    from iokernels.plan.modspec import Mods

    extra = {"dropout": {"dropout": Dropout(0.1, 11, 0)}, "mask_mod": {"mods": Mods(mask_mod="kv_idx % 5 != 2")}}
    plan = make_plan("flash", "fast", N_q=517, N_k=700, d=d, dtype="bfloat16", sram=227 * KB, batch=2, heads=3,
                     direction=direction, causal="bottom_right", **extra[variant])
    if "HEAD_BAND" not in dict(plan.stage("main").params):
        pytest.skip(f"no bands in this plan ({plan.stage('main').kernel}: not the sm_90 tma kernels)")
    inputs, _ = launch.make_device_inputs(plan, seed=_seed("variant bands", direction, d, variant))
    _bands_change_the_order_only(plan, inputs)
