"""Tensor-core FlashAttention forward for float16 / bfloat16 (issue #5, in progress).

``make_fast_plan`` builds the plan of ``kernels/flash_tc.cu``: the FlashAttention-2 loop order of
``flash/q_outer`` (so the model's exact bytes and the simulator of that schedule apply unchanged),
with the kernel's own tiles (B_r = B_c = 64, 4 warps of 16 query rows, K and V double-buffered). Its
effective M is the shared memory those buffers take, recorded as the plan's ``sram_bytes``.

Not yet: a schedule name of its own in ``SCHEDULES`` (so ``compare`` and the CLI list it), the
library default, backward, grouped-query attention, ``iokernels bench``.
"""

from __future__ import annotations

from .plan import Plan, Stage, _cdiv, _layout, _layout_bytes, check_problem
from .units import itemsize

FAST_DTYPES = ("float16", "bfloat16")
FAST_HEAD_DIMS = (64, 128)
FAST_BR = FAST_BC = 64
FAST_THREADS = 32 * FAST_BR // 16
FAST_KERNEL = "flash_tc_fwd"


def fast_buffers(d: int, e: int) -> list[tuple[str, int]]:
    """Shared memory of flash_tc_fwd: Q_i, and two stages of K_j and V_j."""
    tile = FAST_BC * d * e
    return [("Q", FAST_BR * d * e), ("K0", tile), ("K1", tile), ("V0", tile), ("V1", tile)]


def make_fast_plan(*, N_q: int, N_k: int | None = None, d: int, dtype: str, batch: int = 1,
                   heads: int = 1) -> Plan:
    """The plan of the tensor-core forward kernel for one problem (ValueError when unsupported)."""
    N_k = N_q if N_k is None else N_k
    dtype = check_problem(N_q, N_k, d, dtype, batch, heads)
    if dtype not in FAST_DTYPES:
        raise ValueError(f"the tensor-core path takes {' or '.join(FAST_DTYPES)}, got {dtype}")
    if d not in FAST_HEAD_DIMS:
        raise ValueError(f"the tensor-core path takes d in {FAST_HEAD_DIMS}, got d={d}")
    buffers = fast_buffers(d, itemsize(dtype))
    tr, tc = _cdiv(N_q, FAST_BR), _cdiv(N_k, FAST_BC)
    stage = Stage("main", FAST_KERNEL, (tr, 1, batch * heads), FAST_THREADS, _layout(buffers))
    return Plan(algorithm="flash", schedule="q_outer", direction="fwd", N_q=N_q, N_k=N_k, d=d, dtype=dtype,
                sram_bytes=_layout_bytes(buffers), batch=batch, heads=heads,
                tiles=(("Br", FAST_BR), ("Bc", FAST_BC), ("Tr", tr), ("Tc", tc)), stages=(stage,))
