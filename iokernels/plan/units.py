"""Dtypes and byte sizes: the two kinds of user-supplied value every layer parses."""

from __future__ import annotations

import re

import numpy as np

DTYPE_ITEMSIZE: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}
ACC_ITEMSIZE = 4  # statistics (m, l, lse, D) and accumulators are float32 whatever the input dtype

_UNITS = {
    "": 1, "b": 1,
    "kb": 1024, "kib": 1024, "k": 1024,
    "mb": 1024**2, "mib": 1024**2, "m": 1024**2,
    "gb": 1024**3, "gib": 1024**3, "g": 1024**3,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the number of blocks of ``b`` that cover ``a``."""
    return -(-a // b)


def check_dtype(dtype: str) -> str:
    """Return the canonical dtype name, or raise ValueError naming the allowed ones."""
    name = str(dtype).lower()
    if name not in DTYPE_ITEMSIZE:
        raise ValueError(f"unsupported dtype {dtype!r}: expected one of {', '.join(DTYPE_ITEMSIZE)}")
    return name


def itemsize(dtype: str) -> int:
    return DTYPE_ITEMSIZE[check_dtype(dtype)]


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round values to ``dtype`` (bfloat16: to nearest even, as the GPU conversion does), as float64."""
    x32 = np.asarray(x, dtype=np.float32)
    if check_dtype(dtype) == "float32":
        return x32.astype(np.float64)
    if dtype == "float16":
        return x32.astype(np.float16).astype(np.float64)
    bits = x32.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint32) << 16
    return rounded.view(np.float32).astype(np.float64)


def parse_size(text: str | int) -> int:
    """Parse a byte size: ``196608``, ``192KB``, ``192KiB``, ``1MB``.

    KB, MB and GB are binary (1 KB = 1024 bytes), as in NVIDIA's shared-memory figures and the
    FlashAttention paper's "M = 192 KB"; KiB, MiB and GiB mean the same.
    """
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(str(text))
        unit = match.group(2).lower() if match else None
        if not match or unit not in _UNITS:
            raise ValueError(
                f"malformed size {text!r}: expected a byte count such as 196608, 192KB, 192KiB or 1MB"
            )
        number = float(match.group(1)) * _UNITS[unit]
        if number != int(number):
            raise ValueError(f"size {text!r} is not a whole number of bytes")
        value = int(number)
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return value


def format_bytes(n: float | None) -> str:
    """Human-readable bytes with binary prefixes (KiB = 1024 B)."""
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
