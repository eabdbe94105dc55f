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



# the torch front ends' fast path without a GPU: torch_ops.as_cupy's cupy calls and a signature's prepared launches


class RawPlan:
    """The prepared launches of one signature (kernels.rawlaunch.RawPlan's run): ``allocations`` the (shape, dtype) of
    each output; records the addresses each run is given."""

    def __init__(self, allocations):
        self.allocations, self.given = tuple(allocations), []

    def run(self, given, allocate, stream, dropout, poison):
        self.given.append(given)
        return [allocate(i, shape, dtype)[0] for i, (shape, dtype) in enumerate(self.allocations)]


class CupyView:
    """What torch_ops.as_cupy builds (a cupy array on a tensor's memory), recorded."""

    def __init__(self, shape, dtype, memptr, strides):
        self.shape, self.dtype, self.ptr, self.strides = shape, dtype, memptr[0], strides


class ViewCupy:
    """The cupy calls as_cupy makes."""

    dtype = staticmethod(np.dtype)
    ndarray = CupyView
    cuda = type("cuda", (), {"UnownedMemory": staticmethod(lambda ptr, size, owner, device: (ptr, size)),
                             "MemoryPointer": staticmethod(lambda memory, offset: memory)})


class PassAllocator:
    """torch_stream's allocator: outputs handed back as allocated."""

    def tensor(self, x, dtype):
        return x
