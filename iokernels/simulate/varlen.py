"""Variable-length batches in the simulator (iokernels.plan.varlen): packed inputs and their per-sequence float64
reference, and the tma forward's and backward's schedules on them, every load and store counted as flash_tma.cu and
flash_tma_bwd.cu built with VARLEN count them (a copy's rows inside the packed tensor, its sequence's offsets read by
every block of the grid)."""

from __future__ import annotations

import numpy as np

from ..plan import Plan
from ..plan.causal import causal_offset
from ..plan.units import round_to
from ..plan.varlen import key_block_queries, query_tile_keys
from . import reference
from .hbm import ALL, Hbm, divide, finite, rescale


def other_layout(plan: Plan, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` with their first two axes swapped where ``plan``'s tensors are head-major (``Varlen.head_major``:
    (heads, total, d) <-> the packed (total, heads, d) this module computes on; the offsets as they are), else as
    given. Its own inverse: the simulator and the references take and return the plan's layout through it."""
    if not plan.varlen.head_major:
        return arrays
    return {n: x if n.startswith("cu_seqlens") else np.ascontiguousarray(np.swapaxes(x, 0, 1))
            for n, x in arrays.items()}


def varlen_inputs(plan: Plan, rng: np.random.Generator, *, magnitude: float = 1.0, rounded: bool = False
                  ) -> dict[str, np.ndarray]:
    """Random packed Q (total_q, heads, d), K, V (total_k, kv_heads, d) and the offsets cu_seqlens_q, cu_seqlens_k
    ((B + 1,) int32) of ``plan``'s sequences; for a backward plan also O and lse (total_q, heads) from the reference on
    them and a random dO. (Head-major plans: the tensors as (heads, total, d), :func:`other_layout`.)"""
    v = plan.varlen

    def stored(x: np.ndarray) -> np.ndarray:
        return round_to(x, plan.dtype) if rounded else x

    cu_q, cu_k = v.cu_seqlens()
    inputs = {"Q": stored(magnitude * rng.standard_normal((v.total_q, plan.heads, plan.d))),
              "K": stored(magnitude * rng.standard_normal((v.total_k, plan.kv_heads, plan.d))),
              "V": stored(rng.standard_normal((v.total_k, plan.kv_heads, plan.d))),
              "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}
    if plan.direction == "bwd":
        o, lse = _reference(plan, inputs, None)
        inputs.update(O=stored(o), lse=lse, dO=stored(rng.standard_normal(o.shape)))
    return other_layout(plan, inputs)


def _sequence(plan: Plan, inputs: dict[str, np.ndarray], oq: int, lq: int, ok: int, lk: int
              ) -> tuple[np.ndarray, ...]:
    """One sequence's q (heads, L_q, d) and k, v with their K/V head repeated for each query head (heads, L_k, d)."""
    group = plan.heads // plan.kv_heads
    q = np.swapaxes(inputs["Q"][oq:oq + lq], 0, 1)
    k, v = (np.repeat(np.swapaxes(inputs[n][ok:ok + lk], 0, 1), group, axis=0) for n in ("K", "V"))
    return q, k, v


def varlen_reference(plan: Plan, inputs: dict[str, np.ndarray], scale: float | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """O (total_q, heads, d) and lse (total_q, heads): the naive float64 reference on each sequence alone (its
    queries against its keys, causal in the plan's alignment; a row that sees no key: O = 0, lse −inf). Head-major
    plans: inputs and outputs (heads, total, ...)."""
    out = other_layout(plan, dict(zip(("O", "lse"), _reference(plan, other_layout(plan, inputs), scale), strict=True)))
    return out["O"], out["lse"]


def _reference(plan: Plan, inputs: dict[str, np.ndarray], scale: float | None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`varlen_reference` on packed arrays."""
    v = plan.varlen
    o = np.zeros((v.total_q, plan.heads, plan.d))
    lse = np.full((v.total_q, plan.heads), -np.inf)
    for oq, lq, ok, lk in v.sequences():
        if lq == 0 or lk == 0:
            continue
        out, l = reference.forward(*_sequence(plan, inputs, oq, lq, ok, lk), scale, causal=plan.causal)
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


def varlen_reference_grads(plan: Plan, inputs: dict[str, np.ndarray], scale: float | None = None
                           ) -> dict[str, np.ndarray]:
    """dQ (total_q, heads, d), dK and dV (total_k, kv_heads, d): the float64 reference backward of each sequence alone
    (a K/V head's gradient the sum over the query heads that share it; a key no query sees: 0). Head-major plans:
    inputs and outputs (heads, total, d)."""
    inputs = other_layout(plan, inputs)
    v, group = plan.varlen, plan.heads // plan.kv_heads
    out = {"dQ": np.zeros((v.total_q, plan.heads, plan.d)), "dK": np.zeros((v.total_k, plan.kv_heads, plan.d)),
           "dV": np.zeros((v.total_k, plan.kv_heads, plan.d))}
    for oq, lq, ok, lk in v.sequences():
        if lq == 0 or lk == 0:
            continue
        q, k, vv = _sequence(plan, inputs, oq, lq, ok, lk)
        do = np.swapaxes(inputs["dO"][oq:oq + lq], 0, 1)
        dq, dk, dv = reference.backward(q, k, vv, do, scale, causal=plan.causal)
        dq, dk, dv = (np.nan_to_num(x) for x in (dq, dk, dv))  # (rows that see no key: 0)
        out["dQ"][oq:oq + lq] = np.swapaxes(dq, 0, 1)
        for name, x in (("dK", dk), ("dV", dv)):
            out[name][ok:ok + lk] = np.swapaxes(x.reshape(plan.kv_heads, group, lk, plan.d).sum(axis=1), 0, 1)
    return other_layout(plan, out)


def run_varlen_bwd(hbm: Hbm, scale: float) -> None:
    """flash/fast/bwd+varlen: ``prep`` D = rowsum(dO ∘ O) and dQacc = 0 over the packed rows; ``main``, block (key
    block x, sequence b, K/V head z) of the grid reads b's offsets; a key block inside its sequence that some query sees
    loads its B_c key rows of K and V inside the packed tensor, then for each query head of the group and each query
    block that sees it (flash_tma_bwd.cu's schedule) B_r rows of Q and dO inside the packed tensor (those past the
    sequence zeroed: they add nothing) and the block's lse and D inside the sequence, and adds τ dS K to dQacc (the
    reduce-add's 64-row boxes inside the packed tensor; the wide tiles' reductions, the rows inside the sequence);
    dK and dV of every key of the sequence are written (0 where no query sees it); ``dq`` dQ rounded from dQacc."""
    p = hbm.plan
    v, t = p.varlen, p.tile
    group, br, bc = p.heads // p.kv_heads, t["Br"], t["Bc"]
    wide = p.stage("main").kernel != "flash_tma_bwd"
    hbm.alloc("D", (v.total_q, p.heads))
    for name, rows, heads in (("dQacc", v.total_q, p.heads), ("dQ", v.total_q, p.heads), ("dK", v.total_k, p.kv_heads),
                              ("dV", v.total_k, p.kv_heads)):
        hbm.alloc(name, (rows, heads, p.d))
    hbm.begin("prep")
    hbm.store("D", (ALL, ALL), np.sum(hbm.load("dO", (ALL, ALL, ALL)) * hbm.load("O", (ALL, ALL, ALL)), axis=-1))
    hbm.store("dQacc", (ALL, ALL, ALL), 0.0)
    hbm.begin("main")
    for b, (oq, lq, ok, lk) in enumerate(v.sequences()):
        off = causal_offset(lq, lk, p.causal) if p.causal else 0
        for zk in range(p.kv_heads):
            for x in range(t["Tc"]):
                hbm.load("cu_seqlens_q", (slice(b, b + 2),))
                hbm.load("cu_seqlens_k", (slice(b, b + 2),))
                col0 = x * bc
                if col0 >= lk:
                    continue
                cols = min(bc, lk - col0)
                dk, dv = np.zeros((cols, p.d)), np.zeros((cols, p.d))
                queries = key_block_queries(p, lq, lk, col0)
                if queries:
                    keys = slice(ok + col0, min(ok + col0 + bc, v.total_k))
                    k = hbm.load("K", (keys, zk, ALL))[:cols]
                    vv = hbm.load("V", (keys, zk, ALL))[:cols]
                for z in range(zk * group, (zk + 1) * group) if queries else ():
                    for i in queries:
                        q0 = i * br
                        rows = min(br, lq - q0)
                        box = slice(oq + q0, min(oq + q0 + br, v.total_q))
                        q = hbm.load("Q", (box, z, ALL))[:rows]
                        do = hbm.load("dO", (box, z, ALL))[:rows]
                        own = slice(oq + q0, oq + q0 + rows)
                        lse = hbm.load("lse", (own, z))
                        dd = hbm.load("D", (own, z))
                        visible = np.ones((rows, cols), dtype=bool)
                        if p.causal:
                            visible = col0 + np.arange(cols)[None, :] <= q0 + np.arange(rows)[:, None] + off
                        with np.errstate(over="ignore", invalid="ignore"):
                            pt = np.where(visible, np.exp(scale * (q @ k.T) - lse[:, None]), 0.0)
                        dv += pt.T @ do
                        ds = pt * (do @ vv.T - dd[:, None])
                        dk += ds.T @ q
                        dq = scale * (ds @ k)
                        if wide:
                            hbm.atomic_add("dQacc", (own, z, ALL), dq)
                        else:  # the boxes of 64 rows inside the packed tensor (rows past the sequence add 0)
                            for r in range(0, br, 64):
                                target = slice(oq + q0 + r, min(oq + q0 + r + 64, v.total_q))
                                n = max(0, target.stop - target.start)
                                if n:
                                    add = np.zeros((n, p.d))
                                    inside = max(0, min(n, rows - r))
                                    add[:inside] = dq[r:r + inside]
                                    hbm.atomic_add("dQacc", (target, z, ALL), add)
                out = slice(ok + col0, ok + col0 + cols)
                hbm.store("dK", (out, zk, ALL), scale * dk)
                hbm.store("dV", (out, zk, ALL), dv)
    hbm.begin("dq")
    hbm.store("dQ", (ALL, ALL, ALL), hbm.load("dQacc", (ALL, ALL, ALL)))
