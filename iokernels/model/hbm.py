"""The IO model: sympy expressions of HBM bytes per algorithm, schedule, pass, stage and tensor.

``io_exprs`` gives exact bytes as functions of the problem and the plan's tiles (ceilings kept,
ragged N, N_q != N_k, the batch*heads factor ``BH``); :func:`exact` evaluates them for a
:class:`~iokernels.plan.Plan` and must equal the kernels' and the simulator's counters byte for
byte. :func:`theta_expr` drops the ceilings and puts the paper's ideal tiles (B = M/4d, in
elements) in place of the plan's, giving the Θ forms with the constant each schedule implies:
Θ(Nd + N²) for standard attention, Θ(N²d²/M) for FlashAttention.

Counting rules (``DESIGN.md``): every load counts, re-reads included; only in-range elements count;
atomics count as a read and a write. FLOPs are matrix-product FLOPs (2 per multiply-add), the
FlashAttention-2 convention; the softmax's elementwise work is not counted.

Causal plans (``causal=`` of the functions below, ``plan.causal``): the tiled schedules skip every
(query block, key block) pair whose elements are all masked, so their block-loop re-reads become
sums over the visible pairs. These are the symbols ``R_K``, ``R_Q``, ``A_S``, ``N_qv``, ``N_kv``
(:func:`iokernels.plan.causal_sums`), whose values :func:`exact` takes from the plan; without a
mask they are N_k·T_r, N_q·T_c, N_q·N_k, N_q and N_k. Standard attention computes all of S, so
its bytes do not change. The Θ forms put the visible area A (continuous: ``m(N_q − m/2)`` top-left,
``m(N_k − m/2)`` bottom-right, m = min(N_q, N_k); N²/2 when N_q = N_k = N) for the sums: R_K → A/B_r,
R_Q → A/B_c, A_S → A. FLOPs are halved for causal plans (the FlashAttention-2 convention for
TFLOP/s), whatever the schedule actually computes.

Block-sparse plans (``block_sparse=``, ``plan.block_mask``; the paper's Algorithm 5): the same sums over
the block pairs the mask keeps (:func:`iokernels.plan.pair_sums`), plus ``N_bm`` bytes of the block mask
(one per pair a loop visits, per batch·head; the backward's per K/V head). FLOPs are those of the kept blocks
(A_S elements of S); the Θ form is Proposition 4's Θ(Nd + N²d²M⁻¹s), with s·A in place of the sums.

Explicit masks (``mask=``, ``plan.mask``; :class:`iokernels.plan.masks.ExplicitMask`): the stages that read
one read its elements of every pair they compute, once per batch·head whether the mask is shared or not:
BH·A_S·e_m bytes (A_S = N_q·N_k without causal or block mask; e_m = 1 boolean, 4 additive).

The causal tma plans' persistent grids (the forward, the narrow backward) read their list of work items (tensor
``work``, :func:`iokernels.plan.fast.item_list_bytes`; O(T_r·BH) or O(T_c·BH_kv) bytes, added by :func:`exact`, left out
of the Θ forms).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from functools import cache

import sympy as sp

from ..plan import (
    BLOCK_SPARSE_STAGES,
    MASK_STAGES,
    SCHEDULES,
    Plan,
    normalize_causal,
    pair_sums,
    visible_area,
)
from ..plan.decode import DECODE_VARIANTS, decode_sums
from ..plan.fast import item_list_bytes, listed
from ..plan.tensors import DIMS, TENSORS
from ..plan.units import ACC_ITEMSIZE
from ..plan.varlen import VARLEN_VARIANT, varlen_backward_sums, varlen_sums
from .serving import flash_decode, flash_varlen, flash_varlen_bwd
from .specs import GpuSpec
from .terms import (
    A_S,
    BH,
    BM,
    BN,
    CAUSAL_SYMBOLS,
    R_K,
    R_Q,
    A_new,
    A_v,
    A_vl,
    B_c,
    B_r,
    BH_kv,
    G_bv,
    G_pt,
    G_v,
    H,
    H_kv,
    IoTable,
    K_seq,
    L_k,
    Loops,
    M,
    N,
    N_bm,
    N_k,
    N_kv,
    N_q,
    N_qv,
    R_bd,
    R_bk,
    R_bq,
    R_bs,
    R_vk,
    R_vq,
    S_q,
    S_split,
    StageIo,
    T_c,
    T_r,
    T_vk,
    T_vq,
    d,
    e,
    e_m,
    s_density,
    tensor_size,
)


# causal: S computed in full (−inf where masked). An explicit mask (io_exprs): the qk stage reads every element,
# BH·N_q·N_k·e_m. Dropout moves nothing: pv (and the backward's dv, rowdot, ds) regenerate Z.
def _standard_fwd(c: Loops) -> dict[str, StageIo]:
    return {
        "qk": StageIo().gemm("Q", "K", "S", N_q, N_k, d),
        "rowmax": StageIo().read("S", N_q * N_k).write("m", N_q),
        "rowsum": StageIo().read("S", N_q * N_k).read("m", N_q).write("l", N_q),
        "normalize": StageIo().read("S", N_q * N_k).read("m", N_q).read("l", N_q).write("P", N_q * N_k),
        "pv": StageIo().gemm("P", "V", "O", N_q, d, N_k),
    }


def _standard_bwd(c: Loops) -> dict[str, StageIo]:  # causal: P is 0 where masked, same products
    return {
        "dv": StageIo().gemm("P", "dO", "dV", N_k, d, N_q),
        "dp": StageIo().gemm("dO", "V", "dP", N_q, N_k, d),
        "rowdot": StageIo().read("P", N_q * N_k).read("dP", N_q * N_k).write("D", N_q),
        "ds": StageIo().read("P", N_q * N_k).read("dP", N_q * N_k).read("D", N_q).write("dS", N_q * N_k),
        "dq": StageIo().gemm("dS", "K", "dQ", N_q, d, N_k),
        "dk": StageIo().gemm("dS", "Q", "dK", N_k, d, N_q),
    }


def _two_pass(schedule: str, c: Loops) -> dict[str, StageIo]:
    # causal: a query block with no visible key loads nothing (and writes m = −inf, l = 0, O = 0)
    stats = StageIo().read("Q", c.q_any * d).read("K", d * c.k_by_q).write("m", N_q).write("l", N_q)
    output = StageIo().read("m", c.q_any).read("l", c.q_any).read("V", d * c.k_by_q).write("O", N_q * d)
    if schedule == "store":
        stats.write("S", c.s)
        output.read("S", c.s)
    else:
        output.read("Q", c.q_any * d).read("K", d * c.k_by_q)
    return {"stats": stats, "output": output}


def _flash_kv_outer_fwd(c: Loops) -> dict[str, StageIo]:
    main = StageIo().read("K", c.k_any * d).read("V", c.k_any * d).read("Q", d * c.q_by_k)
    for tensor, width in (("l", 1), ("m", 1), ("Oacc", d)):  # O's round trips, in float32
        main.read(tensor, width * c.q_by_k).write(tensor, width * c.q_by_k)
    return {"init": StageIo().write("m", N_q).write("l", N_q).write("Oacc", N_q * d),
            "main": main,
            "finalize": StageIo().write("O", N_q * d).read("Oacc", N_q * d)}


def _flash_q_outer_fwd(c: Loops) -> dict[str, StageIo]:
    main = (StageIo().read("Q", c.q_any * d).read("K", d * c.k_by_q).read("V", d * c.k_by_q)
            .write("O", N_q * d).write("lse", N_q))
    return {"main": main}


def _flash_bwd(c: Loops, kv: sp.Expr = BH) -> dict[str, StageIo]:
    # causal: a key block no query sees loads nothing and writes dK_j = dV_j = 0. ``kv``: the rows of
    # K, V, dK, dV; BH_kv for the tensor-core backward, whose block owns a K/V head's key block and
    # loops over the query heads that share it (grouped-query attention), so that K_j, V_j are read
    # and dK_j, dV_j written once per K/V head
    main = (StageIo().read("K", c.k_any * d, kv).read("V", c.k_any * d, kv)
            .read("Q", d * c.q_by_k).read("dO", d * c.q_by_k)
            .read("lse", c.q_by_k).read("D", c.q_by_k)
            .read("dQacc", d * c.q_by_k).write("dQacc", d * c.q_by_k)  # atomic adds
            .write("dK", N_k * d, kv).write("dV", N_k * d, kv))
    return {
        "prep": StageIo().read("dO", N_q * d).read("O", N_q * d).write("D", N_q).write("dQacc", N_q * d),
        "main": main,
        "dq": StageIo().read("dQacc", N_q * d).write("dQ", N_q * d),
    }


def _flash_fast_bwd_deterministic(c: Loops) -> dict[str, StageIo]:
    # no atomics: a query-outer stage computes and writes D_i, re-reads K and V once per query block
    # and writes dQ once; the K/V-outer stage is the main stage without dQacc
    dq = (StageIo().read("Q", N_q * d).read("dO", N_q * d).read("O", N_q * d).read("lse", N_q).write("D", N_q)
          .read("K", N_k * d * T_r).read("V", N_k * d * T_r).write("dQ", N_q * d))
    dkdv = (StageIo().read("K", N_k * d).read("V", N_k * d)
            .read("Q", N_q * d * T_c).read("dO", N_q * d * T_c)
            .read("lse", N_q * T_c).read("D", N_q * T_c)
            .write("dK", N_k * d).write("dV", N_k * d))
    return {"dq": dq, "dkdv": dkdv}


_BUILDERS = {
    ("standard", "default", "fwd"): _standard_fwd,
    ("standard", "default", "bwd"): _standard_bwd,
    ("two_pass", "store", "fwd"): lambda c: _two_pass("store", c),
    ("two_pass", "recompute", "fwd"): lambda c: _two_pass("recompute", c),
    ("flash", "kv_outer", "fwd"): _flash_kv_outer_fwd,
    ("flash", "q_outer", "fwd"): _flash_q_outer_fwd,
    ("flash", "fast", "fwd"): _flash_q_outer_fwd,  # the q_outer loop order on tensor cores, own tiles
    ("flash", "kv_outer", "bwd"): _flash_bwd,
    # the research backward's stages, tensor-core main stage, own tiles; K/V rows per K/V head
    ("flash", "fast", "bwd"): lambda c: _flash_bwd(c, BH_kv),
    # variants (Plan.variant): keyed (algorithm, schedule, direction, variant)
    ("flash", "fast", "bwd", "deterministic"): _flash_fast_bwd_deterministic,
    ("flash", "fast", "fwd", "split"): lambda c: flash_decode(c, True),
    ("flash", "fast", "fwd", "packed"): lambda c: flash_decode(c, False),
    ("flash", "fast", "fwd", VARLEN_VARIANT): flash_varlen,
    ("flash", "fast", "bwd", VARLEN_VARIANT): flash_varlen_bwd,
}
# a decode plan's cache (io_exprs's ``cache``): its builders with per-sequence lengths, contiguous or paged
_CACHE_BUILDERS = {(split, cache): (lambda c, split=split, cache=cache: flash_decode(c, split == "split", cache))
                   for split in DECODE_VARIANTS
                   for cache in ("ragged", "paged", "ragged+append", "paged+append")}
assert {k for k in _BUILDERS if len(k) == 3} == {(a, s, p) for (a, p), ss in SCHEDULES.items() for s in ss}


def _k(algorithm: str, schedule: str, direction: str, variant: str = "") -> tuple[str, ...]:
    return (algorithm, schedule, direction, variant) if variant else (algorithm, schedule, direction)


_MATMULS = {  # matrix products of shape N_q x N_k x d per pass
    ("standard", "default", "fwd"): 2, ("standard", "default", "bwd"): 4,
    ("two_pass", "store", "fwd"): 2, ("two_pass", "recompute", "fwd"): 3,
    ("flash", "kv_outer", "fwd"): 2, ("flash", "q_outer", "fwd"): 2, ("flash", "fast", "fwd"): 2,
    ("flash", "kv_outer", "bwd"): 5, ("flash", "fast", "bwd"): 5,
    ("flash", "fast", "bwd", "deterministic"): 7,  # S and dP recomputed by the dq stage
    ("flash", "fast", "fwd", "split"): 2, ("flash", "fast", "fwd", "packed"): 2,
    ("flash", "fast", "fwd", VARLEN_VARIANT): 2, ("flash", "fast", "bwd", VARLEN_VARIANT): 5,
}
_ORDER = {
    ("standard", "default", "fwd"): "Θ(Nd + N²)", ("standard", "default", "bwd"): "Θ(Nd + N²)",
    ("two_pass", "store", "fwd"): "Θ(Nd + N² + N²d²/M)", ("two_pass", "recompute", "fwd"): "Θ(N²d²/M)",
    ("flash", "kv_outer", "fwd"): "Θ(N²d²/M)", ("flash", "q_outer", "fwd"): "Θ(N²d²/M)",
    ("flash", "fast", "fwd"): "Θ(N²d²/M)",
    ("flash", "kv_outer", "bwd"): "Θ(N²d²/M)",
    ("flash", "fast", "bwd"): "Θ(N²d²/M)", ("flash", "fast", "bwd", "deterministic"): "Θ(N²d²/M)",
    ("flash", "fast", "fwd", "split"): "Θ(N_k d + S N_q d)", ("flash", "fast", "fwd", "packed"): "Θ(N_k d)",
    ("flash", "fast", "fwd", VARLEN_VARIANT): "Θ(Σ_b L_b d + L_b² d²/M)",
    ("flash", "fast", "bwd", VARLEN_VARIANT): "Θ(Σ_b L_b d + L_b² d²/M)",
}
_EXTRA = {  # footprint beyond inputs and outputs: the tensors a pass keeps in HBM besides them
    ("standard", "default", "fwd"): ("S", "P", "m", "l"),
    ("standard", "default", "bwd"): ("dP", "dS", "D"),
    ("two_pass", "store", "fwd"): ("S", "m", "l"),
    ("two_pass", "recompute", "fwd"): ("m", "l"),
    ("flash", "kv_outer", "fwd"): ("m", "l", "Oacc"),
    ("flash", "q_outer", "fwd"): ("lse",),
    ("flash", "fast", "fwd"): ("lse",),
    ("flash", "kv_outer", "bwd"): ("D", "dQacc"),
    ("flash", "fast", "bwd"): ("D", "dQacc"),
    ("flash", "fast", "bwd", "deterministic"): ("D",),
    ("flash", "fast", "fwd", "split"): ("lse",), ("flash", "fast", "fwd", "packed"): ("lse",),  # + the partials
    ("flash", "fast", "fwd", VARLEN_VARIANT): ("lse",), ("flash", "fast", "bwd", VARLEN_VARIANT): ("D", "dQacc"),
}
_EXTENT = {"q": N_q, "k": N_k, "d": d}


def _elements(tensor: str) -> sp.Expr:
    return sp.Mul(*(_EXTENT[x] for x in DIMS[tensor]))


def io_exprs(algorithm: str, schedule: str, direction: str, variant: str = "", *,
             causal: bool | str = False, block_sparse: bool = False, mask: bool = False,
             window: bool = False, cache: str = "", alibi: bool = False) -> IoTable:
    """Exact bytes read and written, per stage and tensor, as sympy expressions (``causal``: in the
    causal sums R_K, R_Q, A_S, N_qv, N_kv; the alignment only changes their values. ``block_sparse``:
    the same sums over the pairs the block mask keeps, plus the block-mask bytes, one per pair visited:
    N_bm. ``mask``: an explicit mask, e_m bytes per element of the computed pairs, A_S. ``window``: a sliding
    window, the same sums as causal over the pairs with a visible element. ``cache``: a decode plan's cache of
    per-sequence lengths, "ragged" (contiguous) or "paged", in the means L_k, S_q, G_pt, and "+append" with the
    appended rows A_new). ``alibi``: ALiBi's slopes, a float per block and query head: T_r per batch·head forward, T_c
    backward; of order N/B, the Θ forms leave them out)."""
    loops = Loops(bool(normalize_causal(causal)) or block_sparse or window)
    if cache:
        if variant not in DECODE_VARIANTS:
            raise ValueError(f"a cache of per-sequence lengths is a decode plan's ({DECODE_VARIANTS}), got {variant!r}")
        stages = _CACHE_BUILDERS[(variant, cache)](loops)
    else:
        stages = _BUILDERS[_k(algorithm, schedule, direction, variant)](loops)
    if block_sparse:  # the backward's blocks own a K/V head's key block: they read it once per K/V head
        for name in BLOCK_SPARSE_STAGES[(algorithm, schedule, direction)]:
            stages[name].read("block_mask", N_bm, BH_kv if direction == "bwd" else BH)
    if alibi:  # (flash/fast's tma kernels: each block reads its query heads' slopes before its work)
        stages["main"].read("alibi", T_r if direction == "fwd" else T_c)
    if mask:
        # standard attention's qk product reads the mask element of every S element it stores, causal or not
        area = N_q * N_k if algorithm == "standard" else loops.s
        for name in MASK_STAGES[(algorithm, schedule, direction)]:
            stages[name].read("mask", area)
    return {name: {t: (rw[0], rw[1]) for t, rw in sorted(st.io.items(), key=lambda kv: TENSORS.index(kv[0]))}
            for name, st in stages.items()}


def total_exprs(algorithm: str, schedule: str, direction: str, variant: str = "", *,
                causal: bool | str = False, block_sparse: bool = False, mask: bool = False, window: bool = False
                ) -> tuple[sp.Expr, sp.Expr]:
    read = write = sp.Integer(0)
    for tensors in io_exprs(algorithm, schedule, direction, variant, causal=causal,
                            block_sparse=block_sparse, mask=mask, window=window).values():
        for r, w in tensors.values():
            read, write = read + r, write + w
    return read, write


def ideal_tiles(algorithm: str, schedule: str, direction: str) -> dict:
    big, small = M / (4 * d), sp.Min(M / (4 * d), d)
    if algorithm == "standard":
        return {}
    if (algorithm, schedule) in {("flash", "kv_outer")} or (algorithm, schedule, direction) == ("flash", "fast", "bwd"):
        return {B_c: big, B_r: small}  # the K/V block is the resident one
    return {B_r: big, B_c: small}


def visible_area_expr(causal: bool | str) -> sp.Expr:
    """The visible part of the N_q x N_k score matrix, continuous (the Θ forms' causal area):
    m(N_q − m/2) top-left, m(N_k − m/2) bottom-right, m = min(N_q, N_k); N_q·N_k without a mask."""
    causal = normalize_causal(causal)
    if not causal:
        return N_q * N_k
    m = sp.Min(N_q, N_k)
    return m * ((N_q if causal == "top_left" else N_k) - m / 2)


@cache  # simplify is slow, and sweeps ask for the same few forms at every point
def theta_expr(algorithm: str, schedule: str, direction: str, variant: str = "", *,
               causal: bool | str = False, block_sparse: bool = False, mask: bool = False,
               window: bool = False) -> sp.Expr:
    """Total bytes without ceilings along N, with the paper's tile rule B = M/4d for the plan's.

    For standard attention the matrix-product tiles BM, BN stay (its traffic does not depend on M).
    Causal: the visible area A (:func:`visible_area_expr`) in place of the causal sums. Block-sparse
    (Proposition 4, Θ(Nd + N²d²M⁻¹s)): s·A in place of the sums, s the fraction of visited block
    pairs the mask keeps (a plan's value: :func:`plan_values`), and A/(B_r·B_c) mask bytes. A sliding window:
    A is the plan's count of visible elements (A_v, no closed form here).
    """
    read, write = total_exprs(algorithm, schedule, direction, variant, causal=causal, block_sparse=block_sparse,
                              mask=mask, window=window)
    expr = read + write
    if variant == VARLEN_VARIANT:  # each sequence's N²d²/M: Σ L_q·L_k over the resident tile's rows (half causal)
        area = A_vl / 2 if normalize_causal(causal) else A_vl
        g = H / H_kv
        expr = expr.subs({R_vk: area / B_r, R_vq: T_vq, G_v: T_vq / B_r, R_bk: T_vk, R_bq: g * area / B_c,
                          R_bs: g * area / B_c, R_bd: g * area / B_c, G_bv: T_vk / B_c})
    elif normalize_causal(causal) or block_sparse or window:
        area = A_v if window else visible_area_expr(causal)
        kept = s_density * area if block_sparse else area
        expr = expr.subs({R_K: kept / B_r, R_Q: kept / B_c, A_S: kept, N_qv: N_q, N_kv: N_k,
                          N_bm: area / (B_r * B_c)})
    # only the block counts along N lose their ceilings; ceil(d / BN) stays (it is 1 when d <= BN)
    expr = expr.replace(sp.ceiling, lambda x: x if x.has(N_q, N_k) else sp.ceiling(x))
    # split-KV decode: the ideal tile holds a K/V head's g·N_q query rows (K and V read once per K/V head)
    ideal = {B_r: BH * N_q / BH_kv} if variant in DECODE_VARIANTS else ideal_tiles(algorithm, schedule, direction)
    return sp.simplify(expr.subs(ideal))


def theta_leading(plan: Plan) -> tuple[int, float]:
    """The Θ form's leading term in N: (degree, coefficient) with N_q = N_k = N and every other
    symbol (d, M, e, BH, and standard's BM, BN) at the plan's values. Flash: (2, 8·BH·d²·e/M) for
    the FlashAttention-2 order; standard: (2, its N² bytes, which grow with d only through the
    matrix products' panel re-reads)."""
    values = {k: v for k, v in plan_values(plan).items() if k not in (N_q, N_k)}
    expr = theta_expr(*_key(plan), causal=plan.causal, block_sparse=_sparse(plan),
                      mask=plan.mask is not None).subs({N_q: N, N_k: N}).subs(values)
    poly = sp.Poly(sp.expand(expr), N)
    return poly.degree(), float(poly.LC())


def square_tiling_expr() -> sp.Expr:
    """Saha & Ye's square-tiling bound for M < d²: Θ(N²d/√M) element accesses, here in bytes
    (times e and BH, constant 1: it is an order, not a count). Flash's Θ(N²d²/M) exceeds it by
    d/√M, so the two meet at M = d² elements."""
    return BH * e * N_q * N_k * d / sp.sqrt(M)


def io_lower_bound_expr() -> sp.Expr:
    """Saha & Ye's IO complexity of exact attention with standard matrix products, in bytes with
    constant 1: Θ(min(N²d²/M, N²d/√M)), i.e. flash's order for M ≥ d², square tiling's below."""
    return BH * e * N_q * N_k * sp.Min(d**2 / M, d / sp.sqrt(M))


def bound_bytes(expr: sp.Expr, plan: Plan) -> float:
    """A Θ-form expression (such as :func:`square_tiling_expr`) at the plan's N, d, M, e and BH."""
    return float(expr.subs(plan_values(plan)))


def order(algorithm: str, schedule: str, direction: str, variant: str = "") -> str:
    return _ORDER[_k(algorithm, schedule, direction, variant)]


def flops_expr(algorithm: str, schedule: str, direction: str, variant: str = "", *,
               causal: bool | str = False, block_sparse: bool = False, window: bool = False, cache: str = ""
               ) -> sp.Expr:
    """Matrix-product FLOPs; halved for causal attention (the FlashAttention-2 convention);
    block-sparse: those of the computed blocks, A_S elements of S; a sliding window: those of its A_v visible
    elements; a decode plan's cache of per-sequence lengths: over K_seq keys a sequence on average."""
    if block_sparse:
        return 2 * _MATMULS[_k(algorithm, schedule, direction, variant)] * BH * A_S * d
    if window:
        return 2 * _MATMULS[_k(algorithm, schedule, direction, variant)] * BH * A_v * d
    if variant == VARLEN_VARIANT:  # the products of each sequence's real tokens
        flops = 2 * _MATMULS[_k(algorithm, schedule, direction, variant)] * H * A_vl * d
        return flops / 2 if normalize_causal(causal) else flops
    flops = 2 * _MATMULS[_k(algorithm, schedule, direction, variant)] * BH * N_q * (K_seq if cache else N_k) * d
    # (a decode's causal mask hides a triangle of its few queries: its products are those of N_q x N_k)
    return flops / 2 if normalize_causal(causal) and variant not in DECODE_VARIANTS else flops


def footprint_expr(algorithm: str, schedule: str, direction: str, variant: str = "") -> sp.Expr:
    """Extra HBM bytes beyond inputs and outputs (standard: O(N²); flash: O(N); split-KV decode: the partials)."""
    partials = S_split * BH * N_q * (d + 1) * ACC_ITEMSIZE if variant == "split" else sp.Integer(0)
    if variant == VARLEN_VARIANT:  # per packed query row and head
        return sum(H * T_vq * tensor_size(t) * (d if DIMS[t][-1] == "d" else 1)
                   for t in _EXTRA[_k(algorithm, schedule, direction, variant)])
    return sum((BH * _elements(t) * tensor_size(t) for t in _EXTRA[_k(algorithm, schedule, direction, variant)]),
               partials)


def plan_values(plan: Plan) -> dict:
    values = {N_q: plan.N_q, N_k: plan.N_k, d: plan.d, BH: plan.bh, BH_kv: plan.bh_kv, e: plan.itemsize,
              M: sp.Rational(plan.sram_bytes, plan.itemsize)}
    if plan.mask is not None:
        values[e_m] = plan.mask.itemsize
    tile = plan.tile
    for sym, key in ((B_r, "Br"), (B_c, "Bc"), (BM, "BM"), (BN, "BN"), (S_split, "S")):
        if key in tile:
            values[sym] = tile[key]
    if plan.positional:
        values[A_v] = visible_area(plan.N_q, plan.N_k, plan.causal, plan.window, plan.documents)
    if plan.kv_cache is not None and plan.kv_cache.lengths is not None:
        sums = decode_sums(plan)
        values.update({L_k: sp.Rational(sums["rows"], plan.batch), S_q: sp.Rational(sums["splits"], plan.batch),
                       G_pt: sp.Rational(sums["entries"], plan.batch), A_new: plan.kv_cache.append,
                       K_seq: sp.Rational(sum(plan.kv_cache.keys(n) for n in plan.kv_cache.lengths), plan.batch)})
    if plan.varlen is not None:
        v = plan.varlen
        values.update({H: plan.heads, H_kv: plan.kv_heads, T_vq: v.total_q, T_vk: v.total_k})
        if v.known:
            values[A_vl] = sum(lq * lk for _, lq, _, lk in v.sequences())
            if plan.direction == "fwd":
                sums = varlen_sums(plan)
                values.update({R_vq: sums["rows_q"], R_vk: sums["rows_k"], G_v: sums["blocks"]})
            else:
                sums = varlen_backward_sums(plan)
                values.update({R_bk: sums["rows_k"], R_bq: sums["rows_q"], R_bs: sums["scalars"], R_bd: sums["dq"],
                               G_bv: sums["blocks"]})
        return values
    if (plan.causal or _sparse(plan) or plan.positional) and "Br" in tile and plan.variant not in DECODE_VARIANTS:
        sums = pair_sums(plan)
        values.update({sym: sums[name] for sym, name in CAUSAL_SYMBOLS.items()})
        values[N_bm] = sums["N_bm"]
        if _sparse(plan):  # kept pairs over visited ones, weighted by area: s of the Θ form
            values[s_density] = sp.Rational(sums["A_S"], pair_sums(replace(plan, block_mask=None))["A_S"])
    return values


def cache_kind(plan: Plan) -> str:
    """io_exprs's ``cache`` of a plan: "" (no cache of per-sequence lengths), "ragged" or "paged", with "+append"
    when the step appends keys first."""
    if plan.kv_cache is None:
        return ""
    return ("paged" if plan.kv_cache.paged else "ragged") + ("+append" if plan.kv_cache.append else "")


def _key(plan: Plan) -> tuple[str, ...]:
    return _k(plan.algorithm, plan.schedule, plan.direction, plan.variant)


def _sparse(plan: Plan) -> bool:
    return plan.block_mask is not None


def _int(expr: sp.Expr, values: dict) -> int:
    value = sp.sympify(expr).subs(values)
    if not value.is_Integer:
        raise AssertionError(f"exact byte count did not evaluate to an integer: {value}")
    return int(value)


def exact(plan: Plan) -> dict[str, dict[str, tuple[int, int]]]:
    """Exact bytes (read, written) per stage and tensor for this plan; a tensor a stage does not move
    at all (a block mask that zeroes every block) is left out, as counters that stay 0 are."""
    if plan.kv_cache is not None and plan.kv_cache.lengths is None:
        raise ValueError(f"{plan.label}: the cache's lengths are not known (a launch plan): no exact bytes")
    if plan.varlen is not None and not plan.varlen.known:
        raise ValueError(f"{plan.label}: the sequences' lengths are not known (a launch plan): no exact bytes")
    values = plan_values(plan)
    table = io_exprs(*_key(plan), causal=plan.causal, block_sparse=_sparse(plan), mask=plan.mask is not None,
                     window=plan.positional, cache=cache_kind(plan), alibi=plan.alibi is not None)
    out = {stage: {t: (_int(r, values), _int(w, values)) for t, (r, w) in tensors.items()}
           for stage, tensors in table.items()}
    if plan.mods is not None:  # a variant's captured arrays: the reads its expressions execute (iokernels.plan.mods)
        if plan.mods.capture_bytes is None:
            raise ValueError(f"{plan.label}: the captured arrays' values are not known (make_plan(..., "
                             "capture_values=)): no exact bytes")
        out["main"]["captures"] = (plan.mods.capture_bytes, 0)
    if listed(plan):  # a causal tma plan's persistent grid reads its list of items
        out["main"]["work"] = (item_list_bytes(plan), 0)
    return {stage: {t: rw for t, rw in tensors.items() if rw != (0, 0)} for stage, tensors in out.items()}


def per_tensor(stages: dict[str, dict[str, tuple[int, int]]]) -> dict[str, tuple[int, int]]:
    """Bytes (read, written) per tensor, summed over the stages (measured or predicted alike)."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for tensors in stages.values():
        for t, (r, w) in tensors.items():
            out[t][0] += r
            out[t][1] += w
    return {t: (rw[0], rw[1]) for t, rw in sorted(out.items(), key=lambda kv: TENSORS.index(kv[0]))}


@dataclass(frozen=True)
class Prediction:
    """Everything the model says about one plan."""

    plan: Plan
    stages: dict[str, dict[str, tuple[int, int]]]
    theta_bytes: float
    flops: int
    footprint_bytes: int

    @property
    def per_tensor(self) -> dict[str, tuple[int, int]]:
        return per_tensor(self.stages)

    @property
    def read_bytes(self) -> int:
        return sum(r for r, _ in self.per_tensor.values())

    @property
    def write_bytes(self) -> int:
        return sum(w for _, w in self.per_tensor.values())

    @property
    def total_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    @property
    def intensity(self) -> float:
        """FLOPs per byte of HBM traffic."""
        return self.flops / self.total_bytes

    def roofline_seconds(self, spec: GpuSpec) -> float:
        return max(self.flops / spec.peak_flops(self.plan.dtype), self.total_bytes / spec.hbm_bytes_per_s)


def predict(plan: Plan) -> Prediction:
    values = plan_values(plan)
    key = _key(plan)
    return Prediction(
        plan=plan,
        stages=exact(plan),
        theta_bytes=float(theta_expr(*key, causal=plan.causal, block_sparse=_sparse(plan),
                                     mask=plan.mask is not None, window=plan.positional).subs(values)),
        flops=_int(flops_expr(*key, causal=plan.causal, block_sparse=_sparse(plan), window=plan.positional,
                              cache=cache_kind(plan)), values),
        footprint_bytes=_int(footprint_expr(*key), values),
    )


def formulas(algorithm: str, schedule: str, direction: str, *, latex: bool = False,
             per_tensor: bool = False, variant: str = "", causal: bool | str = False,
             block_sparse: bool = False, window: bool = False) -> list[tuple[str, str]]:
    """(label, formula) pairs: total read, write and Θ bytes, and optionally each tensor's."""
    show = sp.latex if latex else (lambda x: sp.pretty(x, use_unicode=True))
    key = (algorithm, schedule, direction, variant)
    masks = {"causal": causal, "block_sparse": block_sparse, "window": window}
    read, write = total_exprs(*key, **masks)
    out = [("read", show(sp.simplify(read))), ("write", show(sp.simplify(write))),
           (f"theta {order(*key)}", show(theta_expr(*key, **masks)))]
    if per_tensor:
        for stage, tensors in io_exprs(*key, **masks).items():
            for t, (r, w) in tensors.items():
                if r != 0:
                    out.append((f"{stage} {t} read", show(r)))
                if w != 0:
                    out.append((f"{stage} {t} write", show(w)))
    return out
