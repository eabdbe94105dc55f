"""A sliding window (left, right), FlashAttention's ``window_size``, in the plans, the model and the simulator
(issue #22): key j is visible to query i iff i + o − left <= j <= i + o + right, o = N_k − N_q, alone or with the
causal mask. flash/fast's tma kernels take it as two offsets; the research kernels do not (the launcher refuses)."""

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import (
    WINDOW_KERNELS,
    Unsupported,
    key_block_ranges,
    make_plan,
    normalize_window,
    visible_area,
    visible_key_blocks,
    with_window,
)
from iokernels.plan.fast import make_fast_plan
from iokernels.simulate import make_inputs, max_relative_error, reference_outputs, simulate

KB = 1024
WINDOWS = [(64, 32), (None, 5), (100, None), (0, 0), (1000, 1000)]


def _brute(n_q, n_k, causal, window):
    """Element visibility by the definition, one element at a time."""
    off_c = n_k - n_q if causal == "bottom_right" else 0
    out = np.zeros((n_q, n_k), dtype=bool)
    for i in range(n_q):
        for j in range(n_k):
            ok = not causal or j <= i + off_c
            if window is not None:
                left, right, o = *window, n_k - n_q
                ok = ok and (left is None or j >= i + o - left) and (right is None or j <= i + o + right)
            out[i, j] = ok
    return out


@pytest.mark.parametrize("window, want", [(None, None), ((None, None), None), ((3, None), (3, None)),
                                          ([0, 7], (0, 7)), ((np.int64(2), 1), (2, 1))])
def test_normalize_window(window, want):
    assert normalize_window(window) == want


@pytest.mark.parametrize("window", [(1,), (1, 2, 3), (-2, 0), (0, -2), (1.5, 0), (True, 0), "ab", 3])
def test_bad_windows_are_refused(window):
    with pytest.raises(ValueError, match="window"):
        normalize_window(window)


@pytest.mark.parametrize("n_q, n_k, br, bc", [(37, 53, 8, 16), (53, 37, 16, 8), (64, 64, 16, 16), (1, 90, 4, 8)])
@pytest.mark.parametrize("causal", ["", "bottom_right", "top_left"])
@pytest.mark.parametrize("window", [None, *WINDOWS, (3, 2)])
def test_ranges_and_area_follow_the_definition(n_q, n_k, br, bc, causal, window):
    """A query block's key-block range holds exactly the blocks with an element visible to one of its rows, and
    visible_area counts the visible elements."""
    vis = _brute(n_q, n_k, causal, normalize_window(window))
    assert visible_area(n_q, n_k, causal, normalize_window(window)) == int(vis.sum())
    ranges = key_block_ranges(n_q, n_k, br, bc, causal, normalize_window(window))
    for i, (a, b) in enumerate(ranges):
        rows = vis[i * br:(i + 1) * br]
        seen = [bool(rows[:, j * bc:(j + 1) * bc].any()) for j in range(-(-n_k // bc))]
        assert seen == [a <= j < b for j in range(len(seen))], (i, a, b, seen)
    if window is None:  # causal alone: the prefixes of visible_key_blocks, so causal bytes do not change
        assert ranges == [(0, v) if v else (0, 0) for v in visible_key_blocks(n_q, n_k, br, bc, causal)]


@pytest.mark.parametrize("algorithm, schedule, direction", [
    ("flash", "q_outer", "fwd"), ("flash", "kv_outer", "fwd"), ("flash", "kv_outer", "bwd"),
    ("two_pass", "store", "fwd"), ("two_pass", "recompute", "fwd"), ("standard", "default", "fwd"),
    ("standard", "default", "bwd")])
@pytest.mark.parametrize("causal", ["", "bottom_right", "top_left"])
@pytest.mark.parametrize("window", WINDOWS)
def test_simulator_equals_model_and_reference(algorithm, schedule, direction, causal, window):
    """The simulator skips the pairs with no visible element and masks the rest; its bytes equal model.exact and
    its outputs the float64 reference with the window's mask; the model's FLOPs are those of the visible area."""
    plan = make_plan(algorithm, schedule, N_q=300, N_k=500, d=32, sram=48 * KB, direction=direction, causal=causal,
                     window=window, batch=1, heads=2)
    assert plan.window == normalize_window(window) and plan.as_dict()["window"] == list(plan.window)
    inputs = make_inputs(plan, seed=7)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    assert max_relative_error(result.outputs, reference_outputs(plan, inputs)) < 1e-10
    area = visible_area(plan.N_q, plan.N_k, plan.causal, plan.window)
    unmasked = model.predict(make_plan(algorithm, schedule, N_q=300, N_k=500, d=32, sram=48 * KB,
                                       direction=direction, batch=1, heads=2)).flops
    assert model.predict(plan).flops * (300 * 500) == unmasked * area


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("window", [(64, 32), (None, 5)])
def test_fast_plans_with_grouped_query(direction, window):
    plan = make_plan("flash", "fast", N_q=300, N_k=500, d=64, dtype="float16", sram=227 * KB, direction=direction,
                     causal="bottom_right", window=window, heads=4, kv_heads=2)
    inputs = make_inputs(plan, seed=3)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    assert max_relative_error(result.outputs, reference_outputs(plan, inputs)) < 1e-10


def test_a_window_saves_bytes_and_the_launcher_refuses_it_on_a_research_kernel():
    """A narrow window visits fewer pairs than causal (fewer bytes); the research kernels take no window: launching
    such a plan raises Unsupported before anything touches a GPU."""
    kw = dict(N_q=4096, d=64, sram=96 * KB, causal=True)
    causal = model.predict(make_plan("flash", "q_outer", **kw)).total_bytes
    window = make_plan("flash", "q_outer", window=(256, 0), **kw)
    assert model.predict(window).total_bytes < causal / 4
    with pytest.raises(Unsupported, match="sliding window"):
        launch.run_plan(window, {})


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_the_tma_kernels_take_the_band_as_two_offsets(direction):
    """flash/fast's main stage carries WINDOW and its kernel gets (lo, hi): query i sees keys i + lo .. i + hi.
    N_q 300, N_k 500 (o = 200), window (64, 32) and bottom-right causal (hi <= 200): lo = 136, hi = 200; a side left
    unbounded is ±2^30; top-left causal alone caps hi at 0."""
    def band(**kw):
        plan = make_plan("flash", "fast", N_q=300, N_k=500, d=64, dtype="float16", sram=227 * KB,
                         direction=direction, **kw)
        assert plan.stage("main").kernel in WINDOW_KERNELS and dict(plan.stage("main").params)["WINDOW"] == 1
        layout, _ = launch.stage_arg_layout(plan, plan.stage("main"), 0.125)
        if layout[-1] == "work":  # (the backward's list of items comes last)
            layout = layout[:-1]
        return tuple(int(x) for x in layout[-2:])

    assert band(window=(64, 32), causal="bottom_right") == (136, 200)
    assert band(window=(64, 32)) == (136, 232)
    assert band(window=(None, 7)) == (-(1 << 30), 207)
    assert band(window=(10, -1), causal="top_left") == (190, 0)
    # a side past any N is unbounded: clamped to ±2^30, never wrapping in the kernels' int32 sums
    assert band(window=(2**31 - 1, 2**40)) == (-(1 << 30), 1 << 30)
    assert band(window=(0, 0)) == (200, 200)  # (a zero offset is a bound, not "none")


def test_a_window_on_another_fast_kernel_is_refused_and_minus_one_is_unbounded():
    with pytest.raises(Unsupported, match="tma kernels"):
        with_window(make_fast_plan(N_q=256, d=64, dtype="float16", kernel="wgmma"), (16, 16))
    assert normalize_window((-1, 5)) == (None, 5) and normalize_window((-1, -1)) is None
    with pytest.raises(ValueError, match="window left"):
        normalize_window((-2, 5))
