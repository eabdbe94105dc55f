"""NVRTC compile of the softcap's kernel variants (counting and plain builds), on the CPU.

The kernels of :data:`iokernels.plan.variants.SOFTCAP_KERNELS` (the tma forward and the narrow tma backward) with
``SOFTCAP`` (one runtime float): the forward at d 128 with a causal mask and a window; the backward at d 128 with
the bottom-right causal mask (its plain build spills 4 bytes, ``test_compile.plain_spill_allowed``) and at d 64 with
a window too (the band's −inf written before the probabilities; one dQ block for two warpgroups: the order dK, dQ).
Each compiled once by ``test_compile.py`` (no warnings, no serialized wgmma); three, for CI's time.
"""

from __future__ import annotations

import functools

from iokernels.kernels.sources import CompileVariant
from iokernels.plan import make_plan
from iokernels.plan.variants import SOFTCAP_KERNELS

from .nvrtc_variants import plan_variants

KB = 1024


def softcap_plans() -> list:
    cases = (("fwd", 128, (256, 0)), ("bwd", 128, None), ("bwd", 64, (256, 0)))
    return [make_plan("flash", "fast", N_q=1000, d=d, dtype="float16", sram=227 * KB, direction=direction,
                      causal="bottom_right", window=window, softcap=30.0) for direction, d, window in cases]


@functools.cache
def softcap_variants() -> dict[str, list[CompileVariant]]:
    """source -> its softcap compile variants (the stages that take the SOFTCAP define)."""
    return plan_variants(softcap_plans(), "SOFTCAP")


def test_every_softcap_kernel_has_a_variant():
    assert {p.stage("main").kernel for p in softcap_plans()} == set(SOFTCAP_KERNELS)
    variants = softcap_variants()
    assert set(variants) == {"flash_tma.cu", "flash_tma_bwd.cu"}
    assert all(v.defines["SOFTCAP"] == 1 for vs in variants.values() for v in vs)
    assert len(variants["flash_tma_bwd.cu"]) == 2
