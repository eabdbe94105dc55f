"""plan.decode: the split count of a decode call (the least modelled time, one wave of long blocks first), the key
tiles of each split, and the split-KV decode plan with its exact bytes (the model) equal to the simulator's, its outputs
to the float64 reference, and the arguments its kernels are launched with (CPU; the kernels run in
tests/gpu/test_decode.py)."""

from itertools import pairwise

import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import Unsupported
from iokernels.plan.core import FLOAT32_TENSORS
from iokernels.plan.decode import BLOCK_TILES, make_decode_plan, num_splits, split_ranges
from iokernels.simulate import make_inputs, max_relative_error, reference_outputs, simulate


def test_the_split_count_of_least_modelled_time():
    # one token, B 1, 8 K/V heads (8 blocks), 132 SMs, N_k 16384 in tiles of 128 -> 128 key tiles: 16 splits run
    # 128 blocks in one wave of 8 tiles each (+ 1 for the block), + 1 for the combine's launch = 10; 15 splits
    # take 9 tiles a block (11); 32 splits two waves of 4 (11)
    assert BLOCK_TILES == 1.0
    assert num_splits(8, 132, 128) == 16
    # N_k 4096 (32 tiles): 16 splits of 2 tiles (4); FlashAttention-3's rule took 14, 11 after evening (5)
    assert num_splits(8, 132, 32) == 16
    # partials that cost a tile pair per split: 10 splits of 13 tiles (14 + 1 + 10; 16 splits: 9 + 1 + 16; 11 splits
    # of 12 tie with 10: the smaller)
    assert num_splits(8, 132, 128, partial_tiles=1.0) == 10


def test_one_wave_of_long_blocks_before_several_of_short_ones():
    # B 1, N_k 131072 (1024 tiles): 16 splits, one wave of 64 tiles (65 + 1); 49 splits, three waves of 21 (66 + 1)
    assert num_splits(8, 132, 1024) == 16
    # B 4 (32 blocks): 4 splits, one wave of 256 (257 + 1); 41 splits, ten waves of 25 (260 + 1)
    assert num_splits(32, 132, 1024) == 4
    # B 16 (128 blocks): no split (1025); 38 splits, 37 waves of 27 (1036 + 1)
    assert num_splits(128, 132, 1024) == 1
    # B 64 (512 blocks), N_k 65536 (512 tiles): 9 splits, 35 waves of 57 (2030 + 1) against 4 waves of 512 (2052)
    assert num_splits(512, 132, 512) == 9


def test_no_split_when_the_grid_is_full_or_the_keys_are_few():
    # B 64, 8 K/V heads, N_k 4096, d 128 fp16: 4 waves of 32 tiles (132); 2 splits: 8 waves of 16, and the combine;
    # 32 splits: 125 waves of one tile, the combine and 32 splits' partials (0.49 tile pairs each: 2·64·64·129·4
    # bytes over 132 SMs' 64 KB tile pairs)
    assert num_splits(512, 132, 32, partial_tiles=0.49) == 1
    # free partials: 32 splits' 125 waves of one tile would still lose to the blocks' own starts and ends (BLOCK_TILES
    # a block: 125 x 2 + 1 against 4 x 33)
    assert num_splits(512, 132, 32) == 1
    assert num_splits(8, 132, 1) == 1
    assert num_splits(8, 132, 2) == 1  # 2 tiles alone, or 1 tile each and the combine's launch: a tie
    assert num_splits(8, 132, 1000, max_splits=4) == 4
    with pytest.raises(ValueError, match="sms"):
        num_splits(8, 0, 32)


@pytest.mark.parametrize("tiles, splits", [(32, 14), (128, 15), (7, 3), (1, 5), (10, 10), (5, 1)])
def test_split_ranges_cover_every_tile_once_and_none_is_empty(tiles, splits):
    ranges = split_ranges(tiles, splits)
    assert ranges[0][0] == 0 and ranges[-1][1] == tiles and len(ranges) <= splits
    assert all(a < b for a, b in ranges) and all(b == c for (_, b), (c, _) in pairwise(ranges))
    assert split_ranges(32, 14) == [(i, min(i + 3, 32)) for i in range(0, 32, 3)]  # c = 3: 11 splits
    assert split_ranges(0, 3) == []


# ---------------------------------------------------------------------------------------------
# the split-KV decode plan, its model and its simulator

@pytest.mark.parametrize("kw", [
    dict(N_q=1, N_k=1000, d=64, heads=8, kv_heads=2, batch=2),  # default splits (8 tiles of 128: 4)
    dict(N_q=5, N_k=300, d=32, heads=4, kv_heads=4),  # 3 key tiles: one split ("packed")
    dict(N_q=3, N_k=777, d=96, heads=48, kv_heads=2, splits=4),  # 72 packed rows in a tile of 128 (d in 128)
    dict(N_q=16, N_k=2000, d=128, heads=16, kv_heads=1, splits=3),  # 256 packed rows: two tiles re-read K/V
    dict(N_q=2, N_k=129, d=256, heads=2, kv_heads=1, splits=9),  # B_c 64: 3 tiles, 3 splits of one
])
def test_simulator_equals_model_and_reference(kw):
    plan = make_decode_plan(dtype="float16", **kw)
    inputs = make_inputs(plan, seed=1)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    assert max_relative_error(result.outputs, reference_outputs(plan, inputs)) < 1e-12


def test_the_decode_bytes_by_hand():
    """One token, 64 query heads over 8 K/V heads, N_k 16384, d 128, fp16, 15 splits; K and V read once per K/V
    head (one packed tile of 8 rows), Q once per split, the partials written and read back in float32."""
    plan = make_decode_plan(N_q=1, N_k=16384, d=128, dtype="float16", heads=64, kv_heads=8, splits=15)
    assert plan.variant == "split" and plan.tile["S"] == 15 and [s.name for s in plan.stages] == ["main", "combine"]
    got = model.exact(plan)
    kv = 8 * 16384 * 128 * 2
    assert got["main"] == {"Q": (15 * 64 * 128 * 2, 0), "K": (kv, 0), "V": (kv, 0),
                           "Opart": (0, 15 * 64 * 128 * 4), "lse_part": (0, 15 * 64 * 4)}
    assert got["combine"] == {"O": (0, 64 * 128 * 2), "lse": (0, 64 * 4), "Opart": (15 * 64 * 128 * 4, 0),
                              "lse_part": (15 * 64 * 4, 0)}
    # the rest against the K/V bytes: 1.9 % here (about 2.5·S·g·N_q / N_k = 1.8 %, the design note's estimate)
    overhead = sum(r + w for t, (r, w) in got["main"].items() if t not in ("K", "V")) + sum(
        r + w for r, w in got["combine"].values())
    assert 0.018 < overhead / (2 * kv) < 0.02


def test_a_full_grid_does_not_split():
    plan = make_decode_plan(N_q=4, N_k=4096, d=128, dtype="float16", batch=32, heads=16)  # 512 packed tiles
    assert plan.variant == "packed" and [s.name for s in plan.stages] == ["main"]
    with pytest.raises(ValueError, match="splits"):
        make_decode_plan(N_q=1, N_k=64, d=64, dtype="float16", splits=0)


def test_the_kernel_split_rule_gives_the_plans_ranges():
    """flash_tma.cu's split s takes key tiles [s c, s c + c), c = ⌈T_c / S⌉ with S the plan's (non-empty) split count:
    the ranges split_ranges made for the split count asked for."""
    for tiles in range(1, 400):
        for asked in range(1, 140):
            ranges = split_ranges(tiles, asked)
            c = -(-tiles // len(ranges))
            assert ranges == [(s * c, min(s * c + c, tiles)) for s in range(len(ranges))], (tiles, asked)


def test_decode_launch_arguments():
    """The main kernel sees each K/V head's g query heads as one head of g·N_q rows (Q's map, n_q, kv_group 1, bh the
    K/V heads); the partials are one float32 (B·H, N_q[, d]) tensor per split; the combine takes the output rows and
    S."""
    plan = make_decode_plan(N_q=2, N_k=5000, d=96, dtype="bfloat16", batch=3, heads=16, kv_heads=4, splits=5)
    main, combine = plan.stages
    assert (main.kernel, main.grid, main.threads, combine.kernel) == ("flash_tma_split", (1, 5, 12), 256,
                                                                      "flash_combine")  # B_r 64: 8 packed rows
    args, dropout = launch.stage_arg_layout(plan, main, 0.5)
    q_map = args[0]
    assert (q_map.buffer, q_map.bh, q_map.n, q_map.d, q_map.rows) == ("Q", 12, 8, 96, 64)
    assert args[3:] == ("Opart", "lse_part", 8, 5000, 0.5, 1, 12) and not dropout
    assert args[1].bh == 12 and args[1].n == 5000 and args[1].rows == 128  # K: a box of B_c rows per K/V head
    assert launch.stage_arg_layout(plan, combine, 0.5) == (("Opart", "lse_part", "O", "lse", 3 * 16 * 2, 5, 5000),
                                                           False)
    assert launch.tensor_shape(plan, "Opart") == (5 * 48, 2, 96) and launch.tensor_shape(plan, "lse_part") == (240, 2)
    assert {"Opart", "lse_part"} <= FLOAT32_TENSORS
    assert launch.plan_tensors(plan) == ["Q", "K", "V", "Opart", "lse_part", "O", "lse"]


def test_one_split_is_the_persistent_forward_on_the_packed_rows():
    plan = make_decode_plan(N_q=1, N_k=4096, d=128, dtype="float16", batch=64, heads=64, kv_heads=8)
    (main,) = plan.stages
    assert plan.variant == "packed" and main.kernel == "flash_tma_fwd" and dict(main.params)["PERSISTENT"] == 1
    assert main.grid == (132, 1, 1)  # 512 packed tiles over the persistent grid
    args, _ = launch.stage_arg_layout(plan, main, 0.5)
    assert (args[0].bh, args[0].n) == (512, 8) and args[3:] == ("O", "lse", 8, 4096, 0.5, 1, 512)


def test_decode_plans_run_on_the_tma_kernels_only():
    with pytest.raises(Unsupported, match="tma"):
        make_decode_plan(N_q=1, N_k=64, d=64, dtype="float32")


def test_decode_row_tile():
    """B_r 64 (one consumer warpgroup) where the packed rows fit it, d ≤ 128, and the grid is split or a block per item;
    B_r 128 past 64 rows, past d 128, and in the persistent grid (one split, no cache)."""
    from iokernels.plan.kvcache import make_kv_cache

    def br(**kw):
        plan = make_decode_plan(**{"N_k": 65536, "d": 128, "dtype": "float16", "batch": 1, "heads": 64, **kw})
        main = plan.stage("main")
        assert main.threads == 2 * dict(plan.tiles)["Br"] + 128
        return dict(plan.tiles)["Br"], main.kernel

    assert br(N_q=1, kv_heads=8) == (64, "flash_tma_split")  # 8 packed rows
    assert br(N_q=8, kv_heads=8) == (64, "flash_tma_split")  # 64
    assert br(N_q=9, kv_heads=8) == (128, "flash_tma_split")  # 72
    assert br(N_q=1, kv_heads=8, d=256) == (128, "flash_tma_split")
    assert br(N_q=1, kv_heads=64, N_k=128, splits=1) == (128, "flash_tma_fwd")  # persistent
    cache = make_kv_cache(batch=1, n_k=4096)
    assert br(N_q=1, kv_heads=64, N_k=4096, splits=1, kv_cache=cache) == (64, "flash_tma_fwd")  # a block per item
