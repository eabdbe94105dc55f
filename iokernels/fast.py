"""Tensor-core FlashAttention forward for float16 / bfloat16 (issue #5, in progress).

``make_fast_plan`` builds the plan of ``kernels/flash_tc.cu``, the schedule ``flash/fast``: the
FlashAttention-2 loop order of ``flash/q_outer`` (so the model's exact bytes and the simulator of that
schedule apply unchanged), with the kernel's own tiles (B_r = B_c = 64, 4 warps of 16 query rows, K
and V double-buffered). Its effective M is the shared memory those buffers take (``plan.smem_bytes``);
``make_plan("flash", "fast", ...)`` requires it to fit the M given, like every plan.

Not yet: the library default, backward, grouped-query attention.
"""

from __future__ import annotations

from .plan import Plan, Stage, Unsupported, _cdiv, _layout, _layout_bytes, check_problem
from .units import itemsize

FAST_DTYPES = ("float16", "bfloat16")
FAST_HEAD_DIMS = (64, 128)
FAST_BR = FAST_BC = 64
FAST_THREADS = 32 * FAST_BR // 16
FAST_KERNEL = "flash_tc_fwd"
# (d, B_r, B_c) tile variants that compile without spills, timed by scripts/fast_probe.py
FAST_TUNING = ((64, 128, 64), (128, 128, 64), (64, 128, 128), (64, 64, 128))


def fast_buffers(d: int, e: int, block_r: int = FAST_BR, block_c: int = FAST_BC) -> list[tuple[str, int]]:
    """Shared memory of flash_tc_fwd: Q_i, and two stages of K_j and V_j."""
    tile = block_c * d * e
    return [("Q", block_r * d * e), ("K0", tile), ("K1", tile), ("V0", tile), ("V1", tile)]


def make_fast_plan(*, N_q: int, N_k: int | None = None, d: int, dtype: str, batch: int = 1,
                   heads: int = 1, block_r: int = FAST_BR, block_c: int = FAST_BC) -> Plan:
    """The plan of the tensor-core forward kernel for one problem (:class:`iokernels.plan.Unsupported`,
    a ValueError, when the kernel does not take the problem).

    ``block_r`` (a multiple of 16, 16 rows per warp) and ``block_c`` (a multiple of 16) override the
    tiles, for tuning."""
    N_k = N_q if N_k is None else N_k
    dtype = check_problem(N_q, N_k, d, dtype, batch, heads)
    if dtype not in FAST_DTYPES:
        raise Unsupported(f"flash/fast (tensor cores) takes {' or '.join(FAST_DTYPES)}, got {dtype}")
    if d not in FAST_HEAD_DIMS:
        raise Unsupported(f"flash/fast (tensor cores) takes d in {FAST_HEAD_DIMS}, got d={d}")
    for name, value, top in (("block_r", block_r, 256), ("block_c", block_c, 128)):
        if not isinstance(value, int) or value % 16 or not 16 <= value <= top:
            raise ValueError(f"{name} must be a multiple of 16 from 16 to {top}, got {value!r}")
    buffers = fast_buffers(d, itemsize(dtype), block_r, block_c)
    tr, tc = _cdiv(N_q, block_r), _cdiv(N_k, block_c)
    stage = Stage("main", FAST_KERNEL, (tr, 1, batch * heads), 32 * block_r // 16, _layout(buffers))
    return Plan(algorithm="flash", schedule="fast", direction="fwd", N_q=N_q, N_k=N_k, d=d, dtype=dtype,
                sram_bytes=_layout_bytes(buffers), batch=batch, heads=heads,
                tiles=(("Br", block_r), ("Bc", block_c), ("Tr", tr), ("Tc", tc)), stages=(stage,))
