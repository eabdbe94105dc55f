"""Document masking (FlexAttention's ``document_id[q] == document_id[kv]`` for packed documents) in the plans, the
model and the simulator (issue #22, first step; CPU only): a query sees the keys of its own document, with the causal
mask and a window when given. No kernel takes it yet: the launcher refuses it."""

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import Unsupported, key_block_ranges, make_plan, normalize_documents, visible_area
from iokernels.simulate import make_inputs, max_relative_error, reference_outputs, simulate

KB = 1024
DOCS = [(100, 1, 60, 139), (300,), (17, 17, 266), (150, 150)]


def _brute(lengths, causal, window):
    """Element visibility by the definition: the same document id, and j <= i (causal, N_q = N_k), and the window."""
    ids = np.repeat(np.arange(len(lengths)), lengths)
    n = len(ids)
    out = np.zeros((n, n), dtype=bool)
    for i in range(n):
        for j in range(n):
            ok = ids[i] == ids[j] and (not causal or j <= i)
            if window is not None:
                ok = ok and (window[0] is None or j >= i - window[0]) and (window[1] is None or j <= i + window[1])
            out[i, j] = ok
    return out


def test_normalize_documents():
    assert normalize_documents(None, 5, 5) is None and normalize_documents([5], 5, 5) is None
    assert normalize_documents([2, np.int64(3)], 5, 5) == (2, 3)
    for bad in ([2, 2], [0, 5], [2.5, 2.5], [True, 4], "ab", 5):
        with pytest.raises(ValueError, match="documents"):
            normalize_documents(bad, 5, 5)
    with pytest.raises(ValueError, match="N_q = N_k"):
        normalize_documents([2, 3], 5, 6)


@pytest.mark.parametrize("docs", DOCS)
@pytest.mark.parametrize("causal", ["", "bottom_right"])
@pytest.mark.parametrize("window", [None, (40, 0), (10, 25)])
def test_ranges_and_area_follow_the_definition(docs, causal, window):
    vis = _brute(docs, causal, window)
    n = len(vis)
    documents = normalize_documents(docs, n, n)
    assert visible_area(n, n, causal, window, documents) == int(vis.sum())
    br, bc = 32, 48
    for i, (a, b) in enumerate(key_block_ranges(n, n, br, bc, causal, window, documents)):
        rows = vis[i * br:(i + 1) * br]
        seen = [bool(rows[:, j * bc:(j + 1) * bc].any()) for j in range(-(-n // bc))]
        assert seen == [a <= j < b for j in range(len(seen))], (i, a, b, seen)


@pytest.mark.parametrize("algorithm, schedule, direction", [
    ("flash", "q_outer", "fwd"), ("flash", "kv_outer", "fwd"), ("flash", "kv_outer", "bwd"),
    ("two_pass", "store", "fwd"), ("two_pass", "recompute", "fwd"), ("standard", "default", "fwd"),
    ("flash", "fast", "fwd"), ("flash", "fast", "bwd")])
@pytest.mark.parametrize("causal, window", [("", None), ("bottom_right", None), ("top_left", (64, 0))])
def test_simulator_equals_model_and_reference(algorithm, schedule, direction, causal, window):
    """The simulator visits the pairs with a visible element; its bytes equal model.exact and its outputs the
    float64 reference under the documents' mask; fewer bytes than without the documents on the tiled schedules
    (without a window)."""
    docs = (100, 1, 60, 239)
    kw = dict(N_q=400, d=32 if schedule != "fast" else 64, dtype="float16" if schedule == "fast" else "float32",
              sram=(48 if schedule != "fast" else 227) * KB, direction=direction, causal=causal, window=window,
              batch=1, heads=2)
    plan = make_plan(algorithm, schedule, documents=docs, **kw)
    assert plan.documents == docs and plan.as_dict()["documents"] == list(docs)
    inputs = make_inputs(plan, seed=11)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    assert max_relative_error(result.outputs, reference_outputs(plan, inputs)) < 1e-10
    plain = model.predict(make_plan(algorithm, schedule, **kw)).total_bytes
    if algorithm == "standard":  # S computed in full: the bytes of the unmasked problem
        assert model.predict(plan).total_bytes == plain
    elif window is None:
        assert model.predict(plan).total_bytes < plain
    else:  # a 65-key window already skips most pairs: documents skip no more at large tiles
        assert model.predict(plan).total_bytes <= plain


def test_the_launcher_refuses_documents():
    plan = make_plan("flash", "fast", N_q=256, d=64, dtype="float16", sram=227 * KB, documents=(128, 128))
    with pytest.raises(Unsupported, match="document"):
        launch.run_plan(plan, {})
