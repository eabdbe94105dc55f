"""The sliding window through the library, without a GPU: bad windows fail before the GPU, a window plans the
tensor-core tma kernels or is refused (never run unmasked, never handed to a research schedule), and
memory_needed takes it."""

import numpy as np
import pytest

import iokernels
from iokernels.kernels import launch
from iokernels.library import api
from iokernels.library.api import choose_plan
from iokernels.library.memory import needed_bytes
from iokernels.plan import SramTooSmall, Unsupported, make_plan
from iokernels.plan.masks import pattern

from .fakes import Launched, TrippedCupy

H = np.zeros((2, 4, 10, 64), np.float16)
LSE = np.zeros((2, 4, 10), np.float32)
TENSOR_CORE = "a sliding window runs on the tensor-core flash path only"


@pytest.fixture
def fake_device(monkeypatch):
    """A GPU with 80 GB free, and a cupy that fails the moment a call uses it."""
    monkeypatch.setattr(api, "require_cupy", lambda: TrippedCupy())
    monkeypatch.setattr(launch, "free_device_bytes", lambda: (80 * 1024**3, 80 * 1024**3))


BAD_WINDOWS = [(1,), (1, 2, 3), "12", 128, (-2, 0), (0, -5), (1.5, 2), (True, 0), (0, False), ("1", 2), {1: 2}]


@pytest.mark.parametrize("window", BAD_WINDOWS, ids=repr)
def test_bad_windows_fail_before_the_gpu(fake_device, window):
    with pytest.raises(ValueError, match="window"):
        iokernels.attention(H, H, H, window=window)
    with pytest.raises(ValueError, match="window"):
        iokernels.attention_backward(H, H, H, H, H, LSE, window=window)
    with pytest.raises(ValueError, match="window"):
        iokernels.memory_needed(H.shape, window=window)


def test_a_good_window_gets_past_the_checks(fake_device):
    """The same call as above with a valid window reaches the device (the fake cupy), forward and backward."""
    for window in ((3, 4), [3, 4], (None, 0), (-1, 0), (np.int64(5), None)):
        with pytest.raises(Launched):
            iokernels.attention(H, H, H, window=window)
        with pytest.raises(Launched):
            iokernels.attention_backward(H, H, H, H, H, LSE, window=window)


@pytest.mark.parametrize("kwargs, message", [
    ({"window": (8, 8), "algorithm": "standard"}, "standard has no kernel"),
    ({"window": (8, 8), "algorithm": "two_pass"}, "two_pass has no kernel"),
    ({"window": (8, 8), "schedule": "q_outer"}, "flash/q_outer has no kernel"),
    ({"window": (8, 8), "schedule": "kv_outer"}, "flash/kv_outer has no kernel"),
    ({"window": (8, 0), "causal": True, "algorithm": "standard"}, "standard has no kernel"),
    ({"window": (8, 8), "block_mask": pattern("local", 0.5, n_q=10, n_k=10)}, "block"),
    ({"window": (8, 8), "mask": np.ones((10, 10), bool)}, "mask"),
])
def test_what_no_kernel_windows_is_refused_before_the_gpu(fake_device, kwargs, message):
    with pytest.raises(Unsupported, match=message) as info:
        iokernels.attention(H, H, H, **kwargs)
    assert TENSOR_CORE in str(info.value)


def test_float32_with_a_window_is_refused_clearly(fake_device):
    q = H.astype(np.float32)
    for call in (lambda: iokernels.attention(q, q, q, window=(16, 16)),
                 lambda: iokernels.attention_backward(q, q, q, q, q, LSE, window=(16, 16)),
                 lambda: iokernels.memory_needed(q.shape, dtype="float32", window=(16, 16)),
                 lambda: iokernels.memory_needed(q.shape, dtype="float32", window=(16, 16), backward=True)):
        with pytest.raises(Unsupported, match=f"{TENSOR_CORE}.*float16 or bfloat16.*got float32"):
            call()
    assert isinstance(Unsupported("x"), ValueError)  # callers catching ValueError see it too


def test_standard_backward_with_a_window_is_refused(fake_device):
    with pytest.raises(Unsupported, match="standard has no kernel"):
        iokernels.attention_backward(H, H, H, H, H, LSE, algorithm="standard", window=(3, 3))
    with pytest.raises(Unsupported, match="standard has no kernel"):
        iokernels.memory_needed(H.shape, algorithm="standard", backward=True, window=(3, 3))


def test_deterministic_backward_with_a_window_is_refused(fake_device):
    with pytest.raises(ValueError, match="deterministic=True has no sliding-window kernel"):
        iokernels.attention_backward(H, H, H, H, H, LSE, window=(3, 3), deterministic=True)
    with pytest.raises(Unsupported, match="deterministic=True has no kernel"):
        choose_plan("bwd", "flash", None, 10, 10, 64, "float16", (2, 4), None, 1, "", True, window=(3, 3))


def _window_plan(direction, n_q=300, n_k=200, d=64, dtype="float16", q_heads=4, kv_heads=4, causal="",
                 window=(30, 10), sram=None):
    return choose_plan(direction, "flash", None, n_q, n_k, d, dtype, (2, q_heads), sram, q_heads // kv_heads, causal,
                       window=window)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("d, dtype, causal, kv_heads, window", [
    (64, "float16", "", 4, (30, 10)), (128, "bfloat16", "bottom_right", 2, (100, None)),
    (256, "float16", "top_left", 4, (None, 0)), (96, "bfloat16", "", 1, (0, 300)), (40, "float16", "", 4, (0, 0)),
])
def test_a_window_plans_the_tma_kernels(direction, d, dtype, causal, kv_heads, window):
    """flash with no schedule takes "fast" with the tma kernel and WINDOW set, grouped-query natively (no GPU: the
    H200's kernels, sm_90)."""
    plan, expand = _window_plan(direction, d=d, dtype=dtype, kv_heads=kv_heads, causal=causal, window=window)
    assert plan.schedule == "fast" and plan.window == window and plan.causal == causal and not expand
    main = plan.stage("main")
    assert main.kernel in ("flash_tma_fwd", "flash_tma_bwd", "flash_tma_bwd_wide") and dict(main.params)["WINDOW"] == 1
    assert plan.bh == 8 and plan.bh_kv == 2 * kv_heads


def test_without_a_window_the_plan_has_none():
    for direction in ("fwd", "bwd"):
        plan, _ = _window_plan(direction, window=None)
        assert plan.window is None and "WINDOW" not in dict(plan.stage("main").params)


def test_a_window_never_falls_back_to_a_research_schedule():
    """An M too small for the tma tiles: without a window flash runs the research schedule in that M; with one
    the call is refused (a research plan would be refused at launch, or worse, run unmasked)."""
    small = 64 * 1024
    plan, _ = _window_plan("fwd", d=256, window=None, sram=small)
    assert plan.schedule == "q_outer"
    with pytest.raises(SramTooSmall):
        _window_plan("fwd", d=256, sram=small)


def test_on_a_gpu_without_the_tma_kernels_a_window_is_refused(monkeypatch):
    """Elsewhere than sm_90 the tensor-core kernels are mma.sync ones, which take no window: refused, not run on
    "q_outer"/"kv_outer"."""
    from iokernels.plan import fast, fast_bwd

    monkeypatch.setattr(fast, "default_kernel", lambda: "mma")
    monkeypatch.setattr(fast_bwd, "default_kernel", lambda: "mma")
    for direction in ("fwd", "bwd"):
        assert _window_plan(direction, window=None)[0].schedule == "fast"  # mma: fine without a window
        with pytest.raises(Unsupported, match=TENSOR_CORE):
            _window_plan(direction)


@pytest.mark.parametrize("backward", [False, True])
def test_memory_needed_takes_a_window_without_a_gpu(backward):
    direction = "bwd" if backward else "fwd"
    got = iokernels.memory_needed((2, 4, 300, 64), (2, 4, 200, 64), window=(30, 10), causal=True, backward=backward)
    plan = make_plan("flash", "fast", N_q=300, N_k=200, d=64, dtype="float16", sram=227 * 1024, batch=8,
                     direction=direction, causal=True, window=(30, 10))
    assert got == needed_bytes([plan], False, 1) > 0
    assert iokernels.memory_needed((2, 4, 300, 64), window=(-1, -1), backward=backward) == \
        iokernels.memory_needed((2, 4, 300, 64), backward=backward)
