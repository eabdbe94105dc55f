"""``bench --documents K`` (document masking, issue #22): the lengths each N is cut into, the work counted (the visible
elements, worked out by hand), the labels and the run's JSON, which implementations take documents and what they are
given, and the command's refusals (CPU only: no GPU, the timed implementations faked)."""

import dataclasses
import json
import types

import numpy as np
import pytest
from click.testing import CliRunner

from iokernels.bench import clocks, configs, implementations, suite
from iokernels.bench.clocks import Unsupported
from iokernels.bench.implementations import CupyStandard, TorchSdpa
from iokernels.cli import cli

from .fakes import FakeClock

# ---------------------------------------------------------------------------------------------
# lengths and FLOPs


def test_each_n_is_cut_into_equal_documents_the_last_taking_the_remainder():
    assert configs.document_lengths(16384, 8) == (2048,) * 8
    assert configs.document_lengths(1000, 3) == (333, 333, 334)
    assert configs.document_lengths(10, 4) == (2, 2, 2, 4)
    assert configs.document_lengths(7, 1) == (7,) and configs.document_lengths(3, 3) == (1, 1, 1)
    for bad, message in ((0, ">= 1"), (-2, ">= 1"), (8, "> N = 7")):
        with pytest.raises(ValueError, match=message):
            configs.document_lengths(7, bad)


def test_documents_count_their_visible_elements():
    docs = (333, 333, 334)
    # N 1000 in documents of 333, 333, 334: 333² + 333² + 334² elements, 4 d FLOPs each (d 64)
    assert configs.attention_flops(1, 1, 1000, 1000, 64, documents=docs) == 4 * 64 * (110889 + 110889 + 111556)
    # causal: n(n + 1)/2 per document, 333·334/2 = 55611 and 334·335/2 = 55945
    assert configs.attention_flops(1, 1, 1000, 1000, 64, causal=True, documents=docs) == \
        4 * 64 * (55611 + 55611 + 55945)
    assert configs.attention_flops(2, 3, 1000, 1000, 64, causal=True, documents=docs, direction="bwd") == \
        2.5 * 6 * 4 * 64 * (55611 + 55611 + 55945)
    # N 4 in (1, 3): 1 + 9 = 10 elements; causal 1 + (1 + 2 + 3) = 7
    assert configs.attention_flops(1, 1, 4, 4, 8, documents=(1, 3)) == 4 * 8 * 10
    assert configs.attention_flops(1, 1, 4, 4, 8, causal=True, documents=[1, 3]) == 4 * 8 * 7
    # one document is plain attention: N² (causal half of it, FlashAttention-2's convention)
    assert configs.attention_flops(1, 1, 4, 4, 8, documents=(4,)) == 4 * 8 * 16
    assert configs.attention_flops(1, 1, 4, 4, 8, causal=True, documents=(4,)) == 4 * 8 * 8
    with pytest.raises(ValueError, match="sum to N_q"):  # lengths that are not N's are an error, not a wrong count
        configs.attention_flops(1, 1, 1000, 1000, 64, documents=(500, 400))


def test_a_problem_labels_and_counts_its_documents():
    problem = configs.Problem(2, 16, 1000, 64, "float16", causal=True, documents=(333, 333, 334))
    assert problem.flops("fwd") == 4 * 2 * 16 * 64 * (55611 + 55611 + 55945)
    assert problem.flops("bwd") == 2.5 * problem.flops("fwd")
    assert "documents=2x333+1x334" in problem.describe() and " causal" in problem.describe()
    assert "documents=8x2048" in configs.Problem(1, 16, 16384, 64, "float16", documents=(2048,) * 8).describe()
    one = configs.Problem(1, 16, 1000, 64, "float16", documents=(1000,))
    assert problem.masks_documents and not one.masks_documents and "documents=1x1000" in one.describe()
    assert "documents" not in configs.Problem(1, 16, 1000, 64, "float16").describe()


def test_main_problems_cut_every_n():
    problems = configs.main_problems([64], [1024, 4096], ["float16"], documents=3)
    assert {p.n: p.documents for p in problems} == {1024: (341, 341, 342), 4096: (1365, 1365, 1366)}
    assert all(p.window is None for p in problems)
    assert all(p.documents is None for p in configs.main_problems([64], [1024], ["float16"]))
    with pytest.raises(ValueError, match="--documents 2048 > N = 1024"):
        configs.main_problems([64], [1024, 4096], ["float16"], documents=2048)


# ---------------------------------------------------------------------------------------------
# implementations


def test_the_peers_without_documents_refuse_them():
    problem = configs.Problem(1, 2, 64, 64, "float16", documents=(32, 32))
    with pytest.raises(Unsupported, match="no document mask"):  # before it needs cupy
        CupyStandard().setup(problem, "fwd")
    pytest.importorskip("torch.nn.attention")
    with pytest.raises(Unsupported, match="no document mask"):
        TorchSdpa("torch_flash").setup(problem, "fwd")


def test_one_document_is_plain_attention_for_the_peers():
    pytest.importorskip("torch.nn.attention")
    problem = configs.Problem(batch=1, heads=2, n=64, d=32, dtype="float32", documents=(64,))
    out = TorchSdpa("torch_math", device="cpu").setup(problem, "fwd").call()
    assert tuple(out.shape) == (1, 2, 64, 32)


def test_flex_mask_mod_sees_only_its_own_document():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.nn.attention.flex_attention")
    ids = [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]  # documents (3, 3, 4), written out
    q_idx, kv_idx = torch.arange(10)[:, None], torch.arange(10)[None, :]
    for causal in (False, True):
        problem = configs.Problem(1, 1, 10, 16, "float32", causal=causal, documents=(3, 3, 4))
        mask_mod = implementations.flex_mask_mod(problem, "cpu")
        got = mask_mod(None, None, q_idx, kv_idx).tolist()
        want = [[ids[i] == ids[j] and (j <= i or not causal) for j in range(10)] for i in range(10)]
        assert got == want
        assert sum(map(sum, got)) == (9 + 9 + 16 if not causal else 6 + 6 + 10)  # 3·4/2 + 3·4/2 + 4·5/2 causal
    assert implementations.flex_mask_mod(configs.Problem(1, 1, 10, 16, "float32", documents=(10,)), "cpu") is None
    assert implementations.flex_mask_mod(configs.Problem(1, 1, 10, 16, "float32"), "cpu") is None


def test_flex_block_mask_skips_the_blocks_between_documents():
    pytest.importorskip("torch")
    from torch.nn.attention.flex_attention import create_block_mask

    problem = configs.Problem(1, 1, 256, 16, "float32", documents=(128, 128))
    block_mask = create_block_mask(implementations.flex_mask_mod(problem, "cpu"), None, None, 256, 256,
                                   device="cpu", BLOCK_SIZE=128)
    assert block_mask.to_dense()[0, 0].tolist() == [[1, 0], [0, 1]]


def test_ours_are_given_the_lengths(monkeypatch):
    """iokernels.torch.attention gets documents= the lengths, and a call without documents documents=None."""
    pytest.importorskip("torch")
    import iokernels.torch as iotorch

    calls = []

    def attention(q, k, v, **kwargs):
        calls.append(kwargs)
        return q.clone()

    monkeypatch.setattr(iotorch, "attention", attention)
    problem = configs.Problem(1, 2, 10, 16, "float32", causal=True, documents=(3, 3, 4))
    implementations.IokernelsTorch(device="cpu").setup(problem, "fwd").call()
    assert calls and all(c["documents"] == (3, 3, 4) and c["causal"] for c in calls)
    calls.clear()
    implementations.IokernelsTorch(device="cpu").setup(configs.Problem(1, 2, 10, 16, "float32"), "fwd").call()
    assert calls and all(c["documents"] is None for c in calls)


def test_ours_on_cupy_are_given_the_lengths_forward_and_backward(monkeypatch):
    """iokernels.attention and attention_backward get documents= the lengths (numpy standing in for cupy)."""
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
    problem = configs.Problem(1, 2, 10, 16, "float16", documents=(5, 5))
    implementations.IokernelsCupy().setup(problem, "bwd").call()
    assert forward and backward and all(c["documents"] == (5, 5) for c in forward + backward)


# ---------------------------------------------------------------------------------------------
# the command


class Fake(implementations.Impl):
    """Runs at ``tflops`` on the FLOPs it is given; refuses documents unless ``documents``."""

    def __init__(self, name, label, ours, tflops, documents=True):
        self.name, self.label, self.ours, self.tflops, self.documents = name, label, ours, tflops, documents

    def setup(self, problem, direction):
        if problem.masks_documents and not self.documents:
            raise Unsupported("no document mask")
        return clocks.Runner(call=lambda: None, clock=FakeClock(problem.flops(direction) / (self.tflops * 1e12)))


@pytest.fixture
def faked(monkeypatch):
    monkeypatch.setattr(suite, "free_device_memory", lambda: None)
    monkeypatch.setattr(suite, "environment", lambda impls: {"gpu": "Fake GPU", "date": "2026-01-01T00:00:00+00:00",
                                                          "cupy": "0", "commit": "abc", "torch": "9.9"})
    impls = [Fake("iokernels_torch", "io-torch", True, 200.0), Fake("torch_flex", "FLEX", False, 100.0),
             Fake("torch_flash", "FLASH", False, 300.0, documents=False)]
    monkeypatch.setattr(implementations, "make_impls", lambda names, sram=None: [i for i in impls if i.name in names])


def invoke(*args):
    return CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)


def test_the_command_records_the_documents(faked):
    result = invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--causal", "--documents", "3",
                    "--no-backward", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["header"]["documents"] == 3 and doc["header"]["window"] is None
    assert "--documents 3" in doc["header"]["command"] and "documents" in doc["header"]["flop_convention"]
    rows = {r["impl"]: r for r in doc["rows"]}
    assert all(r["documents"] == [341, 341, 342] and r["N"] == 1024 and r["batch"] == 16 for r in rows.values())
    # B 16, H 16, d 64; causal: 341·342/2 = 58311 twice and 342·343/2 = 58653
    assert all(r["flops"] == 4 * 16 * 16 * 64 * (58311 + 58311 + 58653) for r in rows.values())
    assert rows["iokernels_torch"]["status"] == rows["torch_flex"]["status"] == "ok"
    assert rows["torch_flash"]["status"] == "unsupported"
    assert "main d=64 N=1024 float16 B=16 H=16 causal documents=2x341+1x342" in result.stderr
    text = invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--documents", "3", "--no-backward")
    assert text.exit_code == 0 and "3 documents per sequence" in text.stdout


def test_without_documents_the_header_says_none(faked):
    doc = json.loads(invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--no-backward", "--json").stdout)
    assert doc["header"]["documents"] is None and all(r["documents"] is None for r in doc["rows"])
    assert all(r["status"] == "ok" for r in doc["rows"])


@pytest.mark.parametrize("args, message", [
    (["--documents", "0"], "--documents must be >= 1, got 0"),
    (["--documents", "-3"], "--documents must be >= 1, got -3"),
    (["--documents", "two"], "'two' is not a valid integer"),
    (["--N", "1024,4096", "--documents", "2048"], "--documents 2048 > N = 1024"),
    (["--documents", "4", "--window", "256,0"], "--documents and --window are two masks: pick one"),
    (["--documents", "4", "--long"], "--documents applies to the main table's TFLOP/s"),
    (["--documents", "4", "--long-only"], "--documents applies to the main table's TFLOP/s"),
    (["--documents", "4", "--overhead"], "--documents applies to the main table's TFLOP/s"),
    (["--decode", "--documents", "4"], "--documents do not apply"),
    (["--varlen", "--documents", "4"], "--documents do not apply"),
])
def test_bad_documents_are_one_line_exit_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------
# the dense reference and the computed tiles (issue #22's "TFLOP/s counted on the computed blocks")


def _pairs_with_a_visible_element(visible, br, bc):
    """The (query tile, key tile) pairs of br x bc tiles holding an element of the boolean matrix ``visible``."""
    n_q, n_k = visible.shape
    return sum(bool(visible[i:i + br, j:j + bc].any()) for i in range(0, n_q, br) for j in range(0, n_k, bc))


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("d", [64, 128])
def test_computed_elements_by_hand(direction, d):
    """A window's and documents' computed tiles against the element-by-element masks: every tile of the plan's tiles
    holding a visible element counts whole (documents: each document tiled on its own)."""
    from iokernels.plan import make_plan
    from iokernels.plan.varlen import make_documents_plan

    n, window, docs = 1000, (300, 0), (341, 341, 318)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    problem = configs.Problem(2, 3, n, d, "float16", window=window)
    plan = make_plan("flash", "fast", N_q=n, d=d, dtype="float16", sram=227 * 1024, batch=2, heads=3, window=window,
                     direction=direction)
    br, bc = plan.tile["Br"], plan.tile["Bc"]
    assert configs.computed_elements(problem, direction) == \
        6 * _pairs_with_a_visible_element((j <= i) & (j >= i - 300), br, bc) * br * bc
    for causal in (False, True):
        problem = configs.Problem(2, 3, n, d, "float16", documents=docs, causal=causal)
        plan = make_documents_plan(docs, d=d, dtype="float16", batch=2, heads=3, causal=causal, direction=direction)
        br, bc = plan.tile["Br"], plan.tile["Bc"]
        mine = [np.tril(np.ones((m, m), bool)) if causal else np.ones((m, m), bool) for m in docs]
        assert configs.computed_elements(problem, direction) == \
            6 * sum(_pairs_with_a_visible_element(v, br, bc) for v in mine) * br * bc
    # documents of one length: the call's dense plan on their batch (2 x 3 x 4 problems of 250 rows)
    for causal in (False, True):
        plan = make_plan("flash", "fast", N_q=250, d=d, dtype="float16", sram=227 * 1024, batch=24, causal=causal,
                         direction=direction)
        br, bc = plan.tile["Br"], plan.tile["Bc"]
        one = np.tril(np.ones((250, 250), bool)) if causal else np.ones((250, 250), bool)
        problem = configs.Problem(2, 3, n, d, "float16", documents=(250,) * 4, causal=causal)
        pairs = _pairs_with_a_visible_element(one, br, bc)
        assert configs.computed_elements(problem, direction) == 24 * pairs * br * bc
    assert configs.computed_elements(configs.Problem(2, 3, n, d, "float16"), direction) is None
    assert configs.computed_elements(configs.Problem(2, 3, n, d, "float16", documents=(n,)), direction) is None


class FakeDense(Fake):
    """The dense reference: ``tflops`` on the problem without its mask."""

    reference = True

    def workload(self, problem):
        return dataclasses.replace(problem, documents=None, window=None)

    def setup(self, problem, direction):
        return super().setup(self.workload(problem), direction)


@pytest.mark.parametrize("mask", [["--documents", "3"], ["--window", "256,0"]])
def test_the_dense_reference_on_the_computed_tiles(monkeypatch, faked, mask):
    """With io-dense in the run, the ratios carry /io-dense and a table of ours' TFLOP/s on its computed tiles over
    the dense path's, from the rows' counts: ours at 200 TFLOP/s on the visible elements, io-dense at 400."""
    impls = [Fake("iokernels_torch", "io-torch", True, 200.0), FakeDense("iokernels_torch_dense", "io-dense", True,
                                                                          400.0)]
    monkeypatch.setattr(implementations, "make_impls", lambda names, sram=None: [i for i in impls if i.name in names])
    args = ["--d", "64", "--N", "1024", "--dtype", "float16", "--no-backward", *mask]
    doc = json.loads(invoke(*args, "--json").stdout)
    rows = {r["impl"]: r for r in doc["rows"]}
    assert set(rows) == {"iokernels_torch", "iokernels_torch_dense"}  # the default ours of a masked run
    ours = rows["iokernels_torch"]
    problem = configs.Problem(16, 16, 1024, 64, "float16", documents=configs.document_lengths(1024, 3)) \
        if mask[0] == "--documents" else configs.Problem(16, 16, 1024, 64, "float16", window=(256, 0))
    assert ours["computed_flops"] == 4 * 64 * configs.computed_elements(problem, "fwd")
    assert rows["iokernels_torch_dense"]["computed_flops"] is None
    assert rows["iokernels_torch_dense"]["flops"] == 4 * 16 * 16 * 1024 * 1024 * 64
    (computed,) = doc["computed"]
    assert computed["ratio"] == pytest.approx(200.0 * ours["computed_flops"] / ours["flops"] / 400.0)
    assert computed["computed_over_visible"] > 1.0
    text = invoke(*args).stdout
    assert "on the computed tiles: ours' TFLOP/s counted on every tile its plan computes" in text
    assert f"{computed['ratio']:.2f}x" in text and "/io-dense" in text


def test_dense_without_a_mask_is_refused(faked):
    result = invoke("--d", "64", "--N", "1024", "--impls", "dense", "--documents", "1")
    assert result.exit_code == 2 and "--impls dense is the dense reference of a masked run" in result.stderr
