"""TMA on the GPU (sm_90 only): a tensor map from kernels/tensormap.py and the loads and barriers of
kernels/tma.cuh bring a (rows x d) tile of one head into shared memory in wg.cuh's 128-byte-swizzled slab
layout, rows past the head's N zero-filled (tests/kernels/tma_probe.cu, launched on raw addresses)."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from iokernels.kernels import nvrtc, rawlaunch, tensormap  # noqa: E402

from ..kernels.test_tma import probe_source  # noqa: E402


def _swizzled(x: np.ndarray, rows: int, d: int) -> np.ndarray:
    """Host model of the tile: element (r, c) at wg.cuh's wg_off(r, c), rows past x's zero."""
    out = np.zeros(rows * d, x.dtype)
    for r in range(min(rows, x.shape[0])):
        for c in range(d):
            out[(c >> 6) * rows * 64 + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7)] = x[r, c]
    return out


@pytest.mark.parametrize("rows, d, r0, z", [(64, 64, 0, 0), (128, 128, 150, 2), (64, 128, 199, 1)])
def test_tma_loads_a_swizzled_tile_of_one_head(tmp_path, rows, d, r0, z):
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("TMA kernels are built for sm_90a")
    bh, n = 3, 200
    x = cp.random.default_rng(0).standard_normal((bh, n, d), dtype=cp.float32).astype(cp.float16)
    cubin = tmp_path / "probe.cubin"
    cubin.write_bytes(nvrtc.compile_to_cubin(probe_source(rows, d), arch="sm_90a", name="tma_probe.cu").cubin)
    fn = cp.RawModule(path=str(cubin)).get_function("tma_probe")
    out = cp.full(rows * d, 0xFFFF, dtype=cp.uint16)  # NaN bits: an element TMA never wrote shows
    the_map = tensormap.attention_map(x.data.ptr, "float16", bh, n, d, rows)
    stage = rawlaunch.RawStage(fn, cp.cuda.Device().id, (1,), (128,), rows * d * 2,
                               [the_map, 0, np.int32(r0), np.int32(z)], dropout=False)
    stage.launch([out.data.ptr], cp.cuda.get_current_stream().ptr)
    cp.cuda.get_current_stream().synchronize()
    want = _swizzled(cp.asnumpy(x[z, r0:]).view(np.uint16), rows, d)
    assert np.array_equal(cp.asnumpy(out), want)


def test_a_map_encodes_in_a_thread_without_a_context():
    """A thread that never called the CUDA runtime has no current context (autograd's backward worker, before its
    first call): cuTensorMapEncodeTiled answers CUDA_ERROR_INVALID_CONTEXT there, and encode_tiled binds the
    device's primary context and encodes again, giving the map the main thread gets."""
    import threading

    x = cp.zeros((2, 256, 64), dtype=cp.float16)
    want = tensormap.attention_map(x.data.ptr, "float16", 2, 256, 64, 128)
    got: list = []

    def worker() -> None:
        try:
            got.append(tensormap.attention_map(x.data.ptr, "float16", 2, 256, 64, 128))
        except Exception as exc:  # the failure, reported by the assertion below
            got.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert got == [want]


def test_a_nan_fill_runs_in_a_thread_without_a_context():
    """The debug poisoning (rawlaunch.fill_nan, the raw driver's memset) binds the device's primary context where the
    thread has none, as the launches do: a torch backward's first call in autograd's worker failed with CUDA error
    201 under IOKERNELS_DEBUG_POISON before."""
    import threading

    x = cp.zeros(1000, dtype=cp.float16)
    device = cp.cuda.Device().id
    errors: list = []

    def worker() -> None:
        try:
            rawlaunch.fill_nan(x.data.ptr, np.dtype(np.float16), x.size, 0, device)
            cp.cuda.runtime.deviceSynchronize()
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert errors == [] and bool(cp.isnan(x).all())

