"""NVRTC compile of every explicit-mask kernel variant (counting and plain builds, sm_80 and sm_90), on the CPU.

The plans of ``iokernels.kernels.REPRESENTATIVE_PROBLEMS`` with an explicit mask (boolean and additive,
shared and per batch·head), without and with the causal mask and a block mask: the stages that read the
mask carry the ``MASK`` and ``MASK_BH_STRIDE`` defines (and take the mask as an argument), so they are
modules of their own. No spills, zero stack, no warnings.
"""

from __future__ import annotations

import functools
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from iokernels.kernels import REPRESENTATIVE_PROBLEMS, CompileVariant, build_source
from iokernels.kernels.stages import plan_kernels
from iokernels.masks import ExplicitMask, pattern
from iokernels.plan import make_plan, supports_explicit_mask

try:
    from cuda.bindings import nvrtc  # noqa: F401

    from iokernels.kernels.nvrtc import compile_to_cubin

    HAVE_NVRTC = True
except ImportError:
    HAVE_NVRTC = False

ARCHS = ("sm_80", "sm_90")
U64_ATOMIC = re.compile(r"\b(?:atom|red)(?:\.\w+)*\.global\.add\.u64\b")
N = 1000
KEYS = [("flash", "q_outer", "fwd"), ("flash", "kv_outer", "bwd")]


@functools.cache
def mask_variants() -> dict[str, list[CompileVariant]]:
    """source -> its explicit-mask compile variants (the stages that take the MASK define)."""
    modules: dict[tuple[str, tuple], set[str]] = {}
    block = pattern("random", 0.5, n_q=N, n_k=N, block_q=128)
    for kind in ("bool", "additive"):
        for shared in (True, False):
            for causal, block_mask in (("", None), ("bottom_right", None), ("", block)):
                for problem in REPRESENTATIVE_PROBLEMS:
                    for algorithm, schedule, direction in KEYS:
                        plan = make_plan(algorithm, schedule, N_q=N, direction=direction, causal=causal,
                                         block_mask=block_mask, mask=ExplicitMask(kind, shared), **problem)
                        for stage, ref in plan_kernels(plan):
                            if "MASK" in dict(stage.params):
                                modules.setdefault((ref.source, ref.defines), set()).add(ref.name_expression)
    out: dict[str, list[CompileVariant]] = {}
    for (source, defines), names in modules.items():
        out.setdefault(source, []).append(CompileVariant(dict(defines), tuple(sorted(names))))
    return out


CASES = [pytest.param(source, i, arch, id=f"{source}-mask{i}-{arch}")
         for source, variants in sorted(mask_variants().items()) for i in range(len(variants)) for arch in ARCHS]


def test_every_mask_kernel_family_has_variants():
    assert all(supports_explicit_mask(*key) for key in KEYS)
    assert set(mask_variants()) == {"flash_fwd.cu", "flash_bwd.cu"}
    for variants in mask_variants().values():
        assert {(v.defines["MASK"], v.defines["MASK_BH_STRIDE"]) for v in variants} == {(1, 0), (1, 1), (2, 0), (2, 1)}
        assert any("CAUSAL" in v.defines for v in variants) and any("BLOCK_SPARSE" in v.defines for v in variants)


@functools.cache
def compiled(source: str, variant: int, arch: str, counting: bool):
    v = mask_variants()[source][variant]
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
def test_mask_variant_compiles_without_spills(source: str, variant: int, arch: str, counting: bool) -> None:
    result = compiled(source, variant, arch, counting)
    assert result.cubin
    assert "warning" not in result.log.lower(), result.log
    for fn, res in result.resources.items():
        assert (res.stack_frame, res.spill_stores, res.spill_loads) == (0, 0, 0), f"{fn}: {res}"
    # the plain build has no counting code, the counting build flushes its counters
    assert bool(U64_ATOMIC.search(result.ptx)) == counting
