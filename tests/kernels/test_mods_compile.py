"""NVRTC compile of the programmable variants' kernel variants (counting and plain builds), on the CPU.

The kernels of :data:`iokernels.plan.mods.MOD_KERNELS` (the tma forward and the narrow tma backward) with a user's
expressions compiled in (``MASK_MOD``, ``SCORE_MOD``, ``SCORE_GRAD``, ``MOD_CAPS``): a document mask with causal
read from a captured int32 array and ALiBi as a score_mod reading captured float slopes (the forward at d 128, the
backward at d 64 grouped-query), a softcap as a score_mod with its derivative (the backward at d 128, the forward at
d 64 with a window-like mask), and the mask of a block mask made from a mask_mod (full blocks skip it: both at d
64). Each compiled once by ``test_compile.py`` (no warnings, no serialized wgmma; the spills a user's expression
may cause are allowed there and reported).
"""

from __future__ import annotations

import functools

import numpy as np

from iokernels.kernels.sources import CompileVariant
from iokernels.plan import make_plan
from iokernels.plan.mods import MOD_KERNELS, check_mods, mod_block_mask

from .nvrtc_variants import plan_variants

KB = 1024
DOC = np.repeat(np.arange(4, dtype=np.int32), 250)
SLOPES = np.array([0.5, 0.25, 0.125, 0.0625], dtype=np.float32)
DOCS_ALIBI = check_mods(mask_mod="doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx",
                        score_mod="score - slopes[h] * abs(q_idx - kv_idx)", score_grad="1.0f",
                        captures={"doc": DOC, "slopes": SLOPES})
SOFTCAP = check_mods(score_mod="30.0f * tanhf(score / 30.0f)",
                     score_grad="1.0f - tanhf(score / 30.0f) * tanhf(score / 30.0f)",
                     mask_mod="kv_idx <= q_idx && q_idx - kv_idx < 256")
BAND = check_mods(mask_mod="kv_idx <= q_idx && q_idx - kv_idx < 300")


def mods_plans() -> list:
    blocks = mod_block_mask(BAND, {}, 1000, 1000)
    cases = (("fwd", 128, DOCS_ALIBI, None, 4), ("bwd", 64, DOCS_ALIBI, None, 2), ("bwd", 128, SOFTCAP, None, 4),
             ("fwd", 64, SOFTCAP, None, 4), ("fwd", 64, BAND, blocks, 4), ("bwd", 64, BAND, blocks, 2))
    return [make_plan("flash", "fast", N_q=1000, d=d, dtype="float16", sram=227 * KB, heads=4, kv_heads=kv,
                      direction=direction, mods=mods, block_mask=block_mask)
            for direction, d, mods, block_mask, kv in cases]


@functools.cache
def mods_variants() -> dict[str, list[CompileVariant]]:
    """source -> its programmable variants (the stages that take a SCORE_MOD or a MASK_MOD)."""
    out = plan_variants(mods_plans(), "SCORE_MOD")
    for source, vs in plan_variants(mods_plans(), "MASK_MOD").items():
        out.setdefault(source, []).extend(v for v in vs if v not in out.get(source, []))
    return out


def test_every_mod_kernel_has_a_variant():
    assert {p.stage("main").kernel for p in mods_plans()} == set(MOD_KERNELS)
    variants = mods_variants()
    assert set(variants) == {"flash_tma.cu", "flash_tma_bwd.cu"}
    assert sum(len(vs) for vs in variants.values()) == 6
    assert all("BLOCK_SPARSE" in v.defines for vs in variants.values() for v in vs if v.defines.get("MASK_MOD")
               == BAND.mask_mod)
