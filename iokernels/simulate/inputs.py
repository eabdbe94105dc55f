"""Inputs and references of simulated (and GPU) runs: random inputs for a plan, the masks and dropout the float64
reference takes for it, what its outputs must equal, and the error measure the tests use."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from ..plan import Plan
from ..plan.mods import capture_buffer
from ..plan.units import round_to
from . import reference
from .mods import reference_mods
from .simulator import kv_rows, reference_dropout
from .varlen import varlen_inputs, varlen_reference, varlen_reference_grads


def make_inputs(plan: Plan, seed: int = 0, scale: float | None = None, *, magnitude: float = 1.0,
                rounded: bool = False, captures: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Random float64 inputs of shape (batch*heads, N, d); for a backward plan also O, lse, P and dO
    (O, lse and P from the reference on the same Q, K, V; a programmable variant's plan: O, lse and dO).
    ``captures``: a programmable variant's captured arrays by name (iokernels.plan.mods), added as inputs (default:
    those the plan was made with).

    ``magnitude`` multiplies Q and K (logits scale with its square). ``rounded``: every value stored
    in the plan's dtype is rounded to it, so that a GPU run gets exactly these values (lse stays
    float32-exact float64, as the kernels read it).
    """
    rng = np.random.default_rng(seed)
    if plan.varlen is not None:  # packed rows and their offsets (simulate/varlen.py)
        return varlen_inputs(plan, rng, magnitude=magnitude, rounded=rounded)
    bh = plan.bh

    def stored(x: np.ndarray) -> np.ndarray:
        return round_to(x, plan.dtype) if rounded else x

    q = stored(magnitude * rng.standard_normal((bh, plan.N_q, plan.d)))
    k = stored(magnitude * rng.standard_normal((plan.bh_kv, plan.N_k, plan.d)))  # grouped-query: fewer heads
    v = stored(rng.standard_normal((plan.bh_kv, plan.N_k, plan.d)))
    inputs = {"Q": q, "K": k, "V": v}
    if plan.kv_cache is not None:  # a decode's cache: its lengths, rows past them NaN; paged: a pool and its table
        inputs.update(cache_inputs(plan, k, v, rng))
    if plan.mask is not None:  # an explicit mask (iokernels.plan.masks.ExplicitMask): data, like Q, K, V
        inputs["mask"] = random_mask(plan, rng)
    if captures is None and plan.mods is not None:  # the arrays the plan was made with, if any
        captures = plan.mods.host_values()
    inputs.update({capture_buffer(name): np.asarray(x) for name, x in (captures or {}).items()})
    if plan.direction == "bwd":
        scale = reference.default_scale(plan.d) if scale is None else scale
        kv = kv_rows(plan)
        mask = reference_mask(plan, inputs)
        # dropout: O is the forward's dropped output (D = rowsum(dO ∘ O)); lse and P stay undropped
        o, lse = reference.forward(q, k[kv], v[kv], scale, causal=plan.causal, mask=mask,
                                   dropout=reference_dropout(plan), softcap=plan.softcap, alibi=plan.alibi,
                                   mods=reference_mods(plan, inputs))
        inputs.update(O=stored(o), lse=lse, dO=stored(rng.standard_normal(o.shape)))
        if plan.mods is not None:  # (flash/fast reads no P)
            return inputs
        inputs["P"] = stored(reference.probabilities(q, k[kv], scale, causal=plan.causal, mask=mask,
                                                     softcap=plan.softcap, alibi=plan.alibi)
                             if plan.causal or mask is not None or plan.softcap is not None
                             or plan.alibi is not None
                             else np.exp(scale * (q @ np.swapaxes(k[kv], -1, -2)) - lse[..., None]))
    return inputs


def cache_inputs(plan: Plan, k: np.ndarray, v: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A decode plan's cache (Plan.kv_cache, its lengths known) holding the keys and values ``k``, ``v`` (batch·K/V
    heads, N_k, d) up to each sequence's length: "seqlens" (batch,) int32; K and V with NaN past the lengths
    (the kernels must never let those rows reach O); paged: the pool (pages·K/V heads, page size, d), NaN where no
    sequence's key lies, its pages handed out in random order (as many as the lengths with the appended keys need),
    and "page_table" (batch, max_pages) int32, −1 past a sequence's pages. With ``append`` new keys: "Knew", "Vnew"
    (batch·K/V heads, append, d), the rows of ``k``, ``v`` that follow each sequence's length (NaN in the cache until
    the step writes them)."""
    cache = plan.kv_cache
    lengths = np.asarray(cache.lengths, dtype=np.int32)
    out: dict[str, np.ndarray] = {"seqlens": lengths}
    if cache.append:
        rows = np.repeat(lengths, plan.kv_heads)[:, None] + np.arange(cache.append)[None, :]  # (bh_kv, append)
        heads = np.arange(plan.bh_kv)[:, None]
        out["Knew"], out["Vnew"] = k[heads, rows], v[heads, rows]
    if not cache.paged:
        past = np.arange(plan.N_k)[None, :] >= np.repeat(lengths, plan.kv_heads)[:, None]
        out["K"], out["V"] = (np.where(past[..., None], np.nan, x) for x in (k, v))
        return out
    size, h_kv = cache.page_size, plan.kv_heads
    need = [-(-cache.keys(int(n)) // size) for n in lengths]
    if sum(need) > cache.pages:
        raise ValueError(f"the pool's {cache.pages} pages hold fewer than the {sum(need)} the lengths need")
    order = rng.permutation(cache.pages)
    table = np.full((plan.batch, cache.max_pages(plan.N_k)), -1, dtype=np.int32)
    pool_k = np.full((cache.pages * h_kv, size, plan.d), np.nan)
    pool_v = np.full(pool_k.shape, np.nan)
    taken = 0
    for b, n in enumerate(lengths):
        for i in range(need[b]):
            page = int(order[taken])
            taken += 1
            table[b, i] = page
            rows = slice(i * size, min((i + 1) * size, int(n)))  # its cached rows (none past them: the appended)
            count = max(0, rows.stop - rows.start)
            for j in range(h_kv if count else 0):
                pool_k[page * h_kv + j, :count] = k[b * h_kv + j, rows]
                pool_v[page * h_kv + j, :count] = v[b * h_kv + j, rows]
    out.update(K=pool_k, V=pool_v, page_table=table)
    return out


def cache_keys(plan: Plan, inputs: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The keys and values each sequence of a decode plan's cache holds, the appended ones (Knew, Vnew) after them: per
    sequence b, (K/V heads, length + append, d), gathered from the contiguous cache or through the page table."""
    cache, h_kv = plan.kv_cache, plan.kv_heads
    ks, vs = [], []
    for b, n in enumerate(int(x) for x in inputs["seqlens"]):
        heads = slice(b * h_kv, (b + 1) * h_kv)
        if not cache.paged:
            got = [inputs["K"][heads, :n], inputs["V"][heads, :n]]
        else:
            pages = inputs["page_table"][b, :-(-n // cache.page_size)].astype(np.int64)
            rows = (pages[:, None] * h_kv + np.arange(h_kv)[None, :])  # (pages, K/V heads) pool rows
            got = [src[rows].transpose(1, 0, 2, 3).reshape(h_kv, -1, plan.d)[:, :n]  # (K/V heads, rows, d)
                   for src in (inputs["K"], inputs["V"])]
        if cache.append:
            got = [np.concatenate([x, inputs[new][heads]], axis=1)
                   for x, new in zip(got, ("Knew", "Vnew"), strict=True)]
        ks.append(got[0])
        vs.append(got[1])
    return ks, vs


def cache_reference(plan: Plan, inputs: dict[str, np.ndarray], scale: float | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """O and lse of a decode plan with a cache, in float64: each sequence's query heads over its keys (causal: the
    plan's bottom-right mask against the sequence's length); a query that sees no key gives O = 0, lse −inf."""
    ks, vs = cache_keys(plan, inputs)
    group = plan.heads // plan.kv_heads
    q = inputs["Q"].reshape(plan.batch, plan.heads, plan.N_q, plan.d)
    o = np.zeros(q.shape)
    lse = np.full(q.shape[:-1], -np.inf)
    for b, (k, v) in enumerate(zip(ks, vs, strict=True)):
        if k.shape[1]:
            o[b], lse[b] = reference.forward(q[b], np.repeat(k, group, axis=0), np.repeat(v, group, axis=0), scale,
                                             causal=plan.causal)
    return o.reshape(plan.bh, plan.N_q, plan.d), lse.reshape(plan.bh, plan.N_q)


def random_mask(plan: Plan, rng: np.random.Generator, *, empty_rows: bool = True) -> np.ndarray:
    """A random explicit mask for ``plan.mask``: (1 or BH, N_q, N_k) of its dtype. Boolean: about 70%
    visible; additive: N(0, 1) values with about 30% −inf. ``empty_rows``: every 7th query row sees no key."""
    spec = plan.mask
    shape = spec.shape(plan.bh, plan.N_q, plan.N_k)
    visible = rng.random(shape) < 0.7
    if empty_rows:
        visible[:, 3::7, :] = False
    if spec.kind == "bool":
        return visible.astype(spec.dtype)
    return np.where(visible, rng.standard_normal(shape), -np.inf).astype(spec.dtype)


def reference_mask(plan: Plan, inputs: dict[str, np.ndarray]) -> np.ndarray | None:
    """The mask :mod:`iokernels.simulate.reference` takes for ``plan``: its block mask's elements, its window and/or
    its explicit mask (boolean, or additive with −inf where the others hide); None without any (the causal mask
    goes to the reference by its own argument)."""
    block = plan.element_mask()
    if plan.positional:  # the window and the documents (the causal mask goes by its own argument)
        window = replace(plan, causal="").visible(np.arange(plan.N_q), np.arange(plan.N_k))
        block = window if block is None else block & window
    if plan.mask is None:
        return block
    m = inputs["mask"]
    if plan.mask.kind == "bool":
        m = m != 0
        return m if block is None else m & block
    m = m.astype(np.float64)
    return m if block is None else np.where(block, m, -np.inf)


def reference_outputs(plan: Plan, inputs: dict[str, np.ndarray], scale: float | None = None
                      ) -> dict[str, np.ndarray]:
    """What the simulated outputs must equal: the naive float64 reference on the same inputs."""
    if plan.varlen is not None:
        if plan.direction == "bwd":
            return varlen_reference_grads(plan, inputs, scale)
        return {"O": varlen_reference(plan, inputs, scale)[0]}
    if plan.kv_cache is not None:
        return {"O": cache_reference(plan, inputs, scale)[0]}
    if plan.direction == "fwd":
        kv = kv_rows(plan)
        return {"O": reference.forward(inputs["Q"], inputs["K"][kv], inputs["V"][kv], scale, causal=plan.causal,
                                       mask=reference_mask(plan, inputs), dropout=reference_dropout(plan),
                                       softcap=plan.softcap, alibi=plan.alibi,
                                       mods=reference_mods(plan, inputs))[0]}
    kv, group = kv_rows(plan), plan.heads // plan.kv_heads
    dq, dk, dv = reference.backward(inputs["Q"], inputs["K"][kv], inputs["V"][kv], inputs["dO"], scale,
                                    causal=plan.causal, mask=reference_mask(plan, inputs),
                                    dropout=reference_dropout(plan), softcap=plan.softcap, alibi=plan.alibi,
                                    mods=reference_mods(plan, inputs))
    # grouped-query attention: a K/V head's gradient sums those of the query heads that share it
    dk, dv = (x.reshape(plan.bh_kv, group, *x.shape[1:]).sum(axis=1) for x in (dk, dv))
    return {"dQ": dq, "dK": dk, "dV": dv}


def max_relative_error(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    """max over outputs of max|got - want| / max(max|want|, 1e-3); NaN or inf anywhere gives inf.

    The floor keeps outputs that are exactly zero meaningful (one key: dQ = dK = 0).
    """
    worst = 0.0
    for name, w in want.items():
        g = got[name]
        if not np.all(np.isfinite(g)):
            return float("inf")
        worst = max(worst, float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-3)))
    return worst
