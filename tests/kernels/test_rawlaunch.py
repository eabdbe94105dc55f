"""Raw launches without a GPU: the parameter types of kernel arguments, and RawPlan.run's pointer list (inputs
in the plan's order, outputs, the one workspace block at aligned offsets, constants) and its allocations."""

import ctypes

import numpy as np
import pytest

from iokernels.kernels import rawlaunch


@pytest.mark.parametrize("value, ctype", [
    (np.int32(-3), ctypes.c_int32), (np.uint32(7), ctypes.c_uint32), (np.float32(0.5), ctypes.c_float),
    (np.uint64(2**63 + 1), ctypes.c_uint64), (np.int64(-2**40), ctypes.c_int64)])
def test_scalar_slots_keep_the_arguments_width_and_value(value, ctype):
    slot = rawlaunch.scalar_slot(value)
    assert type(slot) is ctype and slot.value == value.item()


def test_an_argument_of_no_kernel_type_is_refused():
    with pytest.raises(TypeError, match="no parameter type"):
        rawlaunch.scalar_slot(np.complex64(1))


class _Stage:
    device = 0

    def __init__(self):
        self.calls = []

    def launch(self, pointers, stream, dropout):
        self.calls.append((list(pointers), stream, dropout))


def test_run_allocates_outputs_and_one_aligned_workspace_block():
    stage = _Stage()
    f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
    raw = rawlaunch.RawPlan(names=("K", "Q", "O", "D", "dQacc", "block_mask"), inputs=(1, 0),
                         allocations=(((2, 3), f16),), workspace=((0, 10, f32), (256, 70, f32)), workspace_bytes=768,
                         constants=("grid",), constant_pointers=(9000,), stages=(stage,))
    made = []

    def allocate(position, shape, dtype):
        made.append((position, shape, dtype))
        return f"array{len(made)}", 1000 * len(made)

    out = raw.run((11, 22), allocate, stream=5, dropout="drop")
    assert out == ["array1"]  # the outputs only
    assert made == [(0, (2, 3), f16), (None, (768,), np.dtype(np.uint8))]
    assert stage.calls == [([22, 11, 1000, 2000, 2256, 9000], 5, "drop")]


def test_poisoning_fills_every_output_and_workspace_tensor(monkeypatch):
    fills = []
    monkeypatch.setattr(rawlaunch, "fill_nan",
                        lambda pointer, dtype, count, stream, device: fills.append((pointer, count)))
    f32 = np.dtype(np.float32)
    raw = rawlaunch.RawPlan(("Q", "O", "D"), (0,), (((4, 2), f32),), ((0, 3, f32),), 256, (), (), (_Stage(),))
    raw.run((1,), lambda position, shape, dtype: (None, 500 if position == 0 else 700), 0, None, poison=True)
    assert fills == [(500, 8), (700, 3)]


def test_the_dependent_launch_configuration_has_cudas_layout():
    """cuLaunchKernelEx's CUlaunchConfig (cuda.h): six grid and block extents and the shared memory (28 bytes), the
    stream at 32, the attributes at 40, their count at 48 (56 bytes); a CUlaunchAttribute is its id, 4 bytes of
    padding and a 64-byte value (72 bytes); programmatic stream serialization is attribute 6, value 1."""
    from iokernels.kernels import driver

    assert ctypes.sizeof(driver.LaunchAttribute) == 72 and driver.LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(driver.LaunchConfig) == 56
    assert (driver.LaunchConfig.hStream.offset, driver.LaunchConfig.attrs.offset,
            driver.LaunchConfig.numAttrs.offset) == (32, 40, 48)
    config = driver.dependent_launch_config((3, 2), (256,), 4096)
    assert (config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX, config.blockDimY,
            config.blockDimZ, config.sharedMemBytes, config.numAttrs) == (3, 2, 1, 256, 1, 1, 4096, 1)
    assert config.attrs[0].id == 6 and config.attrs[0].value[0] == 1


def test_a_stage_without_the_driver_launches_through_cupy(monkeypatch):
    """Without libcuda (here) a dependent stage keeps cupy's launch: no configuration, no driver launcher."""
    monkeypatch.setattr(rawlaunch, "driver", lambda: None)
    stage = rawlaunch.RawStage(object(), 0, (1, 1, 1), (256,), 0, [np.int32(1)], False, dependent=True)
    assert stage.config is None and stage.launcher is None


def test_a_plain_stage_launches_through_cupys_binding(monkeypatch):
    """With the driver library and cupy's binding of cuLaunchKernel, a plain stage calls the binding with its grid,
    block, shared bytes, the stream and its parameter block's address; a dependent (PDL) stage keeps ctypes'
    cuLaunchKernelEx. A binding error with the CUresult of a thread without a context binds the device's and launches
    again; any other is raised with its code."""
    from iokernels.kernels import driver as drv

    class Lib:
        cuLaunchKernel = cuLaunchKernelEx = staticmethod(lambda *a: 0)

    class CudaDriverError(RuntimeError):
        def __init__(self, status):
            super().__init__(f"status {status}")
            self.status = status

    calls, errors, bound = [], [], []

    def binding(*args):
        calls.append(args)
        if errors:
            raise CudaDriverError(errors.pop())

    class Function:
        class kernel:
            ptr = 4242

    monkeypatch.setattr(rawlaunch, "driver", lambda: Lib)
    monkeypatch.setattr(drv, "driver", lambda: None)
    monkeypatch.setattr(rawlaunch, "cupy_launch_kernel", lambda: binding)
    monkeypatch.setattr(rawlaunch, "make_current", lambda device: bound.append(device))
    stage = rawlaunch.RawStage(Function, 3, (5, 2), (384,), 1000, [0, np.int32(7)], False)
    assert stage.binding is binding
    stage.launch([0xABC0], stream=77)
    assert calls == [(4242, 5, 2, 1, 384, 1, 1, 1000, 77, ctypes.addressof(stage.params), 0)]
    errors.append(drv.CUDA_ERROR_INVALID_CONTEXT)
    stage.launch([0xABC0], stream=77)
    assert bound == [3] and len(calls) == 3
    errors.append(700)
    with pytest.raises(drv.CudaError, match="CUDA error 700"):
        stage.launch([0xABC0], stream=77)
    dependent = rawlaunch.RawStage(Function, 0, (1,), (128,), 0, [np.int32(1)], False, dependent=True)
    assert dependent.binding is None and dependent.config is not None
