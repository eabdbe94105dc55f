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

Two rules keep every code path compiled in both builds without compiling the same code twice (CI's time: 2 cores), each
with a CPU test below of its premise in the kernels' text, which fails when an edit breaks it:

- gemm.cu's instances that differ only in the tensors they count (``gemm<T, TRANS_A, TRANS_B, TA, TB, TC>``: TA, TB,
  TC name counter slots) have the same plain code, and counting code that differs only in the constant offsets
  iok_flush adds their bytes at. Of each such group the plain build compiles the first and the counting build the
  others (:func:`build_instances`), so each instance, with its static_asserts, is compiled in one build and each
  group's code in both (gemm.cu's largest case: 6 instances in each build, where it was 12 counting and 6 plain).
- A source with an sm_90-only branch compiles for sm_80 too only the modules whose kernels reach it
  (``nvrtc_variants.ARCH_BRANCH_KERNELS``): flash_tc_bwd.cu's deterministic kernels (flash_tc_bwd_dkdv,
  flash_tc_bwd_dq) have no atomics, the same code on both architectures, and compile for sm_90 alone like a source
  without the branch (10 cases fewer).
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
from .nvrtc_variants import (
    ARCH_BRANCH,
    ARCH_BRANCH_KERNELS,
    HAVE_NVRTC,
    ONE_ARCH,
    U64_ATOMIC,
    kernel_names,
    needs_nvrtc,
    variant_archs,
)
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
# (family, the architectures each of its (source, variant) compiles for)
FAMILIES: tuple[tuple[Family, Callable[[str, CompileVariant], tuple[str, ...]]], ...] = (
    (lambda: {source: compile_variants(source) for source in list_sources()}, variant_archs),
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
                for arch in archs(source, v):
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
# registers each: 40 bytes), and the persistent forward with three (56 / 152 registers: 48 bytes; its plain build
# none); the block-sparse backward with dropout at d 128 (36 bytes since the per-warp iok_flush; its plain build none),
# and with a softcap at d 128 (4 bytes since the descriptors are moved by wg_desc_add, 2026-11-28; its plain build none)
SPILL_BYTES_ALLOWED = 48
# ... and a programmable variant's counting build (MASK_MOD, SCORE_MOD: a user's expressions take the registers they
# take; the forward at d 128 with a document mask and ALiBi read from two captured arrays spills 204 bytes, the plain
# build none)
SPILL_BYTES_ALLOWED_MODS = 256


def spills_allowed(source: str, defines: dict) -> bool:
    width = defines.get("HEAD_D_TILE", defines.get("HEAD_D"))
    if source == "flash_tma_bwd.cu":  # counting builds: the variable-length backward at d 64 (its register split), the
        # block-sparse one with dropout or a softcap at d 128
        return ("VARLEN" in defines and width == 64) or ("BLOCK_SPARSE" in defines and width == 128
                                                          and ("DROPOUT" in defines or "SOFTCAP" in defines))
    if source == "flash_tma.cu" and ("VARLEN" in defines or "PERSISTENT" in defines):  # B_r 192: three consumer
        # warpgroups
        return defines["BR"] == 192
    return (source == "flash_tma.cu" and all(k in defines for k in ("SPLIT", "RAGGED", "PACKED_CAUSAL"))
            and width > 128)


def wide_persistent(source: str, defines: dict) -> bool:
    """The tma forward's persistent grid with three consumer warpgroups (B_r 192; plan.fast.with_wide_persistent)."""
    return source == "flash_tma.cu" and "PERSISTENT" in defines and defines["BR"] == 192


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


def build_instances(instances: tuple[str, ...], counting: bool) -> tuple[str, ...]:
    """The instances a build compiles, of each group that differs only in counted tensors: the plain build the first,
    the counting build the others (the one where a group has one). Each group's code is compiled in both builds and
    each instance, with its static_asserts, in one of them."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for expr in instances:
        name, _, args = expr.partition("<")
        values = tuple(a.strip() for a in args.rstrip(">").split(","))
        groups.setdefault((name, values[:len(values) - COUNTED_TENSOR_ARGS.get(name, 0)]), []).append(expr)
    return tuple(e for group in groups.values() for e in ((group[1:] or group) if counting else group[:1]))


def test_counted_tensor_arguments_reach_only_the_counting_helpers():
    """gemm.cu's TA, TB and TC (and GemmSlice::load's TI) appear only in its template header, IokCounters<...>, the
    helpers' template arguments and the static_asserts (the same in both builds): the plain code of two instances
    that differ in them is the same. In the counting build the numbers in a counter pack reach only iok_slot (the
    tensor's position in the pack: its registers), the distinct-tensors check and iok_flush's offsets into the global
    counters (``slot + 2 * ids[i]``), so the counting code of two such instances differs in those constants alone.
    :func:`build_instances` compiles one of them in the plain build and the other in the counting build."""
    from iokernels.kernels.sources import read_source

    text = read_source("gemm.cu")
    assert "template <typename T, int TRANS_A, int TRANS_B, int TA, int TB, int TC>\n__global__" in text
    allowed = re.compile(r"int (?:TA|TB|TC|TI)\b|IokCounters<TA, TB, TC\b|load<T[AB]>\(c, |iok_st<TC>\(c, "
                         r"|iok_ld<TI>\(c, |static_assert\((?:TC == IOK_T_S|TA == IOK_T_P),")
    spans = [m.span() for m in allowed.finditer(text)]
    for use in re.finditer(r"\bT[ABCI]\b", text):
        assert any(a <= use.start() < b for a, b in spans), text[max(0, use.start() - 80):use.end() + 80]
    counting = build_source("gemm.cu", {}, True)
    allowed = re.compile(r"int\.\.\. Ts\b|sizeof\.\.\.\(Ts\)|(?:<|, )Ts\.\.\.>|constexpr int ids\[\] = \{Ts\.\.\.\};"
                         r"|if \(ids\[i\] == T\) return i;|if \(ids\[i\] < 0 \|\| ids\[i\] >= IOK_NUM_TENSORS\)"
                         r"|if \(ids\[j\] == ids\[i\]\)|slot \+ 2 \* ids\[i\](?: \+ 1)?, [rw]\)|pack Ts, or -1")
    spans = [m.span() for m in allowed.finditer(counting)]
    uses = list(re.finditer(r"\bTs\b|\bids\b", counting))
    assert sum("slot + 2 * ids[i]" in m.group(0) for m in allowed.finditer(counting)) >= 2  # the flush's offsets
    for use in uses:
        assert any(a <= use.start() < b for a, b in spans), counting[max(0, use.start() - 80):use.end() + 80]
    instances = ("gemm<float, 0, 0, 12, 1, 13>", "gemm<float, 0, 0, 5, 2, 3>", "gemm<float, 1, 0, 5, 9, 15>",
                 "gemm<__half, 0, 0, 5, 2, 3>", "flash_q_outer<float>")
    assert build_instances(instances, counting=False) == (
        "gemm<float, 0, 0, 12, 1, 13>", "gemm<float, 1, 0, 5, 9, 15>", "gemm<__half, 0, 0, 5, 2, 3>",
        "flash_q_outer<float>")
    assert build_instances(instances, counting=True) == (
        "gemm<float, 0, 0, 5, 2, 3>", "gemm<float, 1, 0, 5, 9, 15>", "gemm<__half, 0, 0, 5, 2, 3>",
        "flash_q_outer<float>")


def under_if(lines: list[str], condition: str) -> list[bool]:
    """Per line: whether it lies in the true branch of an ``#if <condition>`` (at any depth of nesting)."""
    stack: list[bool] = []
    out = []
    for line in lines:
        directive = re.match(r"\s*#\s*(\w+)\s*(.*?)\s*(?://.*)?$", line)
        word, rest = directive.groups() if directive else ("", "")
        if word in ("if", "ifdef", "ifndef"):
            stack.append(word == "if" and rest == condition)
        elif word in ("elif", "else"):
            stack[-1] = word == "elif" and rest == condition
        elif word == "endif":
            stack.pop()
        out.append(any(stack))
    assert not stack, "unbalanced #if"
    return out


def test_only_the_named_kernels_reach_the_sm90_branch():
    """ARCH_BRANCH_KERNELS' premise: in flash_tc_bwd.cu with its headers the sm_90-only branch lies in bwd_red_add2
    alone, every call of it is under ``#if FTB_DQ``, and flash_tc_bwd is the one kernel defined there (flash_tc_bwd_dkdv
    in its #else, flash_tc_bwd_dq in the query-outer layout's branch): a module of those two has the same code on
    sm_80 as on sm_90, so it compiles for sm_90 alone, and flash_tc_bwd's modules for both."""
    assert ARCH_BRANCH_KERNELS == {"flash_tc_bwd.cu": ("flash_tc_bwd",)}  # another entry needs its own check here
    lines = build_source("flash_tc_bwd.cu", {}, False).splitlines()
    start = next(i for i, line in enumerate(lines) if re.search(r"\bvoid bwd_red_add2\(", line))
    end = lines.index("}", start)
    branch = [i for i, line in enumerate(lines) if ARCH_BRANCH in line]
    assert branch and all(start < i < end for i in branch), [lines[i] for i in branch]
    under = under_if(lines, "FTB_DQ")
    calls = [i for i, line in enumerate(lines) if re.search(r"\bbwd_red_add2\b", line) and i != start]
    assert calls and all(under[i] for i in calls), [lines[i] for i in calls if not under[i]]
    text = "\n".join(lines)
    kernels = {m.group(1): under[text.count("\n", 0, m.start(1))]
               for m in re.finditer(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", text)}
    assert kernels == {"flash_tc_bwd": True, "flash_tc_bwd_dkdv": False, "flash_tc_bwd_dq": False}
    sm80 = [merged()[key] for key in merged() if key[0] == "flash_tc_bwd.cu" and key[2] == "sm_80"]
    assert sm80 and all(kernel_names(CompileVariant({}, names)) == {"flash_tc_bwd"} for names in sm80)


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
    built = {counting: build_instances(every, counting) for counting in (True, False)}
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
        # or setting a product's accumulators while it may fly), and honours setmaxnreg (C7508); but for the counting
        # build of the persistent forward with three consumer warpgroups (its producer's 64-bit counters across items
        # take 56 registers, which leave the consumers 152: ptxas serializes their products, C7512, where the plain
        # build's 160 do not; that build counts bytes, and its time is not measured)
        codes = ("C7508", "C7514", "C7515", "C7517", "C7519") if counting and wide_persistent(source, dict(defines)) \
            else ("C7508", "C7512", "C7514", "C7515", "C7517", "C7519")
        assert not any(code in result.log for code in codes), f"{build}: {result.log}"
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
