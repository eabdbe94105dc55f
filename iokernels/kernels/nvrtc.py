"""Compile kernel translation units with NVRTC, no GPU needed (CI checks every kernel variant).

Uses NVIDIA's ``cuda.bindings.nvrtc``, imported on first use. Nothing is cached here: on a GPU,
cupy compiles and caches the same text from :func:`iokernels.kernels.build_source` itself.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

_INSTALL_HINT = (
    "compiling kernels without a GPU needs NVIDIA's NVRTC: pip install 'iokernels[test]' "
    "(or pip install cuda-bindings nvidia-cuda-nvrtc nvidia-cuda-runtime)"
)
_ARCH = re.compile(r"sm_\d+[af]?")


class KernelCompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries NVRTC's log."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


@dataclass(frozen=True)
class KernelResources:
    """One function's line of the ``ptxas -v`` report (bytes, except registers and barriers)."""

    registers: int | None = None  # ptxas reports registers for entry functions only
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    shared: int = 0  # static shared memory; dynamic shared memory is the launcher's
    barriers: int = 0


@dataclass(frozen=True)
class CompileResult:
    cubin: bytes
    ptx: str
    log: str
    lowered_names: dict[str, str] = field(default_factory=dict)  # name expression -> mangled
    resources: dict[str, KernelResources] = field(default_factory=dict)  # mangled name -> report

    def resources_of(self, name_expression: str) -> KernelResources:
        """ptxas report of the kernel instantiated by ``name_expression``."""
        return self.resources[self.lowered_names[name_expression]]


def _nvrtc() -> ModuleType:
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    try:
        nvrtc.nvrtcVersion()
    except RuntimeError as exc:  # bindings present, libnvrtc not loadable
        raise ImportError(f"{exc}; {_INSTALL_HINT}") from exc
    return nvrtc


def include_dirs() -> list[str]:
    """Directories holding the CUDA runtime headers (cuda_fp16.h, cuda_bf16.h, ...)."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError:
        found = None
    else:
        found = find_nvidia_header_directory("cudart")
    if found:
        return [found]
    roots = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    return [str(Path(r) / "include") for r in roots if r and (Path(r) / "include" / "cuda_fp16.h").is_file()][:1]


def _check(nvrtc: ModuleType, result: tuple, what: str) -> tuple:
    if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(result[0])
        raise RuntimeError(f"{what} failed: {text.decode()}")
    return result[1:]


def _get_bytes(nvrtc: ModuleType, prog: object, size_fn: str, get_fn: str) -> bytes:
    (size,) = _check(nvrtc, getattr(nvrtc, size_fn)(prog), size_fn)
    buf = b" " * size
    _check(nvrtc, getattr(nvrtc, get_fn)(prog, buf), get_fn)
    return buf


def compile_to_cubin(
    source_text: str,
    *,
    arch: str = "sm_90",
    name: str = "iokernels.cu",
    name_expressions: Iterable[str] = (),
    extra_options: Sequence[str] = (),
) -> CompileResult:
    """Compile ``source_text`` for the real architecture ``arch`` (``sm_80``, ``sm_90``, ``sm_90a``, ...).

    Returns the cubin, the PTX it was assembled from, NVRTC's log, the mangled name of each name
    expression and the per-function ``ptxas -v`` report. Raises :class:`KernelCompileError` with
    the log when NVRTC rejects the source.
    """
    if not _ARCH.fullmatch(arch):
        raise ValueError(f"arch must be a real architecture like 'sm_90', got {arch!r}")
    nvrtc = _nvrtc()
    expressions = list(dict.fromkeys(name_expressions))
    dirs = include_dirs()
    options = [f"--gpu-architecture={arch}", "-std=c++17", "--ptxas-options=-v"]
    options += [f"-I{d}" for d in dirs]
    options += list(extra_options)

    (prog,) = _check(
        nvrtc, nvrtc.nvrtcCreateProgram(source_text.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram"
    )
    try:
        for expr in expressions:
            _check(nvrtc, nvrtc.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression")
        encoded = [o.encode() for o in options]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        log = _get_bytes(nvrtc, prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog")
        log_text = log.rstrip(b"\0").decode(errors="replace").strip()
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            hint = "" if dirs else "\n(no CUDA headers found: install nvidia-cuda-runtime or set CUDA_PATH)"
            raise KernelCompileError(f"NVRTC could not compile {name} for {arch}:\n{log_text}{hint}", log_text)
        cubin = _get_bytes(nvrtc, prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
        ptx = _get_bytes(nvrtc, prog, "nvrtcGetPTXSize", "nvrtcGetPTX").rstrip(b"\0").decode()
        lowered = {}
        for expr in expressions:
            (mangled,) = _check(nvrtc, nvrtc.nvrtcGetLoweredName(prog, expr.encode()), "nvrtcGetLoweredName")
            lowered[expr] = mangled.decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return CompileResult(cubin=cubin, ptx=ptx, log=log_text, lowered_names=lowered, resources=parse_ptxas_log(log_text))


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")


def parse_ptxas_log(log: str) -> dict[str, KernelResources]:
    """Per-function resources from a ``--ptxas-options=-v`` report, keyed by mangled name.

    Device functions that were not inlined appear too (stack frame and spills, no registers).
    """
    found: dict[str, dict[str, int]] = {}
    entry = props = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            found.setdefault(entry, {})
        elif m := _PROPERTIES.search(line):
            props = m.group(1)
            found.setdefault(props, {})
        elif (m := _FRAME.search(line)) and props is not None:
            frame, stores, loads = map(int, m.groups())
            found[props].update(stack_frame=frame, spill_stores=stores, spill_loads=loads)
        elif (m := _USED.search(line)) and entry is not None:
            found[entry]["registers"] = int(m.group(1))
            if s := _SMEM.search(line):
                found[entry]["shared"] = int(s.group(1))
            if b := _BARRIERS.search(line):
                found[entry]["barriers"] = int(b.group(1))
    return {fn: KernelResources(**values) for fn, values in found.items()}
