"""A decode plan's cache of per-sequence lengths (iokernels.plan.kvcache), contiguous or paged: the simulator's bytes
equal the model's, its outputs the float64 reference over each sequence's keys (rows past the lengths are NaN and
never reach O), the bytes by hand for a small case, and the checks of make_kv_cache (CPU)."""

import numpy as np
import pytest

from iokernels import model
from iokernels.plan.decode import decode_sums, make_decode_plan, sequence_splits
from iokernels.plan.kvcache import make_kv_cache
from iokernels.simulate import make_inputs, max_relative_error, reference_outputs, simulate


def _plan(lengths, n_k, page_size=0, pages=0, append=0, **kw):
    batch = len(lengths)
    cache = make_kv_cache(batch=batch, n_k=n_k, lengths=lengths, page_size=page_size, pages=pages, append=append)
    return make_decode_plan(N_k=n_k, batch=batch, kv_cache=cache, **kw)


CASES = [
    # lengths 0, 1, a tile's end and one past it, the capacity; 3 splits of 3 tiles over a capacity of 9 tiles
    dict(lengths=(0, 1, 128, 129, 1100), n_k=1100, N_q=1, d=64, dtype="float16", heads=8, kv_heads=2, splits=3),
    # one split: the tma forward on the packed rows, a block per item (a sequence of no key: O = 0)
    dict(lengths=(300, 0, 77), n_k=300, N_q=2, d=128, dtype="bfloat16", heads=4, kv_heads=4, splits=1),
    # paged, pages smaller than B_c (boxes of 16 rows; a box past the end is not loaded), 24 query heads over 2
    dict(lengths=(16, 17, 500, 0), n_k=512, page_size=16, pages=80, N_q=3, d=96, dtype="float16", heads=48,
         kv_heads=2, splits=4),
    # paged, pages of 256 rows (two tiles each), d 256 (B_c 64); more pages in the pool than the table uses
    dict(lengths=(700, 255, 1), n_k=1024, page_size=256, pages=9, N_q=1, d=256, dtype="bfloat16", heads=2,
         kv_heads=1),
]


@pytest.mark.parametrize("kw", CASES)
def test_simulator_equals_model_and_reference(kw):
    plan = _plan(**kw)
    inputs = make_inputs(plan, seed=2)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    want = reference_outputs(plan, inputs)
    assert np.all(np.isfinite(result.outputs["O"]))
    assert max_relative_error(result.outputs, want) < 1e-12


def test_the_cache_bytes_by_hand():
    """Two sequences of 200 and 0 keys in a paged cache of 64-row pages, one K/V head of 4 query heads, one token,
    d 64 fp16, capacity 1024 (8 tiles of 128), 4 splits of 2 tiles: sequence 0 has 2 tiles (200 rows: 4 boxes of 64,
    256 rows loaded, 4 page entries per copy) in split 0 only; sequence 1 none."""
    plan = _plan((200, 0), 1024, page_size=64, pages=8, N_q=1, d=64, dtype="float16", heads=4, kv_heads=1,
                 splits=4)
    assert (plan.tile["S"], sequence_splits(plan, 200), sequence_splits(plan, 0)) == (4, 1, 0)
    assert decode_sums(plan) == {"rows": 256, "splits": 1, "entries": 4, "batch": 2}
    got = model.exact(plan)
    assert got["main"] == {"Q": (4 * 64 * 2, 0), "K": (256 * 64 * 2, 0), "V": (256 * 64 * 2, 0),
                           "Opart": (0, 4 * 64 * 4), "lse_part": (0, 4 * 4), "seqlens": (2 * 4 * 4, 0),
                           "page_table": (2 * 4 * 4, 0)}
    assert got["combine"] == {"O": (0, 8 * 64 * 2), "lse": (0, 8 * 4), "Opart": (4 * 64 * 4, 0),
                              "lse_part": (4 * 4, 0), "seqlens": (8 * 4, 0)}


def test_a_launch_plan_has_no_exact_bytes():
    cache = make_kv_cache(batch=2, n_k=4096)
    plan = make_decode_plan(N_q=1, N_k=4096, d=128, dtype="float16", batch=2, heads=8, kv_heads=8, kv_cache=cache)
    assert dict(plan.stage("main").params)["RAGGED"] == 1
    with pytest.raises(ValueError, match="lengths"):
        model.exact(plan)


@pytest.mark.parametrize("kw, match", [
    (dict(lengths=(1, 2, 3)), "2 ints"), (dict(lengths=(1, 5000)), r"\[0, 4096\]"), (dict(page_size=48), "page_size"),
    (dict(page_size=64), "pool"), (dict(pages=3), "without a page_size")])
def test_make_kv_cache_checks(kw, match):
    with pytest.raises(ValueError, match=match):
        make_kv_cache(batch=2, n_k=4096, **kw)


def test_cache_launch_arguments():
    """A paged plan: K and V are the pool (pages·kv_heads, page size, d) in boxes of min(page, B_c) rows; after the
    main kernel's arguments come the lengths, the batch, the appended keys (none), the page table and its columns; the
    combine takes the lengths, the batch and the appended keys; the lengths and the page table are int32 inputs of the
    plan."""
    from iokernels.kernels import launch

    plan = _plan((5, 700, 0), 1000, page_size=16, pages=100, N_q=1, d=128, dtype="float16", heads=16, kv_heads=4,
                 splits=3)
    main, combine = plan.stages
    assert dict(main.params)["RAGGED"] == 1 and dict(main.params)["PAGED"] == 16
    args, _ = launch.stage_arg_layout(plan, main, 0.5)
    assert (args[1].bh, args[1].n, args[1].rows) == (400, 16, 16) and (args[2].bh, args[2].rows) == (400, 16)
    assert args[3:] == ("Opart", "lse_part", 4, 1000, 0.5, 1, 12, "seqlens", 3, 0, "page_table", 63)
    assert launch.stage_arg_layout(plan, combine, 0.5)[0][-3:] == ("seqlens", 3, 0)
    assert launch.tensor_shape(plan, "page_table") == (3, 63) and launch.tensor_shape(plan, "K") == (400, 16, 128)
    assert launch.tensor_dtype(plan, "seqlens") == np.int32
    assert set(launch.plan_tensors(plan)) >= {"seqlens", "page_table", "Opart"}


@pytest.mark.parametrize("kw", [
    # a cache: sequences shorter than the queries (their first queries see no key), split and not
    dict(lengths=(0, 3, 200, 700), n_k=700, N_q=5, d=64, dtype="float16", heads=6, kv_heads=2, splits=3),
    dict(lengths=(16, 300), n_k=512, page_size=16, pages=40, N_q=16, d=128, dtype="bfloat16", heads=8, kv_heads=1,
         splits=1),
])
def test_causal_decode_simulator_equals_model_and_reference(kw):
    """The bottom-right causal mask on packed rows (query i of N_q sees the keys up to length − N_q + i): the same
    bytes as without it (every tile is read), outputs equal to the per-sequence causal float64 reference."""
    plan = _plan(causal=True, **kw)
    assert plan.causal == "bottom_right" and dict(plan.stage("main").params)["PACKED_CAUSAL"] == 1
    inputs = make_inputs(plan, seed=4)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan) == model.exact(_plan(**kw))
    assert max_relative_error(result.outputs, reference_outputs(plan, inputs)) < 1e-12


def test_causal_decode_on_a_dense_cache():
    plan = make_decode_plan(N_q=7, N_k=1000, d=96, dtype="float16", batch=2, heads=16, kv_heads=4, splits=4,
                            causal=True)
    inputs = make_inputs(plan, seed=6)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    assert max_relative_error(result.outputs, reference_outputs(plan, inputs)) < 1e-12
    assert make_decode_plan(N_q=1, N_k=1000, d=96, dtype="float16", causal=True).causal == ""  # one query: no mask


@pytest.mark.parametrize("kw", [
    dict(lengths=(0, 5, 1000), n_k=1004, append=4, N_q=4, d=64, dtype="float16", heads=8, kv_heads=2, splits=3,
         causal=True),
    dict(lengths=(15, 300), n_k=512, page_size=16, pages=40, append=1, N_q=1, d=128, dtype="bfloat16", heads=8,
         kv_heads=8),
    dict(lengths=(40, 0), n_k=64, page_size=64, pages=3, append=16, N_q=16, d=96, dtype="float16", heads=4,
         kv_heads=1, causal=True),
    # a sequence whose appended rows take a page of their own (700 + 16 keys: the twelfth page holds new rows only)
    dict(lengths=(40, 0, 700), n_k=768, page_size=64, pages=30, append=16, N_q=16, d=96, dtype="float16", heads=4,
         kv_heads=1, causal=True),
])
def test_append_then_attend(kw):
    """A decode step that appends its new keys and values first (FlashAttention's flash_attn_with_kvcache(k=, v=)):
    the append stage's bytes (each new row of Knew and Vnew read once, written into K and V, its sequence's length and
    page entry read by each K/V head), the attention over the lengths with the new keys, outputs equal to the float64
    reference over the cached keys and the new ones; the cache holds the new rows afterwards."""
    plan = _plan(**kw)
    assert plan.stages[0].name == "append"
    inputs = make_inputs(plan, seed=8)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    assert max_relative_error(result.outputs, reference_outputs(plan, inputs)) < 1e-12
    cache, h_kv, e, d = plan.kv_cache, plan.kv_heads, plan.itemsize, plan.d
    rows = plan.batch * h_kv * cache.append
    want = {"Knew": (rows * d * e, 0), "Vnew": (rows * d * e, 0), "K": (0, rows * d * e), "V": (0, rows * d * e),
            "seqlens": (rows * 4, 0)}
    if cache.paged:
        want["page_table"] = (rows * 4, 0)
    assert result.counts["append"] == want


def test_append_needs_room():
    with pytest.raises(ValueError, match=r"\[0, 60\]"):
        make_kv_cache(batch=1, n_k=64, lengths=(61,), append=4)
    with pytest.raises(ValueError, match="append"):
        make_kv_cache(batch=1, n_k=64, append=65)


def test_the_dram_model_and_the_flops_follow_the_cache():
    """The L2-aware DRAM model reads the same stages and tensors as the exact one for a cache plan (the append, the
    lengths and the page table included, the cache's rows as loaded), and the FLOPs count each sequence's keys."""
    from iokernels.model.l2 import dram
    from iokernels.model.specs import get_spec

    plan = _plan((10, 20), 4096, page_size=16, pages=300, append=3, N_q=1, d=128, dtype="float16", heads=8,
                 kv_heads=2, splits=4)
    exact, predicted = model.exact(plan), dram(plan, get_spec("h200"))
    assert set(predicted) == set(exact) == {"append", "main", "combine"}
    assert all(set(predicted[s]) >= set(exact[s]) for s in exact)
    # 13 and 23 keys in pages of 16: 16 and 32 rows loaded, for each of the 2 K/V heads of a sequence
    assert exact["main"]["K"] == (2 * (16 + 32) * 128 * 2, 0) and 0 < predicted["main"]["K"][0] <= exact["main"]["K"][0]
    assert model.predict(plan).flops == 4 * 2 * 8 * 1 * ((10 + 3 + 20 + 3) // 2) * 128
    assert plan.as_dict()["kv_cache"] == {"lengths": [10, 20], "page_size": 16, "pages": 300, "append": 3}
