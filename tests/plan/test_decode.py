"""plan.decode: the split count of a decode call (FlashAttention-3's rule) and the key tiles of each split."""

from itertools import pairwise

import pytest

from iokernels.plan.decode import num_splits, split_ranges


def test_the_rules_worked_example_and_the_decode_cases():
    # 48 query tiles on 108 SMs: 2 splits fill 0.89 of a wave, 3 only 0.67 of two; the best (9 splits, 4 full
    # waves) is 1.0, and 2 is the smallest within 85 % of it
    assert num_splits(48, 108, 64) == 2
    # one token, B 1, 8 K/V heads (8 query tiles), 132 SMs: N_k 16384 in tiles of 128 -> 128 key tiles: S = 15
    # (8·15/132 = 0.91 of a wave, the first S within 85 % of the best, 1.0 at S = 33)
    assert num_splits(8, 132, 128) == 15
    # N_k 4096 (32 key tiles): S at most 32, the best 16 (0.97): 14 is the first >= 0.85 x 0.97
    assert num_splits(8, 132, 32) == 14


def test_no_split_when_the_grid_is_full_or_the_keys_are_few():
    assert num_splits(106, 132, 1000) == 1  # 106 >= 0.8 x 132
    assert num_splits(8, 132, 4) == 1
    # a full grid splits only when one K/V head outgrows the L2 and is reread by >= 2·SMs query tiles, not masked
    assert num_splits(200, 132, 1000, kv_head_bytes=120 * 2**20, rows_per_head_tiles=300) == 3
    assert num_splits(200, 132, 1000, kv_head_bytes=120 * 2**20, rows_per_head_tiles=300, masked=True) == 1
    assert num_splits(200, 132, 1000, kv_head_bytes=120 * 2**20, rows_per_head_tiles=100) == 1
    with pytest.raises(ValueError, match="sms"):
        num_splits(8, 0, 32)


@pytest.mark.parametrize("tiles, splits", [(32, 14), (128, 15), (7, 3), (1, 5), (10, 10), (5, 1)])
def test_split_ranges_cover_every_tile_once_and_none_is_empty(tiles, splits):
    ranges = split_ranges(tiles, splits)
    assert ranges[0][0] == 0 and ranges[-1][1] == tiles and len(ranges) <= splits
    assert all(a < b for a, b in ranges) and all(b == c for (_, b), (c, _) in pairwise(ranges))
    assert split_ranges(32, 14) == [(i, min(i + 3, 32)) for i in range(0, 32, 3)]  # c = 3: 11 splits
    assert split_ranges(0, 3) == []
