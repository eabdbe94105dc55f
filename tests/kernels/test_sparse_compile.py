"""NVRTC compile of every block-sparse kernel variant (counting and plain builds, sm_80 and sm_90), on the CPU.

The plans of ``iokernels.kernels.REPRESENTATIVE_PROBLEMS`` with a block mask, without and (the smallest and the
largest problem) with the causal mask: the stages of block-sparse plans carry the ``BLOCK_SPARSE`` define (and take
the block mask as an argument), so they are modules of their own. No spills, zero stack, no warnings.
"""

from __future__ import annotations

import functools

from iokernels.kernels.sources import REPRESENTATIVE_PROBLEMS, CompileVariant
from iokernels.plan import all_plans
from iokernels.plan.masks import pattern

from .nvrtc_variants import plan_variants

N = 1000


@functools.cache
def sparse_variants() -> dict[str, list[CompileVariant]]:
    """source -> its block-sparse compile variants (the stages that take the BLOCK_SPARSE define)."""
    plans = []
    # blocks that keep the plans' usual tiles (128), with and without causal, and that shrink them to
    # divisors of 48 (the largest head dims, where registers are tightest)
    # (with causal: the smallest and the largest problem, for CI's time)
    extremes = [REPRESENTATIVE_PROBLEMS[0], REPRESENTATIVE_PROBLEMS[-1]]
    for block, causal, problems in ((128, "", REPRESENTATIVE_PROBLEMS), (128, "bottom_right", extremes),
                                    (48, "", [p for p in REPRESENTATIVE_PROBLEMS if p["d"] >= 128])):
        mask = pattern("random", 0.5, n_q=N, n_k=N, block_q=block)
        for problem in problems:
            plans += all_plans(N_q=N, N_k=N, backward=True, causal=causal, block_mask=mask, **problem)
    # (flash/fast's tma kernels: their own cases in iokernels.kernels.sources, for CI's time)
    return plan_variants([p for p in plans if p.schedule != "fast"], "BLOCK_SPARSE")


def test_every_block_sparse_kernel_family_has_variants():
    assert set(sparse_variants()) == {"flash_fwd.cu", "two_pass.cu", "flash_bwd.cu"}
    for variants in sparse_variants().values():
        assert all(v.defines["BLOCK_SPARSE"] == 1 for v in variants)
        assert any("CAUSAL" in v.defines for v in variants) and any("CAUSAL" not in v.defines for v in variants)


