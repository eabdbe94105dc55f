"""Tiling plans: the one place where tile sizes, grids, threads and shared memory are decided.

Kernels, the CPU simulator and the model all read a :class:`Plan`; no tile size is written down
anywhere else. ``M`` (``sram_bytes``) is in bytes. Every stage's shared-memory layout is listed
buffer by buffer, and the plan guarantees its total never exceeds ``M`` (nor the GPU's per-block
limit when one is given).

Tile rules (M_el = M / itemsize, the paper's M in elements):

* ``flash``/``kv_outer`` (paper Algorithm 1) and the ``flash`` backward: B_c = ceil(M_el / 4d),
  B_r = min(B_c, d); when the buffers do not fit in M, B_c shrinks first, keeping B_c >= B_r, then B_r.
* ``flash``/``q_outer`` (FlashAttention-2 order) and ``two_pass``: the same rule with the roles
  swapped (the Q block is the resident one): B_r = ceil(M_el / 4d), B_c = min(B_r, d).
* ``standard``: tiled matrix products with square output tiles (128, 64, 32 or 16, the largest
  that fits) and row-wise softmax kernels; its traffic does not depend on M beyond that.

``make_plan(..., block_r=, block_c=)`` forces B_r and/or B_c (the block-size study of the paper's
Figure 2): a forced tile is used as given, and a tile left free follows the rule above relative to
it (the streamed block at most min(forced, d), the resident block at most ceil(M_el / 4d)), shrunk
until the buffers fit. A forced tiling that does not fit in M raises ValueError.

Causal attention (``make_plan(..., causal=True)``): key j is visible to query i iff
j <= i + offset, with offset = N_k - N_q for the **bottom-right** alignment (the default, like
FlashAttention-2 and torch's ``causal_lower_right``: the last query sees every key, as in decoding
with a KV cache) and offset = 0 for the **top-left** one (torch's ``is_causal=True``). With
bottom-right and N_q > N_k the first N_q - N_k queries see no key: their output is 0, their
logsumexp −inf and their gradients 0 (top-left never masks a whole row). Tiles do not change. The
tiled schedules (flash, two_pass) skip every (query block, key block) pair whose elements are all
masked, and load nothing for a query block (key block) with no visible pair; :func:`causal_sums`
gives what they then move. Standard attention computes every element of S (masked ones stored as
−inf, so P is 0 there): its bytes are those of the unmasked problem. Each causal kernel gets the
compile-time define ``CAUSAL`` (1 top-left, 2 bottom-right) as a stage parameter.

Block-sparse attention (``make_plan(..., block_mask=)``, :mod:`iokernels.masks`): the tiles are the
largest up to the usual ones that divide the mask's blocks; the stages that skip zero blocks carry
``BLOCK_SPARSE``; :func:`pair_sums` gives what they move.

Explicit masks (``make_plan(..., mask=ExplicitMask(...))``, :mod:`iokernels.masks`): a boolean or
additive element mask read from HBM as the tensor ``mask`` (shared by every batch·head or one per
batch·head). Tiles do not change; every computed (query block, key block) pair reads its mask elements
(the stages of :func:`supports_explicit_mask` carry ``MASK`` = 1 bool, 2 additive and
``MASK_BH_STRIDE`` = 0 shared, 1 per batch·head). Rows that see no key give O = 0, lse = −inf.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .dropout import Dropout
from .masks import BlockMask, ExplicitMask
from .units import ACC_ITEMSIZE, check_dtype, itemsize

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
GEMM_TILES = (128, 64, 32, 16)
GEMM_BK = 32
GEMM_PIPELINE_STAGES = 2
SMEM_ALIGN = 16

# causal alignments (Plan.causal); "" is no mask. CAUSAL_CODES: the kernels' CAUSAL define
CAUSAL_ALIGNMENTS = ("bottom_right", "top_left")
DEFAULT_CAUSAL_ALIGNMENT = "bottom_right"
CAUSAL_CODES = {"top_left": 1, "bottom_right": 2}

# Tensors stored in float32 whatever the input dtype; one byte per element; all others use the input dtype.
FLOAT32_TENSORS = frozenset({"m", "l", "lse", "D", "dQacc", "Oacc"})
BYTE_TENSORS = frozenset({"block_mask"})


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


def _layout(buffers: list[tuple[str, int]]) -> tuple[tuple[str, int, int], ...]:
    out, offset = [], 0
    for name, size in buffers:
        out.append((name, offset, size))
        offset = _align(offset + size)
    return tuple(out)


def _layout_bytes(buffers: list[tuple[str, int]]) -> int:
    return max((off + size for _, off, size in _layout(buffers)), default=0)


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
    # block-sparse attention (iokernels.masks): the tiles divide its blocks; None: every block computed
    block_mask: BlockMask | None = None
    # an explicit element mask read from HBM (tensor "mask"; iokernels.masks.ExplicitMask); None: none
    mask: ExplicitMask | None = None
    # dropout on P (iokernels.dropout.Dropout: p, seed, offset); None: none. Moves no HBM bytes.
    dropout: Dropout | None = None

    def __post_init__(self) -> None:
        if self.causal not in ("", *CAUSAL_ALIGNMENTS):
            allowed = " or ".join(map(repr, CAUSAL_ALIGNMENTS))
            raise ValueError(f"Plan.causal must be '' or {allowed}, got {self.causal!r}")
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
        if tensor == "mask":
            return self.mask.itemsize if self.mask is not None else 1
        return ACC_ITEMSIZE if tensor in FLOAT32_TENSORS else self.itemsize

    def block_grid(self) -> np.ndarray:
        """The block mask on this plan's tile grid, (T_r, T_c) of uint8: what the kernels read."""
        tile = self.tile
        return self.block_mask.refine(tile["Br"], tile["Bc"]).astype(np.uint8)

    def element_mask(self) -> np.ndarray | None:
        """Boolean (N_q, N_k) of the block mask (the causal mask not included); None without one."""
        return None if self.block_mask is None else self.block_mask.element_mask()

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

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
            **({"block_mask": self.block_mask.as_dict()} if self.block_mask is not None else {}),
            **({"mask": self.mask.as_dict()} if self.mask is not None else {}),
            **({"dropout": self.dropout.as_dict()} if self.dropout is not None else {}),
            "tiles": dict(self.tiles),
            "smem_bytes": self.smem_bytes,
            "stages": [s.as_dict() for s in self.stages],
        }


# ---------------------------------------------------------------------------------------------
# shared-memory layouts per kernel family (bytes as functions of tiles)

def _gemm_buffers(bm: int, bn: int, bk: int, e: int) -> list[tuple[str, int]]:
    # A and B tiles, double-buffered so the next k-slice loads while this one multiplies
    return [("A", GEMM_PIPELINE_STAGES * bm * bk * e), ("B", GEMM_PIPELINE_STAGES * bk * bn * e)]


def _rowwise_buffers() -> list[tuple[str, int]]:
    # 16 bytes per warp and per counted tensor (a row kernel moves at most 4): block reductions, and
    # room for the counting build to flush all its counters behind a single barrier
    return [("partials", ROWWISE_THREADS // 32 * 16 * 4)]


def _flash_fwd_buffers(br: int, bc: int, d: int, e: int) -> list[tuple[str, int]]:
    f = ACC_ITEMSIZE
    return [("Q", br * d * e), ("K", bc * d * e), ("V", bc * d * e), ("O", br * d * f),
            ("S", br * bc * f), ("m", br * f), ("l", br * f)]


def _two_pass_stats_buffers(br: int, bc: int, d: int, e: int) -> list[tuple[str, int]]:
    f = ACC_ITEMSIZE
    return [("Q", br * d * e), ("K", bc * d * e), ("S", br * bc * f), ("m", br * f), ("l", br * f)]


def _two_pass_store_output_buffers(br: int, bc: int, d: int, e: int) -> list[tuple[str, int]]:
    f = ACC_ITEMSIZE
    return [("S", br * bc * f), ("V", bc * d * e), ("O", br * d * f), ("m", br * f), ("l", br * f)]


def _flash_bwd_buffers(br: int, bc: int, d: int, e: int) -> list[tuple[str, int]]:
    f = ACC_ITEMSIZE
    return [("K", bc * d * e), ("V", bc * d * e), ("dK", bc * d * f), ("dV", bc * d * f),
            ("Q", br * d * e), ("dO", br * d * e), ("P", br * bc * f), ("dS", br * bc * f),
            ("lse", br * f), ("D", br * f)]


_BLOCK_BUFFERS: dict[tuple[str, str, str], list[Callable[[int, int, int, int], list]]] = {
    ("flash", "kv_outer", "fwd"): [_flash_fwd_buffers],
    ("flash", "q_outer", "fwd"): [_flash_fwd_buffers],
    ("two_pass", "store", "fwd"): [_two_pass_stats_buffers, _two_pass_store_output_buffers],
    ("two_pass", "recompute", "fwd"): [_two_pass_stats_buffers, _flash_fwd_buffers],
    ("flash", "kv_outer", "bwd"): [_flash_bwd_buffers],
}
_Q_RESIDENT = {("flash", "q_outer", "fwd"), ("two_pass", "store", "fwd"),
               ("two_pass", "recompute", "fwd")}


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


def normalize_causal(causal: bool | str | None) -> str:
    """The canonical alignment of a ``causal`` argument: False/None/"" -> "" (no mask), True -> the
    default (bottom-right), "bottom_right"/"bottom-right"/"top_left"/"top-left" -> that alignment."""
    if type(causal).__name__ in ("bool", "bool_"):  # Python's or numpy's
        causal = bool(causal)
    if causal is None or causal is False or causal == "":
        return ""
    if causal is True:
        return DEFAULT_CAUSAL_ALIGNMENT
    if isinstance(causal, str):
        name = causal.strip().lower().replace("-", "_")
        if name in CAUSAL_ALIGNMENTS:
            return name
    raise ValueError(f"unknown causal alignment {causal!r}: expected True, False, "
                     "'bottom_right' (the default for True) or 'top_left'")


def causal_offset(n_q: int, n_k: int, causal: str) -> int:
    """Key j is visible to query i iff j <= i + offset: N_k - N_q bottom-right, 0 top-left."""
    return n_k - n_q if causal == "bottom_right" else 0


def visible_key_blocks(n_q: int, n_k: int, br: int, bc: int, causal: str) -> list[int]:
    """For each query block i (rows [i·br, min((i+1)·br, n_q))), how many key blocks of bc it
    reads under the causal mask: those with any element visible to its last row, a prefix of the
    key blocks (0 when every element of the block's rows is masked; all of them without a mask)."""
    tc = _cdiv(n_k, bc)
    if not causal:
        return [tc] * _cdiv(n_q, br)
    off = causal_offset(n_q, n_k, causal)
    out = []
    for row0 in range(0, n_q, br):
        last = min(row0 + br, n_q) - 1 + off  # the largest key any row of the block sees
        out.append(0 if last < 0 else min(tc, last // bc + 1))
    return out


def causal_sums(n_q: int, n_k: int, br: int, bc: int, causal: str) -> dict[str, int]:
    """What the tiled schedules move under the causal mask, summed over the visible
    (query block i, key block j) pairs (rows_i, cols_j: the blocks' in-range rows):

    * ``R_K`` = Σ cols_j: key rows a query-block loop loads (q_outer, two_pass); N_k·T_r unmasked
    * ``R_Q`` = Σ rows_i: query rows a key-block loop loads (kv_outer, the backward); N_q·T_c
    * ``A_S`` = Σ rows_i·cols_j: elements of the visible S blocks (two_pass store); N_q·N_k
    * ``N_qv`` = Σ rows_i over query blocks with a visible pair; N_q
    * ``N_kv`` = Σ cols_j over key blocks with a visible pair; N_k
    """
    vis = visible_key_blocks(n_q, n_k, br, bc, causal)
    rows = [min(br, n_q - row0) for row0 in range(0, n_q, br)]
    keys = [min(n_k, v * bc) for v in vis]  # key rows of the visible prefix (only the last block is ragged)
    return {"R_K": sum(keys), "R_Q": sum(r * v for r, v in zip(rows, vis, strict=True)),
            "A_S": sum(r * k for r, k in zip(rows, keys, strict=True)),
            "N_qv": sum(r for r, v in zip(rows, vis, strict=True) if v), "N_kv": max(keys, default=0)}


def pair_grid(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(computed, causal): boolean (T_r, T_c) grids of the (query block, key block) pairs of a tiled
    plan; ``causal`` the pairs its loops visit (all without a causal mask), ``computed`` those of them
    the block mask keeps (the same without one)."""
    tile = plan.tile
    br, bc = tile["Br"], tile["Bc"]
    vis = visible_key_blocks(plan.N_q, plan.N_k, br, bc, plan.causal)
    causal = np.arange(_cdiv(plan.N_k, bc))[None, :] < np.array(vis)[:, None]
    return (causal & plan.block_grid().astype(bool) if plan.block_mask is not None else causal), causal


def pair_sums(plan: Plan) -> dict[str, int]:
    """:func:`causal_sums` over the pairs a tiled plan computes (causal mask and block mask), and
    ``N_bm``: block-mask entries its kernels read per (batch, head), one per pair they visit (the
    causally visible pairs; T_r·T_c without a causal mask)."""
    computed, causal = pair_grid(plan)
    tile = plan.tile
    rows = np.minimum(tile["Br"], plan.N_q - np.arange(0, plan.N_q, tile["Br"]))
    cols = np.minimum(tile["Bc"], plan.N_k - np.arange(0, plan.N_k, tile["Bc"]))
    g = computed.astype(np.int64)
    return {"R_K": int((g * cols[None, :]).sum()), "R_Q": int((g * rows[:, None]).sum()),
            "A_S": int((g * rows[:, None] * cols[None, :]).sum()),
            "N_qv": int(rows[computed.any(axis=1)].sum()), "N_kv": int(cols[computed.any(axis=0)].sum()),
            "N_bm": int(causal.sum())}


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


# ---------------------------------------------------------------------------------------------
# tile selection

def _fit_largest(upper: int, fits: Callable[[int], bool]) -> int:
    """Largest x in [1, upper] with fits(x) (monotone: fits(x) implies fits(x - 1)), else 0."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _block_tiles(key: tuple[str, str, str], d: int, e: int, sram: int) -> tuple[int, int]:
    """(B_r, B_c) by the paper's rule, shrunk until every stage's buffers fit in ``sram``."""
    families = _BLOCK_BUFFERS[key]

    def smem(br: int, bc: int) -> int:
        return max(_layout_bytes(f(br, bc, d, e)) for f in families)

    label = "/".join(key)
    min_bytes = smem(1, 1)
    if min_bytes > sram:
        raise SramTooSmall(label, sram, min_bytes, f"d={d}, {e}-byte elements, tiles B_r=B_c=1")
    big = max(1, _cdiv(sram // e, 4 * d))
    small = min(big, d)
    if key in _Q_RESIDENT:
        # the Q block (B_r rows) is resident; K/V stream in blocks of B_c <= B_r
        for bc in range(small, 0, -1):
            br = _fit_largest(big, lambda r, bc=bc: smem(r, bc) <= sram)
            if br >= bc:
                return br, bc
    else:
        # the K/V block (B_c rows) is resident; Q/O stream in blocks of B_r <= B_c
        for br in range(small, 0, -1):
            bc = _fit_largest(big, lambda c, br=br: smem(br, c) <= sram)
            if bc >= br:
                return br, bc
    raise AssertionError("unreachable: B_r = B_c = 1 fits")  # pragma: no cover


class TilesDoNotFit(ValueError):
    """Forced tiles (``block_r``/``block_c``) whose buffers do not fit in M."""


def _check_block(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _forced_block_tiles(key: tuple[str, str, str], d: int, e: int, sram: int, block_r: int | None,
                        block_c: int | None) -> tuple[int, int]:
    """(B_r, B_c) with one or both forced; the free one by the paper's rule relative to the forced
    one, shrunk until the buffers fit. ValueError when the forced tiling does not fit in ``sram``."""
    families = _BLOCK_BUFFERS[key]

    def smem(br: int, bc: int) -> int:
        return max(_layout_bytes(f(br, bc, d, e)) for f in families)

    big = max(1, _cdiv(sram // e, 4 * d))
    resident_is_r = key in _Q_RESIDENT
    br, bc = block_r, block_c
    if br is None:
        # B_r free: the streamed block (kv_outer, backward) at most min(B_c, d); else the resident one
        upper = big if resident_is_r else min(bc, d)
        br = _fit_largest(upper, lambda r: smem(r, bc) <= sram)
    elif bc is None:
        upper = min(br, d) if resident_is_r else big
        bc = _fit_largest(upper, lambda c: smem(br, c) <= sram)
    if br == 0 or bc == 0 or smem(br, bc) > sram:
        forced = ", ".join(f"{n}={v}" for n, v in (("B_r", block_r), ("B_c", block_c)) if v is not None)
        need = smem(max(br, 1), max(bc, 1))
        raise TilesDoNotFit(
            f"forced tiles {forced} do not fit in --sram {sram} bytes for {'/'.join(key)} "
            f"(d={d}, {e}-byte elements): B_r={max(br, 1)}, B_c={max(bc, 1)} need {need} bytes of shared memory"
        )
    return br, bc


def _gemm_tiles(e: int, sram: int, label: str) -> tuple[int, int, int]:
    for t in GEMM_TILES:
        for bk in (GEMM_BK, 16, 8):
            if max(_layout_bytes(_gemm_buffers(t, t, bk, e)), _layout_bytes(_rowwise_buffers())) <= sram:
                return t, t, bk
    t, bk = GEMM_TILES[-1], 8
    need = max(_layout_bytes(_gemm_buffers(t, t, bk, e)), _layout_bytes(_rowwise_buffers()))
    raise SramTooSmall(label, sram, need, f"{e}-byte elements, tiles {t}x{t}x{bk}")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _rowwise_stage(name: str, kernel: str, n_rows: int, row_length: int, bh: int) -> Stage:
    """A row-wise kernel: each block walks ROWS_PER_BLOCK rows (more when rows are short, so that
    a block's work outweighs its start and its counter flush)."""
    rows = max(1, min(MAX_ROWS_PER_BLOCK, ROW_ELEMENTS_PER_BLOCK // row_length))
    return Stage(name, kernel, (_cdiv(n_rows, rows), 1, bh), ROWWISE_THREADS, _layout(_rowwise_buffers()),
                 (("ROWS_PER_BLOCK", rows),))


def make_plan(
    algorithm: str,
    schedule: str | None = None,
    *,
    N_q: int,
    N_k: int | None = None,
    d: int,
    dtype: str = "float32",
    sram: int,
    batch: int = 1,
    heads: int = 1,
    direction: str = "fwd",
    smem_limit: int | None = None,
    block_r: int | None = None,
    block_c: int | None = None,
    kv_heads: int | None = None,
    causal: bool | str = False,
    block_mask: BlockMask | None = None,
    mask: ExplicitMask | None = None,
    dropout: Dropout | None = None,
) -> Plan:
    """Decide the tiles of one algorithm/schedule/direction for a problem and an SRAM size.

    ``sram`` is M in bytes; ``smem_limit`` is the GPU's per-block shared-memory limit (bytes).
    ``block_r``/``block_c`` force B_r/B_c of flash and two_pass (see the module docstring).
    Raises ValueError (SramTooSmall when no tiling fits, naming the smallest M that works;
    TilesDoNotFit when forced tiles do not fit in M). ``kv_heads`` (grouped-query attention: K and
    V with fewer heads, each shared by heads / kv_heads query heads) is taken by flash/fast only (the
    backward by its wgmma kernel, sm_90).
    ``causal``: False, True (bottom-right alignment, the default), "bottom_right" or "top_left"
    (module docstring); flash/fast/bwd takes causal with its wgmma kernel only (sm_90; Unsupported
    elsewhere).
    ``block_mask``: block-sparse attention (:class:`iokernels.masks.BlockMask`, the paper's Algorithm 5)
    by the research tiled schedules (:func:`supports_block_sparse`; Unsupported elsewhere). The tiles
    are the largest ones up to the usual ones that divide the mask's blocks (forced tiles must divide
    them), so each (query block, key block) pair lies in one mask block; with ``causal`` both masks apply.
    ``mask``: an explicit element mask (:class:`iokernels.masks.ExplicitMask`) read from HBM by the
    schedules of :func:`supports_explicit_mask` (Unsupported elsewhere); it combines with the others.
    ``dropout``: dropout on P (:class:`iokernels.dropout.Dropout`), by the stages of
    :func:`supports_dropout` (Unsupported elsewhere); tiles and bytes do not change.
    """
    N_k = N_q if N_k is None else N_k
    dtype = check_problem(N_q, N_k, d, dtype, batch, heads)
    schedule = check_schedule(algorithm, schedule, direction)
    causal = normalize_causal(causal)
    args = dict(N_q=N_q, N_k=N_k, d=d, dtype=dtype, sram=sram, batch=batch, heads=heads, direction=direction,
                smem_limit=smem_limit, kv_heads=kv_heads, causal=causal)
    # a mask or dropout no kernel of this schedule takes is refused before any tiling (whatever M)
    if mask is not None:
        _check_explicit_mask((algorithm, schedule, direction), mask)
    if dropout is not None:
        _check_dropout((algorithm, schedule, direction), dropout)
    if block_mask is not None:
        block_r, block_c = _block_sparse_tiles(algorithm, schedule, block_mask, block_r, block_c, args)
    plan = _make_plan(algorithm, schedule, block_r=block_r, block_c=block_c, dropout=dropout is not None, **args)
    return with_dropout(with_mask(with_block_mask(with_causal(plan, causal), block_mask), mask), dropout)


# the stages whose kernels apply dropout to P (DROPOUT define; iokernels.dropout): every stage that uses
# the dropped P (Z ∘ P) or the dropped dP (Z ∘ dO Vᵀ)
_DROPOUT_STAGES: dict[tuple[str, str, str], tuple[str, ...]] = {
    # standard: pv reads P and applies Z (O = (Z ∘ P) V); the backward's dv applies it to P, rowdot and ds to
    # the stored raw dP = dO Vᵀ (D = rowsum(P ∘ Z ∘ dP), dS = P ∘ (Z ∘ dP − D)); P itself stays undropped
    ("standard", "default", "fwd"): ("pv",),
    ("standard", "default", "bwd"): ("dv", "rowdot", "ds"),
    ("flash", "q_outer", "fwd"): ("main",),
    ("flash", "kv_outer", "fwd"): ("main",),
    ("two_pass", "store", "fwd"): ("output",),
    ("two_pass", "recompute", "fwd"): ("output",),
    ("flash", "kv_outer", "bwd"): ("main",),
    # flash/fast: the wgmma kernels only (flash_wgmma.cu, flash_wgmma_bwd.cu); with_dropout refuses the mma.sync
    # ones (flash_tc.cu, flash_tc_bwd.cu and the deterministic variant)
    ("flash", "fast", "fwd"): ("main",),
    ("flash", "fast", "bwd"): ("main",),
}


def supports_dropout(algorithm: str, schedule: str, direction: str) -> bool:
    """Whether ``make_plan(algorithm, schedule, direction=direction, dropout=...)`` has kernels."""
    return (algorithm, schedule, direction) in _DROPOUT_STAGES


def _check_dropout(key: tuple[str, str, str], dropout: object) -> None:
    if not isinstance(dropout, Dropout):
        raise TypeError(f"dropout must be an iokernels.dropout.Dropout, got {type(dropout).__name__}")
    if key not in _DROPOUT_STAGES:
        have = ", ".join("/".join(k) for k in _DROPOUT_STAGES) or "none yet"
        raise Unsupported(f"dropout is not implemented by {'/'.join(key)} (plans with dropout: {have})")


def with_dropout(plan: Plan, dropout: Dropout | None) -> Plan:
    """``plan`` with dropout on P: its ``dropout`` field set and the ``DROPOUT`` define added to the stages
    that apply it. A dropout of p = 0 is kept (the kernels then keep every element)."""
    if dropout is None:
        return plan
    key = (plan.algorithm, plan.schedule, plan.direction)
    _check_dropout(key, dropout)
    if plan.variant:
        raise Unsupported(f"dropout is not implemented by {plan.label}")
    if plan.schedule == "fast" and plan.stage("main").kernel not in ("flash_wgmma_fwd", "flash_wgmma_bwd"):
        raise Unsupported(f"dropout in flash/fast is implemented by the wgmma kernels (sm_90); the mma.sync kernel "
                          f"{plan.stage('main').kernel} has none")
    stages = tuple(replace(s, params=(*s.params, ("DROPOUT", 1))) if s.name in _DROPOUT_STAGES[key] else s
                   for s in plan.stages)
    return replace(plan, dropout=dropout, stages=stages)


# the stages whose kernels read an explicit mask (MASK, MASK_BH_STRIDE defines)
_MASK_STAGES: dict[tuple[str, str, str], tuple[str, ...]] = {
    # standard: the qk epilogue reads the mask element of every S element it stores (rowsum and normalize
    # give rows with no visible key P = 0 in every build); the backward reads none (P is 0 where masked)
    ("standard", "default", "fwd"): ("qk",),
    ("standard", "default", "bwd"): (),
    ("flash", "q_outer", "fwd"): ("main",),
    ("flash", "kv_outer", "bwd"): ("main",),
}


def supports_explicit_mask(algorithm: str, schedule: str, direction: str) -> bool:
    """Whether ``make_plan(algorithm, schedule, direction=direction, mask=...)`` has kernels."""
    return (algorithm, schedule, direction) in _MASK_STAGES


def _check_explicit_mask(key: tuple[str, str, str], mask: object) -> None:
    if not isinstance(mask, ExplicitMask):
        raise TypeError(f"mask must be an iokernels.masks.ExplicitMask, got {type(mask).__name__}")
    if key not in _MASK_STAGES:
        raise Unsupported(f"explicit masks are not implemented by {'/'.join(key)}: use flash/q_outer "
                          "(forward) or flash/kv_outer (backward)")


def with_mask(plan: Plan, mask: ExplicitMask | None) -> Plan:
    """``plan`` with an explicit mask: its ``mask`` field set and the ``MASK`` (1 bool, 2 additive) and
    ``MASK_BH_STRIDE`` (0 shared, 1 per batch·head) defines added to the stages that read it."""
    if mask is None:
        return plan
    key = (plan.algorithm, plan.schedule, plan.direction)
    _check_explicit_mask(key, mask)
    if plan.variant:
        raise Unsupported(f"explicit masks are not implemented by {plan.label}")
    stages = tuple(replace(s, params=(*s.params, ("MASK", mask.code), ("MASK_BH_STRIDE", mask.bh_stride)))
                   if s.name in _MASK_STAGES[key] else s for s in plan.stages)
    return replace(plan, mask=mask, stages=stages)


# the stages whose kernels skip the zero blocks of a block mask (BLOCK_SPARSE define)
_BLOCK_SPARSE_STAGES: dict[tuple[str, str, str], tuple[str, ...]] = {
    ("two_pass", "store", "fwd"): ("stats", "output"),
    ("two_pass", "recompute", "fwd"): ("stats", "output"),
    ("flash", "kv_outer", "fwd"): ("main",),
    ("flash", "q_outer", "fwd"): ("main",),
    ("flash", "kv_outer", "bwd"): ("main",),
}


def supports_block_sparse(algorithm: str, schedule: str, direction: str) -> bool:
    """Whether ``make_plan(algorithm, schedule, direction=direction, block_mask=...)`` has kernels."""
    return (algorithm, schedule, direction) in _BLOCK_SPARSE_STAGES


def _check_block_mask(key: tuple[str, str, str], block_mask: object, n_q: int, n_k: int) -> None:
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be an iokernels.masks.BlockMask, got {type(block_mask).__name__}")
    if key not in _BLOCK_SPARSE_STAGES:
        why = {"standard": "standard attention computes all of S (it has no blocks to skip)",
               "fast": "the tensor-core kernels have no block-sparse variant yet; use flash/q_outer "
                       "(forward) or flash/kv_outer (backward)"}
        raise Unsupported(f"block-sparse attention is not implemented by {'/'.join(key)}: "
                          f"{why.get(key[0], why.get(key[1], 'no kernel'))}")
    if (block_mask.n_q, block_mask.n_k) != (n_q, n_k):
        raise ValueError(f"block mask made for N_q={block_mask.n_q}, N_k={block_mask.n_k} given to a problem "
                         f"with N_q={n_q}, N_k={n_k}")


def _largest_divisor(n: int, upper: int) -> int:
    return next(x for x in range(min(n, upper), 0, -1) if n % x == 0)


def _block_sparse_tiles(algorithm: str, schedule: str, block_mask: BlockMask, block_r: int | None,
                        block_c: int | None, args: dict) -> tuple[int, int]:
    """(B_r, B_c) for a block-sparse plan: forced ones as given (they must divide the mask's blocks),
    free ones the largest divisors of the blocks up to the usual tiles."""
    _check_block_mask((algorithm, schedule, args["direction"]), block_mask, args["N_q"], args["N_k"])
    for name, value, block in (("block_r", block_r, block_mask.block_q), ("block_c", block_c, block_mask.block_k)):
        _check_block(name, value)
        if value is not None and block % value:
            raise ValueError(f"{name}={value} does not divide the block mask's block size {block}: "
                             "block-sparse tiles must lie inside one mask block")
    if block_r is not None and block_c is not None:
        return block_r, block_c
    tile = _make_plan(algorithm, schedule, block_r=block_r, block_c=block_c, **args).tile
    return (block_r or _largest_divisor(block_mask.block_q, tile["Br"]),
            block_c or _largest_divisor(block_mask.block_k, tile["Bc"]))


def with_block_mask(plan: Plan, block_mask: BlockMask | None) -> Plan:
    """``plan`` with a block mask: its ``block_mask`` field set and the ``BLOCK_SPARSE`` define added
    to the stages whose kernels skip zero blocks. The plan's tiles must divide the mask's blocks."""
    if block_mask is None:
        return plan
    key = (plan.algorithm, plan.schedule, plan.direction)
    _check_block_mask(key, block_mask, plan.N_q, plan.N_k)
    if plan.variant:
        raise Unsupported(f"block-sparse attention is not implemented by {plan.label}")
    block_mask.refine(plan.tile["Br"], plan.tile["Bc"])  # ValueError unless the tiles divide its blocks
    sparse = _BLOCK_SPARSE_STAGES[key]
    stages = tuple(replace(s, params=(*s.params, ("BLOCK_SPARSE", 1))) if s.name in sparse else s
                   for s in plan.stages)
    return replace(plan, block_mask=block_mask, stages=stages)


# the stages whose kernels take the causal mask (CAUSAL define); the others are the unmasked ones
_CAUSAL_STAGES: dict[tuple[str, str, str], tuple[str, ...]] = {
    ("standard", "default", "fwd"): ("qk", "rowsum", "normalize"),  # S = -inf where masked; rows with none
    ("standard", "default", "bwd"): (),  # P is 0 where masked: the backward's products need no mask
    ("two_pass", "store", "fwd"): ("stats", "output"),
    ("two_pass", "recompute", "fwd"): ("stats", "output"),
    ("flash", "kv_outer", "fwd"): ("main",),
    ("flash", "q_outer", "fwd"): ("main",),
    ("flash", "fast", "fwd"): ("main",),  # flash_wgmma.cu and the mma.sync flash_tc.cu
    ("flash", "kv_outer", "bwd"): ("main",),
    ("flash", "fast", "bwd"): ("main",),  # the wgmma backward (flash_wgmma_bwd.cu) only
}


def supports_causal(algorithm: str, schedule: str, direction: str) -> bool:
    """Whether ``make_plan(algorithm, schedule, direction=direction, causal=True)`` has kernels."""
    return (algorithm, schedule, direction) in _CAUSAL_STAGES


def with_causal(plan: Plan, causal: bool | str) -> Plan:
    """``plan`` with the causal mask: its ``causal`` field set and the ``CAUSAL`` define (1 top-left,
    2 bottom-right) added to the parameters of the stages whose kernels apply the mask."""
    causal = normalize_causal(causal)
    if not causal:
        return plan
    key = (plan.algorithm, plan.schedule, plan.direction)
    if key not in _CAUSAL_STAGES or plan.variant:
        raise Unsupported(f"causal attention is not implemented by {plan.label} yet")
    masked = _CAUSAL_STAGES[key]
    if key == ("flash", "fast", "bwd") and plan.stage("main").kernel != "flash_wgmma_bwd":
        raise Unsupported("the causal tensor-core backward is the wgmma kernel (sm_90); the mma.sync backward "
                          "kernels (flash_tc_bwd.cu, and deterministic=True) have no causal mask")
    stages = tuple(replace(s, params=(*s.params, ("CAUSAL", CAUSAL_CODES[causal]))) if s.name in masked else s
                   for s in plan.stages)
    return replace(plan, causal=causal, stages=stages)


def _make_plan(
    algorithm: str,
    schedule: str,
    *,
    N_q: int,
    N_k: int,
    d: int,
    dtype: str,
    sram: int,
    batch: int,
    heads: int,
    direction: str,
    smem_limit: int | None,
    block_r: int | None,
    block_c: int | None,
    kv_heads: int | None,
    causal: str,
    dropout: bool = False,
) -> Plan:
    if kv_heads is not None and kv_heads != heads:
        if not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
            raise ValueError(f"kv_heads must divide heads={heads}, got {kv_heads!r}")
        if (algorithm, schedule) != ("flash", "fast"):
            raise Unsupported(f"grouped-query attention (kv_heads={kv_heads} < heads={heads}) is implemented by "
                              f"flash/fast only, not {algorithm}/{schedule}/{direction}")
    if not isinstance(sram, int) or sram <= 0:
        raise ValueError(f"sram must be a positive number of bytes, got {sram!r}")
    if smem_limit is not None and sram > smem_limit:
        raise ValueError(
            f"--sram {sram} bytes exceeds the GPU's per-block shared-memory limit of {smem_limit} bytes"
        )
    _check_block("block_r", block_r)
    _check_block("block_c", block_c)
    forced = block_r is not None or block_c is not None
    if schedule == "fast":
        # the tensor-core kernels (iokernels.fast, iokernels.fast_bwd): fixed tiles, which must fit in
        # M like any plan's; its plan records the M they use (its effective M), which the Θ form and
        # the model take
        from .fast import _TooSmall, make_fast_plan_within
        from .fast_bwd import fit_fast_backward_plan

        if forced:
            raise ValueError("block_r/block_c do not apply to flash/fast: its tiles are fixed")
        if direction == "fwd":  # the fastest of the forward kernel's tilings that fits M
            try:
                return make_fast_plan_within(sram, N_q=N_q, N_k=N_k, d=d, dtype=dtype, batch=batch, heads=heads,
                                             kv_heads=kv_heads, wgmma_only=dropout)
            except _TooSmall as exc:
                raise SramTooSmall("flash/fast/fwd", sram, exc.plan.smem_bytes,
                                   f"{exc.detail}, {itemsize(dtype)}-byte elements") from None
        # the backward: its default tiles, or B_c = 64 where those do not fit M
        plan = fit_fast_backward_plan(sram=sram, N_q=N_q, N_k=N_k, d=d, dtype=dtype, batch=batch, heads=heads,
                                      kv_heads=kv_heads, wgmma_only=bool(causal), dropout=dropout)
        if plan.smem_bytes > sram:
            raise SramTooSmall(f"flash/fast/{direction}", sram, plan.smem_bytes,
                               f"d={d}, {itemsize(dtype)}-byte elements, its fixed tiles {plan.describe_tiles()}")
        return plan
    if forced and algorithm == "standard":
        raise ValueError("block_r/block_c set the B_r x B_c attention tiles of flash and two_pass; "
                         "standard attention has none (its matrix-product tiles follow M)")
    e = itemsize(dtype)
    bh = batch * heads
    key = (algorithm, schedule, direction)
    common = dict(algorithm=algorithm, schedule=schedule, direction=direction, N_q=N_q, N_k=N_k,
                  d=d, dtype=dtype, sram_bytes=sram, batch=batch, heads=heads)

    if algorithm == "standard":
        bm, bn, bk = _gemm_tiles(e, sram, "/".join(key))
        gemm_smem = _layout(_gemm_buffers(bm, bn, bk, e))

        def gemm(name: str, m: int, n: int) -> Stage:
            return Stage(name, "gemm", (_cdiv(n, bn), _cdiv(m, bm), bh), THREADS, gemm_smem)

        def rowwise(name: str) -> Stage:
            return _rowwise_stage(name, name, N_q, N_k, bh)

        if direction == "fwd":
            stages = (gemm("qk", N_q, N_k), rowwise("rowmax"), rowwise("rowsum"),
                      rowwise("normalize"), gemm("pv", N_q, d))
        else:
            stages = (gemm("dv", N_k, d), gemm("dp", N_q, N_k), rowwise("rowdot"), rowwise("ds"),
                      gemm("dq", N_q, d), gemm("dk", N_k, d))
        tiles = (("BM", bm), ("BN", bn), ("BK", bk))
        return Plan(**common, tiles=tiles, stages=stages)

    # flash kv_outer's forward and the flash backward also run row-wise stages, whose buffers must fit M too
    rowwise_need = _layout_bytes(_rowwise_buffers()) if schedule == "kv_outer" else 0
    try:
        if forced:
            br, bc = _forced_block_tiles(key, d, e, sram, block_r, block_c)
        else:
            br, bc = _block_tiles(key, d, e, sram)
    except SramTooSmall as exc:
        if exc.min_bytes >= rowwise_need:
            raise
        raise SramTooSmall("/".join(key), sram, rowwise_need, f"its row-wise stages, d={d}, {e}-byte elements"
                           ) from None
    if sram < rowwise_need:
        raise SramTooSmall("/".join(key), sram, rowwise_need,
                           f"its row-wise stages' {rowwise_need}-byte buffers, d={d}, {e}-byte elements")
    tr, tc = _cdiv(N_q, br), _cdiv(N_k, bc)
    fams = [_layout(f(br, bc, d, e)) for f in _BLOCK_BUFFERS[key]]
    if key == ("flash", "kv_outer", "fwd"):
        # Algorithm 1 literally: one block per (batch, head) owns the sequential j loop, so K_j and
        # V_j are read once; O, l, m start in HBM (the init stage) and make a round trip per j.
        # O travels as a float32 accumulator (Oacc), so float16/bfloat16 runs accumulate in float32
        # like every other schedule; the finalize stage rounds it to the output dtype once.
        stages = (_rowwise_stage("init", "flash_init", N_q, d, bh),
                  Stage("main", "flash_kv_outer", (1, 1, bh), THREADS, fams[0]),
                  _rowwise_stage("finalize", "flash_finalize", N_q, d, bh))
    elif key == ("flash", "q_outer", "fwd"):
        stages = (Stage("main", "flash_q_outer", (tr, 1, bh), THREADS, fams[0]),)
    elif algorithm == "two_pass":
        second = "two_pass_store_output" if schedule == "store" else "two_pass_recompute_output"
        stages = (Stage("stats", f"two_pass_stats_{schedule}", (tr, 1, bh), THREADS, fams[0]),
                  Stage("output", second, (tr, 1, bh), THREADS, fams[1]))
    else:  # flash backward
        stages = (_rowwise_stage("prep", "flash_bwd_prep", N_q, d, bh),
                  Stage("main", "flash_bwd_kv_outer", (tc, 1, bh), THREADS, fams[0]),
                  _rowwise_stage("dq", "flash_bwd_dq", N_q, d, bh))
    tiles = (("Br", br), ("Bc", bc), ("Tr", tr), ("Tc", tc))
    plan = Plan(**common, tiles=tiles, stages=stages)
    assert plan.smem_bytes <= sram, (plan.smem_bytes, sram)
    return plan


def all_plans(
    *,
    N_q: int,
    N_k: int | None = None,
    d: int,
    dtype: str = "float32",
    sram: int,
    batch: int = 1,
    heads: int = 1,
    backward: bool = False,
    smem_limit: int | None = None,
    causal: bool | str = False,
    block_mask: BlockMask | None = None,
    kv_heads: int | None = None,
    mask: ExplicitMask | None = None,
    dropout: Dropout | None = None,
) -> list[Plan]:
    """Every algorithm and schedule (forward, plus backward when asked), in display order; with
    ``causal``, those that implement the causal mask (flash/fast/bwd: its wgmma kernel only); with
    ``block_mask``, those that implement block-sparse attention; with ``kv_heads`` < ``heads``
    (grouped-query attention), flash/fast only; with an explicit ``mask`` or ``dropout``, those that
    implement it."""
    directions = ("fwd", "bwd") if backward else ("fwd",)
    plans, too_small = [], []
    for algorithm in ALGORITHMS:
        for direction in directions:
            for schedule in SCHEDULES.get((algorithm, direction), ()):
                try:
                    plans.append(make_plan(algorithm, schedule, N_q=N_q, N_k=N_k, d=d, dtype=dtype,
                                           sram=sram, batch=batch, heads=heads, direction=direction,
                                           smem_limit=smem_limit, causal=causal, block_mask=block_mask,
                                           kv_heads=kv_heads, mask=mask, dropout=dropout))
                except SramTooSmall as exc:
                    too_small.append((exc.min_bytes, f"{algorithm}/{schedule}/{direction}"))
                except Unsupported:
                    continue  # flash/fast takes float16/bfloat16 and d of 64 or 128 only
    if too_small:
        need, label = max(too_small)
        raise SramTooSmall(f"every algorithm (largest need: {label})", sram, need, f"d={d}, {dtype}")
    return plans


def min_sram(algorithm: str, schedule: str | None = None, *, d: int, dtype: str = "float32",
             direction: str = "fwd") -> int:
    """The smallest M (bytes) for which :func:`make_plan` finds a tiling."""
    try:
        make_plan(algorithm, schedule, N_q=1, d=d, dtype=dtype, sram=1, direction=direction)
    except SramTooSmall as exc:
        return exc.min_bytes
    return 1  # pragma: no cover
