"""``iokernels bench`` without a GPU: FLOP convention, configurations, ratios, outcomes (OOM, unsupported,
unavailable, too slow) with fake implementations, CLI errors and JSON. The modes, the strongest peer, the
single timing method and ``--overhead``: tests/bench/test_modes.py."""

import json
import types

import pytest
from click.testing import CliRunner

from iokernels.bench import clocks, configs, implementations, suite
from iokernels.cli import cli

from .fakes import FakeClock

# ---------------------------------------------------------------------------------------------
# FLOPs and configurations


def test_flop_convention():
    # FlashAttention-2: forward 4 N^2 d per head, halved when causal; backward 2.5x forward
    assert configs.attention_flops(1, 1, 1024, 1024, 64) == 4 * 1024 * 1024 * 64
    assert configs.attention_flops(2, 16, 4096, 4096, 128) == 4 * 2 * 16 * 4096**2 * 128
    assert configs.attention_flops(1, 1, 1024, 1024, 64, causal=True) == 2 * 1024 * 1024 * 64
    assert configs.attention_flops(1, 1, 1024, 1024, 64, direction="bwd") == 2.5 * 4 * 1024 * 1024 * 64
    assert configs.attention_flops(1, 1, 1024, 1024, 64, causal=True, direction="bwd") == 2.5 * 2 * 1024 * 1024 * 64
    assert configs.attention_flops(1, 1, 100, 300, 64) == 4 * 100 * 300 * 64
    with pytest.raises(ValueError, match="direction"):
        configs.attention_flops(1, 1, 8, 8, 64, direction="both")
    p = configs.Problem(batch=4, heads=16, n=4096, d=64, dtype="float16")
    assert p.flops("fwd") == 4 * 64 * 4096**2 * 64 and p.flops("bwd") == 2.5 * p.flops("fwd")


def test_issue_configs_keep_tokens_fixed():
    problems = configs.main_problems([64, 128], [16384, 1024, 4096], ["float16", "bfloat16"])
    assert len(problems) == 12
    assert {(p.d, p.n, p.dtype) for p in problems} == {(d, n, t) for d in (64, 128) for n in (1024, 4096, 16384)
                                                      for t in ("float16", "bfloat16")}
    for p in problems:
        assert p.batch * p.heads * p.n == 262144 and p.heads == 16 and not p.causal and p.table == "main"
    assert {p.n: p.batch for p in problems} == {1024: 16, 4096: 4, 16384: 1}
    # N ascending within each (d, dtype): rates measured at small N estimate the larger ones
    for d in (64, 128):
        for t in ("float16", "bfloat16"):
            assert [p.n for p in problems if (p.d, p.dtype) == (d, t)] == [1024, 4096, 16384]


@pytest.mark.parametrize("kwargs, message", [
    ({"ns": [1000]}, "not a multiple of N\\*heads"),
    ({"ns": [32768]}, "not a multiple"),  # 32768 * 16 > 262144: batch would be 0
    ({"ds": [65]}, "head dimension d=65"),
    ({"dtypes": ["int8"]}, "unsupported dtype"),
    ({"heads": 0}, ">= 1"),
])
def test_bad_configs(kwargs, message):
    args = {"ds": [64], "ns": [1024], "dtypes": ["float16"], **kwargs}
    with pytest.raises(ValueError, match=message):
        configs.main_problems(args.pop("ds"), args.pop("ns"), args.pop("dtypes"), **args)


def test_long_table_configs():
    problems = configs.long_problems()
    assert [p.n for p in problems] == [512 * 2**i for i in range(9)] and problems[-1].n == 131072
    assert all((p.heads, p.d, p.batch, p.table) == (48, 64, 1, "long") for p in problems)
    assert [p.n for p in configs.long_problems(n_max=3000)] == [512, 1024, 2048]
    with pytest.raises(ValueError, match="--long-max-n"):
        configs.long_problems(n_max=256)


def test_parsers():
    assert configs.parse_ints("--d", "64, 128,64") == [64, 128]
    with pytest.raises(ValueError, match="--N: 'x' is not an integer"):
        configs.parse_ints("--N", "1024,x")
    with pytest.raises(ValueError, match="--N: values must be >= 1"):
        configs.parse_ints("--N", "0")
    assert configs.parse_dtypes("float16,BFloat16") == ["float16", "bfloat16"]
    def ours(text):
        return implementations.parse_names("--impls", text, implementations.OURS, implementations.IMPL_ALIASES,
                                           implementations.DEFAULT_OURS)

    def peers(text):
        return implementations.parse_names("--peers", text, implementations.PEERS, implementations.PEER_ALIASES,
                                           implementations.PEERS)
    assert ours("default") == ["iokernels_torch", "iokernels_cupy"]
    assert ours("all")[-1] == "iokernels_flash_kv_outer" and ours("none") == []
    assert ours("fast,flash") == ["iokernels_torch", "iokernels_flash"]
    assert ours("torch,cupy,standard") == ["iokernels_torch", "iokernels_cupy", "iokernels_standard"]
    assert peers("FLASH_ATTENTION,cudnn,math,cupy") == ["torch_flash", "torch_cudnn", "torch_math", "cupy_standard"]
    assert peers("flex") == ["torch_flex"]
    assert peers("all") == list(implementations.PEERS)
    with pytest.raises(ValueError, match="--peers: unknown implementation 'foo'"):
        peers("flash,foo")
    names = [i.name for i in implementations.make_impls([*implementations.OURS, *implementations.PEERS])]
    assert names == [*implementations.OURS, *implementations.PEERS]


# ---------------------------------------------------------------------------------------------
# outcomes, with fake implementations


class Fake(implementations.Impl):
    def __init__(self, name, label, ours, tflops=100.0, *, raise_=None, missing=None, calls=None):
        self.name, self.label, self.ours = name, label, ours
        self.tflops, self.raise_, self.missing = tflops, raise_, missing
        self.calls = calls if calls is not None else []

    def unavailable(self, direction):
        return self.missing

    def setup(self, problem, direction):
        exc = self.raise_(problem, direction) if callable(self.raise_) else self.raise_
        if exc is not None:
            raise exc
        seconds = problem.flops(direction) / (self.tflops * 1e12)
        return clocks.Runner(call=lambda: self.calls.append((problem.n, direction)), clock=FakeClock(seconds))


class OutOfMemoryError(RuntimeError):
    """Named like cupy's and torch's."""


PROBLEM = configs.Problem(batch=4, heads=16, n=4096, d=64, dtype="float16")
TIMING = clocks.Timing(warmup=2, repeats=20, max_call_seconds=1.0)


@pytest.fixture(autouse=True)
def no_device(monkeypatch):
    freed = []
    monkeypatch.setattr(suite, "free_device_memory", lambda: freed.append(1))
    monkeypatch.setattr(suite, "environment", lambda impls: {"gpu": "Fake GPU", "date": "2026-01-01T00:00:00+00:00",
                                                          "cupy": "0", "commit": "abc"})
    return freed


def test_ok_is_the_median_of_repeats_after_warmup(no_device):
    fake = Fake("ours", "o", True, tflops=250.0)
    [row] = suite.measure(fake, PROBLEM, "fwd", TIMING)
    seconds = PROBLEM.flops("fwd") / 250e12
    loop = clocks.loop_length(seconds)  # loops of about 5 ms: 5 calls of 1.1 ms
    assert loop == 5
    assert row["status"] == "ok" and row["mode"] == "call" and row["loop"] == loop
    assert row["timed_calls"] == 20 * loop and row["method"] == "fake events around 5 back-to-back calls"
    assert row["tflops"] == pytest.approx(250.0) and row["seconds"] == pytest.approx(seconds)
    assert len(fake.calls) == 1 + 2 + 20 * loop  # the one-call check, warm-ups, timed loops
    assert no_device == [1]  # memory given back after each measurement
    [bwd] = suite.measure(fake, PROBLEM, "bwd", TIMING)
    assert bwd["flops"] == 2.5 * row["flops"] and bwd["tflops"] == pytest.approx(250.0)


def test_time_runner_takes_the_median():
    times = iter([0.5] + [1.0] * 10 + [3.0] * 9 + [100.0])

    class Clock(FakeClock):
        def loop_seconds(self, fn, loop):
            return next(times)

    got = clocks.time_runner(clocks.Runner(call=lambda: None, clock=Clock(0)),
                             clocks.Timing(warmup=0, repeats=20, max_call_seconds=1.0))
    assert (got.seconds, got.calls, got.loop) == (2.0, 20, 1)


@pytest.mark.parametrize("exc, status, text", [
    (OutOfMemoryError("Out of memory allocating 8,589,934,592 bytes"), "oom", "OutOfMemoryError"),
    (RuntimeError("CUDA error: out of memory"), "oom", "out of memory"),
    (clocks.Unsupported("Flash attention requires head dim <= 256"), "unsupported", "head dim"),
    (RuntimeError("No available kernel. Aborting execution."), "unsupported", "No available kernel"),
    (ValueError("the tensor-core path takes d in (64, 128), got d=96"), "unsupported", "d=96"),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), "error", "illegal memory access"),
])
def test_failures_are_labelled_and_the_run_goes_on(no_device, exc, status, text):
    [row] = suite.measure(Fake("x", "x", False, raise_=exc), PROBLEM, "fwd", TIMING)
    assert row["status"] == status and text in row["note"] and row["tflops"] is None
    assert no_device == [1]
    assert suite.measure(Fake("y", "y", False), PROBLEM, "fwd", TIMING)[0]["status"] == "ok"


def test_not_available_is_labelled_without_running():
    fake = Fake("iokernels_torch", "io-torch", True, missing="torch is not installed")
    [row] = suite.measure(fake, PROBLEM, "bwd", TIMING)
    assert row["status"] == "not available" and "torch is not installed" in row["note"] and fake.calls == []


def test_slow_configurations_are_skipped_after_one_call_or_by_estimate():
    slow = Fake("slow", "s", True, tflops=0.1)  # 1 s per 0.1 TFLOP
    small = configs.Problem(batch=16, heads=16, n=1024, d=64, dtype="float16")  # 68.7 GFLOP: 0.69 s, under 1 s
    history = suite._History()
    assert suite.measure(slow, small, "fwd", TIMING, history)[0]["status"] == "ok"
    calls = len(slow.calls)
    [row] = suite.measure(slow, PROBLEM, "fwd", TIMING, history)  # 4x the FLOPs: estimated 2.7 s
    assert row["status"] == "skipped" and "estimated" in row["note"] and len(slow.calls) == calls
    [fresh] = suite.measure(Fake("slow2", "s", True, tflops=0.1), PROBLEM, "fwd", TIMING)
    assert fresh["status"] == "skipped" and "one call took" in fresh["note"] and fresh["timed_calls"] == 1
    assert fresh["tflops"] is None and fresh["seconds"] == pytest.approx(PROBLEM.flops("fwd") / 0.1e12)


def test_long_table_oom_is_minus_one_and_larger_n_is_not_tried():
    oom_at = 2048
    fake = Fake("std", "std", True, raise_=lambda p, d: OutOfMemoryError("oom") if p.n >= oom_at else None)
    peer = Fake("peer", "peer", False, tflops=50.0)
    doc = suite.run([], [fake, peer], TIMING, long=configs.long_problems(n_max=8192))
    rows = {(r["impl"], r["N"], r["pass"]): r for r in doc["rows"]}
    assert rows[("std", 1024, "fwd")]["status"] == "ok"
    assert rows[("std", 2048, "fwd")]["status"] == "oom" and rows[("std", 2048, "fwd")]["tflops"] == -1
    later = rows[("std", 4096, "bwd")]
    assert later["status"] == "skipped" and "out of memory at N=2048" in later["note"]
    assert {n for (_, n, _) in rows} == {512, 1024, 2048, 4096, 8192}
    assert "-1" in suite.render(doc)


def test_long_table_stops_where_nothing_runs():
    fake = Fake("std", "std", True, raise_=lambda p, d: OutOfMemoryError("oom") if p.n >= 1024 else None)
    doc = suite.run([], [fake], TIMING, long=configs.long_problems(n_max=131072))
    assert sorted({r["N"] for r in doc["rows"]}) == [512, 1024]  # every pass ran out of memory at 1024


def test_ratios_pair_each_of_ours_with_each_peer():
    rows = []
    for impl, ours, tflops in [("fast", True, 300.0), ("flash", True, 30.0), ("FLASH", False, 300.0),
                               ("CUDNN", False, 450.0), ("MATH", False, None)]:
        row = {"table": "main", "d": 64, "N": 4096, "dtype": "float16", "batch": 4, "heads": 16, "causal": False,
               "pass": "fwd", "mode": "call", "impl": impl, "ours": ours, "status": "ok" if tflops else "oom",
               "tflops": tflops}
        rows.append(row)
    got = {(r["impl"], r["peer"]): r["ratio"] for r in suite.ratios(rows)}
    assert got == {("fast", "FLASH"): 1.0, ("fast", "CUDNN"): pytest.approx(300 / 450),
                   ("flash", "FLASH"): 0.1, ("flash", "CUDNN"): pytest.approx(30 / 450)}
    summary = {(s["impl"], s["peer"]): s for s in suite.summarize(suite.ratios(rows))}
    assert summary[("fast", "FLASH")]["min"] == 1.0 and summary[("fast", "FLASH")]["configs"] == 1


def fakes():
    return [Fake("iokernels_torch", "io-torch", True, missing="torch is not installed"),
            Fake("iokernels_cupy", "io-cupy", True, tflops=30.0),
            Fake("iokernels_standard", "io-std", True, tflops=20.0,
                 raise_=lambda p, d: OutOfMemoryError("Out of memory") if p.n >= 4096 else None),
            Fake("cupy_standard", "cupy", False, tflops=40.0,
                 raise_=lambda p, d: clocks.Unsupported("cupy has no bfloat16 dtype")
                 if p.dtype == "bfloat16" else None),
            Fake("torch_flash", "FLASH", False, tflops=300.0),
            Fake("torch_cudnn", "CUDNN", False, tflops=450.0)]


def test_document_structure_and_text():
    problems = configs.main_problems([64], [1024, 4096], ["float16", "bfloat16"])
    doc = suite.run(problems, fakes(), TIMING, long=configs.long_problems(n_max=1024), header={"tokens": 262144,
                                                                                       "heads": 16})
    json.loads(json.dumps(doc))
    h = doc["header"]
    assert {"environment", "flop_convention", "warmup", "repeats", "max_call_seconds", "timing", "impls",
            "tokens", "heads", "backward"} <= set(h)
    assert h["repeats"] == 20 and h["impls"][0]["name"] == "iokernels_torch"
    assert len([r for r in doc["rows"] if r["table"] == "main"]) == 4 * 2 * 6
    assert len([r for r in doc["rows"] if r["table"] == "long"]) == 2 * 2 * 6
    for r in doc["rows"]:
        assert {"table", "impl", "pass", "d", "N", "dtype", "batch", "heads", "causal", "flops", "status",
                "seconds", "tflops", "timed_calls", "method", "note"} <= set(r)
        assert r["status"] in ("ok", "oom", "unsupported", "not available", "skipped", "error")
        assert (r["tflops"] is not None and r["tflops"] > 0) == (r["status"] == "ok")
    statuses = {(r["impl"], r["N"], r["dtype"], r["pass"], r["table"]): r["status"] for r in doc["rows"]}
    assert statuses[("iokernels_torch", 1024, "float16", "fwd", "main")] == "not available"
    assert statuses[("iokernels_standard", 4096, "float16", "fwd", "main")] == "oom"
    assert statuses[("cupy_standard", 1024, "bfloat16", "bwd", "main")] == "unsupported"
    ratio = {(r["impl"], r["peer"], r["N"], r["dtype"], r["pass"]): r["ratio"] for r in doc["ratios"]
             if r["table"] == "main"}
    assert ratio[("iokernels_cupy", "torch_flash", 4096, "bfloat16", "bwd")] == pytest.approx(0.1)
    assert ("iokernels_cupy", "cupy_standard", 1024, "bfloat16", "fwd") not in ratio
    assert not any(k[0] == "iokernels_torch" for k in ratio)
    text = suite.render(doc)
    for s in ("Fake GPU", "io-torch", "io-cupy", "FLASH", "CUDNN", "n/a", "OOM", "unsup", "/FLASH", "/CUDNN",
              "long sequences: heads 48, d 64, batch 1", "notes:", "cupy has no bfloat16 dtype"):
        assert s in text, s


def test_no_backward_measures_forward_only():
    doc = suite.run(configs.main_problems([64], [1024], ["float16"]), fakes()[1:3], TIMING, backward=False)
    assert {r["pass"] for r in doc["rows"]} == {"fwd"}


# ---------------------------------------------------------------------------------------------
# the command


def invoke(*args):
    return CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)


@pytest.mark.parametrize("args, message", [
    (["--d", "65"], "head dimension d=65"),
    (["--d", "sixty"], "--d: 'sixty' is not an integer"),
    (["--N", "1000"], "not a multiple of N*heads"),
    (["--N", "0"], "--N: values must be >= 1"),
    (["--dtype", "float8"], "unsupported dtype"),
    (["--impls", "turbo"], "--impls: unknown implementation 'turbo'"),
    (["--peers", "xformers"], "--peers: unknown implementation 'xformers'"),
    (["--impls", "none", "--peers", "none"], "select no implementation"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--max-call-ms", "0"], "--max-call-ms must be > 0"),
    (["--time-budget", "-5"], "--time-budget must be > 0"),
    (["--long", "--long-max-n", "100"], "--long-max-n must be >= 512"),
    (["--long-only", "--long-dtype", "half"], "unsupported dtype"),
    (["--sram", "lots"], "malformed size"),
])
def test_cli_errors_are_one_line_exit_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr


def test_cli_with_nothing_available_is_one_line_exit_1(monkeypatch):
    monkeypatch.setattr(implementations, "make_impls", lambda names, sram=None: [
        Fake(n, n, n in implementations.OURS, missing="torch is not installed" if n.startswith("torch") else "no cupy")
        for n in names])
    result = invoke("--N", "1024")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing to measure" in lines[0] and "torch is not installed" in lines[0]


def test_cli_json_is_one_document(monkeypatch):
    monkeypatch.setattr(implementations, "make_impls", lambda names, sram=None: [f for f in fakes() if f.name in names])
    result = invoke("--d", "64,128", "--N", "1024,4096", "--dtype", "float16", "--long", "--long-max-n", "1024",
                    "--impls", "torch,cupy,standard", "--peers", "flash,cudnn,cupy", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) == {"header", "rows", "ratios", "summary", "computed"}
    assert doc["header"]["tokens"] == 262144 and doc["header"]["heads"] == 16
    assert doc["header"]["long"] == {"heads": 48, "d": 64, "batch": 1, "dtype": "float16", "n_max": 1024}
    assert {r["impl"] for r in doc["rows"]} == {"iokernels_torch", "iokernels_cupy", "iokernels_standard",
                                               "cupy_standard", "torch_flash", "torch_cudnn"}
    assert {(r["d"], r["N"]) for r in doc["rows"] if r["table"] == "main"} == {(64, 1024), (64, 4096), (128, 1024),
                                                                             (128, 4096)}
    assert all(r["batch"] * r["heads"] * r["N"] == 262144 for r in doc["rows"] if r["table"] == "main")
    assert "iokernels: main d=64 N=1024" in result.stderr  # progress goes to stderr
    text = invoke("--d", "64", "--N", "4096", "--dtype", "float16", "--no-backward", "--peers", "flash")
    assert text.exit_code == 0 and "io-cupy" in text.stdout and "bwd" not in text.stdout.split("ratios")[0]


def test_time_budget_skips_the_rest_and_still_ends_with_a_document(monkeypatch):
    clock = iter(range(0, 1000, 10))  # each look at the clock: 10 s later
    monkeypatch.setattr(suite.time, "monotonic", lambda: next(clock))
    timing = clocks.Timing(warmup=0, repeats=20, max_call_seconds=1.0, budget_seconds=25)
    doc = suite.run(configs.main_problems([64], [1024, 4096], ["float16"]), fakes()[1:3], timing, backward=False)
    statuses = [r["status"] for r in doc["rows"]]
    assert statuses[:2] == ["ok", "ok"] and set(statuses[2:]) == {"skipped"}
    assert "--time-budget of 25 s" in doc["rows"][-1]["note"]


# ---------------------------------------------------------------------------------------------
# the peers' arithmetic, on the CPU


def test_cupy_peer_arithmetic_matches_the_reference(monkeypatch):
    """CupyStandard's forward and backward, run with numpy standing in for cupy."""
    import numpy as np

    from iokernels.kernels import runtime
    from iokernels.simulate import reference

    monkeypatch.setattr(runtime, "require_cupy", lambda: np)
    monkeypatch.setattr(implementations, "_random",
                        lambda xp, shape, seed: np.random.default_rng(seed).standard_normal(shape)
                        .astype(np.float32))
    monkeypatch.setattr(np, "cuda", types.SimpleNamespace(Device=lambda: types.SimpleNamespace(
        synchronize=lambda: None)), raising=False)
    monkeypatch.setattr(implementations, "CupyClock", lambda: FakeClock(0.0))
    problem = configs.Problem(batch=1, heads=2, n=96, d=32, dtype="float32")
    q, k, v, do = (implementations._random(np, (1, 2, 96, 32), i).astype(np.float64) for i in range(4))
    o, p = implementations.CupyStandard().setup(problem, "fwd").call()
    want, _ = reference.forward(q, k, v)
    assert np.max(np.abs(o - want)) < 1e-5 and np.allclose(p.sum(axis=-1), 1, atol=1e-5)
    got_all = implementations.CupyStandard().setup(problem, "bwd").call()
    for got, ref in zip(got_all, reference.backward(q, k, v, do), strict=True):
        assert np.max(np.abs(got - ref)) < 1e-5 * np.max(np.abs(ref)) + 1e-6
    with pytest.raises(clocks.Unsupported, match="bfloat16"):
        implementations.CupyStandard().setup(configs.Problem(1, 2, 96, 32, "bfloat16"), "fwd")


def test_torch_backends_on_the_cpu_run_or_are_unsupported():
    """The torch peer's calls (forward and autograd backward) and its refusal, with torch's CPU build."""
    torch = pytest.importorskip("torch")
    problem = configs.Problem(batch=1, heads=2, n=64, d=32, dtype="float32")
    out = implementations.TorchSdpa("torch_math", device="cpu").setup(problem, "fwd").call()
    assert tuple(out.shape) == (1, 2, 64, 32) and not out.requires_grad
    grads = implementations.TorchSdpa("torch_math", device="cpu").setup(problem, "bwd").call()
    assert len(grads) == 3 and all(tuple(g.shape) == (1, 2, 64, 32) for g in grads)
    assert all(torch.isfinite(g).all() for g in grads)
    with pytest.raises(Exception) as info:
        implementations.TorchSdpa("torch_cudnn", device="cpu").setup(problem, "fwd")  # no cuDNN kernel on the CPU
    assert clocks.classify(info.value)[0] == "unsupported"
