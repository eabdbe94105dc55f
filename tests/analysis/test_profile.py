"""`iokernels profile` without a GPU: ncu's CSV, launches matched to stages, the report, the errors.

tests/analysis/data/ncu-standard-N1000-cc-{all,none}.csv are real `ncu --csv --page raw` output from an H200
(ncu 2025.3.1, scripts/probe_ncu.sh; columns trimmed to the metrics): standard attention forward,
N=1000, d=64, float16, M=96KB, with the program's printed counted bytes above the CSV. Launches 0-7
and 13-17 are cupy's input copies and NaN fills, 8-12 the plain build, 18-22 the counting build.
"""

import ast
import json
import os
import shutil
import stat
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from iokernels import model
from iokernels.analysis import ncu, profile
from iokernels.cli import cli
from iokernels.plan import FLOAT32_TENSORS, all_plans, make_plan

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "ncu-standard-N1000-cc-all.csv"
SAMPLE_NONE = DATA / "ncu-standard-N1000-cc-none.csv"
PLAIN_IDS = [8, 9, 10, 11, 12]
COUNTING_IDS = [18, 19, 20, 21, 22]


def sample_plan():
    return make_plan("standard", N_q=1000, d=64, dtype="float16", sram=96 * 1024)


def sample_counts():
    line = next(x for x in SAMPLE.read_text().splitlines() if x.startswith("{'qk'"))
    return ast.literal_eval(line)


def sample_doc():
    plan = sample_plan()
    launches = [x for x in ncu.parse_ncu_csv(SAMPLE.read_text()) if x["id"] <= 12]
    matched, ignored = profile.match_launches(launches, profile.expected_launches([plan], {plan.label: tuple(
        s.name for s in plan.stages)}))
    counts = {plan.label: {s: {t: list(rw) for t, rw in ts.items()} for s, ts in sample_counts().items()}}
    header = {"source": "ncu", "ncu_version": "2025.3.1.0", "cache_control": "all",
              "environment": {"gpu": "NVIDIA H200"}, "note": "recorded sample"}
    return profile.build_document([plan], matched, counts, header, ignored)


# ---------------------------------------------------------------------------------------------
# parsing

def test_parse_recorded_csv():
    launches = ncu.parse_ncu_csv(SAMPLE.read_text())
    assert [x["id"] for x in launches] == list(range(23))
    assert [x["function"] for x in launches[8:13]] == ["gemm", "rowmax", "rowsum", "normalize", "gemm"]
    assert launches[0]["function"] == "cupy_copy__float32_float16" and launches[3]["function"] == "cupy_fill"
    assert launches[8]["kernel_name"].startswith("void gemm<__half, 0, 1, 0, 1, 4>(")
    qk = launches[8]["metrics"]
    assert qk["l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"] == 2_048_000  # "2,048,000" byte
    assert qk["l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum"] == 4_000_000
    assert qk["dram__bytes_read.sum"] == 304_896 and qk["lts__t_sectors_srcunit_tex_op_read.sum"] == 39_680
    assert qk["gpu__time_duration.sum"] > 0
    assert qk["smsp__sass_data_bytes_mem_global_op_ld.sum"] is None  # not collected in this sample
    assert launches[18]["metrics"]["l1tex__t_bytes_pipe_lsu_mem_global_op_red.sum"] == 6_144  # counter flush
    avg = ncu.parse_ncu_csv(SAMPLE.read_text(), metrics=("dram__bytes_read.avg",))
    assert avg[0]["metrics"]["dram__bytes_read.avg"] == pytest.approx(5397.33)  # "5,397.33"


def test_parse_without_csv_is_empty():
    assert ncu.parse_ncu_csv("==PROF== Disconnected from process 1\n") == []


@pytest.mark.parametrize("unit, value, want", [
    ("byte", "2,048,000", 2_048_000), ("Kbyte", "259.07", 259_070), ("Mbyte", "4", 4_000_000),
    ("Gbyte", "8.59", 8_590_000_000), ("KiB".replace("B", "byte"), "1", 1024), ("sector", "39,680", 39_680),
    ("Ksector", "1.5", 1500), ("ns", "3,264", 3264), ("usecond", "2.5", 2500), ("msecond", "1", 10**6),
    ("byte", "n/a", None), ("byte", "", None)])
def test_units_to_base(unit, value, want):
    assert ncu.parse_value(value, unit) == want


def test_scaled_units_in_csv():
    text = textwrap.dedent('''\
        some program output
        "ID","Kernel Name","dram__bytes_read.sum","lts__t_sectors_srcunit_tex_op_read.sum"
        "","","Mbyte","Ksector"
        "0","void flash_q_outer<__half>(const T1 *, int)","12.5","3"
        ''')
    (x,) = ncu.parse_ncu_csv(text, metrics=("dram__bytes_read.sum", "lts__t_sectors_srcunit_tex_op_read.sum"))
    assert x["function"] == "flash_q_outer"
    assert x["metrics"] == {"dram__bytes_read.sum": 12_500_000, "lts__t_sectors_srcunit_tex_op_read.sum": 3000}
    with pytest.raises(ValueError, match="unknown ncu unit"):
        ncu.unit_scale("furlong")


@pytest.mark.parametrize("name, base", [("void gemm<__half, 0, 1, 0, 1, 4>(const T1 *, int)", "gemm"),
                                        ("rowmax", "rowmax"), ("cupy_fill", "cupy_fill"),
                                        ("void two_pass_stats<__nv_bfloat16, 1>(const T1 *)", "two_pass_stats")])
def test_function_base(name, base):
    assert ncu.function_base(name) == base


# ---------------------------------------------------------------------------------------------
# matching launches to stages

def test_match_recorded_launches_to_stages():
    plan = sample_plan()
    stages = {plan.label: tuple(s.name for s in plan.stages)}
    launches = ncu.parse_ncu_csv(SAMPLE.read_text())
    # the recorded program ran the plain build, then the counting build: the plan twice
    expected = profile.expected_launches([plan], stages) * 2
    matched, ignored = profile.match_launches(launches, expected)
    assert [(s.name, x["id"]) for _, s, x in matched] == list(zip(["qk", "rowmax", "rowsum", "normalize", "pv"] * 2,
                                                                  PLAIN_IDS + COUNTING_IDS, strict=True))
    assert {x["function"] for x in ignored} == {"cupy_copy__float32_float16", "cupy_fill"}
    with pytest.raises(RuntimeError, match=r"reported 10 iokernels launches.*expected 5"):
        profile.match_launches(launches, expected[:5])
    swapped = [expected[1], expected[0], *expected[2:]]
    with pytest.raises(RuntimeError, match="expected 10"):
        profile.match_launches(launches, swapped)


def test_select_plans_and_stages():
    plans = all_plans(N_q=256, d=64, dtype="float16", sram=96 * 1024, backward=True)
    chosen = profile.select_plans(plans, "standard/default/fwd, flash/q_outer,flash/kv_outer/bwd")
    assert [p.label for p in chosen] == ["standard/default/fwd", "flash/q_outer/fwd", "flash/kv_outer/bwd"]
    assert profile.select_plans(plans, None) == plans
    sel = profile.select_stages(chosen, "gemm,main")
    assert sel == {"standard/default/fwd": ("qk", "pv"), "flash/q_outer/fwd": ("main",),
                   "flash/kv_outer/bwd": ("main",)}
    assert profile.select_stages(chosen, "flash_bwd_prep") == {"flash/kv_outer/bwd": ("prep",)}
    with pytest.raises(ValueError, match="bogus matches no stage"):
        profile.select_stages(chosen, "qk,bogus")
    with pytest.raises(ValueError, match="matches none of the plans"):
        profile.select_plans(all_plans(N_q=256, d=64, sram=96 * 1024), "flash/kv_outer/bwd")
    with pytest.raises(ValueError, match="not algorithm"):
        profile.select_plans(plans, "flashy")


# ---------------------------------------------------------------------------------------------
# the report, and the tolerance idea checked on the recorded launches

def test_report_rows_from_recorded_sample():
    doc = sample_doc()
    rows = {r["stage"]: r for r in doc["rows"]}
    assert [r["stage"] for r in doc["rows"]] == ["all", "qk", "rowmax", "rowsum", "normalize", "pv"]
    qk = rows["qk"]
    assert (qk["counted_read_bytes"], qk["counted_write_bytes"]) == (2_048_000, 2_000_000)
    assert qk["predicted_bytes"] == qk["counted_bytes"] == 4_048_000
    assert (qk["l1_read_bytes"], qk["l1_write_bytes"]) == (2_048_000, 4_000_000)
    assert qk["l1_over_counted"] == pytest.approx(6_048_000 / 4_048_000)
    assert qk["dram_bytes"] == 304_896 and qk["requested_bytes"] is None and qk["ncu_id"] == 8
    total = rows["all"]
    assert total["complete"] and total["counted_bytes"] == sum(r["counted_bytes"] for r in doc["rows"][1:])
    assert total["l1_bytes"] == sum(r["l1_bytes"] for r in doc["rows"][1:])
    assert {t["tensor"] for t in rows["normalize"]["tensors"]} == {"S", "P", "m", "l"}
    assert len(doc["ignored_launches"]) == 8
    json.dumps(doc)  # serialisable as is


def test_recorded_l1_bytes_obey_the_sector_bound():
    """The GPU test's tolerance, on real launches: counted <= L1 <= 2 x counted of the tensors moved
    in 16-byte pieces + 8 x counted of the float32 ones (one 4-byte value per 32-byte sector).
    N=1000 leaves odd rows of S and P 16 bytes off a sector boundary, so S reads here exceed the
    counted bytes by 3.2% (the GPU test uses aligned sizes, where they are exact)."""
    for row in sample_doc()["rows"][1:]:
        f32 = [t for t in row["tensors"] if t["tensor"] in FLOAT32_TENSORS]
        other = [t for t in row["tensors"] if t["tensor"] not in FLOAT32_TENSORS]
        for d in ("read", "write"):
            bound = sum(2 * t[f"counted_{d}_bytes"] for t in other) + sum(8 * t[f"counted_{d}_bytes"] for t in f32)
            assert row[f"counted_{d}_bytes"] <= row[f"l1_{d}_bytes"] <= bound, (row["stage"], d)
    rows = {r["stage"]: r for r in sample_doc()["rows"]}
    # the parts that do not depend on row alignment are exact multiples, as the GPU test expects
    assert rows["qk"]["l1_read_bytes"] == rows["qk"]["counted_read_bytes"]  # Q, K: 16-byte vectors
    assert rows["qk"]["l1_write_bytes"] == 2 * rows["qk"]["counted_write_bytes"]  # half2 pairs of mma
    assert rows["pv"]["l1_write_bytes"] == 2 * rows["pv"]["counted_write_bytes"]
    assert rows["rowmax"]["l1_write_bytes"] == 8 * rows["rowmax"]["counted_write_bytes"]  # m: thread 0
    assert rows["rowsum"]["l1_write_bytes"] == 8 * rows["rowsum"]["counted_write_bytes"]  # l: thread 0


def test_recorded_dram_with_and_without_cache_control():
    """With caches flushed (all) qk reads Q and K from DRAM; without (none) they are still in L2 from
    the input copies, so qk reads next to nothing from DRAM."""
    plain = {x["id"]: x for x in ncu.parse_ncu_csv(SAMPLE.read_text())}
    warm = {x["id"]: x for x in ncu.parse_ncu_csv(SAMPLE_NONE.read_text())}
    unique_qk = 2 * 1000 * 64 * 2
    assert plain[8]["metrics"]["dram__bytes_read.sum"] >= unique_qk
    assert warm[8]["metrics"]["dram__bytes_read.sum"] < unique_qk / 10


def test_render_text_and_summary():
    doc = sample_doc()
    text = profile.render(doc)
    assert "NVIDIA H200" in text and "--cache-control all" in text and "--clock-control none" in text
    line = next(x for x in text.splitlines() if x.startswith("standard") and " qk " in x)
    assert "4,048,000" in line and "6,048,000" in line and "1.494" in line
    assert "ignored 8 launches" in text and "cupy_fill" in text
    detail = profile.render(doc, detail=True)
    assert "1,024,000r 0w" in detail
    table = profile.summary([doc])
    assert "standard" in table and "15,220,000" in table and "1.199" in table


def test_render_entry_point(tmp_path, capsys):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(sample_doc()))
    assert profile.main(["--render", str(path)]) == 0
    assert "L1/counted" in capsys.readouterr().out
    assert profile.main(["--summary", str(path), str(path)]) == 0
    assert capsys.readouterr().out.count("standard") == 2


# ---------------------------------------------------------------------------------------------
# the whole path with a stand-in ncu (no GPU): command line, log file, child result, report

FAKE_NCU = """\
#!{python}
import json, os, pickle, re, sys
argv = sys.argv[1:]
if "--version" in argv:
    print("NVIDIA (R) Nsight Compute Command Line Profiler")
    print("Version 2025.3.1.0 (build 1) (public-release)")
    sys.exit(0)
with open(os.environ["FAKE_NCU_ARGV"], "w") as f:
    json.dump(argv, f)
mode = os.environ["FAKE_NCU_MODE"]
if mode == "perm":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
          "Performance Counters on the target device 0.")
    sys.exit(1)
if mode == "crash":
    print("Traceback (most recent call last):", file=sys.stderr)
    print("RuntimeError: this needs a CUDA GPU; cupy sees no device", file=sys.stderr)
    sys.exit(1)
from iokernels import model
log = argv[argv.index("--log-file") + 1]
spec = pickle.load(open(argv[argv.index("--run") + 1], "rb"))
lines = open(os.environ["FAKE_NCU_SAMPLE"]).read().splitlines()
launch = [re.match(r'^"(\\d+)"', x) for x in lines]  # the plain build's launches only: IDs <= 12
keep = [x for x, m in zip(lines, launch) if m is None or int(m.group(1)) <= 12]
open(log, "w").write("\\n".join(keep) + "\\n")
counts = {{p.label: {{s: {{t: list(rw) for t, rw in ts.items()}} for s, ts in model.exact(p).items()}}
          for p in spec["plans"]}}
json.dump({{"counts": counts, "inputs": {{p.label: "make_device_inputs" for p in spec["plans"]}},
           "environment": {{"gpu": "stand-in"}}}}, open(spec["out"], "w"))
"""


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    script = tmp_path / "bin" / "ncu"
    script.parent.mkdir()
    script.write_text(FAKE_NCU.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_NCU_ARGV", str(tmp_path / "argv.json"))
    monkeypatch.setenv("FAKE_NCU_SAMPLE", str(SAMPLE))
    monkeypatch.setenv("FAKE_NCU_MODE", "ok")
    monkeypatch.setattr(profile, "check_environment", lambda: str(script))  # no cupy needed
    return tmp_path


def test_profile_command_with_stand_in_ncu(fake_ncu):
    result = CliRunner().invoke(cli, ["profile", "--N", "1000", "--d", "64", "--dtype", "float16", "--sram", "96KB",
                                      "--algorithms", "standard", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    argv = json.loads((fake_ncu / "argv.json").read_text())
    i = argv.index("--metrics")
    assert argv[argv.index("--clock-control") + 1] == "none" and argv[argv.index("--cache-control") + 1] == "all"
    assert argv[argv.index("--profile-from-start") + 1] == "off"
    assert set(argv[i + 1].split(",")) == set(ncu.METRICS.values())
    assert argv[argv.index("--page") + 1] == "raw" and "--csv" in argv
    assert argv[argv.index("--run") - 2:argv.index("--run")] == ["-m", "iokernels.analysis.profile"]
    assert [r["stage"] for r in doc["rows"]] == ["all", "qk", "rowmax", "rowsum", "normalize", "pv"]
    assert [r["ncu_id"] for r in doc["rows"][1:]] == PLAIN_IDS
    assert all(r["counted_bytes"] == r["predicted_bytes"] for r in doc["rows"])
    h = doc["header"]
    assert h["ncu_version"] == "2025.3.1.0 (build 1) (public-release)" and h["cache_control"] == "all"
    assert h["N_q"] == 1000 and h["dtype"] == "float16" and h["environment"] == {"gpu": "stand-in"}
    assert "<spec.pickle>" in h["ncu_command"]
    text = CliRunner().invoke(cli, ["profile", "--N", "1000", "--dtype", "float16", "--sram", "96KB",
                                    "--algorithms", "standard", "--kernels", "qk,rowmax,rowsum,normalize,pv",
                                    "--cache-control", "none"])
    assert text.exit_code == 0 and "--cache-control none" in text.stdout and "1.494" in text.stdout


def test_stand_in_ncu_launch_mismatch_is_one_line(fake_ncu):
    result = CliRunner().invoke(cli, ["profile", "--N", "1000", "--dtype", "float16", "--sram", "96KB",
                                      "--algorithms", "standard", "--kernels", "qk"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert "reported 2 iokernels launches (gemm, gemm), expected 1" in lines[-1] and "Traceback" not in result.stderr


def test_permission_error_text(fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "perm")
    with pytest.raises(ncu.NcuPermissionError, match=r"ERR_NVGPUCTRPERM.*CAP_PERFMON"):
        profile.profile([sample_plan()], ncu=shutil.which("ncu"))
    result = CliRunner().invoke(cli, ["profile", "--N", "1000", "--dtype", "float16", "--sram", "96KB",
                                      "--algorithms", "standard"])
    assert result.exit_code == 1
    err = result.stderr.strip().splitlines()[-1]
    assert err.startswith("iokernels: error: ncu may not read the GPU performance counters (ERR_NVGPUCTRPERM)")


def test_child_failure_is_one_line(fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "crash")
    with pytest.raises(RuntimeError, match=r"ncu exited with code 1: RuntimeError: this needs a CUDA GPU"):
        profile.profile([sample_plan()], ncu=shutil.which("ncu"))


def test_check_ncu_output_messages():
    with pytest.raises(ncu.NcuPermissionError):
        ncu.check_ncu_output(0, "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission")
    with pytest.raises(RuntimeError, match="==ERROR== Failed to find metric foo"):
        ncu.check_ncu_output(1, "==PROF== x\n==ERROR== Failed to find metric foo\n==ERROR== more\n")
    ncu.check_ncu_output(0, "==PROF== Disconnected")


def test_missing_ncu_is_one_line_exit_1(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(ncu.NcuMissing, match="not on PATH"):
        profile.profile([sample_plan()])
    result = CliRunner().invoke(cli, ["profile", "--N", "64"])
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs Nsight Compute's `ncu`, which is not on PATH" in lines[0]


def test_no_cupy_is_one_line_exit_1(monkeypatch, tmp_path):
    try:
        import cupy  # noqa: F401
        pytest.skip("cupy installed")
    except ImportError:
        pass
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: str(tmp_path / "ncu"))
    result = CliRunner().invoke(cli, ["profile", "--N", "64"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cupy is not installed" in lines[0]


def test_model_of_the_sample_plan_is_what_the_probe_counted():
    plan = sample_plan()
    assert {s: dict(ts) for s, ts in model.exact(plan).items()} == sample_counts()
