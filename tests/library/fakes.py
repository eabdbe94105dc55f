"""Stand-ins for the library's tests without a GPU."""

import numpy as np


class NumpyCupy:
    """The cupy calls the library makes on its arrays, on numpy arrays."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def asnumpy(x):
        return np.asarray(x)

    @staticmethod
    def get_default_memory_pool():
        return type("Pool", (), {"used_bytes": lambda self: 0})()


class Launched(Exception):
    """A :class:`TrippedCupy` was touched: the call got past its checks."""


class TrippedCupy:
    """A cupy that fails the moment a call uses it (tests that bad input is refused before the GPU)."""

    def __getattr__(self, name):
        raise Launched(name)

