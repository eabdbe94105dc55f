"""The NVRTC compile check shared by the masked-variant compile tests (causal, block-sparse, explicit masks).

Each of those files builds plans with its mask, keeps the kernel stages that carry the mask's define
(:func:`plan_variants`), and hands them to :class:`VariantCompiles`, which compiles every variant for its
architectures in both builds (in parallel, up front) and asserts: a cubin, no warnings, no spills, zero
stack, and the 64-bit counter flush in the counting build only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import pytest

from iokernels.kernels import SOURCE_ARCHS, CompileVariant, build_source
from iokernels.kernels.stages import plan_kernels

try:
    from cuda.bindings import nvrtc  # noqa: F401

    from iokernels.kernels.nvrtc import compile_to_cubin

    HAVE_NVRTC = True
except ImportError:
    HAVE_NVRTC = False

ARCHS = ("sm_80", "sm_90")
U64_ATOMIC = re.compile(r"\b(?:atom|red)(?:\.\w+)*\.global\.add\.u64\b")
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


class VariantCompiles:
    """The compile cases of one set of variants (``variants``: a function returning
    :func:`plan_variants`' result), their cached compiles and the assertions on each."""

    def __init__(self, variants: Callable[[], dict[str, list[CompileVariant]]], tag: str):
        self.variants = variants
        self.cases = [pytest.param(source, i, arch, id=f"{source}-{tag}{i}-{arch}")
                      for source, vs in sorted(variants().items()) for i in range(len(vs))
                      for arch in SOURCE_ARCHS.get(source, ARCHS)]
        self.compiled = functools.cache(self._compile)

    def _compile(self, source: str, variant: int, arch: str, counting: bool):
        v = self.variants()[source][variant]
        return compile_to_cubin(build_source(source, v.defines, counting), arch=arch, name=source,
                                name_expressions=v.name_expressions)

    def precompile(self) -> None:
        """NVRTC releases the GIL: compile every case on all cores up front; the tests read the cache."""
        if not HAVE_NVRTC:
            return

        def quiet(job: tuple) -> None:
            with contextlib.suppress(Exception):  # the test that owns the job reports it
                self.compiled(*job)

        jobs = [(*c.values, counting) for c in self.cases for counting in (True, False)]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            list(pool.map(quiet, jobs))

    def check(self, source: str, variant: int, arch: str, counting: bool) -> None:
        result = self.compiled(source, variant, arch, counting)
        assert result.cubin
        assert "warning" not in result.log.lower(), result.log
        for fn, res in result.resources.items():
            assert (res.stack_frame, res.spill_stores, res.spill_loads) == (0, 0, 0), f"{fn}: {res}"
        # the plain build has no counting code, the counting build flushes its counters
        assert bool(U64_ATOMIC.search(result.ptx)) == counting
