"""The IO model of the serving schedules: the split-KV decode (iokernels.plan.decode, plan.kvcache) and variable-length
batches (iokernels.plan.varlen), their stages' bytes in the terms of :mod:`.terms` (each sequence's sums the plans'
values, :func:`iokernels.model.hbm.plan_values`)."""

from __future__ import annotations

import sympy as sp

from .terms import (
    BH,
    A_new,
    B_r,
    BH_kv,
    G_bv,
    G_pt,
    G_v,
    H,
    H_kv,
    L_k,
    Loops,
    N_k,
    N_q,
    R_bd,
    R_bk,
    R_bq,
    R_bs,
    R_vk,
    R_vq,
    S_q,
    S_split,
    StageIo,
    T_vk,
    T_vq,
    d,
)


def flash_decode(c: Loops, split: bool, cache: str = "") -> dict[str, StageIo]:
    # split-KV decode (iokernels.plan.decode): the query rows of a K/V head's g query heads packed into
    # ceil(g N_q / B_r) tiles; every tile reads its split's K and V rows (the splits cover the keys once) and each
    # non-empty split reads the tile's Q rows; splits > 1 write float32 partials that the combine merges. ``cache``
    # "ragged" / "paged" (iokernels.plan.kvcache): per-sequence lengths (means L_k, S_q), read by every block (and
    # by the combine, once per row); paged: a page-table entry per box of each K and V copy (G_pt); "+append": a stage
    # first copies A_new new rows of Knew, Vnew into K, V, reading each row's length (and page) once
    tiles = sp.ceiling(BH * N_q / (BH_kv * B_r))
    splits = S_split if split else sp.Integer(1)
    rows, used = (L_k, S_q) if cache else (N_k, splits)
    main = (StageIo().read("Q", used * N_q * d).read("K", tiles * rows * d, BH_kv).read("V", tiles * rows * d, BH_kv))
    if cache:
        main.read("seqlens", tiles * splits, BH_kv)  # each block's sequence length, empty splits' too
    if cache.startswith("paged"):
        main.read("page_table", 2 * tiles * G_pt, BH_kv)
    first = {}
    if cache.endswith("+append"):
        append = (StageIo().read("Knew", A_new * d, BH_kv).read("Vnew", A_new * d, BH_kv).write("K", A_new * d, BH_kv)
                  .write("V", A_new * d, BH_kv).read("seqlens", A_new, BH_kv))
        if cache.startswith("paged"):
            append.read("page_table", A_new, BH_kv)
        first = {"append": append}
    if not split:
        return {**first, "main": main.write("O", N_q * d).write("lse", N_q)}
    main.write("Opart", used * N_q * d).write("lse_part", used * N_q)
    combine = (StageIo().read("Opart", used * N_q * d).read("lse_part", used * N_q)
               .write("O", N_q * d).write("lse", N_q))
    if cache:
        combine.read("seqlens", N_q)  # a row's sequence length: its splits
    return {**first, "main": main, "combine": combine}


def flash_varlen(c: Loops) -> dict[str, StageIo]:
    # a variable-length batch (iokernels.plan.varlen): each query head's tiles of each sequence read their Q rows once
    # and their sequence's (visible) key tiles, rows counted inside the packed tensor; O and lse written once per real
    # row; every block of the grid reads its sequence's offsets
    main = (StageIo().read("Q", R_vq * d, H).read("K", R_vk * d, H).read("V", R_vk * d, H)
            .write("O", T_vq * d, H).write("lse", T_vq, H)
            .read("cu_seqlens_q", 2 * G_v, H).read("cu_seqlens_k", 2 * G_v, H))
    return {"main": main}


def flash_varlen_bwd(c: Loops) -> dict[str, StageIo]:
    # its backward: D and dQacc's zeros over the packed rows; each K/V head's key blocks read K and V once and the
    # query blocks of its g query heads that see them (Q, dO, lse, D), add to dQacc (the reduce-add's boxes inside the
    # packed rows), write dK and dV of every key; dQ rounded from dQacc
    qd = T_vq * d
    main = (StageIo().read("Q", R_bq * d, H_kv).read("K", R_bk * d, H_kv).read("V", R_bk * d, H_kv)
            .read("dO", R_bq * d, H_kv).read("lse", R_bs, H_kv).read("D", R_bs, H_kv)
            .read("dQacc", R_bd * d, H_kv).write("dQacc", R_bd * d, H_kv)
            .write("dK", T_vk * d, H_kv).write("dV", T_vk * d, H_kv)
            .read("cu_seqlens_q", 2 * G_bv, H_kv).read("cu_seqlens_k", 2 * G_bv, H_kv))
    return {"prep": StageIo().read("dO", qd, H).read("O", qd, H).write("D", T_vq, H).write("dQacc", qd, H),
            "main": main, "dq": StageIo().read("dQacc", qd, H).write("dQ", qd, H)}
