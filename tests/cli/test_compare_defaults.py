"""compare's defaults: batch x heads that fill the GPU, stated in the header; explicit values kept; the
simulator counts one batch-head and scales; the roofline's bound column and time-against-bytes lines."""

import json

from click.testing import CliRunner

from iokernels.analysis.compare import MEMORY_FRACTION, filling_problem
from iokernels.cli import cli
from iokernels.kernels.launch import plan_device_bytes
from iokernels.plan import all_plans

N = 4096


def run(*args):
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result


def make(batch, heads):
    return all_plans(N_q=N, N_k=N, d=64, dtype="float32", sram=192 * 1024, batch=batch, heads=heads,
                     smem_limit=227 * 1024)


def smallest_grid(plans):
    return min(s.grid[0] * s.grid[1] * s.grid[2] for p in plans for s in p.stages)


def test_filling_problem_fills_the_sms():
    plans, note = filling_problem(make, 132)
    # flash kv_outer's main stage launches one block per batch-head (grid 1 x 1 x BH): BH >= 132 with 16 heads
    # takes batch >= 9, and 144 blocks run in two waves of 132, 55 % full; batch 15 gives 240 blocks in two
    # waves 91 % full (240 / 264), the first batch from 9 up whose waves are at least 90 % full
    assert (plans[0].batch, plans[0].heads) == (15, 16)
    assert smallest_grid(make(8, 16)) < 132 <= smallest_grid(plans) == 240
    assert all(16 * b / (-(-16 * b // 132) * 132) < 0.9 for b in range(9, 15))
    assert "fills the 132 SMs" in note and "flash/kv_outer/fwd main: 240 blocks" in note
    assert "device memory not checked" in note


def test_filling_problem_stays_within_device_memory():
    # standard's tensors per batch-head: Q, K, V, O (N x d), S, P (N x N), m, l (N), float32
    per_head = 4 * (4 * N * 64 + 2 * N * N + 2 * N)
    memory = 10 * 2**30
    plans, note = filling_problem(make, 132, memory)
    batch = plans[0].batch
    assert max(plan_device_bytes(p) for p in plans) == 16 * batch * per_head
    assert 16 * batch * per_head <= MEMORY_FRACTION * memory < 16 * (batch + 1) * per_head
    assert batch == 2 and "not 15" in note


def test_filling_problem_with_grouped_query_heads():
    plans, _ = filling_problem(lambda b, h: all_plans(N_q=256, N_k=256, d=64, dtype="float16", sram=227 * 1024,
                                                      batch=b, heads=h, kv_heads=3, smem_limit=227 * 1024), 132,
                               kv_heads=3)
    assert plans[0].heads == 3 and plans[0].kv_heads == 3 and smallest_grid(plans) >= 132


def test_compare_defaults_fill_the_gpu_and_scale_the_simulator():
    doc = json.loads(run("compare", "--N", "1024", "--d", "64", "--sram", "192KB", "--json").stdout)
    h = doc["header"]
    assert (h["batch"], h["heads"]) == (15, 16)
    assert "132 SMs" in h["problem_note"]
    assert "simulated one batch-head, bytes scaled by BH" in h["note"]
    assert set(h["simulated_one_batch_head"]) == {p["algorithm"] + "/" + p["schedule"] + "/" + p["pass"]
                                                 for p in h["plans"]}
    for row in doc["rows"] + doc["stages"]:
        assert row["measured_bytes"] == row["predicted_bytes"], row
    q = next(r for r in doc["rows"] if (r["schedule"], r["tensor"]) == ("q_outer", "Q"))
    assert q["measured_read_bytes"] == 240 * 1024 * 64 * 4  # Q read once, every batch-head
    totals = [r for r in doc["rows"] if r["tensor"] == "total"]
    assert all(r["bound"] in ("compute", "memory") and r["roofline_stage_seconds"] > 0 for r in totals)
    checks = {c["denominator"]: c for c in h["roofline"]["checks"]}
    assert checks["flash/q_outer/fwd"]["ranks_as_bytes"]
    assert "compute-bound" in checks["flash/q_outer/fwd"]["reason"]  # float32 on CUDA cores


def test_compare_text_states_the_defaults_and_the_bound():
    out = run("compare", "--N", "512", "--d", "64", "--sram", "96KB", "--gpu", "a100").stdout
    # A100: 108 SMs; kv_outer's main stage one block per batch-head: batch 12 gives 192 blocks in two waves
    # 89 % full (192 / 216), batch 13 gives 208, 96 %
    assert "batch x heads = 13 x 16: heads 16" in out and "fills the 108 SMs" in out
    assert "roofline ms" in out and " bound " in out and "time/roofline" in out
    assert "time against bytes" in out and "flash/q_outer/fwd: bytes" in out


def test_compare_keeps_explicit_batch_and_heads():
    doc = json.loads(run("compare", "--N", "128", "--d", "32", "--sram", "48KB", "--batch", "2", "--json").stdout)
    assert (doc["header"]["batch"], doc["header"]["heads"]) == (2, 1)
    assert doc["header"]["problem_note"] == "as given (--batch, --heads)"
    doc = json.loads(run("compare", "--N", "128", "--d", "32", "--sram", "48KB", "--heads", "3", "--json").stdout)
    assert (doc["header"]["batch"], doc["header"]["heads"]) == (1, 3)


def test_model_keeps_its_defaults():
    doc = json.loads(run("model", "--N", "1024", "--d", "64", "--json").stdout)
    assert (doc["header"]["batch"], doc["header"]["heads"]) == (1, 1)
