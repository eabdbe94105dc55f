"""`iokernels profile` under Nsight Compute: the hardware's bytes against the kernels' counters.

Every plan and pass runs once under ncu (N = 1024, d = 64, float16, M = 96 KB: 22 kernel launches,
each replayed for about five metric passes; caches flushed before each pass). The tolerances, and why:

1. **Requested bytes equal the counters exactly** (tolerance 0), per launch, reads and writes apart.
   ``smsp__sass_data_bytes_mem_global_op_{ld,st,red,atom}`` adds up the bytes that the executed
   global load, store and atomic instructions ask for, thread by thread. The counters add
   ``sizeof`` of every iok_ld / iok_st / iok_atomic_add that runs, and every global access of a
   kernel goes through them (docs/KERNELS.md), so the two count the same thing: the plain build must
   move exactly what the counting build counted. Atomics count as read and written on both sides.

2. **L1 bytes lie between the counters and a sector bound**, per launch, reads and writes apart:
   ``counted <= L1 <= 2 * counted(tensors of the input dtype) + 8 * counted(float32 tensors)``.
   ``l1tex__t_bytes_pipe_lsu_mem_global_op_*`` counts whole 32-byte sectors per warp request, so it
   is never below the bytes requested (each access lies inside the sectors it touches), and it
   exceeds them where a request uses part of a sector. A sector a request touches holds at least one
   whole access of one thread (accesses are naturally aligned and at most 16 bytes, so none straddles
   two sectors): at least 4 of 32 bytes for the float32 tensors (m, l, lse, D, Oacc, dQacc, moved as
   single floats or float4), hence 8x; and at least 16 of 32 for the float16 tensors here, which
   move as aligned 16-byte vectors or, for the tensor-core products' outputs, as 4 lanes' half2
   pairs covering 16 aligned bytes of a row; hence 2x. That takes every row 16-byte aligned (N and d
   multiples of 8 for 2-byte types): it is a property of this configuration, not of every size.
   The recorded H200 sample (tests/analysis/test_profile.py) obeys it too.

3. **Standard attention's forward L1 bytes are exact** (tolerance 0) at this aligned size, from the
   access patterns: Q, K, V, P and S move as 16-byte vectors of whole sectors (factor 1); the
   tensor-core outputs S and O are written as 8 rows x 16 bytes per warp store (factor 2); m and l are
   written and read by one thread per row (4 of 32 bytes: factor 8). The recorded sample (N = 1000)
   shows the same factors for the parts that do not depend on row alignment.

Reads the copy engine makes (TMA, the tensors a kernel takes as tensor maps: Q, K and V of the sm_90 forward,
``copy_engine_read_bytes``) run no load instruction, so 1. and 2. take them out of the counted reads; the stores of
those kernels still equal the counters exactly.
DRAM bytes are reported, not bounded above (that is what the L2 saves); with caches flushed before
each pass every launch must at least read from DRAM what it reads at all.
"""

import shutil

import pytest
from click.testing import CliRunner

from iokernels.analysis import ncu, profile
from iokernels.cli import cli
from iokernels.kernels import launch
from iokernels.plan import FLOAT32_TENSORS, all_plans

cp = pytest.importorskip("cupy")
if shutil.which("ncu") is None:
    pytest.skip("Nsight Compute's ncu is not on PATH", allow_module_level=True)

N, D, DTYPE, SRAM = 1024, 64, "float16", 96 * 1024
F32_FACTOR, VECTOR_FACTOR = 8, 2


@pytest.fixture(scope="module")
def plans():
    return all_plans(N_q=N, d=D, dtype=DTYPE, sram=SRAM, backward=True)


@pytest.fixture(scope="module")
def doc(plans):
    try:
        return profile.profile(plans, cache_control="all")
    except ncu.NcuPermissionError as exc:
        pytest.skip(str(exc))


def stage_rows(doc):
    return [r for r in doc["rows"] if r["stage"] != "all"]


def label(row):
    return f"{row['algorithm']}/{row['schedule']}/{row['pass']}:{row['stage']}"


def test_every_stage_profiled_once(doc, plans):
    got = [label(r) for r in stage_rows(doc)]
    assert got == [f"{p.label}:{s.name}" for p in plans for s in p.stages]
    assert len({r["ncu_id"] for r in stage_rows(doc)}) == len(got)
    assert all(r["complete"] for r in doc["rows"] if r["stage"] == "all")
    assert doc["header"]["cache_control"] == "all" and "--clock-control" in doc["header"]["ncu_command"]


def test_counting_build_equals_model(doc):
    for r in doc["rows"]:
        assert (r["counted_read_bytes"], r["counted_write_bytes"]) == \
               (r["predicted_read_bytes"], r["predicted_write_bytes"]), label(r)


def test_requested_bytes_equal_counted_exactly(doc):
    copied = [r for r in stage_rows(doc) if launch.copied_tensors(r["kernel"])]
    assert copied and all(r["copy_engine_read_bytes"] > 0 for r in copied)  # the TMA forward is among the plans
    for r in doc["rows"]:
        detail = (label(r), {k: v for k, v in r.items() if k.endswith("bytes")})
        assert r["requested_read_bytes"] == r["counted_read_bytes"] - r["copy_engine_read_bytes"], detail
        assert r["requested_write_bytes"] == r["counted_write_bytes"] - r["copy_engine_write_bytes"], detail


def test_l1_bytes_within_the_sector_bound(doc):
    for r in stage_rows(doc):
        for d in ("read", "write"):
            copied = set(launch.copied_tensors(r["kernel"]))
            tensors = [t for t in r["tensors"] if t["tensor"] not in copied]  # those moved by instructions
            f32 = sum(t[f"counted_{d}_bytes"] for t in tensors if t["tensor"] in FLOAT32_TENSORS)
            counted = sum(t[f"counted_{d}_bytes"] for t in tensors)
            bound = VECTOR_FACTOR * (counted - f32) + F32_FACTOR * f32
            assert r[f"requested_{d}_bytes"] <= r[f"l1_{d}_bytes"], (label(r), d)
            assert counted <= r[f"l1_{d}_bytes"] <= bound, (label(r), d, r["metrics"])


def test_standard_forward_l1_bytes_exact(doc):
    gemm_outputs = {("qk", "S"), ("pv", "O")}
    rows = [r for r in stage_rows(doc) if (r["algorithm"], r["pass"]) == ("standard", "fwd")]
    assert [r["stage"] for r in rows] == ["qk", "rowmax", "rowsum", "normalize", "pv"]
    for r in rows:
        want = {"read": 0, "write": 0}
        for t in r["tensors"]:
            for d in want:
                factor = (F32_FACTOR if t["tensor"] in ("m", "l")
                          else 2 if d == "write" and (r["stage"], t["tensor"]) in gemm_outputs else 1)
                want[d] += factor * t[f"counted_{d}_bytes"]
        assert (r["l1_read_bytes"], r["l1_write_bytes"]) == (want["read"], want["write"]), (label(r), r["metrics"])


def test_writes_reach_l2_and_reads_come_from_dram(doc, plans):
    by_label = {p.label: p for p in plans}
    for r in stage_rows(doc):
        sectors = r["l2_write_sectors"] + r["l2_red_sectors"] + r["l2_atom_sectors"]
        assert 32 * sectors >= r["counted_write_bytes"], label(r)  # the L1 writes through to the L2
        plan = by_label[f"{r['algorithm']}/{r['schedule']}/{r['pass']}"]
        unique = 0
        for t in r["tensors"]:
            if t["counted_read_bytes"]:
                shape = launch.tensor_shape(plan, t["tensor"])
                size = plan.tensor_itemsize(t["tensor"])
                for extent in shape:
                    size *= extent
                unique += size
        # caches flushed before each pass: what a launch reads at all comes from DRAM at least once
        assert r["dram_read_bytes"] >= 0.95 * unique, (label(r), r["dram_read_bytes"], unique)


def test_profile_command_text():
    result = CliRunner().invoke(cli, ["profile", "--N", "256", "--d", "64", "--dtype", "float16", "--sram", "96KB",
                                      "--algorithms", "flash/q_outer", "--cache-control", "none"])
    if "ERR_NVGPUCTRPERM" in result.stderr:
        pytest.skip(result.stderr.strip())
    assert result.exit_code == 0, result.stderr
    cells = next(x for x in result.stdout.splitlines() if "flash_q_outer" in x).split()
    assert cells[3:5] == ["main", "flash_q_outer"] and cells[5] == cells[6] == cells[7]  # counted, model, requested
    assert "--cache-control none" in result.stdout
