"""Block-sparse attention on the sm_90 tensor-core path (issue #22; BLOCK_SPARSE on flash_tma.cu and flash_tma_bwd.cu,
the paper's Algorithm 5): counters == model.exact (the block mask's bytes included), O and the gradients within
flash-attention's same-precision tolerance of the float64 reference with the block mask, with causal (both
alignments), grouped-query attention, ragged N, N_q ≠ N_k, rows of the grid with no kept block, d inside a wider
tile and past 128, a softcap; the plain build agrees with the counting one; ``iokernels.attention`` /
``attention_backward`` and ``iokernels.torch.attention`` (autograd) run the same plans.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_block_sparse_fast.py`` (skips without an sm_90 device).
"""

import zlib

import numpy as np
import pytest

import iokernels
from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.masks import pattern
from iokernels.plan.units import round_to
from iokernels.simulate import kv_rows, reference, reference_outputs

from .helpers import assert_within_naive, per_item, plan_naive_grads, plan_naive_p, ulp

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.usefixtures("sm90")
KB = 1024
GRADS = ("dQ", "dK", "dV")

# (N_q, N_k, d, dtype, heads, kv_heads, causal, pattern, density, block, softcap)
CASES = [
    (1000, 1000, 64, "float16", 2, 2, "", "random", 0.3, 128, None),
    (4097, 4097, 128, "bfloat16", 1, 1, "bottom_right", "random", 0.25, 128, None),
    (1000, 1000, 64, "bfloat16", 4, 2, "top_left", "local", 0.5, 128, None),  # grouped-query
    (113, 1000, 128, "float16", 1, 1, "", "strided", 0.5, 128, None),
    (1023, 517, 96, "bfloat16", 2, 1, "top_left", "random", 0.4, 256, None),  # d inside a wider tile, blocks of 256
    (1000, 1000, 64, "float16", 1, 1, "", "random", 0.1, 128, None),  # rows of the grid with no kept block
    (700, 700, 128, "float16", 2, 2, "bottom_right", "random", 0.5, 128, 5.0),  # with a softcap
    (239, 239, 256, "float16", 2, 2, "", "random", 0.5, 128, None),  # the wide backward
    (1000, 600, 160, "bfloat16", 2, 2, "bottom_right", "local", 0.4, 128, None),
]
IDS = ["-".join(map(str, c)).replace(" ", "") for c in CASES]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _plan(case, direction):
    n_q, n_k, d, dtype, heads, kv_heads, causal, kind, density, block, softcap = case
    mask = pattern(kind, density, n_q=n_q, n_k=n_k, block_q=block, seed=_seed(case))
    return make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=227 * KB, heads=heads,
                     kv_heads=kv_heads, causal=causal, block_mask=mask, softcap=softcap, direction=direction)


def _run_both(plan, inputs, names):
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    assert run.counts["main"]["block_mask"][0] > 0
    got = {n: launch.to_float64(run.buffers[n], plan.dtype) for n in names}
    plain = launch.run_plan(plan, inputs, counting=False)
    for n in names:  # the same kernel less its counters: equal, or one ulp apart
        other = launch.to_float64(plain.buffers[n], plan.dtype)
        assert np.max(np.abs(other - got[n]), initial=0.0) <= ulp(plan.dtype) * np.max(np.abs(got[n]), initial=0.0)
    return got


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward(case):
    plan = _plan(case, "fwd")
    params = dict(plan.stage("main").params)
    # the list's persistent grid (no dropout, ALiBi or mods in these cases)
    assert plan.stage("main").kernel == "flash_tma_fwd" and params["BLOCK_SPARSE"] == 1
    assert params["PERSISTENT"] == params["ITEM_LIST"] == 1 and plan.stage("main").grid[0] <= 132
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case, "fwd"))
    got = _run_both(plan, inputs, ("O",))
    want = reference_outputs(plan, host)["O"]
    kv = kv_rows(plan)
    naive = round_to(plan_naive_p(plan, host["Q"], host["K"][kv], reference.default_scale(plan.d)) @ host["V"][kv],
                     plan.dtype)
    assert_within_naive(got, {"O": want}, {"O": naive})
    # rows that see no kept key: exactly 0
    seen = plan.element_mask()
    vis = plan.visible(np.arange(plan.N_q), np.arange(plan.N_k))
    seen = seen if vis is None else seen & vis
    assert np.all(got["O"][:, ~seen.any(axis=1)] == 0)
    if case[8] == 0.1:
        assert (~seen.any(axis=1)).sum() >= 128  # (the case has an empty row of the grid)


BWD = [(c, i) for c, i in zip(CASES, IDS, strict=True) if c[10] is None or c[2] <= 128]


@pytest.mark.parametrize("case", [c for c, _ in BWD], ids=[i for _, i in BWD])
def test_backward(case):
    plan = _plan(case, "bwd")
    assert plan.stage("main").kernel.startswith("flash_tma_bwd")
    inputs, host = launch.make_device_inputs(plan, seed=_seed(case, "bwd"))
    got = _run_both(plan, inputs, GRADS)
    kv = kv_rows(plan)
    naive = plan_naive_grads(plan, host["Q"], host["K"][kv], host["V"][kv], host["dO"])
    assert_within_naive(got, reference_outputs(plan, host), naive)


def test_library_and_torch():
    """iokernels.attention / attention_backward on cupy arrays (twice: the fast path, its cached call) and
    iokernels.torch.attention under autograd, against the float64 reference with the block mask and causal; blocks of
    64 (which the tma tiles do not divide) run the research kernels, as right."""
    torch = pytest.importorskip("torch")
    from iokernels.torch import attention as torch_attention  # (an optional module)

    n = 700
    rng = np.random.default_rng(_seed("library"))
    q, k, v, do = (rng.standard_normal(s) for s in ((2, 4, n, 128), (2, 2, n, 128), (2, 2, n, 128), (2, 4, n, 128)))
    q, k, v, do = (x.astype(np.float16).astype(np.float64) for x in (q, k, v, do))
    kx, vx = (np.repeat(x, 2, axis=1) for x in (k, v))
    for block in (128, 64):
        bm = pattern("random", 0.4, n_q=n, n_k=n, block_q=block, seed=3)
        keep = bm.element_mask()
        o_w = reference.forward(q, kx, vx, causal=True, mask=keep)[0]
        dq_w, dk_w, dv_w = reference.backward(q, kx, vx, do, causal=True, mask=keep)
        dk_w, dv_w = (x.reshape(2, 2, 2, n, 128).sum(axis=2) for x in (dk_w, dv_w))
        qd, kd, vd, dod = (cp.asarray(x.astype(np.float16)) for x in (q, k, v, do))
        for _ in range(2):
            o, lse = iokernels.attention(qd, kd, vd, causal=True, block_mask=bm, return_lse=True)
            assert np.max(np.abs(cp.asnumpy(o) - o_w)) < 2e-2 * np.max(np.abs(o_w))
            grads = iokernels.attention_backward(qd, kd, vd, o, dod, lse, causal=True, block_mask=bm)
            for g, w in zip(grads, (dq_w, dk_w, dv_w), strict=True):
                assert np.max(np.abs(cp.asnumpy(g).astype(np.float64) - w)) < 2e-2 * np.max(np.abs(w))
        if block == 64:
            continue
        qt, kt, vt = (torch.tensor(x, dtype=torch.bfloat16, device="cuda", requires_grad=True) for x in (q, k, v))
        for _ in range(2):
            ot = torch_attention(qt, kt, vt, causal=True, block_mask=bm)
            ot.backward(torch.tensor(do, dtype=torch.bfloat16, device="cuda"))
            assert np.max(np.abs(ot.double().detach().cpu().numpy() - o_w)) < 3e-2 * np.max(np.abs(o_w))
            for g, w in ((qt.grad, dq_w), (kt.grad, dk_w), (vt.grad, dv_w)):
                assert np.max(np.abs(g.double().cpu().numpy() - w)) < 4e-2 * np.max(np.abs(w))
                g.zero_()


@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[2]], ids=[IDS[1], IDS[5], IDS[2]])
def test_the_list_changes_the_order_only(case):
    """The forward's list grid (ITEM_LIST) against the same plan as a block per item (grid (T_r, 1, BH), in bands of
    heads when causal, the kernel before the list): O and lse bitwise equal (an item's work does not depend on the
    block that takes it), and each plan's counters equal its model."""
    listed = _plan(case, "fwd")
    inputs, _ = launch.make_device_inputs(listed, seed=_seed(case, "list"))
    runs = {}
    for name, plan in (("list", listed), ("per item", per_item(listed))):
        assert launch.run_plan(plan, inputs, counting=True).counts == model.exact(plan), name
        runs[name] = launch.run_plan(plan, inputs, counting=False)
    for tensor in ("O", "lse"):
        a, b = (cp.asnumpy(runs[n].buffers[tensor]) for n in ("list", "per item"))
        assert a.tobytes() == b.tobytes(), tensor
