"""How each plan stage becomes a compiled kernel: source file, template instantiation, defines.

This is the contract between plans and CUDA sources. Tile sizes reach a kernel only as defines
made here from the plan (``BM``, ``BR``, ``HEAD_D``, ``SMEM_<BUFFER>`` offsets, ``SMEM_BYTES``...);
the sources never write a tile size down. Importing this module needs neither cupy nor NVRTC.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import Plan, Stage
from ..plan.tensors import TENSOR_INDEX

CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}

# stage.kernel -> (source file, template name)
SOURCES: dict[str, tuple[str, str]] = {
    "gemm": ("gemm.cu", "gemm"),
    "rowmax": ("rowwise.cu", "rowmax"),
    "rowsum": ("rowwise.cu", "rowsum"),
    "normalize": ("rowwise.cu", "normalize"),
    "rowdot": ("rowwise.cu", "rowdot"),
    "ds": ("rowwise.cu", "ds"),
    "flash_init": ("rowwise.cu", "flash_init"),
    "flash_finalize": ("rowwise.cu", "flash_finalize"),
    "flash_bwd_prep": ("rowwise.cu", "flash_bwd_prep"),
    "flash_bwd_dq": ("rowwise.cu", "flash_bwd_dq"),
    "flash_q_outer": ("flash_fwd.cu", "flash_q_outer"),
    "flash_kv_outer": ("flash_fwd.cu", "flash_kv_outer"),
    "two_pass_stats_store": ("two_pass.cu", "two_pass_stats"),
    "two_pass_stats_recompute": ("two_pass.cu", "two_pass_stats"),
    "two_pass_store_output": ("two_pass.cu", "two_pass_store_output"),
    "two_pass_recompute_output": ("two_pass.cu", "two_pass_recompute_output"),
    "flash_bwd_kv_outer": ("flash_bwd.cu", "flash_bwd_kv_outer"),
    "flash_tc_fwd": ("flash_tc.cu", "flash_tc_fwd"),
    "flash_tc_bwd": ("flash_tc_bwd.cu", "flash_tc_bwd"),
    "flash_tc_bwd_dkdv": ("flash_tc_bwd.cu", "flash_tc_bwd_dkdv"),
    "flash_tc_bwd_dq": ("flash_tc_bwd.cu", "flash_tc_bwd_dq"),
    "flash_wgmma_fwd": ("flash_wgmma.cu", "flash_wgmma_fwd"),
    "flash_tma_fwd": ("flash_tma.cu", "flash_tma_fwd"),
    "flash_tma_split": ("flash_tma.cu", "flash_tma_fwd"),  # built with SPLIT: the split-KV decode's partials
    "flash_combine": ("combine.cu", "flash_combine"),
    "kv_append": ("kvcache.cu", "kv_append"),
    "flash_wgmma_bwd": ("flash_wgmma_bwd.cu", "flash_wgmma_bwd"),
    "flash_tma_bwd": ("flash_tma_bwd.cu", "flash_tma_bwd"),
    "flash_tma_bwd_wide": ("flash_tma_bwd.cu", "flash_tma_bwd"),  # built with a tile width past 128
}
# kernels that stream whole rows, one block over ROWS_PER_BLOCK rows (no attention tiles)
ROWWISE = frozenset(k for k, (source, _) in SOURCES.items() if source == "rowwise.cu")

# standard attention's matrix products: stage -> (TRANS_A, TRANS_B, tensor A, tensor B, tensor C)
# C (m x n) = alpha * A (m x k) B (k x n); TRANS_A: A is stored (k x m); TRANS_B: B is stored (n x k)
GEMMS: dict[str, tuple[int, int, str, str, str]] = {
    "qk": (0, 1, "Q", "K", "S"),
    "pv": (0, 0, "P", "V", "O"),
    "dv": (1, 0, "P", "dO", "dV"),
    "dp": (0, 1, "dO", "V", "dP"),
    "dq": (0, 0, "dS", "K", "dQ"),
    "dk": (1, 0, "dS", "Q", "dK"),
}


@dataclass(frozen=True)
class KernelRef:
    """One kernel of one stage: compile ``source`` with ``defines``, look up ``name_expression``."""

    source: str
    defines: tuple[tuple[str, int | str], ...]
    name_expression: str

    @property
    def define_dict(self) -> dict[str, int | str]:
        return dict(self.defines)


def smem_defines(stage: Stage) -> dict[str, int]:
    out = {f"SMEM_{name.upper()}": offset for name, offset, _ in stage.smem}
    out["SMEM_BYTES"] = stage.smem_bytes
    return out


def stage_defines(plan: Plan, stage: Stage) -> dict[str, int | str]:
    tile = plan.tile
    defines: dict[str, int | str] = {"THREADS": stage.threads, **smem_defines(stage), **dict(stage.params)}
    if stage.kernel == "gemm":
        defines.update(BM=tile["BM"], BN=tile["BN"], BK=tile["BK"])
    elif "Br" in tile and stage.kernel not in ROWWISE:
        defines.update(HEAD_D=plan.d, BR=tile["Br"], BC=tile["Bc"])
    return defines


def kernel_ref(plan: Plan, stage: Stage) -> KernelRef:
    source, template = SOURCES[stage.kernel]
    ctype = CTYPES[plan.dtype]
    if stage.kernel == "gemm":
        ta, tb, a, b, c = GEMMS[stage.name]
        args = f"{ctype}, {ta}, {tb}, {TENSOR_INDEX[a]}, {TENSOR_INDEX[b]}, {TENSOR_INDEX[c]}"
    elif stage.kernel.startswith("two_pass_stats_"):
        args = f"{ctype}, {int(stage.kernel.endswith('store'))}"
    else:
        args = ctype
    defines = stage_defines(plan, stage)
    return KernelRef(source, tuple(sorted(defines.items())), f"{template}<{args}>")


def plan_kernels(plan: Plan) -> list[tuple[Stage, KernelRef]]:
    return [(stage, kernel_ref(plan, stage)) for stage in plan.stages]
