"""Configurations of ``iokernels bench`` and the work they count (FlashAttention-2's FLOP convention)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..plan import check_problem, visible_area
from ..plan.units import check_dtype

PASSES = ("fwd", "bwd")
BWD_OVER_FWD = 2.5
DEFAULT_TOKENS = 262144
# N 512 (B 32) and 1024 (B 16) are the small problems where host time per call shows (issue #20)
DEFAULT_NS = (512, 1024, 4096, 16384)
DEFAULT_DS = (64, 128)
DEFAULT_DTYPES = ("float16", "bfloat16")
OVERHEAD_NS, OVERHEAD_DS, OVERHEAD_DTYPES = (512,), (64,), ("float16",)  # bench --overhead's defaults
DEFAULT_HEADS = 16
LONG_HEADS, LONG_D, LONG_BATCH, LONG_N_START, LONG_N_MAX = 48, 64, 1, 512, 131072
FLOP_CONVENTION = ("FlashAttention-2: forward 4*B*H*N_q*N_k*d FLOPs, halved when causal; a sliding window: 4*B*H*d "
                   "per visible element of S (iokernels.plan.visible_area); backward 2.5x forward; "
                   "TFLOP/s = FLOPs / median seconds / 1e12")


# ---------------------------------------------------------------------------------------------
# work and configurations

def attention_flops(batch: int, heads: int, n_q: int, n_k: int, d: int, *, causal: bool = False,
                    direction: str = "fwd", window: tuple[int | None, int | None] | None = None) -> float:
    """FLOPs of one attention call by the FlashAttention-2 convention (a sliding window: its visible elements)."""
    if direction not in PASSES:
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    if window is not None:
        flops = 4.0 * batch * heads * d * visible_area(n_q, n_k, "bottom_right" if causal else "", window)
    else:
        flops = 4.0 * batch * heads * n_q * n_k * d
    if causal and window is None:
        flops /= 2
    return flops * (BWD_OVER_FWD if direction == "bwd" else 1.0)


@dataclass(frozen=True)
class Problem:
    batch: int
    heads: int
    n: int
    d: int
    dtype: str
    causal: bool = False
    table: str = "main"
    dropout: float = 0.0  # dropout probability on P (every implementation draws its own mask)
    window: tuple[int | None, int | None] | None = None  # a sliding window (left, right), FA2's window_size

    @property
    def bh(self) -> int:
        return self.batch * self.heads

    def flops(self, direction: str) -> float:
        return attention_flops(self.batch, self.heads, self.n, self.n, self.d, causal=self.causal,
                               direction=direction, window=self.window)

    def describe(self) -> str:
        return (f"d={self.d} N={self.n} {self.dtype} B={self.batch} H={self.heads}" + (" causal" if self.causal else "")
                + (f" dropout={self.dropout:g}" if self.dropout else "")
                + (f" window={_window_text(self.window)}" if self.window is not None else ""))

    def dropout_plan_arg(self) -> Any:
        """make_plan's dropout argument: None, or a fixed Dropout of seed 0 (timing does not depend on it)."""
        from ..plan.dropout import Dropout

        return Dropout(self.dropout, 0) if self.dropout else None


def _window_text(window: tuple[int | None, int | None]) -> str:
    return ",".join("-1" if side is None else str(side) for side in window)


def parse_ints(option: str, text: str) -> list[int]:
    """``"64,128"`` -> [64, 128]; ValueError naming the option on anything else."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError(f"{option}: give at least one value")
    out = []
    for x in items:
        try:
            value = int(x)
        except ValueError:
            raise ValueError(f"{option}: {x!r} is not an integer") from None
        if value < 1:
            raise ValueError(f"{option}: values must be >= 1, got {value}")
        out.append(value)
    return list(dict.fromkeys(out))


def parse_dtypes(text: str) -> list[str]:
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError("--dtype: give at least one dtype")
    return list(dict.fromkeys(check_dtype(x) for x in items))


def main_problems(ds: Sequence[int], ns: Sequence[int], dtypes: Sequence[str], *, tokens: int = DEFAULT_TOKENS,
                  heads: int = DEFAULT_HEADS, causal: bool = False, dropout: float = 0.0,
                  window: tuple[int | None, int | None] | None = None) -> list[Problem]:
    """One problem per (d, dtype, N), N ascending within each (d, dtype), with B·H·N = tokens."""
    if tokens < 1 or heads < 1:
        raise ValueError(f"--tokens and --heads must be >= 1, got {tokens}, {heads}")
    problems = []
    for d in ds:
        for dtype in dtypes:
            for n in sorted(ns):
                if tokens % (n * heads):
                    raise ValueError(f"--tokens {tokens} is not a multiple of N*heads = {n}*{heads} = {n * heads}; "
                                     "choose --tokens, --N or --heads so that batch = tokens/(N*heads) is whole")
                batch = tokens // (n * heads)
                check_problem(n, n, d, dtype, batch, heads)
                problems.append(Problem(batch, heads, n, d, check_dtype(dtype), causal, dropout=dropout, window=window))
    return problems


def long_problems(*, n_max: int = LONG_N_MAX, dtype: str = "float16", n_start: int = LONG_N_START,
                  heads: int = LONG_HEADS, d: int = LONG_D, batch: int = LONG_BATCH,
                  causal: bool = False, dropout: float = 0.0) -> list[Problem]:
    """The long-sequence table: N = n_start, 2·n_start, ... up to n_max."""
    if n_max < n_start:
        raise ValueError(f"--long-max-n must be >= {n_start}, got {n_max}")
    out, n = [], n_start
    while n <= n_max:
        check_problem(n, n, d, dtype, batch, heads)
        out.append(Problem(batch, heads, n, d, check_dtype(dtype), causal, table="long", dropout=dropout))
        n *= 2
    return out
