"""``iokernels bench`` times everyone the same way (issue #20), without a GPU: the small problems in the default
set, modes "call" and "graph" side by side, ratios to the strongest peer, every implementation through the one
timing function, ``--mode``/``--overhead`` parsing and errors, and the host-overhead report."""

import ast
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from iokernels.bench import clocks, configs, implementations, overhead, suite
from iokernels.cli import cli

from .fakes import FakeClock

BENCH = Path(__file__).resolve().parents[2] / "iokernels" / "bench"


class Fake(implementations.Impl):
    def __init__(self, name, label, ours, tflops=100.0, graph_factor=0.5, *, missing=None, capture_error=None):
        self.name, self.label, self.ours, self.tflops, self.graph_factor = name, label, ours, tflops, graph_factor
        self.missing, self.capture_error, self.clocks, self.calls = missing, capture_error, [], 0

    def unavailable(self, direction):
        return self.missing

    def setup(self, problem, direction):
        flops = problem.flops("fwd") * (3.5 if direction == "fwdbwd" else 1) if direction == "fwdbwd" \
            else problem.flops(direction)
        clock = FakeClock(flops / (self.tflops * 1e12), self.graph_factor)
        if self.capture_error is not None:
            def refuse(fn, error=self.capture_error):
                raise error
            clock.capture = refuse
        self.clocks.append(clock)

        def call():
            self.calls += 1

        return clocks.Runner(call=call, clock=clock)


def fakes():
    return [Fake("iokernels_torch", "io-torch", True, tflops=200.0, graph_factor=0.8),
            Fake("iokernels_cupy", "io-cupy", True, tflops=150.0),
            Fake("cupy_standard", "cupy", False, tflops=600.0),  # a peer, but not one of the "strongest" candidates
            Fake("torch_flash", "FLASH", False, tflops=300.0),
            Fake("torch_cudnn", "CUDNN", False, tflops=400.0),
            Fake("torch_flex", "FLEX", False, tflops=250.0)]


TIMING = clocks.Timing(warmup=1, repeats=5, max_call_seconds=1.0)


@pytest.fixture(autouse=True)
def no_device(monkeypatch):
    monkeypatch.setattr(suite, "free_device_memory", lambda: None)
    monkeypatch.setattr(overhead, "free_device_memory", lambda: None)
    monkeypatch.setattr(suite, "environment", lambda impls: {"gpu": "Fake GPU", "date": "2026-01-01T00:00:00+00:00",
                                                          "cupy": "0", "commit": "abc", "torch": "9.9"})


def invoke(*args):
    return CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)


# ---------------------------------------------------------------------------------------------
# configurations


def test_the_default_set_has_the_small_problems():
    problems = configs.main_problems(configs.DEFAULT_DS, configs.DEFAULT_NS, configs.DEFAULT_DTYPES)
    got = {(p.n, p.batch, p.heads, p.d, p.dtype) for p in problems}
    assert {(512, 32, 16, 64, "float16"), (1024, 16, 16, 64, "float16")} <= got
    assert {(4096, 4, 16, 64, "float16"), (16384, 1, 16, 128, "bfloat16")} <= got  # the ones before stay
    assert all(p.batch * p.heads * p.n == 262144 for p in problems)


def test_the_command_runs_the_default_set(monkeypatch):
    monkeypatch.setattr(implementations, "make_impls", lambda names, sram=None: [f for f in fakes() if f.name in names])
    doc = json.loads(invoke("--no-backward", "--json").stdout)
    got = {(r["N"], r["batch"], r["d"], r["dtype"]) for r in doc["rows"]}
    assert (512, 32, 64, "float16") in got and (1024, 16, 64, "float16") in got
    assert {r["N"] for r in doc["rows"]} == set(configs.DEFAULT_NS)
    assert {r["mode"] for r in doc["rows"]} == {"call"} and doc["header"]["modes"] == ["call"]  # the default


# ---------------------------------------------------------------------------------------------
# one timing method, two modes


def test_both_modes_from_one_setup():
    fake = Fake("ours", "o", True, tflops=250.0)
    problem = configs.Problem(batch=4, heads=16, n=4096, d=64, dtype="float16")
    call, graph = suite.measure(fake, problem, "fwd", TIMING, modes=clocks.MODES)
    assert (call["mode"], graph["mode"]) == ("call", "graph") and len(fake.clocks) == 1
    assert call["status"] == graph["status"] == "ok"
    assert graph["tflops"] == pytest.approx(2 * call["tflops"])  # a replay 'takes' half a call here
    assert fake.clocks[0].captures == 1 and "replays of a CUDA graph" in graph["method"]
    assert "back-to-back calls" in call["method"] and call["loop"] == graph["loop"]


def test_a_failed_capture_is_that_mode_s_row_only():
    fake = Fake("ours", "o", True, capture_error=RuntimeError("operation failed due to a previous error during "
                                                              "capture"))
    problem = configs.Problem(batch=4, heads=16, n=1024, d=64, dtype="float16")
    call, graph = suite.measure(fake, problem, "fwd", TIMING, modes=clocks.MODES)
    assert call["status"] == "ok" and graph["status"] == "error" and "during capture" in graph["note"]


def test_too_slow_skips_every_mode():
    fake = Fake("slow", "s", True, tflops=0.01)
    problem = configs.Problem(batch=4, heads=16, n=4096, d=64, dtype="float16")
    rows = suite.measure(fake, problem, "fwd", TIMING, modes=clocks.MODES)
    assert [r["status"] for r in rows] == ["skipped", "skipped"] and "one call took" in rows[1]["note"]


def test_every_implementation_goes_through_the_one_timing_function(monkeypatch):
    seen = []
    real = clocks.prepare

    def counted(runner, timing, mode="call", **kw):
        seen.append(mode)
        return real(runner, timing, mode, **kw)

    monkeypatch.setattr(clocks, "prepare", counted)
    impls = fakes()
    doc = suite.run(configs.main_problems([64], [512, 1024], ["float16"]), impls, TIMING, modes=clocks.MODES)
    ok = [r for r in doc["rows"] if r["status"] == "ok"]
    assert len(ok) == len(doc["rows"]) == len(seen) == 2 * 2 * len(impls) * 2  # problems, passes, impls, modes
    assert sorted(seen) == sorted(r["mode"] for r in ok)


def test_a_configuration_s_loops_are_taken_in_turn():
    """bench sets up every implementation of a configuration and pass, then takes one timed loop of each
    (implementation, mode) per round, ``repeats`` rounds (clocks.interleave), so that the GPU's clock drift falls alike
    on all; a sample that fails drops that one only."""
    order = []

    class Recording(FakeClock):
        def loop_seconds(self, fn, loop):
            order.append((self.owner, "graph" if getattr(fn, "replay", False) else "call", loop))
            return super().loop_seconds(fn, loop)

    class Traced(Fake):
        def setup(self, problem, direction):
            runner = super().setup(problem, direction)
            clock = Recording(runner.clock.seconds, runner.clock.graph_factor)
            clock.owner = self.name
            return clocks.Runner(call=runner.call, clock=clock)

    impls = [Traced("iokernels_torch", "io-torch", True, tflops=200.0), Traced("torch_cudnn", "CUDNN", False),
             Traced("torch_flash", "FLASH", False, tflops=300.0)]
    problem = configs.main_problems([64], [1024], ["float16"])
    doc = suite.run(problem, impls, TIMING, backward=False, modes=clocks.MODES)
    assert all(r["status"] == "ok" for r in doc["rows"]) and len(doc["rows"]) == 6
    timed = [(name, mode) for name, mode, loop in order if loop > 1][-6 * TIMING.repeats:]  # the samples (not the
    rounds = [timed[6 * r:6 * r + 6] for r in range(TIMING.repeats)]                       # one-call probes)
    assert all(sorted(r) == sorted({(i.name, m) for i in impls for m in clocks.MODES}) for r in rounds), rounds
    assert len({r[0] for r in rounds}) > 1 and len({tuple(r) for r in rounds}) > 1  # orders differ by round
    assert all(r["timed_calls"] == TIMING.repeats * r["loop"] for r in doc["rows"])

    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("unspecified launch failure")

    prepared = [clocks.Prepared(clocks.Runner(call=lambda: None, clock=FakeClock(1e-3)), lambda: None, 2, 1, "m", [])
                for _ in range(3)]
    prepared[1].sample = lambda: flaky()  # the second fails on its third sample
    dropped = []
    clocks.interleave(prepared, 4, lambda i, exc: dropped.append((i, str(exc))))
    assert dropped == [(1, "unspecified launch failure")]
    assert [len(p.times) for p in prepared] == [4, 0, 4]


def test_an_implementation_out_of_memory_beside_the_others_is_set_up_again_alone():
    """Set up beside the others' inputs an implementation may run out of memory that it would not alone: the group
    before it is timed and released, and it is set up again by itself."""
    import weakref

    alive = []

    class Tracked(Fake):
        def setup(self, problem, direction):
            runner = super().setup(problem, direction)
            alive.append(1)
            weakref.finalize(runner, alive.pop)
            return runner

    class Big(Tracked):
        tries = 0

        def setup(self, problem, direction):
            Big.tries += 1
            if alive:
                raise MemoryError("out of memory beside the others")
            return super().setup(problem, direction)

    impls = [Tracked("iokernels_torch", "io-torch", True), Big("torch_cudnn", "CUDNN", False),
             Tracked("torch_flash", "FLASH", False)]
    doc = suite.run(configs.main_problems([64], [1024], ["float16"]), impls, TIMING, backward=False,
                    modes=("call",))
    assert {r["impl"]: r["status"] for r in doc["rows"]} == {"iokernels_torch": "ok", "torch_cudnn": "ok",
                                                              "torch_flash": "ok"}
    assert Big.tries == 2 and not alive  # refused beside the others, then set up alone; every runner released


def test_only_clocks_times_anything():
    """No event, timer, graph capture or spin outside clocks.py: implementations only build Runners."""
    timing_names = {"Event", "elapsed_time", "get_elapsed_time", "perf_counter", "CUDAGraph", "graph", "replay",
                    "begin_capture", "end_capture", "graph_seconds", "_sleep", "time_one", "monotonic"}
    for module in ("implementations.py", "suite.py", "overhead.py"):
        tree = ast.parse((BENCH / module).read_text(encoding="utf-8"))
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
            {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        allowed = {"monotonic"} if module != "implementations.py" else set()  # the run's wall clock and budget
        assert not (used & timing_names) - allowed, (module, used & timing_names)
    assert not hasattr(clocks.Runner, "launch")  # the prebuilt-plan route is gone
    assert all(m in clocks.MODES for m in ("call", "graph"))


def test_prepare_setup_sets_up_once_for_every_mode_or_fails_the_rows_without_a_status():
    """clocks.prepare_setup (suite, --decode and --varlen): one setup, every row's mode prepared, the implementation
    warmed; a setup that raises fails the rows without a status (an unsupported graph mode keeps its own) and readies
    nothing, and leaves the implementation cold."""
    setups, failed, warmed = [], [], set()

    def setup():
        setups.append(1)
        return clocks.Runner(call=lambda: None, clock=FakeClock(1e-3))

    rows = [{"mode": "call", "status": None}, {"mode": "graph", "status": None}]
    ready = clocks.prepare_setup(setup, "ours", warmed, TIMING, rows, lambda row, exc: failed.append(row))
    assert setups == [1] and [row["mode"] for row, _ in ready] == ["call", "graph"] and not failed
    assert warmed == {"ours"}

    def broken():
        raise RuntimeError("no such kernel")

    rows = [{"mode": "call", "status": None}, {"mode": "graph", "status": "unsupported"}]
    ready = clocks.prepare_setup(broken, "peer", warmed, TIMING, rows, lambda row, exc: failed.append((row, exc)))
    assert ready == [] and [row["mode"] for row, _ in failed] == ["call"]
    assert isinstance(failed[0][1], RuntimeError) and warmed == {"ours"}


def test_time_runner_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        clocks.time_runner(clocks.Runner(call=lambda: None, clock=FakeClock(0.001)), TIMING, "eager")


def test_our_implementations_are_public_calls():
    impls = {i.name: i for i in implementations.make_impls(implementations.OURS)}
    assert "iokernels.torch.attention" in impls["iokernels_torch"].description
    assert "iokernels.attention" in impls["iokernels_cupy"].description
    assert "plan" not in " ".join(i.description for i in impls.values())
    assert implementations.DEFAULT_OURS == ("iokernels_torch", "iokernels_cupy")
    assert set(implementations.STRONGEST_FROM) == {"torch_flash", "torch_cudnn", "torch_efficient", "torch_math",
                                                  "torch_flex"}
    with pytest.raises(clocks.Unsupported, match="bfloat16"):
        impls["iokernels_cupy"].setup(configs.Problem(32, 16, 512, 64, "bfloat16"), "fwd")


# ---------------------------------------------------------------------------------------------
# ratios and the report


def test_ratios_to_the_strongest_peer_per_mode():
    doc = suite.run(configs.main_problems([64], [512], ["float16"]), fakes(), TIMING, backward=False,
                    modes=clocks.MODES)
    got = {(r["impl"], r["peer"], r["mode"]): r for r in doc["ratios"]}
    # call: CUDNN 400 is the strongest (cupy's 600 is not a candidate); graph: every replay is half a call
    # except ours on torch (0.8), so CUDNN 800 is the strongest there
    best = got[("iokernels_torch", "strongest", "call")]
    assert best["strongest"] == "torch_cudnn" and best["ratio"] == pytest.approx(200 / 400)
    assert got[("iokernels_torch", "strongest", "graph")]["ratio"] == pytest.approx(250 / 800)
    assert got[("iokernels_cupy", "torch_flex", "call")]["ratio"] == pytest.approx(150 / 250)
    assert got[("iokernels_cupy", "cupy_standard", "graph")]["ratio"] == pytest.approx(150 / 600)
    summary = {(s["impl"], s["peer"], s["mode"]) for s in doc["summary"]}
    assert ("iokernels_torch", "strongest", "graph") in summary


def test_render_both_modes_side_by_side():
    doc = suite.run(configs.main_problems([64], [512, 1024], ["float16"]), fakes(), TIMING, modes=clocks.MODES,
                    header={"tokens": 262144, "heads": 16})
    json.loads(json.dumps(doc))
    text = suite.render(doc)
    table = text.split("ratios:")[0]
    for column in ("io-torch call", "io-torch graph", "io-cupy call", "FLASH graph", "FLEX call"):
        assert column in table, column
    row = next(line for line in table.splitlines() if line.startswith("64  512") and " fwd " in f" {line} ")
    cells = row.split()[6:]  # io-torch call, io-torch graph, io-cupy call, io-cupy graph, ...
    assert cells[:4] == ["200.0", "250.0", "150.0", "300.0"]  # a replay of ours on torch 'takes' 0.8 of a call
    assert "/strongest" in text and "strongest" in text and "CUDNN" in text.split("ratios:")[1]
    assert "0.50x" in text  # io-torch / strongest (CUDNN), call
    assert "modes call, graph" in text


def test_render_one_mode_keeps_plain_columns():
    doc = suite.run(configs.main_problems([64], [512], ["float16"]), fakes(), TIMING, backward=False)
    text = suite.render(doc)
    assert "io-torch call" not in text and "io-torch" in text and "mode call:" in text


# ---------------------------------------------------------------------------------------------
# options


@pytest.mark.parametrize("args, message", [
    (["--mode", "eager"], "--mode: expected call, graph or both, got 'eager'"),
    (["--overhead", "--mode", "graph"], "--mode does not apply"),
    (["--overhead", "--overhead-calls", "0"], "--overhead-calls must be >= 1"),
    (["--overhead", "--long"], "--long and --long-only do not apply"),
    (["--overhead", "--N", "1000"], "not a multiple"),
])
def test_option_errors_are_one_line_exit_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr


def test_parse_mode():
    assert clocks.parse_mode("call") == ("call",) and clocks.parse_mode(" Graph ") == ("graph",)
    assert clocks.parse_mode("both") == ("call", "graph")


def test_mode_both_json_carries_both(monkeypatch):
    monkeypatch.setattr(implementations, "make_impls", lambda names, sram=None: [f for f in fakes() if f.name in names])
    result = invoke("--d", "64", "--N", "512", "--dtype", "float16", "--mode", "both", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["header"]["modes"] == ["call", "graph"]
    assert {(r["mode"], r["pass"]) for r in doc["rows"]} == {(m, p) for m in clocks.MODES for p in configs.PASSES}
    assert {r["mode"] for r in doc["ratios"] if r["peer"] == "strongest"} == {"call", "graph"}


# ---------------------------------------------------------------------------------------------
# host overhead


def test_host_seconds_times_only_the_call(monkeypatch):
    ticks = iter(range(10**6))
    monkeypatch.setattr(clocks.time, "perf_counter", lambda: next(ticks) * 1e-6)
    clock = FakeClock(0.0)
    calls = []
    times = clocks.host_seconds(clocks.Runner(call=lambda: calls.append(1), clock=clock), calls=120, warmup=7,
                                chunk=50)
    assert len(times) == 120 and len(calls) == 127 and all(t == pytest.approx(1e-6) for t in times)
    assert clock.syncs == 1 + 3  # after the warm-up, then after each chunk (50, 50, 20): never inside a timed call
    with pytest.raises(ValueError):
        clocks.host_seconds(clocks.Runner(call=lambda: None, clock=clock), calls=0)


def test_percentile():
    xs = [float(i) for i in range(1, 101)]
    assert clocks.percentile(xs, 50) == pytest.approx(50.5) and clocks.percentile(xs, 90) == pytest.approx(90.1)
    assert clocks.percentile([3.0], 90) == 3.0


def test_overhead_command(monkeypatch):
    monkeypatch.setattr(implementations, "make_impls", lambda names, sram=None: [f for f in fakes() if f.name in names])
    monkeypatch.setattr(clocks, "host_seconds", lambda runner, calls, warmup: [
        (20e-6 if "io" in getattr(runner.call, "__qualname__", "") else 10e-6) + i * 1e-7 for i in range(calls)])
    result = invoke("--overhead", "--overhead-calls", "50", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    rows = doc["overhead"]
    assert {(r["N"], r["batch"], r["heads"], r["d"], r["dtype"]) for r in rows} == {(512, 32, 16, 64, "float16")}
    assert {r["pass"] for r in rows} == {"fwd", "fwd+bwd"}
    assert {r["impl"] for r in rows} == {f.name for f in fakes()}
    assert all(r["status"] == "ok" and r["calls"] == 50 and r["p90_us"] >= r["median_us"] for r in rows)
    assert doc["header"]["calls"] == 50 and "perf_counter" in doc["header"]["method"]
    text = invoke("--overhead", "--overhead-calls", "50").stdout
    assert "median / p90" in text and "io-torch" in text and "FLASH" in text and "fwd+bwd" in text
