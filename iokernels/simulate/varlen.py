"""Variable-length batches in the simulator (iokernels.plan.varlen): packed inputs and their per-sequence float64
reference, and the tma forward's schedule on them, every load and store counted as flash_tma.cu built with VARLEN
counts them (a copy's rows inside the packed tensor, its sequence's offsets read by every block of the grid)."""

from __future__ import annotations

import numpy as np

from ..plan import Plan
from ..plan.causal import causal_offset
from ..plan.units import round_to
from ..plan.varlen import query_tile_keys
from . import reference
from .hbm import ALL, Hbm, divide, finite, rescale


def varlen_inputs(plan: Plan, rng: np.random.Generator, *, magnitude: float = 1.0, rounded: bool = False
                  ) -> dict[str, np.ndarray]:
    """Random packed Q (total_q, heads, d), K, V (total_k, kv_heads, d) and the offsets cu_seqlens_q, cu_seqlens_k
    ((B + 1,) int32) of ``plan``'s sequences."""
    v = plan.varlen

    def stored(x: np.ndarray) -> np.ndarray:
        return round_to(x, plan.dtype) if rounded else x

    cu_q, cu_k = v.cu_seqlens()
    return {"Q": stored(magnitude * rng.standard_normal((v.total_q, plan.heads, plan.d))),
            "K": stored(magnitude * rng.standard_normal((v.total_k, plan.kv_heads, plan.d))),
            "V": stored(rng.standard_normal((v.total_k, plan.kv_heads, plan.d))),
            "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}


def varlen_reference(plan: Plan, inputs: dict[str, np.ndarray], scale: float | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """O (total_q, heads, d) and lse (total_q, heads): the naive float64 reference on each sequence alone (its
    queries against its keys, causal in the plan's alignment; a row that sees no key: O = 0, lse −inf)."""
    v, group = plan.varlen, plan.heads // plan.kv_heads
    o = np.zeros((v.total_q, plan.heads, plan.d))
    lse = np.full((v.total_q, plan.heads), -np.inf)
    for oq, lq, ok, lk in v.sequences():
        if lq == 0 or lk == 0:
            continue
        q = np.swapaxes(inputs["Q"][oq:oq + lq], 0, 1)
        k, vv = (np.repeat(np.swapaxes(inputs[n][ok:ok + lk], 0, 1), group, axis=0) for n in ("K", "V"))
        out, l = reference.forward(q, k, vv, scale, causal=plan.causal)
        o[oq:oq + lq] = np.swapaxes(out, 0, 1)
        lse[oq:oq + lq] = np.swapaxes(l, 0, 1)
    return o, lse


def run_varlen(hbm: Hbm, scale: float) -> None:
    """flash/fast/fwd+varlen: block (query tile x, sequence b, head z) of the grid reads b's offsets; a tile inside its
    sequence loads its B_r query rows (those inside the packed tensor; the rows past the sequence are the next one's,
    computed and never stored), then each key tile it visits (every one of its sequence's, or up to its last row's
    last visible key when causal) as B_c rows of K and of V inside the packed tensor, of which the keys past the
    sequence are masked; the online softmax over them, O and lse stored for the tile's own rows."""
    p = hbm.plan
    v, t = p.varlen, p.tile
    group = p.heads // p.kv_heads
    hbm.alloc("O", (v.total_q, p.heads, p.d))
    hbm.alloc("lse", (v.total_q, p.heads))
    hbm.begin("main")
    for b, (oq, lq, ok, lk) in enumerate(v.sequences()):
        off = causal_offset(lq, lk, p.causal) if p.causal else 0
        for z in range(p.heads):
            for x in range(t["Tr"]):
                hbm.load("cu_seqlens_q", (slice(b, b + 2),))
                hbm.load("cu_seqlens_k", (slice(b, b + 2),))
                row0 = x * t["Br"]
                if row0 >= lq:
                    continue
                rows = min(t["Br"], lq - row0)
                keys = query_tile_keys(p, lq, lk, row0)
                out_rows = slice(oq + row0, oq + row0 + rows)
                if keys == 0:  # no visible key: O = 0, lse −inf
                    hbm.store("O", (out_rows, z, ALL), 0.0)
                    hbm.store("lse", (out_rows, z), -np.inf)
                    continue
                q = hbm.load("Q", (slice(oq + row0, min(oq + row0 + t["Br"], v.total_q)), z, ALL))[:rows]
                acc = np.zeros((rows, p.d))
                m = np.full(rows, -np.inf)
                l = np.zeros(rows)
                for k0 in range(0, keys, t["Bc"]):
                    tile = slice(ok + k0, min(ok + k0 + t["Bc"], v.total_k))
                    inside = min(t["Bc"], lk - k0)  # the sequence's keys of the tile
                    kt = hbm.load("K", (tile, z // group, ALL))[:inside]
                    vt = hbm.load("V", (tile, z // group, ALL))[:inside]
                    s = scale * (q @ kt.T)
                    if p.causal:
                        cols = k0 + np.arange(inside)
                        s = np.where(cols[None, :] <= row0 + np.arange(rows)[:, None] + off, s, -np.inf)
                    m_new = np.maximum(m, s.max(axis=1))
                    pt = np.exp(s - finite(m_new)[:, None])
                    corr = rescale(m, m_new)
                    l = l * corr + pt.sum(axis=1)
                    acc = acc * corr[:, None] + pt @ vt
                    m = m_new
                hbm.store("O", (out_rows, z, ALL), divide(acc, l))
                with np.errstate(divide="ignore"):
                    hbm.store("lse", (out_rows, z), np.where(l > 0, finite(m) + np.log(l), -np.inf))
