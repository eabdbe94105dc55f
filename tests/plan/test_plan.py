import dataclasses
import itertools
import math

import pytest

from iokernels import model
from iokernels.model.specs import list_specs
from iokernels.plan import SCHEDULES, SramTooSmall, Unsupported, all_plans, make_plan, min_sram

KEYS = [(a, s, p) for (a, p), ss in SCHEDULES.items() for s in ss]


@pytest.mark.parametrize("algorithm, schedule, direction", KEYS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("d", [16, 64, 136, 256])
@pytest.mark.parametrize("sram", [8 * 1024, 48 * 1024, 100 * 1024, 192 * 1024, 227 * 1024])
def test_smem_never_exceeds_m(algorithm, schedule, direction, dtype, d, sram):
    try:
        plan = make_plan(algorithm, schedule, N_q=1000, N_k=517, d=d, dtype=dtype, sram=sram,
                         direction=direction)
    except SramTooSmall as exc:
        assert exc.min_bytes > sram
        return
    except Unsupported:
        assert schedule == "fast" and (dtype == "float32" or d not in (64, 128))
        return
    assert 0 < plan.smem_bytes <= sram
    for stage in plan.stages:
        # buffers laid out without overlap, 16-byte aligned
        spans = sorted((off, off + size) for _, off, size in stage.smem)
        assert all(off % 16 == 0 for off, _ in spans)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
        assert stage.threads % 32 == 0 and stage.blocks >= 1


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_paper_tiles_when_they_fit(dtype):
    # float32 at M = 192 KB leaves room for Algorithm 1's tiles as the paper states them
    sram, d = 192 * 1024, 64
    plan = make_plan("flash", "kv_outer", N_q=4096, d=d, dtype=dtype, sram=sram)
    m_el = sram // plan.itemsize
    b = math.ceil(m_el / (4 * d))
    if dtype == "float32":
        assert (plan.tile["Bc"], plan.tile["Br"]) == (b, min(b, d))
    else:  # float32 accumulators do not fit beside a 384-row K/V block: B_c shrinks, B_r stays
        assert plan.tile["Br"] == min(b, d) and plan.tile["Bc"] < b
        bigger = dataclasses.replace(plan)  # frozen plans compare by value
        assert bigger == plan and hash(bigger) == hash(plan)
    assert plan.tile["Tc"] == math.ceil(4096 / plan.tile["Bc"])
    assert plan.stage("main").grid == (1, 1, 1)


def test_q_outer_swaps_the_roles():
    kv = make_plan("flash", "kv_outer", N_q=4096, d=64, sram=192 * 1024)
    q = make_plan("flash", "q_outer", N_q=4096, d=64, sram=192 * 1024)
    assert (q.tile["Br"], q.tile["Bc"]) == (kv.tile["Bc"], kv.tile["Br"])
    assert q.stage("main").grid == (q.tile["Tr"], 1, 1)


def test_tiles_grow_with_m_and_grid_covers_ragged_n():
    small = make_plan("flash", "q_outer", N_q=1000, d=64, sram=32 * 1024, batch=2, heads=3)
    large = make_plan("flash", "q_outer", N_q=1000, d=64, sram=128 * 1024, batch=2, heads=3)
    assert large.tile["Br"] > small.tile["Br"]
    for p in (small, large):
        assert p.tile["Tr"] * p.tile["Br"] >= 1000 > (p.tile["Tr"] - 1) * p.tile["Br"]
        assert p.stage("main").grid == (p.tile["Tr"], 1, 6)


@pytest.mark.parametrize("algorithm, schedule, direction", KEYS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_smallest_m_is_exact(algorithm, schedule, direction, dtype):
    if schedule == "fast" and dtype == "float32":
        pytest.skip("flash/fast takes float16/bfloat16")
    need = min_sram(algorithm, schedule, d=128, dtype=dtype, direction=direction)
    plan = make_plan(algorithm, schedule, N_q=300, d=128, dtype=dtype, sram=need, direction=direction)
    assert plan.smem_bytes <= need
    with pytest.raises(SramTooSmall, match=f"smallest M that works is {need} bytes"):
        make_plan(algorithm, schedule, N_q=300, d=128, dtype=dtype, sram=need - 1, direction=direction)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_all_plans_names_the_largest_need(dtype):
    keys = [k for k in KEYS if k[1] != "fast" or dtype != "float32"]  # flash/fast: half precision only
    need = max(min_sram(a, s, d=64, dtype=dtype, direction=p) for a, s, p in keys)
    with pytest.raises(SramTooSmall, match=f"is {need} bytes"):
        all_plans(N_q=10, d=64, dtype=dtype, sram=need - 1, backward=True)
    assert len(all_plans(N_q=10, d=64, dtype=dtype, sram=need, backward=True)) == len(keys)


def test_every_gpu_limit_is_enforced():
    for spec in list_specs():
        make_plan("flash", N_q=64, d=64, sram=spec.smem_per_block_bytes, smem_limit=spec.smem_per_block_bytes)
        with pytest.raises(ValueError, match="exceeds the GPU's per-block shared-memory limit"):
            make_plan("flash", N_q=64, d=64, sram=spec.smem_per_block_bytes + 1,
                      smem_limit=spec.smem_per_block_bytes)


@pytest.mark.parametrize("kwargs, message", [
    ({"N_q": 0}, "N_q must be an integer >= 1"),
    ({"N_k": -3}, "N_k must be an integer >= 1"),
    ({"d": 12}, "unsupported head dimension d=12"),
    ({"d": 264}, "unsupported head dimension"),
    ({"d": 60}, "multiple of 8"),
    ({"dtype": "float64"}, "unsupported dtype 'float64'"),
    ({"batch": 0}, "batch must be"),
    ({"sram": 0}, "sram must be a positive"),
])
def test_bad_input(kwargs, message):
    args = {"N_q": 128, "d": 64, "sram": 49152} | kwargs
    with pytest.raises(ValueError, match=message):
        make_plan("flash", **args)


def test_bad_schedule_and_direction():
    with pytest.raises(ValueError, match="unknown schedule 'store' for flash fwd"):
        make_plan("flash", "store", N_q=8, d=16, sram=49152)
    with pytest.raises(ValueError, match="two_pass' has no bwd pass"):
        make_plan("two_pass", N_q=8, d=16, sram=49152, direction="bwd")
    with pytest.raises(ValueError, match="unknown algorithm"):
        make_plan("linear", N_q=8, d=16, sram=49152)


@pytest.mark.parametrize("algorithm, schedule, direction", KEYS)
def test_plan_and_model_name_the_same_stages(algorithm, schedule, direction):
    plan = make_plan(algorithm, schedule, N_q=100, d=64, dtype="float16", sram=65536, direction=direction)
    assert [s.name for s in plan.stages] == list(model.io_exprs(algorithm, schedule, direction))


# ---------------------------------------------------------------------------------------------
# forced tiles (block_r / block_c): the block-size study

@pytest.mark.parametrize("algorithm, schedule, direction", [k for k in KEYS if k[0] != "standard" and k[1] != "fast"])
@pytest.mark.parametrize("which", ["block_r", "block_c", "both"])
def test_forced_tiles_are_used_and_counted_exactly(algorithm, schedule, direction, which):
    from iokernels.simulate import make_inputs, simulate

    forced = {"block_r": {"block_r": 24}, "block_c": {"block_c": 40}, "both": {"block_r": 9, "block_c": 50}}[which]
    plan = make_plan(algorithm, schedule, N_q=130, N_k=101, d=32, sram=64 * 1024, direction=direction, **forced)
    tile = plan.tile
    assert tile["Br"] == forced.get("block_r", tile["Br"]) and tile["Bc"] == forced.get("block_c", tile["Bc"])
    assert (tile["Tr"], tile["Tc"]) == (math.ceil(130 / tile["Br"]), math.ceil(101 / tile["Bc"]))
    assert plan.smem_bytes <= 64 * 1024
    default = make_plan(algorithm, schedule, N_q=130, N_k=101, d=32, sram=64 * 1024, direction=direction)
    assert plan.tiles != default.tiles  # the override changed something
    assert simulate(plan, make_inputs(plan)).counts == model.exact(plan)


def test_the_free_tile_follows_the_rule():
    # kv_outer keeps B_c resident: with B_c forced, B_r = min(B_c, d) when it fits ...
    assert make_plan("flash", "kv_outer", N_q=1024, d=64, sram=227 * 1024, block_c=128).tile["Br"] == 64
    assert make_plan("flash", "kv_outer", N_q=1024, d=64, sram=227 * 1024, block_c=16).tile["Br"] == 16
    # ... and shrinks to fit beside a big resident block (float16: K, V of 512 rows take 128 KB)
    big = make_plan("flash", "kv_outer", N_q=1024, d=64, dtype="float16", sram=227 * 1024, block_c=512)
    assert big.tile["Bc"] == 512 and 1 <= big.tile["Br"] < 64 and big.smem_bytes <= 227 * 1024
    # q_outer keeps B_r resident: B_c = min(B_r, d), shrunk to fit
    assert make_plan("flash", "q_outer", N_q=1024, d=64, sram=227 * 1024, block_r=128).tile["Bc"] == 64
    # the resident tile, when only the streamed one is forced, follows M: ceil(M_el / 4d) at most
    free = make_plan("flash", "q_outer", N_q=4096, d=64, sram=192 * 1024, block_c=32)
    assert free.tile["Bc"] == 32 and free.tile["Br"] <= math.ceil(192 * 1024 // 4 / (4 * 64))


@pytest.mark.parametrize("kwargs, message", [
    ({"block_c": 512}, r"forced tiles B_c=512 do not fit in --sram 232448 bytes for flash/kv_outer/fwd"),
    ({"block_r": 512, "schedule": "q_outer"}, r"B_r=512, B_c=1 need \d+ bytes"),
    ({"block_r": 200, "block_c": 200}, "do not fit"),
    ({"block_c": 0}, "block_c must be an integer >= 1"),
    ({"block_r": 2.5}, "block_r must be an integer >= 1"),
    ({"block_c": 64, "algorithm": "standard", "schedule": None}, "standard attention has none"),
])
def test_forced_tiles_that_do_not_fit_are_rejected(kwargs, message):
    from iokernels.plan import TilesDoNotFit

    args = {"algorithm": "flash", "schedule": "kv_outer", "N_q": 1024, "d": 64, "sram": 227 * 1024} | kwargs
    with pytest.raises(ValueError, match=message) as info:
        make_plan(args.pop("algorithm"), args.pop("schedule"), **args)
    assert isinstance(info.value, TilesDoNotFit) == ("fit" in message or "need" in message)
