"""The library's plan choice: which plan a call runs (:func:`choose_plan`), decided before anything touches the
GPU, and the plans a call runs in order (:func:`plan_chain`). Used by :mod:`.api` (and re-exported there)."""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

from ..plan import (
    Plan,
    SramTooSmall,
    Unsupported,
    check_runnable,
    make_plan,
    supports_block_sparse,
    supports_causal,
    supports_dropout,
)
from ..plan.decode import DECODE_BLOCK_R, DECODE_SMS, make_decode_plan
from ..plan.dropout import Dropout
from ..plan.fast import FAST_DTYPES, default_kernel
from ..plan.units import parse_size
from ..plan.variants import alibi_floats
from .dispatch import device_id

FAST_DEFAULT_SRAM = 227 * 1024  # flash/fast without a device: the H200's per-block limit
DEFAULT_SRAM = 96 * 1024  # M when none is given: two 96 KB blocks fit in an H100/H200 SM
# where a sliding window runs: the one kernel family that applies one (iokernels.plan.variants.with_window)
WINDOW_PATH = ("a sliding window runs on the tensor-core flash path only (algorithm='flash', schedule 'fast': "
               "float16 or bfloat16, d a multiple of 8 up to 256, the sm_90 tma kernels, forward and backward)")
SOFTCAP_PATH = ("a softcap runs on the tensor-core flash path only (algorithm='flash', schedule 'fast': float16 or "
                "bfloat16, the sm_90 tma kernels, d up to 256 forward and 128 backward, no dropout or masks)")
ALIBI_PATH = ("ALiBi runs on the tensor-core flash path only (algorithm='flash', schedule 'fast': float16 or "
              "bfloat16, the sm_90 tma kernels, d up to 128, no softcap)")


def alibi_values(slopes: Any) -> tuple[float, ...] | None:
    """A call's ALiBi slopes as given (a sequence, numpy, cupy or torch array of numbers), flattened to floats read on
    the host (a device array: one copy); None for none. TypeError/ValueError for what is not numbers >= 0."""
    if slopes is None:
        return None
    if hasattr(slopes, "tolist") and not isinstance(slopes, np.ndarray):  # cupy, torch: to the host once
        slopes = slopes.tolist()
    return tuple(float(x) for x in alibi_floats(slopes).reshape(-1))


def alibi_for(slopes: tuple[float, ...] | None, lead: tuple[int, ...]) -> tuple[float, ...] | None:
    """The slopes of every row of the leading dims (batch·heads, the heads last) from :func:`alibi_values`: H of them
    (the last leading dim's) repeated for every batch row, or one per row as given; ValueError otherwise."""
    if slopes is None:
        return None
    rows, heads = math.prod(lead), (lead[-1] if lead else 1)
    if len(slopes) == rows:
        return slopes
    if len(slopes) == heads:
        return slopes * (rows // heads)
    raise ValueError(f"alibi_slopes: {heads} (one per head) or {rows} (one per batch row and head) numbers for "
                     f"leading dims {lead}, got {len(slopes)}")


def smem_limit() -> int | None:
    """The current device's per-block shared-memory limit (None without one), read once per device."""
    device = device_id()
    return None if device is None else smem_limit_of(device)


@cache
def smem_limit_of(device: int) -> int | None:
    from ..model.specs import current_device_spec

    spec = current_device_spec()
    return spec.smem_per_block_bytes if spec else None


@cache
def sm_count_of(device: int) -> int | None:
    from ..model.specs import current_device_spec

    spec = current_device_spec()
    return spec.sms if spec else None


def decode_plan(n_q: int, n_k: int, d: int, dtype: str, lead: tuple[int, ...], sram: Any, group: int,
                causal: str) -> Plan | None:
    """The split-KV decode plan (:mod:`iokernels.plan.decode`) of a plain forward call that has few query rows per
    K/V head (its g query heads times N_q fill at most one packed tile of :data:`DECODE_BLOCK_R` rows), on the sm_90
    tma kernels, fitting ``sram`` (and the device); None otherwise. Such a call reads K and V once per K/V head (not
    once per query head) and splits the keys to fill the SMs (the device's count). Causal as bottom-right only (the
    decode's mask on packed rows; top-left is the ordinary plan's)."""
    if causal not in ("", "bottom_right"):
        return None
    batch, heads = (math.prod(lead), 1) if group == 1 else (math.prod(lead[:-1]), lead[-1])
    if dtype not in FAST_DTYPES or group * n_q > DECODE_BLOCK_R or default_kernel() != "tma":
        return None
    device = device_id()
    sms = (sm_count_of(device) if device is not None else None) or DECODE_SMS
    try:
        plan = make_decode_plan(N_q=n_q, N_k=n_k, d=d, dtype=dtype, batch=batch, heads=heads,
                                kv_heads=heads // group, sms=sms, causal=causal == "bottom_right")
    except Unsupported:
        return None
    limit = smem_limit()
    fits = (sram is None or plan.smem_bytes <= parse_size(sram)) and (limit is None or plan.smem_bytes <= limit)
    return plan if fits else None


def library_plan(algorithm, schedule, direction, n_q, n_k, d, dtype, lead, sram, kv_group=1, causal="",
                 deterministic=False, block_mask=None, mask=None, dropout=None, window=None, softcap=None,
                 alibi=None) -> Plan:
    """One plan of a call: M from ``sram`` (default :data:`DEFAULT_SRAM`; "fast": the device's limit), the leading
    dims as batch (and heads, for grouped-query attention), the deterministic backward's own plan."""
    limit = smem_limit()
    sram_bytes = DEFAULT_SRAM if sram is None else parse_size(sram)
    if sram is None and schedule == "fast":  # the tensor-core kernels' tiles are chosen for speed:
        sram_bytes = limit or FAST_DEFAULT_SRAM  # let them take what the device allows
    if limit is not None and sram is None:
        sram_bytes = min(sram_bytes, limit)
    # grouped-query attention needs the head dim apart (the last leading dim); otherwise all are batch
    batch, heads = (math.prod(lead), 1) if kv_group == 1 else (math.prod(lead[:-1]), lead[-1])
    if deterministic:
        from ..plan.fast_bwd import make_fast_backward_plan

        grouped = {"kv_heads": heads // kv_group} if kv_group > 1 else {}
        if dropout is not None:
            raise ValueError("deterministic=True has no dropout kernel: its kernels (mma.sync) take no dropout")
        return make_fast_backward_plan(N_q=n_q, N_k=n_k, d=d, dtype=dtype, batch=batch, heads=heads,
                                       deterministic=True, **grouped)
    return make_plan(algorithm, schedule, N_q=n_q, N_k=n_k, d=d, dtype=dtype, sram=sram_bytes, batch=batch,
                     heads=heads, kv_heads=heads // kv_group, direction=direction, smem_limit=limit, causal=causal,
                     block_mask=block_mask, mask=mask, dropout=dropout, window=window, softcap=softcap, alibi=alibi)


def choose_plan(direction: str, algorithm: str, schedule: str | None, n_q: int, n_k: int, d: int, dtype: str,
                lead: tuple[int, ...], sram: Any, group: int, causal: str, deterministic: bool = False,
                block_mask: Any = None, mask: Any = None, dropout: Dropout | None = None,
                window: tuple[int | None, int | None] | None = None, softcap: float | None = None,
                alibi: tuple[float, ...] | None = None) -> tuple[Plan, bool]:
    """The plan a call runs, and whether K and V are expanded to q's heads for it.

    A plain flash forward with few query rows per K/V head runs the split-KV decode (:func:`decode_plan`).

    With no schedule given, flash takes the tensor-core schedule "fast" where its kernels take the
    problem and their tiles fit the M given (``sram``), else its research default. Grouped-query
    attention (``group`` > 1) runs natively where the plan takes ``kv_heads`` (the fast forward; the fast
    backward on sm_90), else on K and V with each head repeated ``group`` times (expanded).

    ``window`` (normalized, :func:`iokernels.plan.normalize_window`): only flash/fast's tma kernels apply one, so
    flash takes "fast" and nothing else, and any other algorithm, schedule or problem raises Unsupported
    (:data:`WINDOW_PATH`) here: never run unmasked, never left to fail at launch. ``softcap`` (checked) the same
    (:data:`SOFTCAP_PATH`), and ``alibi`` (a slope per row of the leading dims, :func:`alibi_for`; :data:`ALIBI_PATH`).
    """
    if (direction == "fwd" and algorithm == "flash" and schedule in (None, "fast") and not deterministic
            and block_mask is None and mask is None and dropout is None and window is None and softcap is None
            and alibi is None):
        plan = decode_plan(n_q, n_k, d, dtype, lead, sram, group, causal)
        if plan is not None:
            return plan, False
    path = (WINDOW_PATH if window is not None else SOFTCAP_PATH if softcap is not None
            else ALIBI_PATH if alibi is not None else None)
    if path is not None:
        if algorithm != "flash" or schedule not in (None, "fast") or deterministic:
            what = "deterministic=True" if deterministic else "/".join(filter(None, (algorithm, schedule)))
            raise Unsupported(f"{path}; {what} has no kernel that applies one")
        schedules: list[str | None] = ["fast"]
    else:
        fast = (algorithm == "flash" and schedule is None and dtype in FAST_DTYPES  # the head dims: the plans say
                and (not causal or supports_causal("flash", "fast", direction))
                and (block_mask is None or supports_block_sparse("flash", "fast", direction))
                and mask is None and (dropout is None or supports_dropout("flash", "fast", direction)))
        schedules = ["fast"] if deterministic else ["fast", None] if fast else [schedule]
    failure: Unsupported | None = None
    for sched in schedules:
        for kv_group in ((group, 1) if group > 1 else (1,)):
            try:
                plan = library_plan(algorithm, sched, direction, n_q, n_k, d, dtype, lead, sram, kv_group, causal,
                                    deterministic, block_mask, mask, dropout, window, softcap, alibi)
            except Unsupported as exc:  # the next choice, or this error when there is none
                failure = exc
                continue
            except SramTooSmall as exc:  # an M given too small for the tensor-core tiles: the research schedule
                if sched != "fast" or len(schedules) == 1:
                    raise
                failure = exc
                break
            check_runnable(plan)  # (a window's plan is a tma one: this never raises)
            return plan, kv_group != group
    assert failure is not None
    if path is not None:
        raise Unsupported(f"{path}: {failure}") from failure
    raise failure


def plan_chain(plan: Plan, algorithm: str, n_q, n_k, d, dtype, lead, sram, causal, window=None) -> list[Plan]:
    """The plans a call runs in order: the standard backward recomputes P with the standard forward (with
    the backward's masks; P is the undropped softmax, so the forward runs without dropout)."""
    if plan.direction == "bwd" and algorithm == "standard":
        return [library_plan("standard", None, "fwd", n_q, n_k, d, dtype, lead, sram, causal=causal,
                             mask=plan.mask, window=window), plan]
    return [plan]
