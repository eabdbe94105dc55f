"""NVRTC compile of the dropout kernel variants (counting and plain builds), on the CPU.

Every plan of ``plan.DROPOUT_STAGES`` (read at test time, so stages that gain dropout later are covered) in
float32, float16 and bfloat16, without and with the causal mask: the stages that apply dropout carry the
``DROPOUT`` define (and take its four arguments), so they are modules of their own. No spills, zero stack, no
warnings, the counter flush in the counting build only. To keep CI's CPU time small each variant compiles
for one architecture (sm_90, or the one its source is for); the other masked-variant tests cover sm_80.
"""

from __future__ import annotations

import functools

from iokernels.kernels.sources import CompileVariant
from iokernels.plan import DROPOUT_STAGES, Unsupported, make_plan, supports_causal
from iokernels.plan.dropout import Dropout

from .nvrtc_variants import ONE_ARCH, case_count, plan_variants

KB = 1024
# (d, dtype, M): one problem per dtype, d and M of the representative problems
PROBLEMS = [(64, "float32", 192 * KB), (64, "float16", 192 * KB), (128, "bfloat16", 227 * KB)]
DROPOUT = Dropout(0.1, 2**40 + 3, 7)



def dropout_plans() -> list:
    plans = []
    for algorithm, schedule, direction in sorted(DROPOUT_STAGES):
        for d, dtype, sram in PROBLEMS:
            for causal in ("", "bottom_right"):
                if causal and not supports_causal(algorithm, schedule, direction):
                    continue
                try:
                    plans.append(make_plan(algorithm, schedule, N_q=1000, d=d, dtype=dtype, sram=sram,
                                           direction=direction, causal=causal, dropout=DROPOUT))
                except Unsupported:  # e.g. a dtype or head dim a fast kernel does not take
                    continue
    return plans


@functools.cache
def dropout_variants() -> dict[str, list[CompileVariant]]:
    """source -> its dropout compile variants (the stages that take the DROPOUT define)."""
    return plan_variants(dropout_plans(), "DROPOUT")


def test_every_dropout_stage_has_variants():
    plans = dropout_plans()
    keys = {(p.algorithm, p.schedule, p.direction) for p in plans}
    assert keys == set(DROPOUT_STAGES)
    variants = dropout_variants()
    research = {("flash", "q_outer", "fwd"), ("flash", "kv_outer", "fwd"), ("two_pass", "store", "fwd"),
                ("two_pass", "recompute", "fwd"), ("flash", "kv_outer", "bwd")}
    if research <= keys:
        assert {"flash_fwd.cu", "two_pass.cu", "flash_bwd.cu"} <= set(variants)
        names = {n for vs in variants.values() for v in vs for n in v.name_expressions}
        for kernel in ("flash_q_outer", "flash_kv_outer", "two_pass_store_output", "two_pass_recompute_output",
                       "flash_bwd_kv_outer"):
            for t in ("float", "__half", "__nv_bfloat16"):
                assert f"{kernel}<{t}>" in names
    for vs in variants.values():
        assert all(v.defines["DROPOUT"] == 1 for v in vs)
    assert any("CAUSAL" in v.defines for vs in variants.values() for v in vs)
    assert case_count(variants, ONE_ARCH) <= 80  # a few dozen compiles per build: CI runs this on 2 cores


