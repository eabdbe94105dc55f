"""``iokernels bench`` on the GPU, tiny configurations: every implementation timed the same way (issue #20),
in mode "call" and mode "graph"; positive TFLOP/s where things run, labels where they do not; the cupy peer
checked against the float64 reference; the host overhead report. Torch parts skip without torch seeing the GPU."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from iokernels.bench import clocks, configs, implementations, overhead, suite
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
    return {(r["impl"], r["pass"], r["dtype"], r["mode"]): r for r in doc["rows"]}


def test_cupy_call_and_graph_modes():
    """Ours on cupy arrays (iokernels.attention, attention_backward) and the cupy peer, both modes."""
    impls = implementations.make_impls(["iokernels_cupy", "cupy_standard"])
    doc = suite.run([TINY, configs.Problem(1, 2, 256, 64, "bfloat16")], impls, QUICK, modes=clocks.MODES)
    json.dumps(doc)
    rows = rows_by(doc)
    for impl in ("iokernels_cupy", "cupy_standard"):
        for p in configs.PASSES:
            for mode in clocks.MODES:
                r = rows[(impl, p, "float16", mode)]
                if (impl, mode) == ("cupy_standard", "graph") and r["status"] == "unsupported":
                    assert "capture" in r["note"], r  # cupy 14 refuses cuBLAS calls while a stream captures
                    continue
                assert r["status"] == "ok" and r["tflops"] > 0 and r["loop"] >= 1, r
                assert ("graph" in r["method"]) == (mode == "graph")
                assert rows[(impl, p, "bfloat16", mode)]["status"] == "unsupported"
    graph_ok = rows[("cupy_standard", "fwd", "float16", "graph")]["status"] == "ok"
    assert any(r["peer"] == "cupy_standard" and r["mode"] == "graph" for r in doc["ratios"]) == graph_ok
    assert "io-cupy graph" in suite.render(doc)


def test_torch_call_and_graph_modes():
    """Ours through iokernels.torch.attention and torch's FLASH backend, both modes; the other backends run or
    are labelled."""
    torch = torch_cuda()
    if torch is None:
        pytest.skip("torch with CUDA is not available")
    names = ["iokernels_torch", *implementations.TORCH_BACKENDS, "torch_flex"]
    doc = suite.run([TINY], implementations.make_impls(names), QUICK, modes=clocks.MODES)
    rows = rows_by(doc)
    for name in ("iokernels_torch", "torch_flash", "torch_math"):
        for p in configs.PASSES:
            for mode in clocks.MODES:
                r = rows[(name, p, "float16", mode)]
                assert r["status"] == "ok" and r["tflops"] > 0, (name, p, mode, r["status"], r.get("note"))
    for r in doc["rows"]:
        assert r["status"] in ("ok", "unsupported", "not available"), r
        assert r["status"] == "ok" or r["note"]
    best = [r for r in doc["ratios"] if r["impl"] == "iokernels_torch" and r["peer"] == "strongest"]
    assert {r["mode"] for r in best} == set(clocks.MODES)
    assert all(r["strongest"] in implementations.STRONGEST_FROM for r in best)


def test_research_kernels_through_the_public_call():
    impls = implementations.make_impls(["iokernels_flash", "iokernels_standard"])
    rows = rows_by(suite.run([TINY], impls, QUICK))
    assert rows[("iokernels_flash", "fwd", "float16", "call")]["status"] == "ok"
    assert rows[("iokernels_flash", "bwd", "float16", "call")]["status"] == "not available"
    for p in configs.PASSES:
        assert rows[("iokernels_standard", p, "float16", "call")]["status"] == "ok"


def test_torch_float32_flash_is_unsupported_with_a_reason():
    if torch_cuda() is None:
        pytest.skip("torch with CUDA is not available")
    doc = suite.run([configs.Problem(1, 2, 256, 64, "float32")], implementations.make_impls(["torch_flash"]), QUICK,
                    backward=False)
    r = doc["rows"][0]
    assert r["status"] == "unsupported" and r["note"]


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
    [row] = suite.measure(implementations.make_impls(["iokernels_standard"])[0], huge, "fwd", QUICK)
    assert row["status"] == "oom" and row["tflops"] == -1
    [ok] = suite.measure(implementations.make_impls(["iokernels_cupy"])[0], TINY, "fwd", QUICK)
    assert ok["status"] == "ok"


def test_cli_json_tiny_both_modes():
    result = CliRunner().invoke(cli, ["bench", "--d", "64", "--N", "256", "--tokens", "512", "--heads", "2",
                                      "--dtype", "float16", "--repeats", "5", "--warmup", "1", "--peers", "cupy,flash",
                                      "--mode", "both", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["header"]["environment"]["gpu"] and doc["header"]["repeats"] == 5
    ok = [r for r in doc["rows"] if r["status"] == "ok"]
    assert ok and all(r["tflops"] > 0 for r in ok)
    assert {(r["impl"], r["mode"]) for r in ok} >= {("iokernels_cupy", "call"), ("iokernels_cupy", "graph"),
                                                   ("cupy_standard", "call")}
    for r in doc["rows"]:  # cupy 14 refuses cuBLAS calls during stream capture: labelled, with the reason
        if (r["impl"], r["mode"]) == ("cupy_standard", "graph") and r["status"] != "ok":
            assert r["status"] == "unsupported" and "capture" in r["note"], r


def test_overhead_tiny():
    impls = implementations.make_impls(["iokernels_cupy", "iokernels_torch", "torch_flash"])
    doc = overhead.run([TINY], impls, calls=20, warmup=3)
    rows = {(r["impl"], r["pass"]): r for r in doc["overhead"]}
    for p in ("fwd", "fwd+bwd"):
        r = rows[("iokernels_cupy", p)]
        assert r["status"] == "ok" and 0 < r["median_us"] <= r["p90_us"] and r["calls"] == 20, r
        if torch_cuda() is not None:
            assert rows[("iokernels_torch", p)]["status"] == "ok" and rows[("torch_flash", p)]["status"] == "ok"
    assert "median / p90" in overhead.render(doc)


def test_causal_runs_and_halves_the_flops():
    """bench --causal: ours (cupy call), the standard research kernels and the cupy peer run causal (N_q = N_k);
    the FLOPs counted are half the unmasked ones."""
    causal = configs.Problem(batch=1, heads=2, n=256, d=64, dtype="float16", causal=True)
    impls = implementations.make_impls(["iokernels_cupy", "iokernels_standard", "cupy_standard"])
    doc = suite.run([causal], impls, QUICK)
    rows = rows_by(doc)
    for impl in ("iokernels_cupy", "iokernels_standard", "cupy_standard"):
        for p in configs.PASSES:
            r = rows[(impl, p, "float16", "call")]
            assert r["status"] == "ok" and r["tflops"] > 0 and r["causal"], r
            assert r["flops"] == configs.attention_flops(1, 2, 256, 256, 64, causal=True, direction=p)
