"""Bad input to the library fails before anything reaches the GPU (runs without one)."""

import numpy as np
import pytest

import iokernels

from .fakes import Launched, NumpyCupy, TrippedCupy

Q = np.zeros((2, 3, 10, 64), np.float32)


@pytest.mark.parametrize("args, error, message", [
    ((Q, Q, Q.astype(np.float16)), TypeError, "mixed dtypes"),
    ((Q.astype(np.int32),) * 3, TypeError, "unsupported dtype int32"),
    ((Q, Q[..., :32], Q), ValueError, "head dim 32"),
    ((Q, Q, Q[:1]), ValueError, "leading batch/head dims"),
    ((Q, Q, Q[..., :5, :]), ValueError, "rows"),
    ((Q[..., :60],) * 3, ValueError, "unsupported head dimension d=60"),
    ((Q[0, 0, 0],) * 3, ValueError, r"shape \(\.\.\., N, d\)"),
    ((Q, Q, [[1.0]]), TypeError, "numpy or cupy"),
])
def test_bad_input(args, error, message):
    with pytest.raises(error, match=message):
        iokernels.attention(*args)


@pytest.mark.parametrize("causal", ["diagonal", "upper_left", 1.5])
def test_unknown_causal_alignment(causal):
    with pytest.raises(ValueError, match="unknown causal alignment"):
        iokernels.attention(Q, Q, Q, causal=causal)
    with pytest.raises(ValueError, match="unknown causal alignment"):
        iokernels.attention_backward(Q, Q, Q, Q, Q, np.zeros((2, 3, 10), np.float32), causal=causal)


def test_causal_deterministic_backward_is_refused_before_the_gpu():
    h = Q.astype(np.float16)
    with pytest.raises(ValueError, match="no causal kernel"):
        iokernels.attention_backward(h, h, h, h, h, np.zeros((2, 3, 10), np.float32), causal=True, deterministic=True)


def test_backward_checks_lse():
    with pytest.raises(ValueError, match="lse must be float32 of shape"):
        iokernels.attention_backward(Q, Q, Q, Q, Q, np.zeros((2, 3, 9), np.float32))


def test_grouped_query_shapes_are_checked_before_the_gpu():
    import numpy as np

    from iokernels.library.api import _check, _kv_group

    q = np.zeros((2, 6, 10, 64), np.float16)
    k = v = np.zeros((2, 2, 12, 64), np.float16)
    assert _kv_group(q, k, v) == 3
    assert _check({"q": q, "k": k, "v": v}, {"q": "q", "k": "k", "v": "k"}, 3)[2:] == ((2, 6), 10, 12, 64)
    assert _kv_group(q, np.zeros((2, 4, 12, 64), np.float16), np.zeros((2, 4, 12, 64), np.float16)) == 1
    with pytest.raises(ValueError, match="shape mismatch"):
        _check({"q": q, "k": np.zeros((2, 4, 12, 64), np.float16), "v": np.zeros((2, 4, 12, 64), np.float16)},
               {"q": "q", "k": "k", "v": "k"}, 1)


# ---------------------------------------------------------------------------------------------
# options, plans, grouped-query routing and the memory check: all decided before the GPU

H = np.zeros((2, 4, 10, 64), np.float16)
LSE = np.zeros((2, 4, 10), np.float32)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"scale": "0.1"}, TypeError, "scale must be a finite real number"),
    ({"scale": float("nan")}, TypeError, "scale must be a finite real number"),
    ({"scale": True}, TypeError, "scale must be a finite real number"),
    ({"scale": 0}, ValueError, "scale must be > 0"),  # (masked scores are -inf before the multiply)
    ({"scale": -0.125}, ValueError, "scale must be > 0"),
    ({"graph": "yes"}, TypeError, "graph must be True or False"),
    ({"return_lse": 1}, TypeError, "return_lse must be True or False"),
    ({"algorithm": "sparse"}, ValueError, "sparse"),
    ({"algorithm": "flash", "schedule": "diagonal"}, ValueError, "diagonal"),
    ({"sram": "12XB"}, ValueError, "malformed size"),
    ({"sram": 256, "schedule": "q_outer"}, ValueError, "too small"),
])
def test_bad_options_fail_before_the_gpu(kwargs, error, message):
    with pytest.raises(error, match=message):
        iokernels.attention(H, H, H, **kwargs)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"deterministic": 1}, TypeError, "deterministic must be True or False"),
    ({"algorithm": "two_pass"}, ValueError, "two_pass"),
    ({"deterministic": True, "algorithm": "standard"}, ValueError, "tensor-core flash backward"),
])
def test_bad_backward_options_fail_before_the_gpu(kwargs, error, message):
    with pytest.raises(error, match=message):
        iokernels.attention_backward(H, H, H, H, H, LSE, **kwargs)


def test_bfloat16_bits_are_only_taken_from_the_torch_front_end():
    bits = np.zeros((2, 16, 64), np.uint16)
    with pytest.raises(TypeError, match="unsupported dtype uint16"):
        iokernels.attention(bits, bits, bits)
    from iokernels.library.api import _check

    assert _check({"q": bits, "k": bits, "v": bits}, {"q": "q", "k": "k", "v": "k"}, bfloat16=True)[1] == "bfloat16"


def _route(direction, dtype, q_heads, kv_heads, algorithm="flash", deterministic=False, d=64):
    from iokernels.library.api import choose_plan

    return choose_plan(direction, algorithm, None, 300, 200, d, dtype, (2, q_heads), None, q_heads // kv_heads, "",
                        deterministic)


def test_grouped_query_runs_natively_on_the_fast_forward_and_expanded_elsewhere():
    plan, expand = _route("fwd", "float16", 8, 2)
    assert (plan.schedule, expand, plan.heads, plan.kv_heads, plan.bh_kv) == ("fast", False, 8, 2, 4)
    for d in (96, 136, 256):  # d inside a wider tile, and past 128: the tma forward too
        plan, expand = _route("fwd", "float16", 8, 2, "flash", d=d)
        assert (plan.schedule, expand, plan.kv_heads) == ("fast", False, 2), d
    for dtype, algorithm, d in (("float32", "flash", 64), ("float16", "standard", 64)):
        plan, expand = _route("fwd", dtype, 8, 2, algorithm, d=d)
        assert expand and plan.bh == plan.bh_kv == 16, (dtype, algorithm, d)


@pytest.mark.parametrize("d", [32, 96])
def test_the_backward_at_d_inside_a_wider_tile_is_the_wgmma_kernel(d):
    """d 32 and 96 (inside the 64- and 128-wide tiles) take the wgmma backward where the default backward kernel is
    wgmma (sm_90, or no GPU visible, as here), grouped-query natively; elsewhere (mma) the research backward."""
    from iokernels.plan import Unsupported
    from iokernels.plan.fast_bwd import default_backward_kernel

    for q_heads, kv_heads in ((4, 4), (8, 2)):
        plan, expand = _route("bwd", "float16", q_heads, kv_heads, d=d)
        if default_backward_kernel() == "tma":
            assert (plan.schedule, expand, plan.bh_kv, plan.d) == ("fast", False, 2 * kv_heads, d)
            assert plan.stage("main").kernel == "flash_tma_bwd"
            assert dict(plan.stage("main").params)["HEAD_D_TILE"] == (64 if d <= 64 else 128)
        else:
            assert plan.schedule != "fast"
    with pytest.raises(Unsupported, match="sm_90 kernels"):  # deterministic=True: the mma kernels, d 64 and 128
        _route("bwd", "float16", 4, 4, deterministic=True, d=d)


def test_grouped_query_backward_is_native_where_the_plan_takes_kv_heads():
    from iokernels.plan import Unsupported, make_plan

    try:
        make_plan("flash", "fast", direction="bwd", N_q=300, N_k=200, d=64, dtype="float16", sram=227 * 1024,
                  batch=2, heads=8, kv_heads=2)
        native = True
    except Unsupported:
        native = False
    plan, expand = _route("bwd", "float16", 8, 2)
    assert plan.schedule == "fast" and expand is not native
    assert plan.bh_kv == (4 if native else 16) and plan.bh == 16
    for args in (("bwd", "float32", 8, 2), ("bwd", "float16", 8, 2, "standard"),
                 ("bwd", "float16", 8, 2, "flash", True)):  # research, standard, deterministic: expanded
        plan, expand = _route(*args)
        assert expand and plan.bh_kv == 16, args


def test_grouped_query_shapes_of_the_backward_are_checked():
    k = np.zeros((2, 2, 12, 64), np.float16)
    with pytest.raises(ValueError, match="shape mismatch"):
        iokernels.attention_backward(H, k, np.zeros((2, 1, 12, 64), np.float16), H, H, LSE)
    with pytest.raises(ValueError, match="shape mismatch: k"):
        iokernels.attention_backward(H, np.zeros((2, 3, 12, 64), np.float16), np.zeros((2, 3, 12, 64), np.float16),
                                     H, H, LSE)


def _standard_fwd_bytes(bh, n_q, n_k, d, e):
    return bh * (2 * n_q * n_k * e + 2 * n_q * 4 + n_q * d * e)  # S, P; m, l; O


@pytest.mark.parametrize("lead, n_q, n_k, d, dtype", [((2, 3), 1000, 300, 64, "float32"), ((5,), 129, 1023, 128,
                                                                                            "float16")])
def test_memory_needed_counts_the_plans_tensors(lead, n_q, n_k, d, dtype):
    e = np.dtype(dtype).itemsize
    bh = int(np.prod(lead))
    q_shape, k_shape = (*lead, n_q, d), (*lead, n_k, d)
    got = iokernels.memory_needed(q_shape, k_shape, dtype=dtype, algorithm="standard")
    assert got == _standard_fwd_bytes(bh, n_q, n_k, d, e)
    # flash: O and lse only (the tensor-core forward for float16, q_outer for float32: the same tensors)
    assert iokernels.memory_needed(q_shape, k_shape, dtype=dtype) == bh * (n_q * d * e + n_q * 4)
    # the flash backward: D, the float32 dQ accumulator, dQ, dK, dV
    want = bh * (n_q * 4 + n_q * d * 4 + n_q * d * e + 2 * n_k * d * e)
    assert iokernels.memory_needed(q_shape, k_shape, dtype=dtype, backward=True) == want
    # the standard backward reruns the forward, keeps its P and adds dP, dS, D, dQ, dK, dV: the larger of the two
    bwd = bh * (3 * n_q * n_k * e + n_q * 4 + n_q * d * e + 2 * n_k * d * e)
    assert iokernels.memory_needed(q_shape, k_shape, dtype=dtype, algorithm="standard", backward=True) == \
        max(bwd, _standard_fwd_bytes(bh, n_q, n_k, d, e))


def test_memory_needed_adds_the_expanded_kv_of_grouped_query_attention():
    native = iokernels.memory_needed((2, 8, 300, 64), (2, 2, 200, 64), dtype="float16")
    assert native == 16 * (300 * 64 * 2 + 300 * 4)
    expanded = iokernels.memory_needed((2, 8, 300, 64), (2, 2, 200, 64), dtype="float32")
    assert expanded == 16 * (300 * 64 * 4 + 300 * 4) + 2 * 16 * 200 * 64 * 4
    with pytest.raises(ValueError, match="unsupported dtype"):
        iokernels.memory_needed((1, 10, 64), dtype="int8")


@pytest.fixture
def fake_device(monkeypatch):
    """A GPU with 8 GB free of 80 GB, and a cupy that fails the moment the call uses it."""
    from iokernels.kernels import launch
    from iokernels.library import api

    monkeypatch.setattr(api, "require_cupy", lambda: TrippedCupy())
    monkeypatch.setattr(launch, "free_device_bytes", lambda: (8 * 1024**3, 80 * 1024**3))


def test_standard_attention_that_does_not_fit_fails_before_launch(fake_device):
    q = np.zeros((1, 65536, 64), np.float16)  # S and P: 8 GiB each
    need = iokernels.memory_needed(q.shape, dtype="float16", algorithm="standard") + 3 * q.nbytes
    with pytest.raises(iokernels.DeviceMemoryError, match=r"needs 16\.\d\d GB, device has 8\.00 GB free of 80\.00 GB") \
            as info:
        iokernels.attention(q, q, q, algorithm="standard")
    assert isinstance(info.value, MemoryError) and info.value.needed == need and "algorithm='flash'" in str(info.value)
    with pytest.raises(iokernels.DeviceMemoryError, match="needs 24"):  # P, dP and dS
        iokernels.attention_backward(q, q, q, q, q, np.zeros((1, 65536), np.float32), algorithm="standard")
    with pytest.raises(Launched):  # flash fits: the call goes on to upload the inputs
        iokernels.attention(q, q, q)
    with pytest.raises(Launched):
        iokernels.attention_backward(q, q, q, q, q, np.zeros((1, 65536), np.float32))


def test_import_iokernels_imports_neither_torch_nor_cupy():
    import subprocess
    import sys

    code = "import sys, iokernels, iokernels.cli; print(sorted({'torch', 'cupy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_iokernels_torch_without_torch_says_how_to_get_it():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import iokernels.torch\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "iokernels.torch needs PyTorch" in out and "pip install torch" in out


def test_graph_inside_count_io_is_refused_before_the_gpu():
    with iokernels.count_io(), pytest.raises(ValueError, match="graph=True runs the plain build"):
        iokernels.attention(H, H, H, algorithm="standard", graph=True)


# ---------------------------------------------------------------------------------------------
# the library's plumbing on the CPU: reshapes, grouped-query expansion and sums, the standard backward's
# chain, lse. cupy is replaced by numpy and each plan's run by the float64 reference of that plan.

def _reference_run(plan, inputs, scale=None, raw=None):
    from types import SimpleNamespace

    from iokernels import simulate
    from iokernels.kernels import launch
    from iokernels.simulate import reference

    f = {n: np.asarray(x, np.float64) for n, x in inputs.items()}
    kv = simulate.kv_rows(plan)  # native grouped-query attention: query head z reads K/V head z // group
    if plan.direction == "fwd":
        o, lse = reference.forward(f["Q"], f["K"][kv], f["V"][kv], scale, causal=plan.causal)
        out = {"O": o, "lse": lse} if plan.algorithm != "standard" else \
            {"O": o, "m": lse, "l": np.ones_like(lse), "P": reference.probabilities(f["Q"], f["K"], scale, plan.causal)}
    else:
        assert plan.algorithm != "standard" or "P" in inputs  # the chain passed the forward's P on
        out = simulate.reference_outputs(plan, f, scale)
    cast = {n: x.astype(launch.tensor_dtype(plan, n)) for n, x in out.items()}
    for name, x in cast.items():
        assert x.shape == launch.tensor_shape(plan, name), name
    return SimpleNamespace(buffers={**inputs, **cast}, raw=None)


@pytest.fixture
def reference_device(monkeypatch):
    from iokernels.kernels import launch
    from iokernels.library import api, fastpath

    monkeypatch.setattr(api, "require_cupy", lambda: NumpyCupy())
    monkeypatch.setattr(fastpath, "require_cupy", lambda: NumpyCupy())
    monkeypatch.setattr(launch, "free_device_bytes", lambda: (80 * 1024**3, 80 * 1024**3))
    monkeypatch.setattr(launch, "run_plan", _reference_run)


@pytest.mark.parametrize("dtype, d, algorithm, causal, kv_heads", [
    ("float16", 64, "flash", False, 2), ("float16", 128, "flash", True, 1), ("float32", 64, "flash", False, 3),
    ("float32", 32, "standard", False, 2), ("float16", 64, "standard", "top_left", 6),
    ("float32", 64, "flash", True, 1),
])
def test_library_plumbing_against_the_reference(reference_device, dtype, d, algorithm, causal, kv_heads):
    from iokernels.simulate import reference

    rng = np.random.default_rng(5)
    q, do = (rng.standard_normal((2, 6, 40, d)).astype(dtype) for _ in range(2))
    k, v = (rng.standard_normal((2, kv_heads, 33, d)).astype(dtype) for _ in range(2))
    o, lse = iokernels.attention(q, k, v, algorithm=algorithm, causal=causal, return_lse=True)
    dq, dk, dv = iokernels.attention_backward(q, k, v, o, do, lse, algorithm=algorithm, causal=causal)
    assert o.shape == q.shape and lse.shape == q.shape[:-1] and dq.shape == q.shape and dk.shape == dv.shape == k.shape
    assert o.dtype == dq.dtype == dk.dtype == np.dtype(dtype) and lse.dtype == np.float32
    group = 6 // kv_heads
    host = [x.astype(np.float64) for x in (q, k, v, do)]
    kx, vx = (np.repeat(x, group, axis=1) for x in host[1:3])
    want_o, want_lse = reference.forward(host[0], kx, vx, causal=causal)
    want_dq, dkx, dvx = reference.backward(host[0], kx, vx, host[3], causal=causal)
    wants = (want_dq, *(x.reshape(2, kv_heads, group, 33, d).sum(axis=2) for x in (dkx, dvx)))
    tol = 2e-3 if dtype == "float16" else 1e-6
    assert np.abs(o - want_o).max() < tol * np.abs(want_o).max()
    seen = np.isfinite(want_lse)
    assert np.array_equal(np.isfinite(lse), seen) and np.abs(lse[seen] - want_lse[seen]).max() < 1e-5
    for got, want in zip((dq, dk, dv), wants, strict=True):
        assert np.abs(got - want).max() < 2 * tol * np.abs(want).max()


@pytest.mark.parametrize("mask, error, message", [
    (np.ones((5, 7), dtype=np.int32), TypeError, "boolean or floating-point"),
    (np.ones((4, 7), dtype=bool), ValueError, "not broadcastable"),
    (np.full((5, 7), np.nan, dtype=np.float32), ValueError, "NaN"),
])
def test_bad_explicit_masks_are_refused_before_the_gpu(mask, error, message):
    q = np.zeros((2, 5, 16), dtype=np.float32)
    k = np.zeros((2, 7, 16), dtype=np.float32)
    with pytest.raises(error, match=message):
        iokernels.attention(q, k, k, mask=mask)
    with pytest.raises(error, match=message):
        iokernels.attention_backward(q, k, k, q, q, np.zeros((2, 5), np.float32), mask=mask)
    with pytest.raises(ValueError, match="deterministic"):
        iokernels.attention_backward(q, k, k, q, q, np.zeros((2, 5), np.float32), mask=np.ones((5, 7), bool),
                                     deterministic=True)


@pytest.mark.parametrize("direction, d, sram, want", [("fwd", 256, 100 * 1024, "flash/q_outer/fwd"),
                                                      ("bwd", 96, 96 * 1024, "flash/kv_outer/bwd"),
                                                      ("fwd", 96, 96 * 1024, "flash/fast/fwd")])
def test_an_m_too_small_for_the_tensor_core_tiles_takes_the_research_schedule(direction, d, sram, want):
    """With no schedule given, an explicit M (sram) that the tensor-core tiles do not fit runs the research schedule
    in that M; asked for by name, the tensor-core schedule still refuses."""
    from iokernels.library.api import choose_plan
    from iokernels.plan import SramTooSmall

    plan, _ = choose_plan(direction, "flash", None, 300, 200, d, "float16", (2, 4), sram, 1, "", False)
    assert plan.label == want and plan.smem_bytes <= sram
    with pytest.raises(SramTooSmall, match="smallest M that works"):
        choose_plan(direction, "flash", "fast", 300, 200, d, "float16", (2, 4), 16 * 1024, 1, "", False)
