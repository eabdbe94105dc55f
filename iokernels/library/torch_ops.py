"""The torch operators behind :func:`iokernels.torch.attention`: ``torch.ops.iokernels.attention_fwd`` and
``torch.ops.iokernels.attention_bwd``, registered through ``torch.library`` at import, each with a fake
implementation (output shapes, dtypes and strides; no computation) and the forward with an autograd
formula whose backward is the second op. ``torch.compile`` traces them as single nodes (no graph break),
and ``torch.library.opcheck`` checks them. The decode step's operators are :mod:`.torch_kvcache`'s, the
variable-length ones :mod:`.torch_varlen`'s.

Schemas (tensors; mask optional; options as float, int, bool or str)::

    iokernels::attention_fwd(Tensor q, Tensor k, Tensor v, Tensor? mask, float dropout_p, int dropout_seed,
        int dropout_offset, str causal, float? scale, str algorithm, str? schedule, int? sram,
        bool deterministic, int window_left=-1, int window_right=-1, float? softcap=None)
        -> (Tensor out, Tensor lse, Tensor rng)
    iokernels::attention_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? mask,
        float dropout_p, Tensor rng, str causal, float? scale, str algorithm, int? sram, bool deterministic,
        int window_left=-1, int window_right=-1, float? softcap=None) -> (Tensor dq, Tensor dk, Tensor dv)

out (..., N_q, d) in q's dtype and lse (..., N_q) float32, both contiguous on q's device; rng: the dropout
stream the forward used, an int64 CPU tensor [seed, offset] (the 64-bit seed stored as its signed
two's complement; [0, 0] without dropout). A negative ``dropout_offset`` draws the library's next offset
(and its seed) inside the op (:func:`iokernels.plan.dropout.next_dropout`), so that a compiled graph draws
a new one at each call; the backward takes rng and regenerates the same mask. ``causal``: "" (none),
"top_left" or "bottom_right". ``deterministic`` is the backward's (:func:`iokernels.attention_backward`);
the forward only hands it on. ``algorithm`` of the backward: "standard" or "flash". ``window_left``,
``window_right``: the sliding window (:func:`iokernels.attention`'s ``window``), −1 for an unbounded side (both −1,
the default: none); the backward takes the forward's, and the forward's ``softcap`` (None: none). lse and rng carry
no gradient; the mask gets none.

The implementation (:func:`forward`, :func:`backward`; the operators' CUDA kernels, and what an eager call of
:func:`iokernels.torch.attention` runs without the dispatcher) takes a call signature's first call through
:func:`iokernels.attention` / :func:`iokernels.attention_backward` on cupy views of the tensors' memory (raw
pointers, no DLPack, no copy of contiguous tensors), with every buffer it allocates from torch's caching allocator;
later calls of that signature allocate the outputs with ``torch.empty_like``/``torch.empty`` and launch the prepared
kernels on raw addresses (:mod:`iokernels.library.fastpath`), on torch's current stream.
A ``torch.cuda.graph`` capture allocates from its own pool. An explicit mask stays on the device (converted
there to the kernels' layout when it is not in it), so masked calls are capturable too.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..kernels import launch
from ..plan import D_MAX, D_MIN, D_MULTIPLE, normalize_causal, normalize_window
from ..plan.dropout import Dropout, next_dropout
from ..plan.masks import BlockMask
from ..plan.variants import check_softcap
from . import api, explicit
from .dispatch import TORCH_CALLS, Dispatch, device_id
from .fastpath import fast_memory_error

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DEVICE_TYPES = ("cuda", "meta")  # meta: shapes only, through the fake implementations
_CUPY_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "uint16", torch.bool: "bool",
                torch.float64: "float64", torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8"}
# (int32: the KV cache's lengths and page table; int64, uint8: a programmable variant's captured arrays)
FWD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor? mask, float dropout_p, int dropout_seed, int dropout_offset, "
              "str causal, float? scale, str algorithm, str? schedule, int? sram, bool deterministic, "
              "int window_left=-1, int window_right=-1, float? softcap=None, Tensor? block_levels=None, "
              "int block_q=0, int block_k=0, float[]? alibi=None) -> (Tensor, Tensor, Tensor)")
BWD_SCHEMA = ("(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? mask, float dropout_p, "
              "Tensor rng, str causal, float? scale, str algorithm, int? sram, bool deterministic, "
              "int window_left=-1, int window_right=-1, float? softcap=None, Tensor? block_levels=None, "
              "int block_q=0, int block_k=0, float[]? alibi=None) -> (Tensor, Tensor, Tensor)")


@torch.compiler.disable  # (numpy on the mask's bytes: not traced; a graph break where a block mask is given)
def block_mask_args(block_mask: BlockMask) -> tuple[torch.Tensor, int, int]:
    """A block mask as the operators take it: its bytes as a uint8 CPU tensor of its block grid and its block sizes.
    (Callers pass None, 0, 0 without one themselves: calling this is a graph break.)"""
    return torch.from_numpy(block_mask.levels.copy()), block_mask.block_q, block_mask.block_k


def op_block_mask(levels: torch.Tensor | None, block_q: int, block_k: int, q: torch.Tensor,
                  k: torch.Tensor) -> BlockMask | None:
    """The operators' block mask arguments (:func:`block_mask_args`) as a BlockMask for (N_q, N_k) of q and k."""
    if levels is None:
        return None
    return BlockMask(q.shape[-2], k.shape[-2], block_q, block_k, levels.cpu().numpy().tobytes(), "operator")


# ---------------------------------------------------------------------------------------------
# checks: metadata only (shapes, dtypes, devices), so the fake implementations run them too

def check_tensors(q: Any, k: Any, v: Any, mask: Any = None) -> None:
    """TypeError/ValueError for what the library refuses: non-tensors, other dtypes, mixed dtypes or
    devices, tensors not on CUDA (or meta), shapes that do not fit (as :func:`iokernels.attention`)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__module__}.{type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(f"unsupported dtype {t.dtype} of {name}: expected torch.float32, torch.float16 or "
                            "torch.bfloat16")
        if t.device.type not in DEVICE_TYPES:
            raise ValueError(f"{name} is on {t.device}: iokernels runs on CUDA tensors")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"mixed dtypes: q {q.dtype}, k {k.dtype}, v {v.dtype}; pass one dtype for all")
    check_shapes(q, k, v)
    if mask is not None:
        check_mask(mask, q, k)


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() < 2:
        raise ValueError(f"q must have shape (..., N, d), got {tuple(q.shape)}")
    lead, d = tuple(q.shape[:-2]), q.shape[-1]
    if k.dim() != q.dim() or v.dim() != q.dim() or tuple(k.shape[:-2]) != tuple(v.shape[:-2]):
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} (leading "
                         "batch/head dims must be equal, or k and v may have fewer heads in the last one, "
                         "dividing q's)")
    kv_lead = tuple(k.shape[:-2])
    grouped = (len(lead) >= 1 and kv_lead[:-1] == lead[:-1] and kv_lead[-1] >= 1 and lead[-1] % kv_lead[-1] == 0)
    if kv_lead != lead and not grouped:
        raise ValueError(f"shape mismatch: k {tuple(k.shape)} vs q {tuple(q.shape)} (leading batch/head dims must be "
                         "equal, or k and v may have fewer heads in the last one, dividing q's)")
    for name, t in (("k", k), ("v", v)):
        if t.shape[-1] != d:
            raise ValueError(f"shape mismatch: {name} has head dim {t.shape[-1]}, q has {d}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"shape mismatch: v {tuple(v.shape)} has {v.shape[-2]} rows, expected {k.shape[-2]}")
    if not (D_MIN <= d <= D_MAX) or d % D_MULTIPLE:
        raise ValueError(f"unsupported head dimension d={d}: expected a multiple of {D_MULTIPLE} "
                         f"from {D_MIN} to {D_MAX}")
    if q.shape[-2] < 1 or k.shape[-2] < 1:
        raise ValueError(f"sequence lengths must be >= 1, got N_q={q.shape[-2]}, N_k={k.shape[-2]}")
    if q.numel() == 0:
        raise ValueError(f"leading batch/head dims must not be empty, got {lead}")


def check_mask(mask: Any, q: torch.Tensor, k: torch.Tensor) -> None:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"a torch mask must be a torch.Tensor, got {type(mask).__module__}.{type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"mask must be a boolean or floating-point tensor, got dtype {mask.dtype}")
    if mask.device != q.device:
        raise ValueError(f"mask is on {mask.device}, q on {q.device}: pass the mask on q's device")
    want = (*q.shape[:-1], k.shape[-2])
    if mask.dim() < 2 or mask.dim() > len(want):
        raise ValueError(f"mask of shape {tuple(mask.shape)} is not broadcastable to {want}")
    for m, w in zip(reversed(tuple(mask.shape)), reversed(want), strict=False):
        if m != 1 and m != w:
            raise ValueError(f"mask of shape {tuple(mask.shape)} is not broadcastable to {want}")


# ---------------------------------------------------------------------------------------------
# torch memory as cupy arrays, and cupy's allocations from torch

def as_cupy(cp: Any, t: torch.Tensor) -> Any:
    """A cupy array on ``t``'s memory (its shape and strides; bfloat16 as uint16 words): no copy, no DLPack."""
    t = t.detach()
    itemsize = t.element_size()
    span = (sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1) * itemsize if t.numel() else 0
    memory = cp.cuda.UnownedMemory(t.data_ptr(), span, t, t.device.index)
    return cp.ndarray(tuple(t.shape), cp.dtype(_CUPY_DTYPES[t.dtype]), cp.cuda.MemoryPointer(memory, 0),
                      strides=tuple(s * itemsize for s in t.stride()))


class TorchAllocator:
    """cupy's allocator for one call: each allocation is a ``torch.empty`` uint8 tensor on ``device`` (torch's
    caching allocator, on its current stream; a CUDA graph capture's pool while capturing), kept alive by the
    cupy memory that wraps it. :meth:`tensor` gives an output back as the torch tensor it lives in."""

    def __init__(self, cp: Any, device: torch.device) -> None:
        self.cp, self.device = cp, device
        self.blocks: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

    def __call__(self, size: int) -> Any:
        t = torch.empty(size, dtype=torch.uint8, device=self.device)
        self.blocks[t.data_ptr()] = t
        return self.cp.cuda.MemoryPointer(self.cp.cuda.UnownedMemory(t.data_ptr(), size, t, self.device.index), 0)

    def tensor(self, x: Any, dtype: torch.dtype) -> torch.Tensor:
        """The torch tensor of the cupy array ``x`` (``dtype``: bfloat16 for uint16 words)."""
        base = self.blocks.get(x.data.ptr)
        if base is not None and x.flags.c_contiguous and base.numel() >= x.nbytes:
            return base[:x.nbytes].view(dtype).view(tuple(x.shape))
        if dtype == torch.bfloat16:  # not one of this call's allocations: through DLPack
            return torch.from_dlpack(x.view(self.cp.int16)).view(torch.bfloat16)
        return torch.from_dlpack(x)


@contextlib.contextmanager
def torch_stream(device: torch.device) -> Iterator[tuple[Any, TorchAllocator]]:
    """cupy on ``device``, on torch's current stream there, allocating from torch; yields (cupy, allocator)."""
    from ..kernels.runtime import require_cupy

    cp = require_cupy()
    allocator = TorchAllocator(cp, device)
    stream = torch.cuda.current_stream(device).cuda_stream
    with cp.cuda.Device(device.index), cp.cuda.ExternalStream(stream), cp.cuda.using_allocator(allocator):
        yield cp, allocator


def library_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The mask as the library takes it: bool, float16, float32 or float64 (bfloat16, which cupy has not, widened on
    the device to float32)."""
    if mask is None or mask.dtype in (torch.bool, torch.float16, torch.float32, torch.float64):
        return mask
    return mask.float()


def window_ints(window: tuple[int | None, int | None] | None) -> tuple[int, int]:
    """A normalized window as the schemas take it: (window_left, window_right), -1 for an unbounded side."""
    left, right = (None, None) if window is None else window
    return -1 if left is None else left, -1 if right is None else right


def op_window(left: int, right: int) -> tuple[int | None, int | None] | None:
    """The operators' two ints as a normalized window (None for -1, -1); ValueError for a bad one."""
    return normalize_window((left, right))


# ---------------------------------------------------------------------------------------------
# dropout state: a Dropout <-> the rng tensor [seed, offset]

def signed_seed(seed: int) -> int:
    """A 64-bit seed as the int64 the schema and the rng tensor hold."""
    return seed - 2**64 if seed >= 2**63 else seed


def forward_dropout(p: float, seed: int, offset: int) -> Dropout | None:
    """The forward's Dropout: none for p == 0, drawn (the library's seed and next offset) when offset < 0."""
    if p == 0:
        return None
    if offset < 0:
        return next_dropout(p)
    return Dropout(p, seed % 2**64, offset)


def rng_tensor(dropout: Dropout | None) -> torch.Tensor:
    if dropout is None:
        return torch.zeros(2, dtype=torch.int64)
    return torch.tensor([signed_seed(dropout.seed), dropout.offset], dtype=torch.int64)


def backward_dropout(p: float, rng: torch.Tensor) -> Dropout | None:
    if p == 0:
        return None
    seed, offset = rng.tolist()
    return Dropout(p, seed % 2**64, offset)


# ---------------------------------------------------------------------------------------------
# the implementation: a call signature's first call through the library on cupy views, later calls on raw
# addresses (the library's fast path: torch.empty outputs, torch's current stream, one launch per stage)

TORCH_DTYPES = {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
                np.dtype(np.uint16): torch.bfloat16}  # storage dtypes: uint16 holds bfloat16 bits


def mask_signature(mask: torch.Tensor | None) -> tuple[Any, ...] | None:
    return None if mask is None else (mask.shape, mask.stride(), mask.dtype, mask.device)


def raw_stream(device: torch.device) -> int:
    """torch's current stream on ``device`` as a raw handle (torch.cuda.current_stream costs ~10 µs a call)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get(device.index) if get is not None else torch.cuda.current_stream(device).cuda_stream


@dataclass(frozen=True)
class TorchCall:
    """A torch call signature's fast path: the library's Dispatch (its RawPlan) and how each of its allocations is
    made in torch: ``like``, the input tensor (by position) whose shape and dtype it has (``torch.empty_like``,
    the cheapest allocation torch offers from Python), else ``dtypes``'s dtype and the plan's shape."""

    call: Dispatch
    like: tuple[int | None, ...]
    dtypes: tuple[torch.dtype, ...]
    lse: int | None  # the position of lse among the allocations


LIKE = {"O": 0, "dQ": 0, "dK": 1, "dV": 2}  # outputs shaped like an input (q, k, v, in the call's order)


def torch_call(call: Dispatch, tensors: tuple[torch.Tensor, ...]) -> TorchCall:
    like = []
    for name, position in sorted(call.outputs.items(), key=lambda item: item[1]):
        shape, dtype = call.fast.allocations[position]
        j = LIKE.get(name)
        same = j is not None and tuple(tensors[j].shape) == tuple(shape) and TORCH_DTYPES[dtype] == tensors[j].dtype
        like.append(j if same else None)
    return TorchCall(call, tuple(like), tuple(TORCH_DTYPES[dtype] for _, dtype in call.fast.allocations),
                     call.outputs.get("lse"))


SCRATCH: dict[tuple[Any, ...], torch.Tensor] = {}  # (device, shape) -> an lse no one reads (forward without grad)
MAX_SCRATCH = 32


def scratch(device: torch.device, shape: tuple[int, ...]) -> torch.Tensor:
    """A float32 buffer for a forward's lse when no backward will read it: kept, and written by every such call
    (on any stream: nothing reads it), so that call allocates one tensor, not two."""
    return kept(SCRATCH, MAX_SCRATCH, (device, shape), lambda: torch.empty(shape, dtype=torch.float32, device=device))


def kept(cache: dict[tuple[Any, ...], torch.Tensor], most: int, key: tuple[Any, ...],
         make: Any) -> torch.Tensor:
    """``cache``'s tensor under ``key``, else ``make()`` kept there (the cache emptied first when it holds ``most``)."""
    t = cache.get(key)
    if t is None:
        if len(cache) >= most:
            cache.clear()
        t = cache[key] = make()
    return t


WORKSPACES: dict[tuple[Any, ...], torch.Tensor] = {}  # (device, stream, bytes) -> a small workspace block, kept
MAX_WORKSPACES = 8  # (at most 32 MB kept: the cache is emptied when a ninth block would be kept)
WORKSPACE_KEPT_BYTES = 1 << 22  # blocks up to this size are kept (a decode's partials: 0.5 MB at B 1, 64 heads)


def workspace(device: torch.device, stream: int, nbytes: int) -> torch.Tensor:
    """A fast call's workspace block (uint8): one kept per device, stream and size up to WORKSPACE_KEPT_BYTES and
    reused by every such call on that stream, whose kernels run in the stream's order (torch.empty of 0.5 MB took 5.4
    µs of a 37.5 µs decode call on the H100's host, ``results/h100/issue23/d12-12b3578/``); a new one from torch's
    allocator past that size, and while the stream is being captured into a CUDA graph (the graph's pool then keeps
    it, as any allocation of the capture)."""
    def make() -> torch.Tensor:
        return torch.empty((nbytes,), dtype=torch.uint8, device=device)

    if nbytes > WORKSPACE_KEPT_BYTES or torch.cuda.is_current_stream_capturing():
        return make()
    return kept(WORKSPACES, MAX_WORKSPACES, (device, stream, nbytes), make)


def run_torch(entry: TorchCall, tensors: tuple[torch.Tensor, ...], given: tuple[int, ...], dropout: Any,
              keep_lse: bool = True) -> list[torch.Tensor]:
    """The fast path on torch tensors: allocations from torch (``torch.empty_like`` where it can; the workspace
    :func:`workspace`'s), the launches on torch's current stream; ``keep_lse=False``: the lse goes to a scratch buffer
    (:func:`scratch`)."""
    device = tensors[0].device
    like, dtypes, lse = entry.like, entry.dtypes, (None if keep_lse else entry.lse)
    stream = raw_stream(device)

    def allocate(position: int | None, shape: tuple[int, ...], dtype: np.dtype) -> tuple[torch.Tensor, int]:
        j = None if position is None else like[position]
        if position is None:  # the workspace block
            t = workspace(device, stream, shape[0])
        elif j is not None:
            t = torch.empty_like(tensors[j])
        elif position == lse:
            t = scratch(device, shape)
        else:
            t = torch.empty(shape, dtype=dtypes[position], device=device)
        return t, t.data_ptr()

    try:
        return entry.call.fast.run(given, allocate, stream, dropout, launch.DEBUG_POISON)
    except torch.OutOfMemoryError as exc:
        raise fast_memory_error(entry.call) from exc


def dense_mask(mask: torch.Tensor, spec: Any, lead: tuple[int, ...], n_q: int, n_k: int) -> torch.Tensor:
    """The mask as the kernels read it (masks.dense_mask, in torch on the device): (1 or prod(lead), n_q, n_k),
    uint8 for a boolean mask, float32 for an additive one, contiguous; a view when it already is."""
    m = mask.expand(*((1,) * len(lead) if spec.shared else lead), n_q, n_k)
    m = m.reshape(1 if spec.shared else math.prod(lead), n_q, n_k)
    if spec.kind == "bool":
        return m.contiguous().view(torch.uint8) if m.dtype == torch.bool else m.to(torch.uint8).contiguous()
    return m.to(torch.float32).contiguous()


def fast_mask(mask: torch.Tensor, call: Dispatch) -> torch.Tensor | None:
    """The mask a fast call reads: a routed call's (explicit.routed_call: a variant's plan) its own memory, or None
    where that is not 16-byte aligned (the general path then copies it); else :func:`dense_mask`'s."""
    if call.chain[0].mods is not None:
        return mask if mask.data_ptr() % 16 == 0 else None
    return dense_mask(mask, call.chain[0].mask, call.lead, call.n_q, call.n_k)


def routed(direction: str, arrays: list[Any], mask: torch.Tensor, mask_array: Any, options: dict[str, Any],
           block_mask: Any) -> Dispatch | None:
    """The fast path's Dispatch of a call the explicit-mask route ran (:func:`explicit.routed_call`), None where it
    has none (a mask library_mask converted, so that the fast path could not read the caller's)."""
    if mask_array.data.ptr != mask.data_ptr():
        return None
    return explicit.routed_call(direction, tuple(arrays), mask_array, causal=options["causal"],
                                scale=options["scale"], block_mask=block_mask, bfloat16=options["bfloat16"])


def fast_call(key: tuple[Any, ...] | None, device: torch.device) -> TorchCall | None:
    """The fast path of a signature that has one, on the current device, else None."""
    if key is None or launch.counting_active():
        return None
    entry = TORCH_CALLS.get(key)
    if entry is None or device.index != device_id():  # raw launches go to the current device's context
        return None
    return entry


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout: Dropout | None,
            causal: str, scale: float | None, algorithm: str, schedule: str | None, sram: int | None,
            keep_lse: bool = True, window: tuple[int | None, int | None] | None = None, softcap: float | None = None,
            block_mask: Any = None, alibi: tuple[float, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(O, lse) of :func:`iokernels.attention` on CUDA tensors (the operator's forward, and the eager call's);
    ``keep_lse=False`` (a call no backward follows): lse may be None. ``window``: normalized; ``softcap``: checked;
    ``block_mask``: a BlockMask, ``alibi``: the slopes as floats (planning.alibi_values; the eager call's only)."""
    try:
        key = ("fwd", q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device, v.shape,
               v.stride(), v.dtype, v.device, mask_signature(mask), dropout is not None, causal, scale, algorithm,
               schedule, sram, window, softcap, block_mask, alibi)
    except AttributeError:  # not tensors: check_tensors says so
        key = None
    entry = None if key is None else fast_call(key, q.device)
    m = None if entry is None or mask is None else fast_mask(mask, entry.call)
    if entry is not None and (mask is None or m is not None):
        call = entry.call
        given = (q.data_ptr(), k.data_ptr(), v.data_ptr(), 0 if m is None else m.data_ptr())
        arrays = run_torch(entry, (q, k, v), given, dropout, keep_lse)
        out = call.outputs
        if "lse" in out or not keep_lse:
            return arrays[out["O"]], arrays[out["lse"]] if keep_lse else None
        lse = arrays[out["m"]] + torch.log(arrays[out["l"]])
        return arrays[out["O"]], lse.view(*call.lead, call.n_q)
    check_tensors(q, k, v, mask)
    options = {"algorithm": algorithm, "causal": normalize_causal(causal), "scale": scale, "sram": sram,
               "bfloat16": q.dtype == torch.bfloat16, "dropout": dropout, "window": window, "softcap": softcap}
    with torch_stream(q.device) as (cp, allocator):
        arrays = [as_cupy(cp, t.contiguous()) for t in (q, k, v)]
        mask_array = None if mask is None else as_cupy(cp, library_mask(mask))
        o, lse = api.attention_arrays(*arrays, schedule=schedule, return_lse=True, mask=mask_array,
                                      block_mask=block_mask, alibi_slopes=alibi, **options)
        result = allocator.tensor(o, q.dtype), allocator.tensor(lse, torch.float32)
        call = routed("fwd", arrays, mask, mask_array, options, block_mask) \
            if explicit.takes(arrays[0], mask_array, schedule=schedule, alibi=alibi, **options) else \
            api.forward_call(*arrays, schedule=schedule, block_mask=block_mask, mask=mask_array, alibi=alibi,
                             **options)
    if key is not None and call is not None and call.fast is not None and all(t.is_contiguous() for t in (q, k, v)):
        TORCH_CALLS.put(key, torch_call(call, (q, k, v)))
    return result


def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, mask: torch.Tensor | None, dropout: Dropout | None, causal: str, scale: float | None,
             algorithm: str, sram: int | None, deterministic: bool, window: tuple[int | None, int | None] | None = None,
             softcap: float | None = None, block_mask: Any = None, alibi: tuple[float, ...] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of :func:`iokernels.attention_backward` on CUDA tensors (the operator's and the eager call's);
    ``window``: normalized, the forward's; ``softcap``, ``block_mask``, ``alibi``: the forward's."""
    try:
        key = ("bwd", dout.shape, dout.stride(), dout.dtype, dout.device, q.shape, q.stride(), q.dtype, q.device,
               k.shape, k.stride(), k.dtype, k.device, v.shape, v.stride(), v.dtype, v.device, out.shape,
               out.stride(), out.dtype, out.device, lse.shape, lse.stride(), lse.dtype, lse.device,
               mask_signature(mask), dropout is not None, causal, scale, algorithm, sram, deterministic, window,
               softcap, block_mask, alibi)
    except AttributeError:
        key = None
    entry = None if key is None else fast_call(key, q.device)
    m = None if entry is None or mask is None else fast_mask(mask, entry.call)
    if entry is not None and (mask is None or m is not None):
        call = entry.call
        given = (q.data_ptr(), k.data_ptr(), v.data_ptr(), dout.data_ptr(), out.data_ptr(), lse.data_ptr(),
                 0 if m is None else m.data_ptr())
        arrays = run_torch(entry, (q, k, v), given, dropout)
        return tuple(arrays[call.outputs[n]] for n in ("dQ", "dK", "dV"))
    check_tensors(q, k, v, mask)
    check_backward_tensors(dout, q, out, lse)
    options = {"algorithm": algorithm, "causal": normalize_causal(causal), "scale": scale, "sram": sram,
               "deterministic": deterministic, "bfloat16": q.dtype == torch.bfloat16, "dropout": dropout,
               "window": window, "softcap": softcap}
    with torch_stream(q.device) as (cp, allocator):
        arrays = [as_cupy(cp, t.contiguous()) for t in (q, k, v, out, dout.to(q.dtype), lse)]
        mask_array = None if mask is None else as_cupy(cp, library_mask(mask))
        grads = api.attention_backward_arrays(*arrays, mask=mask_array, block_mask=block_mask, alibi_slopes=alibi,
                                              **options)
        result = tuple(allocator.tensor(g, q.dtype) for g in grads)
        call = routed("bwd", arrays, mask, mask_array, options, block_mask) \
            if explicit.takes(arrays[0], mask_array, schedule=None, alibi=alibi, **options) else \
            api.backward_call(*arrays, block_mask=block_mask, mask=mask_array, alibi=alibi, **options)
    if key is not None and call is not None and call.fast is not None and dout.dtype == q.dtype and \
            all(t.is_contiguous() for t in (dout, q, k, v, out, lse)):
        TORCH_CALLS.put(key, torch_call(call, (q, k, v)))
    return result


# ---------------------------------------------------------------------------------------------
# the operators

@torch.library.custom_op("iokernels::attention_fwd", mutates_args=(), schema=FWD_SCHEMA)
def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float,
                  dropout_seed: int, dropout_offset: int, causal: str, scale: float | None, algorithm: str,
                  schedule: str | None, sram: int | None, deterministic: bool, window_left: int = -1,
                  window_right: int = -1, softcap: float | None = None, block_levels: torch.Tensor | None = None,
                  block_q: int = 0, block_k: int = 0, alibi: list[float] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    window = op_window(window_left, window_right)
    drop = forward_dropout(dropout_p, dropout_seed, dropout_offset)
    out, lse = forward(q, k, v, mask, drop, causal, scale, algorithm, schedule, sram, window=window,
                       softcap=check_softcap(softcap), block_mask=op_block_mask(block_levels, block_q, block_k, q, k),
                       alibi=None if alibi is None else tuple(alibi))
    return out, lse, rng_tensor(drop)


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, mask, dropout_p, dropout_seed, dropout_offset, causal, scale, algorithm, schedule,
                        sram, deterministic, window_left=-1, window_right=-1, softcap=None, block_levels=None,
                        block_q=0, block_k=0, alibi=None):
    op_window(window_left, window_right)
    check_softcap(softcap)
    check_tensors(q, k, v, mask)
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse = q.new_empty(tuple(q.shape[:-1]), dtype=torch.float32)
    return out, lse, torch.empty(2, dtype=torch.int64, device="cpu")


@torch.library.custom_op("iokernels::attention_bwd", mutates_args=(), schema=BWD_SCHEMA)
def attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, mask: torch.Tensor | None, dropout_p: float, rng: torch.Tensor, causal: str,
                  scale: float | None, algorithm: str, sram: int | None, deterministic: bool, window_left: int = -1,
                  window_right: int = -1, softcap: float | None = None, block_levels: torch.Tensor | None = None,
                  block_q: int = 0, block_k: int = 0, alibi: list[float] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward(dout, q, k, v, out, lse, mask, backward_dropout(dropout_p, rng), causal, scale, algorithm, sram,
                    deterministic, op_window(window_left, window_right), check_softcap(softcap),
                    op_block_mask(block_levels, block_q, block_k, q, k), None if alibi is None else tuple(alibi))


@attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, mask, dropout_p, rng, causal, scale, algorithm, sram,
                        deterministic, window_left=-1, window_right=-1, softcap=None, block_levels=None, block_q=0,
                        block_k=0, alibi=None):
    op_window(window_left, window_right)
    check_softcap(softcap)
    check_tensors(q, k, v, mask)
    check_backward_tensors(dout, q, out, lse)
    return tuple(t.new_empty(tuple(t.shape)) for t in (q, k, v))


def check_backward_tensors(dout: Any, q: torch.Tensor, out: Any, lse: Any) -> None:
    for name, t in (("dout", dout), ("out", out), ("lse", lse)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__module__}.{type(t).__name__}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    for name, t in (("dout", dout), ("out", out)):
        if tuple(t.shape) != tuple(q.shape):
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)}, got {tuple(t.shape)}")
    if tuple(lse.shape) != tuple(q.shape[:-1]) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be float32 of shape {tuple(q.shape[:-1])}, got {lse.dtype} {tuple(lse.shape)}")


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    # inputs: all 20, the defaults filled in (torch.library fills those the dispatcher dropped)
    (q, k, v, mask, dropout_p, _, _, causal, scale, algorithm, _, sram, deterministic, left, right, softcap, levels,
     block_q, block_k, alibi) = inputs
    out, lse, rng = output
    ctx.save_for_backward(q, k, v, out, lse, rng, mask)
    ctx.mark_non_differentiable(lse, rng)
    ctx.options = (dropout_p, causal, scale, "standard" if algorithm == "standard" else "flash", sram, deterministic,
                   left, right, softcap, levels, block_q, block_k, alibi)  # the backward's variants: the forward's


def _backward(ctx: Any, dout: torch.Tensor, dlse: Any, drng: Any) -> tuple[torch.Tensor | None, ...]:
    q, k, v, out, lse, rng, mask = ctx.saved_tensors
    dropout_p, causal, scale, algorithm, sram, deterministic, *variants = ctx.options
    dq, dk, dv = torch.ops.iokernels.attention_bwd(dout, q, k, v, out, lse, mask, dropout_p, rng, causal, scale,
                                                   algorithm, sram, deterministic, *variants)
    return (dq, dk, dv) + (None,) * 17  # one per positional input of the forward


attention_fwd.register_autograd(_backward, setup_context=_setup_context)
