"""``iokernels paper fig2`` on the CPU: predicted columns only, said so; JSON; errors; the plot."""

import json

import pytest
from click.testing import CliRunner

from iokernels.cli import cli


def run(*args):
    return CliRunner().invoke(cli, ["paper", "fig2", *args], catch_exceptions=False)


def test_fig2_without_gpu_predicts_and_says_so():
    result = run("--predict-only")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "predicted columns only (--predict-only)" in out
    for title in ("left: GPT-2 medium", "middle: flash/kv_outer forward", "right: block-sparse flash/kv_outer"):
        assert title in out
    assert "824.6" in out  # standard's GFLOPs: 6 products of 2·1024²·64 FLOPs, times 64·16
    assert "dQacc" in out


def test_fig2_no_device_found(monkeypatch):
    monkeypatch.setattr("iokernels.cli.paper.current_device_spec", lambda: None)
    result = run("--panels", "right", "--densities", "1,0.25")
    assert result.exit_code == 0, result.output
    assert "predicted columns only (no CUDA device found)" in result.stdout
    assert "counted GB" in result.stdout and "0.25" in result.stdout


def test_fig2_json_is_one_document():
    result = run("--predict-only", "--json", "--panels", "middle,left", "--spec", "a100", "--N", "512")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    h = doc["header"]
    assert h["measured"] is False and h["panels"] == ["left", "middle"] and "right" not in doc
    assert h["spec"]["key"] == "a100-80gb" and h["problem"]["sram"] == h["spec"]["smem_per_block_bytes"]
    assert h["problem"]["N"] == 512 and "commit" in h and "environment" in h
    assert h["command"].startswith("iokernels paper fig2") and "--spec a100" in h["command"]
    assert "--N 512" in h["command"]
    # the A100's M (163 KB), float16, d = 64: K and V blocks of 512 rows take 128 KB (B_r shrinks to fit the
    # rest), of 1024 rows 256 KB
    assert [p["block"] for p in doc["middle"]["points"]] == [64, 128, 256, 512]
    assert doc["middle"]["first_not_fitting"] == 1024
    assert doc["middle"]["points"][-1]["tiles"]["Br"] < 64
    standard = doc["left"]["rows"][0]
    # the A100's roofline (312 TFLOP/s float16 tensor cores, 2039 GB/s) per pass, added up
    assert standard["roofline_seconds"] == pytest.approx(
        sum(max(p["flops"] / 312e12, p["predicted_bytes"] / 2039e9) for p in standard["passes"]))


def test_fig2_sram_and_schedule():
    result = run("--predict-only", "--json", "--panels", "middle", "--sram", "96KB", "--schedule", "q_outer")
    doc = json.loads(result.stdout)
    assert doc["header"]["problem"]["sram"] == 96 * 1024
    assert doc["middle"]["knob"] == "block_r"
    assert all(p["tiles"]["Br"] == p["block"] for p in doc["middle"]["points"])


@pytest.mark.parametrize("args,message", [
    (("--panels", "nonsense"), "--panels"),
    (("--densities", "1,abc"), "--densities"),
    (("--densities", "0,0.5"), "positive"),
    (("--spec", "nosuchgpu"), "unknown GPU"),
    (("--dtype", "int8"), "int8"),
    (("--repeats", "0"), "--repeats"),
])
def test_fig2_bad_input_is_one_line_exit_2(args, message):
    result = CliRunner().invoke(cli, ["paper", "fig2", "--predict-only", *args])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("iokernels: error:") and message in lines[0]


def test_fig2_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "fig2.png"
    result = run("--predict-only", "--plot", str(path), "--N", "256", "--batch", "2", "--heads", "2")
    assert result.exit_code == 0, result.output
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
