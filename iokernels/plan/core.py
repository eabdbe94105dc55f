"""Plan and Stage: the tiles, grid, threads and shared memory of one algorithm, schedule and direction.

Kernels, the CPU simulator and the model all read a :class:`Plan`; no tile size is written down
anywhere else. ``M`` (``sram_bytes``) is in bytes. Every stage's shared-memory layout is listed
buffer by buffer, and the plan guarantees its total never exceeds ``M`` (nor the GPU's per-block
limit when one is given).

Where each family's tiles are decided: :mod:`.research` (standard, two_pass, flash kv_outer/q_outer and
the flash backward), :mod:`.fast` (the tensor-core forward), :mod:`.fast_bwd` (its backward);
:mod:`.variants` adds causal, dropout, explicit and block masks to a plan; :mod:`.make` picks among them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .causal import CAUSAL_ALIGNMENTS, causal_offset, normalize_documents, normalize_window, visible
from .dropout import Dropout
from .kvcache import KvCache
from .masks import BlockMask, ExplicitMask
from .modspec import Mods
from .sequences import Varlen
from .tensors import CACHE_TENSORS, LIST_TENSORS, VARLEN_TENSORS
from .units import ACC_ITEMSIZE, cdiv, check_dtype, itemsize

SCHEDULES: dict[tuple[str, str], tuple[str, ...]] = {
    ("standard", "fwd"): ("default",),
    ("standard", "bwd"): ("default",),
    ("two_pass", "fwd"): ("store", "recompute"),
    ("flash", "fwd"): ("kv_outer", "q_outer", "fast"),
    ("flash", "bwd"): ("kv_outer", "fast"),
}
ALGORITHMS = ("standard", "two_pass", "flash")
DEFAULT_SCHEDULE = {"standard": "default", "two_pass": "store", "flash": "q_outer"}
D_MIN, D_MAX, D_MULTIPLE = 16, 256, 8
THREADS = 256
ROWWISE_THREADS = 256
ROW_ELEMENTS_PER_BLOCK = 32768  # row-wise kernels take several rows per block, up to this many elements
MAX_ROWS_PER_BLOCK = 64
SMEM_ALIGN = 16


# Tensors stored in float32 whatever the input dtype; one byte per element; int32 (a decode's cache lengths and page
# table, a variable-length batch's offsets); all others use the input dtype.
FLOAT32_TENSORS = frozenset({"m", "l", "lse", "D", "dQacc", "Oacc", "Opart", "lse_part", "alibi"})
BYTE_TENSORS = frozenset({"block_mask"})
INT32_TENSORS = frozenset(CACHE_TENSORS) | frozenset(VARLEN_TENSORS) | frozenset(LIST_TENSORS)




def _align(n: int) -> int:
    return -(-n // SMEM_ALIGN) * SMEM_ALIGN


@dataclass(frozen=True)
class Stage:
    """One kernel launch of a plan."""

    name: str
    kernel: str
    grid: tuple[int, int, int]
    threads: int
    smem: tuple[tuple[str, int, int], ...]  # (buffer, offset, bytes)
    params: tuple[tuple[str, int], ...] = ()  # further compile-time constants of this kernel

    @property
    def smem_bytes(self) -> int:
        return max((off + size for _, off, size in self.smem), default=0)

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "kernel": self.kernel,
            "grid": list(self.grid),
            "threads": self.threads,
            "smem_bytes": self.smem_bytes,
            "smem_layout": {name: [off, size] for name, off, size in self.smem},
            **dict(self.params),
        }


def layout(buffers: list[tuple[str, int]]) -> tuple[tuple[str, int, int], ...]:
    out, offset = [], 0
    for name, size in buffers:
        out.append((name, offset, size))
        offset = _align(offset + size)
    return tuple(out)


def layout_bytes(buffers: list[tuple[str, int]]) -> int:
    return max((off + size for _, off, size in layout(buffers)), default=0)




@dataclass(frozen=True)
class Plan:
    """Tiles, grid and shared memory of one algorithm, schedule and direction."""

    algorithm: str
    schedule: str
    direction: str  # "fwd" | "bwd"
    N_q: int
    N_k: int
    d: int
    dtype: str
    sram_bytes: int
    batch: int
    heads: int
    tiles: tuple[tuple[str, int], ...]
    stages: tuple[Stage, ...]
    # a variant of the schedule with stages of its own ("" for none; flash/fast/bwd: "deterministic");
    # the model and the simulator pick its stages by it
    variant: str = ""
    # grouped-query attention: K and V have kv_heads heads, each shared by heads / kv_heads query
    # heads (0: as many as heads). Only flash/fast takes kv_heads < heads (its backward: the wgmma kernel).
    kv_heads: int = 0
    # causal mask alignment: "" (none), "bottom_right" or "top_left" (module docstring)
    causal: str = ""
    # sliding window (left, right) (iokernels.plan.causal.normalize_window; None: none): flash/fast's tma kernels
    # take it (WINDOW), the research kernels do not (the launcher refuses them; the model and simulator take all)
    window: tuple[int | None, int | None] | None = None
    # the logits' softcap c: c · tanh(τ s / c) (iokernels.plan.variants.with_softcap; None: none): flash/fast's tma
    # kernels take it (SOFTCAP), the model's bytes do not change
    softcap: float | None = None
    # ALiBi: one slope per batch·head (row b·heads + h), the logits plus −slope·|j − i − (N_k − N_q)|
    # (iokernels.plan.variants.with_alibi; None: none): flash/fast's tma kernels take it (ALIBI), reading the slopes
    alibi: tuple[float, ...] | None = None
    # document masking: the lengths of packed documents (iokernels.plan.causal.normalize_documents; None: none). No
    # kernel takes it yet: the model and the simulator do, the launcher refuses it
    documents: tuple[int, ...] | None = None
    # block-sparse attention (iokernels.plan.masks): the tiles divide its blocks; None: every block computed
    block_mask: BlockMask | None = None
    # an explicit element mask read from HBM (tensor "mask"; iokernels.plan.masks.ExplicitMask); None: none
    mask: ExplicitMask | None = None
    # dropout on P (iokernels.plan.dropout.Dropout: p, seed, offset); None: none. Moves no HBM bytes.
    dropout: Dropout | None = None
    # a decode plan's cache (iokernels.plan.kvcache.KvCache: per-sequence lengths, paged); None: every sequence N_k
    # keys in a contiguous (batch, kv_heads, N_k, d) K and V
    kv_cache: KvCache | None = None
    # a variable-length batch (iokernels.plan.varlen.Varlen: packed rows, per-sequence lengths); None: every sequence
    # N_q queries and N_k keys in (batch, heads, N, d) tensors. With it, batch is the sequences, N_q and N_k the longest
    varlen: Varlen | None = None
    # a programmable variant: mask_mod / score_mod C expressions and their captured arrays (iokernels.plan.mods.Mods;
    # None: none): flash/fast's tma kernels take it (MASK_MOD, SCORE_MOD), reading the captures
    mods: Mods | None = None

    def __post_init__(self) -> None:
        if self.causal not in ("", *CAUSAL_ALIGNMENTS):
            allowed = " or ".join(map(repr, CAUSAL_ALIGNMENTS))
            raise ValueError(f"Plan.causal must be '' or {allowed}, got {self.causal!r}")
        object.__setattr__(self, "window", normalize_window(self.window))
        object.__setattr__(self, "documents", normalize_documents(self.documents, self.N_q, self.N_k))
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if not isinstance(self.kv_heads, int) or self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ValueError(f"kv_heads must divide heads={self.heads}, got {self.kv_heads!r}")

    @property
    def tile(self) -> dict[str, int]:
        return dict(self.tiles)

    @property
    def causal_offset(self) -> int:
        """Key j is visible to query i iff j <= i + causal_offset (causal plans only)."""
        return causal_offset(self.N_q, self.N_k, self.causal)

    @property
    def bh(self) -> int:
        return self.batch * self.heads

    @property
    def bh_kv(self) -> int:
        """Rows of K and V (and dK, dV): batch * kv_heads."""
        return self.batch * self.kv_heads

    @property
    def smem_bytes(self) -> int:
        return max(s.smem_bytes for s in self.stages)

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)

    @property
    def sram_elements(self) -> int:
        return self.sram_bytes // self.itemsize

    def tensor_itemsize(self, tensor: str) -> int:
        if tensor in BYTE_TENSORS:
            return 1
        if tensor in INT32_TENSORS:
            return 4
        if tensor == "mask":
            return self.mask.itemsize if self.mask is not None else 1
        return ACC_ITEMSIZE if tensor in FLOAT32_TENSORS else self.itemsize

    def block_grid(self) -> np.ndarray:
        """The block mask on this plan's tile grid, (T_r, T_c) of uint8: what the kernels read."""
        tile = self.tile
        return self.block_mask.refine(tile["Br"], tile["Bc"]).astype(np.uint8)

    def visible(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray | None:
        """Boolean (len rows, len cols): where the causal mask, the window and the documents let query rows[r] see
        key cols[c]; None without any (the block and explicit masks not included)."""
        return visible(self.N_q, self.N_k, self.causal, self.window, rows, cols, self.documents)

    @property
    def positional(self) -> bool:
        """Whether a mask by position other than causal applies (a window or documents): the tiled schedules visit
        the block pairs with a visible element, A_v of them (the model's sums as for causal)."""
        return self.window is not None or self.documents is not None

    def element_mask(self) -> np.ndarray | None:
        """Boolean (N_q, N_k) of the block mask (the causal mask not included); None without one."""
        return None if self.block_mask is None else self.block_mask.element_mask()

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def schedule_label(self) -> str:
        """The schedule as the reports name it: with the variant (``fast+split`` beside ``fast``)."""
        return f"{self.schedule}+{self.variant}" if self.variant else self.schedule

    @property
    def label(self) -> str:
        label = f"{self.algorithm}/{self.schedule}/{self.direction}"
        return f"{label}+{self.variant}" if self.variant else label

    def describe_tiles(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.tiles)

    def as_dict(self) -> dict:
        return {
            "algorithm": self.algorithm,
            "schedule": self.schedule,
            "pass": self.direction,
            **({"variant": self.variant} if self.variant else {}),
            **({"kv_heads": self.kv_heads} if self.kv_heads != self.heads else {}),
            **({"causal": self.causal} if self.causal else {}),
            **({"window": list(self.window)} if self.window is not None else {}),
            **({"softcap": self.softcap} if self.softcap is not None else {}),
            **({"alibi": list(self.alibi)} if self.alibi is not None else {}),
            **({"documents": list(self.documents)} if self.documents is not None else {}),
            **({"block_mask": self.block_mask.as_dict()} if self.block_mask is not None else {}),
            **({"mask": self.mask.as_dict()} if self.mask is not None else {}),
            **({"dropout": self.dropout.as_dict()} if self.dropout is not None else {}),
            **({"kv_cache": {"lengths": None if self.kv_cache.lengths is None else list(self.kv_cache.lengths),
                             "page_size": self.kv_cache.page_size, "pages": self.kv_cache.pages,
                             "append": self.kv_cache.append}}
               if self.kv_cache is not None else {}),
            **({"varlen": {"total_q": self.varlen.total_q, "total_k": self.varlen.total_k,
                           "lengths_q": None if self.varlen.lengths_q is None else list(self.varlen.lengths_q),
                           "lengths_k": None if self.varlen.lengths_k is None else list(self.varlen.lengths_k),
                           **({"head_major": True} if self.varlen.head_major else {})}}
               if self.varlen is not None else {}),
            "tiles": dict(self.tiles),
            "smem_bytes": self.smem_bytes,
            "stages": [s.as_dict() for s in self.stages],
        }




def rowwise_buffers() -> list[tuple[str, int]]:
    # 16 bytes per warp and per counted tensor (a row kernel moves at most 4): block reductions (a float per warp and
    # two broadcast scalars, rowwise.cu's PARTIALS)
    return [("partials", ROWWISE_THREADS // 32 * 16 * 4)]


def rowwise_stage(name: str, kernel: str, n_rows: int, row_length: int, bh: int) -> Stage:
    """A row-wise kernel: each block walks ROWS_PER_BLOCK rows (more when rows are short, so that
    a block's work outweighs its start and its counter flush)."""
    rows = max(1, min(MAX_ROWS_PER_BLOCK, ROW_ELEMENTS_PER_BLOCK // row_length))
    return Stage(name, kernel, (cdiv(n_rows, rows), 1, bh), ROWWISE_THREADS, layout(rowwise_buffers()),
                 (("ROWS_PER_BLOCK", rows),))




# ---------------------------------------------------------------------------------------------
# validation

INT32_MAX = 2**31 - 1
GRID_Z_MAX = 65535  # CUDA's gridDim.z limit


def check_problem(N_q: int, N_k: int, d: int, dtype: str, batch: int = 1, heads: int = 1) -> str:
    for name, value in (("N_q", N_q), ("N_k", N_k), ("batch", batch), ("heads", heads)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not isinstance(d, int) or not (D_MIN <= d <= D_MAX) or d % D_MULTIPLE:
        raise ValueError(
            f"unsupported head dimension d={d!r}: expected a multiple of {D_MULTIPLE} "
            f"from {D_MIN} to {D_MAX}"
        )
    for name, value in (("N_q", N_q), ("N_k", N_k)):  # the kernels take lengths as int32
        if value > INT32_MAX:
            raise ValueError(f"{name}={value} exceeds the kernels' 32-bit lengths (at most {INT32_MAX})")
    if batch * heads > GRID_Z_MAX:  # every kernel's grid has one z-slice per (batch, head)
        raise ValueError(f"batch * heads = {batch * heads} exceeds CUDA's grid limit of {GRID_Z_MAX} "
                         "(gridDim.z: one slice per batch-head); split the call")
    return check_dtype(dtype)


def check_schedule(algorithm: str, schedule: str | None, direction: str) -> str:
    if direction not in ("fwd", "bwd"):
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}: expected one of {', '.join(ALGORITHMS)}")
    allowed = SCHEDULES.get((algorithm, direction))
    if allowed is None:
        raise ValueError(f"algorithm {algorithm!r} has no {direction} pass")
    if schedule is None:
        schedule = DEFAULT_SCHEDULE[algorithm] if DEFAULT_SCHEDULE[algorithm] in allowed else allowed[0]
    if schedule not in allowed:
        raise ValueError(
            f"unknown schedule {schedule!r} for {algorithm} {direction}: expected one of {', '.join(allowed)}"
        )
    return schedule




class Unsupported(ValueError):
    """This schedule does not take this problem (the tensor-core ``fast`` schedule: float16 and
    bfloat16, d of 64 or 128)."""


class SramTooSmall(ValueError):
    """No tiling of this plan fits in M; ``min_bytes`` is the smallest M that works."""

    def __init__(self, label: str, sram_bytes: int, min_bytes: int, detail: str):
        self.min_bytes = min_bytes
        super().__init__(
            f"--sram {sram_bytes} bytes is too small for {label} ({detail}); "
            f"the smallest M that works is {min_bytes} bytes"
        )




class TilesDoNotFit(ValueError):
    """Forced tiles (``block_r``/``block_c``) whose buffers do not fit in M."""


def check_block(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
