"""The IO model's terms: the sympy symbols of the problem, the tiles and each schedule's sums, and the per-stage byte
table a schedule's builder fills (:class:`StageIo`: bytes read and written per tensor). :mod:`.hbm` (the dense
schedules) and :mod:`.serving` (decode, variable-length batches) build on them."""

from __future__ import annotations

from collections import defaultdict

import sympy as sp

from ..plan import BYTE_TENSORS, FLOAT32_TENSORS
from ..plan.core import INT32_TENSORS
from ..plan.units import ACC_ITEMSIZE


def pos(name: str) -> sp.Symbol:
    return sp.Symbol(name, positive=True, integer=True)


N_q, N_k, d, BH, e = pos("N_q"), pos("N_k"), pos("d"), pos("BH"), pos("e")
BH_kv = pos("BH_kv")  # rows of K and V (batch * kv_heads): BH, or fewer with grouped-query attention
B_r, B_c, BM, BN = pos("B_r"), pos("B_c"), pos("BM"), pos("BN")
M = sp.Symbol("M", positive=True)  # SRAM size in elements, as in the paper
N = pos("N")  # N_q = N_k = N, for the Θ forms

T_r = sp.ceiling(N_q / B_r)
T_c = sp.ceiling(N_k / B_c)

# causal plans: sums over the visible (query block, key block) pairs (iokernels.plan.causal_sums)
R_K = pos("R_K")  # key rows the query-block loops load: Σ cols_j (N_k·T_r without a mask)
R_Q = pos("R_Q")  # query rows the key-block loops load: Σ rows_i (N_q·T_c)
A_S = pos("A_S")  # elements of the visible S blocks: Σ rows_i·cols_j (N_q·N_k)
N_qv = pos("N_qv")  # rows of query blocks with a visible pair (N_q)
N_kv = pos("N_kv")  # rows of key blocks with a visible pair (N_k)
CAUSAL_SYMBOLS = {R_K: "R_K", R_Q: "R_Q", A_S: "A_S", N_qv: "N_qv", N_kv: "N_kv"}
# block-sparse plans (iokernels.plan.pair_sums): the same sums over the pairs the block mask keeps, and
N_bm = pos("N_bm")  # block-mask entries read per (batch, head): the pairs the loops visit (T_r·T_c)
s_density = sp.Symbol("s", positive=True)  # Θ forms: the fraction of visited pairs the block mask keeps
e_m = pos("e_m")  # explicit masks: bytes per mask element (1 boolean, 4 additive)
A_v = pos("A_v")  # sliding-window plans: visible elements of S, a plan's value (iokernels.plan.visible_area)
S_split = pos("S_split")  # split-KV decode: the splits of the key sequence (iokernels.plan.decode)
# a decode plan's cache of per-sequence lengths (iokernels.plan.decode_sums), as means over the batch: key rows a K/V
# head's copies load per sequence (N_k without a cache), non-empty splits (S_split), page-table entries per copy
L_k, S_q, G_pt = pos("L_k"), pos("S_q"), pos("G_pt")
A_new = pos("A_new")  # keys and values a decode step appends to each sequence's cache first
K_seq = pos("K_seq")  # the keys a decode step's queries attend to, per sequence on average (its FLOPs)
# a variable-length batch (iokernels.plan.varlen_sums), per query head: H the query heads, T_vq the packed query rows,
# R_vq and R_vk the query and key rows its copies load (each tile's rows inside the packed tensor), G_v the grid's
# blocks (each reads its sequence's two offsets of each), A_vl Σ L_q·L_k over the sequences
H, T_vq, R_vq, R_vk, G_v, A_vl = (pos(x) for x in ("H", "T_vq", "R_vq", "R_vk", "G_v", "A_vl"))
# its backward (iokernels.plan.varlen_backward_sums), per K/V head: H_kv the K/V heads, T_vk the packed key rows, R_bk
# and R_bq the key and query rows its copies load, R_bs the lse (and D) floats its steps read, R_bd the dQacc rows its
# additions read and write, G_bv the grid's blocks per K/V head
H_kv, T_vk, R_bk, R_bq, R_bs, R_bd, G_bv = (pos(x) for x in ("H_kv", "T_vk", "R_bk", "R_bq", "R_bs", "R_bd", "G_bv"))


class Loops:
    """What a schedule's block loops move: the unmasked products, or the causal sums."""

    def __init__(self, causal: bool) -> None:
        if causal:
            self.k_by_q, self.q_by_k, self.s, self.q_any, self.k_any = R_K, R_Q, A_S, N_qv, N_kv
        else:
            self.k_by_q, self.q_by_k, self.s, self.q_any, self.k_any = N_k * T_r, N_q * T_c, N_q * N_k, N_q, N_k

IoTable = dict[str, dict[str, tuple[sp.Expr, sp.Expr]]]  # stage -> tensor -> (read, write) bytes


def tensor_size(tensor: str) -> sp.Expr:
    if tensor == "mask":
        return e_m
    if tensor in BYTE_TENSORS:
        return sp.Integer(1)
    if tensor in INT32_TENSORS:
        return sp.Integer(4)
    return sp.Integer(ACC_ITEMSIZE) if tensor in FLOAT32_TENSORS else e


class StageIo:
    """One stage's bytes: tensor -> [read, written], as sympy expressions."""

    def __init__(self) -> None:
        self.io: dict[str, list[sp.Expr]] = defaultdict(lambda: [sp.Integer(0), sp.Integer(0)])

    def read(self, tensor: str, elements: sp.Expr, rows: sp.Expr = BH) -> StageIo:
        """``elements`` of ``tensor`` per row of the batch (``rows``: BH, or BH_kv for K/V heads)."""
        self.io[tensor][0] += rows * elements * tensor_size(tensor)
        return self

    def write(self, tensor: str, elements: sp.Expr, rows: sp.Expr = BH) -> StageIo:
        self.io[tensor][1] += rows * elements * tensor_size(tensor)
        return self

    def gemm(self, a: str, b: str, c: str, m: sp.Expr, n: sp.Expr, k: sp.Expr) -> StageIo:
        # C (m x n) = A (m x k) B (k x n) with BM x BN output tiles: each block reads its
        # A row panel and its B column panel once, whatever the k-slice size.
        return self.read(a, m * k * sp.ceiling(n / BN)).read(b, k * n * sp.ceiling(m / BM)).write(c, m * n)
