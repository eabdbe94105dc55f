"""Names of the tensors whose HBM traffic is counted, shared by kernels, simulator and model.

The order fixes the counter index of each tensor in the kernels' counter arrays
(``counters[2 * index]`` = bytes read, ``counters[2 * index + 1]`` = bytes written); the CUDA
sources get these indices as ``IOK_T_<name>`` defines, never written down a second time.
"""

from __future__ import annotations

TENSORS: tuple[str, ...] = (
    "Q", "K", "V", "O", "S", "P", "m", "l", "lse",
    "dO", "D", "dP", "dS", "dQ", "dK", "dV", "dQacc", "Oacc", "block_mask", "mask", "Opart", "lse_part",
    "seqlens", "page_table", "Knew", "Vnew", "cu_seqlens_q", "cu_seqlens_k", "alibi",
    "captures", "work",
)
TENSOR_INDEX: dict[str, int] = {name: i for i, name in enumerate(TENSORS)}
NUM_TENSORS = len(TENSORS)

# The extents of each tensor after the leading batch*heads index: q = N_q, k = N_k, d = head dim
# (one extent: a float per row).
DIMS: dict[str, tuple[str, ...]] = {
    "Q": ("q", "d"), "K": ("k", "d"), "V": ("k", "d"), "O": ("q", "d"), "dO": ("q", "d"),
    "S": ("q", "k"), "P": ("q", "k"), "dP": ("q", "k"), "dS": ("q", "k"),
    "m": ("q",), "l": ("q",), "lse": ("q",), "D": ("q",),
    "dQ": ("q", "d"), "dK": ("k", "d"), "dV": ("k", "d"), "dQacc": ("q", "d"), "Oacc": ("q", "d"),
}
# Tensors whose shape is not (batch*heads, ...) of N_q, N_k and d: the block mask of block-sparse plans,
# (T_r, T_c) bytes on the plan's tile grid (iokernels.plan.masks), shared by every batch and head.
# The explicit mask of masked plans (iokernels.plan.masks.ExplicitMask): (1 or batch*heads, N_q, N_k), uint8 or float32.
MASK_TENSORS: tuple[str, ...] = ("block_mask", "mask")
# The split-KV decode's partial outputs (iokernels.plan.decode): float32 O and lse of every split, (S·BH, N_q, d) and
# (S·BH, N_q), written by the splits and read by the combine.
SPLIT_TENSORS: tuple[str, ...] = ("Opart", "lse_part")
# A decode's cache (iokernels.plan.kvcache): the sequences' lengths (batch,) and the page table (batch, max_pages),
# int32.
CACHE_TENSORS: tuple[str, ...] = ("seqlens", "page_table")
# The keys and values a decode step appends to its cache first, (batch·kv_heads, append, d) of the input dtype.
APPEND_TENSORS: tuple[str, ...] = ("Knew", "Vnew")
# A variable-length batch's sequence offsets (iokernels.plan.varlen): cumulative lengths (batch + 1,) of int32 into the
# packed query and key rows.
VARLEN_TENSORS: tuple[str, ...] = ("cu_seqlens_q", "cu_seqlens_k")
# ALiBi's slopes (iokernels.plan.variants.with_alibi): one float32 per batch·head, part of the plan.
ALIBI_TENSORS: tuple[str, ...] = ("alibi",)
# The arrays a programmable variant's expressions read (iokernels.plan.mods), all counted as one tensor: the element
# reads the expressions execute.
MOD_TENSORS: tuple[str, ...] = ("captures",)
# A causal tma plan's list of work items (iokernels.plan.fast.item_list: its persistent grid's, forward and backward):
# int32, part of the plan.
LIST_TENSORS: tuple[str, ...] = ("work",)
assert (set(DIMS) | set(MASK_TENSORS) | set(SPLIT_TENSORS) | set(CACHE_TENSORS) | set(APPEND_TENSORS)
        | set(VARLEN_TENSORS) | set(ALIBI_TENSORS) | set(MOD_TENSORS) | set(LIST_TENSORS)) == set(TENSORS)

# Bytes moved: stage -> tensor -> (read, written).
Counts = dict[str, dict[str, tuple[int, int]]]

# What each pass returns.
OUTPUTS: dict[str, tuple[str, ...]] = {"fwd": ("O",), "bwd": ("dQ", "dK", "dV")}
