"""Roofline: per-stage FLOPs, bytes, intensity and attainable time, hand-computed; the time-against-bytes check
with synthetic timings; the document, table and plot."""

import json

import pytest

from iokernels import model
from iokernels.analysis import roofline
from iokernels.analysis.roofline import Ceilings
from iokernels.model.specs import get_spec
from iokernels.plan import all_plans, make_plan
from iokernels.plan.fast_bwd import make_fast_backward_plan

NQ, NK, D, BATCH, HEADS = 300, 200, 32, 2, 3
BH = BATCH * HEADS
ROOF = Ceilings(flops_per_s=100e12, bytes_per_s=1e12, source="spec", note="test roof")  # ridge 100 FLOP/B


def cdiv(a, b):
    return -(-a // b)


def standard():
    return make_plan("standard", N_q=NQ, N_k=NK, d=D, sram=48 * 1024, batch=BATCH, heads=HEADS)


def q_outer(**kw):
    return make_plan("flash", "q_outer", N_q=NQ, N_k=NK, d=D, sram=48 * 1024, batch=BATCH, heads=HEADS, **kw)


def test_standard_forward_stages_by_hand():
    plan = standard()
    bm, bn = plan.tile["BM"], plan.tile["BN"]
    rows = {r["stage"]: r for r in roofline.stage_rows(plan, ROOF)}
    # S = Q K^T: 2 N_q N_k d FLOPs per batch-head; Q's row panel read once per column block of S, K's once per row block
    qk_flops = 2 * BH * NQ * NK * D
    qk_bytes = 4 * BH * (NQ * D * cdiv(NK, bn) + NK * D * cdiv(NQ, bm) + NQ * NK)
    assert rows["qk"]["flops"] == qk_flops and rows["qk"]["bytes"] == qk_bytes
    assert rows["qk"]["intensity_flops_per_byte"] == pytest.approx(qk_flops / qk_bytes)
    assert rows["qk"]["roofline_seconds"] == pytest.approx(max(qk_flops / 100e12, qk_bytes / 1e12))
    # the row-wise softmax stages compute no matrix product: rowmax reads S, writes m
    assert rows["rowmax"]["flops"] == 0 and rows["rowmax"]["bytes"] == 4 * BH * (NQ * NK + NQ)
    assert rows["rowmax"]["bound"] == "memory" and rows["rowmax"]["roofline_seconds"] == pytest.approx(
        4 * BH * (NQ * NK + NQ) / 1e12)
    assert rows["pv"]["flops"] == 2 * BH * NQ * NK * D
    total = roofline.plan_row(plan, ROOF)
    assert total["flops"] == 4 * BH * NQ * NK * D
    assert total["roofline_seconds"] == pytest.approx(sum(r["roofline_seconds"] for r in rows.values()))


def test_flash_q_outer_by_hand():
    plan = q_outer()
    t_r = cdiv(NQ, plan.tile["Br"])
    (row,) = roofline.stage_rows(plan, ROOF)
    flops = 4 * BH * NQ * NK * D  # S = QK^T and O = PV
    nbytes = 4 * BH * (NQ * D + 2 * NK * D * t_r + NQ * D) + 4 * BH * NQ  # Q, K and V per query block, O, lse
    assert (row["flops"], row["bytes"]) == (flops, nbytes)
    assert row["intensity_flops_per_byte"] == pytest.approx(flops / nbytes)
    compute, memory = flops / 100e12, nbytes / 1e12
    assert row["roofline_seconds"] == pytest.approx(max(compute, memory))
    assert row["bound"] == ("compute" if compute > memory else "memory")
    causal = roofline.stage_flops(q_outer(causal=True))
    assert causal == {"main": flops // 2}  # the model's convention: halved for causal attention


def test_spec_ceilings_follow_the_dtype():
    spec = get_spec("h200")
    assert roofline.spec_ceilings(spec, "float32").flops_per_s == 67e12
    fp16 = roofline.spec_ceilings(spec, "float16")
    assert fp16.flops_per_s == 989e12 and fp16.bytes_per_s == 4800e9
    assert fp16.ridge == pytest.approx(989e12 / 4800e9)


@pytest.mark.parametrize("dtype,extra", [("float32", {}), ("float16", {}), ("float16", {"causal": True})])
def test_stage_flops_add_up_to_the_model(dtype, extra):
    plans = all_plans(N_q=256, N_k=256, d=64, dtype=dtype, sram=192 * 1024, batch=2, heads=2, backward=True,
                      smem_limit=227 * 1024, **extra)
    products = {"standard/default/fwd": 2, "standard/default/bwd": 4, "two_pass/store/fwd": 2,
                "two_pass/recompute/fwd": 3, "flash/kv_outer/fwd": 2, "flash/q_outer/fwd": 2, "flash/fast/fwd": 2,
                "flash/kv_outer/bwd": 5, "flash/fast/bwd": 5}
    half = 2 if extra.get("causal") else 1
    for plan in plans:
        flops = roofline.stage_flops(plan)
        assert set(flops) == {s.name for s in plan.stages}
        assert sum(flops.values()) == model.predict(plan).flops
        assert sum(flops.values()) == 2 * products[plan.label] * 4 * 256 * 256 * 64 // half


def test_fast_backward_deterministic_split():
    plan = make_fast_backward_plan(N_q=128, N_k=128, d=64, dtype="float16", deterministic=True, kernel="mma")
    assert plan.variant == "deterministic"
    assert roofline.stage_flops(plan) == {"dq": 2 * 3 * 128 * 128 * 64, "dkdv": 2 * 4 * 128 * 128 * 64}


def pair(dtype="float16"):
    plans = all_plans(N_q=1024, N_k=1024, d=64, dtype=dtype, sram=192 * 1024, batch=4, heads=4,
                      smem_limit=227 * 1024)
    return [p for p in plans if p.label in ("standard/default/fwd", "flash/q_outer/fwd")]


def test_time_check_ranks_as_bytes_with_roofline_times():
    plans = pair()
    roof = Ceilings(1e18, 1e12, "spec", "memory-bound roof")  # so high a compute roof that both are memory-bound
    rows = {r["label"]: r for r in roofline.time_check(plans, roof)["rows"]}
    seconds = {label: 1.1 * r["roofline_seconds"] for label, r in rows.items()}
    (check,) = roofline.time_check(plans, roof, seconds)["checks"]
    std, fl = (roofline.plan_row(p, roof) for p in plans)
    assert check["bytes"] == pytest.approx(std["bytes"] / fl["bytes"]) and check["bytes"] > 1
    assert check["roofline"] == pytest.approx(check["bytes"])  # memory-bound: the roofline is bytes/bandwidth
    assert check["time"] == pytest.approx(check["bytes"])
    assert check["ranks_as_bytes"] and check["reason"] is None


def test_time_check_says_when_time_does_not_rank():
    plans = pair()
    roof = Ceilings(1e18, 1e12, "spec", "memory-bound roof")
    summary = roofline.time_check(plans, roof, {"standard/default/fwd": 1e-3, "flash/q_outer/fwd": 2e-3})
    (check,) = summary["checks"]
    assert check["time"] == pytest.approx(0.5) and not check["ranks_as_bytes"]
    assert "time off the roofline" in check["reason"]
    rows = {r["label"]: r for r in summary["rows"]}
    assert rows["flash/q_outer/fwd"]["measured_over_roofline"] == pytest.approx(
        2e-3 / rows["flash/q_outer/fwd"]["roofline_seconds"])


def test_time_check_names_a_compute_bound_plan():
    flops = 4 * 16 * 1024 * 1024 * 64
    roof = Ceilings(flops / 1e-3, 1e15, "spec", "compute-bound roof")  # FLOPs take 1 ms, bytes about nothing
    (check,) = roofline.time_check(pair(), roof)["checks"]
    assert check["time"] is None and check["ranks_as_bytes"]
    assert check["roofline"] < 0.75 * check["bytes"]
    assert "flash/q_outer/fwd is compute-bound: roofline predicts 1.000 ms" in check["reason"]


def test_document_without_measurements_is_predicted_only():
    plans = pair()
    doc = roofline.build(plans, get_spec("h200"), note="no device", problem_note="as given")
    json.dumps(doc)
    assert doc["header"]["source"] == "model" and doc["header"]["measured_ceilings"] is None
    assert all(r["seconds"] is None and r["dram_bytes"] is None for r in doc["rows"])
    text = roofline.render(doc)
    assert "batch x heads = 4 x 4: as given" in text and "time ms" not in text and "pred TFLOP/s" in text


def test_document_with_synthetic_measurements():
    plans = pair()
    stages = {p.label: {s.name: 1e-4 for s in p.stages} for p in plans}
    dram = {p.label: {s.name: 1000 for s in p.stages} for p in plans}
    measured = {p.label: {"seconds": 1e-4 * len(p.stages), "stage_seconds": stages[p.label],
                          "dram_bytes": dram[p.label]} for p in plans}
    doc = roofline.build(plans, get_spec("h200"), measured_ceilings=ROOF, measured=measured)
    assert doc["header"]["ceilings"]["flops_per_s"] == 100e12 and doc["header"]["dram"]
    main = next(r for r in doc["rows"] if r["label"] == "flash/q_outer/fwd" and r["stage"] == "main")
    assert main["achieved_flops_per_s"] == pytest.approx(4 * 16 * 1024 * 1024 * 64 / 1e-4)
    assert main["achieved_bytes_per_s"] == pytest.approx(main["bytes"] / 1e-4)
    assert main["dram_bytes_per_s"] == pytest.approx(1000 / 1e-4)
    assert main["of_roofline"] == pytest.approx(main["roofline_seconds"] / 1e-4)
    total = next(r for r in doc["rows"] if r["label"] == "standard/default/fwd" and r["stage"] == "all")
    assert total["dram_bytes"] == 5000
    text = roofline.render(doc)
    assert "DRAM TB/s" in text and "TFLOP/s" in text and "spec ceilings" in text


def test_plot_writes_a_figure(tmp_path):
    pytest.importorskip("matplotlib")
    plans = pair()
    measured = {p.label: {"seconds": 1e-3, "stage_seconds": {s.name: 1e-3 for s in p.stages},
                          "dram_bytes": {s.name: 10**6 for s in p.stages}} for p in plans}
    path = tmp_path / "roof.png"
    roofline.plot(roofline.build(plans, get_spec("h200"), measured_ceilings=ROOF, measured=measured), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_measure_ceilings_needs_a_gpu():
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("a GPU is present")
    except Exception:
        pass
    with pytest.raises(RuntimeError):
        roofline.measure_ceilings("float16")


def test_unknown_stage_split_is_refused():
    plan = q_outer()
    odd = plan.__class__(**{**plan.__dict__, "schedule": "nonesuch"})
    with pytest.raises((ValueError, KeyError)):
        roofline.stage_flops(odd)


def test_annotate_compare_document_with_synthetic_timings():
    from iokernels.analysis.report import Measured, build, render

    plans = pair()
    roof = roofline.spec_ceilings(get_spec("h200"), "float16")
    rows = {r["label"]: r for r in roofline.time_check(plans, roof)["rows"]}
    measured = {p.label: Measured(counts=model.exact(p), seconds=2 * rows[p.label]["roofline_seconds"])
                for p in plans}
    doc = roofline.annotate(build(plans, get_spec("h200"), "gpu", measured), plans, get_spec("h200"))
    totals = [r for r in doc["rows"] if r["tensor"] == "total"]
    assert all(r["seconds_over_roofline"] == pytest.approx(2.0) for r in totals)
    (check,) = doc["header"]["roofline"]["checks"]
    assert check["time"] == pytest.approx(check["roofline"]) and check["ranks_as_bytes"]
    text = render(doc)
    assert "time/roofline" in text and "flash/q_outer/fwd: bytes" in text and "2.00" in text
