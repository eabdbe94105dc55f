"""Programmable variants on the GPU (issue #22; MASK_MOD / SCORE_MOD / SCORE_GRAD on flash_tma.cu and
flash_tma_bwd.cu): counters == model.exact (the captured arrays' reads included), O and the gradients within
flash-attention's same-precision tolerance of the float64 reference with the user's expressions, for document masks
read from a captured table, ALiBi and a bias read from captured floats, a softcap with its derivative, prefix-LM and a
sliding band, with causal, grouped-query attention, ragged N, N_q ≠ N_k, a block mask made from the mask_mod (its full
blocks skip it); the plain build agrees with the counting one; the expressions give the built-ins' outputs (causal,
softcap, ALiBi); ``iokernels.attention_mods`` / ``attention_mods_backward`` and ``create_block_mask``.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_mods.py`` (skips without an sm_90 device).
"""

import zlib

import numpy as np
import pytest

import iokernels
from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.mods import capture_buffer, check_mods, mod_block_mask
from iokernels.plan.units import round_to
from iokernels.simulate import kv_rows, reference, reference_outputs
from iokernels.simulate.mods import reference_mods

from .helpers import assert_within_naive, group_sum, ulp

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.usefixtures("sm90")
KB = 1024
GRADS = ("dQ", "dK", "dV")
SLOPES = np.array([2.0 ** (-8 * (h + 1) / 4) for h in range(4)], dtype=np.float32)


def _docs(n: int, parts: int = 5) -> np.ndarray:
    return np.minimum(np.arange(n) * parts // n, parts - 1).astype(np.int32)


def _variant(name: str, n_k: int):
    """(mods, captures) of a named variant over n_k keys."""
    if name == "docs_alibi":
        return check_mods(mask_mod="doc[q_idx] == doc[kv_idx]", score_mod="score - slopes[h] * abs(q_idx - kv_idx)",
                          captures={"doc": _docs(n_k), "slopes": SLOPES}), {"doc": _docs(n_k), "slopes": SLOPES}
    if name == "softcap":
        return check_mods(score_mod="20.0f * tanhf(score / 20.0f)",
                          score_grad="1.0f - tanhf(score / 20.0f) * tanhf(score / 20.0f)"), {}
    if name == "prefix":
        return check_mods(mask_mod="kv_idx < 100 || kv_idx <= q_idx + (n_k - n_q)"), {}
    if name == "band":
        return check_mods(mask_mod="kv_idx <= q_idx && q_idx - kv_idx < 300"), {}
    bias = np.random.default_rng(n_k).standard_normal(n_k).astype(np.float16)  # (a __half capture)
    return check_mods(score_mod="score * 1.5f + bias[kv_idx]", score_grad="1.5f", captures={"bias": bias}), \
        {"bias": bias}


# (N_q, N_k, d, dtype, batch, heads, kv_heads, causal, variant, block mask from the mask_mod)
CASES = [
    (1000, 1000, 64, "float16", 2, 4, 2, "bottom_right", "docs_alibi", False),
    (4097, 4097, 128, "bfloat16", 1, 1, 1, "bottom_right", "softcap", False),
    (113, 1000, 96, "bfloat16", 1, 2, 2, "", "prefix", False),
    (1000, 1000, 128, "float16", 1, 2, 1, "", "band", True),
    (239, 517, 64, "float16", 2, 2, 2, "top_left", "bias", False),
]
IDS = ["-".join(map(str, c)).replace(" ", "") for c in CASES]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _plan(case, direction):
    n_q, n_k, d, dtype, batch, heads, kv_heads, causal, name, sparse = case
    mods, captures = _variant(name, n_k)
    block_mask = mod_block_mask(mods, captures, n_q, n_k) if sparse else None
    plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=227 * KB, batch=batch, heads=heads,
                     kv_heads=kv_heads, causal=causal, block_mask=block_mask, mods=mods, capture_values=captures,
                     direction=direction)
    return plan, captures


def _naive(plan, host, scale):
    """The same-precision yardstick: S rounded to the dtype, the variant applied, P rounded; (P, d score_mod)."""
    kv = kv_rows(plan)
    s = round_to(scale * (host["Q"] @ np.swapaxes(host["K"][kv], -1, -2)), plan.dtype)
    s, grad = reference_mods(plan, host)(s)
    vis = plan.visible(np.arange(plan.N_q), np.arange(plan.N_k))
    if vis is not None:
        s = np.where(vis, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    l = e.sum(axis=-1, keepdims=True)
    return round_to(np.where(l > 0, e / np.where(l > 0, l, 1.0), 0.0), plan.dtype), grad


def _run_both(plan, inputs, names):
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    got = {n: launch.to_float64(run.buffers[n], plan.dtype) for n in names}
    plain = launch.run_plan(plan, inputs, counting=False)
    for n in names:  # the same kernel less its counters: equal, or one ulp apart
        other = launch.to_float64(plain.buffers[n], plan.dtype)
        assert np.max(np.abs(other - got[n]), initial=0.0) <= ulp(plan.dtype) * np.max(np.abs(got[n]), initial=0.0)
    return got, run.counts


def _check_forward(plan, captures, seed):
    """The forward's counters (== model.exact, captured reads where there are captures) and O against the float64
    reference within the same-precision tolerance."""
    inputs, host = launch.make_device_inputs(plan, seed=seed, captures=captures)
    got, counts = _run_both(plan, inputs, ("O",))
    assert (counts["main"].get("captures", (0, 0))[0] > 0) == bool(captures)
    want = reference_outputs(plan, host)["O"]
    p, _ = _naive(plan, host, reference.default_scale(plan.d))
    assert_within_naive(got, {"O": want}, {"O": round_to(p @ host["V"][kv_rows(plan)], plan.dtype)})


def _check_backward(plan, captures, seed):
    """The backward's counters and dQ, dK, dV against the float64 reference within the same-precision tolerance."""
    inputs, host = launch.make_device_inputs(plan, seed=seed, captures=captures)
    got, _ = _run_both(plan, inputs, GRADS)
    scale = reference.default_scale(plan.d)
    kv = kv_rows(plan)
    k, v, q, do = host["K"][kv], host["V"][kv], host["Q"], host["dO"]
    p, grad = _naive(plan, host, scale)
    dp = round_to(do @ np.swapaxes(v, -1, -2), plan.dtype)
    ds = round_to(p * (dp - (p * dp).sum(axis=-1, keepdims=True)) * grad, plan.dtype)
    naive = {"dQ": round_to(scale * (ds @ k), plan.dtype),
             "dK": group_sum(plan, round_to(scale * (np.swapaxes(ds, -1, -2) @ q), plan.dtype)),
             "dV": group_sum(plan, round_to(np.swapaxes(p, -1, -2) @ do, plan.dtype))}
    assert_within_naive(got, reference_outputs(plan, host), naive)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward(case):
    _check_forward(*_plan(case, "fwd"), _seed(case, "fwd"))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward(case):
    _check_backward(*_plan(case, "bwd"), _seed(case, "bwd"))


@pytest.mark.parametrize("seed", range(4))
def test_fuzzed_expressions(seed):
    """Random variants (tests/plan/test_mods.py random_mods: masks of index comparisons and a captured table, smooth
    score_mods with derived derivatives, float16 and int32 captures), forward and backward at d 64 / 128, float16 /
    bfloat16, grouped-query, N_q 700 != N_k 900: counters == model.exact, outputs within the tolerance."""
    from ..plan.test_mods import random_mods

    exprs, captures = random_mods(np.random.default_rng(1000 + seed))
    mods = check_mods(**exprs, captures=captures)
    for direction, check in (("fwd", _check_forward), ("bwd", _check_backward)):
        plan = make_plan("flash", "fast", N_q=700, N_k=900, d=(64, 128)[seed // 2],
                         dtype=("float16", "bfloat16")[seed % 2], sram=227 * KB, heads=4, kv_heads=2, mods=mods,
                         capture_values=captures, direction=direction)
        check(plan, captures, _seed("fuzz", seed, direction))


BUILT_INS = [  # (expressions, the built-in's make_plan arguments, captures)
    ({"mask_mod": "kv_idx <= q_idx + (n_k - n_q)"}, {"causal": "bottom_right"}, {}),
    ({"score_mod": "30.0f * tanhf(score / 30.0f)", "score_grad": "1.0f - tanhf(score / 30.0f) * tanhf(score / 30.0f)"},
     {"softcap": 30.0}, {}),
    ({"score_mod": "score - slopes[h] * abs(kv_idx - q_idx - (n_k - n_q))"}, {"alibi": tuple(SLOPES.tolist())},
     {"slopes": SLOPES}),
]


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("built_in", range(len(BUILT_INS)))
def test_expressions_give_the_built_ins(built_in, direction):
    """The same inputs through the expression and through the built-in variant: within two ulps of the outputs'
    scale (the expression runs in float32 where a built-in may order its operations otherwise)."""
    exprs, args, captures = BUILT_INS[built_in]
    common = dict(N_q=700, N_k=900, d=128, dtype="float16", sram=227 * KB, batch=1, heads=4, direction=direction)
    mine = make_plan("flash", "fast", mods=check_mods(**exprs, captures=captures), capture_values=captures, **common)
    theirs = make_plan("flash", "fast", **args, **common)
    inputs, _ = launch.make_device_inputs(theirs, seed=_seed(built_in, direction))
    inputs.update({capture_buffer(n): cp.asarray(x) for n, x in captures.items()})
    names = ("O",) if direction == "fwd" else GRADS
    a = launch.run_plan(mine, inputs, counting=False).buffers
    b = launch.run_plan(theirs, inputs, counting=False).buffers
    for n in names:
        x, y = (launch.to_float64(r[n], "float16") for r in (a, b))
        assert np.max(np.abs(x - y)) <= 4 * ulp("float16") * np.max(np.abs(y)), n


def test_library():
    """attention_mods / attention_mods_backward on cupy arrays with a document mask from a captured table, causal
    within each document, and the block mask create_block_mask makes of it; against the float64 reference."""
    n, d = 1500, 64
    doc = _docs(n, 3)
    expr = "doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx"
    rng = np.random.default_rng(_seed("library"))
    q, k, v, do = (rng.standard_normal(s).astype(np.float16).astype(np.float64)
                   for s in ((2, 4, n, d), (2, 2, n, d), (2, 2, n, d), (2, 4, n, d)))
    kx, vx = (np.repeat(x, 2, axis=1) for x in (k, v))
    visible = (doc[:, None] == doc[None, :]) & (np.arange(n)[None, :] <= np.arange(n)[:, None])
    o_w, _ = reference.forward(q, kx, vx, mask=visible)
    dq_w, dk_w, dv_w = reference.backward(q, kx, vx, do, mask=visible)
    dk_w, dv_w = (x.reshape(2, 2, 2, n, d).sum(axis=2) for x in (dk_w, dv_w))
    blocks = iokernels.create_block_mask(expr, n, n, captures={"doc": doc})
    assert set(np.unique(blocks.levels)) == {0, 1, 2}
    qd, kd, vd, dod = (cp.asarray(x.astype(np.float16)) for x in (q, k, v, do))
    for block_mask in (None, blocks):
        o, lse = iokernels.attention_mods(qd, kd, vd, mask_mod=expr, captures={"doc": cp.asarray(doc)},
                                          block_mask=block_mask, return_lse=True)
        assert np.max(np.abs(cp.asnumpy(o) - o_w)) < 1e-2 * np.max(np.abs(o_w))
        grads = iokernels.attention_mods_backward(qd, kd, vd, o, dod, lse, mask_mod=expr,
                                                  captures={"doc": cp.asarray(doc)}, block_mask=block_mask)
        for g, w in zip(grads, (dq_w, dk_w, dv_w), strict=True):
            assert np.max(np.abs(cp.asnumpy(g).astype(np.float64) - w)) < 2e-2 * np.max(np.abs(w))


def test_bad_expression_fails_before_a_launch():
    """An expression the CPU parser takes but NVRTC refuses (``%`` of a float) fails with NVRTC's message, which names
    the expression and its line, before any kernel is compiled."""
    q = cp.zeros((1, 1, 64, 64), cp.float16)
    with pytest.raises(ValueError, match=r"score_mod\(1\)"):
        iokernels.attention_mods(q, q, q, score_mod="score % 2", score_grad="1.0f")


def test_torch_autograd():
    """iokernels.torch.attention_mods with autograd, bfloat16: a softcap score_mod (its derivative derived) with a
    document mask read from a captured int32 tensor, grouped-query attention; against the float64 reference."""
    torch = pytest.importorskip("torch")
    from iokernels.torch import attention_mods

    n, d = 700, 128
    doc = _docs(n, 4)
    rng = np.random.default_rng(_seed("torch"))
    q, k, v, do = (rng.standard_normal(s).astype(np.float16).astype(np.float64)
                   for s in ((1, 4, n, d), (1, 2, n, d), (1, 2, n, d), (1, 4, n, d)))
    mods = check_mods(mask_mod="doc[q_idx] == doc[kv_idx]", score_mod="20.0f * tanhf(score / 20.0f)",
                      captures={"doc": doc})
    plan = make_plan("flash", "fast", N_q=n, d=d, dtype="bfloat16", sram=227 * KB, heads=4, kv_heads=2, mods=mods,
                     direction="bwd")
    host = {"Q": q.reshape(4, n, d), "K": k.reshape(2, n, d), "V": v.reshape(2, n, d), "dO": do.reshape(4, n, d),
            capture_buffer("doc"): doc}
    want = reference_outputs(plan, host)
    o_w = reference.forward(host["Q"], host["K"][kv_rows(plan)], host["V"][kv_rows(plan)],
                            mods=reference_mods(plan, host))[0]
    qt, kt, vt = (torch.tensor(x, dtype=torch.bfloat16, device="cuda", requires_grad=True) for x in (q, k, v))
    ot = attention_mods(qt, kt, vt, mask_mod=mods.mask_mod, score_mod=mods.score_mod,
                        captures={"doc": torch.tensor(doc, device="cuda")})
    ot.backward(torch.tensor(do, dtype=torch.bfloat16, device="cuda"))
    assert np.max(np.abs(ot.double().detach().cpu().numpy().reshape(4, n, d) - o_w)) < 3e-2 * np.max(np.abs(o_w))
    for g, name in ((qt.grad, "dQ"), (kt.grad, "dK"), (vt.grad, "dV")):
        w = want[name]
        assert np.max(np.abs(g.double().cpu().numpy().reshape(w.shape) - w)) < 4e-2 * np.max(np.abs(w)), name


@pytest.mark.parametrize("with_table", [True, False])
def test_block_mask_on_the_gpu(with_table):
    """kernels/mod_blocks.cu gives block_levels' levels (ragged N: partial blocks at the end), its counting build the
    bytes block_levels predicts (the table's reads, a byte per block), its plain build the same levels; and
    create_block_mask on the GPU the CPU's block mask."""
    from iokernels.library.mods import gpu_block_levels
    from iokernels.plan.mods import block_levels

    n_q, n_k = 1000, 1300
    doc = _docs(n_k, 5)
    expr = ("doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx + 300" if with_table
            else "kv_idx <= q_idx && q_idx - kv_idx < 300")
    captures = {"doc": doc} if with_table else {}
    mods = check_mods(mask_mod=expr, captures=captures)
    want, reads = block_levels(mods, captures, n_q, n_k, 128)
    assert {0, 1, 2} == set(np.unique(want).tolist())
    device = {n: cp.asarray(x) for n, x in captures.items()}
    got, counts = gpu_block_levels(mods, device, n_q, n_k, 128, counting=True)
    assert np.array_equal(cp.asnumpy(got), want)
    assert counts.get("captures", (0, 0)) == (reads, 0) and counts["block_mask"] == (0, want.size)
    assert (reads > 0) == with_table
    plain, _ = gpu_block_levels(mods, device, n_q, n_k, 128)
    assert np.array_equal(cp.asnumpy(plain), want)
    on_gpu = iokernels.create_block_mask(expr, n_q, n_k, captures=device, on_gpu=True)
    assert on_gpu == iokernels.create_block_mask(expr, n_q, n_k, captures=captures, on_gpu=False)


def test_torch_operator_under_torch_compile():
    """torch.ops.iokernels.attention_mods_fwd traced by torch.compile with fullgraph=True (no graph break) gives the
    eager call's output; iokernels.torch.attention_mods compiled (a block mask from create_block_mask, a captured
    table) gives the eager output and gradients."""
    torch = pytest.importorskip("torch")
    from iokernels.torch import attention_mods

    n, d = 600, 64
    gen = torch.Generator(device="cuda").manual_seed(_seed("compile"))
    q, k, v = (torch.randn(1, 2, n, d, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
    doc = torch.tensor(_docs(n, 3), device="cuda")
    expr = "doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx"

    def op(q, k, v, doc):
        return torch.ops.iokernels.attention_mods_fwd(q, k, v, [doc], ["doc"], expr, None, None, "", None, None,
                                                      128)[0]

    want = op(q, k, v, doc)
    got = torch.compile(op, fullgraph=True)(q, k, v, doc)
    assert torch.equal(got, want)
    blocks = iokernels.create_block_mask(expr, n, n, captures={"doc": doc})
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    eager = attention_mods(*leaves, mask_mod=expr, captures={"doc": doc}, block_mask=blocks)
    eager.float().square().sum().backward()
    grads = [x.grad.clone() for x in leaves]
    for x in leaves:
        x.grad = None
    compiled = torch.compile(lambda a, b, c: attention_mods(a, b, c, mask_mod=expr, captures={"doc": doc},
                                                            block_mask=blocks))(*leaves)
    compiled.float().square().sum().backward()
    assert torch.equal(compiled, eager)
    for x, g in zip(leaves, grads, strict=True):
        assert torch.equal(x.grad, g)
