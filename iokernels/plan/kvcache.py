"""A decode plan's key/value cache (issue #23): each sequence of the batch has its own length (``cache_seqlens``,
read by the kernels from device memory at run time) in a contiguous cache of capacity N_k, (batch, kv_heads, N_k, d),
or in a paged pool (pages, kv_heads, page_size, d) that a page table (batch, max_pages) of int32 page numbers maps:
key n of sequence b is row n % page_size of page page_table[b, n // page_size] (vLLM's and FlashInfer's block
tables; FlashInfer's HND page layout, heads before rows, as our (..., N, d) tensors). The lengths are values for the
model and the simulator only: the kernels, the grid and the split count depend on the capacity alone, so one launch
serves every set of lengths (a plan without them launches; the model then has no exact bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PAGE_SIZES = (8, 16, 32, 64, 128, 256)  # rows per page: a power of two (a page's rows are whole 8-row swizzle atoms)


@dataclass(frozen=True)
class KvCache:
    """``lengths``: the keys of each sequence (0 .. N_k), or None where unknown (a launch plan); ``page_size`` 0 for a
    contiguous cache, else the rows per page (:data:`PAGE_SIZES`) of a pool of ``pages`` pages; ``append``: new keys
    and values per sequence (Knew, Vnew: (batch·kv_heads, append, d)) that the step first writes into the cache after
    each sequence's keys, then attends to with them (FlashAttention's flash_attn_with_kvcache(k=, v=))."""

    lengths: tuple[int, ...] | None = None
    page_size: int = 0
    pages: int = 0
    append: int = 0

    def keys(self, length: int) -> int:
        """The keys a sequence of ``length`` cached keys attends to: with the appended ones."""
        return length + self.append

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    def max_pages(self, n_k: int) -> int:
        """The page table's columns: the pages of a sequence of the capacity N_k."""
        return -(-n_k // self.page_size)


def make_kv_cache(*, batch: int, n_k: int, lengths: Sequence[int] | np.ndarray | None = None, page_size: int = 0,
                  pages: int = 0, append: int = 0) -> KvCache:
    """A checked :class:`KvCache` for ``batch`` sequences of capacity ``n_k``: ``lengths`` ints in [0, n_k − append]
    (one per sequence; None: unknown), ``page_size`` 0 or one of :data:`PAGE_SIZES`, ``pages`` the pool's pages
    (paged: at least one), ``append`` the new keys per sequence (an int >= 0, at most n_k)."""
    if isinstance(append, bool) or not isinstance(append, int) or not 0 <= append <= n_k:
        raise ValueError(f"append must be an int in [0, {n_k}] (new keys per sequence), got {append!r}")
    if lengths is not None:
        values = [int(x) for x in np.asarray(lengths).reshape(-1)] if not isinstance(lengths, (str, bytes)) else None
        top = n_k - append
        if values is None or len(values) != batch or any(not 0 <= x <= top for x in values):
            raise ValueError(f"cache lengths must be {batch} ints in [0, {top}] (one per sequence, room for {append} "
                             f"new keys in a capacity of {n_k}), got {lengths!r}")
        lengths = tuple(values)
    if page_size:
        if page_size not in PAGE_SIZES:
            raise ValueError(f"page_size must be one of {PAGE_SIZES}, got {page_size!r}")
        if not isinstance(pages, int) or pages < 1:
            raise ValueError(f"a paged cache needs its pool's page count (an int >= 1), got {pages!r}")
    elif pages:
        raise ValueError(f"pages={pages!r} without a page_size: a contiguous cache has no pool")
    return KvCache(lengths, page_size, pages, append)
