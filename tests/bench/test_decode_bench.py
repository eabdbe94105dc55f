"""``iokernels bench --decode`` (issue #23) without a GPU: the case grid and its parsing, the bytes and bandwidths
(numbers worked out by hand below), the L2 rotation (count, and that every call and every graph replay goes through
the caches), the run with fake implementations and a fake device (ratios, percent of copy, the issue's criteria,
skips for memory, the budget), the torch peer's call checked on the CPU, and the command's output and JSON."""

import json
import math
import shlex

import pytest
from click.testing import CliRunner

from iokernels.bench import clocks, configs, decode
from iokernels.cli import cli

from .fakes import FakeClock

MIB, GIB = 2**20, 2**30
H200_L2, H100_L2 = 60 * MIB, 50 * MIB
TIMING = clocks.Timing(warmup=1, repeats=5, max_call_seconds=1.0)


# ---------------------------------------------------------------------------------------------
# cases and parsing


def test_the_default_grid_is_the_issue_s():
    problems = configs.decode_problems(configs.DECODE_HEADS, configs.DECODE_BATCHES, configs.DECODE_NKS,
                                       configs.DECODE_NQS)
    assert len(problems) == 2 * 4 * 5
    assert {(p.d, p.dtype, p.n_q) for p in problems} == {(128, "float16", 1)}
    assert {(p.heads, p.kv_heads) for p in problems} == {(64, 8), (8, 8)}
    assert {p.batch for p in problems} == {1, 4, 16, 64}
    assert {p.n_k for p in problems} == {4096, 16384, 32768, 65536, 131072}
    assert not any(p.causal for p in problems)
    # table order: heads as given, then B, then N_k ascending
    assert [(p.heads, p.batch, p.n_k) for p in problems[:6]] == [(64, 1, 4096), (64, 1, 16384), (64, 1, 32768),
                                                                 (64, 1, 65536), (64, 1, 131072), (64, 4, 4096)]
    assert problems[20].heads == 8


def test_several_new_tokens_are_causal():
    [one, four] = configs.decode_problems([(64, 8)], [1], [4096], [4, 1])
    assert (one.n_q, one.causal) == (1, False) and (four.n_q, four.causal) == (4, True)
    assert "causal" in four.describe() and "H_kv=8" in four.describe()


def test_parse_head_pairs():
    assert configs.parse_head_pairs("--decode-heads", " 64:8, 8:8,64:8") == [(64, 8), (8, 8)]
    assert configs.parse_head_pairs("--decode-heads", "32:1") == [(32, 1)]
    for bad, message in [("64", "is not H:H_kv"), ("64:8:2", "is not H:H_kv"), ("a:8", "is not H:H_kv"),
                         ("64:0", ">= 1"), ("64:7", "H_kv = 7 does not divide H = 64"), ("", "at least one")]:
        with pytest.raises(ValueError, match=message):
            configs.parse_head_pairs("--decode-heads", bad)


def test_bad_cases():
    with pytest.raises(ValueError, match="--decode-nq 32 > --decode-nk 16"):
        configs.decode_problems([(8, 8)], [1], [16], [32])
    with pytest.raises(ValueError, match="head dimension d=100"):
        configs.decode_problems([(8, 8)], [1], [4096], [1], [100])
    with pytest.raises(ValueError, match="unsupported dtype"):
        configs.decode_problems([(8, 8)], [1], [4096], [1], [128], ["int8"])


# ---------------------------------------------------------------------------------------------
# bytes, bandwidth, rotation, memory (by hand)


def test_kv_bytes_by_hand():
    # 2 tensors x 2 bytes x d 128 x B 1 x H_kv 8 x N_k 16384 = 67,108,864 (the design note's 67 MB)
    assert configs.DecodeProblem(1, 64, 8, 1, 16384, 128, "float16").kv_bytes == 67_108_864
    # the largest default case: B 64, N_k 128k: 32 GiB exactly
    assert configs.DecodeProblem(64, 64, 8, 1, 131072, 128, "float16").kv_bytes == 32 * GIB
    # 1:1 heads move the same K/V bytes; H does not enter them, q's bytes do (2 x 64 x 64 x 1 x 128)
    big = configs.DecodeProblem(64, 8, 8, 1, 131072, 128, "float16")
    assert big.kv_bytes == 32 * GIB and big.q_bytes == 131_072
    assert configs.DecodeProblem(64, 64, 8, 1, 131072, 128, "float16").q_bytes == 1_048_576
    # float32: 4 bytes; N_q does not enter K/V
    assert configs.DecodeProblem(2, 4, 2, 16, 1000, 64, "float32").kv_bytes == 2 * 4 * 64 * 2 * 2 * 1000


def test_l2_rotation_count():
    def caches(batch, n_k, l2):
        return configs.DecodeProblem(batch, 64, 8, 1, n_k, 128, "float16").caches(l2)

    # H200: 4 x 60 MiB = 240 MiB over 16 MiB of K/V (B 1, N_k 4096) = 15 caches exactly
    assert caches(1, 4096, H200_L2) == 15
    # 64 MiB (N_k 16384): 3.75 -> 4; H100: 200 MiB / 16 MiB = 12.5 -> 13
    assert caches(1, 16384, H200_L2) == 4 and caches(1, 4096, H100_L2) == 13
    # 256 MiB (B 4, N_k 16384) or more: one cache is already >= 4 x L2
    assert caches(4, 16384, H200_L2) == 1 and caches(64, 131072, H200_L2) == 1
    assert caches(1, 4096, 0) == 1
    for batch in (1, 4, 16, 64):
        for n_k in configs.DECODE_NKS:
            p = configs.DecodeProblem(batch, 8, 8, 1, n_k, 128, "float16")
            n = p.caches(H200_L2)
            assert n * p.kv_bytes >= 4 * H200_L2 and (n == 1 or (n - 1) * p.kv_bytes < 4 * H200_L2)
    with pytest.raises(ValueError):
        configs.DecodeProblem(1, 8, 8, 1, 4096, 128, "float16").caches(-1)


def test_memory_check_by_hand():
    big = configs.DecodeProblem(64, 64, 8, 1, 131072, 128, "float16")
    # one 32 GiB cache, q and three outputs of 1 MiB, and the 1 GiB reserve: 33 GiB + 3 MiB
    assert big.device_bytes(1) == 32 * GIB + 3 * MIB
    assert decode.memory_note(big, 1, 34 * GIB) is None
    note = decode.memory_note(big, 1, 30 * GIB)
    assert note == ("needs 33.0 GiB of device memory (1 K/V cache of 32.0 GiB, q, outputs and a 1.0 GiB reserve), "
                    "30.0 GiB free")
    assert decode.memory_note(big, 1, 33 * GIB + 3 * MIB) is None and decode.memory_note(big, 1, 33 * GIB) is not None


# ---------------------------------------------------------------------------------------------
# the rotation through the one timing method


class CallClock(FakeClock):
    """Each call 'takes' ``seconds`` (graph_factor of it inside a replay): a loop's time is counted from the calls
    it made, so a graph of k calls takes k times a call."""

    def __init__(self, seconds, graph_factor=0.5):
        super().__init__(seconds, graph_factor)
        self.made = 0

    def loop_seconds(self, fn, loop):
        before = self.made
        for _ in range(loop):
            fn()
        self.loops.append(loop)
        factor = self.graph_factor if getattr(fn, "replay", False) else 1.0
        return (self.made - before) * self.seconds * factor / loop


def rotating(caches, seconds=1e-4):
    clock = CallClock(seconds)
    used = []
    turn = iter(range(10**9))

    def call():
        clock.made += 1
        used.append(next(turn) % caches)
        return used[-1]

    return clocks.Runner(call=call, clock=clock, cycle=caches), clock, used


def test_graph_mode_captures_one_call_per_cache_and_divides_by_them():
    runner, clock, used = rotating(15)
    got = clocks.time_runner(runner, TIMING, "graph")
    assert got.seconds == pytest.approx(0.5e-4)  # per call, not per replay of 15 calls
    assert clock.captures == 1
    # after the one-call check (cache 0), 15 warm-ups visit every cache, then the capture: 15 calls, each cache once
    every = [*range(1, 15), 0]
    assert used[1:16] == every and used[16:31] == every
    assert "CUDA graph of 15 calls" in got.method and "rotating among 15 inputs" in got.method
    # loop: 5 ms / 0.1 ms = 50 calls -> 4 replays of 15 calls = 60 calls per timed loop
    assert got.loop == 60 and got.calls == TIMING.repeats * 60


def test_call_mode_rotates_every_call():
    runner, clock, used = rotating(4)
    got = clocks.time_runner(runner, TIMING, "call")
    assert got.seconds == pytest.approx(1e-4) and clock.captures == 0
    assert used == [i % 4 for i in range(len(used))] and len(used) == 1 + 1 + TIMING.repeats * 50
    assert "rotating among 4 inputs" in got.method and "graph" not in got.method


def test_one_input_keeps_the_old_method_text():
    runner, _, _ = rotating(1)
    got = clocks.time_runner(runner, TIMING, "graph")
    assert got.method.endswith("replays of a CUDA graph of one call") and got.loop == 50
    with pytest.raises(ValueError, match="cycle"):
        clocks.time_runner(clocks.Runner(call=lambda: None, clock=CallClock(1e-4), cycle=0), TIMING)


# ---------------------------------------------------------------------------------------------
# the run, with fake implementations and a fake device


class FakeDevice:
    def __init__(self, l2=H200_L2, free=80 * GIB, copy=4.0e12, fail_inputs=None):
        self.l2, self.free, self.copy, self.fail_inputs = l2, free, copy, fail_inputs
        self.made, self.released = [], 0

    def l2_bytes(self):
        return self.l2

    def free_bytes(self):
        return self.free

    def copy_bandwidth(self):
        if isinstance(self.copy, Exception):
            raise self.copy
        return self.copy

    def inputs(self, problem, caches):
        if self.fail_inputs is not None:
            raise self.fail_inputs
        self.made.append((problem, caches))
        return decode.DecodeInputs(q="q", caches=[(f"k{i}", f"v{i}") for i in range(caches)], device="fake")

    def release(self):
        self.released += 1


class Fake(decode.DecodeImpl):
    """A call on any case 'takes' ``us`` microseconds (``graph`` of them in a replay); ``us`` may be a function of
    the problem."""

    def __init__(self, name, label, ours=False, us=10.0, graph=1.0, *, missing=None, refuse=None, backend=None):
        self.name, self.label, self.ours, self.us, self.graph = name, label, ours, us, graph
        self.missing, self.refuse, self.backend, self.seen = missing, refuse, backend, []

    def unavailable(self):
        return self.missing

    def setup(self, problem, inputs):
        if self.refuse is not None:
            raise self.refuse
        us = self.us(problem) if callable(self.us) else self.us
        clock = CallClock(us * 1e-6, self.graph)
        turn = iter(range(10**9))

        def call():
            clock.made += 1
            self.seen.append(inputs.caches[next(turn) % len(inputs.caches)][0])

        return clocks.Runner(call=call, clock=clock, cycle=len(inputs.caches))

    def backend_choice(self, problem, inputs):
        return self.backend


def fakes():
    return [Fake("iokernels_torch", "io-torch", True, us=20.0, graph=0.5),
            Fake("torch_flash", "FLASH", us=25.0),
            Fake("torch_cudnn", "CUDNN", us=lambda p: 16.0 if p.n_k == 16384 else 30.0),
            Fake("torch_efficient", "EFFIC", refuse=clocks.Unsupported("Efficient attention has no grouped-query")),
            Fake("torch_sdpa", "SDPA", us=25.0, backend="FLASH_ATTENTION")]


@pytest.fixture(autouse=True)
def no_device(monkeypatch):
    monkeypatch.setattr(decode, "free_device_memory", lambda: None)
    monkeypatch.setattr(decode, "environment", lambda impls: {"gpu": "Fake GPU", "date": "2026-01-01T00:00:00+00:00",
                                                           "cupy": "0", "commit": "abc", "torch": "9.9"})


CASES = configs.decode_problems([(64, 8)], [1], [4096, 16384], [1])  # 16 MiB and 64 MiB of K/V


def rows_by(doc):
    return {(r["impl"], r["N_k"], r["mode"]): r for r in doc["rows"]}


def test_run_measures_every_impl_on_the_same_rotated_inputs():
    device = FakeDevice()
    impls = fakes()
    doc = decode.run(CASES, impls, TIMING, device=device, modes=clocks.MODES)
    json.loads(json.dumps(doc))
    assert [c for _, c in device.made] == [15, 4]  # one set of inputs per case, shared by every implementation
    assert device.released >= 1 + 2  # after the copy, and after each case
    rows = rows_by(doc)
    assert len(doc["rows"]) == 2 * len(impls) * 2
    for impl in impls[:3]:
        assert set(impl.seen) == {f"k{i}" for i in range(15)} | {f"k{i}" for i in range(4)}
    ours = rows[("iokernels_torch", 16384, "call")]
    assert ours["status"] == "ok" and ours["caches"] == 4 and ours["seconds"] == pytest.approx(20e-6)
    # 67,108,864 bytes / 20 us = 3.3554 TB/s; over a 4.0 TB/s copy: 83.886 %
    assert ours["kv_tbps"] == pytest.approx(3.3554432) and ours["percent_of_copy"] == pytest.approx(83.886080)
    graph = rows[("iokernels_torch", 16384, "graph")]
    assert graph["seconds"] == pytest.approx(10e-6) and graph["percent_of_copy"] == pytest.approx(167.77216)
    assert rows[("torch_efficient", 4096, "call")]["status"] == "unsupported"
    assert "no grouped-query" in rows[("torch_efficient", 4096, "graph")]["note"]
    assert rows[("torch_sdpa", 4096, "graph")]["backend"] == "FLASH_ATTENTION"
    h = doc["header"]
    assert h["decode"]["l2_bytes"] == H200_L2 and h["decode"]["copy_bandwidth_bytes_per_s"] == 4.0e12
    assert h["decode"]["best_from"] == ["torch_flash", "torch_cudnn"] and h["modes"] == ["call", "graph"]
    assert "read + written" in h["decode"]["copy_method"] and "Fake GPU" == h["environment"]["gpu"]


def test_ratios_are_the_faster_of_flash_and_cudnn_over_ours():
    doc = decode.run(CASES, fakes(), TIMING, device=FakeDevice(), modes=clocks.MODES)
    got = {(r["N_k"], r["mode"]): r for r in doc["ratios"]}
    # N_k 4096: FLASH 25 us beats CUDNN 30 us; ours 20 us (call), 10 us (graph)
    assert got[(4096, "call")]["best"] == "torch_flash" and got[(4096, "call")]["ratio"] == pytest.approx(25 / 20)
    assert got[(4096, "graph")]["ratio"] == pytest.approx(25 / 10)
    # N_k 16384: CUDNN 16 us is the faster: ours slower in call mode
    assert got[(16384, "call")]["best"] == "torch_cudnn" and got[(16384, "call")]["ratio"] == pytest.approx(16 / 20)
    assert got[(16384, "call")]["peers"] == pytest.approx({"torch_flash": 25 / 20, "torch_cudnn": 16 / 20,
                                                           "torch_sdpa": 25 / 20})
    crit = {(c["mode"], c["criterion"]): c for c in doc["criteria"]}
    # percent of copy counts N_k >= 16384 only: 83.9 % (call) misses 85 %, 167.8 % (graph) meets it
    assert (crit[("call", "percent_of_copy")]["cases"], crit[("call", "percent_of_copy")]["met"]) == (1, 0)
    assert crit[("graph", "percent_of_copy")]["met"] == 1
    assert (crit[("call", "ratio")]["cases"], crit[("call", "ratio")]["met"]) == (2, 1)
    assert crit[("call", "ratio")]["worst"] == pytest.approx(0.8)
    assert crit[("call", "ratio")]["worst_at"] == "B=1 H=64:8 N_q=1 N_k=16384"


def test_no_ratio_without_flash_or_cudnn():
    impls = [Fake("iokernels_torch", "io-torch", True), Fake("torch_flash", "FLASH", refuse=RuntimeError(
        "No available kernel. Aborting execution.")), Fake("torch_sdpa", "SDPA")]
    doc = decode.run(CASES[:1], impls, TIMING, device=FakeDevice())
    assert doc["ratios"] == [] and rows_by(doc)[("torch_flash", 4096, "call")]["status"] == "unsupported"
    assert [c["cases"] for c in doc["criteria"]] == [0, 0]


def test_a_case_over_the_free_memory_is_skipped_and_says_why():
    big = configs.decode_problems([(64, 8)], [64], [131072], [1])
    device = FakeDevice(free=20 * GIB)
    doc = decode.run([*CASES[:1], *big], fakes(), TIMING, device=device)
    assert [p.n_k for p, _ in device.made] == [4096]  # the big case's inputs were never made
    skipped = [r for r in doc["rows"] if r["N_k"] == 131072]
    assert len(skipped) == 5 and {r["status"] for r in skipped} == {"skipped"}
    assert all("needs 33.0 GiB of device memory" in r["note"] and "20.0 GiB free" in r["note"] for r in skipped)
    assert "needs 33.0 GiB" in decode.render(doc).split("notes:")[1]


def test_inputs_out_of_memory_label_the_case_and_the_run_goes_on():
    class OutOfMemoryError(RuntimeError):
        pass

    doc = decode.run(CASES, fakes(), TIMING, device=FakeDevice(fail_inputs=OutOfMemoryError("CUDA out of memory")))
    assert {r["status"] for r in doc["rows"]} == {"oom"} and len(doc["rows"]) == 2 * 5


def test_not_available_and_no_copy_bandwidth():
    impls = [Fake("iokernels_torch", "io-torch", True, missing="no cupy"), Fake("torch_flash", "FLASH")]
    doc = decode.run(CASES, impls, TIMING, device=FakeDevice(copy=RuntimeError("cupy is not installed")))
    rows = rows_by(doc)
    assert rows[("iokernels_torch", 4096, "call")]["status"] == "not available"
    assert impls[0].seen == [] and rows[("torch_flash", 4096, "call")]["percent_of_copy"] is None
    assert "cupy is not installed" in doc["header"]["decode"]["copy_note"]
    assert "%copy: no copy bandwidth: RuntimeError: cupy is not installed" in decode.render(doc)


def test_time_budget_skips_the_rest(monkeypatch):
    ticks = iter(range(0, 10**6, 10))  # each look at the clock: 10 s later
    monkeypatch.setattr(decode.time, "monotonic", lambda: next(ticks))
    timing = clocks.Timing(warmup=0, repeats=3, max_call_seconds=1.0, budget_seconds=25)
    doc = decode.run(CASES, fakes(), timing, device=FakeDevice())
    statuses = [r["status"] for r in doc["rows"]]
    assert statuses[0] == "ok" and statuses[-1] == "skipped" and "--time-budget of 25 s" in doc["rows"][-1]["note"]


def test_render():
    doc = decode.run(CASES, fakes(), TIMING, device=FakeDevice(), modes=clocks.MODES)
    text = decode.render(doc)
    assert "mode call:" in text and "mode graph:" in text and "Fake GPU" in text
    assert "> 1: ours is faster" in text and "read + written" in text and "4.00 TB/s" in text
    assert "L2 60 MiB" in text and ">= 4 x the GPU's L2" in text
    call = text.split("mode call:")[1].split("mode graph:")[0]
    row = next(line for line in call.splitlines() if line.startswith("128") and " 16384 " in line)
    cells = row.split()
    # d dtype H:Hkv B N_k N_q caches | io-torch us TB/s %copy | FLASH us TB/s | CUDNN | EFFIC | SDPA | picks best ratio
    assert cells[:7] == ["128", "float16", "64:8", "1", "16384", "1", "4"]
    assert cells[7:10] == ["20.0", "3.36", "83.9"] and cells[10:12] == ["25.0", "2.68"]
    assert cells[14:16] == ["unsup", "-"] and cells[-3:] == ["FLASH", "CUDNN", "0.80x"]
    assert "io-torch call: >= 85 % of copy for N_k >= 16384: 0 of 1 (lowest 83.9 % at B=1 H=64:8 N_q=1 " \
           "N_k=16384)" in text
    assert "torch_efficient unsupported: Efficient attention has no grouped-query" in text


def test_decode_module_times_nothing_itself():
    """Only clocks (prepare_setup, time_in_turn) times the decode calls (the run's budget and wall clock aside)."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(decode.__file__).read_text(encoding="utf-8"))
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
        {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not used & {"Event", "elapsed_time", "perf_counter", "CUDAGraph", "replay", "begin_capture", "capture",
                       "loop_seconds", "graph_seconds", "event_seconds"}
    assert {"prepare_setup", "time_in_turn"} <= used


# ---------------------------------------------------------------------------------------------
# the torch peer's call, on the CPU


def reference(q, k, v, causal):
    """float64 attention, each K/V head repeated for its H / H_kv query heads; causal bottom-right."""
    import torch

    group = q.shape[1] // k.shape[1]
    k, v = (x.double().repeat_interleave(group, dim=1) for x in (k, v))
    s = q.double() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n_q, n_k = q.shape[-2], k.shape[-2]
    if causal:
        i = torch.arange(n_q)[:, None]
        j = torch.arange(n_k)[None, :]
        s = s.masked_fill(j > n_k - n_q + i, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("n_q", [1, 4])
def test_sdpa_peer_on_the_cpu_matches_the_reference(n_q):
    torch = pytest.importorskip("torch")
    problem = configs.DecodeProblem(2, 8, 2, n_q, 96, 32, "float32")
    inputs = decode.make_inputs(problem, 3, "cpu")
    assert tuple(inputs.q.shape) == (2, 8, n_q, 32)
    assert [tuple(k.shape) for k, _ in inputs.caches] == [(2, 2, 96, 32)] * 3
    assert not torch.equal(inputs.caches[0][0], inputs.caches[1][0])  # distinct caches
    runner = decode.DecodeSdpa("torch_sdpa").setup(problem, inputs)
    assert runner.cycle == 3
    with runner.active():
        outs = [runner.call() for _ in range(3)]  # the first call (setup's) took cache 0: these take 1, 2, 0
    for out, (k, v) in zip(outs, [inputs.caches[1], inputs.caches[2], inputs.caches[0]], strict=True):
        want = reference(inputs.q, k, v, causal=n_q > 1)
        assert tuple(out.shape) == (2, 8, n_q, 32) and (out.double() - want).abs().max() < 1e-5
    if n_q > 1:  # the mask matters: the top-left one (is_causal) gives another answer
        assert (reference(inputs.q, *inputs.caches[0], causal=False) - outs[2].double()).abs().max() > 1e-3
    assert decode.sdpa_choice(inputs.q, *inputs.caches[0], causal=n_q > 1) in {
        "MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "OVERRIDEABLE"}


def test_a_refusing_backend_is_unsupported_on_the_cpu():
    pytest.importorskip("torch.nn.attention")
    problem = configs.DecodeProblem(1, 8, 2, 1, 64, 32, "float32")
    inputs = decode.make_inputs(problem, 1, "cpu")
    with pytest.raises(Exception) as info:
        decode.DecodeSdpa("torch_cudnn").setup(problem, inputs)  # no cuDNN kernel on the CPU
    assert clocks.classify(info.value)[0] == "unsupported"
    assert "enable_gqa=True" in decode.DecodeSdpa("torch_flash").description
    assert "SDPBackend.CUDNN_ATTENTION" in decode.DecodeSdpa("torch_cudnn").description


def test_our_implementation_is_the_public_torch_call():
    [ours] = decode.make_impls(["iokernels_torch"])
    assert ours.ours and "iokernels.torch.attention(q, k, v)" in ours.description and "H_kv" in ours.description


# ---------------------------------------------------------------------------------------------
# the command


def invoke(*args):
    return CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)


@pytest.fixture
def fake_run(monkeypatch):
    device = FakeDevice()
    monkeypatch.setattr(decode, "make_impls", lambda names: [f for f in fakes() if f.name in names])
    monkeypatch.setattr(decode, "TorchDevice", lambda: device)
    return device


def test_decode_command_defaults(fake_run):
    result = invoke("--decode", "--decode-batch", "1,4", "--decode-nk", "4096", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) == {"header", "rows", "ratios", "criteria"}
    h = doc["header"]
    assert h["modes"] == ["call", "graph"]  # --decode measures both by default
    assert {"environment", "command", "decode", "impls", "timing", "warmup", "repeats"} <= set(h)
    assert h["environment"]["commit"] == "abc" and h["environment"]["torch"] == "9.9"
    assert shlex.split(h["command"]) == ["iokernels", "bench", "--decode", "--decode-batch", "1,4", "--decode-nk",
                                         "4096", "--json"]
    assert {(r["heads"], r["kv_heads"], r["batch"], r["N_k"], r["N_q"], r["d"], r["dtype"]) for r in doc["rows"]} \
        == {(h_, k_, b, 4096, 1, 128, "float16") for h_, k_ in ((64, 8), (8, 8)) for b in (1, 4)}
    assert {r["impl"] for r in doc["rows"]} == {"iokernels_torch", "torch_flash", "torch_cudnn", "torch_efficient",
                                               "torch_sdpa"}
    assert len(doc["rows"]) == 4 * 5 * 2
    assert "iokernels: decode d=128 float16 B=1 H=64 H_kv=8" in result.stderr  # progress on stderr
    text = invoke("--decode", "--decode-heads", "16:4", "--decode-batch", "2", "--decode-nk", "8192",
                  "--decode-nq", "1,4", "--mode", "graph", "--peers", "flash")
    assert text.exit_code == 0, text.output
    assert "mode graph:" in text.stdout and "mode call:" not in text.stdout and "CUDNN us" not in text.stdout
    assert " 16:4 " in text.stdout and "best/io-torch" in text.stdout


@pytest.mark.parametrize("args, message", [
    (["--decode", "--decode-heads", "64:7"], "--decode-heads: in '64:7' H_kv = 7 does not divide H = 64"),
    (["--decode", "--decode-heads", "64"], "--decode-heads: '64' is not H:H_kv"),
    (["--decode", "--decode-batch", "0"], "--decode-batch: values must be >= 1"),
    (["--decode", "--decode-nk", "4k"], "--decode-nk: '4k' is not an integer"),
    (["--decode", "--decode-nq", "32", "--decode-nk", "16"], "--decode-nq 32 > --decode-nk 16"),
    (["--decode", "--d", "65"], "head dimension d=65"),
    (["--decode", "--dtype", "int8"], "unsupported dtype"),
    (["--decode", "--mode", "eager"], "--mode: expected call, graph or both"),
    (["--decode", "--impls", "cupy"], "--impls: unknown implementation 'cupy'"),
    (["--decode", "--peers", "flex"], "--peers: unknown implementation 'flex'"),
    (["--decode", "--impls", "none", "--peers", "none"], "select no implementation"),
    (["--decode", "--repeats", "0"], "--repeats must be >= 1"),
    (["--decode", "--N", "1024"], "--N do not apply"),
    (["--decode", "--causal", "--long"], "--causal, --long do not apply"),
    (["--decode", "--backward"], "--backward do not apply"),
    (["--decode-heads", "64:8"], "--decode-heads applies to bench --decode only"),
    (["--decode-nq", "4"], "--decode-nq applies to bench --decode only"),
])
def test_decode_option_errors_are_one_line_exit_2(fake_run, args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr
    assert fake_run.made == []


def test_decode_takes_no_backward(fake_run):
    assert invoke("--decode", "--no-backward", "--decode-batch", "1", "--decode-nk", "4096").exit_code == 0


def test_decode_with_nothing_available_is_one_line_exit_1(monkeypatch):
    monkeypatch.setattr(decode, "make_impls", lambda names: [Fake(n, n, missing="torch sees no CUDA device")
                                                             for n in names])
    result = invoke("--decode")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing to measure" in lines[0] and "torch sees no CUDA device" in lines[0]


def test_the_other_bench_json_records_its_command_too(monkeypatch):
    from iokernels.bench import implementations, suite

    from .test_modes import fakes as main_fakes

    monkeypatch.setattr(implementations, "make_impls", lambda names, sram=None: [f for f in main_fakes()
                                                                                 if f.name in names])
    monkeypatch.setattr(suite, "free_device_memory", lambda: None)
    monkeypatch.setattr(suite, "environment", lambda impls: {"gpu": "Fake GPU", "date": "2026", "commit": "abc"})
    result = invoke("--d", "64", "--N", "512", "--dtype", "float16", "--no-backward", "--json")
    assert result.exit_code == 0, result.output
    assert shlex.split(json.loads(result.stdout)["header"]["command"]) == [
        "iokernels", "bench", "--d", "64", "--N", "512", "--dtype", "float16", "--no-backward", "--json"]
