"""Explicit masks on the tensor-core path (issue #22, iokernels/library/explicit.py): a boolean or additive mask
through ``iokernels.attention`` / ``attention_backward`` (cupy float16) and ``iokernels.torch.attention(attn_mask=)``
(float16, bfloat16, autograd) runs the sm_90 tma kernels as a programmable variant reading the mask where it lies:
outputs and gradients within flash-attention's same-precision tolerance of the float64 reference with the mask, for
masks shared, per head, per batch, per batch and head, transposed, and with batch dims no single stride walks;
causal (both alignments), grouped-query attention, ragged N_q ≠ N_k; rows the mask hides entirely give O 0, lse −inf
and zero gradients; inside count_io the counters equal model.exact of the variant's plan (the mask counted as the
captured array it is), and no research kernel runs.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_explicit_fast.py`` (skips without an sm_90 device).
"""

import zlib

import numpy as np
import pytest

import iokernels
from iokernels import model
from iokernels.library import explicit
from iokernels.plan import make_plan
from iokernels.plan.causal import causal_offset
from iokernels.plan.mods import check_mods
from iokernels.plan.units import round_to
from iokernels.simulate import reference

from .helpers import assert_within_naive

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.usefixtures("sm90")
KB = 1024

# (lead, kv heads, n_q, n_k, d, mask's own shape (None: the full one), kind, causal)
CASES = [
    ((2, 3), 3, 200, 333, 64, "shared", "bool", "bottom_right"),
    ((2, 4), 2, 239, 239, 128, "head", "float16", ""),
    ((2, 4), 4, 113, 300, 64, "batch", "float32", "top_left"),
    ((2, 2), 1, 256, 256, 96, "full", "float16", "bottom_right"),
    ((1, 4), 4, 300, 200, 64, "transposed", "bool", ""),
    ((2, 3, 2), 2, 128, 257, 64, "strided", "float16", ""),
    ((4,), 4, 1023, 1023, 128, "shared", "float16", "top_left"),
    # rows of 16-byte multiples: the forward's tiles by the copy engine (MOD_TMA; rows and keys past the ends
    # zero-filled), and a float32 mask at d 128 (two stages do not fit) by cp.async (MOD_STAGE)
    ((2, 2), 2, 250, 512, 64, "full", "float16", "bottom_right"),
    ((1, 4), 4, 130, 384, 128, "shared", "bool", ""),
    ((1, 4), 2, 200, 264, 128, "head", "float32", "top_left"),
]
IDS = [f"{'x'.join(map(str, c[0]))}-{c[5]}-{c[6]}-{c[7] or 'full'}-d{c[4]}" for c in CASES]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _mask(rng, layout, kind, lead, n_q, n_k):
    """(the device mask, its float64 / bool host values broadcast to (*lead, n_q, n_k))."""
    shape = {"shared": lambda: (n_q, n_k), "head": lambda: (lead[-1], n_q, n_k),
             "batch": lambda: (lead[0], 1, n_q, n_k), "full": lambda: (*lead, n_q, n_k),
             "transposed": lambda: (*lead, n_k, n_q), "strided": lambda: (lead[0], 1, lead[2], n_q, n_k)}[layout]()
    raw = rng.random(shape) < 0.7
    if kind != "bool":
        raw = np.where(raw, rng.standard_normal(raw.shape) * 2, -np.inf).astype(kind)
    dev = cp.asarray(raw)
    if layout == "transposed":  # a view with the query dim last in memory
        dev, raw = dev.swapaxes(-1, -2), raw.swapaxes(-1, -2)
    return dev, np.broadcast_to(raw.astype(bool if kind == "bool" else np.float64), (*lead, n_q, n_k))


def _naive(q, k, v, do, host_mask, causal, dtype):
    """The same-precision yardstick: S rounded to the dtype, the mask applied, P rounded; O and the gradients as a
    float16 standard attention gives them (rows with no visible key 0)."""
    scale = reference.default_scale(q.shape[-1])
    s = round_to(scale * (q @ np.swapaxes(k, -1, -2)), dtype)
    s = np.where(host_mask, s, -np.inf) if host_mask.dtype == bool else s + host_mask
    if causal:
        n_q, n_k = s.shape[-2:]
        s = np.where(np.arange(n_k)[None] <= np.arange(n_q)[:, None] + causal_offset(n_q, n_k, causal), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    l = e.sum(axis=-1, keepdims=True)
    p = round_to(np.where(l > 0, e / np.where(l > 0, l, 1.0), 0.0), dtype)
    dp = round_to(do @ np.swapaxes(v, -1, -2), dtype)
    ds = round_to(p * (dp - (p * dp).sum(axis=-1, keepdims=True)), dtype)
    return {"O": round_to(p @ v, dtype), "dQ": round_to(scale * (ds @ k), dtype),
            "dK": round_to(scale * (np.swapaxes(ds, -1, -2) @ q), dtype), "dV": round_to(np.swapaxes(p, -1, -2) @ do,
                                                                                        dtype)}


def _ref_mask(host_mask, causal):
    """The float64 reference's mask: the explicit one and, with causal, the causal one (a hidden element −inf)."""
    if not causal:
        return host_mask
    n_q, n_k = host_mask.shape[-2:]
    vis = np.arange(n_k)[None] <= np.arange(n_q)[:, None] + causal_offset(n_q, n_k, causal)
    return vis & host_mask if host_mask.dtype == bool else np.where(vis, host_mask, -np.inf)


def _group(x, lead, kv_heads):
    """dK or dV over q's heads summed over each K/V head's group."""
    return x.reshape(*lead[:-1], kv_heads, lead[-1] // kv_heads, *x.shape[-2:]).sum(axis=-3)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_masked_call_on_the_tma_kernels(case):
    lead, kv_heads, n_q, n_k, d, layout, kind, causal = case
    rng = np.random.default_rng(_seed(case))
    kv_lead = (*lead[:-1], kv_heads)
    q, k, v, do = (rng.standard_normal(s).astype(np.float16).astype(np.float64)
                   for s in ((*lead, n_q, d), (*kv_lead, n_k, d), (*kv_lead, n_k, d), (*lead, n_q, d)))
    mask, host_mask = _mask(rng, layout, kind, lead, n_q, n_k)
    qd, kd, vd, dod = (cp.asarray(x.astype(np.float16)) for x in (q, k, v, do))
    with iokernels.count_io() as records:
        o, lse = iokernels.attention(qd, kd, vd, mask=mask, causal=causal, return_lse=True)
        grads = iokernels.attention_backward(qd, kd, vd, o, dod, lse, mask=mask, causal=causal)
    assert {r["kernel"] for r in records} <= {"flash_tma_fwd", "flash_tma_bwd", "flash_bwd_prep",
                                             "flash_bwd_dq"}, {r["kernel"] for r in records}
    assert any(r["tensor"] == "captures" and r["read_bytes"] > 0 for r in records)
    # the model of the same variant, its captured array's values given
    mask_mod, score_mod, capture = explicit.variant(mask, lead, n_q, n_k)
    host_cap = cp.asnumpy(capture)
    mods = check_mods(mask_mod, score_mod, captures={"mask": host_cap})
    batch, heads = (int(np.prod(lead[:-1])), lead[-1])
    for direction in ("fwd", "bwd"):
        plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * KB, batch=batch,
                         heads=heads, kv_heads=kv_heads, causal=causal, mods=mods, capture_values={"mask": host_cap},
                         direction=direction)
        want = {(s, t): rw for s, tensors in model.exact(plan).items() for t, rw in tensors.items()}
        got = {(r["stage"], r["tensor"]): (r["read_bytes"], r["write_bytes"]) for r in records
               if r["plan"] == plan.label}
        assert got == want, direction
    # values against float64 (the plain build, outside count_io, on the same arrays)
    o, lse = iokernels.attention(qd, kd, vd, mask=mask, causal=causal, return_lse=True)
    grads = iokernels.attention_backward(qd, kd, vd, o, dod, lse, mask=mask, causal=causal)
    group = lead[-1] // kv_heads
    kx, vx = (np.repeat(x, group, axis=-3) for x in (k, v))
    ref_mask = _ref_mask(host_mask, causal)
    want_o, _ = reference.forward(q, kx, vx, mask=ref_mask)
    want_g = reference.backward(q, kx, vx, do, mask=ref_mask)
    naive = _naive(q, kx, vx, do, host_mask, causal, "float16")
    got = {"O": cp.asnumpy(o).astype(np.float64), **{n: cp.asnumpy(g).astype(np.float64)
                                                     for n, g in zip(("dQ", "dK", "dV"), grads, strict=True)}}
    want = {"O": want_o, "dQ": want_g[0], "dK": _group(want_g[1], lead, kv_heads),
            "dV": _group(want_g[2], lead, kv_heads)}
    naive.update(dK=_group(naive["dK"], lead, kv_heads), dV=_group(naive["dV"], lead, kv_heads))
    assert_within_naive(got, want, naive)


@pytest.mark.parametrize("kind", ["bool", "float16"])
def test_rows_the_mask_hides_give_zero(kind):
    """Rows with no visible key (every element False, or −inf): O 0, lse −inf, dQ 0, never NaN; the other rows as
    the reference."""
    rng = np.random.default_rng(_seed("hidden", kind))
    n, d = 256, 64
    q, k, v, do = (rng.standard_normal((2, 2, n, d)).astype(np.float16) for _ in range(4))
    visible = rng.random((n, n)) < 0.6
    visible[17] = visible[200] = False
    mask = cp.asarray(visible if kind == "bool" else np.where(visible, 0.0, -np.inf).astype(np.float16))
    qd, kd, vd, dod = (cp.asarray(x) for x in (q, k, v, do))
    o, lse = iokernels.attention(qd, kd, vd, mask=mask, return_lse=True)
    dq, dk, dv = iokernels.attention_backward(qd, kd, vd, o, dod, lse, mask=mask)
    o, lse, dq = cp.asnumpy(o), cp.asnumpy(lse), cp.asnumpy(dq)
    assert np.all(o[:, :, [17, 200]] == 0) and np.all(np.isneginf(lse[:, :, [17, 200]]))
    assert np.all(dq[:, :, [17, 200]] == 0)
    assert all(np.all(np.isfinite(cp.asnumpy(x))) for x in (dq, dk, dv)) and np.all(np.isfinite(o))
    want, _ = reference.forward(*(x.astype(np.float64) for x in (q, k, v)), mask=visible)
    assert np.max(np.abs(o - want)) < 1e-2 * np.max(np.abs(want))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_attn_mask_with_autograd(dtype):
    """iokernels.torch.attention(attn_mask=) with an additive per-head mask in q's dtype and a boolean one, grouped-
    query attention, is_causal: O and the gradients against SDPA in float64 with the same mask."""
    torch = pytest.importorskip("torch")
    import iokernels.torch as itorch

    tdt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(_seed("torch", dtype))
    n, d = 384, 128
    q = torch.randn(2, 4, n, d, device="cuda", dtype=tdt, generator=gen)
    k, v = (torch.randn(2, 2, n, d, device="cuda", dtype=tdt, generator=gen) for _ in range(2))
    do = torch.randn(2, 4, n, d, device="cuda", dtype=tdt, generator=gen)
    additive = torch.randn(4, n, n, device="cuda", generator=gen).to(tdt)
    boolean = torch.rand(2, 1, n, n, device="cuda", generator=gen) > 0.3
    boolean |= torch.eye(n, dtype=torch.bool, device="cuda")  # every row sees a key (SDPA's NaN rows aside)
    for mask in (additive, boolean):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = itorch.attention(*leaves, attn_mask=mask, is_causal=True, enable_gqa=True)
        o.backward(do)
        x64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
        m64 = mask if mask.dtype == torch.bool else mask.double()
        causal = torch.ones(n, n, dtype=torch.bool, device="cuda").tril()
        m64 = (m64 & causal) if mask.dtype == torch.bool else m64.masked_fill(~causal, float("-inf"))
        want = torch.nn.functional.scaled_dot_product_attention(*x64, attn_mask=m64, enable_gqa=True)
        want.backward(do.double())
        tol = 2e-2 if dtype == "float16" else 6e-2
        assert (o.double() - want).abs().max() <= tol * want.abs().max()
        for got, ref in zip(leaves, x64, strict=True):
            assert (got.grad.double() - ref.grad).abs().max() <= 2 * tol * ref.grad.abs().max()


def test_a_block_mask_the_variant_refuses_runs_on_the_research_kernels():
    """A block mask of 64-blocks (the tma kernels take multiples of 128) with an explicit mask: the research kernels
    run it, with the same result as the float64 reference."""
    rng = np.random.default_rng(_seed("fallback"))
    n, d = 256, 64
    q, k, v = (rng.standard_normal((1, 2, n, d)).astype(np.float16) for _ in range(3))
    visible = rng.random((n, n)) < 0.7
    blocks = iokernels.BlockMask.from_array(np.array([[1, 0, 1, 1], [1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]],
                                                     dtype=bool), n_q=n, n_k=n, block_q=64, block_k=64)
    with iokernels.count_io() as records:
        o = iokernels.attention(*(cp.asarray(x) for x in (q, k, v)), mask=cp.asarray(visible), block_mask=blocks)
    assert not any(r["kernel"].startswith("flash_tma") for r in records)
    want, _ = reference.forward(*(x.astype(np.float64) for x in (q, k, v)), mask=visible & blocks.element_mask())
    assert np.max(np.abs(cp.asnumpy(o) - want)) < 1e-2 * np.max(np.abs(want))


def test_torch_masked_calls_take_the_fast_path():
    """A routed signature's second call runs on raw addresses (torch_ops' fast path holds a variant's plan for it) and
    gives the first call's O and gradients; a mask 2 bytes off 16-byte alignment (a view) takes the general path every
    time (the library copies it), with the same values."""
    torch = pytest.importorskip("torch")
    import iokernels.torch as itorch
    from iokernels.library import dispatch

    dispatch.clear_dispatch_cache()
    gen = torch.Generator(device="cuda").manual_seed(_seed("fast"))
    q, k, v, do = (torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.float16, generator=gen) for _ in range(4))
    mask = torch.randn(4, 256, 256, device="cuda", generator=gen).half()
    off = torch.empty(4 * 256 * 256 + 1, device="cuda", dtype=torch.float16)[1:].view(4, 256, 256)
    off.copy_(mask)
    runs = []
    for m in (mask, mask, off, off):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = itorch.attention(*leaves, attn_mask=m)
        o.backward(do)
        runs.append([o.detach(), *(t.grad for t in leaves)])
    routed = [e.call for e in dispatch.TORCH_CALLS.entries.values() if e.call.chain[0].mods is not None]
    assert sorted(c.chain[0].direction for c in routed) == ["bwd", "fwd"]  # the aligned mask's two signatures
    for run in runs[1:]:
        assert torch.equal(run[0], runs[0][0])
        for g, g0 in zip(run[1:], runs[0][1:], strict=True):
            assert torch.allclose(g, g0, atol=2e-3, rtol=1e-2)


def test_cupy_masked_calls_take_the_fast_path():
    """iokernels.attention / attention_backward with mask=: a routed signature's second call runs its prepared
    launches on raw addresses (dispatch.ROUTED_CALLS) with the first call's outputs; a mask 2 bytes off 16-byte
    alignment takes the general path (which copies it), with the same values."""
    from iokernels.library import dispatch

    dispatch.clear_dispatch_cache()
    rng = np.random.default_rng(_seed("cupy fast"))
    q, k, v, do = (cp.asarray(rng.standard_normal((2, 4, 256, 64)).astype(np.float16)) for _ in range(4))
    mask = cp.asarray(rng.standard_normal((4, 256, 256)).astype(np.float16))
    off = cp.empty(4 * 256 * 256 + 1, cp.float16)[1:].reshape(4, 256, 256)
    off[...] = mask
    runs = []
    for m in (mask, mask, off, off):
        o, lse = iokernels.attention(q, k, v, mask=m, return_lse=True)
        runs.append([o, lse, *iokernels.attention_backward(q, k, v, o, do, lse, mask=m)])
    assert sorted(c.chain[0].direction for c in dispatch.ROUTED_CALLS.entries.values()) == ["bwd", "fwd"]
    for run in runs[1:]:
        assert cp.array_equal(run[0], runs[0][0]) and cp.array_equal(run[1], runs[0][1])
        for g, g0 in zip(run[2:], runs[0][2:], strict=True):
            assert cp.allclose(g, g0, atol=2e-3, rtol=1e-2)


def test_a_numpy_mask_with_cupy_inputs():
    """mask= as a numpy array beside cupy float16 inputs: checked and copied up at each call (no fast path), the same
    outputs as the device mask's, forward and backward, twice."""
    rng = np.random.default_rng(_seed("numpy mask"))
    q, k, v, do = (cp.asarray(rng.standard_normal((1, 2, 128, 64)).astype(np.float16)) for _ in range(4))
    host = rng.random((128, 128)) < 0.8
    want_o, want_lse = iokernels.attention(q, k, v, mask=cp.asarray(host), return_lse=True)
    want_g = iokernels.attention_backward(q, k, v, want_o, do, want_lse, mask=cp.asarray(host))
    for _ in range(2):
        o, lse = iokernels.attention(q, k, v, mask=host, return_lse=True)
        grads = iokernels.attention_backward(q, k, v, o, do, lse, mask=host)
        assert cp.array_equal(o, want_o) and cp.array_equal(lse, want_lse)
        for g, w in zip(grads, want_g, strict=True):
            assert cp.allclose(g, w, atol=2e-3, rtol=1e-2)


@pytest.mark.parametrize("kind", ["bool", "float16"])
def test_a_block_mask_of_128_blocks_with_an_explicit_mask(kind):
    """A block mask of 128-blocks with an explicit mask whose rows the copy engine loads (MOD_TMA with BLOCK_SPARSE)
    and N 4 blocks wide: the tma kernels run it, skipping the empty blocks, and O and the gradients are those of the
    float64 reference with both masks (within the same-precision tolerance)."""
    rng = np.random.default_rng(_seed("block mask", kind))
    n, d = 512, 64
    q, k, v, do = (rng.standard_normal((1, 2, n, d)).astype(np.float16).astype(np.float64) for _ in range(4))
    visible = rng.random((n, n)) < 0.7
    host = visible if kind == "bool" else np.where(visible, rng.standard_normal((n, n)), -np.inf).astype(np.float16)
    blocks = iokernels.BlockMask.from_array(np.array([[1, 0, 1, 1], [1, 1, 0, 1], [0, 1, 1, 1], [1, 0, 0, 1]],
                                                     dtype=bool), n_q=n, n_k=n, block_q=128, block_k=128)
    qd, kd, vd, dod = (cp.asarray(x.astype(np.float16)) for x in (q, k, v, do))
    with iokernels.count_io() as records:
        o, lse = iokernels.attention(qd, kd, vd, mask=cp.asarray(host), block_mask=blocks, return_lse=True)
        grads = iokernels.attention_backward(qd, kd, vd, o, dod, lse, mask=cp.asarray(host), block_mask=blocks)
    assert {"flash_tma_fwd", "flash_tma_bwd"} <= {r["kernel"] for r in records}
    o, lse = iokernels.attention(qd, kd, vd, mask=cp.asarray(host), block_mask=blocks, return_lse=True)
    grads = iokernels.attention_backward(qd, kd, vd, o, dod, lse, mask=cp.asarray(host), block_mask=blocks)
    element = blocks.element_mask()
    both = (visible & element) if kind == "bool" else np.where(element, host.astype(np.float64), -np.inf)
    want_o, _ = reference.forward(q, k, v, mask=both)
    want_g = reference.backward(q, k, v, do, mask=both)
    naive = _naive(q, k, v, do, both, "", "float16")
    got = {"O": cp.asnumpy(o).astype(np.float64), **{n: cp.asnumpy(g).astype(np.float64)
                                                     for n, g in zip(("dQ", "dK", "dV"), grads, strict=True)}}
    want = {"O": want_o, "dQ": want_g[0], "dK": want_g[1], "dV": want_g[2]}
    assert_within_naive(got, want, naive)
