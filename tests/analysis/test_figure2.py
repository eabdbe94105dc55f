"""Figure 2's predicted columns, block sizes, slope and knee (CPU only; expected values by hand)."""

import math

import pytest

from iokernels.analysis import figure2
from iokernels.model import get_spec
from iokernels.plan import TilesDoNotFit, make_plan

H200 = get_spec("h200")
GPT2 = figure2.Problem(N=1024, d=64, batch=64, heads=16, dtype="float16", sram=H200.smem_per_block_bytes)
N, D, BH = 1024, 64, 64 * 16
E = 2  # float16


@pytest.fixture(scope="module")
def predicted():
    return figure2.build(GPT2, H200, figure2.PANELS, header={"reason": "test"})


def test_left_gflops_by_hand(predicted):
    # one N x N x d matrix product is 2·N²·d FLOPs per batch-head; standard: 2 forward (QKᵀ, PV) + 4 backward
    # (dV, dP, dQ, dK) products; flash: the same plus S = QKᵀ recomputed in the backward
    product = 2 * N * N * D * BH
    rows = predicted["left"]["rows"]
    assert rows[0]["row"] == "standard"
    assert rows[0]["gflops"] == pytest.approx(6 * product / 1e9)
    assert rows[1]["gflops"] == pytest.approx(7 * product / 1e9)
    assert rows[2]["gflops"] == pytest.approx(7 * product / 1e9)
    assert rows[0]["gflops"] == pytest.approx(824.633720832)
    assert rows[0]["paper_a100"] == {"gflops": 66.6, "hbm_gb": 40.3, "runtime_ms": 41.7}
    assert rows[1]["paper_a100"]["hbm_gb"] == 4.4 and rows[2]["paper_a100"]["runtime_ms"] == 7.3


def test_left_plans_are_the_library_and_the_paper_schedules(predicted):
    rows = predicted["left"]["rows"]
    assert [p["plan"] for p in rows[0]["passes"]] == ["standard/default/fwd", "standard/default/bwd"]
    assert [p["plan"] for p in rows[1]["passes"]] == ["flash/fast/fwd", "flash/fast/bwd"]
    assert [p["plan"] for p in rows[2]["passes"]] == ["flash/kv_outer/fwd", "flash/kv_outer/bwd"]
    for r in rows:  # nothing measured without a GPU
        assert r["counted_bytes"] is None and r["dram_bytes"] is None and r["seconds"] is None


def test_left_standard_bytes_by_hand(predicted):
    # forward: S written once and read by rowmax, rowsum, normalize; P written by normalize and read by pv;
    # the backward reads P by dv, rowdot and ds; each of dP and dS is written once and read twice
    s_bytes = N * N * BH * E
    # its products read each input panel once per 128-wide tile of the other side: Q, K (QKᵀ), V (PV) 8 times;
    # m (float32) is written once and read twice, l written and read once
    passes = predicted["left"]["rows"][0]["passes"]
    fwd = make_plan("standard", N_q=N, d=D, dtype="float16", sram=GPT2.sram, batch=64, heads=16)
    assert (fwd.tile["BM"], fwd.tile["BN"]) == (128, 128)
    panels = N // 128
    fwd_expected = BH * (E * (3 * N * D * panels + N * D) + 4 * (3 * N + 2 * N)) + 6 * s_bytes
    assert passes[0]["predicted_bytes"] == fwd_expected
    assert predicted["left"]["rows"][0]["predicted_bytes"] > 40e9  # the paper's 40.3 GB order


def test_left_flash_dq_accumulator_by_hand(predicted):
    # the backward's float32 dQ accumulator: zeroed by prep (written once), then read and written once per
    # key block by the atomic adds (T_c times), then read once by the dq stage
    fast_bwd = make_plan("flash", "fast", N_q=N, d=D, dtype="float16", sram=GPT2.sram, batch=64, heads=16,
                         direction="bwd")
    tc = math.ceil(N / fast_bwd.tile["Bc"])
    acc = N * D * BH * 4
    rows = [t for t in predicted["left"]["per_tensor"] if t["plan"] == "flash/fast/bwd" and t["tensor"] == "dQacc"]
    assert len(rows) == 1
    assert (rows[0]["read_bytes"], rows[0]["write_bytes"]) == (acc * (tc + 1), acc * (tc + 1))
    assert any("dQacc" in note for note in predicted["left"]["notes"])


def test_left_shares_add_to_one(predicted):
    for row in predicted["left"]["rows"]:
        shares = [t["share_of_row"] for t in predicted["left"]["per_tensor"] if t["row"] == row["row"]]
        assert sum(shares) == pytest.approx(1.0)


def test_left_float32_falls_back_to_research_flash():
    problem = figure2.Problem(N=256, d=64, batch=1, heads=2, dtype="float32", sram=96 * 1024)
    plans = figure2.left_plans(problem)
    assert [p.label for p in plans[1][2]] == ["flash/q_outer/fwd", "flash/kv_outer/bwd"]


def test_roofline_seconds_by_hand(predicted):
    point = predicted["middle"]["points"][0]
    expected = max(point["flops"] / H200.tensor_flops, point["predicted_bytes"] / H200.hbm_bytes_per_s)
    assert point["roofline_seconds"] == pytest.approx(expected)
    assert point["memory_bound"] == (point["predicted_bytes"] / H200.hbm_bytes_per_s
                                     > point["flops"] / H200.tensor_flops)


@pytest.mark.parametrize("schedule,knob", [("kv_outer", "block_c"), ("q_outer", "block_r")])
def test_block_sizes_up_to_the_largest_that_fits(schedule, knob):
    sizes, too_big = figure2.block_sizes(GPT2, schedule)
    assert too_big == 2 * sizes[-1]
    kw = dict(N_q=N, d=D, dtype="float16", sram=GPT2.sram, batch=64, heads=16)
    tile = {"block_c": "Bc", "block_r": "Br"}[knob]
    assert make_plan("flash", schedule, **kw, **{knob: sizes[-1]}).tile[tile] == sizes[-1]
    with pytest.raises(TilesDoNotFit):
        make_plan("flash", schedule, **kw, **{knob: too_big})
    # H200's M of 227 KB with float16 and d = 64: 512 fits, 1024 does not (the K, V block alone is 256 KB)
    assert sizes == [64, 128, 256, 512]


def test_middle_points_and_bytes_fall_with_block(predicted):
    panel = predicted["middle"]
    assert [p["block"] for p in panel["points"]] == [64, 128, 256, 512]
    assert all(p["tiles"]["Bc"] == p["block"] for p in panel["points"])
    nbytes = [p["predicted_bytes"] for p in panel["points"]]
    assert nbytes == sorted(nbytes, reverse=True)
    assert len({p["flops"] for p in panel["points"]}) == 1
    assert panel["fits"] == {} and panel["knee"] is None


def test_middle_blocks_given_skip_what_does_not_fit():
    panel = figure2.build(GPT2, H200, ("middle",), blocks=[64, 2048])["middle"]
    assert [p["block"] for p in panel["points"]] == [64] and panel["skipped"] == [2048]


def test_slopes_of_exact_power_laws():
    nbytes = [1e9, 2e9, 4e9, 8e9, 16e9]
    seconds = [3e-3 * (b / 1e9) ** 0.8 for b in nbytes]
    out = figure2.time_bytes_slopes(nbytes, seconds, [True] * 5)
    assert out["all"] == pytest.approx(0.8) and out["memory_bound"] == pytest.approx(0.8)
    assert out["n_all"] == out["n_memory_bound"] == 5
    # memory-bound points follow bytes^1, the compute-bound ones stay flat
    seconds = [1e-3, 1e-3, 1e-3 * 2, 1e-3 * 4, 1e-3 * 8]
    bound = [False, False, True, True, True]
    out = figure2.time_bytes_slopes([1e9, 2e9, 4e9, 8e9, 16e9], seconds, bound)
    assert out["memory_bound"] == pytest.approx(1.0) and out["n_memory_bound"] == 3
    assert out["all"] < 1.0
    assert figure2.time_bytes_slopes([1e9, 2e9], [1.0, 2.0], [True, False])["memory_bound"] is None


def test_knee():
    assert figure2.knee([64, 128, 256, 512], [8.0, 4.0, 2.0, 2.05]) == 256
    assert figure2.knee([64, 128, 256, 512], [8.0, 4.0, 2.0, 1.0]) is None  # still falling
    assert figure2.knee([64, 128, 256], [4.0, 3.9, 3.95]) == 64  # within 5%
    assert figure2.knee([64], [1.0]) is None


def test_roofline_knee():
    # bandwidth 1 byte/s, peak 10 FLOP/s: compute-bound once bytes <= flops / 10
    spec = H200.__class__(**{**H200.__dict__, "hbm_bytes_per_s": 1.0, "tensor_flops": 10.0})
    assert figure2.roofline_knee([64, 128, 256], [100, 100, 100], [40, 20, 10], spec, "float16") == 256
    assert figure2.roofline_knee([64, 128], [100, 100], [40, 20], spec, "float16") is None


def test_right_densities_flops_by_hand(predicted):
    panel = predicted["right"]
    assert [p["requested_density"] for p in panel["points"]] == list(figure2.DENSITIES)
    for p in panel["points"]:  # random pattern: exactly that fraction of the 8 x 8 blocks of 128
        assert p["density"] == pytest.approx(p["requested_density"])
        assert p["flops"] == pytest.approx(2 * 2 * N * N * D * BH * p["density"])
    nbytes = [p["predicted_bytes"] for p in panel["points"]]
    assert nbytes == sorted(nbytes, reverse=True)


def test_parse_panels():
    assert figure2.parse_panels("right,left") == ("left", "right")
    for bad in ("nonsense", "", "left,,middle"):
        with pytest.raises(ValueError):
            figure2.parse_panels(bad)


def test_label_batches_keep_labels_distinct():
    plans = [figure2.block_plan(GPT2, "kv_outer", b) for b in (64, 128)] + \
        [make_plan("flash", "q_outer", N_q=N, d=D, dtype="float16", sram=GPT2.sram)]
    batches = figure2.label_batches(plans)
    assert [len(b) for b in batches] == [2, 1]
    assert all(len({p.label for p in b}) == len(b) for b in batches)


def test_measured_columns_come_from_measure_and_dram():
    problem = figure2.Problem(N=256, d=64, batch=1, heads=2, dtype="float16", sram=H200.smem_per_block_bytes)

    def measure(plan):
        return {"counted_read_bytes": 10, "counted_write_bytes": 5, "seconds": 1e-3 * plan.tile.get("Bc", 1)}

    def dram(plans):
        return [{"dram_read_bytes": 3, "dram_write_bytes": 4, "dram_bytes": 7} for _ in plans]

    doc = figure2.build(problem, H200, figure2.PANELS, measure=measure, dram=dram)
    row = doc["left"]["rows"][0]
    assert row["counted_bytes"] == 30 and row["dram_bytes"] == 14
    assert doc["middle"]["points"][0]["counted_bytes"] == 15 and doc["middle"]["fits"]
    assert doc["right"]["points"][0]["dram_bytes"] is None and doc["right"]["points"][0]["seconds"]


def test_dram_for_every_middle_block_given_below_the_default_first():
    problem = figure2.Problem(N=256, d=64, batch=1, heads=2, dtype="float16", sram=H200.smem_per_block_bytes)
    asked = []

    def dram(plans):
        asked.extend(plans)
        return [{"dram_read_bytes": 3, "dram_write_bytes": 4, "dram_bytes": 7} for _ in plans]

    def measure(plan):  # time proportional to the resident block's Q/O traffic: 1 / B_c
        return {"counted_read_bytes": 10, "counted_write_bytes": 5, "seconds": 1.0 / plan.tile["Bc"]}

    panel = figure2.build(problem, H200, ("middle",), blocks=[16, 32, 64], measure=measure, dram=dram)["middle"]
    assert [p["block"] for p in panel["points"]] == [16, 32, 64] and panel["skipped"] == []
    assert sorted(p.tile["Bc"] for p in asked) == [16, 32, 64]
    assert all(p["dram_bytes"] == 7 for p in panel["points"])


def test_model_dram_column_is_the_two_level_model_of_each_plan(predicted):
    from iokernels.model.l2 import dram_totals

    problem = figure2.Problem(**predicted["header"]["problem"])
    point = predicted["middle"]["points"][0]
    totals = dram_totals(figure2.block_plan(problem, "kv_outer", point["block"]), H200)
    assert point["model_dram_read_bytes"] == sum(r for r, _ in totals.values())
    assert point["model_dram_bytes"] == sum(r + w for r, w in totals.values())
    # a plan's DRAM traffic never exceeds its L2-level (counted) traffic in this model
    assert all(p["model_dram_bytes"] <= p["predicted_bytes"] for p in predicted["middle"]["points"])
    standard = predicted["left"]["rows"][0]
    plans = figure2.left_plans(problem)[0][2]
    assert standard["model_dram_bytes"] == sum(r + w for p in plans for r, w in dram_totals(p, H200).values())
    assert "model DRAM GB" in figure2.render(predicted)
