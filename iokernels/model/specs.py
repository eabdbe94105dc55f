"""GPU specifications: a data file (``gpus.json`` beside it) plus the device cupy sees, if any."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources

from ..plan.units import check_dtype

KB = 1024
DEFAULT_GPU = "h200"


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    compute_capability: str
    sms: int | None
    smem_per_sm_bytes: int
    smem_per_block_bytes: int  # opt-in maximum for one thread block
    l1_smem_per_sm_bytes: int
    l2_bytes: int | None
    hbm_bytes_per_s: float
    tensor_flops: float  # dense float16/bfloat16 tensor-core peak
    fp32_flops: float
    # occupancy and L2 figures (the two-level DRAM model, model/l2.py): per-SM limits of the compute capability,
    # shared memory the driver reserves per block, and the L2's partitions (each caches its own SMs' accesses)
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    smem_reserved_per_block_bytes: int = 1024
    l2_partitions: int = 1
    unverified: tuple[str, ...] = ()
    source: str = ""
    aliases: tuple[str, ...] = field(default=(), compare=False)
    from_device: bool = False

    def peak_flops(self, dtype: str) -> float:
        return self.fp32_flops if check_dtype(dtype) == "float32" else self.tensor_flops

    def as_row(self) -> dict:
        return {
            "key": self.key,
            "name": self.name,
            "compute_capability": self.compute_capability,
            "sms": self.sms,
            "smem_per_sm_bytes": self.smem_per_sm_bytes,
            "smem_per_block_bytes": self.smem_per_block_bytes,
            "l1_smem_per_sm_bytes": self.l1_smem_per_sm_bytes,
            "l2_bytes": self.l2_bytes,
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "tensor_flops": self.tensor_flops,
            "fp32_flops": self.fp32_flops,
            "max_threads_per_sm": self.max_threads_per_sm,
            "max_blocks_per_sm": self.max_blocks_per_sm,
            "smem_reserved_per_block_bytes": self.smem_reserved_per_block_bytes,
            "l2_partitions": self.l2_partitions,
            "unverified": list(self.unverified),
            "source": self.source,
            "from_device": self.from_device,
        }


def _from_record(rec: dict) -> GpuSpec:
    return GpuSpec(
        key=rec["key"],
        name=rec["name"],
        compute_capability=rec["compute_capability"],
        sms=rec["sms"],
        smem_per_sm_bytes=int(rec["smem_per_sm_kb"] * KB),
        smem_per_block_bytes=int(rec["smem_per_block_kb"] * KB),
        l1_smem_per_sm_bytes=int(rec["l1_smem_per_sm_kb"] * KB),
        l2_bytes=None if rec["l2_mb"] is None else int(rec["l2_mb"] * KB * KB),
        hbm_bytes_per_s=rec["hbm_gb_per_s"] * 1e9,
        tensor_flops=rec["tensor_tflops"] * 1e12,
        fp32_flops=rec["fp32_tflops"] * 1e12,
        max_threads_per_sm=rec["max_threads_per_sm"],
        max_blocks_per_sm=rec["max_blocks_per_sm"],
        smem_reserved_per_block_bytes=int(rec["smem_reserved_per_block_kb"] * KB),
        l2_partitions=rec["l2_partitions"],
        unverified=tuple(rec["unverified"]),
        source=rec["source"],
        aliases=tuple(rec["aliases"]),
    )


@lru_cache(maxsize=1)
def list_specs() -> tuple[GpuSpec, ...]:
    text = resources.files("iokernels.model").joinpath("gpus.json").read_text()
    return tuple(_from_record(rec) for rec in json.loads(text)["gpus"])


def table_notes() -> str:
    text = resources.files("iokernels.model").joinpath("gpus.json").read_text()
    return json.loads(text)["notes"]


def get_spec(name: str) -> GpuSpec:
    """Look a GPU up by key or alias, case-insensitively (``h200``, ``A100``, ``h100-pcie``)."""
    wanted = name.strip().lower().replace("_", "-").replace(" ", "-")
    for spec in list_specs():
        if wanted == spec.key or wanted in spec.aliases:
            return spec
    known = ", ".join(s.key for s in list_specs())
    raise ValueError(f"unknown GPU {name!r}: expected one of {known}")


def _match_device_name(device_name: str) -> GpuSpec | None:
    lowered = device_name.lower()
    for key, needle in (("h200", "h200"), ("h100-pcie", "h100 pcie"), ("h100-sxm", "h100"),
                        ("a100-40gb", "a100-sxm4-40gb"), ("a100-80gb", "a100"), ("v100", "v100"),
                        ("l4", " l4"), ("rtx4090", "4090"), ("rtx3090", "3090"), ("b200", "b200")):
        if needle in f" {lowered}":
            return get_spec(key)
    return None


def current_device_spec() -> GpuSpec | None:
    """The spec of cupy's current device, or None when cupy or a GPU is missing.

    Shared memory, SM count and L2 are read from the device; bandwidth and peak FLOP/s come from
    the table entry whose name matches (they are not device attributes).
    """
    try:
        import cupy
        from cupy.cuda import runtime

        device = cupy.cuda.Device()
        props = runtime.getDeviceProperties(device.id)
    except Exception:  # no cupy, no driver or no device: there is simply no current GPU
        return None
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    attrs = device.attributes
    table = _match_device_name(name)
    base = table or GpuSpec(
        key="device", name=name, compute_capability="", sms=None, smem_per_sm_bytes=0,
        smem_per_block_bytes=0, l1_smem_per_sm_bytes=0, l2_bytes=None, hbm_bytes_per_s=float("nan"),
        tensor_flops=float("nan"), fp32_flops=float("nan"), source="device attributes only",
    )
    return replace(
        base,
        name=name,
        compute_capability=f"{props['major']}.{props['minor']}",
        sms=attrs["MultiProcessorCount"],
        smem_per_block_bytes=attrs["MaxSharedMemoryPerBlockOptin"],
        smem_per_sm_bytes=attrs["MaxSharedMemoryPerMultiprocessor"],
        l2_bytes=attrs["L2CacheSize"],
        max_threads_per_sm=attrs.get("MaxThreadsPerMultiProcessor", base.max_threads_per_sm),
        max_blocks_per_sm=attrs.get("MaxBlocksPerMultiprocessor", base.max_blocks_per_sm),
        smem_reserved_per_block_bytes=attrs.get("ReservedSharedMemoryPerBlock", base.smem_reserved_per_block_bytes),
        from_device=True,
    )


def resolve_spec(name: str | None) -> GpuSpec:
    """``name`` from the table; with None, the current device, else the H200 entry."""
    if name is not None:
        return get_spec(name)
    return current_device_spec() or get_spec(DEFAULT_GPU)
