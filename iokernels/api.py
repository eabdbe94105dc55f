"""``iokernels.attention`` and ``iokernels.attention_backward``: exact attention on cupy or numpy arrays."""

from __future__ import annotations

import math
from typing import Any

from ._cupy import require_cupy
from .fast import FAST_DTYPES, FAST_HEAD_DIMS
from .plan import D_MAX, D_MIN, D_MULTIPLE, make_plan, normalize_causal, supports_causal
from .units import parse_size

FAST_DEFAULT_SRAM = 227 * 1024  # flash/fast without a device: the H200's per-block limit
DEFAULT_SRAM = 96 * 1024  # M when none is given: two 96 KB blocks fit in an H100/H200 SM
_DTYPES = {"float32": "float32", "float16": "float16"}


def _module_of(x: Any) -> str:
    mod = type(x).__module__.split(".")[0]
    if mod not in ("numpy", "cupy"):
        raise TypeError(f"expected numpy or cupy arrays, got {type(x).__module__}.{type(x).__name__}")
    return mod


def _kv_group(q: Any, k: Any, v: Any) -> int:
    """Query heads per K/V head: 1, or heads_q / heads_kv when k and v have fewer heads in their last
    leading dim (grouped-query attention: q (..., H_q, N_q, d), k and v (..., H_kv, N_k, d))."""
    if q.ndim < 3 or k.ndim != q.ndim or tuple(k.shape[:-2]) == tuple(q.shape[:-2]):
        return 1
    hq, hk = q.shape[-3], k.shape[-3]
    if tuple(k.shape[:-3]) != tuple(q.shape[:-3]) or tuple(v.shape[:-2]) != tuple(k.shape[:-2]) or hq % hk:
        return 1  # not grouped-query: _check reports the mismatch
    return hq // hk


def _check(arrays: dict[str, Any], n_names: dict[str, str], kv_group: int = 1
           ) -> tuple[str, str, tuple[int, ...], int, int, int]:
    """Validate shapes (..., N, d) and dtypes before anything touches the GPU (k and v with
    1/kv_group of q's heads in their last leading dim when kv_group > 1)."""
    mods = {_module_of(x) for x in arrays.values()}
    if len(mods) != 1:
        raise TypeError(f"mixed array types: {', '.join(sorted(mods))}; pass all numpy or all cupy arrays")
    dtypes = {name: str(x.dtype) for name, x in arrays.items()}
    if len(set(dtypes.values())) != 1:
        raise TypeError(f"mixed dtypes: {dtypes}; pass one dtype for all")
    dtype = next(iter(dtypes.values()))
    if dtype not in _DTYPES:
        raise TypeError(f"unsupported dtype {dtype}: expected float32 or float16")
    q = arrays["q"]
    if q.ndim < 2:
        raise ValueError(f"q must have shape (..., N, d), got {q.shape}")
    lead, d = tuple(q.shape[:-2]), q.shape[-1]
    extents: dict[str, int] = {}
    kv_lead = (*lead[:-1], lead[-1] // kv_group) if kv_group > 1 else lead
    for name, x in arrays.items():
        if x.ndim != q.ndim or tuple(x.shape[:-2]) != (kv_lead if name in ("k", "v") else lead):
            raise ValueError(f"shape mismatch: {name} {tuple(x.shape)} vs q {tuple(q.shape)} "
                             "(leading batch/head dims must be equal)")
        if x.shape[-1] != d:
            raise ValueError(f"shape mismatch: {name} has head dim {x.shape[-1]}, q has {d}")
        extent, key = x.shape[-2], n_names[name]
        if extents.setdefault(key, extent) != extent:
            raise ValueError(f"shape mismatch: {name} {tuple(x.shape)} has {extent} rows, expected {extents[key]}")
    if not (D_MIN <= d <= D_MAX) or d % D_MULTIPLE:
        raise ValueError(f"unsupported head dimension d={d}: expected a multiple of {D_MULTIPLE} "
                         f"from {D_MIN} to {D_MAX}")
    n_q, n_k = extents["q"], extents["k"]
    if n_q < 1 or n_k < 1:
        raise ValueError(f"sequence lengths must be >= 1, got N_q={n_q}, N_k={n_k}")
    return mods.pop(), _DTYPES[dtype], lead, n_q, n_k, d


def _plan(algorithm, schedule, direction, n_q, n_k, d, dtype, lead, sram, kv_group=1, causal=""):
    from .specs import current_device_spec

    spec = current_device_spec()
    limit = spec.smem_per_block_bytes if spec else None
    sram_bytes = DEFAULT_SRAM if sram is None else parse_size(sram)
    if sram is None and schedule == "fast":  # the tensor-core kernels' tiles are chosen for speed:
        sram_bytes = limit or FAST_DEFAULT_SRAM  # let them take what the device allows
    if limit is not None and sram is None:
        sram_bytes = min(sram_bytes, limit)
    # grouped-query attention needs the head dim apart (the last leading dim); otherwise all are batch
    batch, heads = (math.prod(lead), 1) if kv_group == 1 else (math.prod(lead[:-1]), lead[-1])
    return make_plan(algorithm, schedule, N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=sram_bytes, batch=batch,
                     heads=heads, kv_heads=heads // kv_group, direction=direction, smem_limit=limit, causal=causal)


def _to_device(cp, x, shape):
    return cp.ascontiguousarray(cp.asarray(x)).reshape(shape)


def attention(q: Any, k: Any, v: Any, *, algorithm: str = "flash", schedule: str | None = None,
              causal: bool = False, scale: float | None = None, sram: int | str | None = None,
              return_lse: bool = False) -> Any:
    """Exact attention ``softmax(scale * q kᵀ) v`` on the GPU.

    Shapes: q (..., N_q, d), k and v (..., N_k, d), any number of equal leading batch/head dims; or,
    grouped-query attention (flash "fast" path), q (..., H_q, N_q, d) and k, v (..., H_kv, N_k, d)
    with H_kv dividing H_q: query head h uses K/V head h // (H_q / H_kv);
    d a multiple of 8 from 16 to 256; float32 or float16 (all the same). numpy inputs are copied to
    the GPU and the result comes back as numpy; cupy in, cupy out (non-contiguous inputs are copied).

    algorithm: "flash" (default), "two_pass" ("store" or "recompute") or "standard". Flash schedules:
    "fast" (tensor cores: float16 with d of 64 or 128, the default there), "q_outer" (the
    FlashAttention-2 order on CUDA cores, the default otherwise) or "kv_outer" (the paper's
    Algorithm 1). scale defaults to 1/sqrt(d). sram: M, the shared memory per block the plan may use
    (bytes or "96KB"; default 96 KB, or for "fast" the device's limit, where its fastest tiles
    fit; capped at the device's limit). return_lse: also return the row
    logsumexp (..., N_q), float32. Returns O (..., N_q, d) in the input dtype [, lse].

    causal: False, True, "bottom_right" or "top_left". True means **bottom-right** alignment (as
    FlashAttention-2 and torch's ``causal_lower_right``): query i sees key j iff
    j <= i + N_k - N_q, so the last query sees every key (decoding with a KV cache). "top_left" is
    torch's ``is_causal=True``: j <= i. With bottom-right and N_q > N_k the first N_q - N_k queries
    see no key: their output rows are 0 and their lse −inf (top-left never masks a whole row). Flash
    and two_pass skip the blocks that are entirely masked; standard attention computes them. The
    tensor-core schedule "fast" has no causal kernel yet: causal runs use "q_outer" unless a schedule
    is given.
    """
    causal = normalize_causal(causal)
    group = _kv_group(q, k, v)
    mod, dtype, lead, n_q, n_k, d = _check({"q": q, "k": k, "v": v}, {"q": "q", "k": "k", "v": "k"}, group)
    cp = require_cupy()
    from . import gpu

    if (algorithm == "flash" and schedule is None and dtype in FAST_DTYPES and d in FAST_HEAD_DIMS
            and (not causal or supports_causal("flash", "fast", "fwd"))):
        schedule = "fast"  # the tensor-core kernel where it applies
    if group > 1 and (algorithm, schedule) != ("flash", "fast"):
        raise ValueError(f"grouped-query attention (k and v with {lead[-1] // group} heads, q with {lead[-1]}) "
                         f"runs on the tensor-core flash path only: float16 with d in {FAST_HEAD_DIMS}")
    plan = _plan(algorithm, schedule, "fwd", n_q, n_k, d, dtype, lead, sram, kv_group=group, causal=causal)
    bh, bh_kv = plan.bh, plan.bh_kv
    inputs = {"Q": _to_device(cp, q, (bh, n_q, d)), "K": _to_device(cp, k, (bh_kv, n_k, d)),
              "V": _to_device(cp, v, (bh_kv, n_k, d))}
    run = gpu.run_plan(plan, inputs, scale=scale)
    out = run.buffers["O"].reshape((*lead, n_q, d))
    if return_lse:
        b = run.buffers
        lse = b["lse"] if "lse" in b else b["m"] + cp.log(b["l"])
        lse = lse.reshape((*lead, n_q))
        return (cp.asnumpy(out), cp.asnumpy(lse)) if mod == "numpy" else (out, lse)
    return cp.asnumpy(out) if mod == "numpy" else out


def attention_backward(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any, *, algorithm: str = "flash",
                       causal: bool | str = False, scale: float | None = None, sram: int | str | None = None,
                       deterministic: bool = False) -> tuple[Any, Any, Any]:
    """Gradients (dq, dk, dv) of ``o = attention(q, k, v)`` given ``do = dL/do``.

    Shapes as :func:`attention`; o and do (..., N_q, d); lse (..., N_q) float32, from
    ``attention(..., return_lse=True)``. algorithm "flash" (FlashAttention-2 backward: D pre-pass,
    K/V-outer pass, dQ accumulated in float32) or "standard" (paper Algorithm 3; recomputes P with
    the standard forward first). Flash uses the tensor-core backward (schedule "fast") for float16
    with d of 64 or 128. deterministic=True (that path only): dQ from a query-outer kernel instead of
    float32 atomics, so gradients are bitwise identical run to run (about 25% slower).
    causal: as :func:`attention` (True is the bottom-right alignment), and the same as the forward
    that produced o and lse; queries that see no key get dq = 0 and contribute nothing to dk, dv.
    The tensor-core backward has no causal kernel yet: causal gradients come from the research flash
    backward ("kv_outer"), so deterministic=True does not take causal.
    Returns dq, dk, dv in the input dtype, numpy or cupy like the inputs.
    """
    causal = normalize_causal(causal)
    mod, dtype, lead, n_q, n_k, d = _check({"q": q, "k": k, "v": v, "o": o, "do": do},
                                           {"q": "q", "k": "k", "v": "k", "o": "q", "do": "q"})
    lse_shape = (*lead, n_q)
    if tuple(lse.shape) != lse_shape or str(lse.dtype) != "float32":
        raise ValueError(f"lse must be float32 of shape {lse_shape}, got {lse.dtype} {tuple(lse.shape)}")
    fast = (algorithm == "flash" and dtype in FAST_DTYPES and d in FAST_HEAD_DIMS
            and (not causal or supports_causal("flash", "fast", "bwd")))
    if deterministic and causal and not fast:
        raise ValueError("deterministic=True needs the tensor-core flash backward, which has no causal kernel yet")
    if deterministic and not fast:
        raise ValueError("deterministic=True needs the tensor-core flash backward: float16 with d in "
                         f"{FAST_HEAD_DIMS} (the other backward passes add dQ with float atomics)")
    cp = require_cupy()
    from . import gpu

    plan = _plan(algorithm, "fast" if fast else None, "bwd", n_q, n_k, d, dtype, lead, sram, causal=causal)
    if deterministic:
        from .fast_bwd import make_fast_backward_plan

        plan = make_fast_backward_plan(N_q=n_q, N_k=n_k, d=d, dtype=dtype, batch=plan.batch, heads=plan.heads,
                                       deterministic=True)
    bh = plan.bh
    inputs = {"Q": _to_device(cp, q, (bh, n_q, d)), "K": _to_device(cp, k, (bh, n_k, d)),
              "V": _to_device(cp, v, (bh, n_k, d)), "dO": _to_device(cp, do, (bh, n_q, d))}
    if algorithm == "standard":
        fwd = _plan("standard", None, "fwd", n_q, n_k, d, dtype, lead, sram, causal=causal)
        inputs["P"] = gpu.run_plan(fwd, {n: inputs[n] for n in ("Q", "K", "V")}, scale=scale).buffers["P"]
    else:
        inputs["O"] = _to_device(cp, o, (bh, n_q, d))
        inputs["lse"] = _to_device(cp, lse, (bh, n_q))
    needed = set(gpu.plan_tensors(plan))
    run = gpu.run_plan(plan, {n: x for n, x in inputs.items() if n in needed}, scale=scale)
    grads = [run.buffers[n].reshape(shape) for n, shape in
             (("dQ", (*lead, n_q, d)), ("dK", (*lead, n_k, d)), ("dV", (*lead, n_k, d)))]
    return tuple(cp.asnumpy(g) for g in grads) if mod == "numpy" else tuple(grads)
