"""``iokernels sweep`` on the CPU simulator: points, fits against theory, block study, M < d², outputs."""

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from iokernels.analysis import sweep
from iokernels.cli import cli

pytest.importorskip("scipy")


def run_json(*args):
    result = CliRunner().invoke(cli, ["sweep", "--simulate", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def fits_by(doc, quantity="bytes"):
    return {f"{f['algorithm']}/{f['schedule']}/{f['pass']}": f for f in doc["fits"] if f["quantity"] == quantity}


def check_points(doc):
    for p in doc["points"]:
        assert p["source"] == "simulator" and p["max_rel_err"] < 1e-10
        assert p["measured_bytes"] == p["predicted_bytes"] and p["measured_over_predicted"] == 1.0
        assert p["seconds"] is None  # no timings on the simulator, so no time fits
    assert all(f["quantity"] == "bytes" for f in doc["fits"])


def test_n_sweep_exponents_near_two():
    doc = run_json("--vary", "N", "--values", "512,1024,2048", "--d", "16", "--sram", "4KB",
                   "--algorithms", "flash,standard", "--schedules", "q_outer,default")
    check_points(doc)
    assert doc["header"]["vary"] == "N" and doc["header"]["values"] == [512, 1024, 2048]
    assert [(p["schedule"], p["value"], p["N_q"]) for p in doc["points"]] == [
        ("default", 512, 512), ("default", 1024, 1024), ("default", 2048, 2048),
        ("q_outer", 512, 512), ("q_outer", 1024, 1024), ("q_outer", 2048, 2048)]
    fits = fits_by(doc)
    assert set(fits) == {"standard/default/fwd", "flash/q_outer/fwd"}
    for f in fits.values():
        assert 1.9 <= f["exponent"] <= 2.05, f
        assert f["theory_exponent"] == 2.0 and f["flops_exponent"] == pytest.approx(2.0)
        assert f["ci_low"] <= f["exponent"] <= f["ci_high"] and f["n"] == 3
        assert f["exponent"] < f["end_exponent"] <= 2.0 + 1e-9  # closer to 2 at the large-N end
        # measured == exact model, so the measured fit is the model's slope, inside the interval
        assert f["model_exponent"] == pytest.approx(f["exponent"], abs=1e-9)
    # flash's linear term (Q, O once; K, V T_r times) is relatively larger: its slope is below standard's
    assert fits["flash/q_outer/fwd"]["exponent"] < fits["standard/default/fwd"]["exponent"]


def test_d_and_m_sweeps_against_theory():
    doc = run_json("--vary", "d", "--values", "16,32,64,128", "--N", "256", "--sram", "16KB",
                   "--algorithms", "flash,standard")
    check_points(doc)
    fits = fits_by(doc)
    assert [p["d"] for p in doc["points"] if p["schedule"] == "q_outer"] == [16, 32, 64, 128]
    assert fits["flash/q_outer/fwd"]["theory_exponent"] == pytest.approx(2.0)
    # Algorithm 1's l and m round trips add a d¹ term to its leading N² coefficient
    assert 1.9 < fits["flash/kv_outer/fwd"]["theory_exponent"] < 2.0
    # standard's N² bytes barely depend on d (only its matrix products' panel re-reads)
    assert 0 < fits["standard/default/fwd"]["theory_exponent"] < 0.5
    assert fits["flash/q_outer/fwd"]["flops_exponent"] == pytest.approx(1.0)

    doc = run_json("--vary", "M", "--values", "4KB,8KB,16KB,32KB", "--N", "1024", "--d", "16",
                   "--algorithms", "flash,standard")
    check_points(doc)
    fits = fits_by(doc)
    assert [p["sram_bytes"] for p in doc["points"] if p["schedule"] == "q_outer"] == [4096, 8192, 16384, 32768]
    for name in ("flash/q_outer/fwd", "flash/kv_outer/fwd"):
        f = fits[name]
        assert f["theory_exponent"] == pytest.approx(-1.0)
        assert -1.1 < f["exponent"] < -0.9 and f["ci_low"] <= f["exponent"] <= f["ci_high"]
        assert f["flops_exponent"] == pytest.approx(0.0, abs=1e-12)
    assert abs(fits["standard/default/fwd"]["exponent"]) < 0.15  # standard's bytes barely move with M
    assert all(r["plan"].startswith("flash") for r in doc["regime"])


def test_block_study_skips_what_does_not_fit_and_matches_the_model():
    doc = run_json("--vary", "block", "--values", "8,16,32,64,1024", "--N", "512", "--d", "16", "--sram", "32KB")
    check_points(doc)
    assert doc["header"]["block_tile"] == {"flash/kv_outer/fwd": "Bc", "flash/q_outer/fwd": "Br"}
    for p in doc["points"]:
        assert p["tiles"][doc["header"]["block_tile"][sweep.label(p)]] == p["value"]
        assert p["sram_bytes"] == 32 * 1024 and p["smem_bytes"] <= 32 * 1024
    assert {(s["value"], s["plan"]) for s in doc["skipped"]} == {(1024, "flash/kv_outer/fwd"),
                                                                 (1024, "flash/q_outer/fwd")}
    assert all("do not fit" in s["reason"] for s in doc["skipped"])
    for name, pts in sweep.groups(doc["points"]).items():
        assert [p["value"] for p in pts] == [8, 16, 32, 64]
        measured = [p["measured_bytes"] for p in pts]
        assert measured == sorted(measured, reverse=True) and len(set(measured)) == 4, name  # bigger: fewer
        f = fits_by(doc)[name]
        assert f["theory_exponent"] is None and -1.0 < f["exponent"] < -0.85


def test_m_below_d_squared_regime():
    doc = run_json("--vary", "M", "--values", "16KB,32KB,64KB,128KB,227KB", "--N", "256", "--d", "256",
                   "--schedules", "q_outer")
    check_points(doc)
    (reg,) = doc["regime"]
    assert reg["plan"] == "flash/q_outer/fwd" and reg["d2_elements"] == 65536
    rows = reg["points"]
    assert all(r["M_over_d2"] < 1 for r in rows)  # float32, d = 256: every M the H200 allows is below d²
    for r, p in zip(rows, doc["points"], strict=True):
        assert r["square_tiling_bytes"] == pytest.approx(4 * 256 * 256 * 256 / math.sqrt(p["sram_elements"]))
        assert r["over_square_tiling"] == pytest.approx(p["measured_bytes"] / r["square_tiling_bytes"])
    assert rows[0]["local_exponent"] is None
    assert all(r["local_exponent"] < -0.5 for r in rows[1:])  # flash falls faster than N²d/√M
    assert rows[-1]["over_square_tiling"] < rows[0]["over_square_tiling"]
    assert "keep falling" in reg["summary"] and "below d²" in reg["summary"]
    text = CliRunner().invoke(cli, ["sweep", "--simulate", "--vary", "M", "--values", "16KB,64KB", "--N", "128",
                                    "--d", "256", "--schedules", "q_outer"]).stdout
    assert "M against d²" in text and "N²d/√M B" in text


def test_csv_and_text(tmp_path):
    path = tmp_path / "out.csv"
    result = CliRunner().invoke(cli, ["sweep", "--simulate", "--vary", "N", "--values", "64,128,256", "--d", "16",
                                      "--sram", "8KB", "--algorithms", "flash", "--csv", str(path)])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 6 and list(rows[0]) == list(sweep.CSV_COLUMNS)
    assert [int(r["N_q"]) for r in rows] == [64, 128, 256] * 2
    assert all(r["measured_bytes"] == r["predicted_bytes"] and r["seconds"] == "" for r in rows)
    out = result.stdout
    assert "vary N over 64, 128, 256" in out and "log-log fits" in out and "kv_outer" in out
    assert "iokernels: sweep N on the CPU simulator" in result.stderr  # the progress bar, on stderr


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    for vary, values in (("N", "64,128,256"), ("M", "8KB,16KB,32KB")):
        path = tmp_path / f"{vary}.png"
        result = CliRunner().invoke(cli, ["sweep", "--simulate", "--vary", vary, "--values", values, "--N", "128",
                                          "--d", "64", "--algorithms", "flash,standard", "--backward",
                                          "--plot", str(path)])
        assert result.exit_code == 0, result.output
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert height > width / 2  # fwd and bwd: two rows of panels


@pytest.mark.parametrize("args, message", [
    (["--vary", "N", "--values", "64,x"], "'x' is not an integer"),
    (["--vary", "N", "--values", "64,,128"], "comma-separated list"),
    (["--vary", "N", "--values", "64,64"], "repeats a value"),
    (["--vary", "Q", "--values", "64"], "'Q' is not one of"),
    (["--vary", "d", "--values", "16,32"], "give --N"),
    (["--vary", "d", "--values", "16,60", "--N", "64"], "unsupported head dimension d=60"),
    (["--vary", "M", "--values", "48KB,1MB", "--N", "64"], "exceeds the GPU's per-block shared-memory limit"),
    (["--vary", "M", "--values", "48QB", "--N", "64"], "malformed size '48QB'"),
    (["--vary", "M", "--values", "16,32", "--N", "64"], "no point of this sweep fits"),
    (["--vary", "block", "--values", "64", "--N", "64", "--algorithms", "standard"], "standard attention has none"),
    (["--vary", "block", "--values", "4096", "--N", "64"], "no point of this sweep fits"),
    (["--vary", "N", "--values", "64", "--algorithms", "linear"], "unknown algorithm 'linear'"),
    (["--vary", "N", "--values", "64", "--schedules", "nope"], "'nope' is not a schedule"),
    (["--vary", "N", "--values", "64", "--gpu", "x100"], "unknown GPU 'x100'"),
    (["--vary", "N", "--values", "64", "--repeats", "0"], "--repeats must be >= 1"),
    (["--vary", "N", "--values", "1000000"], "the simulator would need"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = CliRunner().invoke(cli, ["sweep", "--simulate", *args])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr, lines


BLOCKED = """
import sys
for name in {blocked}:
    sys.modules[name] = None
import iokernels, iokernels.cli, iokernels.analysis.sweep, iokernels.analysis.fit, iokernels.analysis.plotting
from iokernels.cli import main
sys.argv = ["iokernels", "sweep", "--simulate", "--vary", "N", "--values", "32,64", "--d", "16", "--json"] + {extra}
main()
"""


@pytest.mark.parametrize("blocked, extra, code, message", [
    (["scipy", "cupy"], [], 1, "pip install 'iokernels[sweep]'"),
    (["matplotlib", "cupy"], ["--plot", "x.png"], 1, "pip install 'iokernels[plot]'"),
    (["scipy", "matplotlib", "cupy"], ["--no-fit"], 0, ""),
])
def test_optional_dependencies(tmp_path, blocked, extra, code, message):
    proc = subprocess.run([sys.executable, "-c", BLOCKED.format(blocked=blocked, extra=extra)], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == code, proc.stderr
    if code:
        assert proc.stderr.count("\n") == 1 and message in proc.stderr and proc.stdout == ""
    else:
        doc = json.loads(proc.stdout)
        assert doc["fits"] == [] and len(doc["points"]) == 2 * 5
    assert not (tmp_path / "x.png").exists()


def test_gpu_path_plumbing_time_fits_and_time_panel(monkeypatch, tmp_path):
    """The GPU branch of sweep.run with compare faked (no device here): kernels precompiled once per
    plan, the reference check passed through, timings fitted and drawn in a second panel."""
    from iokernels.analysis import compare as compare_module
    from iokernels.model.specs import get_spec

    calls, compiled = [], []

    def fake_compare(plans, spec, *, on_gpu, reason, seed, repeats, reference_check):
        calls.append((on_gpu, repeats, reference_check))
        doc = compare_module.compare(plans, spec, on_gpu=False, reason="test")
        total = next(r for r in doc["rows"] if r["tensor"] == "total")
        total.update(source="gpu", seconds=1e-12 * plans[0].N_q ** 2 * (3 if plans[0].algorithm == "flash" else 1))
        doc["header"]["warnings"] = [f"{plans[0].label}: grid underfills"]
        return doc

    monkeypatch.setattr(sweep, "compare", fake_compare)
    monkeypatch.setattr(sweep, "precompile", lambda plans: compiled.extend(plans))
    base = sweep.Problem(N_q=None, N_k=None, d=32, dtype="float32", sram=32 * 1024)
    keys = sweep.select("flash,standard", "q_outer,default", False, "N")
    doc = sweep.run("N", [128, 256, 512], keys, base, get_spec("h200"), on_gpu=True, repeats=3,
                    reference_check=False)
    assert calls == [(True, 3, False)] * 6 and len(compiled) == 6
    assert doc["header"]["repeats"] == 3 and doc["header"]["reference_check"] is False
    assert len(doc["header"]["warnings"]) == 2  # one per plan, not one per point
    times = fits_by(doc, "seconds")
    assert set(times) == {"standard/default/fwd", "flash/q_outer/fwd"}
    for f in times.values():
        assert f["exponent"] == pytest.approx(2.0) and f["flops_exponent"] == pytest.approx(2.0)
    text = sweep.render(doc)
    assert " seconds " in text and "warning: flash/q_outer/fwd: grid underfills" in text
    pytest.importorskip("matplotlib")
    from iokernels.analysis.plotting import plot

    path = tmp_path / "t.png"
    plot(doc, str(path))
    data = path.read_bytes()
    assert int.from_bytes(data[16:20], "big") > int.from_bytes(data[20:24], "big")  # bytes | time panels


def test_refit_of_a_no_fit_run_and_the_post_script(tmp_path):
    args = ["--vary", "M", "--values", "8KB,16KB,32KB", "--N", "128", "--d", "16", "--algorithms", "flash"]
    fitted = run_json(*args)
    bare = run_json(*args, "--no-fit")
    assert bare["fits"] == [] and fitted["fits"]
    assert sweep.refit(bare)["fits"] == fitted["fits"] and sweep.refit(bare)["regime"] == fitted["regime"]
    pytest.importorskip("matplotlib")
    path = tmp_path / "M.json"
    path.write_text(json.dumps(bare))
    (tmp_path / "M.txt").write_text("iokernels sweep --vary M ...\nold text\n")
    script = Path(__file__).resolve().parents[2] / "scripts" / "sweeps_post.py"
    proc = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(path.read_text())["fits"] == fitted["fits"]
    text = (tmp_path / "M.txt").read_text()
    assert text.startswith("iokernels sweep --vary M ...\n") and "log-log fits" in text and "old text" not in text
    assert (tmp_path / "M.png").read_bytes()[:4] == b"\x89PNG"
