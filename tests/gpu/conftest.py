import pytest


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    """Every buffer a plan writes starts as NaN here (launch.DEBUG_POISON, off for users), so an output
    element no kernel writes fails the test that checks it."""
    from iokernels.kernels import launch

    monkeypatch.setattr(launch, "DEBUG_POISON", True)


@pytest.fixture
def sm90():
    """Skips the test without an sm_90 device: the tma and wgmma kernels (sliding window, dropout and the persistent
    grid on flash/fast) run there only. A module takes it with ``pytestmark = pytest.mark.usefixtures("sm90")``."""
    cp = pytest.importorskip("cupy")
    if cp.cuda.runtime.getDeviceCount() < 1 or cp.cuda.Device().compute_capability != "90":
        pytest.skip("the sm_90 tensor-core kernels (tma, wgmma) need an sm_90 device")
