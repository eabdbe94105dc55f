"""NVRTC compile of every explicit-mask kernel variant (counting and plain builds, sm_80 and sm_90), on the CPU.

The plans of ``iokernels.kernels.REPRESENTATIVE_PROBLEMS`` with an explicit mask (boolean and additive, shared and
per batch·head alternating over the problems), without and with the causal mask and a block mask (each with two of
the problems, a float32 and a half-precision one): the stages that
read the mask carry the ``MASK`` and ``MASK_BH_STRIDE`` defines (and take the mask as an argument), so they are
modules of their own. No spills, zero stack, no warnings.
"""

from __future__ import annotations

import functools

from iokernels.kernels.sources import REPRESENTATIVE_PROBLEMS, CompileVariant
from iokernels.plan import make_plan, supports_explicit_mask
from iokernels.plan.masks import ExplicitMask, pattern

from .nvrtc_variants import plan_variants

N = 1000
KEYS = [("flash", "q_outer", "fwd"), ("flash", "kv_outer", "bwd")]


@functools.cache
def mask_variants() -> dict[str, list[CompileVariant]]:
    """source -> its explicit-mask compile variants (the stages that take the MASK define)."""
    block = pattern("random", 0.5, n_q=N, n_k=N, block_q=128)
    # the mask's row stride (shared or per batch·head) alternates over the problems, so each kind meets both strides
    # with every other mask and tile (the stride is one index's factor: CI's time, half the modules); the causal mask
    # meets the problems of float32 d 64 and bfloat16 d 256, the block mask those of float32 d 16 and float16 d 64
    # (each a float32 and a half-precision tile: the mask's code is the same at every tile of a dtype)
    combos = (("", None, (0, 1, 2, 3)), ("bottom_right", None, (1, 3)), ("", block, (0, 2)))
    plans = [make_plan(algorithm, schedule, N_q=N, direction=direction, causal=causal, block_mask=block_mask,
                       mask=ExplicitMask(kind, (i + j) % 2 == 0), **REPRESENTATIVE_PROBLEMS[i])
             for kind in ("bool", "additive") for j, (causal, block_mask, problems) in enumerate(combos)
             for i in problems for algorithm, schedule, direction in KEYS]
    return plan_variants(plans, "MASK")


def test_every_mask_kernel_family_has_variants():
    assert all(supports_explicit_mask(*key) for key in KEYS)
    assert set(mask_variants()) == {"flash_fwd.cu", "flash_bwd.cu"}
    for variants in mask_variants().values():
        assert {(v.defines["MASK"], v.defines["MASK_BH_STRIDE"]) for v in variants} == {(1, 0), (1, 1), (2, 0), (2, 1)}
        assert any("CAUSAL" in v.defines for v in variants) and any("BLOCK_SPARSE" in v.defines for v in variants)


