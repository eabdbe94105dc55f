"""``bench --block-sparse DENSITY`` (block-sparse attention, the paper's Algorithm 5, issue #22): the work counted (the
kept blocks' visible elements, worked out by hand on small grids), the masks the problems carry, FlexAttention's
``from_kv_blocks`` arguments of a small grid, which implementations take the mask and what they are given, the run's
JSON and text (the dense reference counted on its own work, a denominator of the ratios) and the command's refusals
(CPU only: no GPU, the timed implementations faked)."""

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
from iokernels.plan.masks import BlockMask

from .fakes import FakeClock


def _mask(rows, n, block=128):
    return BlockMask.from_array(np.array(rows, bool), n_q=n, n_k=n, block_q=block, block_k=block, label="test")


# ---------------------------------------------------------------------------------------------
# FLOPs


def test_a_two_by_two_grid_counts_its_kept_blocks_by_hand():
    bm = _mask([[1, 0], [1, 1]], 256)
    # three kept blocks of 128 x 128; causal: the two diagonal ones 128·129/2 = 8256 each, the one below whole
    assert configs.block_sparse_area(bm) == 3 * 16384
    assert configs.block_sparse_area(bm, causal=True) == 8256 + 16384 + 8256
    assert configs.block_areas(bm, causal=True).tolist() == [[8256, 0], [16384, 8256]]
    assert configs.block_areas(bm).tolist() == [[16384] * 2] * 2  # kept or not
    # the block above the diagonal computes nothing under the causal mask
    anti = _mask([[0, 1], [1, 0]], 256)
    assert configs.block_sparse_area(anti) == 2 * 16384 and configs.block_sparse_area(anti, causal=True) == 16384
    # 4·B·H·d per element, backward 2.5x: B 2, H 3, d 64
    assert configs.attention_flops(2, 3, 256, 256, 64, block_mask=bm) == 4 * 2 * 3 * 64 * 49152
    assert configs.attention_flops(2, 3, 256, 256, 64, causal=True, block_mask=bm, direction="bwd") == \
        2.5 * 4 * 2 * 3 * 64 * 32896


def test_a_ragged_grid_counts_the_clipped_blocks():
    # N 200 in blocks of 128: the last row and column of blocks are 72 long
    full = _mask([[1, 1], [1, 1]], 200)
    assert configs.block_areas(full).tolist() == [[16384, 128 * 72], [72 * 128, 72 * 72]]
    assert configs.block_sparse_area(full) == 200 * 200
    # causal: 128·129/2 = 8256, nothing above, 72 x 128 below, 72·73/2 = 2628; together N(N + 1)/2
    assert configs.block_areas(full, causal=True).tolist() == [[8256, 0], [9216, 2628]]
    assert configs.block_sparse_area(full, causal=True) == 200 * 201 // 2
    assert configs.block_sparse_area(_mask([[0, 1], [0, 1]], 200), causal=True) == 2628


@pytest.mark.parametrize("kind, density, causal", [("random", 0.25, False), ("random", 0.25, True),
                                                   ("local", 0.5, True), ("strided", 0.34, False)])
def test_the_count_is_the_element_mask_intersected_with_causal(kind, density, causal):
    from iokernels.plan.masks import pattern

    bm = pattern(kind, density, n_q=96, n_k=96, block_q=16, seed=3)
    visible = bm.element_mask() & (np.tri(96, dtype=bool) if causal else True)
    assert configs.block_sparse_area(bm, causal) == int(visible.sum())


def test_a_problem_carries_counts_and_labels_its_block_mask():
    bm = _mask([[1, 0], [1, 1]], 256)
    problem = configs.Problem(1, 16, 256, 64, "float16", causal=True, block_mask=bm)
    assert problem.flops("fwd") == 4 * 16 * 64 * 32896 and problem.flops("bwd") == 2.5 * problem.flops("fwd")
    assert problem.describe().endswith(" causal blocks=test")
    dense = dataclasses.replace(problem, block_mask=None)  # the dense reference: FlashAttention-2's halved N²
    assert dense.flops("fwd") == 4 * 16 * 256 * 256 * 64 / 2 and "blocks" not in dense.describe()
    assert "block-sparse" in configs.FLOP_CONVENTION
    with pytest.raises(ValueError, match="counted alone"):
        configs.attention_flops(1, 1, 256, 256, 64, block_mask=bm, window=(64, 0))
    with pytest.raises(ValueError, match="N_q=256, N_k=256"):
        configs.attention_flops(1, 1, 512, 512, 64, block_mask=bm)


def test_main_problems_make_one_mask_per_n():
    spec = configs.block_sparse_spec(0.25)
    assert spec == {"kind": "random", "density": 0.25, "seed": 0, "block_q": 128}
    problems = configs.main_problems([64, 128], [1024, 16384], ["float16", "bfloat16"], tokens=262144, causal=True,
                                     block_sparse=spec)
    masks = {}
    for p in problems:
        assert p.block_mask is masks.setdefault(p.n, p.block_mask) and p.causal  # shared by every d and dtype
    assert masks[16384].shape == (128, 128) and int(masks[16384].blocks.sum()) == 4096  # 25 % of 128²
    assert masks[16384].density == 0.25 and masks[1024].shape == (8, 8) and int(masks[1024].blocks.sum()) == 16
    assert masks[16384].label == "random(density=0.25, seed=0)"
    again = configs.main_problems([64], [16384], ["float16"], block_sparse=spec)[0].block_mask
    assert again == masks[16384]  # the seed fixes the blocks
    other = configs.main_problems([64], [16384], ["float16"], block_sparse=configs.block_sparse_spec(0.25, seed=1))
    assert other[0].block_mask.bits != masks[16384].bits
    assert all(p.block_mask is None for p in configs.main_problems([64], [1024], ["float16"]))


@pytest.mark.parametrize("args, message", [
    ((0.0,), "--block-sparse: block-sparse density must be in (0, 1], got 0.0"),
    ((1.5,), "--block-sparse: block-sparse density must be in (0, 1]"),
    ((0.5, "diagonal"), "--block-pattern: unknown pattern 'diagonal'; expected one of local, strided, random"),
    ((0.5, "random", -1), "--block-seed must be an int >= 0, got -1"),
])
def test_block_sparse_spec_refuses(args, message):
    with pytest.raises(ValueError) as info:
        configs.block_sparse_spec(*args)
    assert message in str(info.value)


# ---------------------------------------------------------------------------------------------
# FlexAttention's block mask


def test_flex_kv_blocks_of_a_three_by_three_grid():
    bm = _mask([[1, 0, 1], [0, 1, 1], [1, 1, 0]], 384)
    num, idx, full_num, full_idx = implementations.flex_kv_blocks(bm)
    # no causal mask: every kept block is full (no mask_mod), listed first in each row
    assert num.tolist() == [[[0, 0, 0]]] and full_num.tolist() == [[[2, 2, 2]]]
    assert full_idx.tolist() == [[[[0, 2, 1], [1, 2, 0], [0, 1, 2]]]]
    assert num.dtype == idx.dtype == np.int32 and idx.shape == (1, 1, 3, 3)
    num, idx, full_num, full_idx = implementations.flex_kv_blocks(bm, causal=True)
    # causal: (0, 0) and (1, 1) cut by the diagonal (partial), (0, 2) and (1, 2) above it (dropped), (2, 0) and
    # (2, 1) below it (full)
    assert num.tolist() == [[[1, 1, 0]]] and idx.tolist()[0][0][:2] == [[0, 1, 2], [1, 0, 2]]
    assert full_num.tolist() == [[[0, 0, 2]]] and full_idx.tolist()[0][0][2] == [0, 1, 2]


def test_flex_kv_blocks_of_a_ragged_grid_are_partial_at_the_end():
    # N 300: the last row and column of blocks are 44 long, partial (FlexAttention pads them), not full
    num, idx, full_num, full_idx = implementations.flex_kv_blocks(_mask([[1, 1, 1]] * 3, 300))
    assert full_num.tolist() == [[[2, 2, 0]]] and num.tolist() == [[[1, 1, 3]]]
    assert idx.tolist()[0][0][0] == [2, 0, 1] and full_idx.tolist()[0][0][0] == [0, 1, 2]


@pytest.mark.parametrize("causal", [False, True])
def test_flex_block_mask_is_our_blocks_and_the_causal_mask_mod(causal):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.nn.attention.flex_attention")
    bm = _mask([[1, 0, 1], [0, 1, 1], [1, 1, 0]], 384)
    problem = configs.Problem(1, 2, 384, 16, "float32", causal=causal, block_mask=bm)
    flex = implementations.flex_block_mask(problem, "cpu")
    assert flex.BLOCK_SIZE == (128, 128) and tuple(flex.seq_lengths) == (384, 384)
    want = [[1, 0, 0], [0, 1, 0], [1, 1, 0]] if causal else [[1, 0, 1], [0, 1, 1], [1, 1, 0]]
    assert flex.to_dense()[0, 0].tolist() == want  # the blocks computed: kept, with a visible element
    assert flex.full_kv_num_blocks[0, 0].tolist() == ([0, 0, 2] if causal else [2, 2, 2])
    # what compiled FlexAttention computes: the listed blocks, the mask_mod on the partial ones
    i, j = torch.arange(384)[:, None], torch.arange(384)[None, :]
    listed = torch.as_tensor(want, dtype=torch.bool).repeat_interleave(128, 0).repeat_interleave(128, 1)
    partial = torch.zeros(3, 3, dtype=torch.bool)
    for r in range(3):
        partial[r, flex.kv_indices[0, 0, r, :flex.kv_num_blocks[0, 0, r]]] = True
    partial = partial.repeat_interleave(128, 0).repeat_interleave(128, 1)
    computed = listed & (~partial | flex.mask_mod(torch.tensor(0), torch.tensor(0), i, j))
    ours = torch.as_tensor(bm.element_mask()) & ((j <= i) if causal else True)
    assert torch.equal(computed, ours) and int(computed.sum()) == configs.block_sparse_area(bm, causal)


def _record_flex(monkeypatch):
    calls = []

    def flex(q, k, v, **kwargs):
        calls.append(kwargs)
        return q.clone()

    monkeypatch.setattr(implementations, "_compiled_flex", lambda: flex)
    return calls


def test_flex_is_given_the_block_mask(monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("torch.nn.attention.flex_attention")
    calls = _record_flex(monkeypatch)
    bm = _mask([[1, 0], [1, 1]], 256)
    implementations.TorchFlex(device="cpu").setup(configs.Problem(1, 1, 256, 16, "float32", causal=True,
                                                                  block_mask=bm), "fwd").call()
    assert calls and all(c["score_mod"] is None for c in calls)
    assert calls[0]["block_mask"].to_dense()[0, 0].tolist() == [[1, 0], [1, 1]]
    assert calls[0]["block_mask"].kv_num_blocks[0, 0].tolist() == [1, 1]  # the diagonal blocks, partial


# ---------------------------------------------------------------------------------------------
# implementations


def test_the_peers_without_a_block_mask_refuse_it():
    problem = configs.Problem(1, 2, 256, 64, "float16", block_mask=_mask([[1, 0], [0, 1]], 256))
    with pytest.raises(Unsupported, match="cupy standard attention has no block mask"):  # before it needs cupy
        CupyStandard().setup(problem, "fwd")
    pytest.importorskip("torch.nn.attention")
    for name in implementations.TORCH_BACKENDS:
        with pytest.raises(Unsupported, match="scaled_dot_product_attention has no block-sparse mask"):
            TorchSdpa(name, device="cpu").setup(problem, "fwd")


def test_ours_are_given_the_block_mask_and_the_dense_reference_none(monkeypatch):
    pytest.importorskip("torch")
    import iokernels.torch as iotorch

    calls = []

    def attention(q, k, v, **kwargs):
        calls.append(kwargs)
        return q.clone()

    monkeypatch.setattr(iotorch, "attention", attention)
    bm = _mask([[1, 0], [1, 1]], 256)
    problem = configs.Problem(1, 2, 256, 16, "float32", causal=True, block_mask=bm)
    implementations.IokernelsTorch(device="cpu").setup(problem, "fwd").call()
    assert calls and all(c["block_mask"] is bm and c["causal"] for c in calls)
    calls.clear()
    dense = implementations.make_impls(["iokernels_torch_dense"])[0]
    dense.device = "cpu"
    assert dense.ours and dense.reference and dense.label == "io-dense"
    dense.setup(problem, "fwd").call()
    assert calls and all("block_mask" not in c and c["causal"] for c in calls)
    assert dense.workload(problem).block_mask is None and implementations.IokernelsTorch().workload(problem) is problem
    with pytest.raises(Unsupported, match="without a block mask it is io-torch"):
        dense.setup(configs.Problem(1, 2, 256, 16, "float32"), "fwd")
    calls.clear()  # without a block mask, ours are called as before (no block_mask argument)
    implementations.IokernelsTorch(device="cpu").setup(configs.Problem(1, 2, 256, 16, "float32"), "fwd").call()
    assert calls and all("block_mask" not in c for c in calls)


def test_ours_on_cupy_are_given_the_block_mask_forward_and_backward(monkeypatch):
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
    bm = _mask([[1, 0], [1, 1]], 256)
    implementations.IokernelsCupy().setup(configs.Problem(1, 2, 256, 16, "float16", block_mask=bm), "bwd").call()
    assert forward and backward and all(c["block_mask"] is bm for c in forward + backward)


# ---------------------------------------------------------------------------------------------
# the run and the command


class Fake(implementations.Impl):
    """Runs at ``tflops`` on the FLOPs of what it computes; refuses a block mask unless ``sparse``; ``dense``: the
    dense reference (its workload without the mask)."""

    def __init__(self, name, label, ours, tflops, sparse=True, dense=False):
        self.name, self.label, self.ours, self.tflops, self.sparse = name, label, ours, tflops, sparse
        self.reference = dense
        self.problems = []

    def workload(self, problem):
        return dataclasses.replace(problem, block_mask=None) if self.reference else problem

    def setup(self, problem, direction):
        self.problems.append(problem)
        if problem.block_mask is not None and not self.sparse:
            raise Unsupported("no block mask")
        work = self.workload(problem)
        return clocks.Runner(call=lambda: None, clock=FakeClock(work.flops(direction) / (self.tflops * 1e12)))


@pytest.fixture
def faked(monkeypatch):
    monkeypatch.setattr(suite, "free_device_memory", lambda: None)
    monkeypatch.setattr(suite, "environment", lambda impls: {"gpu": "Fake GPU", "date": "2026-01-01T00:00:00+00:00",
                                                          "cupy": "0", "commit": "abc", "torch": "9.9"})
    impls = [Fake("iokernels_torch", "io-torch", True, 270.0), Fake("iokernels_torch_dense", "io-dense", True, 300.0,
                                                                    dense=True),
             Fake("iokernels_cupy", "io-cupy", True, 100.0), Fake("torch_flex", "FLEX", False, 180.0),
             Fake("torch_flash", "FLASH", False, 300.0, sparse=False)]
    monkeypatch.setattr(implementations, "make_impls", lambda names, sram=None: [i for i in impls if i.name in names])
    return impls


def invoke(*args):
    return CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)


def test_the_command_runs_ours_sparse_and_dense_beside_the_peers(faked):
    result = invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--causal", "--block-sparse", "0.25",
                    "--no-backward", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["header"]["block_sparse"] == {"density": 0.25, "pattern": "random", "seed": 0, "block": 128}
    assert "--block-sparse 0.25" in doc["header"]["command"] and "block-sparse" in doc["header"]["flop_convention"]
    rows = {r["impl"]: r for r in doc["rows"]}
    # the default ours with --block-sparse: torch and its dense reference (not cupy)
    assert set(rows) == {"iokernels_torch", "iokernels_torch_dense", "torch_flex", "torch_flash"}
    bm = configs.main_problems([64], [1024], ["float16"], block_sparse=configs.block_sparse_spec(0.25))[0].block_mask
    sparse = 4 * 16 * 16 * 64 * configs.block_sparse_area(bm, causal=True)  # B 16, H 16, d 64
    assert rows["iokernels_torch"]["flops"] == rows["torch_flex"]["flops"] == sparse
    assert rows["iokernels_torch_dense"]["flops"] == 4 * 16 * 16 * 1024 * 1024 * 64 / 2  # the dense count
    assert rows["iokernels_torch"]["block_mask"]["density"] == 0.25 and rows["iokernels_torch_dense"]["block_mask"] \
        is None
    assert rows["iokernels_torch_dense"]["reference"] and not rows["iokernels_torch"]["reference"]
    assert rows["torch_flash"]["status"] == "unsupported"
    assert all(rows[n]["status"] == "ok" for n in ("iokernels_torch", "iokernels_torch_dense", "torch_flex"))
    assert rows["iokernels_torch"]["tflops"] == pytest.approx(270.0)
    assert rows["iokernels_torch_dense"]["tflops"] == pytest.approx(300.0)
    ratios = {(r["impl"], r["peer"]): r["ratio"] for r in doc["ratios"]}
    # the dense reference a denominator, never a numerator; "strongest" among the peers only
    assert ratios[("iokernels_torch", "iokernels_torch_dense")] == pytest.approx(0.9)
    assert ratios[("iokernels_torch", "torch_flex")] == pytest.approx(1.5)
    assert ratios[("iokernels_torch", "strongest")] == pytest.approx(1.5)
    assert not any(impl == "iokernels_torch_dense" for impl, _ in ratios)
    assert "main d=64 N=1024 float16 B=16 H=16 causal blocks=random(density=0.25, seed=0)" in result.stderr
    text = invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--causal", "--block-sparse", "0.25",
                  "--no-backward").stdout
    assert "block-sparse: random 128x128 blocks at density 0.25, seed 0 (kept per N: 1024 0.250)" in text
    assert "kept blocks' visible elements (causal: on or below the diagonal) for io-torch, FLEX" in text
    assert "on the dense count (4*B*H*N^2*d, halved) for io-dense" in text
    assert "/io-dense: our TFLOP/s (a block mask: on its kept blocks; a window or documents: on the visible" in text
    assert "io-torch / io-dense fwd call: 0.90x" in text


def test_the_patterns_and_explicit_impls(faked):
    result = invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--block-sparse", "0.5", "--block-pattern",
                    "local", "--impls", "torch,cupy", "--peers", "flex", "--no-backward", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["header"]["block_sparse"]["pattern"] == "local"
    assert {r["impl"] for r in doc["rows"]} == {"iokernels_torch", "iokernels_cupy", "torch_flex"}
    assert all(p.block_mask.label == "local(density=0.5)" for i in faked for p in i.problems)
    # local at 0.5 on 8 x 8 blocks: 4 key blocks per row, none cut (not causal)
    assert all(r["flops"] == 4 * 16 * 16 * 64 * 8 * 4 * 128 * 128 for r in doc["rows"])
    seeded = json.loads(invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--block-sparse", "0.25",
                               "--block-seed", "7", "--impls", "all", "--peers", "none", "--no-backward",
                               "--json").stdout)
    assert seeded["header"]["block_sparse"]["seed"] == 7 and "--block-seed 7" in seeded["header"]["command"]
    assert {"iokernels_torch", "iokernels_torch_dense", "iokernels_cupy"} <= {r["impl"] for r in seeded["rows"]}


def test_without_block_sparse_the_header_says_none_and_dense_is_refused(faked):
    doc = json.loads(invoke("--d", "64", "--N", "1024", "--dtype", "float16", "--impls", "all", "--no-backward",
                            "--json").stdout)
    assert doc["header"]["block_sparse"] is None and all(r["block_mask"] is None for r in doc["rows"])
    assert "iokernels_torch_dense" not in {r["impl"] for r in doc["rows"]}  # "all" without --block-sparse


@pytest.mark.parametrize("args, message", [
    (["--block-sparse", "0"], "--block-sparse: block-sparse density must be in (0, 1], got 0.0"),
    (["--block-sparse", "1.5"], "--block-sparse: block-sparse density must be in (0, 1], got 1.5"),
    (["--block-sparse", "quarter"], "'quarter' is not a valid float"),
    (["--block-sparse", "0.25", "--block-pattern", "diagonal"], "--block-pattern: unknown pattern 'diagonal'"),
    (["--block-sparse", "0.25", "--block-seed", "-1"], "--block-seed must be an int >= 0, got -1"),
    (["--block-sparse", "0.25", "--block-pattern", "local", "--block-seed", "3"],
     "--block-seed applies to --block-pattern random only"),
    (["--block-pattern", "local"], "--block-pattern needs --block-sparse DENSITY"),
    (["--block-seed", "3"], "--block-seed needs --block-sparse DENSITY"),
    (["--impls", "dense"], "--impls dense is the dense reference of a masked run: it needs --block-sparse"),
    (["--block-sparse", "0.25", "--documents", "4"], "--block-sparse and --documents: two masks; pick one"),
    (["--block-sparse", "0.25", "--window", "256,0"], "--block-sparse and --window: two masks; pick one"),
    (["--block-sparse", "0.25", "--softcap", "30"], "--block-sparse and --softcap"),
    (["--block-sparse", "0.25", "--dropout", "0.1"], "--block-sparse and --dropout"),
    (["--block-sparse", "0.25", "--long"], "--block-sparse applies to the main table's TFLOP/s"),
    (["--block-sparse", "0.25", "--long-only"], "--block-sparse applies to the main table's TFLOP/s"),
    (["--block-sparse", "0.25", "--overhead"], "--block-sparse applies to the main table's TFLOP/s"),
    (["--decode", "--block-sparse", "0.25"], "--block-sparse do not apply"),
    (["--varlen", "--block-sparse", "0.25"], "--block-sparse do not apply"),
    (["--varlen", "--block-pattern", "local"], "--block-pattern do not apply"),
])
def test_bad_block_sparse_options_are_one_line_exit_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr
