import pytest


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    """Every buffer a plan writes starts as NaN here (launch.DEBUG_POISON, off for users), so an output
    element no kernel writes fails the test that checks it."""
    from iokernels.kernels import launch

    monkeypatch.setattr(launch, "DEBUG_POISON", True)
