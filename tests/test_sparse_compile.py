"""NVRTC compile of every block-sparse kernel variant (counting and plain builds, sm_80 and sm_90), on the CPU.

The plans of ``iokernels.kernels.REPRESENTATIVE_PROBLEMS`` with a block mask, without and with the causal
mask: the stages of block-sparse plans carry the ``BLOCK_SPARSE`` define (and take the block mask as an
argument), so they are modules of their own. No spills, zero stack, no warnings.
"""

from __future__ import annotations

import functools
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from iokernels.kernels import REPRESENTATIVE_PROBLEMS, CompileVariant, build_source
from iokernels.kernels.stages import plan_kernels
from iokernels.masks import pattern
from iokernels.plan import all_plans

try:
    from cuda.bindings import nvrtc  # noqa: F401

    from iokernels.kernels.nvrtc import compile_to_cubin

    HAVE_NVRTC = True
except ImportError:
    HAVE_NVRTC = False

ARCHS = ("sm_80", "sm_90")
U64_ATOMIC = re.compile(r"\b(?:atom|red)(?:\.\w+)*\.global\.add\.u64\b")
N = 1000


@functools.cache
def sparse_variants() -> dict[str, list[CompileVariant]]:
    """source -> its block-sparse compile variants (the stages that take the BLOCK_SPARSE define)."""
    modules: dict[tuple[str, tuple], set[str]] = {}
    # blocks that keep the plans' usual tiles (128), with and without causal, and that shrink them to
    # divisors of 48 (the largest head dims, where registers are tightest)
    for block, causal, problems in ((128, "", REPRESENTATIVE_PROBLEMS), (128, "bottom_right", REPRESENTATIVE_PROBLEMS),
                                    (48, "", [p for p in REPRESENTATIVE_PROBLEMS if p["d"] >= 128])):
        mask = pattern("random", 0.5, n_q=N, n_k=N, block_q=block)
        for problem in problems:
            for plan in all_plans(N_q=N, N_k=N, backward=True, causal=causal, block_mask=mask, **problem):
                for stage, ref in plan_kernels(plan):
                    if "BLOCK_SPARSE" in dict(stage.params):
                        modules.setdefault((ref.source, ref.defines), set()).add(ref.name_expression)
    out: dict[str, list[CompileVariant]] = {}
    for (source, defines), names in modules.items():
        out.setdefault(source, []).append(CompileVariant(dict(defines), tuple(sorted(names))))
    return out


CASES = [pytest.param(source, i, arch, id=f"{source}-sparse{i}-{arch}")
         for source, variants in sorted(sparse_variants().items()) for i in range(len(variants)) for arch in ARCHS]


def test_every_block_sparse_kernel_family_has_variants():
    assert set(sparse_variants()) == {"flash_fwd.cu", "two_pass.cu", "flash_bwd.cu"}
    for variants in sparse_variants().values():
        assert all(v.defines["BLOCK_SPARSE"] == 1 for v in variants)
        assert any("CAUSAL" in v.defines for v in variants) and any("CAUSAL" not in v.defines for v in variants)


@functools.cache
def compiled(source: str, variant: int, arch: str, counting: bool):
    v = sparse_variants()[source][variant]
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
def test_block_sparse_variant_compiles_without_spills(source: str, variant: int, arch: str, counting: bool) -> None:
    result = compiled(source, variant, arch, counting)
    assert result.cubin
    assert "warning" not in result.log.lower(), result.log
    for fn, res in result.resources.items():
        assert (res.stack_frame, res.spill_stores, res.spill_loads) == (0, 0, 0), f"{fn}: {res}"
    # the plain build has no counting code, the counting build flushes its counters
    assert bool(U64_ATOMIC.search(result.ptx)) == counting
