"""``bench --alibi`` (ALiBi, FlashAttention-2's ``alibi_slopes``; issue #22): the slopes (made in one place), the
labels and the run's JSON, the work counted (as without ALiBi), which implementations take it and what they are given
(FlexAttention's ``score_mod`` worked out by hand), ours' refusal past d 128 read as "unsupported", and the command's
refusals (CPU only: no GPU, the timed implementations faked)."""

import json
import math
import types

import pytest
from click.testing import CliRunner

from iokernels.bench import clocks, configs, implementations, suite
from iokernels.bench.clocks import Unsupported
from iokernels.bench.implementations import CupyStandard, TorchSdpa
from iokernels.cli import cli

from .fakes import FakeClock

# ---------------------------------------------------------------------------------------------
# the slopes, problems and FLOPs


def test_the_slopes_are_the_standard_geometric_ones():
    # H 8: 2^(-8(h+1)/8) = 2^-(h+1), written out
    assert configs.alibi_slopes(8) == (0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625)
    sixteen = configs.alibi_slopes(16)  # 2^-0.5, 2^-1, ..., 2^-8: every other one H 8's
    assert len(sixteen) == 16 and sixteen[1::2] == configs.alibi_slopes(8)
    assert sixteen[0] == pytest.approx(1 / math.sqrt(2), rel=1e-15) and sixteen[-1] == 1 / 256
    assert configs.alibi_slopes(1) == (1 / 256,) and configs.alibi_slopes(2) == (1 / 16, 1 / 256)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="heads >= 1"):
            configs.alibi_slopes(bad)


def test_a_problem_labels_its_alibi_and_counts_as_without():
    biased = configs.Problem(2, 16, 1024, 64, "float16", causal=True, alibi=True)
    assert biased.describe().endswith(" causal alibi") and biased.alibi_slopes == configs.alibi_slopes(16)
    plain = configs.Problem(2, 16, 1024, 64, "float16", causal=True)
    assert "alibi" not in plain.describe() and plain.alibi_slopes is None
    assert configs.Problem(1, 8, 64, 64, "float16", alibi=True).alibi_slopes == configs.alibi_slopes(8)
    # FlashAttention-2's convention, the bias not counted: 4·B·H·N²·d halved when causal, backward 2.5×
    assert biased.flops("fwd") == plain.flops("fwd") == 4 * 2 * 16 * 1024 * 1024 * 64 / 2
    assert biased.flops("bwd") == 2.5 * 4 * 2 * 16 * 1024 * 1024 * 64 / 2
    windowed = configs.Problem(1, 1, 4, 8, "float16", window=(1, 0), alibi=True)  # 1 + 2 + 2 + 2 visible elements
    assert windowed.flops("fwd") == 4 * 8 * 7
    assert "ALiBi" in configs.FLOP_CONVENTION and "not counted" in configs.FLOP_CONVENTION


def test_main_problems_carry_alibi():
    problems = configs.main_problems([64, 128], [4096], ["float16"], heads=16, causal=True, alibi=True)
    assert len(problems) == 2 and all(p.alibi and p.causal and p.batch == 4 for p in problems)
    sparse = configs.main_problems([64], [1024], ["float16"], alibi=True,
                                   block_sparse=configs.block_sparse_spec(0.5))
    assert sparse[0].alibi and sparse[0].block_mask is not None
    assert not any(p.alibi for p in configs.main_problems([64], [1024], ["float16"]))


# ---------------------------------------------------------------------------------------------
# implementations


def test_the_peers_without_alibi_refuse_it():
    problem = configs.Problem(1, 2, 64, 64, "float16", alibi=True)
    with pytest.raises(Unsupported, match="cupy standard attention has no ALiBi"):  # before it needs cupy
        CupyStandard().setup(problem, "fwd")
    pytest.importorskip("torch.nn.attention")
    for name in implementations.TORCH_BACKENDS:
        with pytest.raises(Unsupported, match="scaled_dot_product_attention has no ALiBi"):
            TorchSdpa(name, device="cpu").setup(problem, "fwd")


def test_flex_score_mod_subtracts_the_slope_times_the_distance():
    torch = pytest.importorskip("torch")
    assert implementations.flex_score_mod(configs.Problem(1, 2, 4, 16, "float32"), "cpu") is None
    score_mod = implementations.flex_score_mod(configs.Problem(1, 2, 4, 16, "float32", alibi=True), "cpu")
    h = torch.arange(2)[:, None, None]
    q_idx, kv_idx = torch.arange(4)[None, :, None], torch.arange(4)[None, None, :]
    got = score_mod(torch.ones(2, 4, 4), 0, h, q_idx, kv_idx)
    # by hand: H 2, slopes 2^-4 and 2^-8; score 1 minus slope·|kv_idx − q_idx|
    distance = [[0, 1, 2, 3], [1, 0, 1, 2], [2, 1, 0, 1], [3, 2, 1, 0]]
    want = [[[1 - s * x for x in row] for row in distance] for s in (1 / 16, 1 / 256)]
    assert got.dtype == torch.float32 and torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64))
    assert got[0, 0, 3].item() == 1 - 3 / 16 and got[1, 3, 0].item() == pytest.approx(1 - 3 / 256, abs=1e-7)
    one = score_mod(torch.tensor(0.5), 0, torch.tensor(1), torch.tensor(2), torch.tensor(0))  # a scalar each
    assert one.item() == pytest.approx(0.5 - 2 / 256, abs=1e-7)
    with pytest.raises(ValueError, match="one or the other"):
        implementations.flex_score_mod(configs.Problem(1, 2, 4, 16, "float32", softcap=5.0, alibi=True), "cpu")


def _record_flex(monkeypatch):
    """FlexAttention stood in for by a recorder of its keyword arguments (the output: q)."""
    calls = []

    def flex(q, k, v, **kwargs):
        calls.append(kwargs)
        return q.clone()

    monkeypatch.setattr(implementations, "_compiled_flex", lambda: flex)
    return calls


@pytest.mark.parametrize("kind", ["plain", "causal", "window", "block_sparse"])
def test_flex_gets_the_alibi_score_mod_beside_the_block_mask(monkeypatch, kind):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.nn.attention.flex_attention")
    calls = _record_flex(monkeypatch)
    extra = {"plain": {}, "causal": {"causal": True}, "window": {"window": (64, 0)},
             "block_sparse": {"causal": True, "block_mask": configs.main_problems(
                 [16], [256], ["float32"], heads=1, tokens=256,
                 block_sparse=configs.block_sparse_spec(1.0, "local"))[0].block_mask}}[kind]
    problem = configs.Problem(1, 4, 256, 16, "float32", alibi=True, **extra)
    implementations.TorchFlex(device="cpu").setup(problem, "fwd").call()
    assert calls and all(set(c) == {"score_mod", "block_mask"} for c in calls)
    score_mod = calls[0]["score_mod"]  # head 3 of 4: slope 2^-8; 10 keys apart
    assert score_mod(torch.tensor(0.0), 0, torch.tensor(3), torch.tensor(12), torch.tensor(2)).item() == -10 / 256
    assert (calls[0]["block_mask"] is None) == (kind == "plain")


def test_ours_are_given_the_slopes(monkeypatch):
    """iokernels.torch.attention gets alibi_slopes= the H slopes, and a call without ALiBi no alibi_slopes."""
    pytest.importorskip("torch")
    import iokernels.torch as iotorch

    calls = []

    def attention(q, k, v, **kwargs):
        calls.append(kwargs)
        return q.clone()

    monkeypatch.setattr(iotorch, "attention", attention)
    problem = configs.Problem(1, 8, 10, 16, "float32", causal=True, window=(4, 0), alibi=True)
    implementations.IokernelsTorch(device="cpu").setup(problem, "fwd").call()
    assert calls and all(c["alibi_slopes"] == configs.alibi_slopes(8) and c["causal"] and c["window"] == (4, 0)
                         for c in calls)
    assert isinstance(calls[0]["alibi_slopes"], tuple) and len(calls[0]["alibi_slopes"]) == 8
    calls.clear()
    implementations.IokernelsTorch(device="cpu").setup(configs.Problem(1, 2, 10, 16, "float32"), "fwd").call()
    assert calls and all("alibi_slopes" not in c for c in calls)


@pytest.mark.parametrize("alibi", [True, False])
def test_ours_on_cupy_are_given_the_slopes_forward_and_backward(monkeypatch, alibi):
    """iokernels.attention and attention_backward get alibi_slopes= (numpy standing in for cupy)."""
    import numpy as np

    from iokernels.kernels import runtime
    from iokernels.library import api

    monkeypatch.setattr(runtime, "require_cupy", lambda: np)
    monkeypatch.setattr(implementations, "_random", lambda xp, shape, seed: np.zeros(shape, np.float32))
    monkeypatch.setattr(np, "cuda", types.SimpleNamespace(Device=lambda: types.SimpleNamespace(
        synchronize=lambda: None)), raising=False)
    monkeypatch.setattr(implementations, "CupyClock", lambda: FakeClock(0.0))
    forward, backward = [], []

    def attention(q, k, v, return_lse=False, return_dropout=False, **kwargs):
        forward.append(kwargs)
        return (q, None, None) if return_lse else q

    monkeypatch.setattr(api, "attention", attention)
    monkeypatch.setattr(api, "attention_backward", lambda *args, **kwargs: backward.append(kwargs))
    problem = configs.Problem(1, 4, 10, 16, "float16", causal=True, alibi=alibi)
    implementations.IokernelsCupy().setup(problem, "bwd").call()
    assert forward and backward
    want = configs.alibi_slopes(4) if alibi else None
    assert all(c["alibi_slopes"] == want and c["causal"] for c in forward + backward)


def test_ours_plan_the_bench_configurations_and_refuse_past_d_128():
    """The library plans ALiBi at the bench's d 64 and 128 (N 4096, B 4, H 16; causal, a window, a block mask), and
    past d 128 raises its own Unsupported, which the bench reads as "unsupported" (unsup)."""
    from iokernels.plan import Unsupported as PlanUnsupported
    from iokernels.plan import make_plan

    slopes = configs.alibi_slopes(16)
    mask = configs.main_problems([64], [4096], ["float16"], block_sparse=configs.block_sparse_spec(0.25))[0].block_mask
    for d in (64, 128):
        for direction in ("fwd", "bwd"):
            for extra in ({}, {"causal": "bottom_right"}, {"window": (256, 0)}, {"block_mask": mask}):
                plan = make_plan("flash", "fast", N_q=4096, d=d, dtype="float16", sram=227 * 1024, batch=4,
                                 heads=16, direction=direction, alibi=slopes, **extra)
                assert plan.alibi == slopes * 4
    with pytest.raises(PlanUnsupported, match="d up to 128") as refused:
        make_plan("flash", "fast", N_q=4096, d=256, dtype="float16", sram=227 * 1024, batch=4, heads=16,
                  alibi=slopes)
    status, note = clocks.classify(refused.value)
    assert status == "unsupported" and "ALiBi" in note


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_with_alibi_computes_biased_attention(monkeypatch):
    """The uncompiled FlexAttention on CPU, given what setup builds, against softmax(s − slope_h|j − i|) written out."""
    torch = pytest.importorskip("torch")
    flex_attention = pytest.importorskip("torch.nn.attention.flex_attention").flex_attention

    monkeypatch.setattr(implementations, "_compiled_flex", lambda: flex_attention)
    n, d, heads = 128, 16, 2
    problem = configs.Problem(1, heads, n, d, "float32", causal=True, alibi=True)
    out = implementations.TorchFlex(device="cpu").setup(problem, "fwd").call()
    gen = torch.Generator(device="cpu").manual_seed(0)  # the inputs torch_runner draws: q, k, v, dout in this order
    q, k, v = (torch.randn((1, heads, n, d), dtype=torch.float32, generator=gen).double() for _ in range(3))
    distance = (torch.arange(n)[None, :] - torch.arange(n)[:, None]).abs().double()
    slopes = torch.tensor([2.0 ** -4, 2.0 ** -8], dtype=torch.float64)[:, None, None]
    causal = torch.ones(n, n, dtype=torch.bool).triu(1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    want = torch.softmax((s - slopes * distance).masked_fill(causal, float("-inf")), dim=-1) @ v
    assert torch.allclose(out.double(), want, atol=1e-5)
    plain = torch.softmax(s.masked_fill(causal, float("-inf")), dim=-1) @ v
    assert not torch.allclose(out.double(), plain, atol=1e-3)  # the bias does change the output


# ---------------------------------------------------------------------------------------------
# the command


class Fake(implementations.Impl):
    """Runs at ``tflops`` on the FLOPs it is given; refuses ALiBi unless ``alibi``."""

    def __init__(self, name, label, ours, tflops, alibi=True):
        self.name, self.label, self.ours, self.tflops, self.alibi = name, label, ours, tflops, alibi
        self.problems = []

    def setup(self, problem, direction):
        self.problems.append(problem)
        if problem.alibi and not self.alibi:
            raise Unsupported("no ALiBi")
        return clocks.Runner(call=lambda: None, clock=FakeClock(problem.flops(direction) / (self.tflops * 1e12)))


@pytest.fixture
def faked(monkeypatch):
    monkeypatch.setattr(suite, "free_device_memory", lambda: None)
    monkeypatch.setattr(suite, "environment", lambda impls: {"gpu": "Fake GPU", "date": "2026-01-01T00:00:00+00:00",
                                                          "cupy": "0", "commit": "abc", "torch": "9.9"})
    impls = [Fake("iokernels_torch", "io-torch", True, 200.0), Fake("torch_flex", "FLEX", False, 100.0),
             Fake("torch_flash", "FLASH", False, 300.0, alibi=False)]
    monkeypatch.setattr(implementations, "make_impls", lambda names, sram=None: [i for i in impls if i.name in names])
    return impls


def invoke(*args):
    return CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)


def test_the_command_records_alibi(faked):
    result = invoke("--d", "64", "--N", "4096", "--dtype", "float16", "--causal", "--alibi", "--no-backward", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["header"]["alibi"] == {"rule": "2^(-8(h+1)/H)", "slopes": list(configs.alibi_slopes(16))}
    assert doc["header"]["softcap"] is None and "--alibi" in doc["header"]["command"]
    assert "ALiBi" in doc["header"]["flop_convention"]
    rows = {r["impl"]: r for r in doc["rows"]}
    assert set(rows) == {"iokernels_torch", "torch_flex", "torch_flash"}
    assert all(r["alibi"] is True and r["N"] == 4096 and r["batch"] == 4 for r in rows.values())
    # B 4, H 16, N 4096, d 64, causal: 4·B·H·N²·d / 2, the bias not counted
    assert all(r["flops"] == 4 * 4 * 16 * 4096 * 4096 * 64 / 2 for r in rows.values())
    assert rows["iokernels_torch"]["status"] == rows["torch_flex"]["status"] == "ok"
    assert rows["torch_flash"]["status"] == "unsupported"
    assert all(p.alibi and p.alibi_slopes == configs.alibi_slopes(16) for i in faked for p in i.problems)
    assert "main d=64 N=4096 float16 B=4 H=16 causal alibi" in result.stderr
    text = invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--alibi", "--heads", "8", "--no-backward")
    assert text.exit_code == 0, text.output
    assert "ALiBi (the logits minus slope_h |j - i|, slopes 2^(-8(h+1)/H): 2^-1, 2^-2, ..., 2^-8" in text.stdout


@pytest.mark.parametrize("args, label", [
    (["--causal"], "causal alibi"),
    (["--window", "256,0"], "window=256,0 alibi"),
    (["--block-sparse", "0.5"], "alibi blocks=random(density=0.5"),
    (["--block-sparse", "0.25", "--causal"], "causal alibi blocks="),
])
def test_alibi_combines_with_the_masks(faked, args, label):
    result = invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--alibi", *args, "--no-backward", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["header"]["alibi"]["slopes"] == list(configs.alibi_slopes(16))
    assert doc["rows"] and all(r["alibi"] for r in doc["rows"])
    assert label in result.stderr


def test_without_alibi_the_header_says_none(faked):
    doc = json.loads(invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--no-backward", "--json").stdout)
    assert doc["header"]["alibi"] is None and all(r["alibi"] is False for r in doc["rows"])
    assert all(r["status"] == "ok" for r in doc["rows"])


@pytest.mark.parametrize("args, message", [
    (["--alibi", "--softcap", "30"], "--alibi and --softcap: ours have no ALiBi with a softcap"),
    (["--alibi", "--dropout", "0.1"], "--alibi and --dropout: FlexAttention, the peer with ALiBi, has no dropout"),
    (["--alibi", "--documents", "4"], "--alibi and --documents: ours have no ALiBi on documents"),
    (["--alibi", "--long"], "--alibi applies to the main table's TFLOP/s"),
    (["--alibi", "--long-only"], "--alibi applies to the main table's TFLOP/s"),
    (["--alibi", "--overhead"], "--alibi applies to the main table's TFLOP/s"),
    (["--decode", "--alibi"], "--alibi do not apply"),
    (["--varlen", "--alibi"], "--alibi do not apply"),
    (["--alibi=yes"], "does not take a value"),
])
def test_alibi_refusals_are_one_line_exit_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert message in result.stderr and "Traceback" not in result.stderr
    if "does not take" not in message:  # click's own usage error has its usage lines
        assert len(lines) == 1
