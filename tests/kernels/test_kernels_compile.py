"""NVRTC on the CPU: the compile helpers, the counting helpers on every element type, source assembly and the
ptxas report. (Every kernel variant is compiled by ``test_compile.py``.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from iokernels.kernels.nvrtc import (
    KernelCompileError,
    KernelResources,
    compile_to_cubin,
    parse_ptxas_log,
)
from iokernels.kernels.sources import (
    build_source,
    compile_variants,
    list_sources,
    read_source,
)
from iokernels.plan.tensors import TENSORS

from .nvrtc_variants import HAVE_NVRTC, needs_nvrtc


def test_nvrtc_installed_in_ci() -> None:
    if HAVE_NVRTC:
        return
    if os.environ.get("CI"):
        pytest.fail("CI must install the test extra: cuda.bindings is missing, so no kernel was compiled")
    pytest.skip("cuda.bindings not installed (pip install -e '.[test]' installs NVRTC)")


def test_every_source_has_compile_variants() -> None:
    assert "selftest.cu" in list_sources()
    for source in list_sources():
        assert compile_variants(source), f"{source}: no compile variants"


# Every helper on every element type the kernels use; appended to a real translation unit.
HELPERS_KERNEL = r"""
template <typename X>
__global__ void iok_helpers(const X* __restrict__ a, X* __restrict__ b, unsigned long long* iok_counters)
{
    IokCounters<IOK_T_K, IOK_T_V> c;
    iok_st<IOK_T_V>(c, b + threadIdx.x, iok_ld<IOK_T_K>(c, a + threadIdx.x));
    iok_flush(c, iok_counters);
}

__global__ void iok_atomics(float* f, double* d, __half2* h, unsigned long long* iok_counters)
{
    IokCounters<IOK_T_dQacc> c;
    iok_atomic_add<IOK_T_dQacc>(c, f, 1.0f);
    iok_atomic_add<IOK_T_dQacc>(c, d, 1.0);
    iok_atomic_add<IOK_T_dQacc>(c, h, __floats2half2_rn(1.0f, 2.0f));
    iok_flush(c, iok_counters);
}
"""
ELEMENT_TYPES = ("float", "__half", "__nv_bfloat16", "float2", "float4", "__half2", "__nv_bfloat162", "uint4")


@needs_nvrtc
@pytest.mark.parametrize("counting", [True, False], ids=["count", "plain"])
def test_helpers_accept_every_element_type(counting: bool) -> None:
    exprs = [f"iok_helpers<{t}>" for t in ELEMENT_TYPES] + ["iok_atomics"]
    result = compile_to_cubin(
        build_source("selftest.cu", {"BLOCK_ROWS": 1}, counting) + HELPERS_KERNEL,
        arch="sm_80",
        name_expressions=exprs,
    )
    for expr in exprs:
        assert result.resources_of(expr).stack_frame == 0


@needs_nvrtc
@pytest.mark.parametrize("counting", [True, False], ids=["count", "plain"])
def test_access_to_an_undeclared_tensor_does_not_compile(counting: bool) -> None:
    source = build_source("selftest.cu", {"BLOCK_ROWS": 1}, counting) + HELPERS_KERNEL.replace(
        "IokCounters<IOK_T_K, IOK_T_V>", "IokCounters<IOK_T_K>"
    )
    with pytest.raises(KernelCompileError, match="tensor not named"):
        compile_to_cubin(source, name_expressions=["iok_helpers<float>"])


def test_build_source_prelude() -> None:
    plain = build_source("selftest.cu", {"BLOCK_ROWS": 4, "FLAG": True}, counting=False)
    counting = build_source("selftest.cu", {"BLOCK_ROWS": 4}, counting=True)
    assert "#define BLOCK_ROWS 4" in plain and "#define FLAG 1" in plain
    for index, tensor in enumerate(TENSORS):
        assert f"#define IOK_T_{tensor} {index}\n" in plain
    assert f"#define IOK_NUM_TENSORS {len(TENSORS)}\n" in plain
    assert "#define IOK_COUNT 1" not in plain and "#define IOK_COUNTER_SLOTS" in plain
    assert "#define IOK_COUNT 1\n" in counting
    # common.cuh is inlined, not included: the text compiles with no include path of ours.
    assert '#include "common.cuh"' not in plain
    assert read_source("common.cuh").strip() in plain


@pytest.mark.parametrize(
    ("defines", "error"),
    [
        ({"IOK_COUNT": 1}, ValueError),
        ({"2BAD": 1}, ValueError),
        ({"X": "1\n#define Y 2"}, ValueError),
        ({"X": 1.5}, TypeError),
    ],
)
def test_build_source_rejects_bad_defines(defines: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        build_source("selftest.cu", defines, counting=False)


def test_read_source_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match=r"selftest\.cu"):
        read_source("../tensors.py")


def test_import_is_cheap() -> None:
    code = (
        "import sys, iokernels.kernels, iokernels.kernels.nvrtc; "
        "heavy = [m for m in ('cupy', 'cuda.bindings', 'cuda.bindings.nvrtc') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


@needs_nvrtc
def test_syntax_error_raises_with_log() -> None:
    with pytest.raises(KernelCompileError, match=r"broken\.cu.*error") as info:
        compile_to_cubin('extern "C" __global__ void k(int* p) { p[0] = ; }', name="broken.cu")
    assert "expected an expression" in info.value.log
    assert info.value.log in str(info.value)


def test_rejects_virtual_arch() -> None:
    with pytest.raises(ValueError, match="compute_90"):
        compile_to_cubin("", arch="compute_90")


PTXAS_SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z12iok_selftestIfEvPKT_PS0_PfiifPy' for 'sm_90'
ptxas info    : Function properties for _Z12iok_selftestIfEvPKT_PS0_PfiifPy
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers
ptxas info    : Compile time = 50.170 ms
ptxas info    : Function properties for _Z6helperv
ptxas         .     16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'big' for 'sm_80'
ptxas info    : Function properties for big
ptxas         .     24 bytes stack frame, 24 bytes spill stores, 20 bytes spill loads
ptxas info    : Used 255 registers, 4096 bytes smem, 380 bytes cmem[0]
"""


def test_parse_ptxas_log() -> None:
    assert parse_ptxas_log(PTXAS_SAMPLE) == {
        "_Z12iok_selftestIfEvPKT_PS0_PfiifPy": KernelResources(registers=32, barriers=1),
        "_Z6helperv": KernelResources(stack_frame=16),
        "big": KernelResources(registers=255, stack_frame=24, spill_stores=24, spill_loads=20, shared=4096),
    }
    assert parse_ptxas_log("") == {}


def test_own_headers_are_inlined_with_line_directives() -> None:
    text = build_source("flash_fwd.cu", compile_variants("flash_fwd.cu")[0].defines, counting=False)
    assert '#include "tiles.cuh"' not in text
    assert '#line 1 "tiles.cuh"' in text and read_source("tiles.cuh").strip() in text
    after = text.index('#line 1 "flash_fwd.cu"')
    include_line = read_source("flash_fwd.cu").splitlines().index('#include "tiles.cuh"') + 1
    assert f'#line {include_line + 1} "flash_fwd.cu"' in text[after:]


def test_forced_tiles_of_the_block_study_are_compiled():
    from iokernels.plan import make_plan
    from iokernels.plan.research import FORCED_TILE_PROBLEMS

    tiles = {(dict(v.defines)["BR"], dict(v.defines)["BC"]) for v in compile_variants("flash_fwd.cu")}
    for problem in FORCED_TILE_PROBLEMS:
        plan = make_plan(N_q=1000, **problem)
        assert (plan.tile["Br"], plan.tile["Bc"]) in tiles, problem
    assert {(41, 512), (512, 13)} <= tiles  # B_c = 512 with B_r shrunk to fit; B_r = 512 with B_c shrunk


@needs_nvrtc
def test_the_flush_adds_no_barrier_and_no_shared_memory() -> None:
    """iok_flush sums per warp and adds with atomics (common.cuh): the counting build of a kernel has the plain build's
    barriers and shared memory, no more (a barrier-free flush: warps may reach it diverged, in any order)."""
    sources = {counting: build_source("selftest.cu", {"BLOCK_ROWS": 2}, counting) for counting in (True, False)}
    assert "iok_flush(c, iok_counters)" in sources[True]
    built = {counting: compile_to_cubin(text, name_expressions=("iok_selftest<float>",))
             for counting, text in sources.items()}
    barriers = {k: len(re.findall(r"\b(?:bar|barrier)\.(?:sync|cta\.sync)\b", r.ptx)) for k, r in built.items()}
    assert barriers[True] == barriers[False] >= 1, barriers  # the kernel's own __syncthreads, once in each
    assert (built[True].resources_of("iok_selftest<float>").shared
            == built[False].resources_of("iok_selftest<float>").shared)
