import json
from importlib import resources

import pytest

from iokernels.model.specs import get_spec, list_specs, resolve_spec

REQUIRED = {"v100", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "l4", "rtx3090", "rtx4090", "b200"}


def test_table_has_every_required_gpu():
    assert REQUIRED <= {s.key for s in list_specs()}


def test_lookup_by_alias_and_case():
    assert get_spec("H200").key == "h200"
    assert get_spec("a100").key == "a100-80gb"
    assert get_spec("H100 PCIe").key == "h100-pcie"


def test_unknown_gpu_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown GPU 'x100'.*h200"):
        get_spec("x100")


def test_figures_are_consistent():
    records = json.loads(resources.files("iokernels.model").joinpath("gpus.json").read_text())["gpus"]
    fields = set(records[0])
    for s in list_specs():
        assert s.smem_per_block_bytes <= s.smem_per_sm_bytes <= s.l1_smem_per_sm_bytes
        assert s.hbm_bytes_per_s > 0 and s.tensor_flops > s.fp32_flops > 0
        assert set(s.unverified) <= fields  # each flag names a figure of the data file
    h200 = get_spec("h200")
    assert h200.smem_per_block_bytes == 232448  # 227 KB, read off a device
    assert h200.peak_flops("float16") == h200.tensor_flops
    assert h200.peak_flops("float32") == h200.fp32_flops


def test_resolve_defaults_without_a_device():
    assert resolve_spec("a100").key == "a100-80gb"
    assert resolve_spec(None).smem_per_block_bytes > 0
