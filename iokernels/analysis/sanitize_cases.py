"""The kernel variants ``iokernels.analysis.sanitize`` runs under compute-sanitizer: every kernel, schedule, direction,
dtype and mask at small ragged sizes, and how they are split into shards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..kernels.stages import plan_kernels
from ..plan import (
    CAUSAL_ALIGNMENTS,
    SCHEDULES,
    Plan,
    Unsupported,
    make_plan,
    with_block_mask,
    with_causal,
    with_dropout,
    with_mask,
)
from ..plan.decode import make_decode_plan
from ..plan.dropout import Dropout
from ..plan.fast import FAST_DTYPES, FAST_HEAD_DIMS, TMA_FALLBACK, TMA_TILES, WGMMA_FALLBACK, make_fast_plan
from ..plan.fast_bwd import FAST_BWD_FALLBACKS, FAST_BWD_WGMMA_FALLBACK, make_fast_backward_plan
from ..plan.kvcache import make_kv_cache
from ..plan.masks import ExplicitMask, pattern
from ..plan.research import FORCED_TILE_PROBLEMS
from ..plan.units import DTYPE_ITEMSIZE
from ..plan.varlen import make_varlen_plan

KB = 1024
BATCH, HEADS = 1, 2  # blockIdx.z > 0 exercises the batch·head offsets


SHAPES = ((113, 17), (1, 113), (17, 1))  # (N_q, N_k): N of 1, 17 and 113, N_q != N_k; 113 > 17 masks whole rows


QUICK_SHAPES = ((113, 17),)


RESEARCH_HEAD_DIMS = (16, 128)
RESEARCH_SRAM = {16: 16 * KB, 128: 96 * KB}  # several ragged tiles over 113 rows at both head dims
# the sm_90 backwards' d inside a wider tile (HEAD_D_TILE 128), and the tma kernel's wide tiles (d 256; wgmma
# raises Unsupported there and is left out)
FAST_BWD_WIDER_HEAD_DIMS = (96, 256)


@dataclass(frozen=True)
class Variant:
    """One plan at one size in one build. ``config`` names the plan without its size: all sizes and
    builds of a configuration load the same modules and go to the same shard."""

    index: int
    config: str
    plan: Plan
    counting: bool

    @property
    def label(self) -> str:
        v = self.plan.varlen
        size = (f"N_q={self.plan.N_q} N_k={self.plan.N_k}" if v is None else
                f"lengths={','.join(map(str, v.lengths_q))}/{','.join(map(str, v.lengths_k))}")
        return f"{self.config} {size} {'count' if self.counting else 'plain'}"


def _describe(plan: Plan) -> str:
    kernels = "+".join(dict.fromkeys(s.kernel for s in plan.stages))
    tiles = ",".join(f"{k}={v}" for k, v in plan.tiles if k not in ("Tr", "Tc"))
    smem = "/".join(str(s.smem_bytes) for s in plan.stages)
    extra = [f"causal={plan.causal}"] if plan.causal else []
    if plan.block_mask is not None:
        extra.append(f"block_sparse={plan.block_mask.density:.2f}")
    if plan.mask is not None:
        extra.append(f"mask={plan.mask.kind}{'/shared' if plan.mask.shared else ''}")
    if plan.dropout is not None:
        extra.append(f"dropout={plan.dropout.p:g}")
    if plan.kv_heads != plan.heads:
        extra.append(f"kv_heads={plan.kv_heads}")
    if plan.kv_cache is not None:
        extra.append(f"cache={'paged' + str(plan.kv_cache.page_size) if plan.kv_cache.paged else 'ragged'}"
                     + (f"+append{plan.kv_cache.append}" if plan.kv_cache.append else ""))
    if plan.varlen is not None:
        extra.append("varlen")
    elif plan.causal and plan.variant:
        extra.append("packed_causal")
    return " ".join([plan.label, plan.dtype, f"d={plan.d}", kernels, tiles, f"smem={smem}", *extra])


Factory = Callable[[int, int], Plan]  # (N_q, N_k) -> the plan of one configuration


def _block_sparse(plan: Plan, causal: str = "") -> Plan:
    """``plan`` with a random block mask on its own tile grid (about half the blocks, so that rows and
    columns with no block occur at these sizes), and the causal mask when given."""
    if "Br" not in plan.tile:
        raise Unsupported(f"{plan.label} has no attention tiles")
    mask = pattern("random", 0.5, n_q=plan.N_q, n_k=plan.N_k, block_q=plan.tile["Br"], block_k=plan.tile["Bc"],
                   seed=plan.N_q * 7 + plan.N_k)
    return with_block_mask(with_causal(plan, causal), mask)


def _masks(quick: bool) -> tuple[Callable[[Plan], Plan], ...]:
    """The masks each configuration runs with (a mask a plan has no kernel for raises Unsupported and is
    left out): none, the causal mask in both alignments (bottom-right only with --quick), and a random
    block-sparse mask alone and (not --quick) with the bottom-right causal mask, explicit masks, and
    dropout alone and (not --quick) with the top-left causal mask. A new kind of mask is one more entry
    here."""
    alignments = ("bottom_right",) if quick else CAUSAL_ALIGNMENTS
    sparse = (_block_sparse,) if quick else (_block_sparse, lambda plan: _block_sparse(plan, "bottom_right"))
    explicit = [ExplicitMask("bool", shared=False)] + ([] if quick else [ExplicitMask("additive", shared=True)])
    dropout = Dropout(0.3, 0x1234_5678_9ABC_DEF0, 5)
    dropped = ((lambda plan: with_dropout(plan, dropout)),) if quick else (
        (lambda plan: with_dropout(plan, dropout)), (lambda plan: with_dropout(with_causal(plan, "top_left"), dropout)))
    return (lambda plan: plan, *(lambda plan, a=a: with_causal(plan, a) for a in alignments), *sparse,
            *(lambda plan, m=m: with_mask(plan, m) for m in explicit), *dropped)


def _research_configs(quick: bool) -> Iterator[Factory]:
    for (algorithm, direction), schedules in SCHEDULES.items():
        for schedule in schedules:
            if schedule == "fast":
                continue
            for dtype in DTYPE_ITEMSIZE:
                for d in RESEARCH_HEAD_DIMS:
                    yield lambda n_q, n_k, a=algorithm, s=schedule, p=direction, t=dtype, d=d: make_plan(
                        a, s, N_q=n_q, N_k=n_k, d=d, dtype=t, sram=RESEARCH_SRAM[d], batch=BATCH, heads=HEADS,
                        direction=p)


TMA_CAUSAL_64 = dict(zip(("block_r", "block_c"), TMA_TILES[64, True], strict=True))


def _fast_forward_configs(quick: bool) -> Iterator[Factory]:
    # the kernels make_plan picks (make_fast_plan_within: tma, its B_c = 64 fallback, wgmma's, mma), with
    # grouped-query K/V or not
    options = ({"kernel": "tma"}, {"kernel": "wgmma"}, {"kernel": "mma"}) if quick else (
        {"kernel": "tma"}, {"kernel": "tma", **TMA_FALLBACK}, {"kernel": "wgmma"},
        {"kernel": "wgmma", **WGMMA_FALLBACK}, {"kernel": "mma"})
    for dtype in FAST_DTYPES:
        for d in FAST_HEAD_DIMS:
            for option in options:
                for kv_heads in ((1,) if quick else (HEADS, 1)):
                    yield lambda n_q, n_k, t=dtype, d=d, o=option, kv=kv_heads: make_fast_plan(
                        N_q=n_q, N_k=n_k, d=d, dtype=t, batch=BATCH, heads=HEADS, kv_heads=kv, **o)
    # the tma kernel's other shapes: d inside a wider tile, past 128 (128 x 64), and at d 64 two consumer
    # warpgroups (128 x 128, its causal default) beside the three of its default
    extra = [("bfloat16", 96, {}), ("float16", 256, {})] + ([] if quick else [("float16", 64, TMA_CAUSAL_64)])
    for dtype, d, tiles in extra:
        yield lambda n_q, n_k, t=dtype, d=d, o=tiles: make_fast_plan(N_q=n_q, N_k=n_k, d=d, dtype=t, batch=BATCH,
                                                                     heads=HEADS, kernel="tma", **o)


def _fast_backward_configs(quick: bool) -> Iterator[Factory]:
    # tma and wgmma (default tiles and make_plan's 64 x 64 fallback), mma with FAST_BWD_FALLBACKS,
    # deterministic=True; grouped-query K/V where a kernel takes it (the others raise Unsupported and are left
    # out); tma and wgmma at d inside a wider tile
    options: list[dict] = [{"kernel": "tma"}, {"kernel": "wgmma"}, {"kernel": "mma"},
                           {"kernel": "mma", "deterministic": True}]
    if not quick:
        options += [{"kernel": k, **FAST_BWD_WGMMA_FALLBACK} for k in ("tma", "wgmma")]
        options += [{"kernel": "mma", "deterministic": det, **f} for det in (False, True) for f in FAST_BWD_FALLBACKS
                    if f]
    for dtype in FAST_DTYPES:
        for d in (*FAST_HEAD_DIMS, *FAST_BWD_WIDER_HEAD_DIMS):
            for option in options:
                if d not in FAST_HEAD_DIMS and option not in ({"kernel": "tma"}, {"kernel": "wgmma"}):
                    continue  # d inside a wider tile: the sm_90 kernels' default tiles (their others as at d 128)
                for kv_heads in ((HEADS,) if quick else (HEADS, 1)):
                    yield lambda n_q, n_k, t=dtype, d=d, o=option, kv=kv_heads: make_fast_backward_plan(
                        N_q=n_q, N_k=n_k, d=d, dtype=t, batch=BATCH, heads=HEADS, **({"kv_heads": kv} if kv != HEADS
                                                                                      else {}), **o)


# the split-KV decode's keys beyond a shape's N_k: three key tiles or more, so the splits run at every shape
DECODE_EXTRA_KEYS = 300


def _decode_configs(quick: bool) -> Iterator[Factory]:
    # the split-KV decode (flash_tma.cu with SPLIT, combine.cu): N_k + DECODE_EXTRA_KEYS keys split three ways,
    # grouped-query packing (two packed tiles at N_q 113) and d in a wider tile; a cache of per-sequence lengths
    # (RAGGED: by default the sequence ends 100 keys before the capacity, its last V tile's tail zeroed), paged in
    # pages of 16 and 256 rows (PAGED), with 8 keys appended first (kvcache.cu) and the causal mask on packed rows; an
    # empty sequence and one of a single tile's 5 keys; one split (the packed persistent forward; a block per item
    # with a cache) past quick. (dtype, d, splits, page size: None without a cache, append, length: None for 100
    # short of the capacity)
    cases = [("float16", 128, 3, None, 0, None), ("bfloat16", 96, 3, None, 0, None), ("float16", 128, 3, 0, 0, None),
             ("bfloat16", 256, 3, 16, 0, None), ("float16", 64, 3, 16, 8, None)]
    if not quick:
        cases += [("float16", 256, 1, None, 0, None), ("bfloat16", 64, 1, 0, 8, None), ("float16", 128, 3, 256, 0, 0),
                  ("bfloat16", 128, 3, 0, 0, 5)]
    for dtype, d, splits, page, append, length in cases:
        def factory(n_q: int, n_k: int, t: str = dtype, d: int = d, s: int = splits, page: int | None = page,
                    append: int = append, length: int | None = length) -> Plan:
            keys = n_k + DECODE_EXTRA_KEYS
            cache = None if page is None else make_kv_cache(
                batch=BATCH, n_k=keys, lengths=(keys - 100 if length is None else length,), page_size=page,
                pages=-(-keys // page) + 3 if page else 0, append=append)
            return make_decode_plan(N_q=n_q, N_k=keys, d=d, dtype=t, batch=BATCH, heads=HEADS, kv_heads=1, splits=s,
                                    kv_cache=cache, causal=append > 0)
        yield factory


def _varlen_configs(quick: bool) -> Iterator[Factory]:
    # variable-length batches (flash_tma.cu and flash_tma_bwd.cu with VARLEN): the shape's (N_q, N_k) sequence between
    # an empty one, one of a single row and key, and one of 130 (a second tile, whose last rows are the next sequence's
    # in the forward's copies and zeroed in the backward's), two K/V heads per query head; causal bottom-right, and
    # (past quick) d past 128 and top-left. (dtype, d, causal, direction)
    cases = [("float16", 128, False, "fwd"), ("bfloat16", 64, "bottom_right", "fwd"), ("float16", 64, False, "bwd"),
             ("bfloat16", 128, "bottom_right", "bwd")]
    if not quick:
        cases += [("float16", 256, "top_left", "fwd"), ("bfloat16", 256, "bottom_right", "bwd"),
                  ("float16", 96, "top_left", "bwd")]
    for dtype, d, causal, direction in cases:
        def factory(n_q: int, n_k: int, t: str = dtype, d: int = d, c: bool | str = causal, p: str = direction) -> Plan:
            return make_varlen_plan(d=d, dtype=t, heads=2 * HEADS, kv_heads=HEADS, lengths_q=(1, n_q, 0, 130),
                                    lengths_k=(1, n_k, 7, 130), causal=c, direction=p)
        yield factory


def _forced_tile_configs(quick: bool) -> Iterator[Factory]:
    if quick:
        return
    for problem in FORCED_TILE_PROBLEMS:  # the block-size study's most lopsided tiles
        yield lambda n_q, n_k, p=problem: make_plan(N_q=n_q, N_k=n_k, batch=BATCH, heads=HEADS, **p)


def module_key(plan: Plan) -> tuple:
    return tuple(ref for _, ref in plan_kernels(plan)), plan.kv_heads, plan.causal


def variants(quick: bool = False) -> list[Variant]:
    """Every variant the sanitizers run, in a fixed order (``index`` is the position)."""
    shapes = QUICK_SHAPES if quick else SHAPES
    out: list[Variant] = []
    seen: set[tuple] = set()
    families = (_research_configs, _fast_forward_configs, _fast_backward_configs, _decode_configs, _varlen_configs,
                _forced_tile_configs)
    for family in families:
        for unmasked in family(quick):
            for mask in _masks(quick):
                def factory(n_q: int, n_k: int, unmasked: Factory = unmasked, mask=mask) -> Plan:
                    return mask(unmasked(n_q, n_k))

                try:
                    probe = factory(*shapes[0])
                except Unsupported:
                    continue  # no kernel for this mask, or for grouped-query K/V, on this configuration
                if probe.causal and not any({"CAUSAL", "PACKED_CAUSAL"} & set(dict(s.params)) for s in probe.stages):
                    continue  # no stage takes the mask (standard backward): the unmasked kernels, already listed
                key = module_key(probe)
                if key in seen:
                    continue  # a fallback equal to the default tiles
                seen.add(key)
                config = _describe(probe)
                for n_q, n_k in shapes:
                    plan = factory(n_q, n_k)
                    for counting in (True, False):
                        out.append(Variant(len(out), config, plan, counting))
    return out


def shard(items: list[Variant], index: int, count: int) -> list[Variant]:
    """The variants of shard ``index`` of ``count``: whole configurations, dealt round robin."""
    configs = list(dict.fromkeys(v.config for v in items))
    mine = set(configs[index::count])
    return [v for v in items if v.config in mine]
