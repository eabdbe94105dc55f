"""Bad input to the library fails before anything reaches the GPU (runs without one)."""

import numpy as np
import pytest

import iokernels

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

    from iokernels.api import _check, _kv_group

    q = np.zeros((2, 6, 10, 64), np.float16)
    k = v = np.zeros((2, 2, 12, 64), np.float16)
    assert _kv_group(q, k, v) == 3
    assert _check({"q": q, "k": k, "v": v}, {"q": "q", "k": "k", "v": "k"}, 3)[2:] == ((2, 6), 10, 12, 64)
    assert _kv_group(q, np.zeros((2, 4, 12, 64), np.float16), np.zeros((2, 4, 12, 64), np.float16)) == 1
    with pytest.raises(ValueError, match="shape mismatch"):
        _check({"q": q, "k": np.zeros((2, 4, 12, 64), np.float16), "v": np.zeros((2, 4, 12, 64), np.float16)},
               {"q": "q", "k": "k", "v": "k"}, 1)
