"""Block-sparse attention on flash/fast (issue #22: the tma kernels' BLOCK_SPARSE): the plans (the tma kernels; the
forward a persistent grid on a list of its items balanced by their kept tiles, the backward a block per work item;
the kept tiles' list's size), the simulator's bytes == model.exact (the block mask read once per batch·head forward
and once per K/V head backward) and its outputs == the float64 reference with the block mask, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

from iokernels import model
from iokernels.plan import Unsupported, make_plan, pair_sums
from iokernels.plan.masks import pattern
from iokernels.plan.variants import BLOCK_LIST, FAST_SPARSE_BLOCK
from iokernels.simulate import make_inputs, max_relative_error, reference_outputs, simulate

KB = 1024


def _plan(direction, n_q=300, n_k=400, d=64, causal="", heads=4, kv_heads=2, density=0.4, block=128, **kw):
    mask = pattern("random", density, n_q=n_q, n_k=n_k, block_q=block, seed=n_q + d)
    return make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * KB, heads=heads,
                     kv_heads=kv_heads, causal=causal, block_mask=mask, direction=direction, **kw)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("causal", ["", "top_left", "bottom_right"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_simulator_bytes_equal_the_model_and_outputs_the_reference(direction, causal, d):
    plan = _plan(direction, d=d, causal=causal)
    main = plan.stage("main")
    params = dict(main.params)
    assert main.kernel.startswith("flash_tma") and params["BLOCK_SPARSE"] == 1
    assert params["BLOCK_LIST"] == BLOCK_LIST[main.kernel]
    # the forward: the list's persistent grid (its items' kept tiles balanced); the backward a block per item
    assert ("PERSISTENT" in params) == ("ITEM_LIST" in params) == (direction == "fwd")
    assert FAST_SPARSE_BLOCK % plan.tile["Br"] == 0 and FAST_SPARSE_BLOCK % plan.tile["Bc"] == 0
    inputs = make_inputs(plan, seed=d)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    assert max_relative_error(result.outputs, reference_outputs(plan, inputs)) < 1e-10
    # the block mask's bytes: one per pair a loop visits, per batch·head (forward) or K/V head (backward)
    rows = plan.bh if direction == "fwd" else plan.bh_kv
    assert result.counts["main"]["block_mask"] == (rows * pair_sums(plan)["N_bm"], 0)


def test_kept_fraction_scales_the_streamed_reads():
    dense = _plan("fwd", n_q=4096, n_k=4096, density=1.0, heads=1, kv_heads=1)
    sparse = _plan("fwd", n_q=4096, n_k=4096, density=0.25, heads=1, kv_heads=1)
    k = model.per_tensor(model.exact(sparse))["K"][0] / model.per_tensor(model.exact(dense))["K"][0]
    assert k == pytest.approx(sparse.block_mask.density)
    assert model.predict(sparse).flops / model.predict(dense).flops == pytest.approx(sparse.block_mask.density)


def test_refusals():
    with pytest.raises(Unsupported, match="multiple of 128, not the block mask's 64x64"):
        _plan("fwd", block=64)
    with pytest.raises(Unsupported, match="sliding window"):
        _plan("bwd", window=(100, 0))
    with pytest.raises(Unsupported, match="lists at most 1024"):
        _plan("fwd", n_q=128, n_k=1025 * 128, heads=1, kv_heads=1, density=0.01)
    with pytest.raises(Unsupported, match="lists at most 512"):
        _plan("bwd", n_q=513 * 64, n_k=128, d=256, heads=1, kv_heads=1, density=0.01)
    from iokernels.plan.fast import make_fast_plan
    from iokernels.plan.variants import with_block_mask

    plain = make_fast_plan(N_q=256, d=64, dtype="float16", kernel="mma")
    with pytest.raises(Unsupported, match="tma kernels"):
        with_block_mask(plain, pattern("random", 0.5, n_q=256, n_k=256))
    persistent = make_fast_plan(N_q=256, d=128, dtype="float16", kernel="tma", block_c=128)
    assert dict(persistent.stage("main").params).get("PERSISTENT")
    with pytest.raises(Unsupported, match="persistent"):
        with_block_mask(persistent, pattern("random", 0.5, n_q=256, n_k=256))


def test_the_library_takes_the_fast_path():
    from iokernels.library.planning import choose_plan

    mask = pattern("random", 0.5, n_q=1000, n_k=1000)
    for direction in ("fwd", "bwd"):
        plan, expanded = choose_plan(direction, "flash", None, 1000, 1000, 128, "float16", (2, 4), None, 1,
                                     "bottom_right", block_mask=mask)
        assert plan.schedule == "fast" and plan.block_mask is mask and not expanded
    small = pattern("random", 0.5, n_q=1000, n_k=1000, block_q=64)  # the research kernels' then
    plan, _ = choose_plan("fwd", "flash", None, 1000, 1000, 128, "float16", (2, 4), None, 1, "", block_mask=small)
    assert plan.schedule != "fast" and np.all(plan.block_grid() == small.refine(plan.tile["Br"], plan.tile["Bc"]))


@pytest.mark.parametrize("causal", ["", "top_left"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_the_forward_takes_a_list_balanced_by_the_kept_tiles(causal, d):
    """A block mask's forward (no dropout, ALiBi or mods): the persistent grid (at most 132 blocks, no HEAD_BAND) on
    item_list, every item once, and its steps the kept tiles of the item's row (counted here from the boolean blocks,
    causal top-left: the blocks on or below the diagonal), so no block's cost passes the least loaded one's by more
    than the longest item's. With dropout, ALiBi or a variant the forward keeps a block per item."""
    import itertools

    from iokernels.plan.dropout import Dropout
    from iokernels.plan.fast import ITEM_OVERHEAD_STEPS, item_list
    from iokernels.plan.masks import BlockMask

    n, heads, batch = 4096, 8, 3
    rng = np.random.default_rng(d)
    blocks = rng.random((n // 128, n // 128)) < 0.3
    mask = BlockMask.from_array(blocks, n_q=n, n_k=n, block_q=128, block_k=128)
    kw = dict(N_q=n, d=d, dtype="float16", sram=227 * KB, heads=heads, batch=batch, causal=causal, block_mask=mask)
    plan = make_plan("flash", "fast", **kw)
    params, t = dict(plan.stage("main").params), plan.tile["Tr"]
    assert (plan.tile["Br"], plan.tile["Bc"]) == (128, 128 if d <= 128 else 64)
    assert params["ITEM_LIST"] == 1 and params["PERSISTENT"] == 1 and "HEAD_BAND" not in params
    blocks_g = plan.stage("main").grid
    assert blocks_g == (min(t * batch * heads, 132), 1, 1)
    kept = blocks if plan.tile["Bc"] == 128 else np.repeat(blocks, 2, axis=1)  # (64-key tiles: two a block)
    if causal:
        kept = kept & (np.arange(kept.shape[1])[None, :] * plan.tile["Bc"] < (np.arange(t)[:, None] + 1) * 128)
    steps = kept.sum(axis=1)
    work = item_list(plan)
    g = blocks_g[0]
    offsets, entries = work[:g + 1], work[g + 1:]
    assert sorted(entries.tolist()) == list(range(t * batch * heads))
    cost = [sum(int(steps[e % t]) + ITEM_OVERHEAD_STEPS for e in entries[a:b]) for a, b in itertools.pairwise(offsets)]
    assert max(cost) - min(cost) <= steps.max() + ITEM_OVERHEAD_STEPS
    # the simulator's bytes == the model's on a small problem of the same kind (N 512, one batch row, two heads)
    small_mask = BlockMask.from_array(blocks[:4, :4], n_q=512, n_k=512, block_q=128, block_k=128)
    small = make_plan("flash", "fast", **{**kw, "N_q": 512, "heads": 2, "batch": 1, "block_mask": small_mask})
    assert dict(small.stage("main").params)["ITEM_LIST"] == 1
    assert simulate(small, make_inputs(small, seed=d)).counts == model.exact(small)
    for other in ({"dropout": Dropout(0.1, 1, 0)}, *([{"alibi": (0.5,) * heads}] if d <= 128 else [])):
        params = dict(make_plan("flash", "fast", **kw, **other).stage("main").params)
        assert "ITEM_LIST" not in params and "PERSISTENT" not in params, other
