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
