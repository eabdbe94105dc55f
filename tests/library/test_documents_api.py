"""documents= on the library's calls, on the CPU: what a call with documents refuses before it reaches the GPU (the
options it does not take, shapes that do not add up, bad lengths), and the shapes it checks (grouped-query
attention's heads)."""

import numpy as np
import pytest

import iokernels
from iokernels.library.varlen import documents_shapes


def test_refuses_the_options_it_does_not_take():
    q = np.zeros((2, 100, 64), np.float16)
    for options, name in (({"window": (8, 0)}, "window"), ({"dropout": 0.1}, "dropout"),
                          ({"algorithm": "standard"}, "algorithm"), ({"schedule": "q_outer"}, "schedule"),
                          ({"graph": True}, "graph"), ({"mask": np.ones((100, 100), bool)}, "mask")):
        with pytest.raises(ValueError, match=f"not {name}"):
            iokernels.attention(q, q, q, documents=(40, 60), **options)
    with pytest.raises(ValueError, match="not deterministic"):
        iokernels.attention_backward(q, q, q, q, q, np.zeros((2, 100), np.float32), documents=(40, 60),
                                     deterministic=True)


def test_shapes():
    assert documents_shapes((2, 8, 300, 64), (2, 2, 300, 64), (2, 2, 300, 64), (100, 0, 200)) == (
        (100, 0, 200), 16, 4, 300, 64)
    assert documents_shapes((300, 64), (300, 64), (300, 64), [300])[1:3] == (1, 1)
    with pytest.raises(ValueError, match="N = 300"):
        documents_shapes((2, 8, 299, 64), (2, 2, 299, 64), (2, 2, 299, 64), (100, 0, 200))
    with pytest.raises(ValueError, match="dividing"):
        documents_shapes((2, 8, 300, 64), (2, 3, 300, 64), (2, 3, 300, 64), (300,))
    with pytest.raises(ValueError, match="leading dims"):
        documents_shapes((2, 8, 300, 64), (3, 8, 300, 64), (3, 8, 300, 64), (300,))
    with pytest.raises(ValueError, match="documents"):
        documents_shapes((300, 64), (300, 64), (300, 64), ())
    with pytest.raises(ValueError, match="documents"):
        documents_shapes((300, 64), (300, 64), (300, 64), (301, -1))


def test_documents_of_one_length_take_the_dense_path():
    """uniform_documents: more than one document, one length, K/V with q's heads (a view batches those documents);
    grouped-query heads, one document or lengths that differ keep the variable-length kernels."""
    from iokernels.library.varlen import uniform_documents

    assert uniform_documents((250,) * 4, 8, 8)
    assert not uniform_documents((250,) * 4, 8, 2)  # grouped-query: the documents of a K/V head are not a view's
    assert not uniform_documents((1000,), 8, 8)  # one document: no mask at all, and no batch to make
    assert not uniform_documents((250, 250, 500), 8, 8)
