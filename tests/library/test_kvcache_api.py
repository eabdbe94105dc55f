"""iokernels.attention_with_kvcache's checks, on the CPU: every argument a user can get wrong raises a clear error
before cupy or the GPU is touched (the arrays are stand-ins that report themselves as cupy arrays)."""

import numpy as np
import pytest

import iokernels
from iokernels.plan import Unsupported


class _Data:
    device_id = 0
    ptr = 0


class FakeCupyArray:
    """A numpy array that says it is a cupy array (its module), with the attributes the checks read."""

    __module__ = "cupy"

    def __init__(self, shape, dtype="float16", contiguous=True):
        self._a = np.zeros(shape, dtype=dtype)
        self.shape, self.dtype, self.ndim, self.strides = self._a.shape, self._a.dtype, self._a.ndim, self._a.strides
        self.flags = type("Flags", (), {"c_contiguous": contiguous})()
        self.data = _Data()


def _call(q=(2, 8, 1, 64), k=(2, 2, 512, 64), v=None, seqlens=None, table=None, new=None, **kw):
    arr = lambda s, **a: s if not isinstance(s, tuple) else FakeCupyArray(s, **a)  # noqa: E731
    appended = {} if new is None else {"k": arr(new[0]), "v": arr(new[1])}
    return iokernels.attention_with_kvcache(arr(q), arr(k), arr(k if v is None else v),
                                            cache_seqlens=None if seqlens is None else arr(seqlens, dtype="int32"),
                                            page_table=None if table is None else arr(table, dtype="int32"),
                                            **appended, **kw)


@pytest.mark.parametrize("kw, error, match", [
    (dict(q=np.zeros((2, 8, 1, 64), np.float16)), TypeError, "cupy array"),
    (dict(k=(2, 3, 512, 64)), ValueError, "divide"),
    (dict(k=(3, 2, 512, 64)), ValueError, "contiguous cache is"),
    (dict(v=(2, 2, 256, 64)), ValueError, "one 4-d shape"),
    (dict(q=(2, 8, 1, 60), k=(2, 2, 512, 60)), ValueError, "multiple of 8"),
    (dict(seqlens=(3,)), ValueError, "cache_seqlens must be int32"),
    (dict(k=(40, 2, 64, 64), table=(2, 8)), ValueError, "needs cache_seqlens"),
    (dict(k=(40, 2, 48, 64), table=(2, 8), seqlens=(2,)), ValueError, "page size"),
    (dict(k=(40, 2, 64, 64), table=(2,), seqlens=(2,)), ValueError, "page_table must be int32"),
    (dict(q=(2, 8, 4, 64), causal="top_left"), Unsupported, "bottom-right"),
    (dict(new=((2, 2, 3, 64), (2, 2, 3, 64))), ValueError, "needs cache_seqlens"),
    (dict(new=((2, 2, 3, 64), (2, 2, 4, 64)), seqlens=(2,)), ValueError, "k and v"),
    (dict(new=((2, 3, 3, 64), (2, 3, 3, 64)), seqlens=(2,)), ValueError, "k and v"),
    (dict(new=((2, 2, 513, 64), (2, 2, 513, 64)), seqlens=(2,)), ValueError, "513 keys to a cache of capacity 512"),
    (dict(num_splits=129), ValueError, "num_splits"),
    (dict(return_lse=1), TypeError, "return_lse"),
    (dict(scale=0.0), ValueError, "scale"),
])
def test_bad_calls_fail_before_the_gpu(kw, error, match):
    with pytest.raises(error, match=match):
        _call(**kw)


def test_float32_is_refused():
    with pytest.raises(TypeError, match="float16"):
        iokernels.attention_with_kvcache(FakeCupyArray((1, 2, 1, 64), "float32"),
                                         FakeCupyArray((1, 2, 64, 64), "float32"),
                                         FakeCupyArray((1, 2, 64, 64), "float32"))


def test_a_non_contiguous_array_is_refused():
    with pytest.raises(ValueError, match="C-contiguous"):
        iokernels.attention_with_kvcache(FakeCupyArray((1, 2, 1, 64)), FakeCupyArray((1, 2, 64, 64), contiguous=False),
                                         FakeCupyArray((1, 2, 64, 64)))
