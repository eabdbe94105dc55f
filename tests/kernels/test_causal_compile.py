"""NVRTC compile of every causal kernel variant (counting and plain builds, sm_80 and sm_90), on the CPU.

The plans of ``iokernels.kernels.REPRESENTATIVE_PROBLEMS`` and ``FORCED_TILE_PROBLEMS`` with the causal
mask, the two alignments alternating over the plans: the stages of causal plans carry the ``CAUSAL`` define, so they
are modules of their own. (tests/kernels/test_kernels_compile.py compiles the unmasked variants.)
"""

from __future__ import annotations

import functools

from iokernels.kernels.sources import REPRESENTATIVE_PROBLEMS, CompileVariant
from iokernels.plan import CAUSAL_ALIGNMENTS, all_plans, make_plan, with_causal
from iokernels.plan.fast import FAST_DTYPES, FAST_HEAD_DIMS, make_fast_plan
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.research import FORCED_TILE_PROBLEMS

from .nvrtc_variants import plan_variants


def causal_plans(causal: str) -> list:
    plans = [plan for problem in REPRESENTATIVE_PROBLEMS
             for plan in all_plans(N_q=1000, N_k=1000, backward=True, causal=causal, **problem)]
    plans += [make_plan(N_q=1000, causal=causal, **problem) for problem in FORCED_TILE_PROBLEMS]
    for d in FAST_HEAD_DIMS:  # the tensor-core kernels: forward wgmma and mma.sync, backward tma and wgmma
        for dtype in FAST_DTYPES:
            plans += [with_causal(make_fast_plan(N_q=1000, d=d, dtype=dtype, kernel=kernel), causal)
                      for kernel in ("wgmma", "mma")]
            plans.append(make_plan("flash", "fast", N_q=1000, d=d, dtype=dtype, sram=227 * 1024, direction="bwd",
                                   causal=causal))  # the default backward (tma)
            plans.append(with_causal(make_fast_backward_plan(N_q=1000, d=d, dtype=dtype, kernel="wgmma"), causal))
            # the backward's d inside a wider tile (HEAD_D_TILE): 32 and 96
            plans.append(make_plan("flash", "fast", N_q=1000, d=d - 32, dtype=dtype, sram=227 * 1024,
                                   direction="bwd", causal=causal))
            # past d 128: the tma backward's wide tiles (d 192 in 192, d 224 in 256)
            plans.append(make_plan("flash", "fast", N_q=1000, d=d + 96, dtype=dtype, sram=227 * 1024,
                                   direction="bwd", causal=causal))
    return plans


@functools.cache
def causal_variants() -> dict[str, list[CompileVariant]]:
    """source -> its causal compile variants (the stages that take the CAUSAL define)."""
    # the alignments alternate over the plans (CAUSAL's value only picks iok_causal_offset's constant: CI's time, half
    # the modules), so every kernel meets both where it has two plans or more
    lists = [causal_plans(causal) for causal in CAUSAL_ALIGNMENTS]
    return plan_variants((plans[i] for i in range(len(lists[0])) for k, plans in enumerate(lists)
                          if i % len(lists) == k), "CAUSAL")


def test_every_causal_kernel_family_has_variants():
    sources = set(causal_variants())
    assert {"gemm.cu", "rowwise.cu", "flash_fwd.cu", "two_pass.cu", "flash_bwd.cu", "flash_tc.cu",
            "flash_wgmma.cu", "flash_wgmma_bwd.cu", "flash_tma_bwd.cu"} <= sources
    for variants in causal_variants().values():
        assert all(v.defines["CAUSAL"] in (1, 2) for v in variants)
    for source in ("two_pass.cu", "flash_fwd.cu", "flash_bwd.cu", "flash_tma_bwd.cu"):
        assert {v.defines["CAUSAL"] for v in causal_variants()[source]} == {1, 2}, source


