"""The split-KV decode on the GPU (issue #23; flash_tma.cu built with SPLIT, combine.cu; iokernels/plan/decode.py):
counters == model.exact stage by stage; O and lse equal the float64 reference within flash-attention's same-precision
tolerance, for one and several query tokens, grouped-query packing (8:1, 24:1, 1:1, 16:1 over two packed tiles),
ragged key tiles, one key, d inside a wider tile and past 128, forced and default split counts, and the one-split
plan (the persistent tma forward on packed rows); the plain build agrees with the counting one; the library and the
torch front end route decode-shaped calls to these plans.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_decode.py`` (skips without an sm_90 device).
"""

import zlib

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan.decode import make_decode_plan
from iokernels.plan.units import round_to
from iokernels.simulate import kv_rows, reference, reference_outputs

from .helpers import assert_within_naive, plan_naive_p, ulp

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.usefixtures("sm90")

# (N_q, N_k, d, dtype, batch, heads, kv_heads, splits: None for the plan's own)
CASES = [
    (1, 16384, 128, "float16", 1, 64, 8, None),  # the design note's case: 15 splits of 9 tiles (the last 2)
    (1, 1000, 128, "bfloat16", 2, 8, 8, None),  # 1:1
    (3, 777, 96, "float16", 1, 48, 2, 4),  # 72 packed rows; d inside a 128-wide tile; a ragged last tile
    (16, 2000, 128, "bfloat16", 1, 16, 1, 3),  # 256 packed rows: two tiles, each reading K and V
    (2, 129, 256, "float16", 1, 2, 1, 9),  # B_c 64: 3 tiles, 3 splits of one (the last: one key)
    (1, 1, 64, "float16", 1, 8, 8, None),  # one key: one split, the packed plan
    (1, 4097, 64, "float16", 1, 8, 1, 33),  # 33 tiles of 128 keys, a split each
    (5, 300, 32, "bfloat16", 3, 4, 4, None),  # d 32 in a 64-wide tile
    (4, 4096, 128, "float16", 32, 16, 16, None),  # a full grid: one split, persistent
]
IDS = ["-".join(map(str, c)) for c in CASES]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _assert_outputs(runs, dtype, o_want, lse_want, naive):
    """Each run's O within flash-attention's tolerance of the float64 reference (twice the same-precision naive
    error), lse within 1e-2, −inf exactly where a query sees no key (and O 0 there)."""
    for buffers in runs:
        o = launch.to_float64(buffers["O"], dtype)
        assert_within_naive({"O": o}, {"O": o_want}, {"O": naive})
        lse = cp.asnumpy(buffers["lse"]).astype(np.float64)
        empty = np.isneginf(lse_want)
        assert np.array_equal(np.isneginf(lse), empty) and np.all(o[empty] == 0)
        assert np.max(np.abs(lse[~empty] - lse_want[~empty]), initial=0.0) < 1e-2


def _plan(case):
    n_q, n_k, d, dtype, batch, heads, kv_heads, splits = case
    return make_decode_plan(N_q=n_q, N_k=n_k, d=d, dtype=dtype, batch=batch, heads=heads, kv_heads=kv_heads,
                            splits=splits)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_counters_outputs_and_lse(case):
    plan = _plan(case)
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case))
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    o = launch.to_float64(run.buffers["O"], plan.dtype)
    plain = launch.run_plan(plan, inputs, counting=False)
    o_plain = launch.to_float64(plain.buffers["O"], plan.dtype)
    assert np.max(np.abs(o_plain - o)) <= ulp(plan.dtype) * np.max(np.abs(o))  # the same kernels less counters
    want = reference_outputs(plan, host)
    kv = kv_rows(plan)
    q, k, v = host["Q"], host["K"][kv], host["V"][kv]
    naive = round_to(plan_naive_p(plan, q, k, reference.default_scale(plan.d)) @ v, plan.dtype)
    assert_within_naive({"O": o}, {"O": want["O"]}, {"O": naive})
    lse_want = reference.forward(q, k, v)[1]
    for buffers in (run.buffers, plain.buffers):
        lse = cp.asnumpy(buffers["lse"]).astype(np.float64)
        assert np.max(np.abs(lse - lse_want)) < 1e-2


# the bottom-right causal mask on packed rows (PACKED_CAUSAL): (N_q, N_k, d, dtype, batch, heads, kv_heads, splits)
CAUSAL_CASES = [
    (4, 2000, 128, "float16", 2, 32, 8, None),  # 4 queries x 4 heads a K/V head, the default split
    (16, 300, 64, "bfloat16", 1, 8, 1, 3),  # 128 packed rows; the masked keys span two tiles
    (7, 5, 128, "float16", 1, 4, 2, None),  # more queries than keys: the first two see none (O = 0, lse -inf)
    (5, 4097, 96, "bfloat16", 3, 24, 2, 1),  # one split: the persistent forward on packed rows, masked
]


@pytest.mark.parametrize("case", CAUSAL_CASES, ids=["-".join(map(str, c)) for c in CAUSAL_CASES])
def test_causal_counters_outputs_and_lse(case):
    n_q, n_k, d, dtype, batch, heads, kv_heads, splits = case
    plan = make_decode_plan(N_q=n_q, N_k=n_k, d=d, dtype=dtype, batch=batch, heads=heads, kv_heads=kv_heads,
                            splits=splits, causal=True)
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case, "causal"))
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    plain = launch.run_plan(plan, inputs, counting=False)
    kv = kv_rows(plan)
    q, k, v = host["Q"], host["K"][kv], host["V"][kv]
    o_want, lse_want = reference.forward(q, k, v, causal="bottom_right")
    naive = round_to(plan_naive_p(plan, q, k, reference.default_scale(d)) @ v, dtype)
    _assert_outputs((run.buffers, plain.buffers), dtype, o_want, lse_want, naive)


def test_each_split_sees_its_keys_once():
    """Q = 0 makes every key's weight equal: O is the mean of V over all N_k keys only if every key tile is visited
    by exactly one split and the combine weights the splits by their key counts."""
    plan = make_decode_plan(N_q=1, N_k=5000, d=64, dtype="float16", heads=8, kv_heads=2, splits=7)
    assert plan.tile["S"] == 7
    inputs, host = launch.make_device_inputs(plan, seed=5)
    inputs["Q"] = cp.zeros_like(inputs["Q"])
    run = launch.run_plan(plan, inputs, counting=False)
    o = launch.to_float64(run.buffers["O"], plan.dtype)
    mean = host["V"].mean(axis=1)[kv_rows(plan)]  # (BH, d): each query head's K/V head's mean row
    assert np.max(np.abs(o[:, 0] - mean)) < 2e-3
    assert np.allclose(cp.asnumpy(run.buffers["lse"]), np.log(5000), atol=1e-4)


def test_the_library_routes_decode_calls_to_the_split_plan():
    """iokernels.attention on a decode-shaped call (one token, 64 query heads over 8 K/V heads) runs the split plan
    (its counted stages are main and combine) and equals the float64 reference; its lse too."""
    import iokernels

    rng = np.random.default_rng(7)
    q = cp.asarray(rng.standard_normal((2, 64, 1, 128)), dtype=cp.float16)
    k = cp.asarray(rng.standard_normal((2, 8, 3000, 128)), dtype=cp.float16)
    v = cp.asarray(rng.standard_normal((2, 8, 3000, 128)), dtype=cp.float16)
    with launch.count_io() as records:
        o, lse = iokernels.attention(q, k, v, return_lse=True)
    assert {r["plan"] for r in records} == {"flash/fast/fwd+split"}
    assert {r["stage"] for r in records} == {"main", "combine"}
    qh, kh, vh = (cp.asnumpy(x).astype(np.float64) for x in (q, k, v))
    kh, vh = np.repeat(kh, 8, axis=1), np.repeat(vh, 8, axis=1)
    o_want, lse_want = reference.forward(qh.reshape(128, 1, 128), kh.reshape(128, 3000, 128),
                                         vh.reshape(128, 3000, 128))
    assert np.max(np.abs(cp.asnumpy(o).astype(np.float64).reshape(128, 1, 128) - o_want)) < 2e-3
    assert np.max(np.abs(cp.asnumpy(lse).reshape(128, 1) - lse_want)) < 1e-3
    again = iokernels.attention(q, k, v)  # the fast path (the signature's second call): the same values
    assert cp.array_equal(again, o)


def test_torch_decode_equals_sdpa():
    torch = pytest.importorskip("torch")
    import iokernels.torch as iot

    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(4, 8, 9000, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(4, 8, 9000, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    got = iot.attention(q, k, v).float()
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
    same = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True).double()
    err, err_same = (got.double() - want).abs().max().item(), (same - want).abs().max().item()
    assert err <= 2 * err_same + 1e-3, (err, err_same)


# a cache of per-sequence lengths (iokernels.plan.kvcache): (lengths, capacity, page size, pool pages, N_q, d, dtype,
# heads, kv_heads, splits, causal); rows past a sequence's length hold NaN (make_inputs), which must never reach O
CACHE_CASES = [
    ((0, 1, 128, 129, 1100), 1100, 0, 0, 1, 128, "float16", 8, 2, 3, False),  # empty, one key, a tile's end, past it
    ((300, 0, 77), 300, 0, 0, 2, 128, "bfloat16", 4, 4, 1, False),  # one split: a block per item
    ((16, 17, 500, 0), 512, 16, 80, 3, 96, "float16", 48, 2, 4, False),  # pages of 16: boxes past the end not loaded
    ((700, 255, 1), 1024, 256, 9, 1, 256, "bfloat16", 2, 1, None, False),  # pages of 256 (two tiles), d 256
    ((5000, 3, 4097, 2048), 8192, 64, 300, 1, 128, "float16", 64, 8, None, False),  # GQA 8:1, the default split
    ((0, 3, 200, 700), 700, 0, 0, 5, 64, "float16", 6, 2, 3, True),  # causal: sequences shorter than the queries
    ((16, 300), 512, 16, 40, 16, 128, "bfloat16", 8, 1, 1, True),  # causal, paged, one split
]
CACHE_IDS = ["-".join(map(str, c[1:])) + f"-{len(c[0])}seq" for c in CACHE_CASES]


def _naive(q, k, v, dtype, scale, causal):
    """Same-precision attention of one sequence (S, P and O rounded to the dtype), float64 arithmetic; ``causal``:
    bottom-right (a query that sees no key: 0)."""
    s = round_to(scale * (q @ np.swapaxes(k, -1, -2)), dtype)
    if causal:
        n_q, n_k = s.shape[-2:]
        s = np.where(np.arange(n_k)[None, :] <= n_k - n_q + np.arange(n_q)[:, None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = p.sum(axis=-1, keepdims=True)
    return round_to(round_to(np.where(total > 0, p / np.where(total > 0, total, 1), 0.0), dtype) @ v, dtype)


@pytest.mark.parametrize("case", CACHE_CASES, ids=CACHE_IDS)
def test_cache_counters_outputs_and_lse(case):
    from iokernels.plan.kvcache import make_kv_cache
    from iokernels.simulate.inputs import cache_keys, cache_reference

    lengths, n_k, page, pages, n_q, d, dtype, heads, kv_heads, splits, causal = case
    cache = make_kv_cache(batch=len(lengths), n_k=n_k, lengths=lengths, page_size=page, pages=pages)
    plan = make_decode_plan(N_q=n_q, N_k=n_k, d=d, dtype=dtype, batch=len(lengths), heads=heads,
                            kv_heads=kv_heads, splits=splits, kv_cache=cache, causal=causal)
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case))
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    plain = launch.run_plan(plan, inputs, counting=False)
    o_want, lse_want = cache_reference(plan, host)
    scale, group = reference.default_scale(d), heads // kv_heads
    ks, vs = cache_keys(plan, host)
    q = host["Q"].reshape(len(lengths), heads, n_q, d)
    naive = np.zeros(q.shape)
    for b, (k, v) in enumerate(zip(ks, vs, strict=True)):
        if k.shape[1]:
            naive[b] = _naive(q[b], np.repeat(k, group, axis=0), np.repeat(v, group, axis=0), dtype, scale, causal)
    naive = naive.reshape(plan.bh, n_q, d)
    _assert_outputs((run.buffers, plain.buffers), dtype, o_want, lse_want, naive)


def test_the_library_decodes_from_a_paged_cache():
    """iokernels.attention_with_kvcache on a paged pool with per-sequence lengths on the device equals the float64
    reference."""
    import iokernels
    from iokernels.plan.kvcache import make_kv_cache
    from iokernels.simulate.inputs import cache_reference

    lengths, page, heads, kv_heads, d = (900, 1, 0, 3000), 64, 32, 8, 128
    cache = make_kv_cache(batch=4, n_k=4096, lengths=lengths, page_size=page, pages=80)
    plan = make_decode_plan(N_q=1, N_k=4096, d=d, dtype="float16", batch=4, heads=heads, kv_heads=kv_heads,
                            kv_cache=cache)
    inputs, host = launch.make_device_inputs(plan, seed=11)
    q = inputs["Q"].reshape(4, heads, 1, d)
    k_pool, v_pool = (inputs[n].reshape(80, kv_heads, page, d) for n in ("K", "V"))
    o = iokernels.attention_with_kvcache(q, k_pool, v_pool, cache_seqlens=inputs["seqlens"],
                                         page_table=inputs["page_table"])
    o_want, _ = cache_reference(plan, host)
    got = launch.to_float64(o, "float16").reshape(plan.bh, 1, d)
    assert np.max(np.abs(got - o_want)) < 3e-3


# a decode step that appends its new keys first (kvcache.cu): (lengths, capacity, page size, pool pages, appended (=
# N_q, causal), d, dtype, heads, kv_heads, splits)
APPEND_CASES = [
    ((0, 5, 1000), 1004, 0, 0, 4, 128, "float16", 8, 2, 3),
    ((15, 300), 512, 16, 40, 1, 128, "bfloat16", 64, 8, None),  # one new token, 8:1, pages of 16
    ((40, 0, 700), 768, 64, 30, 16, 96, "float16", 4, 1, None),  # 16 new tokens a sequence, pages of 64
]


@pytest.mark.parametrize("case", APPEND_CASES, ids=["-".join(map(str, c[1:])) for c in APPEND_CASES])
def test_append_then_attend(case):
    """The append stage writes Knew, Vnew after each sequence's keys (contiguous or through the page table), then the
    attention sees them with the causal mask: counters == model; O, lse against the float64 reference over the cached
    and the new keys; the cache holds the new rows afterwards (a second run appends the same rows: the same O)."""
    from iokernels.plan.kvcache import make_kv_cache
    from iokernels.simulate.inputs import cache_keys, cache_reference

    lengths, n_k, page, pages, new, d, dtype, heads, kv_heads, splits = case
    cache = make_kv_cache(batch=len(lengths), n_k=n_k, lengths=lengths, page_size=page, pages=pages, append=new)
    plan = make_decode_plan(N_q=new, N_k=n_k, d=d, dtype=dtype, batch=len(lengths), heads=heads, kv_heads=kv_heads,
                            splits=splits, kv_cache=cache, causal=True)
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case, "append"))
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    o_want, lse_want = cache_reference(plan, host)
    after = {n: launch.to_float64(inputs[n], dtype) for n in ("K", "V")}
    got_k, got_v = cache_keys(plan, {**host, **after, "Knew": host["Knew"][:, :0], "Vnew": host["Vnew"][:, :0],
                                     "seqlens": host["seqlens"] + new})
    want_k, want_v = cache_keys(plan, host)
    for got, want in ((got_k, want_k), (got_v, want_v)):
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))  # the cache holds the new rows
    plain = launch.run_plan(plan, inputs, counting=False)
    for buffers in (run.buffers, plain.buffers):
        o = launch.to_float64(buffers["O"], dtype)
        assert np.max(np.abs(o - o_want)) < (2e-3 if dtype == "float16" else 1.6e-2)
        lse = cp.asnumpy(buffers["lse"]).astype(np.float64)
        empty = np.isneginf(lse_want)
        assert np.array_equal(np.isneginf(lse), empty)
        assert np.max(np.abs(lse[~empty] - lse_want[~empty]), initial=0.0) < 1e-2


def test_the_library_appends_and_attends():
    """iokernels.attention_with_kvcache(k=, v=, causal=True) on a paged pool: the new rows go after each sequence's
    keys, the N_q = N_new queries attend causally; O equals the float64 reference, and counts equal the model."""
    import iokernels
    from iokernels.plan.kvcache import make_kv_cache
    from iokernels.simulate.inputs import cache_reference

    lengths, page, heads, kv_heads, d, new = (900, 1, 0, 3000), 64, 32, 8, 128, 3
    cache = make_kv_cache(batch=4, n_k=4096, lengths=lengths, page_size=page, pages=80, append=new)
    plan = make_decode_plan(N_q=new, N_k=4096, d=d, dtype="float16", batch=4, heads=heads, kv_heads=kv_heads,
                            kv_cache=cache, causal=True)
    inputs, host = launch.make_device_inputs(plan, seed=12)
    q = inputs["Q"].reshape(4, heads, new, d)
    k_pool, v_pool = (inputs[n].reshape(80, kv_heads, page, d) for n in ("K", "V"))
    k_new, v_new = (inputs[n].reshape(4, kv_heads, new, d) for n in ("Knew", "Vnew"))
    with launch.count_io() as records:
        o = iokernels.attention_with_kvcache(q, k_pool, v_pool, cache_seqlens=inputs["seqlens"],
                                             page_table=inputs["page_table"], k=k_new, v=v_new, causal=True)
    counted: dict = {}
    for r in records:
        counted.setdefault(r["stage"], {})[r["tensor"]] = (r["read_bytes"], r["write_bytes"])
    assert counted == model.exact(plan)
    o_want, _ = cache_reference(plan, host)
    got = launch.to_float64(o, "float16").reshape(plan.bh, new, d)
    assert np.max(np.abs(got - o_want)) < 3e-3
    again = iokernels.attention_with_kvcache(q, k_pool, v_pool, cache_seqlens=inputs["seqlens"],
                                             page_table=inputs["page_table"], k=k_new, v=v_new, causal=True)
    assert np.max(np.abs(launch.to_float64(again, "float16").reshape(plan.bh, new, d) - o_want)) < 3e-3


def test_lengths_past_the_capacity_are_clamped():
    """A length past the contiguous cache's capacity counts as the capacity (no zero-filled row taken for a key), and
    rows appended past it are not written (the next head's keys stay as they were)."""
    import iokernels

    rng = np.random.default_rng(13)
    q = cp.asarray(rng.standard_normal((2, 8, 1, 64)), dtype=cp.float16)
    k, v = (cp.asarray(rng.standard_normal((2, 2, 300, 64)), dtype=cp.float16) for _ in range(2))
    over = cp.asarray([1000, 300], dtype=cp.int32)
    o = iokernels.attention_with_kvcache(q, k, v, cache_seqlens=over)
    full = iokernels.attention_with_kvcache(q, k, v)  # every sequence its 300 keys
    assert cp.allclose(o.astype(cp.float32), full.astype(cp.float32), atol=2e-3)
    before = k.copy()
    k_new, v_new = (cp.asarray(rng.standard_normal((2, 2, 4, 64)), dtype=cp.float16) for _ in range(2))
    iokernels.attention_with_kvcache(q, k, v, cache_seqlens=cp.asarray([298, 300], dtype=cp.int32), k=k_new, v=v_new)
    assert cp.array_equal(k[0, :, 298:], k_new[0, :, :2]) and cp.array_equal(k[0, :, :298], before[0, :, :298])
    assert cp.array_equal(k[1], before[1])  # sequence 1 is full: none of its rows written, nothing past it
