"""NVRTC compile of the softcap's kernel variants (counting and plain builds), on the CPU.

The kernels of :data:`iokernels.plan.variants.SOFTCAP_KERNELS` (the tma forward and the narrow tma backward) with
``SOFTCAP`` (one runtime float), with a causal mask and a window (the band's −inf written before the backward's
probabilities): one forward and one backward module at d 128, compiled once each by ``test_compile.py`` (no spills,
no warnings, no serialized wgmma). Two, not more: CI's time (the other widths differ in tile constants only).
"""

from __future__ import annotations

import functools

from iokernels.kernels.sources import CompileVariant
from iokernels.plan import make_plan
from iokernels.plan.variants import SOFTCAP_KERNELS

from .nvrtc_variants import plan_variants

KB = 1024


def softcap_plans() -> list:
    return [make_plan("flash", "fast", N_q=1000, d=128, dtype="float16", sram=227 * KB, direction=direction,
                      causal="bottom_right", window=(256, 0), softcap=30.0) for direction in ("fwd", "bwd")]


@functools.cache
def softcap_variants() -> dict[str, list[CompileVariant]]:
    """source -> its softcap compile variants (the stages that take the SOFTCAP define)."""
    return plan_variants(softcap_plans(), "SOFTCAP")


def test_every_softcap_kernel_has_a_variant():
    assert {p.stage("main").kernel for p in softcap_plans()} == set(SOFTCAP_KERNELS)
    variants = softcap_variants()
    assert set(variants) == {"flash_tma.cu", "flash_tma_bwd.cu"}
    assert all(v.defines["SOFTCAP"] == 1 and v.defines["WINDOW"] == 1 for vs in variants.values() for v in vs)
