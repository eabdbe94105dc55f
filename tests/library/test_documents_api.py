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


class _OnDevice(np.ndarray):
    """A numpy array that names a device as a cupy array's ``data.device_id`` does (the offsets' device, faked)."""

    @property
    def data(self):
        return type("Data", (), {"device_id": 0})


def test_documents_of_one_length_go_to_the_dense_call(monkeypatch):
    """attention_documents and its backward hand documents of one length to ``dense`` (the library passes its dense
    calls) on the arrays viewed as (..., D, L, d), lse as (..., D, L), and give the results back in the callers'
    shapes; grouped-query heads and unequal lengths go to the variable-length kernels (both faked: no GPU here)."""
    from iokernels.library import varlen

    monkeypatch.setattr(varlen, "check_in_place", lambda *args, **kwargs: None)
    monkeypatch.setattr(varlen, "document_offsets", lambda documents, device: None)
    calls = []

    def dense(*arrays, **options):
        calls.append(("dense", [a.shape for a in arrays], options))
        if len(arrays) == 3:  # forward: O (and lse)
            o = np.zeros(arrays[0].shape, np.float16)
            return (o, np.zeros(arrays[0].shape[:-1], np.float32)) if options["return_lse"] else o
        return tuple(np.zeros(a.shape, np.float16) for a in arrays[:3])

    def varlen_call(*arrays, **options):
        calls.append(("varlen", [getattr(a, "shape", None) for a in arrays], options))
        return np.zeros(arrays[0].shape, np.float16)

    monkeypatch.setattr(varlen, "attention_varlen", varlen_call)
    q = np.zeros((2, 3, 1000, 64), np.float16).view(_OnDevice)
    o, lse = varlen.attention_documents(q, q, q, (250,) * 4, causal=True, scale=0.5, return_lse=True, dense=dense)
    assert o.shape == q.shape and lse.shape == q.shape[:-1]
    assert calls[-1][0] == "dense" and calls[-1][1] == [(2, 3, 4, 250, 64)] * 3
    assert calls[-1][2]["causal"] is True and calls[-1][2]["scale"] == 0.5
    grads = varlen.attention_documents_backward(q, q, q, q, q, np.zeros((2, 3, 1000), np.float32), (250,) * 4,
                                                dense=dense)
    assert [g.shape for g in grads] == [q.shape] * 3
    assert calls[-1][1] == [(2, 3, 4, 250, 64)] * 5 + [(2, 3, 4, 250)]
    for k, documents in ((np.zeros((2, 1, 1000, 64), np.float16).view(_OnDevice), (250,) * 4), (q, (500, 250, 250))):
        varlen.attention_documents(q, k, k, documents, dense=dense)
        assert calls[-1][0] == "varlen"
