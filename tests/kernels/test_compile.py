"""NVRTC compile of every kernel variant the package uses, on the CPU: one check per distinct (source, defines,
architecture), both builds.

The variants are the union of the package's own (``iokernels.kernels.sources.COMPILE_VARIANTS``, every source,
for each architecture whose code differs: sm_80 too where the source has an sm_90-only branch, else sm_90, or
the one an arch-specific source is for) and of each variant
family (causal, block-sparse, explicit masks, dropout, standard attention's masks, the tensor-core dropout
kernels: for one architecture, sm_90 or the source's own), merged by (source, defines, architecture) with every
template instance any of them names, so that nothing is compiled twice. Each case asserts, for the counting and
the plain build: a cubin, no warnings, no wgmma serialized by ptxas, a ptxas report for every instance, no spills
and zero stack; and the 64-bit counter flush in the counting build only.

The counting build compiles every instance. The plain build compiles one of each set of gemm.cu instances that differ
only in the tensors they count (``gemm<T, TRANS_A, TRANS_B, TA, TB, TC>``: TA, TB, TC name counter slots, which the
plain build does not have), the same plain code under another name (:func:`plain_instances`; CI time: gemm.cu's
three largest cases compile 24 instances instead of 12 in the plain build, 21 s of NVRTC to 10 s; the test below
checks that TA, TB and TC reach nothing but the counting helpers).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Iterator

import pytest

from iokernels.kernels.sources import CompileVariant, build_source, compile_variants, list_sources
from iokernels.plan.mods import MOD_DEFINES

from ..plan.test_dropout_fast import dropout_variants as fast_dropout_variants
from .nvrtc_variants import ALL_ARCHS, HAVE_NVRTC, ONE_ARCH, U64_ATOMIC, needs_nvrtc
from .test_causal_compile import causal_variants
from .test_dropout_compile import dropout_variants
from .test_mask_compile import mask_variants
from .test_mods_compile import mods_variants
from .test_softcap_compile import softcap_variants
from .test_sparse_compile import sparse_variants
from .test_standard_masks_compile import standard_variants
from .test_window_compile import window_variants

if HAVE_NVRTC:
    from iokernels.kernels.nvrtc import compile_to_cubin

Family = Callable[[], dict[str, list[CompileVariant]]]
# (family, the architectures each of its sources compiles for)
FAMILIES: tuple[tuple[Family, Callable[[str], tuple[str, ...]]], ...] = (
    (lambda: {source: compile_variants(source) for source in list_sources()}, ALL_ARCHS),
    (causal_variants, ONE_ARCH),
    (dropout_variants, ONE_ARCH),
    (mask_variants, ONE_ARCH),
    (sparse_variants, ONE_ARCH),
    (standard_variants, ONE_ARCH),
    (fast_dropout_variants, ONE_ARCH),
    (window_variants, ONE_ARCH),
    (softcap_variants, ONE_ARCH),
    (mods_variants, ONE_ARCH),
)


def family_cases() -> Iterator[tuple[tuple[str, tuple, str], tuple[str, ...]]]:
    """((source, sorted defines, arch), template instances) of every family, duplicates included."""
    for family, archs in FAMILIES:
        for source, variants in family().items():
            for v in variants:
                for arch in archs(source):
                    yield (source, tuple(sorted(v.defines.items())), arch), v.name_expressions


@functools.cache
def merged() -> dict[tuple[str, tuple, str], tuple[str, ...]]:
    """(source, sorted defines, arch) -> every template instance compiled with them."""
    names: dict[tuple[str, tuple, str], set[str]] = {}
    for key, instances in family_cases():
        names.setdefault(key, set()).update(instances)
    return {key: tuple(sorted(n)) for key, n in sorted(names.items(), key=repr)}


def _case_id(source: str, defines: tuple, arch: str) -> str:
    digest = hashlib.sha1(repr(defines).encode()).hexdigest()[:8]
    return f"{source}-{arch}-{digest}"


CASES = [pytest.param(*key, id=_case_id(*key)) for key in merged()]

# The counting builds allowed a small spill (the kernels' comments on their register splits say why): the split-KV
# decode with a cache of per-sequence lengths and the causal mask on packed rows, in a tile past 128 columns; the
# variable-length backward at d 64; the variable-length forward with three consumer warpgroups (B_r 192, 160
# registers each: 40 bytes); the block-sparse backward with dropout at d 128 (36 bytes since the per-warp iok_flush;
# its plain build none)
SPILL_BYTES_ALLOWED = 40
# ... and a programmable variant's counting build (MASK_MOD, SCORE_MOD: a user's expressions take the registers they
# take; the forward at d 128 with a document mask and ALiBi read from two captured arrays spills 204 bytes, the plain
# build none)
SPILL_BYTES_ALLOWED_MODS = 256


def spills_allowed(source: str, defines: dict) -> bool:
    width = defines.get("HEAD_D_TILE", defines.get("HEAD_D"))
    if source == "flash_tma_bwd.cu":  # counting builds: the variable-length backward at d 64 (its register split), the
        # block-sparse one with dropout at d 128
        return ("VARLEN" in defines and width == 64) or ("BLOCK_SPARSE" in defines and "DROPOUT" in defines
                                                          and width == 128)
    if source == "flash_tma.cu" and "VARLEN" in defines:  # B_r 192: three consumer warpgroups
        return defines["BR"] == 192
    return (source == "flash_tma.cu" and all(k in defines for k in ("SPLIT", "RAGGED", "PACKED_CAUSAL"))
            and width > 128)


def plain_spill_allowed(source: str, defines: dict) -> int:
    """The stack a plain build may use for spills: 8 bytes (4 spilled) in the softcapped backward at tile width 128 with
    the bottom-right causal mask and no window (its 1 − tanh² beside dK in flight; the other alignments, windows, d 64
    and 96 spill none). That build is the one tests/gpu/test_softcap.py's library test ran and passed
    (results/h100/issue22/softcap/)."""
    if source == "flash_tma_bwd.cu" and "SOFTCAP" in defines and defines.get("CAUSAL") == 2 \
            and "WINDOW" not in defines and defines.get("HEAD_D_TILE", defines["HEAD_D"]) == 128:
        return 8
    return 0


# Kernels whose last template arguments only name the tensors a counting build counts (IokCounters<...> and the iok_*
# helpers, whose plain versions ignore them): kernel -> how many such trailing arguments
COUNTED_TENSOR_ARGS = {"gemm": 3}


def plain_instances(instances: tuple[str, ...]) -> tuple[str, ...]:
    """The instances the plain build compiles: the first of each group that differs only in counted tensors."""
    kept: dict[tuple[str, tuple[str, ...]], str] = {}
    for expr in instances:
        name, _, args = expr.partition("<")
        values = tuple(a.strip() for a in args.rstrip(">").split(","))
        kept.setdefault((name, values[:len(values) - COUNTED_TENSOR_ARGS.get(name, 0)]), expr)
    return tuple(kept.values())


def test_counted_tensor_arguments_reach_only_the_counting_helpers():
    """gemm.cu's TA, TB and TC (and GemmSlice::load's TI) appear only in its template header, IokCounters<...>, the
    helpers' template arguments and the static_asserts (the same in both builds): the plain code of two instances
    that differ in them is the same, so :func:`plain_instances` compiles one of them in the plain build."""
    from iokernels.kernels.sources import read_source

    text = read_source("gemm.cu")
    assert "template <typename T, int TRANS_A, int TRANS_B, int TA, int TB, int TC>\n__global__" in text
    allowed = re.compile(r"int (?:TA|TB|TC|TI)\b|IokCounters<TA, TB, TC\b|load<T[AB]>\(c, |iok_st<TC>\(c, "
                         r"|iok_ld<TI>\(c, |static_assert\((?:TC == IOK_T_S|TA == IOK_T_P),")
    spans = [m.span() for m in allowed.finditer(text)]
    for use in re.finditer(r"\bT[ABCI]\b", text):
        assert any(a <= use.start() < b for a, b in spans), text[max(0, use.start() - 80):use.end() + 80]
    assert plain_instances(("gemm<float, 0, 0, 12, 1, 13>", "gemm<float, 0, 0, 5, 2, 3>", "gemm<float, 1, 0, 5, 9, 15>",
                            "gemm<__half, 0, 0, 5, 2, 3>", "flash_q_outer<float>")) == (
        "gemm<float, 0, 0, 12, 1, 13>", "gemm<float, 1, 0, 5, 9, 15>", "gemm<__half, 0, 0, 5, 2, 3>",
        "flash_q_outer<float>")


def test_merging_only_removes_duplicates():
    """Every source and every (defines, arch, instance) of every family is compiled; the merged count is no
    larger than the families' sum."""
    cases = list(family_cases())
    assert len(merged()) <= len(cases)
    for key, instances in cases:
        assert key in merged() and set(instances) <= set(merged()[key])
    assert {key[0] for key in merged()} == set(list_sources())


@needs_nvrtc
@pytest.mark.parametrize(("source", "defines", "arch"), CASES)
def test_compiles_in_both_builds_without_spills(source: str, defines: tuple, arch: str) -> None:
    every = merged()[(source, defines, arch)]
    built = {True: every, False: plain_instances(every)}
    results = {counting: compile_to_cubin(build_source(source, dict(defines), counting), arch=arch, name=source,
                                          name_expressions=instances)
               for counting, instances in built.items()}
    for counting, result in results.items():
        build = "counting" if counting else "plain"
        instances = built[counting]
        assert result.cubin, build
        assert "warning" not in result.log.lower(), f"{build}: {result.log}"
        # ptxas keeps every wgmma asynchronous (C7519: products serialized by a compiler-inserted wait in a
        # divergent path; C7517: a wait injected; C7512: too few registers; C7514 / C7515: other instructions reading
        # or setting a product's accumulators while it may fly), and honours setmaxnreg (C7508)
        assert not any(code in result.log for code in ("C7508", "C7512", "C7514", "C7515", "C7517", "C7519")), \
            f"{build}: {result.log}"
        if source == "flash_tma.cu":  # the copies and the register reallocation are in its PTX
            assert "cp.async.bulk.tensor.3d" in result.ptx and "setmaxnreg.inc" in result.ptx, build
        for expr in instances:
            assert result.resources_of(expr).registers, f"{build} {expr}: no ptxas report\n{result.log}"
        # setmaxnreg moves registers within the block's launch allocation (an increase past it waits forever): the
        # producer warpgroup's smallest share and the consumers' largest must fit the registers it launched with
        incs = [int(n) for n in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", result.ptx)]
        decs = [int(n) for n in re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+)", result.ptx)]
        if incs:
            threads = dict(defines)["THREADS"]
            for expr in instances:
                launched = result.resources_of(expr).registers * threads
                assert min(decs) * 128 + max(incs) * (threads - 128) <= launched, (build, expr, incs, decs, launched)
        mods = any(k in dict(defines) for k in MOD_DEFINES)
        allowed = (SPILL_BYTES_ALLOWED_MODS if counting and mods
                   else SPILL_BYTES_ALLOWED if counting and spills_allowed(source, dict(defines))
                   else plain_spill_allowed(source, dict(defines)) if not counting else 0)
        for fn, res in result.resources.items():
            assert max(res.stack_frame, res.spill_stores) <= allowed, f"{build} {fn}: {res}"
            assert allowed or (res.stack_frame, res.spill_stores, res.spill_loads) == (0, 0, 0), f"{build} {fn}: {res}"
    assert results[True].cubin != results[False].cubin
    assert U64_ATOMIC.search(results[True].ptx), "counting build never flushes its counters"
    assert not U64_ATOMIC.search(results[False].ptx), "plain build contains a 64-bit atomic add"
