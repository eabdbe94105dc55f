import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from iokernels.cli import cli

HEADER_KEYS = {"gpu", "dtype", "N_q", "N_k", "d", "batch", "heads", "sram_bytes", "plans"}
ROW_KEYS = {"algorithm", "schedule", "pass", "tensor", "predicted_read_bytes", "predicted_write_bytes",
            "predicted_bytes", "measured_read_bytes", "measured_write_bytes", "measured_bytes", "theta_bytes",
            "source"}
ALL_PLANS = {("standard", "default", "fwd"), ("standard", "default", "bwd"), ("two_pass", "store", "fwd"),
             ("two_pass", "recompute", "fwd"), ("flash", "kv_outer", "fwd"), ("flash", "q_outer", "fwd"),
             ("flash", "kv_outer", "bwd")}


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def run_json(*args):
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def check_simulated_equals_predicted(doc):
    assert HEADER_KEYS <= set(doc["header"])
    assert doc["header"]["source"] == "simulator" and "simulator" in doc["header"]["note"]
    assert {(r["algorithm"], r["schedule"], r["pass"]) for r in doc["rows"]} == ALL_PLANS
    for row in doc["rows"] + doc["stages"]:
        assert ROW_KEYS <= set(row) | {"theta_bytes"}
        assert row["measured_bytes"] == row["predicted_bytes"], row
        assert row["measured_read_bytes"] == row["predicted_read_bytes"], row
        assert row["measured_write_bytes"] == row["predicted_write_bytes"], row
    totals = [r for r in doc["rows"] if r["tensor"] == "total"]
    assert len(totals) == len(ALL_PLANS)
    for t in totals:
        assert t["theta_bytes"] > 0 and t["max_rel_err"] < 1e-10
        per_tensor = [r for r in doc["rows"] if r["tensor"] != "total"
                      and (r["algorithm"], r["schedule"], r["pass"]) == (t["algorithm"], t["schedule"], t["pass"])]
        assert sum(r["predicted_bytes"] for r in per_tensor) == t["predicted_bytes"]


def test_compare_ragged_simulated_equals_predicted():
    doc = run_json("compare", "--simulate", "--N", "1000", "--d", "64", "--sram", "48KB", "--backward")
    check_simulated_equals_predicted(doc)
    assert doc["header"]["sram_bytes"] == 49152 and doc["header"]["N_q"] == 1000


def test_compare_headline_simulated_equals_predicted():
    doc = run_json("compare", "--N", "4096", "--d", "64", "--sram", "192KB", "--backward")
    check_simulated_equals_predicted(doc)
    ratios = {r["denominator"]: r for r in doc["header"]["ratios"]}
    assert ratios["flash/q_outer/fwd"]["measured"] == pytest.approx(ratios["flash/q_outer/fwd"]["predicted"])
    assert ratios["flash/q_outer/fwd"]["predicted"] > 2  # flash moves fewer bytes than standard


def test_compare_text_table_and_detail():
    # 48 KiB: the tensor-core forward at d 32 (the tma kernel's 64-wide tile) needs it
    result = run("compare", "--simulate", "--Nq", "100", "--Nk", "37", "--d", "32", "--sram", "48KiB",
                 "--dtype", "bfloat16", "--batch", "2", "--heads", "3", "--detail")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "CPU simulator (--simulate)" in out and "49,152 bytes" in out and "24,576 elements" in out
    assert "flash/fast/fwd" in out
    assert "Br=" in out and "BM=" in out  # each plan's tiles in the header
    assert " lse " in out and " rowmax " in out  # tensors and stages with --detail
    table = [line for line in out.splitlines() if line.startswith(("standard ", "two_pass ", "flash "))]
    assert table and all(" 1.000 " in line for line in table)


def test_model_command_json_and_formulas():
    doc = run_json("model", "--N", "4096", "--d", "64", "--sram", "160KB", "--gpu", "a100", "--backward")
    assert doc["header"]["gpu"] == "A100 80GB SXM"
    for row in doc["rows"]:
        assert row["source"] == "model" and row["measured_bytes"] is None
        assert (row["theta_bytes"] is not None) == (row["tensor"] == "total")
    assert set(doc["formulas"]) == {"/".join(k) for k in ALL_PLANS}
    text = run("model", "--N", "4096", "--d", "64", "--latex").stdout
    assert "\\frac" in text and "roofline" in text and "FLOP/B" in text


@pytest.mark.parametrize("size", ["192KB", "192KiB", "196608", "0.1875MB"])
def test_size_spellings_agree(size):
    assert run_json("model", "--N", "64", "--sram", size)["header"]["sram_bytes"] == 196608


def test_help_says_what_kb_means():
    assert "1 KB = 1024 bytes" in " ".join(run("compare", "--help").stdout.split())


def test_specs():
    doc = run_json("specs")
    assert {"h200", "a100-80gb", "b200"} <= {r["key"] for r in doc["rows"]}
    assert "227.00 KiB" in run("specs").stdout


@pytest.mark.parametrize("args, message", [
    (["compare", "--N", "0"], "N_q must be an integer >= 1"),
    (["compare", "--N", "10", "--d", "65"], "unsupported head dimension d=65"),
    (["compare", "--N", "10", "--dtype", "int8"], "unsupported dtype"),
    (["compare", "--N", "10", "--sram", "1KB"], "smallest M that works is"),
    (["compare", "--N", "10", "--sram", "300KB", "--gpu", "h200"], "exceeds the per-block shared-memory limit"),
    (["model", "--N", "10", "--sram", "192KB", "--gpu", "a100"], "limit of A100 80GB SXM, 166912 bytes"),
    (["model", "--N", "10", "--gpu", "x100"], "unknown GPU 'x100'"),
    (["model", "--N", "10", "--sram", "12QB"], "malformed size '12QB'"),
    (["model", "--d", "64"], "give --N"),
    (["model", "--N", "abc"], "'abc' is not a valid integer"),
    (["compare", "--bogus"], "No such option"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr


def test_console_script_exit_code():
    proc = subprocess.run([sys.executable, "-m", "iokernels.cli", "model", "--N", "-5"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "N_q" in proc.stderr


def test_kernel_bench_without_cupy_is_one_line():
    try:
        import cupy  # noqa: F401
        pytest.skip("cupy installed")
    except ImportError:
        pass
    result = CliRunner().invoke(cli, ["kernel-bench", "--N", "64"])
    assert result.exit_code == 1 and "cupy is not installed" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_compare_grouped_query_attention_rows():
    """--kv-heads: the flash/fast plans only (forward and backward), measured (simulated) == predicted, and
    the backward's K, V bytes per K/V head: a quarter of those of --kv-heads 8 for the same tiles."""
    def run(kv_heads):
        result = CliRunner().invoke(cli, ["compare", "--simulate", "--N", "200", "--d", "64", "--sram", "227KB",
                                          "--dtype", "float16", "--heads", "8", "--kv-heads", str(kv_heads),
                                          "--backward", "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    grouped, plain = run(2), run(8)
    assert grouped["header"]["kv_heads"] == 2
    totals = [r for r in grouped["rows"] if r["tensor"] == "total"]
    assert {(r["algorithm"], r["schedule"], r["pass"]) for r in totals} == {("flash", "fast", "fwd"),
                                                                            ("flash", "fast", "bwd")}
    assert all(r["measured_bytes"] == r["predicted_bytes"] for r in totals)

    def kv_bytes(doc):
        return sum(r["predicted_bytes"] for r in doc["rows"]
                   if (r["schedule"], r["pass"]) == ("fast", "bwd") and r["tensor"] in ("K", "V", "dK", "dV"))

    assert kv_bytes(grouped) * 4 == kv_bytes(plain)
    result = CliRunner().invoke(cli, ["compare", "--simulate", "--N", "64", "--d", "64", "--heads", "8",
                                      "--kv-heads", "2"])
    assert result.exit_code == 2 and "grouped-query" in result.output
