"""Programmable variants on the CPU (issue #22, iokernels.plan.mods): the checks of check_mods (bad expressions with
their column, captures, the derivative), the plans with_mods makes and refuses, the simulator's bytes against
model.exact (captured reads included) and its outputs against the float64 reference, the expressions against the
built-in variants in the reference, mod_block_mask against a brute-force classification, and the expressions through
NVRTC (check_source)."""

from __future__ import annotations

import numpy as np
import pytest

from iokernels.kernels import launch
from iokernels.model.hbm import exact
from iokernels.plan import Unsupported, make_plan
from iokernels.plan.cexpr import ExprError
from iokernels.plan.mods import MAX_CAPTURES, block_levels, capture_buffer, check_mods, mask_layout, mod_block_mask
from iokernels.simulate import make_inputs, reference, reference_outputs, simulate

from ..kernels.nvrtc_variants import needs_nvrtc

KB = 1024
DOC = np.repeat(np.arange(3, dtype=np.int32), 100)[:289]
SLOPES = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)


def _plan(direction="fwd", n_q=289, n_k=289, d=64, captures=None, **kw):
    return make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * KB, heads=4, kv_heads=2,
                     direction=direction, capture_values=captures, **kw)


def test_check_mods_refuses_bad_input():
    assert check_mods() is None
    with pytest.raises(TypeError, match="mask_mod must be a C expression"):
        check_mods(mask_mod="  ")
    with pytest.raises(ValueError, match="give score_mod too"):
        check_mods(mask_mod="q_idx >= kv_idx", score_grad="1.0f")
    with pytest.raises(ExprError, match="column 1: unknown name 'qidx'") as err:
        check_mods(mask_mod="qidx >= kv_idx")
    assert err.value.column == 1
    with pytest.raises(ExprError, match=r"mask_mod: column 17: missing '\)' to close the '\(' at column 10"):
        check_mods(mask_mod="q_idx >= (kv_idx")
    with pytest.raises(ValueError, match="identifier other than"):
        check_mods(mask_mod="q_idx >= kv_idx", captures={"q_idx": DOC})
    with pytest.raises(TypeError, match="1-d array of int32"):
        check_mods(mask_mod="doc[q_idx] > 0", captures={"doc": DOC.astype(np.float64)})
    with pytest.raises(ValueError, match=f"at most {MAX_CAPTURES}"):
        check_mods(mask_mod="t1[0] > 0", captures={f"t{i}": DOC for i in range(5)})
    with pytest.raises(ValueError, match="not derived for this form"):
        check_mods(score_mod="floorf(score)")


def test_the_derivative_is_derived_and_left_out_where_it_is_one():
    bias = check_mods(score_mod="score - slopes[h] * abs(q_idx - kv_idx)", captures={"slopes": SLOPES})
    assert bias.score_grad is None and "SCORE_GRAD" not in dict(_plan("bwd", mods=bias, captures={"slopes": SLOPES})
                                                                .stage("main").params)
    cap = check_mods(score_mod="30.0f * tanhf(score / 30.0f)")
    assert "tanhf" in cap.score_grad
    assert check_mods(score_mod="bias[kv_idx]", captures={"bias": SLOPES}).score_grad == "0.0f"  # score dropped


def test_with_mods_refusals():
    mods = check_mods(mask_mod="kv_idx <= q_idx")
    with pytest.raises(Unsupported, match="score_mod and mask_mod run on the sm_90 tma kernels"):
        make_plan("flash", "q_outer", N_q=256, d=64, dtype="float16", sram=227 * KB, mods=mods)
    with pytest.raises(Unsupported, match="d=160"):
        _plan(d=160, mods=mods)
    with pytest.raises(Unsupported, match="without a softcap"):
        _plan(mods=mods, softcap=30.0)
    plan = _plan(mods=mods)
    assert plan.mods.capture_bytes == 0 and dict(plan.stage("main").params)["MASK_MOD"] == "kv_idx <= q_idx"
    docs = check_mods(mask_mod="doc[q_idx] == doc[kv_idx]", captures={"doc": DOC})
    with pytest.raises(ValueError, match="captured arrays' values are not known"):
        exact(_plan(mods=docs))


VARIANTS = {
    "docs_alibi": (dict(mask_mod="doc[q_idx] == doc[kv_idx]", score_mod="score - slopes[h] * abs(q_idx - kv_idx)"),
                   {"doc": DOC, "slopes": SLOPES}, {"causal": "bottom_right"}),
    "softcap": (dict(score_mod="30.0f * tanhf(score / 30.0f)"), {}, {}),
    "band": (dict(mask_mod="kv_idx <= q_idx && q_idx - kv_idx < 150"), {}, {}),
    "band_blocks": (dict(mask_mod="kv_idx <= q_idx && q_idx - kv_idx < 150"), {}, {"blocks": True}),
    "prefix_rect": (dict(mask_mod="kv_idx < 20 || kv_idx <= q_idx + (n_k - n_q)",
                         score_mod="score * 0.5f + bias[kv_idx]"), {"bias": np.linspace(-1, 1, 700, dtype=np.float32)},
                    {"n_q": 113, "n_k": 700, "causal": "top_left"}),
    # an explicit mask's forms with 16-byte rows: read through shared memory in the forward (MOD_STAGE)
    "staged_bias": (dict(score_mod="score + mask[h * 85544 + q_idx * 296 + kv_idx]"),
                    {"mask": np.random.default_rng(1).standard_normal(4 * 289 * 296).astype(np.float16)}, {}),
    "staged_bool": (dict(mask_mod="mask[q_idx * 304 + kv_idx] != 0"),
                    {"mask": (np.random.default_rng(2).random(289 * 304) < 0.7).astype(np.uint8)},
                    {"causal": "bottom_right"}),
}


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_simulator_matches_model_and_reference(name, direction):
    exprs, captures, extra = VARIANTS[name]
    extra = dict(extra)
    mods = check_mods(**exprs, captures=captures)
    n_q, n_k = extra.pop("n_q", 289), extra.pop("n_k", 289)
    if extra.pop("blocks", False):
        extra["block_mask"] = mod_block_mask(mods, captures, n_q, n_k)
    plan = _plan(direction, n_q, n_k, mods=mods, captures=captures, **extra)
    inputs = make_inputs(plan, seed=3, captures=captures)
    run = simulate(plan, inputs)
    assert run.counts == exact(plan)
    assert (run.counts["main"].get("captures", (0, 0))[0] > 0) == bool(captures)
    want = reference_outputs(plan, inputs)
    for n, w in want.items():
        assert np.all(np.isfinite(run.outputs[n]))
        assert np.max(np.abs(run.outputs[n] - w)) < 1e-12 * max(1, np.abs(w).max())


def test_full_blocks_skip_the_mask():
    """A block mask made from a mask_mod that reads a capture: its full blocks read none, its empty ones are skipped,
    so the captured bytes fall; every element of a partial tile (B_r x B_c, past the end too) reads two ints."""
    mods = check_mods(mask_mod="doc[q_idx] == doc[kv_idx]", captures={"doc": DOC})
    plain = _plan(mods=mods, captures={"doc": DOC}, n_q=289, n_k=289)
    blocks = mod_block_mask(mods, {"doc": DOC}, 289, 289)
    sparse = _plan(mods=mods, captures={"doc": DOC}, block_mask=blocks)
    tiles = -(-289 // 128)
    assert plain.tile["Br"] == plain.tile["Bc"] == 128
    assert plain.mods.capture_bytes == 2 * 4 * (128 * tiles) ** 2 * plain.bh
    partial = int((sparse.block_grid() == 1).sum())
    assert 0 < partial < tiles * tiles
    assert sparse.mods.capture_bytes == 2 * 4 * 128 * 128 * partial * sparse.bh < plain.mods.capture_bytes
    assert {"BLOCK_SPARSE", "MASK_MOD"} <= set(dict(sparse.stage("main").params))


def test_block_levels_count_the_tables_reads():
    """A document mask's block levels read the table twice per element inside the problem (8 bytes of int32)."""
    n_q, n_k = 300, 289
    table = np.repeat(np.arange(3, dtype=np.int32), 100)
    mods = check_mods(mask_mod="doc[q_idx] == doc[kv_idx]", captures={"doc": table})
    levels, reads = block_levels(mods, {"doc": table}, n_q, n_k, 128)
    assert reads == 8 * n_q * n_k and levels.shape == (3, 3)
    assert np.array_equal(levels, mod_block_mask(mods, {"doc": table}, n_q, n_k).levels)


def test_mod_block_mask_classifies_blocks():
    mods = check_mods(mask_mod="kv_idx <= q_idx && q_idx - kv_idx < 300")
    n = 1000
    got = mod_block_mask(mods, {}, n, n, block=128).levels
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    keep = (j <= i) & (i - j < 300)
    for r in range(got.shape[0]):
        for c in range(got.shape[1]):
            tile = keep[128 * r:128 * (r + 1), 128 * c:128 * (c + 1)]
            assert got[r, c] == (2 if tile.all() else 1 if tile.any() else 0)
    assert {0, 1, 2} == set(np.unique(got))


BUILT_INS = [  # (expressions, captures, the built-in's make_plan arguments)
    (dict(mask_mod="kv_idx <= q_idx + (n_k - n_q)"), {}, {"causal": "bottom_right"}),
    (dict(score_mod="30.0f * tanhf(score / 30.0f)"), {}, {"softcap": 30.0}),
    (dict(score_mod="score - slopes[h] * abs(kv_idx - q_idx - (n_k - n_q))"), {"slopes": SLOPES},
     {"alibi": tuple(SLOPES.tolist())}),
]


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("case", range(len(BUILT_INS)))
def test_expressions_give_the_built_ins(case, direction):
    exprs, captures, args = BUILT_INS[case]
    mine = _plan(direction, 300, 260, mods=check_mods(**exprs, captures=captures), captures=captures)
    inputs = make_inputs(mine, seed=5, captures=captures)
    a, b = reference_outputs(mine, inputs), reference_outputs(_plan(direction, 300, 260, **args), inputs)
    for n in a:
        assert np.max(np.abs(a[n] - b[n])) < 1e-12 * max(1.0, np.abs(b[n]).max()), n


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_a_document_table_gives_the_documents_mask(direction):
    doc = np.repeat(np.arange(4, dtype=np.int32), 75)
    mine = _plan(direction, 300, 300, mods=check_mods(mask_mod="doc[q_idx] == doc[kv_idx]", captures={"doc": doc}),
                 captures={"doc": doc})
    inputs = make_inputs(mine, seed=6, captures={"doc": doc})
    kv = np.arange(mine.bh) // 2
    vis = doc[:, None] == doc[None, :]
    q, k, v = inputs["Q"], inputs["K"][kv], inputs["V"][kv]
    if direction == "fwd":
        want = {"O": reference.forward(q, k, v, mask=vis)[0]}
    else:
        dq, dk, dv = reference.backward(q, k, v, inputs["dO"], mask=vis)
        want = {"dQ": dq, "dK": dk.reshape(mine.bh_kv, 2, 300, 64).sum(axis=1),
                "dV": dv.reshape(mine.bh_kv, 2, 300, 64).sum(axis=1)}
    got = reference_outputs(mine, inputs)
    for n in want:
        assert np.max(np.abs(got[n] - want[n])) < 1e-12 * max(1.0, np.abs(want[n]).max()), n


@needs_nvrtc
def test_check_source_compiles_and_names_a_bad_expression():
    from iokernels.kernels.nvrtc import KernelCompileError, compile_to_cubin

    mods = check_mods(mask_mod="doc[q_idx] == doc[kv_idx]", score_mod="score * 2.0f - slopes[h]",
                      captures={"doc": DOC, "slopes": SLOPES})
    assert compile_to_cubin(mods.check_source(), arch="sm_90").cubin
    bad = check_mods(mask_mod="kv_idx <= q_idx", score_mod="score % 2", score_grad="1.0f")  # parses; NVRTC refuses
    with pytest.raises(KernelCompileError) as err:
        compile_to_cubin(bad.check_source(), arch="sm_90")
    assert "score_mod(1)" in err.value.log


FUZZ_TABLE = np.random.default_rng(7).integers(0, 4, 2048).astype(np.int32)
FUZZ_BIAS = np.random.default_rng(8).standard_normal(2048).astype(np.float16)


def random_mods(rng: np.random.Generator) -> tuple[dict, dict]:
    """A random variant (expressions, captures): a mask_mod of comparisons on the indices and a captured table joined
    by && / ||, and a score_mod of smooth pieces (scaled score, tanh cap, bias by position or from a float16 table,
    a ternary on the indices) whose derivative iokernels.plan.cderiv derives. Used by the CPU test below and by
    tests/gpu/test_mods.py."""
    masks = ["kv_idx <= q_idx", f"q_idx % {rng.integers(2, 5)} != {rng.integers(0, 2)}",
             f"abs(q_idx - kv_idx) < {rng.integers(20, 200)}", "tab[q_idx] == tab[kv_idx]",
             f"kv_idx < {rng.integers(5, 60)}", "tab[kv_idx] != 3"]
    picked = rng.choice(len(masks), size=rng.integers(1, 4), replace=False)
    mask = masks[picked[0]]
    for i in picked[1:]:
        mask = f"({mask}) {'&&' if rng.random() < 0.5 else '||'} {masks[i]}"
    pieces = [f"score * {rng.uniform(0.5, 1.5):.3f}f",
              f"{rng.uniform(5, 30):.2f}f * tanhf(score * {rng.uniform(0.03, 0.2):.3f}f)",
              f"score - {rng.uniform(0.001, 0.05):.4f}f * fabsf((float)(q_idx - kv_idx))", "score + bias[kv_idx]",
              f"(q_idx > kv_idx ? score : score * {rng.uniform(0.3, 0.9):.2f}f)"]
    score = pieces[rng.integers(len(pieces))]
    if rng.random() < 0.5:  # a second piece on top: its score is the first's
        second = pieces[rng.integers(len(pieces))]
        score = second.replace("score", f"({score})")
    exprs = {"mask_mod": mask, "score_mod": score}
    captures = {n: a for n, a in (("tab", FUZZ_TABLE), ("bias", FUZZ_BIAS)) if f"{n}[" in mask + score}
    return exprs, captures


@pytest.mark.parametrize("seed", range(6))
def test_fuzzed_expressions_simulate_as_the_model_and_reference(seed):
    """Random variants (:func:`random_mods`), forward and backward, ragged N_q != N_k: the simulator's bytes equal
    model.exact (captured reads included) and its outputs the float64 reference; the derivative was derived."""
    rng = np.random.default_rng(seed)
    exprs, captures = random_mods(rng)
    mods = check_mods(**exprs, captures=captures)
    for direction in ("fwd", "bwd"):
        plan = _plan(direction, 150, 170, mods=mods, captures=captures)
        inputs = make_inputs(plan, seed=seed, captures=captures)
        run = simulate(plan, inputs)
        assert run.counts == exact(plan), exprs
        for n, w in reference_outputs(plan, inputs).items():
            assert np.all(np.isfinite(run.outputs[n])), (exprs, n)
            assert np.max(np.abs(run.outputs[n] - w)) < 1e-12 * max(1, np.abs(w).max()), (exprs, n)


@pytest.mark.parametrize("mask_mod, score_mod, ctype, want", [
    (None, "score + mask[q_idx * 64 + kv_idx]", np.float16, (0, "__half", "q_idx * 64 + kv_idx")),
    (None, "  score+mask[h * (n_k + 1)] ", np.float32, (0, "float", "h * (n_k + 1)")),
    ("mask[(q_idx * 64) + kv_idx] != 0", None, np.uint8, (0, "unsigned char", "(q_idx * 64) + kv_idx")),
    ("mask[kv_idx]", "score * 2.0f", np.uint8, (0, "unsigned char", "kv_idx")),
    ("kv_idx <= q_idx", "score + mask[kv_idx]", np.float16, None),  # the mask_mod reads first: nothing to fetch
    (None, "mask[kv_idx] + score", np.float16, None),
    (None, "score + mask[kv_idx] + 1.0f", np.float16, None),
    (None, "score * mask[kv_idx]", np.float16, None),
    ("mask[kv_idx] == 1", None, np.uint8, None),
])
def test_the_forward_prefetches_an_explicit_masks_read(mask_mod, score_mod, ctype, want):
    """Mods.prefetch finds the read of a mask_mod X[i] != 0 (or X[i]), else of a score_mod score + X[i]: the forward's
    MOD_PREFETCH (the L2 a tile ahead) beside the expressions, whose launch takes the captures; not the backward's."""
    mods = check_mods(mask_mod, score_mod, captures={"mask": np.zeros(64 * 64, ctype)},
                      **({"score_grad": "2.0f"} if score_mod == "score * 2.0f" else {}))
    assert mods.prefetch() == want
    fwd, bwd = dict(mods.defines("fwd")), dict(mods.defines("bwd"))
    assert ("MOD_PREFETCH" in fwd) == (want is not None) and "MOD_PREFETCH" not in bwd
    if want is not None:
        assert (fwd["MOD_PREFETCH"], fwd["MOD_PREFETCH_SLOT"], fwd["MOD_PREFETCH_T"]) == (want[2], "0", want[1])
    plan = make_plan("flash", "fast", N_q=64, d=64, dtype="float16", sram=227 * 1024, heads=2, mods=mods)
    args, _ = launch.stage_arg_layout(plan, plan.stage("main"), 0.125)
    assert capture_buffer("mask") in args


@pytest.mark.parametrize("mask_mod, score_mod, ctype, staged", [
    (None, "score + mask[h * 85544 + q_idx * 296 + kv_idx]", np.float16,
     ("h * 85544 + q_idx * 296", "__half", "1", "MASK0")),
    ("mask[q_idx * 304 + kv_idx] != 0", None, np.uint8, ("q_idx * 304", "unsigned char", "2", "MASK0")),
    (None, "score + mask[q_idx * 296 + kv_idx]", np.float32, ("q_idx * 296", "float", "1", "STAGE")),  # d 128
    (None, "score + mask[(q_idx / 2) * 304 + kv_idx]", np.float16, ("(q_idx / 2) * 304", "__half", "1", "STAGE")),
    (None, "score + mask[q_idx * 297 + kv_idx]", np.float16, None),  # rows not 16-byte aligned: prefetched instead
    (None, "score + mask[kv_idx * 289 + q_idx]", np.float16, None),  # not contiguous along the keys
    ("mask[q_idx * 304 + kv_idx] != 0", "score + 1.0f", np.uint8, None),  # two expressions
])
def test_an_explicit_masks_read_is_staged_in_the_forward(mask_mod, score_mod, ctype, staged):
    """plan.mods.staging: the forward's MOD_STAGE in place of the expression (its launch takes the captures), loaded
    by the copy engine into two stages (MOD_TMA, MASK0 / MASK1) where its map exists and they fit, else by cp.async
    (STAGE: a float32 mask at d 128, a row offset that is not affine); the staged bytes every element of a computed
    tile inside (N_q, N_k) once, by hand; the backward keeps the expression."""
    mods = check_mods(mask_mod, score_mod, captures={"mask": np.zeros(4 * 289 * 304, ctype)})
    values = {"mask": np.ones(4 * 289 * 304, ctype)}
    d = 128 if ctype == np.float32 else 64
    plan = _plan("fwd", mods=mods, captures=values, d=d)
    main = dict(plan.stage("main").params)
    buffers = dict((n, (o, size)) for n, o, size in plan.stage("main").smem)
    got = (main["MOD_STAGE"], main["MOD_STAGE_T"], main["MOD_STAGE_FORM"], "MASK0" if "MASK0" in buffers else
           "STAGE" if "STAGE" in buffers else "?") if "MOD_STAGE" in main else None
    assert got == staged
    if staged is not None:
        assert "SCORE_MOD" not in main and "MASK_MOD" not in main
        assert ("MOD_TMA" in main) == (staged[3] == "MASK0") == ("STAGE" not in buffers)
        if "MOD_TMA" in main:  # two stages of B_r x B_c elements, 1024-byte aligned, past the plan's other buffers
            tile = plan.tile["Br"] * plan.tile["Bc"] * np.dtype(ctype).itemsize
            assert buffers["MASK0"][1] == buffers["MASK1"][1] == tile and buffers["MASK0"][0] % 1024 == 0
            assert buffers["MASK1"][0] == buffers["MASK0"][0] + tile
            assert all(o + size <= buffers["MASK0"][0] for n, (o, size) in buffers.items() if n[:4] != "MASK")
            assert plan.stage("main").smem_bytes <= 227 * KB - 1024
        assert exact(plan)["main"]["captures"] == (plan.bh * 289 * 289 * np.dtype(ctype).itemsize, 0)
        args, _ = launch.stage_arg_layout(plan, plan.stage("main"), 0.125)
        assert capture_buffer("mask") in args
        maps = [a for a in args if getattr(a, "layout", None) is not None]
        assert [m.buffer for m in maps] == ([capture_buffer("mask")] if "MOD_TMA" in main else [])
    bwd = dict(_plan("bwd", mods=mods, captures=values).stage("main").params)
    assert "MOD_STAGE" not in bwd


@pytest.mark.parametrize("row, want", [
    # (B, H, N_q, N_k) contiguous: every dim stepped
    ("(b * 4 + h) * 289 * 304 + q_idx * 304", ((289, 289, 4, 2), (608, 608 * 289, 608 * 289 * 4))),
    ("h * 289 * 304 + q_idx * 304", ((289, 289, 4, 1), (608, 608 * 289, 608 * 289 * 4))),  # per head, any batch
    ("b * 289 * 304 + q_idx * 304", ((289, 289, 1, 2), (608, 608 * 289, 608 * 289))),  # per batch, any head
    ("q_idx * 304", ((289, 289, 1, 1), (608, 608 * 289, 608 * 289))),  # shared: dims of 1 take the packed strides
    ("h * 1024 + q_idx * 4096", ((289, 289, 4, 1), (8192, 2048, 2048 * 4))),  # heads interleaved within a row
    ("q_idx * 304 + 8", None),  # an offset: the map's base would move
    ("q_idx * 256", None),  # rows that overlap (256 < N_k 289): staged by cp.async
    ("(q_idx / 2) * 304", None),  # not affine
    ("(q_idx % 3) * 304 + h * 8", None),
])
def test_mask_layout_states_the_masks_map(row, want):
    """plan.mods.mask_layout: the staged read R = s_b b + s_h h + s_q q_idx as the tensor map {n_k, n_q, heads, batch}
    (strides in bytes, a dim R does not step of 1), boxes of 128 bytes x B_r rows, by hand; None where R is not that."""
    plan = make_plan("flash", "fast", N_q=289, d=64, dtype="float16", sram=227 * KB, heads=4, batch=2)
    got = mask_layout(plan, row, "__half")
    assert (None if got is None else got[:2]) == want
    if got is not None:
        assert got[2:] == ((64, plan.tile["Br"], 1, 1), "float16")
    assert mask_layout(plan, "q_idx * 304", "unsigned char")[2:] == ((128, plan.tile["Br"], 1, 1), "uint8")
