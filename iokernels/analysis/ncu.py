"""Nsight Compute (``ncu``): finding it, the command line, its metrics and its CSV output, parsed."""

from __future__ import annotations

import csv
import math
import re
import shutil
import subprocess
import sys

# short key -> ncu metric (all .sum: over the whole GPU)
METRICS: dict[str, str] = {
    "dram_read": "dram__bytes_read.sum",
    "dram_write": "dram__bytes_write.sum",
    "l1_ld": "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
    "l1_st": "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum",
    "l1_red": "l1tex__t_bytes_pipe_lsu_mem_global_op_red.sum",
    "l1_atom": "l1tex__t_bytes_pipe_lsu_mem_global_op_atom.sum",
    "req_ld": "smsp__sass_data_bytes_mem_global_op_ld.sum",
    "req_st": "smsp__sass_data_bytes_mem_global_op_st.sum",
    "req_red": "smsp__sass_data_bytes_mem_global_op_red.sum",
    "req_atom": "smsp__sass_data_bytes_mem_global_op_atom.sum",
    # cp.async (LDGSTS: global to shared, no register) is not an op_ld: its bytes are their own metric
    "req_ldgsts": "sm__sass_data_bytes_mem_global_op_ldgsts.sum",
    "l2_read_sectors": "lts__t_sectors_srcunit_tex_op_read.sum",
    "l2_write_sectors": "lts__t_sectors_srcunit_tex_op_write.sum",
    "l2_red_sectors": "lts__t_sectors_srcunit_tex_op_red.sum",
    "l2_atom_sectors": "lts__t_sectors_srcunit_tex_op_atom.sum",
    "xbar_read_sectors": "l1tex__m_xbar2l1tex_read_sectors.sum",
    "xbar_write_sectors": "l1tex__m_l1tex2xbar_write_sectors.sum",
    "duration_ns": "gpu__time_duration.sum",
}


CACHE_CONTROL = ("all", "none")


PERMISSION_MESSAGE = (
    "ncu may not read the GPU performance counters (ERR_NVGPUCTRPERM): run it as root or with "
    "CAP_PERFMON (driver R565+) or CAP_SYS_ADMIN, or allow all users "
    "(NVreg_RestrictProfilingToAdminUsers=0); see https://developer.nvidia.com/ERR_NVGPUCTRPERM"
)


MISSING_MESSAGE = (
    "`iokernels profile` needs Nsight Compute's `ncu`, which is not on PATH: install Nsight Compute "
    "(it comes with the CUDA toolkit, e.g. /usr/local/cuda/bin/ncu) and put it on PATH"
)


_HEADER_START = '"ID",'


class NcuMissing(RuntimeError):
    """``ncu`` is not on PATH."""


class NcuPermissionError(RuntimeError):
    """``ncu`` may not read the performance counters (ERR_NVGPUCTRPERM)."""


def find_ncu() -> str:
    path = shutil.which("ncu")
    if path is None:
        raise NcuMissing(MISSING_MESSAGE)
    return path


def ncu_version(ncu: str) -> str | None:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [x.strip() for x in out.splitlines() if x.strip().startswith("Version")]
    return lines[-1].removeprefix("Version").strip() if lines else None


def ncu_command(ncu: str, spec_path: str, log_path: str, cache_control: str) -> list[str]:
    if cache_control not in CACHE_CONTROL:
        raise ValueError(f"--cache-control must be one of {', '.join(CACHE_CONTROL)}, got {cache_control!r}")
    return [ncu, "--clock-control", "none", "--cache-control", cache_control, "--profile-from-start", "off",
            "--metrics", ",".join(METRICS.values()), "--csv", "--page", "raw", "--print-units", "base",
            "--log-file", log_path, sys.executable, "-m", "iokernels.analysis.profile", "--run", spec_path]


def check_ncu_output(returncode: int, text: str) -> None:
    """Raise a one-line RuntimeError for what went wrong in an ncu run (``text``: all it printed)."""
    if "ERR_NVGPUCTRPERM" in text:
        raise NcuPermissionError(PERMISSION_MESSAGE)
    if returncode != 0:
        raise RuntimeError(f"ncu exited with code {returncode}: {first_problem(text)}")


def first_problem(text: str) -> str:
    """ncu's first ==ERROR== line, else the program's exception line, else its last line."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("==ERROR==")]
    if errors:
        return errors[0]
    raised = [x for x in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b.*:", x)]
    return (raised or lines or ["no output"])[-1]


_PREFIX = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


_TIME_NS = {"ns": 1, "nsecond": 1, "us": 10**3, "usecond": 10**3, "ms": 10**6, "msecond": 10**6,
            "s": 10**9, "second": 10**9}


def unit_scale(unit: str) -> float:
    """Factor from a value in ``unit`` to its base unit (bytes, sectors, ..., nanoseconds for time)."""
    unit = unit.strip()
    if unit in _TIME_NS:
        return _TIME_NS[unit]
    for base in ("byte", "sector", "inst", "cycle", "request", "warp", "thread"):
        if unit.endswith(base) and unit[:-len(base)] in _PREFIX:
            return _PREFIX[unit[:-len(base)]]
    if unit in ("", "%"):
        return 1
    raise ValueError(f"unknown ncu unit {unit!r}")


def parse_value(text: str, unit: str = "") -> int | float | None:
    """ncu's number ("2,048,000", "5,397.33"; "n/a" and "" are None) in base units; int when whole."""
    text = text.strip().replace(",", "")
    if text in ("", "n/a", "N/A"):
        return None
    try:
        x = float(text) * unit_scale(unit)
    except ValueError:
        return None
    return round(x) if math.isfinite(x) and abs(x - round(x)) < 1e-6 * max(1.0, abs(x)) else x


def parse_ncu_csv(text: str, metrics: tuple[str, ...] | None = None) -> list[dict]:
    """The launches in ``ncu --csv --page raw`` output, in ID order: ``{"id", "kernel_name",
    "function", "block", "grid", "metrics": {metric: value in base units or None}}``.
    Lines before the CSV header (the program's own output, ``==PROF==`` lines) are skipped.
    ``metrics``: the metric columns to keep (default: :data:`METRICS`; ones absent are None)."""
    wanted = tuple(METRICS.values()) if metrics is None else metrics
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(_HEADER_START)), None)
    if start is None:
        return []
    body = [x for x in lines[start:] if x.strip() and not x.startswith("==")]
    rows = list(csv.reader(body))
    header, rows = rows[0], rows[1:]
    units: dict[str, str] = {}
    if rows and rows[0] and rows[0][0] == "":  # the units row: no ID
        units = dict(zip(header, rows[0], strict=False))
        rows = rows[1:]
    out = []
    for row in rows:
        rec = dict(zip(header, row, strict=False))
        name = rec.get("Kernel Name", "")
        out.append({
            "id": int(rec["ID"]),
            "kernel_name": name,
            "function": function_base(name),
            "block": rec.get("Block Size"),
            "grid": rec.get("Grid Size"),
            "metrics": {m: parse_value(rec[m], units.get(m, "")) if m in rec else None for m in wanted},
        })
    return sorted(out, key=lambda r: r["id"])


def function_base(kernel_name: str) -> str:
    """"void gemm<__half, 0, 1, 0, 1, 4>(const T1 *, ...)" -> "gemm" (also for a bare "gemm")."""
    name = kernel_name.strip()
    name = name.removeprefix("void ")
    cut = [i for i in (name.find("<"), name.find("(")) if i >= 0]
    return name[:min(cut)].strip() if cut else name
