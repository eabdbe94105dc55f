"""CUDA C sources shipped as package data, and the translation units built from them.

A kernel source ``<name>.cu`` in this folder may ``#include "common.cuh"`` (the counting helpers);
:func:`build_source` inlines that header after a prelude of ``#define`` lines, so the text it returns
compiles with no include path of ours, the same text under NVRTC in CI and ``cupy.RawModule`` on a GPU.

Importing this module is cheap: no cupy, no cuda.bindings (compiling lives in :mod:`.nvrtc`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

from iokernels.plan.tensors import NUM_TENSORS, TENSOR_INDEX

# Counter slots per launch: each block adds its bytes to slot (block index % COUNTER_SLOTS), so that
# the once-per-block atomics of large grids do not contend for one address; the launcher sums slots.
COUNTER_SLOTS = 64

KERNEL_DIR: Path = Path(__file__).resolve().parent
HEADER = "common.cuh"

_INCLUDE_HEADER = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"common\.cuh"[ \t]*$', re.MULTILINE)
_INCLUDE_OWN = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"(\w+\.cuh)"[ \t]*$', re.MULTILINE)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CompileVariant(NamedTuple):
    """One compilation of a kernel source: its ``#define`` values and template instantiations."""

    defines: Mapping[str, int | str]
    name_expressions: tuple[str, ...]


def _selftest_variants() -> list[CompileVariant]:
    instances = tuple(f"iok_selftest<{t}>" for t in ("float", "__half", "__nv_bfloat16"))
    return [CompileVariant({"BLOCK_ROWS": rows}, instances) for rows in (1, 4)]


# Problems whose plans cover the kernels' compile-time variety: every head-dim extreme, every dtype,
# small and large M (tiles come from the plans; nothing here names a tile size).
REPRESENTATIVE_PROBLEMS: tuple[dict, ...] = (
    {"d": 16, "dtype": "float32", "sram": 48 * 1024},
    {"d": 64, "dtype": "float32", "sram": 192 * 1024},  # the headline `compare` configuration
    {"d": 64, "dtype": "float16", "sram": 192 * 1024},
    {"d": 256, "dtype": "bfloat16", "sram": 227 * 1024},
)


def _plan_variants(source: str) -> list[CompileVariant]:
    from iokernels.plan import all_plans, make_plan
    from iokernels.plan.research import FORCED_TILE_PROBLEMS

    from .stages import plan_kernels

    plans = [plan for problem in REPRESENTATIVE_PROBLEMS
             for plan in all_plans(N_q=1000, N_k=1000, backward=True, **problem)]
    plans += [make_plan(N_q=1000, **problem) for problem in FORCED_TILE_PROBLEMS]
    if source == "flash_tc.cu":
        from iokernels.plan.fast import FAST_DTYPES, FAST_HEAD_DIMS, FAST_TUNING, make_fast_plan

        plans = [make_fast_plan(N_q=1000, d=d, dtype=t, kernel="mma") for t in FAST_DTYPES for d in FAST_HEAD_DIMS]
        plans += [make_fast_plan(N_q=1000, d=d, dtype="float16", block_r=br, block_c=bc, kernel="mma")
                  for d, br, bc in FAST_TUNING]  # tuning variants
    if source == "flash_wgmma.cu":
        from iokernels.plan.fast import FAST_DTYPES, FAST_HEAD_DIMS, WGMMA_TUNING, make_fast_plan

        plans = [make_fast_plan(N_q=1000, d=d, dtype=t, kernel="wgmma") for t in FAST_DTYPES for d in FAST_HEAD_DIMS]
        plans += [make_fast_plan(N_q=1000, d=d, dtype="float16", block_r=br, block_c=bc, kernel="wgmma")
                  for d, br, bc in WGMMA_TUNING]  # tuning variants
    if source == "flash_tma.cu":  # the default sm_90 forward: every tile shape it takes at d 64 and 128, and the
        # defaults of d inside a wider tile and past 128
        from iokernels.plan.fast import FAST_DTYPES, FAST_HEAD_DIMS, make_fast_plan

        plans = [make_fast_plan(N_q=1000, d=d, dtype=t, kernel="tma", block_r=br, block_c=bc)
                 for t in FAST_DTYPES for d in FAST_HEAD_DIMS for bc in (64, 128)
                 for br in ((128, 192) if d == 64 else (128,))]
        plans += [make_fast_plan(N_q=1000, d=d, dtype=t, kernel="tma")
                  for t in FAST_DTYPES for d in (32, 96, 160, 192, 256)]
        # the 192-row tiles' persistent grid (a plain forward's short items, plan.fast.with_wide_persistent)
        plans += [make_fast_plan(N_q=1000, d=d, dtype=t, kernel="tma", persistent=True)
                  for t, d in (("float16", 64), ("bfloat16", 64), ("float16", 32))]
    if source in ("flash_tma.cu", "combine.cu", "kvcache.cu"):  # the split-KV decode (SPLIT) and its combine; a cache
        # of per-sequence lengths (RAGGED), contiguous or paged with pages smaller than B_c and not, split or not; the
        # append of new keys (kvcache.cu), contiguous and paged, at every tile width
        from iokernels.plan.decode import make_decode_plan
        from iokernels.plan.fast import FAST_DTYPES
        from iokernels.plan.kvcache import make_kv_cache

        decode = {"N_k": 1024, "batch": 2, "heads": 8, "kv_heads": 1}
        contiguous, small, large = (make_kv_cache(batch=2, n_k=1024, **kw)
                                    for kw in ({}, {"page_size": 16, "pages": 200}, {"page_size": 256, "pages": 20}))
        # (d, splits, cache, queries: several with the causal mask, PACKED_CAUSAL): each define and register split
        # once (SPLIT alone; with RAGGED; with PAGED boxes smaller than B_c and the mask past d 128; one split with
        # pages past B_c and the mask past d 128; one split with lengths; the persistent forward with the mask, d in
        # a wider tile)
        cases = [(128, 2, None, 1), (64, 4, contiguous, 1), (256, 4, small, 4), (256, 1, large, 4),
                 (128, 1, contiguous, 1), (96, 1, None, 4)]
        plans += [make_decode_plan(N_q=q, d=d, dtype=t, splits=s, kv_cache=c, causal=q > 1, **decode)
                  for t in FAST_DTYPES for d, s, c, q in cases]
        if source == "kvcache.cu":  # (its attention stages are the variants above)
            appended = [make_kv_cache(batch=2, n_k=1024, append=4, **kw) for kw in ({}, {"page_size": 64, "pages": 40})]
            plans += [make_decode_plan(N_q=4, d=d, dtype=t, kv_cache=c, causal=True, **decode) for t in FAST_DTYPES
                      for d, c in zip((96, 256), appended, strict=True)]
    if source == "flash_tma.cu":  # variable-length batches (VARLEN): a narrow tile causal and head-major (document
        # masking), the widest not and packed (the layouts differ in the O and lse addresses only)
        from iokernels.plan.fast import FAST_DTYPES
        from iokernels.plan.varlen import make_varlen_plan

        plans += [make_varlen_plan(d=d, dtype=t, heads=4, kv_heads=2, lengths_q=(300, 5), causal=c, head_major=h)
                  for t in FAST_DTYPES for d, c, h in ((64, True, True), (256, False, False))]
    if source == "flash_tc_bwd.cu":
        from iokernels.plan.fast_bwd import (
            FAST_BWD_DTYPES,
            FAST_BWD_FALLBACKS,
            FAST_BWD_HEAD_DIMS,
            FAST_BWD_TUNING,
            make_fast_backward_plan,
        )

        plans = [make_fast_backward_plan(N_q=1000, d=d, dtype=t, deterministic=det, kernel="mma", **options)
                 for t in FAST_BWD_DTYPES for d in FAST_BWD_HEAD_DIMS for det in (False, True)
                 for options in FAST_BWD_FALLBACKS]  # the defaults and make_plan's smaller fallbacks
        plans += [make_fast_backward_plan(N_q=1000, d=d, dtype="float16", block_r=br, block_c=bc, ds_stages=ds,
                                          kernel="mma")
                  for d, br, bc, ds in FAST_BWD_TUNING]  # tuning variants
    if source in ("flash_wgmma_bwd.cu", "flash_tma_bwd.cu"):
        from iokernels.plan.fast_bwd import (
            FAST_BWD_DTYPES,
            FAST_BWD_HEAD_DIMS,
            FAST_BWD_WGMMA_FALLBACK,
            FAST_BWD_WGMMA_TUNING,
            make_fast_backward_plan,
        )

        kernel = "wgmma" if source == "flash_wgmma_bwd.cu" else "tma"
        plans = [make_fast_backward_plan(N_q=1000, d=d, dtype=t, kernel=kernel, **tiles)
                 for t in FAST_BWD_DTYPES for d in FAST_BWD_HEAD_DIMS
                 for tiles in ({}, FAST_BWD_WGMMA_FALLBACK)]  # defaults and make_plan's fallback
        plans += [make_fast_backward_plan(N_q=1000, d=d, dtype="float16", block_r=br, block_c=bc, kernel=kernel)
                  for d, br, bc in FAST_BWD_WGMMA_TUNING]  # tuning variants
        # d inside a wider tile (HEAD_D_TILE 64, 128; tma: its wide tiles, 192 and 256 wide, and d 256)
        plans += [make_fast_backward_plan(N_q=1000, d=d, dtype=t, kernel=kernel)
                  for t in FAST_BWD_DTYPES for d in ((32, 96, 160, 256) if kernel == "tma" else (32, 96))]
        if kernel == "tma":  # variable-length batches (VARLEN): narrow tiles not causal, wide ones causal; head-major
            # (document masking) causal at d 128
            from iokernels.plan.varlen import make_varlen_plan

            plans += [make_varlen_plan(d=d, dtype=t, heads=4, kv_heads=2, lengths_q=(300, 5), causal=c,
                                       direction="bwd", head_major=h)
                      for t in FAST_BWD_DTYPES for d, c, h in ((64, False, False), (256, True, False),
                                                               (128, True, True))]
    if source in ("flash_tma.cu", "flash_tma_bwd.cu"):  # block-sparse (BLOCK_SPARSE): the forward causal at d 128 and
        # with a softcap at d 64 (both the list's persistent grid, ITEM_LIST; a block per item with dropout, below), the
        # backward's narrow tiles not causal, with a softcap causal, its wide ones causal
        from iokernels.plan import make_plan
        from iokernels.plan.masks import pattern

        cases = (((128, True, None), (64, False, 5.0), (256, False, None)) if source == "flash_tma.cu"
                 else ((64, False, None), (128, True, 5.0), (256, True, None)))
        plans += [make_plan("flash", "fast", N_q=1000, d=d, dtype="float16", sram=227 * 1024, causal=c, softcap=cap,
                            direction="fwd" if source == "flash_tma.cu" else "bwd",
                            block_mask=pattern("random", 0.5, n_q=1000, n_k=1000))
                  for d, c, cap in cases]
        # ALiBi (ALIBI): the forward causal at d 64 and not at d 128, the backward causal grouped-query at d 128 and not
        # at d 64
        cases = ((64, True), (128, False)) if source == "flash_tma.cu" else ((128, True), (64, False))
        plans += [make_plan("flash", "fast", N_q=1000, d=d, dtype="bfloat16", sram=227 * 1024, causal=c, heads=4,
                            kv_heads=2, alibi=(0.5, 0.25, 0.125, 0.0625),
                            direction="fwd" if source == "flash_tma.cu" else "bwd")
                  for d, c in cases]
        # with dropout: a block mask at d 128 (the dropout tiles), ALiBi at d 64 causal
        from iokernels.plan.dropout import Dropout

        plans += [make_plan("flash", "fast", N_q=1000, d=d, dtype="float16", sram=227 * 1024, causal=c,
                            dropout=Dropout(0.1, 1, 0), direction=direction,
                            **({"block_mask": pattern("random", 0.5, n_q=1000, n_k=1000)} if sparse
                               else {"alibi": (0.5,)}))
                  for d, c, sparse in ((128, False, True), (64, True, False))
                  for direction in (("fwd",) if source == "flash_tma.cu" else ("bwd",))]
    modules: dict[tuple, set[str]] = {}
    for plan in plans:
        for _, ref in plan_kernels(plan):
            if ref.source == source:
                modules.setdefault(ref.defines, set()).add(ref.name_expression)
    return [CompileVariant(dict(defines), tuple(sorted(names))) for defines, names in modules.items()]


def _mod_blocks_variants() -> list[CompileVariant]:
    """mod_blocks.cu (the GPU's block mask of a mask_mod): one expression reading a captured table."""
    import numpy as np

    from ..plan.mods import check_mods, mod_blocks_defines

    mods = check_mods(mask_mod="doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx",
                      captures={"doc": np.zeros(1, np.int32)})
    return [CompileVariant(mod_blocks_defines(mods, 128), ("mod_blocks",))]


# Source name -> its compile variants. A callable, so entries built from plans import them lazily.
COMPILE_VARIANTS: dict[str, Callable[[], list[CompileVariant]]] = {
    "selftest.cu": _selftest_variants,
    "mod_blocks.cu": _mod_blocks_variants,
    **{source: (lambda source=source: _plan_variants(source))
       for source in ("gemm.cu", "rowwise.cu", "flash_fwd.cu", "two_pass.cu", "flash_bwd.cu", "flash_tc.cu",
                      "flash_wgmma.cu", "flash_tma.cu", "flash_tc_bwd.cu", "flash_wgmma_bwd.cu",
                      "flash_tma_bwd.cu", "combine.cu", "kvcache.cu")},
}

# Sources that only one architecture runs (arch-specific PTX such as wgmma): compiled for these
# real architectures only, on the GPU and in the CPU compile test; any other device cannot use them.
SOURCE_ARCHS: dict[str, tuple[str, ...]] = {"flash_wgmma.cu": ("sm_90a",), "flash_wgmma_bwd.cu": ("sm_90a",),
                                             "flash_tma.cu": ("sm_90a",), "flash_tma_bwd.cu": ("sm_90a",)}


def list_sources() -> list[str]:
    """Names of the kernel sources (``*.cu``) shipped in :data:`KERNEL_DIR`, sorted."""
    return sorted(p.name for p in KERNEL_DIR.glob("*.cu"))


def list_headers() -> list[str]:
    """Names of the headers (``*.cuh``) shipped in :data:`KERNEL_DIR`, sorted."""
    return sorted(p.name for p in KERNEL_DIR.glob("*.cuh"))


def read_source(name: str) -> str:
    """Text of the ``.cu`` or ``.cuh`` file ``name`` in :data:`KERNEL_DIR`."""
    available = [*list_sources(), *list_headers()]
    if name not in available:
        raise ValueError(f"unknown kernel source {name!r}; available: {', '.join(available)}")
    return (KERNEL_DIR / name).read_text(encoding="utf-8")


def compile_variants(name: str) -> list[CompileVariant]:
    """Every (defines, name_expressions) the package compiles ``name`` with."""
    if name not in COMPILE_VARIANTS:
        raise KeyError(f"kernel source {name!r} has no entry in iokernels.kernels.COMPILE_VARIANTS")
    return COMPILE_VARIANTS[name]()


def _define_line(key: str, value: int | str) -> str:
    if not _IDENTIFIER.fullmatch(key):
        raise ValueError(f"define name {key!r} is not a C identifier")
    if key.startswith("IOK_"):
        raise ValueError(f"define name {key!r}: the IOK_ prefix is reserved for build_source")
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, (int, str)):
        raise TypeError(f"define {key}: value must be int or str, got {type(value).__name__}")
    text = str(value)
    if not text or "\n" in text or "\r" in text or text.endswith("\\"):
        raise ValueError(f"define {key}: value {text!r} must be one non-empty line")
    return f"#define {key} {text}"


def _inline_headers(name: str, kernel: str) -> str:
    """Replace each ``#include "x.cuh"`` of our own headers by the header's text, with ``#line``
    directives before and after so compiler messages keep pointing at the real files and lines."""
    out, last = [], 0
    for match in _INCLUDE_OWN.finditer(kernel):
        header = match.group(1)
        if header == HEADER:
            continue
        line_after = kernel.count("\n", 0, match.end()) + 2
        out += [kernel[last:match.start()], f'#line 1 "{header}"\n', read_source(header).rstrip("\n"),
                f'\n#line {line_after} "{name}"']
        last = match.end()
    return "".join(out) + kernel[last:]


def build_source(name: str, defines: Mapping[str, int | str], counting: bool) -> str:
    """The full translation unit for kernel source ``name``.

    A prelude of ``#define`` lines (``defines``, ``IOK_NUM_TENSORS``, ``IOK_T_<tensor>`` for every
    tensor of :mod:`iokernels.plan.tensors`, and ``IOK_COUNT`` only when ``counting``), then common.cuh,
    then the kernel source. ``#line`` directives keep compiler messages pointing at the real files.
    """
    if not name.endswith(".cu"):
        raise ValueError(f"kernel source name must end in .cu, got {name!r}")
    kernel = read_source(name)
    # Blank, not removed, so the kernel's line numbers stay right.
    kernel = _INCLUDE_HEADER.sub("", kernel)
    kernel = _inline_headers(name, kernel)
    lines = [_define_line(k, v) for k, v in defines.items()]
    lines.append(f"#define IOK_NUM_TENSORS {NUM_TENSORS}")
    lines.append(f"#define IOK_COUNTER_SLOTS {COUNTER_SLOTS}")
    lines += [f"#define IOK_T_{tensor} {index}" for tensor, index in TENSOR_INDEX.items()]
    if counting:
        lines.append("#define IOK_COUNT 1")
    lines.append(f'#line 1 "{HEADER}"')
    lines.append(read_source(HEADER).rstrip("\n"))
    lines.append(f'#line 1 "{name}"')
    lines.append(kernel)
    return "\n".join(lines)
