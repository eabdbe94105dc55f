import pytest


def pytest_collection_modifyitems(config, items):
    """Tests under tests/gpu/ get the ``gpu`` marker and skip, with the reason, without a device."""
    from iokernels.model.specs import current_device_spec

    has_gpu = current_device_spec() is not None
    skip = pytest.mark.skip(reason="needs a CUDA device and cupy (none found)")
    for item in items:
        if "/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not has_gpu:
                item.add_marker(skip)
