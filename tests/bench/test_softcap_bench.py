"""``bench --softcap C`` (attention softcapping, Gemma 2's, issue #22): the labels and the run's JSON, the work counted
(as without a softcap), which implementations take it and what they are given (FlexAttention's ``score_mod`` worked
out by hand), and the command's refusals (CPU only: no GPU, the timed implementations faked)."""

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
# problems and FLOPs


def test_a_problem_labels_its_softcap_and_counts_as_without():
    capped = configs.Problem(2, 16, 1024, 64, "float16", causal=True, softcap=30.0)
    assert capped.describe().endswith(" causal softcap=30")
    assert "softcap=2.5" in configs.Problem(1, 16, 1024, 64, "float16", softcap=2.5).describe()
    assert "softcap" not in configs.Problem(1, 16, 1024, 64, "float16").describe()
    # FlashAttention-2's convention, the tanh not counted: 4·B·H·N²·d halved when causal, backward 2.5×
    assert capped.flops("fwd") == 4 * 2 * 16 * 1024 * 1024 * 64 / 2
    assert capped.flops("bwd") == 2.5 * 4 * 2 * 16 * 1024 * 1024 * 64 / 2
    assert configs.Problem(2, 16, 1024, 64, "float16", softcap=30.0).flops("fwd") == 4 * 2 * 16 * 1024 * 1024 * 64
    # with documents (1, 3) at N 4: 1 + 9 visible elements, the softcap changing nothing
    assert configs.Problem(1, 1, 4, 8, "float16", documents=(1, 3), softcap=5.0).flops("fwd") == 4 * 8 * 10
    assert "softcap" in configs.FLOP_CONVENTION and "not counted" in configs.FLOP_CONVENTION


def test_main_problems_carry_the_softcap():
    problems = configs.main_problems([64], [1024, 4096], ["float16"], causal=True, documents=2, softcap=50.0)
    assert len(problems) == 2 and all(p.softcap == 50.0 and p.causal for p in problems)
    assert {p.n: p.documents for p in problems} == {1024: (512, 512), 4096: (2048, 2048)}
    assert all(p.softcap is None for p in configs.main_problems([64], [1024], ["float16"]))


# ---------------------------------------------------------------------------------------------
# implementations


def test_the_peers_without_a_softcap_refuse_it():
    problem = configs.Problem(1, 2, 64, 64, "float16", softcap=30.0)
    with pytest.raises(Unsupported, match="cupy standard attention has no softcap"):  # before it needs cupy
        CupyStandard().setup(problem, "fwd")
    pytest.importorskip("torch.nn.attention")
    for name in implementations.TORCH_BACKENDS:
        with pytest.raises(Unsupported, match="scaled_dot_product_attention has no softcap"):
            TorchSdpa(name, device="cpu").setup(problem, "fwd")


def test_flex_score_mod_is_c_tanh_of_the_score_over_c():
    torch = pytest.importorskip("torch")
    assert implementations.flex_score_mod(configs.Problem(1, 1, 16, 16, "float32")) is None
    score_mod = implementations.flex_score_mod(configs.Problem(1, 1, 16, 16, "float32", softcap=30.0))
    xs = [-300.0, -30.0, -1.0, 0.0, 0.5, 15.0, 30.0, 90.0, 1e4]
    got = score_mod(torch.tensor(xs, dtype=torch.float64), None, None, None, None).tolist()
    assert got == pytest.approx([30.0 * math.tanh(x / 30.0) for x in xs], rel=1e-12, abs=1e-12)
    # by hand: 30·tanh(1) = 22.8478..., tanh(0) = 0, small scores nearly unchanged, large ones near ±30
    assert got[6] == pytest.approx(22.847824, abs=1e-6) and got[3] == 0.0
    assert got[4] == pytest.approx(0.5, abs=1e-4) and got[8] == pytest.approx(30.0, abs=1e-9)
    assert got[0] == pytest.approx(-29.9999, abs=1e-3) and all(abs(g) <= 30.0 for g in got)
    other = implementations.flex_score_mod(configs.Problem(1, 1, 16, 16, "float32", softcap=2.0))
    assert other(torch.tensor([2.0], dtype=torch.float64), 0, 0, 0, 0).item() == pytest.approx(2 * math.tanh(1.0))


def _record_flex(monkeypatch):
    """FlexAttention stood in for by a recorder of its keyword arguments (the output: q)."""
    calls = []

    def flex(q, k, v, **kwargs):
        calls.append(kwargs)
        return q.clone()

    monkeypatch.setattr(implementations, "_compiled_flex", lambda: flex)
    return calls


@pytest.mark.parametrize("causal, documents", [(False, None), (True, None), (False, (128, 128)), (True, (64, 192))])
def test_flex_gets_the_score_mod_beside_the_block_mask(monkeypatch, causal, documents):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.nn.attention.flex_attention")
    calls = _record_flex(monkeypatch)
    problem = configs.Problem(1, 1, 256, 16, "float32", causal=causal, documents=documents, softcap=20.0)
    implementations.TorchFlex(device="cpu").setup(problem, "fwd").call()
    assert calls and all(set(c) == {"score_mod", "block_mask"} for c in calls)
    score_mod = calls[0]["score_mod"]
    assert score_mod(torch.tensor([20.0]), 0, 0, 0, 0).item() == pytest.approx(20 * math.tanh(1.0), rel=1e-6)
    block_mask = calls[0]["block_mask"]
    if not causal and documents is None:
        assert block_mask is None
    else:  # the mask's visible elements: causal 256·257/2, documents (128, 128) 2·128², causal (64, 192) 64·65/2 + ...
        dense = block_mask.mask_mod(None, None, torch.arange(256)[:, None], torch.arange(256)[None, :])
        want = {(True, None): 32896, (False, (128, 128)): 32768, (True, (64, 192)): 2080 + 18528}[(causal, documents)]
        assert int(dense.sum()) == want


def test_flex_without_a_softcap_gets_no_score_mod(monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("torch.nn.attention.flex_attention")
    calls = _record_flex(monkeypatch)
    implementations.TorchFlex(device="cpu").setup(configs.Problem(1, 1, 128, 16, "float32", causal=True),
                                                  "fwd").call()
    assert calls and all(c["score_mod"] is None and c["block_mask"] is not None for c in calls)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_with_a_softcap_computes_softcapped_attention(monkeypatch):
    """The uncompiled FlexAttention on CPU, given what setup builds, against softmax(c·tanh(s/c)) written out here."""
    torch = pytest.importorskip("torch")
    flex_attention = pytest.importorskip("torch.nn.attention.flex_attention").flex_attention

    monkeypatch.setattr(implementations, "_compiled_flex", lambda: flex_attention)
    c, n, d = 2.0, 128, 16
    problem = configs.Problem(1, 2, n, d, "float32", causal=True, softcap=c)
    out = implementations.TorchFlex(device="cpu").setup(problem, "fwd").call()
    gen = torch.Generator(device="cpu").manual_seed(0)  # the inputs torch_runner draws: q, k, v, dout in this order
    q, k, v = (torch.randn((1, 2, n, d), dtype=torch.float32, generator=gen).double() for _ in range(3))
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    s = c * torch.tanh(s / c)
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.softmax(s, dim=-1) @ v
    assert torch.allclose(out.double(), want, atol=1e-5)
    plain = (torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(
        torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")), dim=-1) @ v)
    assert not torch.allclose(out.double(), plain, atol=1e-3)  # the cap at 2 does change the output


def test_ours_are_given_the_softcap(monkeypatch):
    """iokernels.torch.attention gets softcap= C, and a call without a softcap softcap=None."""
    pytest.importorskip("torch")
    import iokernels.torch as iotorch

    calls = []

    def attention(q, k, v, **kwargs):
        calls.append(kwargs)
        return q.clone()

    monkeypatch.setattr(iotorch, "attention", attention)
    problem = configs.Problem(1, 2, 10, 16, "float32", causal=True, documents=(3, 3, 4), softcap=30.0)
    implementations.IokernelsTorch(device="cpu").setup(problem, "fwd").call()
    assert calls and all(c["softcap"] == 30.0 and c["causal"] and c["documents"] == (3, 3, 4) for c in calls)
    calls.clear()
    implementations.IokernelsTorch(device="cpu").setup(configs.Problem(1, 2, 10, 16, "float32"), "fwd").call()
    assert calls and all("softcap" in c and c["softcap"] is None for c in calls)


@pytest.mark.parametrize("softcap", [30.0, None])
def test_ours_on_cupy_are_given_the_softcap_forward_and_backward(monkeypatch, softcap):
    """iokernels.attention and attention_backward get softcap= C (numpy standing in for cupy)."""
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
    problem = configs.Problem(1, 2, 10, 16, "float16", window=(4, 0), softcap=softcap)
    implementations.IokernelsCupy().setup(problem, "bwd").call()
    assert forward and backward
    assert all("softcap" in c and c["softcap"] == softcap and c["window"] == (4, 0) for c in forward + backward)


# ---------------------------------------------------------------------------------------------
# the command


class Fake(implementations.Impl):
    """Runs at ``tflops`` on the FLOPs it is given; refuses a softcap unless ``softcap``."""

    def __init__(self, name, label, ours, tflops, softcap=True):
        self.name, self.label, self.ours, self.tflops, self.softcap = name, label, ours, tflops, softcap
        self.problems = []

    def setup(self, problem, direction):
        self.problems.append(problem)
        if problem.softcap is not None and not self.softcap:
            raise Unsupported("no softcap")
        return clocks.Runner(call=lambda: None, clock=FakeClock(problem.flops(direction) / (self.tflops * 1e12)))


@pytest.fixture
def faked(monkeypatch):
    monkeypatch.setattr(suite, "free_device_memory", lambda: None)
    monkeypatch.setattr(suite, "environment", lambda impls: {"gpu": "Fake GPU", "date": "2026-01-01T00:00:00+00:00",
                                                          "cupy": "0", "commit": "abc", "torch": "9.9"})
    impls = [Fake("iokernels_torch", "io-torch", True, 200.0), Fake("torch_flex", "FLEX", False, 100.0),
             Fake("torch_flash", "FLASH", False, 300.0, softcap=False)]
    monkeypatch.setattr(implementations, "make_impls", lambda names, sram=None: [i for i in impls if i.name in names])
    return impls


def invoke(*args):
    return CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)


def test_the_command_records_the_softcap(faked):
    result = invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--causal", "--softcap", "30", "--no-backward",
                    "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["header"]["softcap"] == 30.0 and doc["header"]["documents"] is None
    assert "--softcap 30" in doc["header"]["command"] and "softcap" in doc["header"]["flop_convention"]
    rows = {r["impl"]: r for r in doc["rows"]}
    assert set(rows) == {"iokernels_torch", "torch_flex", "torch_flash"}
    assert all(r["softcap"] == 30.0 and r["N"] == 1024 and r["batch"] == 16 for r in rows.values())
    # B 16, H 16, N 1024, d 64, causal: 4·B·H·N²·d / 2, the tanh not counted
    assert all(r["flops"] == 4 * 16 * 16 * 1024 * 1024 * 64 / 2 for r in rows.values())
    assert rows["iokernels_torch"]["status"] == rows["torch_flex"]["status"] == "ok"
    assert rows["torch_flash"]["status"] == "unsupported"
    assert all(p.softcap == 30.0 for i in faked for p in i.problems)
    assert "main d=64 N=1024 float16 B=16 H=16 causal softcap=30" in result.stderr
    text = invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--softcap", "2.5", "--no-backward")
    assert text.exit_code == 0 and "softcap 2.5" in text.stdout


@pytest.mark.parametrize("args, label", [
    (["--causal"], "causal softcap=50"),
    (["--window", "256,0"], "window=256,0 softcap=50"),
])
def test_the_softcap_combines_with_the_masks(faked, args, label):
    result = invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--softcap", "50", *args, "--no-backward",
                    "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["header"]["softcap"] == 50.0 and all(r["softcap"] == 50.0 for r in doc["rows"])
    assert label in result.stderr


def test_without_a_softcap_the_header_says_none(faked):
    doc = json.loads(invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--no-backward", "--json").stdout)
    assert doc["header"]["softcap"] is None and all(r["softcap"] is None for r in doc["rows"])
    assert all(r["status"] == "ok" for r in doc["rows"])


@pytest.mark.parametrize("args, message", [
    (["--softcap", "0"], "--softcap: softcap must be > 0, got 0.0"),
    (["--softcap", "-30"], "--softcap: softcap must be > 0, got -30.0"),
    (["--softcap", "inf"], "--softcap: softcap must be a finite number > 0"),
    (["--softcap", "nan"], "--softcap: softcap must be a finite number > 0"),
    (["--softcap", "thirty"], "'thirty' is not a valid float"),
    (["--softcap", "30", "--dropout", "0.1"], "--softcap and --dropout"),
    (["--softcap", "30", "--documents", "4"], "--softcap and --documents"),
    (["--softcap", "30", "--long"], "--softcap applies to the main table's TFLOP/s"),
    (["--softcap", "30", "--long-only"], "--softcap applies to the main table's TFLOP/s"),
    (["--softcap", "30", "--overhead"], "--softcap applies to the main table's TFLOP/s"),
    (["--decode", "--softcap", "30"], "--softcap do not apply"),
    (["--varlen", "--softcap", "30"], "--softcap do not apply"),
])
def test_bad_softcaps_are_one_line_exit_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr
