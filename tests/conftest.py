import pytest

# the slowest CPU tests (the NVRTC compiles, gemm.cu's instances the longest: up to 20 s each on CI's cores), run first
# so that pytest-xdist's workers do not end on one of them while the other waits
SLOW_FIRST = ("tests/kernels/test_compile.py::test_compiles_in_both_builds_without_spills[gemm.cu",
              "tests/kernels/test_compile.py::", "tests/cli/test_cli.py::test_compare_headline",
              "tests/plan/test_fuzz.py::")


def _slowness(item) -> int:
    for rank, prefix in enumerate(SLOW_FIRST):
        if item.nodeid.startswith(prefix):
            return rank
    return len(SLOW_FIRST)


def pytest_collection_modifyitems(config, items):
    """Tests under tests/gpu/ get the ``gpu`` marker and skip, with the reason, without a device. The slowest CPU tests
    are moved to the front (:data:`SLOW_FIRST`, in that order; the rest keep theirs)."""
    from iokernels.model.specs import current_device_spec

    items.sort(key=_slowness)

    has_gpu = current_device_spec() is not None
    skip = pytest.mark.skip(reason="needs a CUDA device and cupy (none found)")
    for item in items:
        if "/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not has_gpu:
                item.add_marker(skip)
