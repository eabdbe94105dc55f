"""What the compile-variant families share (causal, block-sparse, explicit masks, dropout, standard's masks).

Each family file builds plans with its variant and keeps the kernel stages that carry its define
(:func:`plan_variants`); ``test_compile.py`` merges every family with the package's own variants and compiles
each distinct (source, defines, architecture) once, in both builds.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

import pytest

from iokernels.kernels.sources import SOURCE_ARCHS, CompileVariant, build_source
from iokernels.kernels.stages import plan_kernels

try:
    from cuda.bindings import nvrtc  # noqa: F401

    HAVE_NVRTC = True
except ImportError:
    HAVE_NVRTC = False

ARCHS = ("sm_80", "sm_90")
U64_ATOMIC = re.compile(r"\b(?:atom|red)(?:\.\w+)*\.global\.add\.u64\b")
ARCH_BRANCH = "__CUDA_ARCH__ >= 900"  # code that differs between sm_80 and sm_90 (bwd.cuh's vector atomics)


def ALL_ARCHS(source: str) -> tuple[str, ...]:
    """The architectures whose code differs for a source: the one an arch-specific source is for; sm_80 and
    sm_90 where the source (with its headers) has an sm_90-only branch; else sm_90 alone (the same code: one
    compile check per source and define set)."""
    if source in SOURCE_ARCHS:
        return SOURCE_ARCHS[source]
    return ARCHS if ARCH_BRANCH in _text(source) else ("sm_90",)


@functools.cache
def _text(source: str) -> str:
    return build_source(source, {}, False) if source.endswith(".cu") else ""


# The kernels that reach ARCH_BRANCH, for a source whose other kernels do not (test_compile.py checks it in the text):
# flash_tc_bwd.cu's branch is bwd.cuh's bwd_red_add2 (dQ's float2 reductions), called only under #if FTB_DQ, where
# flash_tc_bwd is the one kernel; flash_tc_bwd_dkdv and flash_tc_bwd_dq (the deterministic plan's) have no atomics
ARCH_BRANCH_KERNELS = {"flash_tc_bwd.cu": ("flash_tc_bwd",)}


def kernel_names(variant: CompileVariant) -> set[str]:
    """The kernels a variant instantiates (its name expressions without template arguments)."""
    return {expr.partition("<")[0].strip() for expr in variant.name_expressions}


def variant_archs(source: str, variant: CompileVariant) -> tuple[str, ...]:
    """:func:`ALL_ARCHS` for one variant: sm_90 alone where none of its kernels reaches the sm_90-only branch
    (:data:`ARCH_BRANCH_KERNELS`), the same code on both architectures as in a source without the branch."""
    archs = ALL_ARCHS(source)
    if source in ARCH_BRANCH_KERNELS and not kernel_names(variant) & set(ARCH_BRANCH_KERNELS[source]):
        return ("sm_90",)
    return archs


def ONE_ARCH(source: str, variant: CompileVariant | None = None) -> tuple[str, ...]:
    """The one architecture a variant family compiles for: sm_90 (the GPU we run), or the source's own."""
    return SOURCE_ARCHS.get(source, ("sm_90",))[:1]


needs_nvrtc = pytest.mark.skipif(not HAVE_NVRTC,
                                 reason="cuda.bindings not installed (pip install -e '.[test]' installs NVRTC)")


def plan_variants(plans: Iterable, define: str) -> dict[str, list[CompileVariant]]:
    """source -> the compile variants of the plans' stages that carry ``define`` (one per distinct set
    of defines, with every name expression the plans use)."""
    modules: dict[tuple[str, tuple], set[str]] = {}
    for plan in plans:
        for stage, ref in plan_kernels(plan):
            if define in dict(stage.params):
                modules.setdefault((ref.source, ref.defines), set()).add(ref.name_expression)
    out: dict[str, list[CompileVariant]] = {}
    for (source, defines), names in modules.items():
        out.setdefault(source, []).append(CompileVariant(dict(defines), tuple(sorted(names))))
    return out


def case_count(variants: dict[str, list[CompileVariant]], archs: Callable[[str], tuple[str, ...]] | None = None) -> int:
    """How many (variant, architecture) compiles a family asks for (each in two builds)."""
    return sum(len(vs) * len((archs or ALL_ARCHS)(source)) for source, vs in variants.items())
