"""NVRTC compile of the programmable variants' kernel variants (counting and plain builds), on the CPU.

The kernels of :data:`iokernels.plan.mods.MOD_KERNELS` (the tma forward and the narrow tma backward) with a user's
expressions compiled in (``MASK_MOD``, ``SCORE_MOD``, ``SCORE_GRAD``, ``MOD_CAPS``) or an explicit mask's read
(``MOD_STAGE``, ``MOD_TMA``, ``MOD_PREFETCH``), eight cases covering each define in each kernel: a document mask read
from a captured int32 array with ALiBi as a score_mod reading captured float16 slopes (the forward at d 128); a softcap
as a score_mod with its derivative and a band as the mask (the backward at d 128); a document mask with the block mask
made from it (full blocks skip it; both kernels at d 64, the backward grouped-query); an additive float16 mask per head
loaded by the copy engine (MOD_TMA, d 128, grouped-query), a boolean one the same as bytes with a block mask (d 64), an
additive float32 one staged by cp.async (d 128: two stages of it do not fit) and an additive one whose odd rows are
prefetched instead (d 64). Each compiled once by ``test_compile.py`` (no warnings, no serialized wgmma; the spills a
user's expression may cause in the counting build are allowed there).
"""

from __future__ import annotations

import functools

import numpy as np

from iokernels.kernels.sources import CompileVariant
from iokernels.plan import make_plan
from iokernels.plan.masks import pattern
from iokernels.plan.mods import MOD_KERNELS, check_mods, mod_block_mask

from .nvrtc_variants import plan_variants

KB = 1024
DOC = np.repeat(np.arange(4, dtype=np.int32), 250)
SLOPES = np.array([0.5, 0.25, 0.125, 0.0625], dtype=np.float16)  # (a __half capture, read as a float)
DOCS_ALIBI = check_mods(mask_mod="doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx",
                        score_mod="score - slopes[h] * abs(q_idx - kv_idx)", score_grad="1.0f",
                        captures={"doc": DOC, "slopes": SLOPES})
SOFTCAP = check_mods(score_mod="30.0f * tanhf(score / 30.0f)",
                     score_grad="1.0f - tanhf(score / 30.0f) * tanhf(score / 30.0f)",
                     mask_mod="kv_idx <= q_idx && q_idx - kv_idx < 256")
DOCS = check_mods(mask_mod="doc[q_idx] == doc[kv_idx]", captures={"doc": DOC})
# the explicit masks' forms: an additive float16 mask per head (rows 16-byte aligned: staged through shared memory,
# MOD_STAGE; by the copy engine, MOD_TMA), a boolean one the same as bytes, an additive float32 one staged by cp.async
# (two TMA stages of it do not fit at d 128), and an additive one with odd rows (prefetched into the L2, MOD_PREFETCH)
BIAS = check_mods(score_mod="score + mask[(h * 1000 + q_idx) * 1000 + kv_idx]",
                  captures={"mask": np.zeros(4 * 1000 * 1000, np.float16)})
BOOL = check_mods(mask_mod="mask[q_idx * 1008 + kv_idx] != 0", captures={"mask": np.zeros(1000 * 1008, np.uint8)})
WIDE = check_mods(score_mod="score + mask[q_idx * 1000 + kv_idx]", captures={"mask": np.zeros(1000 * 1000, np.float32)})
ODD = check_mods(score_mod="score + mask[q_idx * 1001 + kv_idx]", captures={"mask": np.zeros(1000 * 1001, np.float16)})


def mods_plans() -> list:
    blocks = mod_block_mask(DOCS, {"doc": DOC}, 1000, 1000)
    sparse = pattern("random", 0.5, n_q=1000, n_k=1000)  # (the boolean mask's tiles by the copy engine, block-sparse)
    cases = (("fwd", 128, DOCS_ALIBI, None, 4), ("bwd", 128, SOFTCAP, None, 4), ("fwd", 64, DOCS, blocks, 4),
             ("bwd", 64, DOCS, blocks, 2), ("fwd", 128, BIAS, None, 2), ("fwd", 64, BOOL, sparse, 4),
             ("fwd", 128, WIDE, None, 4), ("fwd", 64, ODD, None, 4))
    return [make_plan("flash", "fast", N_q=1000, d=d, dtype="float16", sram=227 * KB, heads=4, kv_heads=kv,
                      direction=direction, mods=mods, block_mask=block_mask)
            for direction, d, mods, block_mask, kv in cases]


@functools.cache
def mods_variants() -> dict[str, list[CompileVariant]]:
    """source -> its programmable variants (the stages that take a SCORE_MOD or a MASK_MOD)."""
    out = plan_variants(mods_plans(), "SCORE_MOD")
    for define in ("MASK_MOD", "MOD_STAGE"):
        for source, vs in plan_variants(mods_plans(), define).items():
            out.setdefault(source, []).extend(v for v in vs if v not in out.get(source, []))
    return out


def test_every_mod_kernel_has_a_variant():
    assert {p.stage("main").kernel for p in mods_plans()} == set(MOD_KERNELS)
    variants = mods_variants()
    assert set(variants) == {"flash_tma.cu", "flash_tma_bwd.cu"}
    assert sum(len(vs) for vs in variants.values()) == 8
    staged = [v.defines for v in variants["flash_tma.cu"] if "MOD_STAGE" in v.defines]
    assert sorted((d["MOD_STAGE"], d["MOD_STAGE_T"], d["MOD_STAGE_FORM"], d.get("MOD_TMA_H"), d.get("MOD_TMA_B"))
                  for d in staged) == [("(h * 1000 + q_idx) * 1000", "__half", "1", "h", "0"),
                                       ("q_idx * 1000", "float", "1", None, None),
                                       ("q_idx * 1008", "unsigned char", "2", "0", "0")]
    assert not any("SCORE_MOD" in d or "MASK_MOD" in d or "MOD_PREFETCH" in d for d in staged)
    assert [v.defines["MOD_PREFETCH"] for v in variants["flash_tma.cu"] if "MOD_PREFETCH" in v.defines] == \
        ["q_idx * 1001 + kv_idx"]
    for defines in (v.defines for vs in variants.values() for v in vs):
        assert ("BLOCK_SPARSE" in defines) == (defines.get("MASK_MOD") == DOCS.mask_mod
                                               or defines.get("MOD_STAGE") == "q_idx * 1008")
    assert {"SCORE_GRAD", "MOD_CAPS"} <= {k for v in variants["flash_tma_bwd.cu"] for k in v.defines}
