"""FlexAttention's arguments for ``bench``'s problems (issue #22): the ``mask_mod`` of a causal mask, a window or
documents, the ``BlockMask`` of a block-sparse problem (:func:`flex_kv_blocks`: our blocks as FlexAttention's kv
blocks), and the ``score_mod`` of a softcap, of ALiBi or of an additive explicit mask. Built once per problem by
:class:`iokernels.bench.implementations.TorchFlex`, outside the timed calls; torch imported only when needed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..plan.masks import BlockMask
from .configs import Problem, block_areas, explicit_mask


def flex_mask_mod(problem: Problem, device: str = "cuda") -> Callable[..., Any] | None:
    """FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)`` for the problem's causal mask, window and documents (those
    given, all at once; N_q = N_k, so the window's offset is 0 and the causal alignments agree), None without any.
    Documents: ``document_id[q_idx] == document_id[kv_idx]``, ``document_id`` an int32 tensor on ``device`` giving
    each position its document (the lengths repeated), as FlexAttention's document-masking example builds it."""
    if not problem.causal and problem.window is None and not problem.masks_documents:
        return None
    left, right = problem.window if problem.window is not None else (None, None)
    document_id = None
    if problem.masks_documents:
        import torch

        lengths = torch.tensor(problem.documents, device=device, dtype=torch.int64)
        document_id = torch.repeat_interleave(torch.arange(len(problem.documents), device=device,
                                                           dtype=torch.int32), lengths)

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        ok = q_idx >= kv_idx if problem.causal else q_idx == q_idx
        if left is not None:
            ok = ok & (q_idx - kv_idx <= left)
        if right is not None:
            ok = ok & (kv_idx - q_idx <= right)
        if document_id is not None:
            ok = ok & (document_id[q_idx] == document_id[kv_idx])
        return ok

    return mask_mod


def flex_kv_blocks(block_mask: BlockMask, causal: bool = False) -> tuple[Any, Any, Any, Any]:
    """FlexAttention's ``BlockMask.from_kv_blocks`` arguments for our block mask, as numpy int32 arrays shaped
    (1, 1, T_r) and (1, 1, T_r, T_c) (one mask for every batch row and head): ``kv_num_blocks``, ``kv_indices`` of
    the partial blocks (those kept that the causal mask cuts, or that pass the end of N: the ``mask_mod`` applies to
    them) and ``full_kv_num_blocks``, ``full_kv_indices`` of the full ones (kept and wholly visible: no ``mask_mod``).
    Each row of indices lists its blocks in ascending order, then the others (ascending; FlexAttention reads only the
    first ``num`` of them). A kept block with no visible element (above the diagonal) is in neither: FlexAttention
    skips it, as ours do. Built from :func:`iokernels.bench.configs.block_areas`, the areas the FLOPs count."""
    import numpy as np

    areas = block_areas(block_mask, causal)
    kept = block_mask.blocks
    full = kept & (areas == block_mask.block_q * block_mask.block_k)
    partial = kept & (areas > 0) & ~full

    def listed(grid: Any) -> tuple[Any, Any]:
        order = np.argsort(~grid, axis=1, kind="stable").astype(np.int32)  # the chosen first, each part ascending
        return grid.sum(axis=1).astype(np.int32)[None, None], order[None, None]

    return (*listed(partial), *listed(full))


def flex_block_mask(problem: Problem, device: str = "cuda") -> Any:
    """FlexAttention's BlockMask of the problem's block mask (:func:`flex_kv_blocks`), BLOCK_SIZE the mask's blocks,
    the causal ``mask_mod`` (:func:`flex_mask_mod`) on the partial blocks when causal: no per-element mask for the
    block sparsity itself."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask as FlexBlockMask

    bm = problem.block_mask
    if bm is None:
        raise ValueError("flex_block_mask needs a problem with a block mask")
    num, idx, full_num, full_idx = (torch.as_tensor(a, device=device)
                                    for a in flex_kv_blocks(bm, problem.causal))
    return FlexBlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=(bm.block_q, bm.block_k),
                                        mask_mod=flex_mask_mod(problem, device), seq_lengths=(bm.n_q, bm.n_k))


def flex_score_mod(problem: Problem, device: str = "cuda") -> Callable[..., Any] | None:
    """FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx)`` for the problem's softcap or ALiBi, None without
    either (FlexAttention's score is already scaled, scale·q·kᵀ). A softcap c: ``c * tanh(score / c)``, ours'
    c·tanh(scale·q·kᵀ/c). ALiBi: ``score - slopes[h] * |kv_idx - q_idx - (N_k - N_q)|`` (FlashAttention-2's bias,
    the bottom-right offset; 0 here, N_q = N_k), ``slopes`` the problem's
    (:attr:`iokernels.bench.configs.Problem.alibi_slopes`) as a float32 tensor on ``device``, made here once per
    problem. Both at once is no workload of ours: ValueError."""
    slopes = problem.alibi_slopes
    if problem.attn_mask == "additive":  # alone (bench --attn-mask takes no softcap or ALiBi)
        mask = explicit_mask(problem, device)
        return lambda score, b, h, q_idx, kv_idx: score + mask[b, h, q_idx, kv_idx]
    if problem.softcap is not None and slopes is not None:
        raise ValueError("a softcap and ALiBi together: ours take one or the other")
    if problem.softcap is None and slopes is None:
        return None
    import torch

    if slopes is None:
        c = float(problem.softcap)
        return lambda score, b, h, q_idx, kv_idx: c * torch.tanh(score / c)
    table = torch.tensor(slopes, device=device, dtype=torch.float32)
    offset = problem.n - problem.n  # N_k - N_q: the bench's problems are square

    def alibi(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return score - table[h] * (kv_idx - q_idx - offset).abs()

    return alibi
