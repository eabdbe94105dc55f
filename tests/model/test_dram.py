"""The two-level DRAM model (iokernels.model.l2) against hand-computed cases on toy GPUs.

Expected bytes are worked out by hand from the formulas in docs/DRAM-MODEL.md; tiles, grids and
counted bytes come from the plan and the exact model (the layers below this one), never from l2.py.
"""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import sympy as sp

from iokernels.model import BH, N_k, N_q, d, e, exact, get_spec
from iokernels.model.hbm import BM, BN, B_c, B_r, BH_kv, M
from iokernels.model.l2 import (
    DRAM_SYMBOLS,
    compare_profile,
    dram,
    dram_blocks_per_sm,
    dram_exprs,
    dram_l2_bytes,
    dram_totals,
)
from iokernels.model.specs import GpuSpec
from iokernels.plan import make_plan

KB = 1024
PROFILE = Path(__file__).resolve().parents[2] / "results" / "h200" / "profile" / "profile-N1024-cc-all.json"


def toy(l2_bytes: int, sms: int, smem_per_sm: int = 228 * KB) -> GpuSpec:
    """A compute-capability 9.0 GPU: two L2 partitions, 2048 threads and 32 blocks per SM."""
    return GpuSpec(key="toy", name="toy", compute_capability="9.0", sms=sms, smem_per_sm_bytes=smem_per_sm,
                   smem_per_block_bytes=smem_per_sm, l1_smem_per_sm_bytes=smem_per_sm, l2_bytes=l2_bytes,
                   hbm_bytes_per_s=1.0, tensor_flops=2.0, fp32_flops=1.0, max_threads_per_sm=2048,
                   max_blocks_per_sm=32, smem_reserved_per_block_bytes=1024, l2_partitions=2)


def one_block_per_sm(stage, l2_bytes: int, sms: int) -> GpuSpec:
    """A toy GPU whose shared memory holds exactly one block of ``stage`` per SM."""
    return toy(l2_bytes, sms, smem_per_sm=stage.smem_bytes + 1024)


BIG = 2 * 1024 * KB  # L_2 = 1 MiB: everything below fits


# ---------------------------------------------------------------------------------------------
# the GPU side: effective L2 and resident blocks


def test_l2_is_split_by_its_partitions_and_blocks_per_sm_follow_smem_threads_and_the_limit():
    assert dram_l2_bytes(toy(BIG, 1)) == 1024 * KB
    assert dram_l2_bytes(replace(toy(BIG, 1), l2_partitions=1)) == BIG
    assert dram_l2_bytes(get_spec("v100")) == 6 * 1024 * KB  # one partition
    assert dram_l2_bytes(get_spec("h200")) == 30 * 1024 * KB  # 60 MiB in gpus.json, two partitions
    plan = make_plan("standard", N_q=256, d=16, sram=64 * KB)
    qk = plan.stage("qk")
    assert dram_blocks_per_sm(qk, one_block_per_sm(qk, BIG, 1)) == 1
    assert dram_blocks_per_sm(qk, toy(BIG, 1, smem_per_sm=3 * (qk.smem_bytes + 1024) + 5)) == 3
    assert dram_blocks_per_sm(qk, toy(BIG, 1, smem_per_sm=10**9)) == 2048 // qk.threads  # threads bound
    small = replace(toy(BIG, 1, smem_per_sm=10**9), max_threads_per_sm=1536)
    assert dram_blocks_per_sm(qk, small) == 1536 // qk.threads  # 8.6 / 8.9
    few = replace(toy(BIG, 1, smem_per_sm=10**9), max_threads_per_sm=10**6, max_blocks_per_sm=5)
    assert dram_blocks_per_sm(qk, few) == 5  # the block limit
    assert get_spec("rtx3090").max_blocks_per_sm == 16 and get_spec("l4").max_threads_per_sm == 1536


def test_unknown_l2_or_sms_is_refused():
    plan = make_plan("flash", "q_outer", N_q=64, d=16, sram=16 * KB)
    with pytest.raises(ValueError, match="L2 size is unknown"):
        dram(plan, replace(toy(BIG, 1), l2_bytes=None))
    with pytest.raises(ValueError, match="SM count is unknown"):
        dram(plan, replace(toy(BIG, 1), sms=None))


# ---------------------------------------------------------------------------------------------
# hand-computed cases


def test_rowmax_streams_s_once_and_the_l2_keeps_its_share_of_dirty_lines():
    plan = make_plan("standard", N_q=64, d=16, sram=64 * KB)  # float32: S is 64*64*4 = 16384 B, m 256 B
    fits = dram(plan, toy(BIG, 4))["rowmax"]
    assert fits == {"S": (16384, 0), "m": (0, 0)}  # m stays dirty in the L2 after the launch
    # L_2 = 1040 B: kept = 1040 * 256 / (256 + 16384) = 16 B of m, so 240 B reach DRAM
    tiny = dram(plan, toy(2080, 4))["rowmax"]
    assert tiny == {"S": (16384, 0), "m": (0, 240)}


def test_ragged_tensors_are_fetched_in_whole_sectors():
    plan = make_plan("standard", N_q=3, d=16, sram=64 * KB, batch=2)  # S: 2*3*3*4 = 72 B -> 3 sectors
    assert dram(plan, toy(64, 1))["rowmax"]["S"][0] == 96
    assert exact(plan)["rowmax"]["S"][0] == 72


def test_qk_product_fits_every_operand_once():
    plan = make_plan("standard", N_q=256, d=16, sram=64 * KB)
    gx, gy, _ = plan.stage("qk").grid
    assert gx > 1 and gy > 1
    # Q, K: 256*16*4 = 16384 B each, fetched once; S: 256*256*4 = 262144 B, all kept dirty in the 1 MiB L2
    got = dram(plan, toy(BIG, sms=gx * gy))["qk"]
    assert got == {"Q": (16384, 0), "K": (16384, 0), "S": (0, 0)}


def test_qk_product_that_does_not_fit_refetches_per_wave():
    plan = make_plan("standard", N_q=256, d=16, sram=64 * KB)
    qk = plan.stage("qk")
    gx, gy, _ = qk.grid
    # one resident block: Q's row panel once per block of its row (gx), K once per wave (gy of them);
    # L_2 = 1024 B: kept = 1024 * 262144 / (262144 + 16384) of S, the rest written back
    got = dram(plan, one_block_per_sm(qk, 2048, sms=1))["qk"]
    assert got["Q"] == (16384 * gx, 0)
    assert got["K"] == (16384 * gy, 0)
    assert got["S"] == (0, round(262144 - 1024 * 262144 / 278528))
    assert got["S"][1] == 261180


def test_flash_q_outer_shares_k_and_v_in_three_regimes():
    plan = make_plan("flash", "q_outer", N_q=512, d=16, sram=16 * KB)  # float32: Q, K, V, O 32768 B each
    main = plan.stage("main")
    tr = plan.tile["Tr"]
    assert main.blocks == tr >= 3
    fits = dram(plan, toy(BIG, sms=tr))["main"]
    assert {t: r for t, (r, _) in fits.items()} == {"Q": 32768, "K": 32768, "V": 32768, "O": 0, "lse": 0}
    assert fits["O"][1] == fits["lse"][1] == 0
    # L_2 = 1024 B, one block per SM: K and V fetched once per wave of the grid
    for sms in (1, 2):
        got = dram(plan, one_block_per_sm(main, 2048, sms=sms))["main"]
        waves = math.ceil(tr / sms)
        assert got["K"][0] == got["V"][0] == 32768 * waves
        assert got["Q"][0] == 32768


def test_one_block_per_slice_rereads_its_loop_when_it_does_not_fit():
    plan = make_plan("flash", "kv_outer", N_q=512, d=16, sram=16 * KB)  # main: grid (1, 1, BH)
    counted = exact(plan)["main"]
    got = dram(plan, one_block_per_sm(plan.stage("main"), 2048, sms=1))["main"]
    assert got["Q"][0] == counted["Q"][0] == 32768 * plan.tile["Tc"]
    assert got["Oacc"][0] == counted["Oacc"][0]
    assert dram(plan, toy(BIG, 1))["main"]["Q"][0] == 32768


# ---------------------------------------------------------------------------------------------
# properties


def _plans(N: int):
    out = [make_plan(a, s, N_q=N, d=64, dtype="float16", sram=96 * KB, direction=p, batch=2, heads=2)
           for a, s, p in (("standard", "default", "fwd"), ("standard", "default", "bwd"),
                           ("two_pass", "store", "fwd"), ("two_pass", "recompute", "fwd"),
                           ("flash", "q_outer", "fwd"), ("flash", "kv_outer", "fwd"), ("flash", "kv_outer", "bwd"))]
    out += [make_plan("flash", "fast", N_q=N, d=64, dtype="float16", sram=200 * KB, direction=p)
            for p in ("fwd", "bwd")]
    return out


SPECS = (toy(BIG, 8), toy(4 * KB, 1), toy(256 * KB, 4), get_spec("h200"))


@pytest.mark.parametrize("N", [256, 1000])
def test_dram_never_exceeds_counted_bytes_rounded_to_sectors(N):
    for plan in _plans(N):
        counted = exact(plan)
        for spec in SPECS:
            for stage, tensors in dram(plan, spec).items():
                for t, (r, w) in tensors.items():
                    cr, cw = counted[stage][t]
                    assert r <= 32 * math.ceil(cr / 32), (plan.label, stage, t, spec.l2_bytes)
                    assert w <= 32 * math.ceil(cw / 32), (plan.label, stage, t, spec.l2_bytes)


def test_a_larger_l2_never_adds_dram_bytes():
    for plan in _plans(512):
        previous = None
        for l2 in (2 * KB, 64 * KB, 512 * KB, 4096 * KB, 64 * 1024 * KB):
            totals = dram_totals(plan, toy(l2, 4))
            if previous is not None:
                for stage, (r, w) in totals.items():
                    assert r <= previous[stage][0] and w <= previous[stage][1], (plan.label, stage, l2)
            previous = totals
        first, last = dram_totals(plan, toy(2 * KB, 4)), previous
        assert sum(map(sum, first.values())) > sum(map(sum, last.values())), plan.label  # the L2 matters


def test_a_longer_sequence_never_moves_fewer_dram_bytes():
    spec = toy(512 * KB, 4)
    for schedule, algorithm in (("default", "standard"), ("q_outer", "flash")):
        totals = [sum(r for r, _ in dram_totals(make_plan(algorithm, schedule, N_q=N, d=32, sram=48 * KB),
                                                spec).values()) for N in (128, 256, 512, 1024, 2048)]
        assert totals == sorted(totals) and totals[0] < totals[-1], (algorithm, totals)


def test_expressions_use_the_exact_models_symbols():
    allowed = {N_q, N_k, d, e, BH, BH_kv, B_r, B_c, BM, BN, M, *DRAM_SYMBOLS}
    for key in (("standard", "default", "fwd"), ("flash", "q_outer", "fwd"), ("flash", "kv_outer", "bwd")):
        for tensors in dram_exprs(*key).values():
            for r, w in tensors.values():
                assert sp.sympify(r).free_symbols | sp.sympify(w).free_symbols <= allowed, key


# ---------------------------------------------------------------------------------------------
# against a committed Nsight Compute run (structure only; the ratios are in docs/DRAM-MODEL.md)


def test_compare_profile_on_a_committed_run():
    doc = json.loads(PROFILE.read_text())
    rows = compare_profile(doc)
    assert len(rows) == len(doc["rows"])
    keys = {"N_q", "d", "cache_control", "spec", "algorithm", "schedule", "pass", "stage", "dram_read_measured",
            "dram_read_predicted", "dram_read_ratio", "dram_read_within", "dram_write_measured",
            "dram_write_predicted", "dram_write_ratio", "dram_write_within"}
    for row, src in zip(rows, doc["rows"], strict=True):
        assert keys <= set(row)
        assert row["spec"] == "h200" and row["cache_control"] == "all"
        assert (row["algorithm"], row["schedule"], row["pass"], row["stage"]) == (
            src["algorithm"], src["schedule"], src["pass"], src["stage"])
        assert row["dram_read_measured"] == src["dram_read_bytes"]
        assert row["dram_write_measured"] == src["dram_write_bytes"]
        assert isinstance(row["dram_read_predicted"], int) and row["dram_read_predicted"] >= 0
        assert isinstance(row["dram_read_within"], bool)
    totals = {(r["algorithm"], r["pass"]): r for r in rows if r["stage"] == "all"}
    stages = [r for r in rows if r["stage"] != "all" and r["algorithm"] == "standard" and r["pass"] == "fwd"]
    assert totals[("standard", "fwd")]["dram_read_predicted"] == sum(r["dram_read_predicted"] for r in stages)


def test_compare_profile_refuses_a_run_whose_tiles_differ():
    doc = json.loads(PROFILE.read_text())
    doc["header"]["plans"][0]["tiles"] = {"BM": 1, "BN": 1, "BK": 1}
    with pytest.raises(ValueError, match="differ from the profiled"):
        compare_profile(doc)
