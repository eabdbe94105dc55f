"""``iokernels info``: this machine as iokernels sees it (device, versions, what runs, kernel caches).

Works without cupy or a GPU: it then says so, and lists what the kernels would need.
"""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

from ..plan import SCHEDULES
from ..plan.fast import FAST_DTYPES, FAST_HEAD_DIMS, TMA_HEAD_DIMS
from ..plan.fast_bwd import TMA_BWD_HEAD_DIMS

FAST_MIN_CC = (8, 0)  # mma.sync m16n8k16 for float16 and bfloat16
WGMMA_CC = (9, 0)  # wgmma: sm_90a (H100, H200)
LIBRARY_DTYPES = ("float32", "float16")  # numpy and cupy; bfloat16 through iokernels.torch


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def device_info() -> tuple[dict[str, Any] | None, str | None]:
    """(device facts, None), or (None, why there is no GPU)."""
    try:
        import cupy
    except ImportError:
        return None, "no GPU: cupy is not installed"
    try:
        runtime = cupy.cuda.runtime
        if runtime.getDeviceCount() == 0:
            return None, "no GPU: cupy sees no CUDA device"
        device = cupy.cuda.Device()
        props = runtime.getDeviceProperties(device.id)
        free, total = runtime.memGetInfo()
        attrs = device.attributes
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        nvrtc = cupy.cuda.nvrtc.getVersion()
        return {
            "id": device.id,
            "name": name,
            "compute_capability": f"{props['major']}.{props['minor']}",
            "sms": attrs["MultiProcessorCount"],
            "smem_per_block_bytes": attrs["MaxSharedMemoryPerBlockOptin"],
            "smem_per_sm_bytes": attrs["MaxSharedMemoryPerMultiprocessor"],
            "memory_bytes": total,
            "free_memory_bytes": free,
            "devices": runtime.getDeviceCount(),
            "cuda_runtime": _cuda_version(runtime.runtimeGetVersion()),
            "cuda_driver": _cuda_version(runtime.driverGetVersion()),
            "nvrtc": f"{nvrtc[0]}.{nvrtc[1]}",
        }, None
    except Exception as exc:  # a missing or broken driver
        return None, f"no GPU: cupy found no usable CUDA driver ({exc})"


def availability(cc: tuple[int, int] | None) -> list[dict[str, Any]]:
    """One row per algorithm, schedule and pass: the dtypes it takes and whether it runs here (``cc``:
    the device's compute capability; None without a GPU)."""
    rows = []
    for (algorithm, direction), schedules in SCHEDULES.items():
        for schedule in schedules:
            row = {"algorithm": algorithm, "schedule": schedule, "pass": direction,
                   "dtypes": ["float32", "float16", "bfloat16"], "head_dims": "16-256, multiples of 8"}
            if schedule == "fast":
                wider = TMA_HEAD_DIMS if direction == "fwd" else TMA_BWD_HEAD_DIMS  # d inside a wider tile
                row.update(dtypes=list(FAST_DTYPES), head_dims=f"{', '.join(map(str, FAST_HEAD_DIMS))}; sm_90: "
                           f"{wider[0]}-{wider[-1]}, multiples of 8")
            if cc is None:
                row.update(available=False, kernel="-", note="needs a CUDA GPU (the simulator and model run here)")
            elif schedule == "fast":
                if cc < FAST_MIN_CC:
                    row.update(available=False, kernel="-", note="tensor-core kernels need compute capability 8.0")
                else:
                    wgmma = cc[0] == WGMMA_CC[0]
                    sm90 = "tma + wgmma (sm_90a)"
                    row.update(available=True, kernel=sm90 if wgmma else "mma.sync",
                               note="" if wgmma else "wgmma kernels need sm_90 (H100, H200)")
            else:
                row.update(available=True, kernel="CUDA cores" + (", tensor-core GEMMs" if algorithm == "standard"
                                                                   else ""),
                           note="" if cc >= FAST_MIN_CC else "bfloat16 needs compute capability 8.0")
            rows.append(row)
    return rows


def collect() -> dict[str, Any]:
    """Everything ``iokernels info`` prints, as a JSON-ready dict."""
    from .. import __version__
    from ..kernels.runtime import cubin_cache_dir, cupy_cache_dir

    device, no_gpu = device_info()
    cc = tuple(int(x) for x in device["compute_capability"].split(".")) if device else None
    return {
        "iokernels": __version__,
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "cupy": next((v for p in ("cupy", "cupy-cuda13x", "cupy-cuda12x") if (v := _version(p))), None),
        "torch": _version("torch"),
        "device": device,
        "no_gpu": no_gpu,
        "library_dtypes": list(LIBRARY_DTYPES) + (["bfloat16 (iokernels.torch)"] if _version("torch") else []),
        "algorithms": availability(cc),
        "kernel_cache": {"cupy": str(cupy_cache_dir()), "sm_90a cubins": str(cubin_cache_dir())},
    }


def render(doc: dict[str, Any]) -> str:
    from ..plan.units import format_bytes

    lines = [f"iokernels {doc['iokernels']}  python {doc['python']}  numpy {doc['numpy']}  "
             f"cupy {doc['cupy'] or 'not installed'}  torch {doc['torch'] or 'not installed'}"]
    dev = doc["device"]
    if dev is None:
        lines.append(doc["no_gpu"])
    else:
        lines += [f"device {dev['id']} of {dev['devices']}: {dev['name']}, compute capability "
                  f"{dev['compute_capability']}, {dev['sms']} SMs, shared memory "
                  f"{format_bytes(dev['smem_per_block_bytes'])} per block ({format_bytes(dev['smem_per_sm_bytes'])} "
                  "per SM), memory "
                  f"{format_bytes(dev['memory_bytes'])} ({format_bytes(dev['free_memory_bytes'])} free)",
                  f"CUDA runtime {dev['cuda_runtime']}, driver {dev['cuda_driver']}, NVRTC {dev['nvrtc']}"]
    lines.append(f"library dtypes: {', '.join(doc['library_dtypes'])}")
    lines.append("")
    headers = ["algorithm", "schedule", "pass", "available", "kernel", "dtypes", "d", "note"]
    body = [[r["algorithm"], r["schedule"], r["pass"], "yes" if r["available"] else "no", r["kernel"],
             ",".join(r["dtypes"]), r["head_dims"], r["note"]] for r in doc["algorithms"]]
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(headers)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in [headers, ["-" * w for w in widths], *body]]
    lines.append("")
    lines += [f"kernel cache ({name}): {path}" for name, path in doc["kernel_cache"].items()]
    return "\n".join(lines)
