"""iokernels roofline without a GPU: the predicted columns, the defaults, JSON, the plot and the errors."""

import json

import pytest
from click.testing import CliRunner

from iokernels.cli import cli


def run(*args):
    return CliRunner().invoke(cli, list(args))


def test_roofline_json_predicted_only():
    result = run("roofline", "--N", "512", "--d", "64", "--dtype", "float16", "--backward", "--model-only", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    h = doc["header"]
    assert h["source"] == "model" and "predicted columns only" in h["note"]
    assert (h["batch"], h["heads"]) == (9, 16) and "132 SMs" in h["problem_note"]
    assert h["ceilings"]["flops_per_s"] == 989e12 and h["ceilings"]["bytes_per_s"] == 4800e9
    labels = {r["label"] for r in doc["rows"]}
    assert "flash/fast/bwd" in labels and "standard/default/bwd" in labels
    for label in labels:
        rows = [r for r in doc["rows"] if r["label"] == label]
        total = next(r for r in rows if r["stage"] == "all")
        assert total["flops"] == sum(r["flops"] for r in rows if r["stage"] != "all")
        assert total["bytes"] == sum(r["bytes"] for r in rows if r["stage"] != "all")
        assert all(r["seconds"] is None for r in rows)
    # q_outer: 2 products of 512 x 512 x 64 per batch-head, 2 FLOPs per multiply-add, 144 batch-heads (9 x 16)
    main = next(r for r in doc["rows"] if r["label"] == "flash/q_outer/fwd" and r["stage"] == "main")
    assert main["flops"] == 2 * 2 * 512 * 512 * 64 * 144


def test_roofline_text_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "roof.png"
    result = run("roofline", "--N", "256", "--d", "64", "--batch", "2", "--heads", "2", "--plot", str(path))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "batch x heads = 2 x 2: as given" in out and "FLOP/B" in out and "roofline ms" in out
    assert "spec: fp32 (CUDA cores) 67 TFLOP/s, HBM 4800 GB/s" in out
    assert path.stat().st_size > 0


def test_roofline_dram_needs_a_gpu():
    result = run("roofline", "--N", "256", "--model-only", "--dram")
    assert result.exit_code == 1 and "--dram needs a CUDA GPU" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_roofline_user_errors():
    result = run("roofline", "--N", "256", "--repeats", "0")
    assert result.exit_code == 2 and "--repeats must be >= 1" in result.stderr
