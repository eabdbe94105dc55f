"""The tensor-core forward kernels (iokernels.plan.fast: flash_wgmma.cu and flash_tma.cu on sm_90, flash_tc.cu on
sm_80+): counters == model == simulator and outputs within flash-attention's same-precision tolerance, ragged
N and N_q != N_k included, for each kernel and its tile variants."""

import zlib

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan.fast import FAST_TUNING, WGMMA_TUNING, make_fast_plan
from iokernels.simulate import reference, simulate

from .helpers import naive_forward, problem_scale, rel_err

cp = pytest.importorskip("cupy")


def _kernels():
    major = int(cp.cuda.Device().compute_capability[:-1])
    return ["mma"] + (["wgmma", "tma"] if major == 9 else [])


KERNELS = pytest.mark.parametrize("kernel", ["mma", "wgmma", "tma"])


@pytest.fixture(autouse=True)
def _skip_unavailable(request):
    kernel = request.node.callspec.params.get("kernel") if hasattr(request.node, "callspec") else None
    if kernel is not None and kernel not in _kernels():
        pytest.skip(f"the {kernel} kernel does not run on this GPU")


CASES = [  # (N_q, N_k, d, dtype, batch, heads)
    (1, 1, 64, "float16", 1, 1),
    (113, 1000, 64, "bfloat16", 1, 3),
    (1000, 113, 128, "float16", 2, 1),
    (64, 64, 128, "bfloat16", 1, 1),
    (4097, 1000, 64, "float16", 1, 1),
    (257, 4097, 128, "bfloat16", 1, 2),
]


# the tma kernel's d inside a wider tile (the copy engine zero-fills the columns past d; O's are not stored)
PADDED_CASES = [
    (1, 1, 32, "float16", 1, 1),
    (113, 1000, 96, "bfloat16", 1, 3),
    (1000, 113, 80, "float16", 2, 1),
    (239, 4097, 16, "bfloat16", 1, 2),
    (4097, 257, 112, "float16", 1, 1),
    (1023, 1023, 40, "float16", 2, 2),
    (239, 1000, 256, "float16", 1, 2),  # past d 128: 128 x 64 tiles
    (1000, 239, 160, "bfloat16", 2, 1),
    (113, 4097, 200, "float16", 1, 1),
    (1, 1, 192, "bfloat16", 1, 1),
]


def _check_outputs(run, host, dtype):
    o = launch.to_float64(run.buffers["O"], dtype)
    assert np.all(np.isfinite(o))
    want, lse_want = reference.forward(host["Q"], host["K"], host["V"])[:2]
    scale = problem_scale({"O": want})
    bound = 2 * rel_err(naive_forward(host["Q"], host["K"], host["V"], dtype), want, scale) + 1e-6
    assert rel_err(o, want, scale) <= bound
    lse = cp.asnumpy(run.buffers["lse"]).astype(np.float64)
    assert np.max(np.abs(lse - lse_want.reshape(lse.shape))) < 1e-2


@pytest.mark.parametrize("case", PADDED_CASES, ids=lambda c: "-".join(map(str, c)))
def test_tma_takes_d_inside_a_wider_tile(case):
    if "tma" not in _kernels():
        pytest.skip("the tma kernel runs on sm_90 only")
    test_counters_and_outputs(case, "tma")


@KERNELS
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_counters_and_outputs(case, kernel):
    n_q, n_k, d, dtype, batch, heads = case
    plan = make_fast_plan(N_q=n_q, N_k=n_k, d=d, dtype=dtype, batch=batch, heads=heads, kernel=kernel)
    inputs, host = launch.make_device_inputs(plan, seed=zlib.crc32(repr(case).encode()))
    run = launch.run_plan(plan, inputs, counting=True)
    exact = model.exact(plan)
    assert run.counts == exact
    if plan.N_q * plan.N_k * plan.bh <= 4_000_000:
        assert simulate(plan, host).counts == exact
    _check_outputs(run, host, dtype)


VARIANTS = ([("mma", *t) for t in FAST_TUNING] + [("wgmma", *t) for t in WGMMA_TUNING]
            + [("tma", d, 128, bc) for d in (64, 128) for bc in (64, 128, 176)] + [("tma", 64, 192, 128)])


@pytest.mark.parametrize("kernel, d, br, bc", VARIANTS)
def test_tile_variants(kernel, d, br, bc):
    plan = make_fast_plan(N_q=300, N_k=517, d=d, dtype="float16", heads=2, block_r=br, block_c=bc, kernel=kernel)
    inputs, host = launch.make_device_inputs(plan, seed=br + bc + d)
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    _check_outputs(run, host, "float16")


@KERNELS
def test_plain_build_matches_counting_build(kernel):
    plan = make_fast_plan(N_q=300, N_k=200, d=64, dtype="float16", heads=2, kernel=kernel)
    inputs, _ = launch.make_device_inputs(plan, seed=5)
    a = cp.asnumpy(launch.run_plan(plan, inputs, counting=True).buffers["O"])
    b = cp.asnumpy(launch.run_plan(plan, inputs, counting=False).buffers["O"])
    assert np.array_equal(a, b)


@KERNELS
def test_outputs_bitwise_identical_run_to_run(kernel):
    plan = make_fast_plan(N_q=1000, N_k=777, d=128, dtype="bfloat16", heads=2, kernel=kernel)
    inputs, _ = launch.make_device_inputs(plan, seed=11)
    a = cp.asnumpy(launch.run_plan(plan, inputs, counting=False).buffers["O"])
    b = cp.asnumpy(launch.run_plan(plan, inputs, counting=False).buffers["O"])
    assert np.array_equal(a, b)


@KERNELS
def test_large_logits_stay_finite(kernel):
    plan = make_fast_plan(N_q=500, N_k=700, d=128, dtype="bfloat16", kernel=kernel)
    inputs, _ = launch.make_device_inputs(plan, seed=9, magnitude=10.0)  # logits about x100
    o = launch.to_float64(launch.run_plan(plan, inputs, counting=False).buffers["O"], "bfloat16")
    assert np.all(np.isfinite(o))


def test_wgmma_refused_off_sm90():
    if "wgmma" in _kernels():
        pytest.skip("this GPU runs the wgmma kernel")
    plan = make_fast_plan(N_q=64, d=64, dtype="float16", kernel="wgmma")
    inputs, _ = launch.make_device_inputs(plan, seed=0)
    with pytest.raises(launch.ArchUnavailable):
        launch.run_plan(plan, inputs)


@KERNELS
@pytest.mark.parametrize("batch, heads, kv_heads, n_q, n_k", [(2, 6, 2, 300, 517), (1, 8, 1, 129, 64)])
def test_grouped_query_attention(kernel, batch, heads, kv_heads, n_q, n_k):
    plan = make_fast_plan(N_q=n_q, N_k=n_k, d=64, dtype="float16", batch=batch, heads=heads, kv_heads=kv_heads,
                          kernel=kernel)
    inputs, host = launch.make_device_inputs(plan, seed=heads * 7 + kv_heads)
    assert inputs["K"].shape == (batch * kv_heads, n_k, 64)
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)
    kv = np.arange(plan.bh) // (heads // kv_heads)
    _check_outputs(run, {"Q": host["Q"], "K": host["K"][kv], "V": host["V"][kv]}, "float16")
