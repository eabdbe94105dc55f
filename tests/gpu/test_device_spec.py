from iokernels.model.specs import current_device_spec
from iokernels.plan import make_plan


def test_current_device_is_read_from_cupy():
    spec = current_device_spec()
    assert spec is not None and spec.from_device
    assert spec.sms and spec.sms > 0
    assert 48 * 1024 <= spec.smem_per_block_bytes <= spec.smem_per_sm_bytes
    if "H200" in spec.name:
        assert (spec.sms, spec.smem_per_block_bytes, spec.key) == (132, 232448, "h200")
    # the device's own limit is what plans are checked against
    make_plan("flash", N_q=128, d=64, sram=spec.smem_per_block_bytes, smem_limit=spec.smem_per_block_bytes)
