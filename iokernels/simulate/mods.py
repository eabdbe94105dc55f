"""A programmable variant (iokernels.plan.mods) in the simulator and the float64 reference: the expressions applied
by :func:`iokernels.plan.mods.apply_mods`, the captured arrays' reads counted per tile as the kernels read them."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..plan import Plan
from ..plan.mods import CTYPE_BYTES, apply_mods, captures_of, host_captures
from .hbm import Hbm
from .reference import Mods


def reference_mods(plan: Plan, inputs: Mapping[str, object]) -> Mods | None:
    """The plan's variant as the reference's ``mods`` (every element of (BH, N_q, N_k) logits); None without one."""
    if plan.mods is None:
        return None
    mods, arrays = plan.mods, host_captures(plan.mods, captures_of(plan.mods, inputs))
    rows, cols = np.arange(plan.N_q), np.arange(plan.N_k)

    def run(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x, grad, _ = apply_mods(mods, arrays, plan.heads, plan.N_q, plan.N_k, s.reshape(-1, plan.N_q, plan.N_k),
                                rows, cols, grads=True)
        return x.reshape(s.shape), grad.reshape(s.shape)

    return run


def tile_mods(hbm: Hbm, arrays: Mapping[str, np.ndarray], rs: slice, cs: slice, logits: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """The pair's logits (BH, rows, cols) through the plan's variant as its kernel applies it (mask_mod only where the
    block mask does not mark the pair full), the captured elements read counted over the whole B_r x B_c tile (a
    query or key past the end with the last one's index, its score 0: the zero-filled rows the kernels compute; a
    staged read, MOD_STAGE: the pair's own elements once); (x, d score_mod / d score) of the pair's elements."""
    p = hbm.plan
    br, bc = p.tile["Br"], p.tile["Bc"]
    partial = True
    if p.block_mask is not None:
        partial = bool(p.block_grid()[rs.start // br, cs.start // bc] == 1)
    r, c = rs.stop - rs.start, cs.stop - cs.start
    padded = np.zeros((logits.shape[0], br, bc))
    padded[:, :r, :c] = logits
    rows = np.minimum(np.arange(rs.start, rs.start + br), p.N_q - 1)
    cols = np.minimum(np.arange(cs.start, cs.start + bc), p.N_k - 1)
    x, grad, reads = apply_mods(p.mods, arrays, p.heads, p.N_q, p.N_k, padded, rows, cols, partial=partial,
                                grads=p.direction == "bwd")
    staged = dict(p.stage("main").params).get("MOD_STAGE_T")
    if staged is not None:  # a staged read (plan.mods.staging): each element inside (N_q, N_k) once
        reads = logits.shape[0] * r * c * CTYPE_BYTES[staged]
    hbm.read_bytes("captures", reads)
    return x[:, :r, :c], grad[:, :r, :c]
