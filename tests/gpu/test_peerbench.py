"""``iokernels bench`` on the GPU, tiny configurations: positive TFLOP/s where things run, labels
where they do not; the cupy peer checked against the float64 reference. Torch parts skip without
torch seeing the GPU."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from iokernels.bench import clocks, configs, implementations, suite
from iokernels.cli import cli
from iokernels.simulate import reference

cp = pytest.importorskip("cupy")

TINY = configs.Problem(batch=1, heads=2, n=256, d=64, dtype="float16")
QUICK = clocks.Timing(warmup=1, repeats=5, max_call_seconds=5.0)


def torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def rows_by(doc):
    return {(r["impl"], r["pass"], r["dtype"]): r for r in doc["rows"]}


def test_research_and_cupy_run_and_unavailable_peers_are_labelled():
    impls = implementations.make_impls(["iokernels_flash", "iokernels_standard", *implementations.PEERS])
    doc = suite.run([TINY, configs.Problem(1, 2, 256, 64, "bfloat16")], impls, QUICK)
    json.dumps(doc)
    rows = rows_by(doc)
    for impl in ("iokernels_flash", "iokernels_standard"):
        for p in configs.PASSES:
            for dtype in ("float16", "bfloat16"):
                r = rows[(impl, p, dtype)]
                assert r["status"] == "ok" and r["tflops"] > 0 and r["method"] == "cuda-graph", r
    for p in configs.PASSES:
        assert rows[("cupy_standard", p, "float16")]["status"] == "ok"
        assert rows[("cupy_standard", p, "float16")]["tflops"] > 0
        unsupported = rows[("cupy_standard", p, "bfloat16")]
        assert unsupported["status"] == "unsupported" and "bfloat16" in unsupported["note"]
    torch = torch_cuda()
    for name in implementations.TORCH_BACKENDS:
        for p in configs.PASSES:
            r = rows[(name, p, "float16")]
            if torch is None:
                assert r["status"] == "not available" and "torch" in r["note"]
            else:
                assert r["status"] in ("ok", "unsupported"), r
                assert (r["status"] == "ok") == (r["tflops"] is not None and r["tflops"] > 0)
                assert r["status"] == "ok" or r["note"]
    if torch is not None:
        for name in ("torch_flash", "torch_math"):
            assert rows[(name, "fwd", "float16")]["status"] == "ok"
            assert rows[(name, "bwd", "float16")]["status"] == "ok"
        assert any(r["peer"] == "torch_flash" and r["impl"] == "iokernels_flash" for r in doc["ratios"])
    assert "io-flash" in suite.render(doc)


def test_torch_float32_flash_is_unsupported_with_a_reason():
    if torch_cuda() is None:
        pytest.skip("torch with CUDA is not available")
    doc = suite.run([configs.Problem(1, 2, 256, 64, "float32")], implementations.make_impls(["torch_flash"]), QUICK,
                    backward=False)
    r = doc["rows"][0]
    assert r["status"] == "unsupported" and r["note"]


def test_fast_slot_is_measured_or_labelled():
    doc = suite.run([TINY], implementations.make_impls(["iokernels_fast"]), QUICK)
    for r in doc["rows"]:
        assert r["status"] in ("ok", "not available"), r
        assert (r["status"] == "ok" and r["tflops"] > 0) or "iokernels.plan.fast" in r["note"]


def _inputs(problem):
    shape = (problem.batch, problem.heads, problem.n, problem.d)
    return [implementations._random(cp, shape, i).astype(cp.float16) for i in range(4)]  # as CupyStandard makes them


def test_cupy_peer_matches_the_reference():
    q, k, v, do = (cp.asnumpy(x).astype(np.float64) for x in _inputs(TINY))
    o = cp.asnumpy(implementations.CupyStandard().setup(TINY, "fwd").call()[0]).astype(np.float64)
    want, _ = reference.forward(q, k, v)
    assert np.max(np.abs(o - want)) / np.max(np.abs(want)) < 1e-2
    grads = implementations.CupyStandard().setup(TINY, "bwd").call()
    for got, want in zip(grads, reference.backward(q, k, v, do), strict=True):
        got = cp.asnumpy(got).astype(np.float64)
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 2e-2


def test_oom_is_reported_and_the_run_goes_on():
    # standard attention's S alone: 32 heads x 65536^2 float16 = 256 GiB, more than any GPU has
    huge = configs.Problem(batch=1, heads=32, n=65536, d=64, dtype="float16", table="long")
    row = suite.measure(implementations.make_impls(["iokernels_standard"])[0], huge, "fwd", QUICK)
    assert row["status"] == "oom" and row["tflops"] == -1
    assert suite.measure(implementations.make_impls(["iokernels_flash"])[0], TINY, "fwd", QUICK)["status"] == "ok"


def test_cli_json_tiny():
    result = CliRunner().invoke(cli, ["bench", "--d", "64", "--N", "256", "--tokens", "512", "--heads", "2",
                                      "--dtype", "float16", "--repeats", "5", "--warmup", "1", "--peers", "cupy,flash",
                                      "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["header"]["environment"]["gpu"] and doc["header"]["repeats"] == 5
    ok = [r for r in doc["rows"] if r["status"] == "ok"]
    assert ok and all(r["tflops"] > 0 for r in ok)
    assert {r["impl"] for r in ok} >= {"iokernels_flash", "iokernels_standard", "cupy_standard"}


def test_causal_runs_for_ours_and_cupy_and_halves_the_flops():
    """bench --causal: the research plans, the tensor-core path and the cupy peer run causal (N_q = N_k);
    the FLOPs counted are half the unmasked ones."""
    causal = configs.Problem(batch=1, heads=2, n=256, d=64, dtype="float16", causal=True)
    impls = implementations.make_impls(["iokernels_fast", "iokernels_flash", "iokernels_standard", "cupy_standard"])
    doc = suite.run([causal], impls, QUICK)
    rows = rows_by(doc)
    for impl in ("iokernels_fast", "iokernels_flash", "iokernels_standard", "cupy_standard"):
        for p in configs.PASSES:
            r = rows[(impl, p, "float16")]
            assert r["status"] == "ok" and r["tflops"] > 0 and r["causal"], r
            assert r["flops"] == configs.attention_flops(1, 2, 256, 256, 64, causal=True, direction=p)
