"""The split-KV decode in the simulator (iokernels.plan.decode, plan.kvcache): packed query rows, the splits and their
log-sum-exp combine, a cache of per-sequence lengths (contiguous or paged, the append first, the causal mask on packed
rows), every load and store counted as the kernels count them (flash_tma.cu with SPLIT, combine.cu, kvcache.cu)."""

from __future__ import annotations

import numpy as np

from ..plan.units import cdiv
from .hbm import ALL, Hbm, blocks, divide, finite, rescale, transpose


def run_decode(hbm: Hbm, scale: float) -> None:
    """flash/fast/fwd+split and +packed (iokernels.plan.decode): the g query heads of a K/V head and their N_q rows
    as one packed sequence of g·N_q rows (query head z·g + h, row i: packed row h·N_q + i of K/V head z), in tiles
    of B_r rows; each split of the key tiles runs the online softmax of every tile over its keys and, with more
    than one split, writes the tile's normalized partial O and lse (float32), which the combine merges by their
    log-sum-exp; one split writes O and lse itself. With a cache of per-sequence lengths (Plan.kv_cache) every block
    reads its sequence's length first, a split past the sequence's end does nothing, a contiguous cache's last tile
    loads its rows up to the capacity, a paged one its boxes of min(page, B_c) rows from the pages the page table
    names (an entry per box, for K and again for V), and the combine reads each row's length; a sequence with no key
    gives O = 0 and lse −inf."""
    p = hbm.plan
    t, cache = p.tile, p.kv_cache
    rows, g_kv = p.heads // p.kv_heads * p.N_q, p.kv_heads
    split = p.variant == "split"
    for name, width in (("Q", (p.d,)), ("O", (p.d,)), ("lse", ())):  # the packed views (same memory)
        hbm.arrays[name] = hbm.arrays[name].reshape(p.bh_kv, rows, *width)
    lengths = (p.N_k,) * p.batch if cache is None else cache.lengths
    if split:
        hbm.alloc("Opart", (t["S"], p.bh_kv, rows, p.d))
        hbm.alloc("lse_part", (t["S"], p.bh_kv, rows))
    if cache is not None:  # a block reads its sequence's length: one copy per K/V head (and per page-table row)
        hbm.arrays["seqlens"] = np.repeat(hbm.arrays["seqlens"], g_kv)
        if cache.paged:
            hbm.arrays["page_table"] = np.repeat(hbm.arrays["page_table"], g_kv, axis=0)
    chunk = cdiv(t["Tc"], t["S"])
    if cache is not None and cache.append:  # the new keys and values first, after each sequence's keys
        hbm.begin("append")
        for b, n in enumerate(lengths):
            for r in range(cache.append):
                append_row(hbm, b, n + r, r)
        lengths = tuple(cache.keys(n) for n in lengths)
    hbm.begin("main")
    for b, n in enumerate(lengths):
        heads = slice(b * g_kv, (b + 1) * g_kv)
        tiles = cdiv(n, t["Bc"])
        for rs in blocks(rows, t["Br"]):
            for si in range(t["S"]):
                if cache is not None:
                    hbm.load("seqlens", (heads,))
                a, z = si * chunk, min(si * chunk + chunk, tiles)
                if a >= z:
                    if not split and cache is not None:  # (one split: the sequence has no key)
                        hbm.store("O", (heads, rs, ALL), 0.0)
                        hbm.store("lse", (heads, rs), -np.inf)
                    continue  # an empty split: the combine leaves it out
                q = hbm.load("Q", (heads, rs, ALL))
                acc = np.zeros(q.shape)
                m = np.full(q.shape[:-1], -np.inf)
                l = np.zeros(m.shape)
                # causal (bottom-right): packed row r is query r % N_q, which sees the keys up to n − N_q + r % N_q
                last = n - p.N_q + np.arange(rs.start, rs.stop) % p.N_q if p.causal else None
                for j in range(a, z):
                    key0 = j * t["Bc"]
                    k, v = (cache_tile(hbm, name, b, heads, key0) for name in ("K", "V"))
                    valid = min(t["Bc"], n - key0)  # the rows past the sequence's end are loaded, never used
                    s = scale * (q @ transpose(k[:, :valid]))
                    if last is not None:
                        s = np.where(key0 + np.arange(valid)[None, :] <= last[:, None], s, -np.inf)
                    m_new = np.maximum(m, s.max(axis=-1))
                    prob = np.exp(s - finite(m_new)[..., None])
                    alpha = rescale(m, m_new)
                    l = alpha * l + prob.sum(axis=-1)
                    acc = alpha[..., None] * acc + prob @ v[:, :valid]
                    m = m_new
                out, lse = ("Opart", "lse_part") if split else ("O", "lse")
                index = (si,) if split else ()
                hbm.store(out, (*index, heads, rs, ALL), divide(acc, l))  # (a row that saw no key here: 0, −inf)
                lse_rows = np.where(l > 0, finite(m) + np.log(np.where(l > 0, l, 1)), -np.inf)
                hbm.store(lse, (*index, heads, rs), lse_rows)
    if split:
        hbm.begin("combine")
        per_seq = p.heads * p.N_q  # output rows of a sequence
        for b, n in enumerate(lengths):
            heads = slice(b * g_kv, (b + 1) * g_kv)
            if cache is not None:  # each row's length, by the warp that combines it
                hbm.load("seqlens", (np.full(per_seq, b * g_kv),))
            used = cdiv(cdiv(n, t["Bc"]), chunk)
            if used == 0:
                hbm.store("O", (heads, ALL, ALL), 0.0)
                hbm.store("lse", (heads, ALL), -np.inf)
                continue
            lse_part = hbm.load("lse_part", (slice(0, used), heads, ALL))
            o_part = hbm.load("Opart", (slice(0, used), heads, ALL, ALL))
            top = finite(lse_part.max(axis=0))  # (a row that saw no key in any split: O = 0, lse −inf)
            total = np.exp(lse_part - top).sum(axis=0)
            lse = np.where(total > 0, top + np.log(np.where(total > 0, total, 1)), -np.inf)
            weight = np.exp(lse_part - finite(lse))
            hbm.store("O", (heads, ALL, ALL), np.where(total[..., None] > 0, (weight[..., None] * o_part).sum(axis=0),
                                                       0.0))
            hbm.store("lse", (heads, ALL), lse)
    for name, width in (("Q", (p.d,)), ("O", (p.d,)), ("lse", ())):
        hbm.arrays[name] = hbm.arrays[name].reshape(p.bh, p.N_q, *width)


def append_row(hbm: Hbm, b: int, position: int, r: int) -> None:
    """New row r of sequence b's K/V heads (Knew, Vnew) into its cache at ``position``: each head's warp reads the
    sequence's length and (paged) the page's entry once, and copies the row of K and of V."""
    p, cache = hbm.plan, hbm.plan.kv_cache
    for j in range(b * p.kv_heads, (b + 1) * p.kv_heads):  # (one head at a time: stores need plain indices)
        hbm.load("seqlens", (j,))
        if cache.paged:
            page = int(hbm.load("page_table", (j, position // cache.page_size)))
            row = (page * p.kv_heads + j % p.kv_heads, position % cache.page_size)
        else:
            row = (j, position)
        for new, name in (("Knew", "K"), ("Vnew", "V")):
            hbm.store(name, (*row, ALL), hbm.load(new, (j, r, ALL)))


def cache_tile(hbm: Hbm, name: str, b: int, heads: slice, key0: int) -> np.ndarray:
    """Key tile [key0, key0 + B_c) of sequence b's K/V heads ``heads`` as its copies load it: from a contiguous cache
    (rows up to the capacity), or box by box (min(page, B_c) rows) from the pages its page-table entries name
    (boxes past the sequence's end not loaded: zeros). (heads, B_c, d)."""
    p = hbm.plan
    bc, cache = p.tile["Bc"], p.kv_cache
    if cache is None or not cache.paged:
        tile = hbm.load(name, (heads, slice(key0, min(key0 + bc, p.N_k)), ALL))
        return np.concatenate([tile, np.zeros((tile.shape[0], bc - tile.shape[1], p.d))], axis=1)
    size, n = cache.page_size, cache.keys(cache.lengths[b])
    box = min(size, bc)
    out = np.zeros((heads.stop - heads.start, bc, p.d))
    for i in range(0, bc, box):
        if key0 + i >= n:
            break
        page = hbm.load("page_table", (heads, (key0 + i) // size)).astype(np.int64)  # one entry per K/V head
        row = (key0 + i) % size
        pool = page * p.kv_heads + np.arange(heads.stop - heads.start)  # pool row of (page, K/V head)
        out[:, i:i + box] = hbm.load(name, (pool, slice(row, row + box), ALL))
    return out
