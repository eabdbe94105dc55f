"""Configurations of ``iokernels bench`` and the work they count (FlashAttention-2's FLOP convention)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..plan import check_problem, normalize_documents, visible_area
from ..plan.causal import key_intervals
from ..plan.masks import DEFAULT_BLOCK, PATTERNS, BlockMask, check_density, pattern
from ..plan.units import check_dtype, itemsize
from ..plan.variants import geometric_slopes

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
# bench --decode (issue #23): N_q new query tokens against a K/V cache of N_k tokens
DECODE_DS, DECODE_DTYPES = (128,), ("float16",)
DECODE_HEADS = ((64, 8), (8, 8))  # (H, H_kv): grouped-query 8:1 and 1:1
DECODE_BATCHES = (1, 4, 16, 64)
DECODE_NKS = (4096, 16384, 32768, 65536, 131072)
DECODE_NQS = (1,)
L2_FACTOR = 4  # the K/V caches a decode case rotates among hold together at least this many times the L2
FLOP_CONVENTION = ("FlashAttention-2: forward 4*B*H*N_q*N_k*d FLOPs, halved when causal; a sliding window or "
                   "documents: 4*B*H*d per visible element of S (iokernels.plan.visible_area; documents of lengths "
                   "n_i: the sum of n_i^2, causal n_i(n_i+1)/2); block-sparse: 4*B*H*d per visible element of the "
                   "blocks the mask keeps (causal: those of them on or below the diagonal; the dense reference "
                   "io-dense: its own dense count); a softcap's tanh and ALiBi's bias not counted; backward 2.5x "
                   "forward; TFLOP/s = FLOPs / median seconds / 1e12")
BLOCK_SPARSE_BLOCK = DEFAULT_BLOCK  # bench --block-sparse: 128 x 128 blocks (FlexAttention's BLOCK_SIZE too)
DEFAULT_BLOCK_PATTERN = "random"  # the peers' reference setup: random 128 x 128 blocks
ALIBI_RULE = "2^(-8(h+1)/H)"  # bench --alibi's slopes (alibi_slopes), as the header states them
ATTN_MASKS = ("additive", "bool")  # bench --attn-mask's kinds
ATTN_MASK_KEEP = 0.9  # the share of keys a --attn-mask bool mask keeps
ATTN_MASK_SEED = 7  # the seed of every implementation's copy of the mask (the same values for all)


# ---------------------------------------------------------------------------------------------
# work and configurations

def alibi_slopes(heads: int) -> tuple[float, ...]:
    """ALiBi's standard slopes for ``heads`` heads, the geometric sequence 2^(−8(h+1)/H) for head h = 0 .. H−1
    (Press et al.; H 8: 1/2, 1/4, ..., 1/256; :func:`iokernels.plan.variants.geometric_slopes`, the CLI's too), one
    float per head: every ``bench --alibi`` slope comes from here."""
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(f"ALiBi slopes need heads >= 1, got {heads!r}")
    return geometric_slopes(heads)


def block_areas(block_mask: BlockMask, causal: bool = False) -> np.ndarray:
    """Int64 (T_r, T_c): the visible elements of each block of ``block_mask``'s grid, kept or not (its block's
    rows times columns, clipped to N_q x N_k; with ``causal``, those of them with key j <= query i + N_k - N_q, the
    bottom-right rule of :func:`iokernels.plan.causal.key_intervals`). What a block-sparse call computes is these
    areas over the kept blocks (:func:`block_sparse_area`); FlexAttention's full blocks are those whose area is the
    whole block. Cached per mask and causal: computed once per shape."""
    return _block_areas(block_mask, bool(causal)).copy()


@lru_cache(maxsize=64)
def _block_areas(block_mask: BlockMask, causal: bool) -> np.ndarray:
    n_q, n_k, bq, bk = block_mask.n_q, block_mask.n_k, block_mask.block_q, block_mask.block_k
    rows, cols = block_mask.shape
    start = np.arange(cols, dtype=np.int64) * bk
    end = np.minimum(n_k, start + bk) - 1  # each key block's last key
    out = np.zeros((rows, cols), np.int64)
    for a in range(rows):  # per query block: its rows' visible keys [lo, hi] against every key block
        lo, hi = key_intervals(n_q, n_k, "bottom_right" if causal else "", None,
                               np.arange(a * bq, min(n_q, (a + 1) * bq)))
        out[a] = np.maximum(0, np.minimum(hi[:, None], end) - np.maximum(lo[:, None], start) + 1).sum(axis=0)
    out.flags.writeable = False
    return out


def block_sparse_area(block_mask: BlockMask, causal: bool = False) -> int:
    """The visible elements of S a block-sparse call computes: the kept blocks' :func:`block_areas`."""
    return int(block_areas(block_mask, causal)[block_mask.blocks].sum())


def attention_flops(batch: int, heads: int, n_q: int, n_k: int, d: int, *, causal: bool = False,
                    direction: str = "fwd", window: tuple[int | None, int | None] | None = None,
                    documents: Sequence[int] | None = None, block_mask: BlockMask | None = None) -> float:
    """FLOPs of one attention call by the FlashAttention-2 convention (a sliding window or documents, the lengths of
    packed documents summing to N_q = N_k: their visible elements; a block mask: the visible elements of the blocks
    it keeps, :func:`block_sparse_area`)."""
    if direction not in PASSES:
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    # checked here so that lengths not summing to N are an error, not a wrong count; one document is None (no mask)
    documents = normalize_documents(documents, n_q, n_k)
    if block_mask is not None:
        if window is not None or documents is not None:
            raise ValueError("a block mask is counted alone (with causal): not with a window or documents")
        if (block_mask.n_q, block_mask.n_k) != (n_q, n_k):
            raise ValueError(f"the block mask is for N_q={block_mask.n_q}, N_k={block_mask.n_k}, not {n_q}, {n_k}")
        flops = 4.0 * batch * heads * d * block_sparse_area(block_mask, causal)
        return flops * (BWD_OVER_FWD if direction == "bwd" else 1.0)
    masked = window is not None or documents is not None
    if masked:
        flops = 4.0 * batch * heads * d * visible_area(n_q, n_k, "bottom_right" if causal else "", window, documents)
    else:
        flops = 4.0 * batch * heads * n_q * n_k * d
    if causal and not masked:
        flops /= 2
    return flops * (BWD_OVER_FWD if direction == "bwd" else 1.0)


def computed_elements(problem: Problem, direction: str) -> int | None:
    """The elements of S in the tiles our fast path computes for ``problem`` (a sliding window's or documents': every
    (query tile, key tile) pair with a visible element, whole; with the tiles of the plan a call takes on an sm_90 part,
    227 KB: documents of one length, the dense plan of their batch), None for another problem: the count of issue
    #22's "TFLOP/s counted on the computed blocks"."""
    from ..library.varlen import uniform_documents
    from ..plan import make_plan
    from ..plan.causal import pair_grid
    from ..plan.varlen import key_block_queries, make_documents_plan, query_tile_keys

    if problem.block_mask is not None or (problem.window is None and not problem.masks_documents):
        return None
    causal = "bottom_right" if problem.causal else ""
    documents = problem.documents if problem.masks_documents else None
    if documents is not None and uniform_documents(documents, problem.heads, problem.heads):
        # (the call runs the dense path on the batch of documents: each document's pairs, every document alike)
        plan = make_plan("flash", "fast", N_q=documents[0], d=problem.d, dtype=problem.dtype, sram=227 * 1024,
                         batch=problem.batch * problem.heads * len(documents), causal=causal, direction=direction)
        br, bc = plan.tile["Br"], plan.tile["Bc"]
        pairs = len(documents) * int(np.count_nonzero(pair_grid(plan)[1]))
    elif documents is not None:
        plan = make_documents_plan(problem.documents, d=problem.d, dtype=problem.dtype, batch=problem.batch,
                                   heads=problem.heads, causal=causal, direction=direction)
        br, bc = plan.tile["Br"], plan.tile["Bc"]
        pairs = 0
        for n in problem.documents:
            if direction == "fwd":
                pairs += sum(-(-query_tile_keys(plan, n, n, row0) // bc) for row0 in range(0, n, br))
            else:
                pairs += sum(len(key_block_queries(plan, n, n, col0)) for col0 in range(0, n, bc))
    else:
        plan = make_plan("flash", "fast", N_q=problem.n, d=problem.d, dtype=problem.dtype, sram=227 * 1024,
                         batch=problem.batch, heads=problem.heads, causal=causal, window=problem.window,
                         direction=direction)
        br, bc = plan.tile["Br"], plan.tile["Bc"]
        pairs = int(np.count_nonzero(pair_grid(plan)[1]))
    return problem.batch * problem.heads * pairs * br * bc


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
    # document masking: the lengths of the documents packed into N (summing to N; a row sees its own document's keys)
    documents: tuple[int, ...] | None = None
    softcap: float | None = None  # the logits capped, c·tanh(scale·q·kᵀ/c) (Gemma 2's attention softcapping)
    # block-sparse attention (the paper's Algorithm 5): the blocks of S computed (with causal, both masks apply)
    block_mask: BlockMask | None = None
    # ALiBi: the logits plus −slope_h·|j − i − (N_k − N_q)|, the slopes alibi_slopes(heads) (FlashAttention-2's)
    alibi: bool = False
    # an explicit mask per batch and head, (B, H, N, N), given as attn_mask (issue #22): "additive" (random normal
    # values in the problem's dtype) or "bool" (each key kept with probability ATTN_MASK_KEEP); FLOPs as without
    attn_mask: str | None = None

    @property
    def alibi_slopes(self) -> tuple[float, ...] | None:
        """The H slopes of :func:`alibi_slopes` with ALiBi, None without: ours' ``alibi_slopes``, Flex's bias."""
        return alibi_slopes(self.heads) if self.alibi else None

    @property
    def bh(self) -> int:
        return self.batch * self.heads

    @property
    def masks_documents(self) -> bool:
        """Whether the documents mask anything: more than one (one document of N is plain attention, which the
        peers without a document mask run as it is)."""
        return self.documents is not None and len(self.documents) > 1

    def flops(self, direction: str) -> float:
        return attention_flops(self.batch, self.heads, self.n, self.n, self.d, causal=self.causal,
                               direction=direction, window=self.window, documents=self.documents,
                               block_mask=self.block_mask)

    def describe(self) -> str:
        return (f"d={self.d} N={self.n} {self.dtype} B={self.batch} H={self.heads}" + (" causal" if self.causal else "")
                + (f" dropout={self.dropout:g}" if self.dropout else "")
                + (f" window={_window_text(self.window)}" if self.window is not None else "")
                + (f" documents={documents_text(self.documents)}" if self.documents is not None else "")
                + (f" softcap={self.softcap:g}" if self.softcap is not None else "") + (" alibi" if self.alibi else "")
                + (f" blocks={self.block_mask.label}" if self.block_mask is not None else "")
                + (f" attn_mask={self.attn_mask}" if self.attn_mask is not None else ""))

    def dropout_plan_arg(self) -> Any:
        """make_plan's dropout argument: None, or a fixed Dropout of seed 0 (timing does not depend on it)."""
        from ..plan.dropout import Dropout

        return Dropout(self.dropout, 0) if self.dropout else None


def _window_text(window: tuple[int | None, int | None]) -> str:
    return ",".join("-1" if side is None else str(side) for side in window)


def documents_text(documents: Sequence[int]) -> str:
    """Lengths as runs of equal ones, count x length joined by "+": (2048,) * 8 -> "8x2048", (333, 333, 334) ->
    "2x333+1x334" (a label stays short however many documents)."""
    runs: list[list[int]] = []
    for n in documents:
        if runs and runs[-1][1] == n:
            runs[-1][0] += 1
        else:
            runs.append([1, n])
    return "+".join(f"{count}x{n}" for count, n in runs)


def document_lengths(n: int, count: int) -> tuple[int, ...]:
    """N cut into ``count`` documents of equal length, the last one taking the remainder: (16384, 8) -> 8 x 2048,
    (1000, 3) -> (333, 333, 334). ValueError naming --documents unless 1 <= count <= N."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"--documents must be an int >= 1, got {count!r}")
    if count > n:
        raise ValueError(f"--documents {count} > N = {n}: every document needs at least one token")
    base = n // count
    return (base,) * (count - 1) + (n - base * (count - 1),)


def block_sparse_spec(density: float, kind: str = DEFAULT_BLOCK_PATTERN, seed: int = 0) -> dict:
    """bench --block-sparse's mask: :func:`iokernels.plan.masks.pattern`'s arguments, checked (ValueError naming the
    option), blocks of :data:`BLOCK_SPARSE_BLOCK`."""
    try:
        density = check_density(density)
    except ValueError as exc:
        raise ValueError(f"--block-sparse: {exc}") from None
    if kind not in PATTERNS:
        raise ValueError(f"--block-pattern: unknown pattern {kind!r}; expected one of {', '.join(PATTERNS)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"--block-seed must be an int >= 0, got {seed!r}")
    return {"kind": kind, "density": density, "seed": seed, "block_q": BLOCK_SPARSE_BLOCK}


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


def explicit_mask(problem: Problem, device: str = "cuda") -> Any:
    """The explicit mask of ``bench --attn-mask`` (:attr:`Problem.attn_mask`), (B, H, N, N) on ``device``, the same
    values for every implementation (seed :data:`ATTN_MASK_SEED`): standard normal in the
    problem's dtype ("additive"), or True with probability ATTN_MASK_KEEP ("bool")."""
    import torch

    gen = torch.Generator(device=device).manual_seed(ATTN_MASK_SEED)
    shape = (problem.batch, problem.heads, problem.n, problem.n)
    if problem.attn_mask == "bool":
        return torch.rand(shape, device=device, generator=gen) < ATTN_MASK_KEEP
    return torch.randn(shape, device=device, dtype=getattr(torch, problem.dtype), generator=gen)


def parse_dtypes(text: str) -> list[str]:
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError("--dtype: give at least one dtype")
    return list(dict.fromkeys(check_dtype(x) for x in items))


def main_problems(ds: Sequence[int], ns: Sequence[int], dtypes: Sequence[str], *, tokens: int = DEFAULT_TOKENS,
                  heads: int = DEFAULT_HEADS, causal: bool = False, dropout: float = 0.0,
                  window: tuple[int | None, int | None] | None = None,
                  documents: int | None = None, softcap: float | None = None,
                  block_sparse: dict | None = None, alibi: bool = False, attn_mask: str | None = None
                  ) -> list[Problem]:
    """One problem per (d, dtype, N), N ascending within each (d, dtype), with B·H·N = tokens; ``documents``: the
    number of documents each N is cut into (:func:`document_lengths`), None for none; ``softcap``: every problem's
    softcap (None for none); ``block_sparse``: :func:`block_sparse_spec`'s pattern arguments, one block mask made
    per N (:func:`iokernels.plan.masks.pattern`) and shared by its problems, None for none; ``alibi``: ALiBi on
    every problem (the slopes :func:`alibi_slopes` of ``heads``); ``attn_mask``: an explicit mask's kind
    (:data:`ATTN_MASKS`) on every problem, None for none."""
    if attn_mask is not None and attn_mask not in ATTN_MASKS:
        raise ValueError(f"--attn-mask must be one of {', '.join(ATTN_MASKS)}, got {attn_mask!r}")
    if tokens < 1 or heads < 1:
        raise ValueError(f"--tokens and --heads must be >= 1, got {tokens}, {heads}")
    masks: dict[int, BlockMask] = {}
    problems = []
    for d in ds:
        for dtype in dtypes:
            for n in sorted(ns):
                if tokens % (n * heads):
                    raise ValueError(f"--tokens {tokens} is not a multiple of N*heads = {n}*{heads} = {n * heads}; "
                                     "choose --tokens, --N or --heads so that batch = tokens/(N*heads) is whole")
                batch = tokens // (n * heads)
                check_problem(n, n, d, dtype, batch, heads)
                lengths = None if documents is None else document_lengths(n, documents)
                if block_sparse is not None and n not in masks:
                    masks[n] = pattern(n_q=n, n_k=n, **block_sparse)
                problems.append(Problem(batch, heads, n, d, check_dtype(dtype), causal, dropout=dropout, window=window,
                                        documents=lengths, softcap=softcap, block_mask=masks.get(n),
                                        alibi=bool(alibi), attn_mask=attn_mask))
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


# ---------------------------------------------------------------------------------------------
# bench --decode

@dataclass(frozen=True)
class DecodeProblem:
    """One decode case: q (B, H, N_q, d) against k and v (B, H_kv, N_k, d), H_kv dividing H. N_q > 1 is causal,
    bottom-right: the new tokens are the cache's last N_q, query i sees keys 0 .. N_k - N_q + i."""

    batch: int
    heads: int
    kv_heads: int
    n_q: int
    n_k: int
    d: int
    dtype: str

    @property
    def causal(self) -> bool:
        return self.n_q > 1

    @property
    def kv_bytes(self) -> int:
        """K and V of one cache, 2·itemsize·d·B·H_kv·N_k: the bytes of the issue's KV bandwidth."""
        return 2 * itemsize(self.dtype) * self.d * self.batch * self.kv_heads * self.n_k

    @property
    def q_bytes(self) -> int:
        """q's bytes, and an output's."""
        return itemsize(self.dtype) * self.batch * self.heads * self.n_q * self.d

    def caches(self, l2_bytes: int, factor: int = L2_FACTOR) -> int:
        """The distinct K/V caches the case rotates among: the fewest whose K and V together are at least
        ``factor`` times the L2, and at least one."""
        if l2_bytes < 0 or factor < 1:
            raise ValueError(f"l2_bytes must be >= 0 and factor >= 1, got {l2_bytes}, {factor}")
        return max(1, -(-factor * l2_bytes // self.kv_bytes))

    def device_bytes(self, caches: int) -> int:
        """Device memory of the case's inputs and outputs: ``caches`` K/V caches, q, and an output for each call of
        a graph of ``caches`` calls and one more."""
        return caches * self.kv_bytes + (caches + 2) * self.q_bytes

    def describe(self) -> str:
        return (f"d={self.d} {self.dtype} B={self.batch} H={self.heads} H_kv={self.kv_heads} N_q={self.n_q} "
                f"N_k={self.n_k}" + (" causal" if self.causal else ""))


def parse_head_pairs(option: str, text: str) -> list[tuple[int, int]]:
    """``"64:8,8:8"`` -> [(64, 8), (8, 8)]: query heads H and K/V heads H_kv, H_kv dividing H."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError(f"{option}: give at least one H:H_kv pair")
    out = []
    for x in items:
        try:
            heads, kv_heads = (int(p) for p in x.split(":"))  # a count other than two raises ValueError too
        except ValueError:
            raise ValueError(f"{option}: {x!r} is not H:H_kv, query heads and K/V heads (e.g. 64:8)") from None
        if heads < 1 or kv_heads < 1:
            raise ValueError(f"{option}: heads must be >= 1, got {x!r}")
        if heads % kv_heads:
            raise ValueError(f"{option}: in {x!r} H_kv = {kv_heads} does not divide H = {heads} (each K/V head "
                             "serves H / H_kv query heads)")
        out.append((heads, kv_heads))
    return list(dict.fromkeys(out))


def decode_problems(heads: Sequence[tuple[int, int]], batches: Sequence[int], nks: Sequence[int],
                    nqs: Sequence[int], ds: Sequence[int] = DECODE_DS,
                    dtypes: Sequence[str] = DECODE_DTYPES) -> list[DecodeProblem]:
    """Every combination, in table order: d, dtype and heads as given, then N_q, B and N_k ascending."""
    for n_q in nqs:
        for n_k in nks:
            if n_q > n_k:
                raise ValueError(f"--decode-nq {n_q} > --decode-nk {n_k}: the new tokens are the cache's last N_q, "
                                 "so N_q <= N_k")
    problems = []
    for d in ds:
        for dtype in dtypes:
            for h, h_kv in heads:
                for n_q in sorted(nqs):
                    for batch in sorted(batches):
                        for n_k in sorted(nks):
                            name = check_problem(n_q, n_k, d, dtype, batch, h)
                            problems.append(DecodeProblem(batch, h, h_kv, n_q, n_k, d, name))
    return problems
