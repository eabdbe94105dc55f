"""NVRTC compile of the sliding-window kernel variants (counting and plain builds), on the CPU.

The kernels of :data:`iokernels.plan.WINDOW_KERNELS` (flash/fast's tma forward and backward, sm_90) with a window
alone and with the causal mask (bottom-right; the alignments differ in the host's offset only), at the tile widths
64, 128 and 256 (the backward's wide tiles) and with dropout: the main stages carry the ``WINDOW`` define (and take
the band's two offsets), so they are modules of their own. ``test_compile.py`` compiles each once (no spills, no
warnings, no serialized wgmma).
"""

from __future__ import annotations

import functools

from iokernels.kernels.sources import CompileVariant
from iokernels.plan import WINDOW_KERNELS, Dropout, make_plan

from .nvrtc_variants import plan_variants

KB = 1024


def window_plans() -> list:
    plans = []
    for direction in ("fwd", "bwd"):
        for d in (64, 128, 256):
            for causal in ("", "bottom_right"):  # (the alignments share the band's code: one is compiled)
                plans.append(make_plan("flash", "fast", N_q=1000, d=d, dtype="float16", sram=227 * KB,
                                       direction=direction, causal=causal, window=(256, 0 if causal else 64)))
        plans.append(make_plan("flash", "fast", N_q=1000, d=64, dtype="bfloat16", sram=227 * KB, direction=direction,
                               window=(128, 128), dropout=Dropout(0.1, 5, 0)))
    return plans


@functools.cache
def window_variants() -> dict[str, list[CompileVariant]]:
    """source -> its window compile variants (the stages that take the WINDOW define)."""
    return plan_variants(window_plans(), "WINDOW")


def test_every_window_kernel_has_variants():
    kernels = {p.stage("main").kernel for p in window_plans()}
    assert kernels == set(WINDOW_KERNELS)
    variants = window_variants()
    assert set(variants) == {"flash_tma.cu", "flash_tma_bwd.cu"}
    defines = [v.defines for vs in variants.values() for v in vs]
    assert all(d["WINDOW"] == 1 for d in defines)
    assert {d.get("CAUSAL") for d in defines} == {None, 2}
    assert any("DROPOUT" in d for d in defines)
