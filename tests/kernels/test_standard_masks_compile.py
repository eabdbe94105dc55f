"""NVRTC compile of standard attention's explicit-mask and dropout kernel variants (counting and plain builds,
sm_80 and sm_90), on the CPU.

gemm.cu with ``MASK`` (the qk stage: boolean and additive, shared and per batch·head, once with ``CAUSAL``) and
with ``DROPOUT`` (pv and dv), rowwise.cu with ``DROPOUT`` (rowdot, ds), over float32, float16 and bfloat16. The
mask variants are spread over the dtypes so that the whole file stays at a few dozen compiles (2 CPU cores in
CI). No spills, zero stack, no warnings.
"""

from __future__ import annotations

import functools

from iokernels.kernels.sources import CompileVariant
from iokernels.plan import make_plan
from iokernels.plan.dropout import Dropout
from iokernels.plan.masks import ExplicitMask

from .nvrtc_variants import case_count, plan_variants

N = 1000
KB = 1024
SRAM = 192 * KB
SMALL = 2 * KB  # 32 x 32 x 8 product tiles: the SIMT path
# (mask kind, shared, dtype, causal): every MASK x MASK_BH_STRIDE, every dtype, causal once
MASKED = [("bool", True, "float32", ""), ("bool", False, "float16", ""), ("additive", True, "bfloat16", ""),
          ("additive", False, "float32", ""), ("bool", True, "float16", "bottom_right")]
DTYPES = ("float32", "float16", "bfloat16")


@functools.cache
def standard_variants() -> dict[str, list[CompileVariant]]:
    """source -> the standard stages' compile variants that carry MASK or DROPOUT."""
    dropout = Dropout(0.1, seed=1)
    plans = [make_plan("standard", N_q=N, d=64, dtype=dtype, sram=SRAM, causal=causal, mask=ExplicitMask(kind, shared))
             for kind, shared, dtype, causal in MASKED]
    plans += [make_plan("standard", N_q=N, d=64, dtype=dtype, sram=SRAM, direction=direction, dropout=dropout)
              for dtype in DTYPES for direction in ("fwd", "bwd")]
    # the SIMT path of 16-bit elements (k-slices below mma.sync's 16): Z on half-precision slices in registers
    plans += [make_plan("standard", N_q=N, d=64, dtype="float16", sram=SMALL, direction=direction, dropout=dropout)
              for direction in ("fwd", "bwd")]
    masked = plan_variants(plans, "MASK")
    dropped = plan_variants(plans, "DROPOUT")
    return {source: masked.get(source, []) + dropped.get(source, []) for source in ("gemm.cu", "rowwise.cu")}


def test_the_variants_cover_masks_dropout_and_dtypes():
    v = standard_variants()
    gemm, rows = v["gemm.cu"], v["rowwise.cu"]
    masks = {(x.defines["MASK"], x.defines["MASK_BH_STRIDE"]) for x in gemm if "MASK" in x.defines}
    assert masks == {(1, 0), (1, 1), (2, 0), (2, 1)}
    assert any("CAUSAL" in x.defines and "MASK" in x.defines for x in gemm)
    assert not any("MASK" in x.defines and "DROPOUT" in x.defines for x in gemm)
    names = {n for x in gemm if "DROPOUT" in x.defines for n in x.name_expressions}
    for ctype in ("float", "__half", "__nv_bfloat16"):
        assert f"gemm<{ctype}, 0, 0, 5, 2, 3>" in names  # pv: P V -> O
        assert f"gemm<{ctype}, 1, 0, 5, 9, 15>" in names  # dv: Pᵀ dO -> dV
        assert any(n.startswith(f"gemm<{ctype}, 0, 1,") for x in gemm if "MASK" in x.defines
                   for n in x.name_expressions)  # qk
    assert len(rows) == 1 and rows[0].defines["DROPOUT"] == 1
    assert set(rows[0].name_expressions) == {f"{k}<{t}>" for k in ("rowdot", "ds")
                                             for t in ("float", "__half", "__nv_bfloat16")}
    assert any(x.defines["BK"] < 16 and "DROPOUT" in x.defines for x in gemm)  # 16-bit SIMT (no mma.sync)
    assert case_count(v) * 2 <= 40  # a few dozen compiles


