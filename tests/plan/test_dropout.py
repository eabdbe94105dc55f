"""Dropout on the CPU: the Philox stream (Random123's known answers, the element layout, the keep rate over
a million elements), Dropout's checks, plans with dropout, and the simulator: == the float64 reference given
the same multipliers Z, alone and with the causal, block-sparse and explicit masks; bytes == model, == the
plan without dropout (dropout moves no byte). Plans are those of ``plan.DROPOUT_STAGES`` at test time, so
every stage that gains dropout is covered."""

from __future__ import annotations

import math
import zlib
from dataclasses import replace

import numpy as np
import pytest

from iokernels import model
from iokernels import simulate as sim
from iokernels.plan import (
    DROPOUT_STAGES,
    SCHEDULES,
    Unsupported,
    make_plan,
    supports_block_sparse,
    supports_causal,
    supports_dropout,
    supports_explicit_mask,
    with_dropout,
)
from iokernels.plan.dropout import Dropout, philox4x32_10
from iokernels.plan.masks import ExplicitMask, pattern
from iokernels.simulate import reference

KB = 1024
ALL_KEYS = [(a, s, p) for (a, p), ss in SCHEDULES.items() for s in ss]


def dropout_keys() -> list[tuple[str, str, str]]:
    return sorted(DROPOUT_STAGES)


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _kw(key, n_q, n_k, dtype="float16", **kw):
    """make_plan's arguments for a small problem of ``key`` (flash/fast needs its kernels' d and M)."""
    _, schedule, direction = key
    args = dict(N_q=n_q, N_k=n_k, d=16, dtype=dtype, sram=16 * KB, direction=direction, batch=2, heads=2)
    if schedule == "fast":
        args.update(d=64, sram=227 * KB)
    args.update(kw)
    return args


# ---------------------------------------------------------------------------------------------
# the stream

# Random123's kat_vectors for philox4x32_10: (counter, key) -> the four output words
KATS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, want", KATS, ids=["zeros", "ones", "pi"])
def test_philox_known_answers(counter, key, want):
    got = philox4x32_10(counter, key)
    assert tuple(int(x) for x in got) == want
    assert all(x.dtype == np.uint32 for x in got)


def test_philox_broadcasts_like_scalar_calls():
    """A vector call equals the calls one element at a time (the KAT inputs mixed into one array)."""
    c = np.array([k[0] for k in KATS], dtype=np.uint64).T
    k = np.array([k[1] for k in KATS], dtype=np.uint64).T
    words = philox4x32_10(tuple(c), tuple(k))
    for n, (_, _, want) in enumerate(KATS):
        assert tuple(int(w[n]) for w in words) == want


def test_element_layout():
    """Element (bh, i, j) is byte j mod 4 (low first) of word (j mod 16) div 4 of philox((j div 16, i, bh, offset),
    (seed lo, seed hi)), kept iff it is >= round(p · 256)."""
    d = Dropout(0.3, 0x0123456789ABCDEF, 77)
    bh, i, j = np.meshgrid(np.arange(3), np.arange(5), np.arange(37), indexing="ij")
    got = d.random_bytes(bh, i, j)
    for b, r, c in [(0, 0, 0), (2, 4, 36), (1, 3, 7), (0, 2, 16), (1, 1, 31)]:
        w = philox4x32_10((c // 16, r, b, 77), (0x89ABCDEF, 0x01234567))[(c % 16) // 4]
        assert int(got[b, r, c]) == (int(w) >> (8 * (c % 4))) & 0xFF
    assert d.threshold == 77  # round(0.3 * 256) = round(76.8)
    z = d.full_multiplier(3, 5, 37)
    np.testing.assert_array_equal(z, np.where(got >= 77, d.keep_scale, 0.0))
    # a tile of the multipliers is the same block of the whole (slices need the shape)
    np.testing.assert_array_equal(d.multiplier(slice(None), slice(1, 4), slice(3, 29), (3, 5, 37)), z[:, 1:4, 3:29])
    np.testing.assert_array_equal(d.multiplier(np.array([2]), np.arange(5), np.arange(37)), z[2:3])
    # another offset, seed or batch·head: another stream
    assert not np.array_equal(Dropout(0.3, d.seed, 78).random_bytes(bh, i, j), got)
    assert not np.array_equal(Dropout(0.3, d.seed ^ (1 << 40), 77).random_bytes(bh, i, j), got)
    assert not np.array_equal(got[0], got[1])


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
def test_keep_fraction_of_a_million_elements(p):
    d = Dropout(p, _seed("keep", p), 3)
    kept = d.keep(np.arange(4)[:, None, None], np.arange(250)[None, :, None], np.arange(1000)[None, None, :])
    n, q = kept.size, d.keep_probability
    assert n == 1_000_000
    assert q == 1 - math.floor(p * 256 + 0.5) / 256 and abs(q - (1 - p)) <= 1 / 512
    sigma = math.sqrt(n * q * (1 - q))
    assert abs(int(kept.sum()) - n * q) <= 5 * sigma + (0 if sigma else 0.5), (int(kept.sum()), n * q, sigma)
    if p == 0.0:
        assert kept.all()


@pytest.mark.parametrize("p, t", [(0.0, 0), (0.1, 26), (0.25, 64), (0.5, 128), (0.99, 253), (1 / 512, 1),
                                  (255.4 / 256, 255)])
def test_threshold_and_scale(p, t):
    """p takes effect as t / 256, t = round(256 p); kept elements are scaled by one over the exact keep probability."""
    d = Dropout(p, 1)
    assert d.threshold == t and d.kernel_args()[0] == np.uint32(t)
    assert d.keep_probability == 1 - t / 256
    assert d.keep_scale == float(np.float32(256 / (256 - t)))
    assert d.as_dict() == {"p": p, "seed": 1, "offset": 0}


@pytest.mark.parametrize("p, error", [(1.0, ValueError), (-0.1, ValueError), (1.5, ValueError), (-1e-300, ValueError),
                                      (float("nan"), ValueError), (float("inf"), ValueError),
                                      (True, TypeError), (False, TypeError), ("0.1", TypeError), (None, TypeError),
                                      (1j, TypeError)])
def test_bad_probability(p, error):
    with pytest.raises(error, match="dropout probability"):
        Dropout(p, 0)


@pytest.mark.parametrize("p", [1e-4, 1 / 513, 255.6 / 256, 0.9999])
def test_probability_outside_the_byte_resolution_is_refused(p):
    """A p that rounds to no dropout (below 1/512) or to dropping everything is refused, not run as another p."""
    with pytest.raises(ValueError, match="8-bit draws"):
        Dropout(p, 0)


@pytest.mark.parametrize("seed, offset", [(-1, 0), (2**64, 0), (True, 0), (0.0, 0), ("1", 0),
                                          (0, -1), (0, 2**32), (0, False), (0, 1.0)])
def test_bad_seed_or_offset(seed, offset):
    with pytest.raises(ValueError, match=r"dropout (seed|offset) must be an integer"):
        Dropout(0.1, seed, offset)


def test_extreme_words_are_accepted():
    d = Dropout(0.5, 2**64 - 1, 2**32 - 1)
    assert d.kernel_args()[2] == np.uint64(2**64 - 1) and d.kernel_args()[3] == np.uint32(2**32 - 1)
    assert d.full_multiplier(1, 2, 5).shape == (1, 2, 5)
    assert Dropout(np.float32(0.25), np.int64(3), np.uint32(4)) == Dropout(0.25, 3, 4)


# ---------------------------------------------------------------------------------------------
# plans


@pytest.mark.parametrize("key", ALL_KEYS, ids="/".join)
def test_plans_without_kernels_refuse_dropout(key):
    d = Dropout(0.1, 1)
    if supports_dropout(*key):
        plan = make_plan(key[0], key[1], **_kw(key, 100, 90), dropout=d)
        stages = {s.name for s in plan.stages if dict(s.params).get("DROPOUT") == 1}
        assert plan.dropout == d and stages == set(DROPOUT_STAGES[key])
        assert plan.as_dict()["dropout"] == {"p": 0.1, "seed": 1, "offset": 0}
        return
    with pytest.raises(Unsupported, match="dropout is not implemented by " + "/".join(key)):
        make_plan(key[0], key[1], **_kw(key, 100, 90), dropout=d)


def test_dropout_must_be_a_dropout():
    key = dropout_keys()[0]
    with pytest.raises(TypeError, match=r"dropout must be an iokernels\.plan\.dropout\.Dropout, got float"):
        make_plan(key[0], key[1], **_kw(key, 100, 90), dropout=0.1)


@pytest.mark.parametrize("key", dropout_keys(), ids="/".join)
def test_dropout_changes_no_tile_and_no_byte(key):
    plain = make_plan(key[0], key[1], **_kw(key, 300, 200))
    plan = with_dropout(plain, Dropout(0.2, 9, 4))
    assert plan.tiles == plain.tiles
    assert [s.smem_bytes for s in plan.stages] == [s.smem_bytes for s in plain.stages]
    assert [s.grid for s in plan.stages] == [s.grid for s in plain.stages]
    assert model.exact(plan) == model.exact(plain)
    assert with_dropout(plain, None) is plain


# ---------------------------------------------------------------------------------------------
# simulator == reference with the same Z, bytes == model


def _check_simulation(plan, seed):
    inputs = sim.make_inputs(plan, seed)
    result = sim.simulate(plan, inputs)
    z = plan.dropout.full_multiplier(plan.bh, plan.N_q, plan.N_k)
    kv = sim.kv_rows(plan)
    mask = sim.reference_mask(plan, inputs)
    q, k, v = inputs["Q"], inputs["K"][kv], inputs["V"][kv]
    if plan.direction == "fwd":
        o, _ = reference.forward(q, k, v, causal=plan.causal, mask=mask, dropout=z)
        want = {"O": o}
    else:
        # the backward's O is the forward's dropped output (make_inputs), so D = rowsum(dO ∘ O) matches
        o, _ = reference.forward(q, k, v, causal=plan.causal, mask=mask, dropout=z)
        np.testing.assert_allclose(inputs["O"], o, rtol=0, atol=1e-13)
        dq, dk, dv = reference.backward(q, k, v, inputs["dO"], causal=plan.causal, mask=mask, dropout=z)
        group = plan.heads // plan.kv_heads
        dk, dv = (x.reshape(plan.bh_kv, group, *x.shape[1:]).sum(axis=1) for x in (dk, dv))
        want = {"dQ": dq, "dK": dk, "dV": dv}
    for name, w in want.items():
        got = result.outputs[name]
        assert np.all(np.isfinite(got)), name
        np.testing.assert_allclose(got, w, rtol=0, atol=1e-12 * max(1.0, float(np.max(np.abs(w)))), err_msg=name)
    # the reference of the simulator's own module agrees
    assert sim.max_relative_error(result.outputs, sim.reference_outputs(plan, inputs)) < 1e-10
    exact = model.exact(plan)
    assert result.counts == exact
    # ... and the plan without dropout moves the same bytes, to different outputs (p > 0)
    plain = _without_dropout(plan)
    undropped = sim.simulate(plain, sim.make_inputs(plain, seed) if plan.direction == "bwd" else inputs)
    assert undropped.counts == exact
    if plan.dropout.p > 0:
        assert any(not np.allclose(result.outputs[n], undropped.outputs[n]) for n in want)
    return result


def _without_dropout(plan):
    stages = tuple(replace(s, params=tuple(x for x in s.params if x[0] != "DROPOUT")) for s in plan.stages)
    return replace(plan, dropout=None, stages=stages)


SHAPES = [(1, 1), (77, 53), (53, 130), (128, 128)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("key", dropout_keys(), ids="/".join)
def test_simulator_equals_reference(key, shape):
    n_q, n_k = shape
    ran = 0
    for dtype, p in (("float32", 0.1), ("bfloat16", 0.5)):
        try:
            plan = make_plan(key[0], key[1], **_kw(key, n_q, n_k, dtype), dropout=Dropout(p, _seed(key, shape), 5))
        except Unsupported:  # flash/fast: half precision only
            continue
        _check_simulation(plan, _seed(key, shape, dtype))
        ran += 1
    assert ran


@pytest.mark.parametrize("causal", ["top_left", "bottom_right"])
@pytest.mark.parametrize("key", dropout_keys(), ids="/".join)
def test_with_the_causal_mask(key, causal):
    if not supports_causal(*key):
        pytest.skip(f"{'/'.join(key)} has no causal kernels")
    for n_q, n_k in ((77, 53), (40, 130)):
        try:
            plan = make_plan(key[0], key[1], **_kw(key, n_q, n_k), causal=causal, dropout=Dropout(0.3, 11, 2))
        except Unsupported as exc:  # e.g. a causal plan whose kernel needs another architecture
            pytest.skip(str(exc))
        _check_simulation(plan, _seed(key, causal, n_q))


@pytest.mark.parametrize("causal", ["", "bottom_right"])
@pytest.mark.parametrize("key", dropout_keys(), ids="/".join)
def test_with_a_block_mask(key, causal):
    if not supports_block_sparse(*key) or (causal and not supports_causal(*key)):
        pytest.skip(f"{'/'.join(key)} has no block-sparse{' causal' if causal else ''} kernels")
    size = 128 if key[1] == "fast" else 32  # (flash/fast's tiles divide blocks of a multiple of 128)
    block = pattern("random", 0.5, n_q=150, n_k=130, block_q=size, block_k=size, seed=4)
    plan = make_plan(key[0], key[1], **_kw(key, 150, 130), causal=causal, block_mask=block,
                     dropout=Dropout(0.25, 3, 1))
    _check_simulation(plan, _seed(key, "block", causal))


@pytest.mark.parametrize("kind, shared", [("bool", True), ("additive", False)])
@pytest.mark.parametrize("key", dropout_keys(), ids="/".join)
def test_with_an_explicit_mask(key, kind, shared):
    if not supports_explicit_mask(*key):
        pytest.skip(f"{'/'.join(key)} reads no explicit mask")
    causal = "bottom_right" if supports_causal(*key) else ""
    for c in ("", causal):
        plan = make_plan(key[0], key[1], **_kw(key, 90, 70), causal=c, mask=ExplicitMask(kind, shared),
                         dropout=Dropout(0.4, 8, 6))
        result = _check_simulation(plan, _seed(key, kind, shared, c))
        out = result.outputs["O" if plan.direction == "fwd" else "dQ"]
        assert np.all(out[:, 3::7] == 0)  # rows that see no key (sim.random_mask): still 0 with dropout


@pytest.mark.parametrize("key", dropout_keys(), ids="/".join)
def test_no_dropout_at_p_zero(key):
    """p = 0 keeps every element with scale 1: the outputs of the plan without dropout, bit for bit."""
    plain = make_plan(key[0], key[1], **_kw(key, 77, 53))
    plan = with_dropout(plain, Dropout(0.0, 123, 4))
    inputs = sim.make_inputs(plan, 1)
    got, want = sim.simulate(plan, inputs), sim.simulate(plain, inputs)
    for name, w in want.outputs.items():
        np.testing.assert_array_equal(got.outputs[name], w)
    assert got.counts == want.counts


def test_the_backward_regenerates_the_forwards_mask():
    """A forward with Dropout d, its backward with the same d: the float64 gradients of the dropped forward
    (finite differences of the simulated forward's output in one direction)."""
    fwd_key, bwd_key = ("flash", "q_outer", "fwd"), ("flash", "kv_outer", "bwd")
    if not (supports_dropout(*fwd_key) and supports_dropout(*bwd_key)):
        pytest.skip("no flash forward and backward with dropout")
    d = Dropout(0.3, 2**63 + 12345, 9)
    n_q, n_k, h = 33, 29, 1e-6
    fwd = make_plan(*fwd_key[:2], **_kw(fwd_key, n_q, n_k, "float32"), dropout=d)
    bwd = make_plan(*bwd_key[:2], **_kw(bwd_key, n_q, n_k, "float32"), dropout=d)
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.standard_normal((fwd.bh, n, 16)) for n in (n_q, n_k, n_k, n_q))
    o = sim.simulate(fwd, {"Q": q, "K": k, "V": v}).outputs["O"]
    _, lse = reference.forward(q, k, v)
    grads = sim.simulate(bwd, {"Q": q, "K": k, "V": v, "O": o, "lse": lse, "dO": do}).outputs
    for name, x in (("dQ", q), ("dK", k), ("dV", v)):
        t = rng.standard_normal(x.shape)
        args = {"Q": q, "K": k, "V": v}
        plus = dict(args, **{name[1]: x + h * t})
        minus = dict(args, **{name[1]: x - h * t})
        slope = (np.sum(do * sim.simulate(fwd, plus).outputs["O"]) - np.sum(do * sim.simulate(fwd, minus).outputs["O"]))
        assert abs(slope / (2 * h) - np.sum(grads[name] * t)) < 1e-5 * max(1.0, abs(slope / (2 * h))), name
