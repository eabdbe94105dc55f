"""Run plans on the GPU through cupy: compile (memoized per device), allocate, launch, count, time.

One launcher for every algorithm: each plan stage names its kernel (``kernels/stages.py``), and :data:`ARGS` below
names its arguments; grids, threads and shared memory come from the plan. bfloat16 lives in cupy as ``uint16`` bits.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import numpy as np

from ..plan import FLOAT32_TENSORS, Plan, Stage, band_offsets, check_runnable, plan_arrays
from ..plan.core import INT32_TENSORS
from ..plan.decode import DECODE_VARIANTS, packed_rows
from ..plan.fast_bwd import FAST_BWD_ARGS
from ..plan.mods import MAX_CAPTURES, MOD_DEFINES, capture_buffer, capture_inputs, captures_of, mask_layout
from ..plan.tensors import (
    APPEND_TENSORS,
    CACHE_TENSORS,
    DIMS,
    NUM_TENSORS,
    SPLIT_TENSORS,
    TENSORS,
    VARLEN_TENSORS,
    Counts,
)
from ..simulate import KV_TENSORS, make_inputs, reference
from . import rawlaunch, tensormap
from .runtime import cubin_cache_dir, require_cupy
from .sources import COUNTER_SLOTS, SOURCE_ARCHS, build_source
from .stages import GEMMS, KernelRef, kernel_ref

# kernel -> its arguments before the counters: tensor names, or n_q / n_k / d / scale
ARGS: dict[str, tuple[str, ...]] = {
    "rowmax": ("S", "m", "n_k", "n_q"),
    "rowsum": ("S", "m", "l", "n_k", "n_q"),
    "normalize": ("S", "m", "l", "P", "n_k", "n_q"),
    "rowdot": ("P", "dP", "D", "n_k", "n_q"),
    "ds": ("P", "dP", "D", "dS", "n_k", "n_q"),
    "flash_init": ("Oacc", "m", "l", "d", "n_q"),
    "flash_finalize": ("Oacc", "O", "d", "n_q"),
    "flash_bwd_prep": ("dO", "O", "D", "dQacc", "d", "n_q"),
    "flash_bwd_dq": ("dQacc", "dQ", "d", "n_q"),
    "flash_q_outer": ("Q", "K", "V", "O", "lse", "n_q", "n_k", "scale"),
    "flash_kv_outer": ("Q", "K", "V", "Oacc", "m", "l", "n_q", "n_k", "scale"),
    "flash_tc_fwd": ("Q", "K", "V", "O", "lse", "n_q", "n_k", "scale", "kv_group"),
    "flash_wgmma_fwd": ("Q", "K", "V", "O", "lse", "n_q", "n_k", "scale", "kv_group"),
    "flash_tma_fwd": ("map:Q", "map:K", "map:V", "O", "lse", "n_q", "n_k", "scale", "kv_group", "bh"),  # TMA maps
    "flash_tma_split": ("map:Q", "map:K", "map:V", "Opart", "lse_part", "n_q", "n_k", "scale", "kv_group", "bh"),
    "flash_combine": ("Opart", "lse_part", "O", "lse", "rows", "splits", "n_k"),
    "kv_append": ("Knew", "Vnew", "K", "V", "n_new", "n_k"),
    **FAST_BWD_ARGS,  # the tensor-core backward's kernels (iokernels.plan.fast_bwd)
    "two_pass_stats_store": ("Q", "K", "S", "m", "l", "n_q", "n_k", "scale"),
    "two_pass_stats_recompute": ("Q", "K", "null", "m", "l", "n_q", "n_k", "scale"),  # S is never written
    "two_pass_store_output": ("S", "m", "l", "V", "O", "n_q", "n_k"),
    "two_pass_recompute_output": ("Q", "K", "V", "m", "l", "O", "n_q", "n_k", "scale"),
    "flash_bwd_kv_outer": ("Q", "K", "V", "dO", "lse", "D", "dQacc", "dK", "dV", "n_q", "n_k", "scale"),
}
# gemm stage -> (M, N, K) of C = alpha A B, and whether alpha is the softmax scale
GEMM_SIZES: dict[str, tuple[str, str, str, bool]] = {
    "qk": ("n_q", "n_k", "d", True), "pv": ("n_q", "d", "n_k", False), "dv": ("n_k", "d", "n_q", False),
    "dp": ("n_q", "n_k", "d", False), "dq": ("n_q", "d", "n_k", True), "dk": ("n_k", "d", "n_q", True),
}

INPUTS = {"fwd": ("Q", "K", "V"), "bwd": ("Q", "K", "V", "O", "dO", "lse", "P")}
BF16_NAN = rawlaunch.NAN_WORDS[np.dtype(np.uint16)][0]  # bfloat16 NaN bits
# Fill every buffer a plan writes with NaN before it runs, so an element no kernel writes shows up as NaN:
# a debug switch (IOKERNELS_DEBUG_POISON=1, or set this flag), off by default since each fill is a kernel of
# its own on every call. The kernels write every element of their outputs and workspace (the GPU tests run
# with it on, tests/gpu/conftest.py); analysis/compare poisons its own runs, which it checks.
DEBUG_POISON = os.environ.get("IOKERNELS_DEBUG_POISON", "") not in ("", "0")


def storage_dtype(plan_dtype: str) -> np.dtype:
    return np.dtype({"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[plan_dtype])


def tensor_dtype(plan: Plan, name: str) -> np.dtype:
    if name in INT32_TENSORS:
        return np.dtype(np.int32)
    return np.dtype(np.float32) if name in FLOAT32_TENSORS else storage_dtype(plan.dtype)


# the tensors a launch allocates or takes by name: those of (batch*heads, ...) shapes, the split-KV decode's partials
# and its cache's lengths and page table, a variable-length batch's offsets
BUFFERS = (frozenset(DIMS) | frozenset(SPLIT_TENSORS) | frozenset(CACHE_TENSORS) | frozenset(APPEND_TENSORS)
           | frozenset(VARLEN_TENSORS))


def tensor_shape(plan: Plan, name: str) -> tuple[int, ...]:
    extent = {"q": plan.N_q, "k": plan.N_k, "d": plan.d}
    if name in SPLIT_TENSORS:  # one (batch*heads, N_q[, d]) float32 tensor per split
        return (plan.tile["S"] * plan.bh, plan.N_q, *((plan.d,) if name == "Opart" else ()))
    if plan.varlen is not None:  # packed: (total, heads, d) rows, (total, heads) row scalars, (batch + 1,) offsets
        if name in VARLEN_TENSORS:
            return (plan.batch + 1,)
        total = plan.varlen.total_k if DIMS[name][0] == "k" else plan.varlen.total_q
        heads = plan.kv_heads if name in KV_TENSORS else plan.heads
        rows = (heads, total) if plan.varlen.head_major else (total, heads)  # head-major: (heads, total, d)
        return (*rows, *((plan.d,) if DIMS[name][-1] == "d" else ()))
    cache = plan.kv_cache
    if name in CACHE_TENSORS:  # a decode's cache: lengths (batch,), page table (batch, max_pages)
        return (plan.batch,) if name == "seqlens" else (plan.batch, cache.max_pages(plan.N_k))
    if name in APPEND_TENSORS:  # the keys and values appended first
        return (plan.bh_kv, cache.append, plan.d)
    if cache is not None and cache.paged and name in ("K", "V"):  # the pool: (pages·kv_heads, page_size, d)
        return (cache.pages * plan.kv_heads, cache.page_size, plan.d)
    rows = plan.bh_kv if name in KV_TENSORS else plan.bh  # grouped-query: fewer K/V heads
    return (rows, *(extent[x] for x in DIMS[name]))


def stage_tensors(stage: Stage) -> tuple[str, ...]:
    if stage.kernel == "gemm":
        return GEMMS[stage.name][2:]
    params = dict(stage.params)
    cache = (("seqlens",) * bool(params.get("RAGGED")) + ("page_table",) * bool(params.get("PAGED"))
             + VARLEN_TENSORS * bool(params.get("VARLEN")))
    return tuple(a.removeprefix("map:") for a in ARGS[stage.kernel] if a.removeprefix("map:") in BUFFERS) + cache


def copied_tensors(kernel: str) -> tuple[str, ...]:
    """The tensors a kernel takes as TMA maps ("map:" in ARGS): the copy engine reads (dQacc: and writes) them."""
    return tuple(a[4:] for a in ARGS.get(kernel, ()) if a.startswith("map:"))


def plan_tensors(plan: Plan) -> list[str]:
    seen: list[str] = []
    for stage in plan.stages:
        seen += [t for t in stage_tensors(stage) if t not in seen]
    return seen


# ---------------------------------------------------------------------------------------------
# dtype conversion on the device (bfloat16 as uint16 bits, round to nearest even)

def to_device(x: Any, dtype: str) -> Any:
    """A float array (numpy or cupy, any float dtype) as a cupy array of the plan's storage dtype."""
    cp = require_cupy()
    x32 = cp.asarray(x, dtype=cp.float32)
    if dtype != "bfloat16":
        return cp.ascontiguousarray(x32.astype(storage_dtype(dtype)))
    bits = x32.view(cp.uint32)
    rounded = (bits + cp.uint32(0x7FFF) + ((bits >> 16) & cp.uint32(1))) >> 16
    return cp.ascontiguousarray(rounded.astype(cp.uint16))


def to_float64(x: Any, dtype: str) -> np.ndarray:
    """A device array of storage dtype ``dtype`` as a float64 numpy array."""
    cp = require_cupy()
    if dtype == "bfloat16" and x.dtype == cp.uint16:
        x = (x.astype(cp.uint32) << 16).view(cp.float32)
    return cp.asnumpy(x).astype(np.float64)


def poison(x: Any, dtype: np.dtype) -> None:
    """Fill with NaN so an element no kernel writes fails the check."""
    if dtype == np.uint16:
        x.fill(BF16_NAN)
    else:
        x.fill(np.nan)


# ---------------------------------------------------------------------------------------------
# compilation, memoized per device

class ArchUnavailable(RuntimeError):
    """A kernel written for one architecture (``SOURCE_ARCHS``) was asked for on another GPU."""


def _nvrtc_cubin(code: str, name: str, arch: str, expression: str) -> tuple[bytes, str]:
    """Compile for a real architecture that cupy's own compile path does not take (``sm_90a``):
    NVIDIA's cuda.bindings NVRTC when installed, else cupy's binding of the same library."""
    options = ["-std=c++17", "-ftz=true"]  # cupy.RawModule compiles every other kernel with -ftz=true
    try:
        from .nvrtc import compile_to_cubin

        result = compile_to_cubin(code, arch=arch, name=name, name_expressions=[expression], extra_options=options)
        return result.cubin, result.lowered_names[expression]
    except ImportError:
        pass
    from cupy_backends.cuda.libs import nvrtc

    from .nvrtc import include_dirs

    prog = nvrtc.createProgram(code, name, (), ())
    try:
        nvrtc.addNameExpression(prog, expression)
        try:
            nvrtc.compileProgram(prog, (f"--gpu-architecture={arch}", *options,
                                        *(f"-I{d}" for d in include_dirs())))
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"NVRTC could not compile {name} for {arch}:\n{nvrtc.getProgramLog(prog)}") from exc
        return bytes(nvrtc.getCUBIN(prog)), nvrtc.getLoweredName(prog, expression)
    finally:
        nvrtc.destroyProgram(prog)


def _arch_function(cp: Any, ref: KernelRef, code: str, archs: tuple[str, ...]) -> Any:
    cc = cp.cuda.Device().compute_capability
    arch = f"sm_{cc}a"
    if arch not in archs:
        raise ArchUnavailable(f"{ref.source} ({ref.name_expression}) runs on {', '.join(archs)} only; "
                              f"this GPU is sm_{cc}")
    key = hashlib.sha256("\0".join((code, arch, ref.name_expression, cp.__version__)).encode()).hexdigest()
    folder = cubin_cache_dir()
    cubin_path, name_path = folder / f"{key}.cubin", folder / f"{key}.name"
    if not (cubin_path.is_file() and name_path.is_file()):
        cubin, mangled = _nvrtc_cubin(code, ref.source, arch, ref.name_expression)
        folder.mkdir(parents=True, exist_ok=True)
        for path, data in ((cubin_path, cubin), (name_path, mangled.encode())):
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)  # atomic: concurrent processes never see half a file
    module = cp.RawModule(path=str(cubin_path))
    return module.get_function(name_path.read_text())


@cache
def _function(ref: KernelRef, counting: bool, device_id: int, smem_bytes: int) -> Any:
    cp = require_cupy()
    with cp.cuda.Device(device_id):
        code = build_source(ref.source, ref.define_dict, counting)
        if ref.source in SOURCE_ARCHS:
            fn = _arch_function(cp, ref, code, SOURCE_ARCHS[ref.source])
        else:
            module = cp.RawModule(code=code, options=("-std=c++17",), name_expressions=[ref.name_expression])
            fn = module.get_function(ref.name_expression)
        if smem_bytes > 40 * 1024:  # above 48 KB with its static shared memory (mbarriers), a kernel must opt in
            fn.max_dynamic_shared_size_bytes = smem_bytes
    return fn


def kernel_function(plan: Plan, stage: Stage, counting: bool) -> Any:
    cp = require_cupy()
    return _function(kernel_ref(plan, stage), counting, cp.cuda.Device().id, stage.smem_bytes)


def compile_plan(plan: Plan, counting: bool = False) -> None:
    for stage in plan.stages:
        kernel_function(plan, stage, counting)


# ---------------------------------------------------------------------------------------------
# launching

@dataclass
class GpuRun:
    plan: Plan
    buffers: dict[str, Any]
    counts: Counts | None = None
    workspace_bytes: int = 0
    raw: rawlaunch.RawPlan | None = None  # the plain build's prepared launches, for the next run


@dataclass
class _IoLog:
    records: list[dict] = field(default_factory=list)


_IO_LOGS: list[_IoLog] = []


@contextlib.contextmanager
def count_io() -> Iterator[list[dict]]:
    """Inside this block every launch uses the counting build; yields the list of records, one per
    kernel launch and tensor: ``{"plan", "stage", "kernel", "tensor", "read_bytes", "write_bytes"}``."""
    log = _IoLog()
    _IO_LOGS.append(log)
    try:
        yield log.records
    finally:
        _IO_LOGS.remove(log)


def counting_active() -> bool:
    return bool(_IO_LOGS)


def stage_arg_layout(plan: Plan, stage: Stage, scale: float) -> tuple[tuple[Any, ...], bool]:
    """A stage's kernel arguments before the counters, decided by the plan alone: buffer names (str: the
    tensor of that name at launch) and values, and whether the four dropout arguments follow them (they
    come last, from the call's Dropout: threshold, keep scale, seed, offset; common.cuh IOK_DROPOUT_PARAM)."""
    check_runnable(plan)
    values = {"n_q": np.int32(plan.N_q), "n_k": np.int32(plan.N_k), "d": np.int32(plan.d),
              "scale": np.float32(scale), "null": np.uint64(0),
              "kv_group": np.int32(plan.heads // plan.kv_heads), "bh": np.int32(plan.bh),
              "n_new": np.int32(plan.kv_cache.append if plan.kv_cache is not None else 0)}
    if plan.variant in DECODE_VARIANTS:  # the main kernel sees a K/V head's query heads as one head of g·N_q rows
        values.update(n_q=np.int32(packed_rows(plan)), kv_group=np.int32(1), bh=np.int32(plan.bh_kv),
                      rows=np.int32(plan.bh * plan.N_q), splits=np.int32(plan.tile["S"]))
    if plan.varlen is not None:  # the kernels' n_q, n_k: the packed rows; bh: the heads of a packed row
        values.update(n_q=np.int32(plan.varlen.total_q), n_k=np.int32(plan.varlen.total_k), bh=np.int32(plan.heads))
    params = dict(stage.params)
    if stage.kernel == "gemm":
        _, _, a, b, c = GEMMS[stage.name]
        m, n, k, scaled = GEMM_SIZES[stage.name]
        args = [a, b, c, values[m], values[n], values[k], np.float32(scale if scaled else 1.0)]
        if params.get("MASK"):  # qk: the explicit mask, before the dropout arguments (common.cuh)
            args.append("mask")
        return tuple(args), bool(params.get("DROPOUT"))  # pv, dv: the dropped P
    tiles = dict(plan.tiles)
    args = [a if a in BUFFERS else _map_arg(plan, a[4:], tiles) if a.startswith("map:") else values[a]
            for a in ARGS[stage.kernel]]
    if params.get("BLOCK_SPARSE"):  # the block mask, before the counters (docs/KERNELS.md)
        args.append("block_mask")
    if params.get("MASK"):  # the explicit mask, after the block mask (common.cuh)
        args.append("mask")
    if params.get("WINDOW"):  # the band's offsets, after the masks (common.cuh); unbounded (or past N): ±2^30
        lo, hi, big = *band_offsets(plan.N_q, plan.N_k, plan.causal, plan.window), 1 << 30
        args += [np.int32(-big if lo is None else max(lo, -big)), np.int32(big if hi is None else min(hi, big))]
    if params.get("SOFTCAP"):  # the softcap, after the window (common.cuh IOK_SOFTCAP_PARAM)
        args.append(np.float32(plan.softcap))
    if params.get("ALIBI"):  # ALiBi's slopes, after the softcap (common.cuh IOK_ALIBI_PARAM)
        args.append("alibi")
    if any(params.get(k) for k in MOD_DEFINES):  # heads and captures, after ALiBi (IOK_MOD_PARAM)
        caps = [capture_buffer(name) for name, _ in plan.mods.captures]
        args += [np.int32(plan.heads), *caps, *[np.uint64(0)] * (MAX_CAPTURES - len(caps))]
        if params.get("MOD_TMA"):  # the staged read's tensor map, last of them (IOK_MOD_PARAM)
            *layout, dtype = mask_layout(plan, params["MOD_STAGE"], params["MOD_STAGE_T"])
            args.append(tensormap.MapArg(caps[int(params["MOD_STAGE_SLOT"])], dtype, 0, 0, 0, 0, layout=tuple(layout)))
    if params.get("RAGGED"):  # a decode's cache, after the window (common.cuh IOK_CACHE_PARAM)
        args += ["seqlens", np.int32(plan.batch), np.int32(plan.kv_cache.append)]
    if params.get("PAGED"):
        args += ["page_table", np.int32(plan.kv_cache.max_pages(plan.N_k))]
    if params.get("VARLEN"):  # a variable-length batch's offsets, after the cache (common.cuh IOK_VARLEN_PARAM)
        args += list(VARLEN_TENSORS)
    if params.get("PACKED_CAUSAL"):  # the decode's causal mask on packed rows: the queries per head (flash_tma.cu)
        args.append(np.int32(plan.N_q))
    if params.get("ITEM_LIST"):  # a persistent grid's list of items, last (common.cuh IOK_WORK_PARAM)
        args.append("work")
    return tuple(args), bool(params.get("DROPOUT"))


def _map_arg(plan: Plan, name: str, tiles: dict[str, int]) -> tensormap.MapArg:
    """The TMA map of tensor ``name``: boxes of B_r rows for Q and dO, B_c for K and V, 64 for dQacc (float32); a
    decode plan's Q as (batch·K/V heads, g·N_q, d), its packed rows."""
    rows = tiles["Br"] if name in ("Q", "dO") else 64 if name == "dQacc" else tiles["Bc"]
    dtype = "float32" if name in FLOAT32_TENSORS else plan.dtype
    if plan.varlen is not None and not plan.varlen.head_major:  # packed (total, heads, d)
        n, bh, d = tensor_shape(plan, name)
        return tensormap.MapArg(name, dtype, bh, n, d, rows, packed=True)
    bh, n, d = tensor_shape(plan, name)
    if name == "Q" and plan.variant in DECODE_VARIANTS:
        bh, n = plan.bh_kv, packed_rows(plan)
    if plan.kv_cache is not None and plan.kv_cache.paged and name in ("K", "V"):  # a box per page, at most B_c rows
        rows = min(rows, plan.kv_cache.page_size)
    return tensormap.MapArg(name, dtype, bh, n, d, rows)


def resolve_args(layout: tuple[Any, ...], dropout: bool, buffers: dict[str, Any], plan_dropout: Any) -> list[Any]:
    """The arguments of :func:`stage_arg_layout`'s layout with the buffers and the plan's Dropout filled in."""
    args = [buffers[a] if a.__class__ is str else a for a in layout]
    if dropout:
        args.extend(plan_dropout.kernel_args())
    return args


def _stage_args(plan: Plan, stage: Stage, buffers: dict[str, Any], scale: float) -> list[Any]:
    return resolve_args(*stage_arg_layout(plan, stage, scale), buffers, plan.dropout)


def allocate(plan: Plan, inputs: dict[str, Any], *, poison_outputs: bool | None = None
             ) -> tuple[dict[str, Any], int]:
    """Device buffers for every tensor the plan touches; inputs are used as given (checked). The other
    buffers are left unwritten (every kernel writes all of its outputs and workspace; the sanitizer's
    initcheck sees a kernel that reads what it never wrote), or filled with NaN first when
    ``poison_outputs`` is True (None: :data:`DEBUG_POISON`)."""
    poison_outputs = DEBUG_POISON if poison_outputs is None else poison_outputs
    cp = require_cupy()
    pool = cp.get_default_memory_pool()
    before = pool.used_bytes()
    buffers: dict[str, Any] = {}
    for name in plan_tensors(plan):
        shape, dtype = tensor_shape(plan, name), tensor_dtype(plan, name)
        if name in inputs:
            x = inputs[name]
            if tuple(x.shape) != shape or x.dtype != dtype or not x.flags.c_contiguous:
                raise ValueError(f"input {name}: expected a C-contiguous {dtype} array of shape {shape}, "
                                 f"got {x.dtype} {tuple(x.shape)}")
            buffers[name] = x
        else:
            buffers[name] = cp.empty(shape, dtype=dtype)
            if poison_outputs:
                poison(buffers[name], dtype)
    workspace = pool.used_bytes() - before
    buffers.update(plan_constants(plan))
    if plan.mask is not None:  # an explicit mask: an input, (1 or batch*heads, N_q, N_k) of uint8 or float32
        shape = plan.mask.shape(plan.bh, plan.N_q, plan.N_k)
        x = inputs.get("mask")
        if x is None or tuple(x.shape) != shape or x.dtype != plan.mask.dtype or not x.flags.c_contiguous:
            got = "none" if x is None else f"{x.dtype} {tuple(x.shape)}"
            raise ValueError(f"input mask: expected a C-contiguous {plan.mask.dtype} array of shape {shape}, "
                             f"got {got}")
        buffers["mask"] = x
    if plan.mods is not None:  # a variant's captured arrays: inputs
        buffers.update(capture_inputs(plan.mods, inputs))
    return buffers, workspace


def plan_constants(plan: Plan) -> dict[str, Any]:
    """The device arrays that are part of a plan (:func:`iokernels.plan.plan_arrays`)."""
    cp = require_cupy()
    return {name: cp.asarray(x) for name, x in plan_arrays(plan).items()}


def launch_stage(plan: Plan, stage: Stage, buffers: dict[str, Any], scale: float, counting: bool,
                 counters: Any = None) -> None:
    fn = kernel_function(plan, stage, counting)
    layout, dropout = stage_arg_layout(plan, stage, scale)
    dependent = bool(dict(stage.params).get("PDL"))
    if dependent or any(isinstance(a, tensormap.MapArg) for a in layout):  # maps, PDL: through the driver
        args, pointers = raw_args(layout, buffers)
        stage_raw = rawlaunch.RawStage(fn, require_cupy().cuda.Device().id, stage.grid, (stage.threads,),
                                       stage.smem_bytes, args, dropout, dependent)
        stage_raw.launch(pointers, current_stream(), plan.dropout, counters.data.ptr if counting else 0)
        return
    args = _stage_args(plan, stage, buffers, scale)
    fn(stage.grid, (stage.threads,), (*args, counters if counting else np.uint64(0)),
       shared_mem=stage.smem_bytes)


def raw_args(layout: tuple[Any, ...], buffers: dict[str, Any]) -> tuple[list[Any], list[int]]:
    """A layout's arguments for a RawStage (buffer names as indices into the returned addresses, maps with
    theirs) and those addresses, from ``buffers``."""
    index: dict[str, int] = {}
    pointers: list[int] = []

    def ref(name: str) -> int:
        if name not in index:
            index[name] = len(pointers)
            pointers.append(buffers[name].data.ptr)
        return index[name]

    args = [ref(a) if a.__class__ is str else replace(a, buffer=ref(a.buffer)) if isinstance(a, tensormap.MapArg)
            else a for a in layout]
    return args, pointers


WORKSPACE_ALIGN = 256  # bytes: each workspace tensor's offset in the one block a fast call allocates for them


def prepare_raw(plan: Plan, scale: float, inputs: tuple[str, ...], shapes: dict[str, tuple[int, ...]] | None = None,
                outputs: tuple[str, ...] | None = None) -> rawlaunch.RawPlan:
    """``plan``'s :class:`.rawlaunch.RawPlan` at ``scale`` on the current device (compiling what is not yet): ``inputs``
    the names of the caller's input tuple ("mask" for an explicit mask), ``outputs`` the tensors a run returns
    (default: every one it writes; the rest is workspace), ``shapes`` the shape each is returned in (default:
    the plan's; the same element count)."""
    cp = require_cupy()
    device = cp.cuda.Device().id
    tensors = plan_tensors(plan)
    captured = () if plan.mods is None else {capture_buffer(n) for n, _ in plan.mods.captures}
    read = [n for n in inputs if n in tensors or (n == "mask" and plan.mask is not None) or n in captured]
    written = [n for n in tensors if n not in read]
    returned = [n for n in written if outputs is None or n in outputs]
    scratch = [n for n in written if n not in returned]
    constants = plan_constants(plan)
    names = (*read, *returned, *scratch, *constants)
    index = {n: i for i, n in enumerate(names)}
    allocations = []
    for n in returned:
        shape = tensor_shape(plan, n) if shapes is None or n not in shapes else tuple(shapes[n])
        if math.prod(shape) != math.prod(tensor_shape(plan, n)):
            raise ValueError(f"{n}: shape {shape} does not hold the plan's {tensor_shape(plan, n)}")
        allocations.append((shape, tensor_dtype(plan, n)))
    workspace, offset = [], 0
    for n in scratch:
        elements, dtype = math.prod(tensor_shape(plan, n)), tensor_dtype(plan, n)
        workspace.append((offset, elements, dtype))
        offset += -(-elements * dtype.itemsize // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
    stages = []
    for stage in plan.stages:
        layout, dropout = stage_arg_layout(plan, stage, scale)
        args = [index[a] if a.__class__ is str else replace(a, buffer=index[a.buffer])
                if isinstance(a, tensormap.MapArg) else a for a in layout]
        stages.append(rawlaunch.RawStage(kernel_function(plan, stage, False), device, stage.grid, (stage.threads,),
                                         stage.smem_bytes, args, dropout, bool(dict(stage.params).get("PDL"))))
    return rawlaunch.RawPlan(names, tuple(inputs.index(n) for n in read), tuple(allocations), tuple(workspace), offset,
                   tuple(constants.values()), tuple(c.data.ptr for c in constants.values()), tuple(stages))


def current_stream() -> int:
    """cupy's current stream on the current device, as a raw handle."""
    return require_cupy().cuda.get_current_stream().ptr


def new_counters() -> Any:
    cp = require_cupy()
    return cp.zeros(COUNTER_SLOTS * 2 * NUM_TENSORS, dtype=cp.uint64)


def counts_from(raw: np.ndarray) -> dict[str, tuple[int, int]]:
    raw = raw.reshape(COUNTER_SLOTS, 2 * NUM_TENSORS).sum(axis=0, dtype=np.uint64)
    out = {}
    for i, tensor in enumerate(TENSORS):
        r, w = int(raw[2 * i]), int(raw[2 * i + 1])
        if r or w:
            out[tensor] = (r, w)
    return out


def run_plan(plan: Plan, inputs: dict[str, Any], *, counting: bool | None = None, scale: float | None = None,
             poison_outputs: bool | None = None, raw: rawlaunch.RawPlan | None = None) -> GpuRun:
    """Launch every stage of ``plan`` once. ``inputs``: device arrays (batch*heads, N, d) of the plan's storage
    dtype (see :func:`to_device`); outputs and workspace are allocated by :func:`allocate` (``poison_outputs``:
    filled with NaN first; None: :data:`DEBUG_POISON`). With ``counting`` (default: inside :func:`count_io`) the
    counting build runs and per-stage, per-tensor bytes come back in ``counts``. The plain build runs ``raw`` (from
    an earlier run's :attr:`GpuRun.raw`, prepared for this plan at this scale on this device, with ``inputs`` in
    its order) or prepares it. A sliding window on a plan whose kernels do not take it raises Unsupported."""
    check_runnable(plan)
    cp = require_cupy()
    counting = counting_active() if counting is None else counting
    scale = reference.default_scale(plan.d) if scale is None else scale
    buffers, workspace = allocate(plan, inputs, poison_outputs=poison_outputs)
    if not counting:
        raw = prepare_raw(plan, scale, tuple(inputs)) if raw is None else raw
        raw.launch([buffers[n].data.ptr for n in raw.names], current_stream(), plan.dropout)
        return GpuRun(plan, buffers, None, workspace, raw)
    counts: Counts | None = {} if counting else None
    for stage in plan.stages:
        counters = new_counters() if counting else None
        launch_stage(plan, stage, buffers, scale, counting, counters)
        if counting:
            counts[stage.name] = counts_from(cp.asnumpy(counters))
            for log in _IO_LOGS:
                for tensor, (r, w) in counts[stage.name].items():
                    log.records.append({"plan": plan.label, "stage": stage.name, "kernel": stage.kernel,
                                        "tensor": tensor, "read_bytes": r, "write_bytes": w})
    return GpuRun(plan, buffers, counts, workspace)


def plan_device_bytes(plan: Plan, exclude: tuple[str, ...] | set[str] = ()) -> int:
    """Device bytes of every tensor ``plan`` touches (:func:`allocate`), less ``exclude`` (inputs already there)."""
    return sum(math.prod(tensor_shape(plan, name)) * tensor_dtype(plan, name).itemsize
               for name in plan_tensors(plan) if name not in exclude)


def free_device_bytes() -> tuple[int, int]:
    """(free, total) bytes of the current device; free counts what cupy's pool holds unused."""
    cp = require_cupy()
    free, total = cp.cuda.runtime.memGetInfo()
    return free + cp.get_default_memory_pool().free_bytes(), total


def capture_plans(runs: list[tuple[Plan, dict[str, Any]]], scale: float) -> Any:
    """A CUDA graph of every stage of each ``(plan, buffers)`` in order (plain build), captured on a
    private stream; replay it with ``graph.launch(stream)`` on any stream. ``buffers`` as from
    :func:`allocate`: the graph reads and writes those addresses on every replay."""
    cp = require_cupy()
    for plan, _ in runs:
        compile_plan(plan)  # nothing may compile or load during capture
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            for plan, buffers in runs:
                for stage in plan.stages:
                    launch_stage(plan, stage, buffers, scale, False)
        finally:
            graph = stream.end_capture()
    return graph


# inputs and checks shared by tests, compare and benchmarks

def make_device_inputs(plan: Plan, seed: int = 0, magnitude: float = 1.0, scale: float | None = None,
                       captures: dict[str, np.ndarray] | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Random inputs on the device (storage dtype) and the same values as float64 on the host
    (:func:`iokernels.simulate.make_inputs` with ``rounded=True``); a variant's ``captures`` as given on both."""
    host = make_inputs(plan, seed, scale, magnitude=magnitude, rounded=True, captures=captures)
    device = {capture_buffer(n): require_cupy().asarray(x) for n, x in captures_of(plan.mods, host).items()}
    for name in (n for n in INPUTS[plan.direction] if n in plan_tensors(plan)):
        device[name] = to_device(host[name], "float32" if name in FLOAT32_TENSORS else plan.dtype)
    for name in (*CACHE_TENSORS, *VARLEN_TENSORS):  # a decode's cache lengths and page table, offsets: int32
        if name in plan_tensors(plan):
            device[name] = require_cupy().asarray(host[name].astype(np.int32))
    for name in (n for n in APPEND_TENSORS if n in plan_tensors(plan)):  # the keys and values a decode step appends
        device[name] = to_device(host[name], plan.dtype)
    if plan.mask is not None:  # uint8 or float32 already, as the kernels read it
        device["mask"] = require_cupy().asarray(host["mask"])
    return device, host


def underfill_note(plan: Plan, sms: int | None) -> str | None:
    """A warning naming the stages that launch fewer thread blocks than the GPU has SMs."""
    if not sms:
        return None
    small = [f"{s.name} {s.blocks}" for s in plan.stages if s.blocks < sms]
    if small:
        return (f"{plan.label}: grid underfills the {sms} SMs ({', '.join(small)} blocks); "
                "raise --batch/--heads to fill it")
    return None
