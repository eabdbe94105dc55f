"""iokernels.plan.fast on the CPU: the tensor-core plans are the q_outer schedule with their kernels' own
tiles, so the simulator's counts equal the exact model and its outputs the float64 reference."""

import itertools

import numpy as np
import pytest

from iokernels import model
from iokernels.plan.fast import FAST_KERNELS, make_fast_plan, make_fast_plan_within
from iokernels.simulate import make_inputs, reference, simulate


@pytest.mark.parametrize("kernel", FAST_KERNELS)
@pytest.mark.parametrize("n_q, n_k, d, dtype", [(1, 1, 64, "float16"), (113, 300, 128, "bfloat16"),
                                                (200, 65, 64, "bfloat16")])
def test_simulator_counts_equal_model(n_q, n_k, d, dtype, kernel):
    plan = make_fast_plan(N_q=n_q, N_k=n_k, d=d, dtype=dtype, heads=2, kernel=kernel)
    br = plan.tile["Br"]
    producer = 128 if kernel == "tma" else 0  # tma: a producer warpgroup beside a warpgroup per 64 rows
    persistent = dict(plan.stages[0].params).get("PERSISTENT")  # tma at B_r 128: the items (query block, head)
    grid = (min(2 * -(-n_q // br), 132), 1, 1) if persistent else (-(-n_q // br), 1, 2)
    assert plan.stages[0].grid == grid and plan.stages[0].threads == 2 * br + producer
    assert persistent == (1 if kernel == "tma" and br == 128 else None)
    host = make_inputs(plan, seed=1, rounded=True)
    run = simulate(plan, host)
    assert run.counts == model.exact(plan)
    want = reference.forward(host["Q"], host["K"], host["V"])[0]
    assert np.max(np.abs(run.outputs["O"] - want)) < 1e-10


@pytest.mark.parametrize("kernel, d, br, bc", [("wgmma", 128, 128, 128), ("wgmma", 64, 128, 64),
                                               ("mma", 128, 64, 64)])
def test_effective_m_is_the_kernels_shared_memory(kernel, d, br, bc):
    plan = make_fast_plan(N_q=4096, d=d, dtype="float16", kernel=kernel)
    assert (plan.tile["Br"], plan.tile["Bc"]) == (br, bc)
    # Q: Br x d, K and V: two stages of Bc x d, 2-byte elements
    assert plan.sram_bytes == plan.smem_bytes == (br + 4 * bc) * d * 2
    assert plan.stages[0].kernel == {"wgmma": "flash_wgmma_fwd", "mma": "flash_tc_fwd"}[kernel]


@pytest.mark.parametrize("kwargs, message", [({"d": 64, "dtype": "float32"}, "float16 or bfloat16"),
                                             ({"d": 96, "dtype": "float16", "kernel": "wgmma"}, "d in"),
                                             ({"d": 264, "dtype": "float16", "kernel": "tma"}, "16 to 256"),
                                             ({"d": 128, "dtype": "float16", "kernel": "tma", "block_r": 192},
                                              "up to 64"),
                                             ({"d": 256, "dtype": "float16", "kernel": "tma", "block_c": 128},
                                              "past d 128"),
                                             ({"d": 64, "dtype": "float16", "kernel": "tma", "block_r": 256},
                                              "tma tiles"),
                                             ({"d": 60, "dtype": "float16", "kernel": "tma"}, "multiple of 8"),
                                             ({"d": 64, "dtype": "int8"}, "dtype"),
                                             ({"d": 64, "dtype": "float16", "kernel": "wmma"}, "kernel"),
                                             ({"d": 64, "dtype": "float16", "kernel": "wgmma", "block_c": 96},
                                              "wgmma tiles"),
                                             ({"d": 64, "dtype": "float16", "kernel": "mma", "block_r": 24},
                                              "multiple of 16")])
def test_unsupported_problems_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_fast_plan(N_q=128, **kwargs)


@pytest.mark.parametrize("d, tile, br, bc", [(16, 64, 192, 128), (32, 64, 192, 128), (56, 64, 192, 128),
                                             (64, 64, 192, 128), (72, 128, 128, 176), (96, 128, 128, 176),
                                             (128, 128, 128, 176), (136, 192, 128, 64), (192, 192, 128, 64),
                                             (200, 256, 128, 64), (256, 256, 128, 64)])
def test_the_tma_kernel_takes_d_in_the_next_tile(d, tile, br, bc):
    """d a multiple of 8 up to 256: the tile of the next multiple of 64; shared memory is the tile's (Q, two
    stages of K and V), the bytes are d's (the model), and the kernel gets the tile width as HEAD_D_TILE where
    it differs from d."""
    plan = make_fast_plan(N_q=300, d=d, dtype="float16", kernel="tma")
    assert (plan.tile["Br"], plan.tile["Bc"]) == (br, bc)
    assert plan.d == d and plan.smem_bytes == (br + 4 * bc) * tile * 2
    assert dict(plan.stages[0].params).get("HEAD_D_TILE") == (None if d == tile else tile)
    same = make_fast_plan(N_q=300, d=tile, dtype="float16", kernel="tma")
    assert model.exact(plan)["main"]["Q"] == (model.exact(same)["main"]["Q"][0] * d // tile, 0)  # Q once, d columns


def test_causal_d_64_takes_two_consumer_warpgroups():
    """Three warpgroups (B_r 192) at d 64 unless causal, where the diagonal's masked work grows with B_r."""
    from iokernels.plan import make_plan

    tiles = {causal: make_plan("flash", "fast", N_q=4096, d=64, dtype="float16", sram=227 * 1024, causal=causal).tile
             for causal in (False, True)}
    assert (tiles[False]["Br"], tiles[True]["Br"]) == (192, 128)


@pytest.mark.parametrize("d", [32, 96, 160, 256])
def test_make_plan_takes_the_tma_kernel_for_d_inside_a_wider_tile(d):
    from iokernels.plan import Unsupported, make_plan
    from iokernels.plan.dropout import Dropout

    for dropout in (None, Dropout(0.1, 1, 0)):
        plan = make_plan("flash", "fast", N_q=300, d=d, dtype="float16", sram=227 * 1024, dropout=dropout)
        assert plan.stages[0].kernel == "flash_tma_fwd" and plan.d == d
    with pytest.raises(Unsupported, match="d in"):
        make_fast_plan_within(227 * 1024, kernel="mma", N_q=300, d=d, dtype="float16")


def test_within_picks_the_largest_tiling_that_fits():
    tiles = [(p.stages[0].kernel, p.tile["Br"], p.tile["Bc"]) for p in
             (make_fast_plan_within(m, N_q=512, d=128, dtype="float16", kernel="wgmma")
              for m in (160 * 1024, 159 * 1024, 80 * 1024))]
    assert tiles == [("flash_wgmma_fwd", 128, 128), ("flash_wgmma_fwd", 128, 64), ("flash_tc_fwd", 64, 64)]


def test_fast_is_a_schedule_of_flash():
    from iokernels.plan import SramTooSmall, Unsupported, all_plans, make_plan

    plan = make_plan("flash", "fast", N_q=300, d=64, dtype="bfloat16", sram=96 * 1024)
    # M given is a bound; the plan records the M its tiles use (its effective M)
    assert plan.label == "flash/fast/fwd" and plan.sram_bytes == plan.smem_bytes <= 96 * 1024
    assert "flash/fast/fwd" in [p.label for p in all_plans(N_q=300, d=128, dtype="float16", sram=192 * 1024)]
    assert "flash/fast/fwd" not in [p.label for p in all_plans(N_q=300, d=128, sram=192 * 1024)]
    with pytest.raises(SramTooSmall, match="smallest M that works is 40960 bytes"):
        make_plan("flash", "fast", N_q=300, d=64, dtype="float16", sram=40959)
    with pytest.raises(Unsupported):
        make_plan("flash", "fast", N_q=300, d=64, sram=96 * 1024)
    with pytest.raises(ValueError, match="fixed"):
        make_plan("flash", "fast", N_q=300, d=64, dtype="float16", sram=96 * 1024, block_r=32)


def test_generated_wgmma_header_is_current():
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    render = runpy.run_path(str(root / "scripts" / "gen_wgmma.py"))["render"]
    assert (root / "iokernels" / "kernels" / "wgmma.cuh").read_text() == render(), \
        "run python scripts/gen_wgmma.py"


@pytest.mark.parametrize("kernel", FAST_KERNELS)
def test_grouped_query_attention_in_the_simulator(kernel):
    from iokernels.simulate import reference_outputs

    plan = make_fast_plan(N_q=200, N_k=130, d=64, dtype="float16", batch=2, heads=6, kv_heads=2, kernel=kernel)
    assert plan.bh_kv == 4 and plan.as_dict()["kv_heads"] == 2
    host = make_inputs(plan, seed=3)
    assert host["K"].shape == host["V"].shape == (4, 130, 64)
    run = simulate(plan, host)
    # each query head reads its K/V head's tiles: the bytes of ordinary attention with 6 heads
    assert run.counts == model.exact(plan) == model.exact(make_fast_plan(N_q=200, N_k=130, d=64, dtype="float16",
                                                                           batch=2, heads=6, kernel=kernel))
    want = reference_outputs(plan, host)["O"]
    assert np.max(np.abs(run.outputs["O"] - want)) < 1e-10
    # query head 5 of batch 1 uses K/V head 2 of batch 1 (group of 3)
    k, v = host["K"][3], host["V"][3]
    assert np.allclose(want[11], reference.forward(host["Q"][11], k, v)[0])


def test_grouped_query_attention_is_refused_elsewhere():
    from iokernels.plan import Unsupported, make_plan

    with pytest.raises(ValueError, match="kv_heads must divide"):
        make_fast_plan(N_q=64, d=64, dtype="float16", heads=6, kv_heads=4)
    with pytest.raises(Unsupported, match="flash/fast only"):
        make_plan("flash", "q_outer", N_q=64, d=64, sram=96 * 1024, heads=4, kv_heads=2)
    assert make_plan("flash", "fast", N_q=64, d=64, dtype="float16", sram=96 * 1024, heads=4, kv_heads=1).kv_heads == 1


def test_the_persistent_tma_grid_is_capped_at_the_sms():
    """B_r 128: one block per work item up to 132 blocks (the H100's and H200's SMs), which then take items in turn."""
    small = make_fast_plan(N_q=1000, d=128, dtype="float16", heads=3, kernel="tma")  # 8 query blocks x 3 heads
    big = make_fast_plan(N_q=16384, d=128, dtype="float16", heads=16, kernel="tma")
    assert small.stages[0].grid == (24, 1, 1) and big.stages[0].grid == (132, 1, 1)
    wide = make_fast_plan(N_q=16384, d=64, dtype="float16", heads=16, kernel="tma")  # B_r 192: a block per item
    assert wide.tile["Br"] == 192 and wide.stages[0].grid == (86, 1, 16)


def test_short_items_in_192_rows_take_the_persistent_grid():
    """make_plan's plain forward in 192-row tiles (d up to 64): the persistent grid up to TMA_WIDE_PERSISTENT_KEYS keys,
    a block per item past them; any variant, the 128-row tiles and the backward as they were; the bytes unchanged."""
    from iokernels.plan import make_plan
    from iokernels.plan.dropout import Dropout
    from iokernels.plan.fast import TMA_WIDE_PERSISTENT_KEYS

    kw = dict(d=64, dtype="float16", sram=227 * 1024, batch=4, heads=16)
    short = make_plan("flash", "fast", N_q=TMA_WIDE_PERSISTENT_KEYS, **kw)
    assert short.tile["Br"] == 192 and short.stages[0].grid == (132, 1, 1)
    assert dict(short.stages[0].params)["PERSISTENT"] == 1
    few = make_plan("flash", "fast", N_q=300, d=32, dtype="bfloat16", sram=227 * 1024, heads=2)  # 2 x 2 items
    assert few.tile["Br"] == 192 and few.stages[0].grid == (4, 1, 1) and dict(few.stages[0].params)["PERSISTENT"]
    long = make_plan("flash", "fast", N_q=300, N_k=TMA_WIDE_PERSISTENT_KEYS + 1, **kw)
    assert long.stages[0].grid == (2, 1, 64) and "PERSISTENT" not in dict(long.stages[0].params)
    per_item = make_fast_plan(N_q=TMA_WIDE_PERSISTENT_KEYS, d=64, dtype="float16", batch=4, heads=16, kernel="tma")
    assert model.exact(short) == model.exact(per_item) and per_item.stages[0].grid == (11, 1, 64)
    for variant in ({"causal": True}, {"window": (256, 0)}, {"softcap": 30.0}, {"dropout": Dropout(0.1, 1, 0)},
                    {"alibi": (0.5,) * 16}, {"direction": "bwd"}):
        plan = make_plan("flash", "fast", N_q=1024, **kw, **variant)
        params = dict(plan.stage("main").params)
        assert plan.tile["Br"] != 192 or "PERSISTENT" not in params, (variant, plan.tile, params)


def test_causal_takes_the_list_and_a_window_is_persistent():
    """Causal alone: the persistent grid taking item_list's entries (ITEM_LIST); a window: the persistent grid in
    turn (its items are alike); dropout and the per-item variants: a block per item."""
    from iokernels.plan import make_plan
    from iokernels.plan.dropout import Dropout

    kw = dict(N_q=16384, d=128, dtype="float16", sram=227 * 1024, heads=16)
    causal = make_plan("flash", "fast", causal=True, **kw).stages[0]
    window = make_plan("flash", "fast", causal=True, window=(1024, 0), **kw).stages[0]
    dropout = make_plan("flash", "fast", causal=True, dropout=Dropout(0.1, 1, 0), **kw).stages[0]
    alibi = make_plan("flash", "fast", causal=True, alibi=(0.5,) * 16, **kw).stages[0]
    assert causal.grid == (132, 1, 1) and dict(causal.params)["PERSISTENT"] == dict(causal.params)["ITEM_LIST"] == 1
    assert window.grid == (132, 1, 1) and dict(window.params)["PERSISTENT"] == 1
    assert "ITEM_LIST" not in dict(window.params)
    for stage in (dropout, alibi):
        assert stage.grid == (128, 1, 16) and not {"PERSISTENT", "ITEM_LIST"} & set(dict(stage.params))
    # the list is one of the plan's arrays (the launcher's constants), int32; ALiBi's slopes float32
    from iokernels.plan import plan_arrays
    from iokernels.plan.fast import item_list

    listed, sloped = (make_plan("flash", "fast", causal=True, **o, **kw) for o in ({}, {"alibi": (0.5,) * 16}))
    arrays = plan_arrays(listed)
    assert set(arrays) == {"work"} and arrays["work"].dtype == np.int32
    assert (arrays["work"] == item_list(listed)).all()
    assert set(plan_arrays(sloped)) == {"alibi"} and plan_arrays(sloped)["alibi"].dtype == np.float32
    # the backward: the plain causal narrow tma plan and a window's (causal or not) on the list, without HEAD_BAND;
    # the other variants and the wide tiles a block per item
    bwd = {label: make_plan("flash", "fast", direction="bwd", **{"causal": True, **kw, **o}).stage("main")
           for label, o in (("causal", {}), ("dropout", {"dropout": Dropout(0.1, 1, 0)}),
                            ("window", {"window": (1024, 0)}), ("window alone", {"window": (1024, 0), "causal": False}),
                            ("softcap", {"window": (1024, 0), "softcap": 30.0}), ("alibi", {"alibi": (0.5,) * 16}),
                            ("wide", {"d": 256}))}
    for label in ("causal", "window", "window alone"):
        params = dict(bwd[label].params)
        assert bwd[label].grid == (132, 1, 1) and params["ITEM_LIST"] == 1 and "HEAD_BAND" not in params, label
    assert dict(bwd["window"].params)["WINDOW"] == dict(bwd["window alone"].params)["WINDOW"] == 1
    for label in ("dropout", "softcap", "alibi", "wide"):
        assert "ITEM_LIST" not in dict(bwd[label].params) and bwd[label].grid[2] == 16, label


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize(("n_q", "n_k", "causal", "batch", "heads", "kv_heads", "d"),
                         [(4096, 4096, "bottom_right", 4, 16, 16, 128), (300, 1000, "top_left", 2, 3, 3, 64),
                          (1000, 300, "bottom_right", 3, 4, 2, 96), (65536, 65536, "top_left", 1, 4, 1, 128),
                          (100, 100, "bottom_right", 1, 1, 1, 64)])
def test_item_list_takes_every_item_once_and_balances_the_blocks(n_q, n_k, causal, batch, heads, kv_heads, d,
                                                                 direction):
    """item_list: G + 1 increasing offsets ending at the items' count (T_r·BH forward, T_c·BH_kv backward), every
    item z·T + x once, and no block's cost (the item's steps + the overhead, per item) past the least loaded one's by
    more than the longest item's (a list schedule's bound). A forward item's steps: the key tiles its query block
    visits; a backward one's: the query blocks that visit its key block, times the query heads of its K/V head."""
    from iokernels.plan import make_plan
    from iokernels.plan.causal import key_block_ranges
    from iokernels.plan.fast import ITEM_OVERHEAD_STEPS, item_list

    plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * 1024, batch=batch,
                     heads=heads, kv_heads=kv_heads, causal=causal, direction=direction)
    assert dict(plan.stage("main").params).get("ITEM_LIST") == 1
    ranges = key_block_ranges(n_q, n_k, plan.tile["Br"], plan.tile["Bc"], plan.causal)
    if direction == "fwd":
        t, items, steps = plan.tile["Tr"], plan.tile["Tr"] * plan.bh, [b - a for a, b in ranges]
    else:
        group = heads // kv_heads
        t, items = plan.tile["Tc"], plan.tile["Tc"] * plan.bh_kv
        steps = [group * sum(1 for a, b in ranges if a <= x < b) for x in range(t)]
    blocks = plan.stage("main").grid[0]
    assert blocks == min(items, 132)
    work = item_list(plan)
    offsets, entries = work[:blocks + 1], work[blocks + 1:]
    assert work.dtype == np.int32 and offsets[0] == 0 and offsets[-1] == len(entries) == items
    assert (np.diff(offsets) >= 1).all()  # (no block without an item: G <= the items)
    assert sorted(entries.tolist()) == list(range(items))
    cost = [sum(steps[e % t] + ITEM_OVERHEAD_STEPS for e in entries[a:b]) for a, b in itertools.pairwise(offsets)]
    assert max(cost) - min(cost) <= max(steps) + ITEM_OVERHEAD_STEPS



def test_unmasked_d_72_to_128_takes_176_keys_a_tile_and_masks_keep_128():
    """The tma forward's 128 x 176 tile (FlashAttention-3's, timed in results/h100/issue21/bc176/) is the default at
    d 72-128 without a mask only: causal plans, windows and dropout keep 128 keys a tile, d 64 its 192 x 128 (128 x 128
    with a mask), and 176 is refused where its registers would not suffice (B_r 192, past d 128) and with dropout."""
    from iokernels.plan import make_plan
    from iokernels.plan.dropout import Dropout

    kw = dict(N_q=4096, dtype="float16", sram=227 * 1024, heads=16)
    options = {"dense": {}, "causal": {"causal": True}, "window": {"window": (512, 512)},
               "dropout": {"dropout": Dropout(0.1, 1, 0)}}
    got = {(d, label): (make_plan("flash", "fast", d=d, **o, **kw).tile["Br"],
                        make_plan("flash", "fast", d=d, **o, **kw).tile["Bc"])
           for d in (64, 72, 128) for label, o in options.items()}
    masked = {"causal": (128, 128), "window": (128, 128)}
    want = {(64, "dense"): (192, 128), **{(64, k): v for k, v in masked.items()}}
    for d in (72, 128):
        want |= {(d, "dense"): (128, 176), **{(d, k): v for k, v in masked.items()}}
    assert {k: v for k, v in got.items() if k[1] != "dropout"} == want
    assert all(got[d, "dropout"][1] != 176 for d in (64, 72, 128))
    for bad in ({"block_r": 192, "d": 64}, {"d": 192}):
        with pytest.raises(ValueError, match="176"):
            make_fast_plan(N_q=128, dtype="float16", kernel="tma", block_c=176, **{"block_r": 128, **bad})
    with pytest.raises(ValueError, match="176"):
        make_fast_plan(N_q=128, d=128, dtype="float16", kernel="tma", block_c=176, dropout=True)
