"""The library's fast path: a call whose signature has run once (its ``Dispatch`` holds a prepared
``kernels.rawlaunch.RawPlan``) allocates its outputs and launches on raw addresses on the current stream,
nothing else: no checks (the signature's first call made them), no memory query (a failed allocation
raises :class:`DeviceMemoryError`), no copies (masks stay on the device). Shared by ``api`` (cupy arrays)
and ``torch_ops`` (torch tensors)."""

from __future__ import annotations

import functools
from typing import Any

from ..kernels import launch
from ..kernels.runtime import require_cupy
from ..plan import Plan
from .dispatch import CUPY_CALLS, Dispatch
from .memory import DeviceMemoryError, memory_error


def module_of(x: Any) -> str:
    mod = type(x).__module__.split(".")[0]
    if mod not in ("numpy", "cupy"):
        raise TypeError(f"expected numpy or cupy arrays, got {type(x).__module__}.{type(x).__name__}")
    return mod


def check_in_place(named: dict[str, Any], why: str) -> None:
    """TypeError/ValueError unless every array of ``named`` (name -> array; None: not given) is a C-contiguous cupy
    array, all on one device: the arrays a call reads where they lie (``why``: where, for the message)."""
    given = {name: x for name, x in named.items() if x is not None}
    for name, x in given.items():
        if module_of(x) != "cupy":
            raise TypeError(f"{name} must be a cupy array on the GPU ({why}; iokernels.torch takes torch tensors), "
                            f"got a {type(x).__module__} array")
        if not x.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous, got strides {x.strides} for shape {x.shape}")
    devices = {x.data.device_id for x in given.values()}
    if len(devices) != 1:
        raise ValueError(f"the arrays lie on several devices: {sorted(devices)}")


def mask_spec(mask: Any, lead: tuple[int, ...], n_q: int, n_k: int) -> Any:
    """The plan's ExplicitMask of a numpy or cupy mask (None without one), from its dtype and shape alone."""
    if mask is None:
        return None
    from ..plan.masks import mask_layout

    module_of(mask)
    spec, _ = mask_layout(mask.dtype, mask.shape, lead, n_q, n_k)
    return spec


def mask_array(mask: Any, spec: Any, lead: tuple[int, ...], n_q: int, n_k: int) -> Any:
    """The device array the kernels read of a mask (None without one): a numpy mask is checked (no NaN or
    +inf in an additive mask) and copied up; a cupy mask stays on the device, unread by the host (no copy
    when it already has the kernels' layout)."""
    if mask is None:
        return None
    from ..plan.masks import dense_mask, explicit_mask

    if module_of(mask) == "numpy":  # checked before cupy is touched
        host = explicit_mask(mask, lead, n_q, n_k)[1]
        return require_cupy().asarray(host)
    return dense_mask(require_cupy(), mask, spec, lead, n_q, n_k)


FWD_INPUTS = ("Q", "K", "V", "mask")  # the fast path's input tuple (the mask's slot only with a mask)
BWD_INPUTS = ("Q", "K", "V", "dO", "O", "lse", "mask")
FWD_OUTPUTS = ("O", "lse", "m", "l")  # what a fast call may return (the rest of what it writes: one workspace block)
BWD_OUTPUTS = ("dQ", "dK", "dV")


def fast_ok(arrays: list[Any], chain: tuple[Plan, ...], expand: bool) -> bool:
    """Whether a call can run on raw addresses: one plan, no expanded K/V, every input a contiguous cupy array."""
    return len(chain) == 1 and not expand and all(module_of(x) == "cupy" and x.flags.c_contiguous for x in arrays)


def prepare_fast(call: Dispatch, inputs: tuple[str, ...], shapes: dict[str, tuple[int, ...]],
                 outputs: tuple[str, ...]) -> None:
    """Fill ``call.fast`` (after the call's first run, which compiled its kernels)."""
    call.fast, call.outputs = prepared(call.chain[0], call.scale, inputs, shapes, outputs)


def prepared(plan: Plan, scale: float, inputs: tuple[str, ...], shapes: dict[str, tuple[int, ...]],
             outputs: tuple[str, ...]) -> tuple[Any, dict[str, int]]:
    """A plan's launches on raw addresses (``launch.prepare_raw``) and where each output comes back in what its
    ``run`` returns: name -> index."""
    raw = launch.prepare_raw(plan, scale, inputs, shapes, outputs)
    start = len(raw.inputs)
    return raw, {n: i for i, n in enumerate(raw.names[start:start + len(raw.allocations)])}


@functools.cache
def cupy_empty(cp: Any) -> Any:
    """The allocator of the fast path for cupy arrays: (array, address) from cupy's pool."""
    def empty(position: int | None, shape: tuple[int, ...], dtype: Any) -> tuple[Any, int]:
        a = cp.empty(shape, dtype)
        return a, a.data.ptr
    return empty


def run_fast(call: Dispatch, given: tuple[int, ...], empty: Any, stream: int, dropout: Any) -> list[Any]:
    """``call.fast`` on inputs at addresses ``given``, outputs from ``empty``; a failed allocation raises
    :class:`DeviceMemoryError` (before anything is launched)."""
    try:
        return call.fast.run(given, empty, stream, dropout, launch.DEBUG_POISON)
    except MemoryError as exc:  # cupy's OutOfMemoryError (torch's: its caller translates it)
        raise fast_memory_error(call) from exc


def fast_memory_error(call: Dispatch) -> DeviceMemoryError:
    """The error of a fast call whose outputs did not fit."""
    return memory_error(call.chain, call.needed_bytes, call.lead)


def memo_call(key: tuple[Any, ...] | None) -> Dispatch | None:
    """The Dispatch stored under a cupy call's ``dispatch.memo_key`` (its fast path), or None (none stored, or
    inside ``count_io``, whose calls take the general path)."""
    if key is None or launch.counting_active():
        return None
    return CUPY_CALLS.get(key)


def forward_result(call: Dispatch, out: dict[str, Any], return_lse: bool, return_dropout: bool, drop: Any) -> Any:
    """O (and lse, and the Dropout) in the caller's shapes, from a run's outputs by name."""
    lead, n_q, d = call.lead, call.n_q, call.d
    o = out["O"]
    result = [o if o.shape == (*lead, n_q, d) else o.reshape((*lead, n_q, d))]
    if return_lse:
        lse = out["lse"] if "lse" in out else out["m"] + require_cupy().log(out["l"])
        result.append(lse if lse.shape == (*lead, n_q) else lse.reshape((*lead, n_q)))
    if return_dropout:
        result.append(drop)
    return result[0] if len(result) == 1 else tuple(result)
