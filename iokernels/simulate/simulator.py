"""CPU simulator: each plan executed tile by tile in numpy, in the order the kernels run it.

It is the executable specification of every schedule. Arithmetic is float64 (so outputs match the
reference to ~1e-13), while bytes are counted at the plan's storage dtypes, by DESIGN.md's rules:
every :meth:`Hbm.load`/:meth:`Hbm.store` counts the elements it actually moves, re-reads included;
ragged edge tiles count only their in-range elements; an atomic add counts a read and a write.
Thread blocks that run side by side on the GPU are independent, so the simulator may process
rows of independent blocks together (row-wise stages) and always vectorizes over batch*heads. The counted memory
and the shared tile helpers are :mod:`.hbm`; the split-KV decode's schedule is :mod:`.decode`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..plan import Plan, key_block_ranges
from ..plan.fast import item_list, list_readers, listed
from ..plan.mods import captures_of, host_captures
from ..plan.tensors import DIMS, OUTPUTS, TENSORS
from . import reference
from .decode import run_decode
from .hbm import ALL, KV_TENSORS, Hbm, blocks, divide, finite, rescale, transpose
from .mods import tile_mods
from .reference import capped
from .varlen import other_layout, run_varlen, run_varlen_bwd

# ---------------------------------------------------------------------------------------------
# the causal mask and the sliding window (iokernels.plan.causal): Plan.visible

def _visible(plan: Plan, rs: slice, cs: slice) -> np.ndarray | None:
    """Boolean (rows, cols) of the block: True where visible; None without a mask."""
    return plan.visible(np.arange(rs.start, rs.stop), np.arange(cs.start, cs.stop))


def _masked(s: np.ndarray, visible: np.ndarray | None) -> np.ndarray:
    return s if visible is None else np.where(visible, s, -np.inf)


def _pair_visible(plan: Plan, rs: slice, cs: slice) -> bool:
    """Whether any element of the (query block, key block) pair is visible (causal: its last row sees most)."""
    if plan.positional:
        return bool(_visible(plan, rs, cs).any())
    return not plan.causal or cs.start <= rs.stop - 1 + plan.causal_offset


def _key_block_used(plan: Plan, cs: slice) -> bool:
    """Whether any query sees a key of this block (the last query sees the most)."""
    return _pair_visible(plan, slice(0, plan.N_q), cs)


def _kept(hbm: Hbm, rs: slice, cs: slice) -> bool:
    """Block-sparse plans (iokernels.plan.masks): the kernel reads the pair's block-mask byte, for every
    batch·head, and skips the pair when it is 0. True without a block mask (nothing read)."""
    p = hbm.plan
    if p.block_mask is None:
        return True
    t = p.tile
    return bool(hbm.load("block_mask", (ALL, rs.start // t["Br"], cs.start // t["Bc"])).all())


def _slopes(hbm: Hbm) -> np.ndarray | None:
    """ALiBi plans: the slopes of every batch·head, read (a float each) by a block before its work; None without."""
    return None if hbm.plan.alibi is None else hbm.load("alibi", (ALL,))


def _bias(p: Plan, slopes: np.ndarray | None, rs: slice, cs: slice) -> np.ndarray | float:
    """ALiBi's bias of the pair (reference.alibi_bias), (BH, rows, cols); 0 without slopes."""
    if slopes is None:
        return 0.0
    return reference.alibi_bias(slopes, p.N_q, p.N_k, np.arange(rs.start, rs.stop), np.arange(cs.start, cs.stop))


def _explicit(hbm: Hbm, rs: slice, cs: slice, x: np.ndarray) -> np.ndarray:
    """Explicit masks (iokernels.plan.masks.ExplicitMask): x (scores of the pair, any offset already taken)
    with the pair's mask elements applied: read once per batch·head (a shared mask too), boolean 0 → −inf,
    additive: x + mask (−inf hides, whatever x is). x unchanged and nothing read without a mask."""
    if hbm.plan.mask is None:
        return x
    m = hbm.load("mask", (ALL, rs, cs))
    if hbm.plan.mask.kind == "bool":
        return np.where(m != 0, x, -np.inf)
    with np.errstate(invalid="ignore"):
        return np.where(np.isneginf(m), -np.inf, x + m)


def _dropout_tile(plan: Plan, rs: slice, cs: slice) -> np.ndarray | float:
    """Z of the (query block, key block) pair for every batch·head, (BH, rows, cols) (iokernels.plan.dropout: the
    tiled kernels regenerate it from the seed, nothing read); 1.0 without dropout."""
    if plan.dropout is None:
        return 1.0
    return plan.dropout.multiplier(ALL, rs, cs, (plan.bh, plan.N_q, plan.N_k))


# ---------------------------------------------------------------------------------------------
# standard attention (paper Algorithms 0 and 3)

def _gemm(hbm: Hbm, a: str, b: str, c: str, m: int, n: int, k: int, alpha: float = 1.0,
          a_t: bool = False, b_t: bool = False, causal: bool = False, mask: bool = False,
          a_dropout: np.ndarray | None = None) -> None:
    """C = alpha * A B, A (m x k), B (k x n); ``a_t``/``b_t``: the operand is stored transposed;
    ``causal``: C = −inf where the plan's mask hides (row, column) (S = τQKᵀ); ``mask``: the plan's explicit
    mask applied to each stored tile of C, its elements read there (once per batch·head); ``a_dropout``: Z of
    A as stored (the dropped P: (BH, N_q, N_k)), multiplying each k-slice of A once loaded (never stored)."""
    tile = hbm.plan.tile
    for ms in blocks(m, tile["BM"]):
        for ns in blocks(n, tile["BN"]):
            acc = 0.0
            for ks in blocks(k, tile["BK"]):
                rows, cols = (ks, ms) if a_t else (ms, ks)  # the A slice as stored
                at = hbm.load(a, (ALL, rows, cols))
                if a_dropout is not None:
                    at = at * a_dropout[:, rows, cols]
                at = transpose(at) if a_t else at
                bt = transpose(hbm.load(b, (ALL, ns, ks))) if b_t else hbm.load(b, (ALL, ks, ns))
                acc = acc + at @ bt
            out = _masked(alpha * acc, _visible(hbm.plan, ms, ns) if causal else None)
            hbm.store(c, (ALL, ms, ns), _explicit(hbm, ms, ns, out) if mask else out)


def _standard_fwd(hbm: Hbm, scale: float) -> None:
    p = hbm.plan
    mat, vec = (ALL, ALL, ALL), (ALL, ALL)
    # causal, explicit mask: S = −inf where masked, so P = 0 there (rows with no visible key: l = 0, P = 0);
    # the explicit mask is read by the qk product's epilogue, every element of S once per batch·head
    hbm.begin("qk")
    _gemm(hbm, "Q", "K", "S", p.N_q, p.N_k, p.d, scale, b_t=True, causal=bool(p.causal) or p.positional,
          mask=p.mask is not None)
    hbm.begin("rowmax")
    hbm.store("m", vec, hbm.load("S", mat).max(axis=-1))
    hbm.begin("rowsum")
    m = finite(hbm.load("m", vec))[..., None]
    hbm.store("l", vec, np.exp(hbm.load("S", mat) - m).sum(axis=-1))
    hbm.begin("normalize")
    m, l = finite(hbm.load("m", vec))[..., None], hbm.load("l", vec)
    hbm.store("P", mat, divide(np.exp(hbm.load("S", mat) - m), l))
    hbm.begin("pv")  # dropout: O = (Z ∘ P) V, P stays the undropped softmax
    _gemm(hbm, "P", "V", "O", p.N_q, p.d, p.N_k, a_dropout=reference_dropout(p))


def _standard_bwd(hbm: Hbm, scale: float) -> None:
    p = hbm.plan
    mat, vec = (ALL, ALL, ALL), (ALL, ALL)
    # dropout: dV = (Z ∘ P)ᵀ dO; dP is stored raw (dO Vᵀ), rowdot and ds apply Z to it:
    # D = rowsum(P ∘ Z ∘ dP), dS = P ∘ (Z ∘ dP − D)
    z = reference_dropout(p)
    zp = 1.0 if z is None else z
    hbm.begin("dv")
    _gemm(hbm, "P", "dO", "dV", p.N_k, p.d, p.N_q, a_t=True, a_dropout=z)
    hbm.begin("dp")
    _gemm(hbm, "dO", "V", "dP", p.N_q, p.N_k, p.d, b_t=True)
    hbm.begin("rowdot")
    hbm.store("D", vec, (hbm.load("P", mat) * (zp * hbm.load("dP", mat))).sum(axis=-1))
    hbm.begin("ds")
    prob, dp, dd = hbm.load("P", mat), zp * hbm.load("dP", mat), hbm.load("D", vec)
    hbm.store("dS", mat, prob * (dp - dd[..., None]))
    hbm.begin("dq")
    _gemm(hbm, "dS", "K", "dQ", p.N_q, p.d, p.N_k, scale)
    hbm.begin("dk")
    _gemm(hbm, "dS", "Q", "dK", p.N_k, p.d, p.N_q, scale, a_t=True)


# ---------------------------------------------------------------------------------------------
# online softmax, two passes (Milakov & Gimelshein)

def _two_pass(hbm: Hbm, scale: float) -> None:
    p = hbm.plan
    store = p.schedule == "store"
    t = p.tile
    cols = blocks(p.N_k, t["Bc"])
    # causal, window: key blocks outside a query block's visible range are skipped; block-sparse: the pairs the
    # block mask zeroes. Q_i (pass 2: m_i, l_i) is loaded at the block's first computed pair; a block
    # with none loads nothing (m = −inf, l = 0, O = 0)
    visible = key_block_ranges(p.N_q, p.N_k, t["Br"], t["Bc"], p.causal, p.window, p.documents)
    hbm.begin("stats")
    for rs, (a, b) in zip(blocks(p.N_q, t["Br"]), visible, strict=True):
        q = None
        m = np.full((p.bh, rs.stop - rs.start), -np.inf)
        l = np.zeros(m.shape)
        for cs in cols[a:b]:
            if not _kept(hbm, rs, cs):
                continue
            if q is None:
                q = hbm.load("Q", (ALL, rs, ALL))  # resident for the rest of the sweep over K
            s = _masked(scale * (q @ transpose(hbm.load("K", (ALL, cs, ALL)))), _visible(p, rs, cs))
            if store:
                hbm.store("S", (ALL, rs, cs), s)
            m_new = np.maximum(m, s.max(axis=-1))
            l = l * rescale(m, m_new) + np.exp(s - finite(m_new)[..., None]).sum(axis=-1)
            m = m_new
        hbm.store("m", (ALL, rs), m)
        hbm.store("l", (ALL, rs), l)
    hbm.begin("output")
    for rs, (a, b) in zip(blocks(p.N_q, t["Br"]), visible, strict=True):
        m = l = q = None
        acc = np.zeros((p.bh, rs.stop - rs.start, p.d))
        for cs in cols[a:b]:
            if not _kept(hbm, rs, cs):
                continue
            if m is None:
                m, l = finite(hbm.load("m", (ALL, rs)))[..., None], hbm.load("l", (ALL, rs))
                q = None if store else hbm.load("Q", (ALL, rs, ALL))
            if store:
                s = hbm.load("S", (ALL, rs, cs))
            else:
                s = _masked(scale * (q @ transpose(hbm.load("K", (ALL, cs, ALL)))), _visible(p, rs, cs))
            # dropout: O = (Z ∘ P) V, the statistics m, l of pass 1 are those of the undropped P
            acc = acc + (_dropout_tile(p, rs, cs) * np.exp(s - m)) @ hbm.load("V", (ALL, cs, ALL))
        hbm.store("O", (ALL, rs, ALL), 0.0 if l is None else divide(acc, l))


# ---------------------------------------------------------------------------------------------
# FlashAttention forward: Algorithm 1 (kv_outer) and the FlashAttention-2 order (q_outer)

def _flash_kv_outer(hbm: Hbm, scale: float) -> None:
    p = hbm.plan
    t = p.tile
    hbm.begin("init")
    hbm.store("m", (ALL, ALL), -np.inf)
    hbm.store("l", (ALL, ALL), 0.0)
    hbm.store("Oacc", (ALL, ALL, ALL), 0.0)
    hbm.begin("main")
    for cs in blocks(p.N_k, t["Bc"]):
        if not _key_block_used(p, cs):
            if p.positional:
                continue  # a window or documents: no query sees this key block (a later one may be seen)
            break  # causal: no query sees this key block, nor the later ones
        k = v = None
        for rs in blocks(p.N_q, t["Br"]):
            if not _pair_visible(p, rs, cs) or not _kept(hbm, rs, cs):
                continue  # causal: every element of the pair is masked; block-sparse: a zero block
            if k is None:  # K_j, V_j at the key block's first computed pair
                k, v = hbm.load("K", (ALL, cs, ALL)), hbm.load("V", (ALL, cs, ALL))
            q, o = hbm.load("Q", (ALL, rs, ALL)), hbm.load("Oacc", (ALL, rs, ALL))
            l, m = hbm.load("l", (ALL, rs)), hbm.load("m", (ALL, rs))
            s = _masked(scale * (q @ transpose(k)), _visible(p, rs, cs))
            m_tile = s.max(axis=-1)
            empty = np.isneginf(m_tile)  # rows that see no key of this block keep m, l, O
            p_tile = np.exp(s - finite(m_tile)[..., None])
            l_tile = p_tile.sum(axis=-1)
            m_new = np.maximum(m, m_tile)
            a = np.where(empty, 1.0, rescale(m, m_new))
            b = np.where(empty, 0.0, np.exp(finite(m_tile) - finite(m_new)))
            l_new = a * l + b * l_tile
            l_div = np.where(empty, 1.0, l_new)
            alpha = np.where(empty, 1.0, l * a / l_div)
            # dropout: l sums the undropped P̃, O accumulates (Z ∘ P̃) V_j
            o = alpha[..., None] * o + (b / l_div)[..., None] * ((_dropout_tile(p, rs, cs) * p_tile) @ v)
            hbm.store("Oacc", (ALL, rs, ALL), o)
            hbm.store("l", (ALL, rs), l_new)
            hbm.store("m", (ALL, rs), m_new)
    hbm.begin("finalize")
    hbm.store("O", (ALL, ALL, ALL), hbm.load("Oacc", (ALL, ALL, ALL)))


def kv_rows(plan: Plan) -> slice | np.ndarray:
    """The K/V row of each query row (batch * heads): all of them, or with grouped-query attention
    query head z's K/V head z // (heads / kv_heads)."""
    if plan.kv_heads == plan.heads:
        return ALL
    return np.arange(plan.bh) // (plan.heads // plan.kv_heads)


def item_list_counts(plan: Plan) -> tuple[int, int]:
    """The (read, written) bytes of ``plan``'s list of items (tensor ``work``) by the simulator's walk of it, for
    the whole grid: compare's one batch-head runs (analysis/compare.py) take these in place of a batch-head's times
    batch·heads, since the grid's blocks and the list do not scale with the batch-heads."""
    hbm = Hbm(plan)
    hbm.begin("main")
    _item_list_reads(hbm)
    read, written = hbm.counts["main"]["work"]
    return read, written


def _item_list_reads(hbm: Hbm) -> None:
    """A causal tma plan's persistent grid (ITEM_LIST): each block's thread 0 reads its two offsets into the list, and
    each of its entries is read list_readers times (the warps that walk it)."""
    p = hbm.plan
    work = item_list(p)
    hbm.put("work", work)
    blocks, readers = p.stage("main").grid[0], list_readers(p)
    for b in range(blocks):
        first, last = (int(x) for x in hbm.load("work", slice(b, b + 2)))
        for _ in range(readers):
            hbm.load("work", slice(blocks + 1 + first, blocks + 1 + last))


def _flash_q_outer(hbm: Hbm, scale: float) -> None:
    p = hbm.plan
    t = p.tile
    kv = kv_rows(p)  # a K/V tile is read once per query head that uses it
    cols = blocks(p.N_k, t["Bc"])
    visible = key_block_ranges(p.N_q, p.N_k, t["Br"], t["Bc"], p.causal, p.window, p.documents)
    hbm.begin("main")
    if listed(p):
        _item_list_reads(hbm)
    for rs, (a, b) in zip(blocks(p.N_q, t["Br"]), visible, strict=True):
        # a block with no computed pair (causal, block-sparse) loads nothing: O = 0, lse = −inf
        slopes = _slopes(hbm)  # (ALiBi: every block reads its head's slope first)
        q = None
        acc = np.zeros((p.bh, rs.stop - rs.start, p.d))
        m = np.full(acc.shape[:-1], -np.inf)
        l = np.zeros(m.shape)
        for cs in cols[a:b]:
            if not _kept(hbm, rs, cs):
                continue
            if q is None:  # resident from the first computed pair on; O accumulates on chip, written once
                q = hbm.load("Q", (ALL, rs, ALL))
            logits = capped(scale * (q @ transpose(hbm.load("K", (kv, cs, ALL)))), p.softcap) + _bias(p, slopes, rs, cs)
            if p.mods is not None:  # a programmable variant (iokernels.plan.mods), on the pair's elements
                logits = tile_mods(hbm, hbm.captures, rs, cs, logits)[0]
            s = _explicit(hbm, rs, cs, _masked(logits, _visible(p, rs, cs)))
            m_new = np.maximum(m, s.max(axis=-1))
            prob = np.exp(s - finite(m_new)[..., None])
            alpha = rescale(m, m_new)
            l = alpha * l + prob.sum(axis=-1)
            # dropout: l sums the undropped P, O accumulates (Z ∘ P) V_j
            acc = alpha[..., None] * acc + (_dropout_tile(p, rs, cs) * prob) @ hbm.load("V", (kv, cs, ALL))
            m = m_new
        hbm.store("O", (ALL, rs, ALL), divide(acc, l))
        with np.errstate(divide="ignore"):
            hbm.store("lse", (ALL, rs), np.where(l > 0, finite(m) + np.log(l), -np.inf))


# ---------------------------------------------------------------------------------------------
# FlashAttention backward (Algorithm 4 in the FlashAttention-2 arrangement)

def _kv_outer_grads(hbm: Hbm, scale: float, stage: str, *, dq_atomics: bool) -> None:
    """The K/V-outer backward stage: dK_j, dV_j on chip, written once; Q_i, dO_i, lse_i, D_i read once
    per K/V block; with ``dq_atomics`` also dS_i K_j added into dQacc (read + write). Grouped-query
    attention (flash/fast): a K/V head's block loops over the query heads that share it, so K_j, V_j
    are read and dK_j, dV_j written once per K/V head, summed over its query heads."""
    p = hbm.plan
    t = p.tile
    group = p.heads // p.kv_heads

    def grouped(x: np.ndarray) -> np.ndarray:  # query rows (BH, ...) -> (BH_kv, group, ...)
        return x.reshape(p.bh_kv, group, *x.shape[1:])

    hbm.begin(stage)
    if listed(p):
        _item_list_reads(hbm)
    for cs in blocks(p.N_k, t["Bc"]):
        slopes = _slopes(hbm)  # (ALiBi: every block reads its query heads' slopes first)
        if not _key_block_used(p, cs):  # causal: no query sees these keys: dK_j = dV_j = 0, nothing loaded
            hbm.store("dK", (ALL, cs, ALL), 0.0)
            hbm.store("dV", (ALL, cs, ALL), 0.0)
            continue
        k = v = None
        dk = np.zeros((p.bh_kv, 1, cs.stop - cs.start, p.d))
        dv = np.zeros(dk.shape)
        for rs in blocks(p.N_q, t["Br"]):
            if not _pair_visible(p, rs, cs) or not _kept(hbm, rs, cs):
                continue  # causal: every element of the pair is masked; block-sparse: a zero block
            if k is None:  # K_j, V_j at the key block's first computed pair
                k, v = hbm.load("K", (ALL, cs, ALL))[:, None], hbm.load("V", (ALL, cs, ALL))[:, None]
            q, do = grouped(hbm.load("Q", (ALL, rs, ALL))), grouped(hbm.load("dO", (ALL, rs, ALL)))
            lse, dd = grouped(hbm.load("lse", (ALL, rs))), grouped(hbm.load("D", (ALL, rs)))
            # P = 0 where masked (rows with no visible key have lse = −inf: masked everywhere)
            raw = (scale * (q @ transpose(k))).reshape(p.bh, *q.shape[2:-1], -1)
            logits, grad = capped(raw, p.softcap) + _bias(p, slopes, rs, cs), 1.0
            if p.mods is not None:  # a programmable variant (iokernels.plan.mods): dS times d score_mod / d score
                logits, grad = tile_mods(hbm, hbm.captures, rs, cs, logits)
            with np.errstate(invalid="ignore"):  # a row with lse = −inf is masked everywhere
                x = grouped(_explicit(hbm, rs, cs, logits))
                prob = np.exp(_masked(np.where(np.isneginf(x), -np.inf, x - lse[..., None]), _visible(p, rs, cs)))
            # dropout (Z of the query heads): dV += (Z ∘ P)ᵀ dO, dS = P ∘ (Z ∘ dO Vᵀ − D)
            z = _dropout_tile(p, rs, cs)
            z = grouped(z) if p.dropout is not None else z
            dv += (transpose(z * prob) @ do).sum(axis=1, keepdims=True)
            ds = prob * (z * (do @ transpose(v)) - dd[..., None])
            if p.softcap is not None:  # through the softcap: 1 − tanh²
                ds = ds * grouped(1.0 - np.tanh(raw / p.softcap) ** 2)
            if p.mods is not None:
                ds = ds * grouped(grad)
            if dq_atomics:
                hbm.atomic_add("dQacc", (ALL, rs, ALL), (scale * (ds @ k)).reshape(p.bh, -1, p.d))
            dk += scale * (transpose(ds) @ q).sum(axis=1, keepdims=True)
        hbm.store("dK", (ALL, cs, ALL), dk[:, 0])
        hbm.store("dV", (ALL, cs, ALL), dv[:, 0])


def _flash_bwd(hbm: Hbm, scale: float) -> None:
    rows = (ALL, ALL, ALL)
    hbm.begin("prep")
    hbm.store("D", (ALL, ALL), (hbm.load("dO", rows) * hbm.load("O", rows)).sum(axis=-1))
    hbm.store("dQacc", rows, 0.0)
    _kv_outer_grads(hbm, scale, "main", dq_atomics=True)
    hbm.begin("dq")
    hbm.store("dQ", rows, hbm.load("dQacc", rows))


def _flash_bwd_deterministic(hbm: Hbm, scale: float) -> None:
    """flash/fast/bwd+deterministic: a query-outer dQ stage (D_i computed there and written), then the
    K/V-outer dK, dV stage; no atomics."""
    p = hbm.plan
    t = p.tile
    hbm.begin("dq")
    for rs in blocks(p.N_q, t["Br"]):
        q, do, o = (hbm.load(name, (ALL, rs, ALL)) for name in ("Q", "dO", "O"))
        lse = hbm.load("lse", (ALL, rs))
        dd = (do * o).sum(axis=-1)
        hbm.store("D", (ALL, rs), dd)
        dq = np.zeros(q.shape)
        for cs in blocks(p.N_k, t["Bc"]):  # the kernel's own key steps move the same bytes
            k, v = hbm.load("K", (ALL, cs, ALL)), hbm.load("V", (ALL, cs, ALL))
            prob = np.exp(scale * (q @ transpose(k)) - lse[..., None])
            dq += scale * ((prob * (do @ transpose(v) - dd[..., None])) @ k)
        hbm.store("dQ", (ALL, rs, ALL), dq)
    _kv_outer_grads(hbm, scale, "dkdv", dq_atomics=False)


_RUNNERS: dict[tuple[str, ...], Callable[[Hbm, float], None]] = {
    ("standard", "default", "fwd"): _standard_fwd,
    ("standard", "default", "bwd"): _standard_bwd,
    ("two_pass", "store", "fwd"): _two_pass,
    ("two_pass", "recompute", "fwd"): _two_pass,
    ("flash", "kv_outer", "fwd"): _flash_kv_outer,
    ("flash", "q_outer", "fwd"): _flash_q_outer,
    ("flash", "fast", "fwd"): _flash_q_outer,
    ("flash", "kv_outer", "bwd"): _flash_bwd,
    ("flash", "fast", "bwd"): _flash_bwd,  # the research backward's schedule with the kernel's tiles
    ("flash", "fast", "bwd", "deterministic"): _flash_bwd_deterministic,  # Plan.variant
    ("flash", "fast", "fwd", "split"): run_decode,
    ("flash", "fast", "fwd", "packed"): run_decode,
}



@dataclass(frozen=True)
class SimResult:
    plan: Plan
    outputs: dict[str, np.ndarray]  # shape (batch*heads, N, d)
    counts: dict[str, dict[str, tuple[int, int]]]  # stage -> tensor -> (read, written) bytes


def reference_dropout(plan: Plan) -> np.ndarray | None:
    """The dropout multipliers Z that :mod:`.reference` takes for ``plan`` ((BH, N_q, N_k)); None without."""
    return None if plan.dropout is None else plan.dropout.full_multiplier(plan.bh, plan.N_q, plan.N_k)


def simulate(plan: Plan, inputs: dict[str, np.ndarray], scale: float | None = None) -> SimResult:
    """Run ``plan`` on ``inputs`` (from :func:`make_inputs`), counting every HBM access."""
    scale = reference.default_scale(plan.d) if scale is None else scale
    hbm = Hbm(plan)
    if plan.varlen is not None:  # computed on packed arrays (head-major ones swapped in and out, simulate/varlen.py)
        inputs = other_layout(plan, inputs)
    for name, array in inputs.items():
        hbm.put(name, array)
    if plan.mask is not None:  # read by every batch·head, shared or not: a row per batch·head to count
        hbm.put("mask", np.broadcast_to(inputs["mask"], (plan.bh, plan.N_q, plan.N_k)))
    if plan.mods is not None:  # a programmable variant's captured arrays, as given (their types matter)
        hbm.captures = host_captures(plan.mods, captures_of(plan.mods, inputs))
    if plan.alibi is not None:  # part of the plan: a slope per batch·head
        hbm.put("alibi", np.asarray(plan.alibi, dtype=np.float64))
    if plan.block_mask is not None:  # part of the plan, in HBM like an input; one copy per batch·head read (the
        # backward's blocks own a K/V head's key block: per K/V head)
        rows = plan.bh_kv if plan.direction == "bwd" else plan.bh
        hbm.put("block_mask", np.broadcast_to(plan.block_grid(), (rows, *plan.block_grid().shape)))
    if plan.varlen is not None:  # packed tensors of their own shapes (simulate/varlen.py)
        (run_varlen if plan.direction == "fwd" else run_varlen_bwd)(hbm, scale)
    else:
        extent = {"q": plan.N_q, "k": plan.N_k, "d": plan.d}
        for name, dims in DIMS.items():
            if name not in hbm.arrays:
                hbm.alloc(name, (plan.bh_kv if name in KV_TENSORS else plan.bh, *(extent[x] for x in dims)))
        key = (plan.algorithm, plan.schedule, plan.direction) + ((plan.variant,) if plan.variant else ())
        _RUNNERS[key](hbm, scale)
    counts = {stage: {t: (rw[0], rw[1]) for t, rw in sorted(c.items(), key=lambda kv: TENSORS.index(kv[0]))}
              for stage, c in hbm.counts.items()}
    outputs = {n: hbm.arrays[n] for n in OUTPUTS[plan.direction]}
    return SimResult(plan, other_layout(plan, outputs) if plan.varlen is not None else outputs, counts)
