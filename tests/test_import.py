import subprocess
import sys

import pytest


def test_import_needs_neither_cupy_nor_a_gpu():
    # cupy blocked: the package, the model, the simulator and the CLI still import
    code = ("import sys; sys.modules['cupy'] = None\n"
            "import iokernels, iokernels.model, iokernels.simulate, iokernels.cli, iokernels.kernels\n"
            "from iokernels.kernels.runtime import require_cupy\n"
            "try:\n    require_cupy()\nexcept RuntimeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "cupy is not installed" in out and "iokernels[cuda13]" in out


def test_require_cupy_without_a_device():
    try:
        import cupy  # noqa: F401
    except ImportError:
        pytest.skip("cupy not installed: the no-cupy path is covered above")
    from iokernels.kernels.runtime import require_cupy
    from iokernels.model.specs import current_device_spec

    if current_device_spec() is None:
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            require_cupy()
