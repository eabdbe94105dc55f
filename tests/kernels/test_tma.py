"""Tensor maps and TMA without a GPU: the driver's rules for a map (tensormap.check_tiled), the attention map's
dims, strides and box, a structure parameter of a raw launch, and NVRTC compiling kernels/tma.cuh's PTX for
sm_90a (tests/kernels/tma_probe.cu; tests/gpu/test_tma.py runs it)."""

import ctypes
from pathlib import Path

import numpy as np
import pytest

from iokernels.kernels import rawlaunch, tensormap
from iokernels.kernels.sources import read_source

PROBE = Path(__file__).with_name("tma_probe.cu")


def probe_source(rows: int, d: int) -> str:
    return f"#define ROWS {rows}\n#define HEAD_D {d}\n" + read_source("tma.cuh") + "\n" + PROBE.read_text()


def test_the_attention_map_is_one_head_at_a_time():
    dims, strides, box, swizzle = tensormap.attention_args(0x1000, "float16", bh=6, n=1000, d=128, rows=128)
    assert dims == [128, 1000, 6] and strides == [256, 1000 * 256] and box == [64, 128, 1] and swizzle == 128
    tensormap.check_tiled(0x1000, "float16", dims, strides, box, swizzle)


@pytest.mark.parametrize("change, message", [
    ({"pointer": 0x1008}, "16-byte aligned"),
    ({"dtype": "int8"}, "dtype"),
    ({"box": [64, 300, 1]}, "box"),
    ({"box": [128, 64, 1]}, "exceeds the 128-byte swizzle"),
    ({"strides": [200, 1000 * 256]}, "multiple of 16"),
    ({"dims": [128, 0, 6]}, "dims"),
    ({"swizzle": 16}, "swizzle"),
])
def test_maps_the_driver_would_refuse_fail_here(change, message):
    args = dict(pointer=0x1000, dtype="float16", dims=[128, 1000, 6], strides=[256, 256000], box=[64, 128, 1],
                swizzle=128)
    args.update(change)
    with pytest.raises(tensormap.TensorMapError, match=message):
        tensormap.check_tiled(**args)


def test_a_head_dim_is_boxes_of_64_columns_and_rows_of_16_bytes():
    dims, strides, box, swizzle = tensormap.attention_args(0x1000, "float16", 3, 10, 96, 64)
    assert (dims, strides, box, swizzle) == ([96, 10, 3], [192, 1920], [64, 64, 1], 128)  # 2 boxes, the 2nd half d
    with pytest.raises(tensormap.TensorMapError, match="multiple of 16 bytes"):
        tensormap.attention_args(0x1000, "float16", 1, 10, 20, 64)


def test_a_structure_argument_is_passed_by_value():
    blob = bytes(range(128))
    stage = rawlaunch.RawStage(None, 0, (1,), (128,), 0, [blob, 0, np.int32(3)], dropout=False)
    slot = ctypes.cast(stage.params[0], ctypes.POINTER(ctypes.c_ubyte * 128)).contents
    assert bytes(slot) == blob and len(stage.params) == 4  # the map, the buffer, the int, the counters


@pytest.mark.parametrize("rows, d", [(64, 64), (128, 128)])
def test_the_tma_probe_compiles_for_sm_90a(rows, d):
    nvrtc = pytest.importorskip("iokernels.kernels.nvrtc")
    try:
        result = nvrtc.compile_to_cubin(probe_source(rows, d), arch="sm_90a", name="tma_probe.cu")
    except ImportError as exc:
        pytest.skip(str(exc))
    assert "cp.async.bulk.tensor.3d" in result.ptx and "mbarrier.try_wait.parity" in result.ptx
    assert result.cubin


def _tma_variants():
    from iokernels.plan.dropout import Dropout
    from iokernels.plan.fast import make_fast_plan
    from iokernels.plan.variants import with_causal, with_dropout

    # 32, 96, 160: d inside a wider tile; 192 x 128: three consumer warpgroups; 256: past 128, 128 x 64 only
    for d, br, bc, dtypes in ((64, 128, 64, 2), (64, 128, 128, 2), (128, 128, 64, 2), (128, 128, 128, 2),
                              (32, 128, 128, 2), (96, 128, 128, 2), (64, 192, 128, 2), (256, 128, 64, 2),
                              (160, 128, 64, 1)):
        for dtype in ("float16", "bfloat16")[:dtypes]:
            plan = make_fast_plan(N_q=300, N_k=200, d=d, dtype=dtype, batch=2, heads=2, kernel="tma", block_r=br,
                                  block_c=bc)
            yield plan
            yield with_causal(plan, "bottom_right")
            if br != 192:  # (dropout plans take TMA_DROPOUT_TILES: two consumer warpgroups)
                yield with_dropout(plan, Dropout(0.1, 1, 0))


def _not_in_test_compile(plans):
    """The variants tests/kernels/test_compile.py does not compile already (one compile per define set)."""
    from iokernels.kernels.stages import kernel_ref

    from .test_compile import merged

    done = merged()
    for plan in plans:
        ref = kernel_ref(plan, plan.stages[0])
        if (ref.source, tuple(sorted(ref.define_dict.items())), "sm_90a") not in done:
            yield plan


@pytest.mark.parametrize("plan", list(_not_in_test_compile(_tma_variants())),
                         ids=lambda p: f"d{p.d}-Br{dict(p.tiles)['Br']}-Bc{dict(p.tiles)['Bc']}-{p.dtype}"
                         f"{'-causal' if p.causal else ''}{'-dropout' if p.dropout else ''}")
@pytest.mark.parametrize("counting", [False, True], ids=["plain", "counting"])
def test_the_tma_forward_compiles_without_spills(plan, counting):
    """The variants of kernels/flash_tma.cu that make_plan does not plan by default (those test_compile.py
    compiles, with the same checks and no spills in either build): sm_90a, the TMA copies and the register
    reallocation in its PTX, ptxas honouring setmaxnreg (no C7508 warning) and keeping the products asynchronous,
    and no register spills in the plain build (the counting builds spill a little with dropout: they only
    count)."""
    nvrtc = pytest.importorskip("iokernels.kernels.nvrtc")
    from iokernels.kernels.sources import build_source
    from iokernels.kernels.stages import kernel_ref

    ref = kernel_ref(plan, plan.stages[0])
    try:
        result = nvrtc.compile_to_cubin(build_source(ref.source, ref.define_dict, counting), arch="sm_90a",
                                        name=ref.source, name_expressions=[ref.name_expression])
    except ImportError as exc:
        pytest.skip(str(exc))
    res = result.resources_of(ref.name_expression)
    assert "cp.async.bulk.tensor.3d" in result.ptx and "setmaxnreg.inc" in result.ptx
    assert counting or (res.spill_stores == 0 and res.spill_loads == 0), res
    assert "C7508" not in result.log and "setmaxnreg" not in result.log.lower(), result.log
    # no wgmma serialized by ptxas (C7519: a compiler-inserted wait in a divergent path; C7517: a wait injected)
    assert "C7519" not in result.log and "C7517" not in result.log, result.log
