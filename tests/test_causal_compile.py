"""NVRTC compile of every causal kernel variant (counting and plain builds, sm_80 and sm_90), on the CPU.

The plans of ``iokernels.kernels.REPRESENTATIVE_PROBLEMS`` and ``FORCED_TILE_PROBLEMS`` with the causal
mask, in both alignments: the stages of causal plans carry the ``CAUSAL`` define, so they are modules
of their own. (tests/test_kernels_compile.py compiles the unmasked variants.)
"""

from __future__ import annotations

import functools
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from iokernels.fast import FAST_DTYPES, FAST_HEAD_DIMS, make_fast_plan
from iokernels.kernels import FORCED_TILE_PROBLEMS, REPRESENTATIVE_PROBLEMS, SOURCE_ARCHS, CompileVariant, build_source
from iokernels.kernels.stages import plan_kernels
from iokernels.plan import CAUSAL_ALIGNMENTS, all_plans, make_plan, with_causal

try:
    from cuda.bindings import nvrtc  # noqa: F401

    from iokernels.kernels.nvrtc import compile_to_cubin

    HAVE_NVRTC = True
except ImportError:
    HAVE_NVRTC = False

ARCHS = ("sm_80", "sm_90")
U64_ATOMIC = re.compile(r"\b(?:atom|red)(?:\.\w+)*\.global\.add\.u64\b")


def causal_plans(causal: str) -> list:
    plans = [plan for problem in REPRESENTATIVE_PROBLEMS
             for plan in all_plans(N_q=1000, N_k=1000, backward=True, causal=causal, **problem)]
    plans += [make_plan(N_q=1000, causal=causal, **problem) for problem in FORCED_TILE_PROBLEMS]
    for d in FAST_HEAD_DIMS:  # the tensor-core kernels: forward wgmma and mma.sync, backward wgmma
        for dtype in FAST_DTYPES:
            plans += [with_causal(make_fast_plan(N_q=1000, d=d, dtype=dtype, kernel=kernel), causal)
                      for kernel in ("wgmma", "mma")]
            plans.append(make_plan("flash", "fast", N_q=1000, d=d, dtype=dtype, sram=227 * 1024, direction="bwd",
                                   causal=causal))
    return plans


@functools.cache
def causal_variants() -> dict[str, list[CompileVariant]]:
    """source -> its causal compile variants (the stages that take the CAUSAL define)."""
    modules: dict[tuple[str, tuple], set[str]] = {}
    for causal in CAUSAL_ALIGNMENTS:
        for plan in causal_plans(causal):
            for stage, ref in plan_kernels(plan):
                if "CAUSAL" in dict(stage.params):
                    modules.setdefault((ref.source, ref.defines), set()).add(ref.name_expression)
    out: dict[str, list[CompileVariant]] = {}
    for (source, defines), names in modules.items():
        out.setdefault(source, []).append(CompileVariant(dict(defines), tuple(sorted(names))))
    return out


CASES = [pytest.param(source, i, arch, id=f"{source}-causal{i}-{arch}")
         for source, variants in sorted(causal_variants().items()) for i in range(len(variants))
         for arch in SOURCE_ARCHS.get(source, ARCHS)]


def test_every_causal_kernel_family_has_variants():
    sources = set(causal_variants())
    assert {"gemm.cu", "rowwise.cu", "flash_fwd.cu", "two_pass.cu", "flash_bwd.cu", "flash_tc.cu",
            "flash_wgmma.cu", "flash_wgmma_bwd.cu"} <= sources
    for variants in causal_variants().values():
        assert all(v.defines["CAUSAL"] in (1, 2) for v in variants)


@functools.cache
def compiled(source: str, variant: int, arch: str, counting: bool):
    v = causal_variants()[source][variant]
    return compile_to_cubin(build_source(source, v.defines, counting), arch=arch, name=source,
                            name_expressions=v.name_expressions)


@pytest.fixture(scope="module", autouse=True)
def _precompile_in_parallel() -> None:
    if HAVE_NVRTC:
        jobs = [(*c.values, counting) for c in CASES for counting in (True, False)]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            list(pool.map(lambda job: _quiet(compiled, *job), jobs))


def _quiet(fn, *args):
    try:
        fn(*args)
    except Exception:  # the test that owns the job reports it
        pass


@pytest.mark.skipif(not HAVE_NVRTC, reason="cuda.bindings not installed (pip install -e '.[test]' installs NVRTC)")
@pytest.mark.parametrize("counting", [True, False], ids=["count", "plain"])
@pytest.mark.parametrize(("source", "variant", "arch"), CASES)
def test_causal_variant_compiles_without_spills(source: str, variant: int, arch: str, counting: bool) -> None:
    result = compiled(source, variant, arch, counting)
    assert result.cubin
    assert "warning" not in result.log.lower(), result.log
    for fn, res in result.resources.items():
        assert (res.stack_frame, res.spill_stores, res.spill_loads) == (0, 0, 0), f"{fn}: {res}"
    # the plain build has no counting code, the counting build flushes its counters
    assert bool(U64_ATOMIC.search(result.ptx)) == counting
