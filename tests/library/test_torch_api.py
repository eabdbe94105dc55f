"""iokernels.torch rejects bad input before anything reaches the GPU (needs torch, not a GPU)."""

import pytest

torch = pytest.importorskip("torch")
itorch = pytest.importorskip("iokernels.torch")


def test_cpu_tensors_are_refused():
    q = torch.zeros(1, 16, 64)
    with pytest.raises(ValueError, match="is on cpu"):
        itorch.attention(q, q, q)


@pytest.mark.parametrize("q, k, message", [
    (torch.zeros(1, 16, 64, dtype=torch.int32), None, "unsupported dtype torch.int32"),
    (torch.zeros(1, 16, 64, dtype=torch.float64), None, "unsupported dtype torch.float64"),
    ([[0.0]], None, "must be a torch.Tensor"),
])
def test_bad_types_are_refused(q, k, message):
    with pytest.raises(TypeError, match=message):
        itorch.attention(q, q if k is None else k, q if k is None else k)


def test_the_options_cache_tells_true_from_one():
    """The front end keeps each call's checked options by their values, and True == 1 == 1.0 in Python: after
    scale=1 and causal=True are accepted, scale=True (not a number) is still refused, and so is causal=1.0."""
    q = torch.zeros(1, 16, 64)
    for kw in ({"scale": 1}, {"causal": True}):
        with pytest.raises(ValueError, match="is on cpu"):  # the options pass; the tensors do not
            itorch.attention(q, q, q, **kw)
    with pytest.raises(TypeError, match="scale"):
        itorch.attention(q, q, q, scale=True)
    with pytest.raises((TypeError, ValueError), match="causal"):
        itorch.attention(q, q, q, causal=1.0)


def test_a_scale_of_zero_or_less_is_refused():
    q = torch.zeros(1, 16, 64)
    for scale in (0.0, -1):
        with pytest.raises(ValueError, match="scale must be > 0"):
            itorch.attention(q, q, q, scale=scale)

