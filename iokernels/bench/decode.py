"""``iokernels bench --decode`` (issue #23): decoding attention, N_q new query tokens against a long K/V cache, ours
beside torch SDPA's backends, every implementation timed the one way of :mod:`iokernels.bench.clocks` (modes "call"
and "graph"; a case's implementations and modes set up, then their loops taken in turn) on the same inputs, in the same
run.

Inputs, per case and shared by every implementation: q (B, H, N_q, d) and ``caches`` distinct K/V caches k, v
(B, H_kv, N_k, d), random normal, made once with torch on the device. Each call takes the next cache, and the caches
hold together at least ``L2_FACTOR`` times the GPU's L2 (``L2_cache_size``), so that no call finds its K and V in
what the calls before it left in the L2; mode "graph" captures one graph of ``caches`` calls, one per cache. A case
whose inputs and outputs, with ``MEMORY_RESERVE`` for the implementations' own buffers, exceed the free device memory
is skipped, and its rows say so.

Implementations:

- ``iokernels_torch`` (ours): ``iokernels.torch.attention(q, k, v)``, grouped-query attention native (k and v with
  H_kv heads); ``causal=True`` (bottom-right) when N_q > 1.
- ``torch_flash``, ``torch_cudnn``, ``torch_efficient``: ``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)``
  under ``sdpa_kernel(SDPBackend.X)``, entered once around the calls; ``torch_sdpa``: the same call with no backend
  forced, torch's own choice (named in its rows). N_q > 1: ``attn_mask=causal_lower_right(N_q, N_k)`` (SDPA's
  ``is_causal`` is top-left: another workload). A backend that refuses a case is "unsupported" with torch's reasons;
  K and V are never expanded to H heads for it.

Metrics: the median seconds per call; the KV bandwidth 2·itemsize·d·B·H_kv·N_k / t (K and V read once: the issue's
figure); its percent of the copy bandwidth measured at the start of the run (:func:`iokernels.kernels.launch.
copy_bandwidth`: bytes read + written by a device-to-device copy, over its time); per mode, the time of the faster of
FLASH and CUDNN over ours (> 1: ours is faster), and issue #23's two criteria counted over the cases."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import clocks
from .clocks import Runner, TooSlow, TorchClock, free_device_memory, one_line
from .configs import L2_FACTOR, DecodeProblem
from .implementations import TORCH_BACKENDS, contexts, cupy_reason, sdpa_first_call, torch_import_reason, torch_reason
from .suite import CELL, TIMING, environment, note_lines, text_table

MEMORY_RESERVE = 1 << 30  # bytes left free for the implementations' own buffers (split-KV partials, workspaces)
BEST_FROM = ("torch_flash", "torch_cudnn")  # the peers: ours over the faster of the two
COPY_TARGET, COPY_FROM_NK, RATIO_TARGET = 85.0, 16384, 1.0  # issue #23: >= 85 % of copy for N_k >= 16k, >= 1.0x
KV_BANDWIDTH = "KV bandwidth = 2*itemsize*d*B*H_kv*N_k / median seconds per call (K and V read once)"
COPY_METHOD = ("iokernels.kernels.timing.copy_bandwidth: bytes read + written by a device-to-device copy of 1 GiB "
               "(cupy.copyto), over the median of 20 CUDA-event timings after 3 warm-ups, measured once at the start "
               "of the run; a stream that only reads is not measured")
RATIO = "best/ours: the faster of FLASH and CUDNN's median time over ours, same case and mode (> 1: ours is faster)"
ROTATION = ("each case's K/V caches (same shapes, distinct memory) hold together >= {factor} x the GPU's L2; each "
            "call takes the next cache; mode graph captures one graph of `caches` calls, one per cache, and divides a "
            "replay's time by `caches`")


# ---------------------------------------------------------------------------------------------
# inputs and the device

@dataclass
class DecodeInputs:
    """q and the K/V caches one case's calls rotate among, on ``device``."""

    q: Any
    caches: list[tuple[Any, Any]]
    device: str = "cuda"


def make_inputs(problem: DecodeProblem, caches: int, device: str = "cuda") -> DecodeInputs:
    """Random normal q (B, H, N_q, d) and ``caches`` K/V pairs (B, H_kv, N_k, d) in the problem's dtype."""
    import torch

    dt = getattr(torch, problem.dtype)
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> Any:
        return torch.randn(shape, device=device, dtype=dt, generator=gen)

    q = randn(problem.batch, problem.heads, problem.n_q, problem.d)
    kv = (problem.batch, problem.kv_heads, problem.n_k, problem.d)
    pairs = [(randn(*kv), randn(*kv)) for _ in range(caches)]
    if device != "cpu":
        torch.cuda.synchronize()  # made on the default stream; the clocks run on streams of their own
    return DecodeInputs(q, pairs, device)


class TorchDevice:
    """The CUDA device as torch sees it: its L2, its free memory, the copy bandwidth, the inputs of a case."""

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def l2_bytes(self) -> int:
        torch = self.torch
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size)

    def free_bytes(self) -> int:
        return int(self.torch.cuda.mem_get_info()[0])

    def copy_bandwidth(self) -> float:
        from ..kernels.timing import copy_bandwidth

        return copy_bandwidth()

    def inputs(self, problem: DecodeProblem, caches: int) -> DecodeInputs:
        return make_inputs(problem, caches)

    def release(self) -> None:
        free_device_memory()


def memory_note(problem: DecodeProblem, caches: int, free: int) -> str | None:
    """Why a case does not fit ``free`` bytes of device memory, or None when it does."""
    need = problem.device_bytes(caches) + MEMORY_RESERVE
    if need <= free:
        return None
    return (f"needs {_gib(need)} of device memory ({caches} K/V cache{'s' if caches > 1 else ''} of "
            f"{_gib(problem.kv_bytes)}, q, outputs and a {_gib(MEMORY_RESERVE)} reserve), {_gib(free)} free")


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


# ---------------------------------------------------------------------------------------------
# implementations

class DecodeImpl:
    """An implementation of decoding attention: ``unavailable`` says why it cannot run at all (None when it can);
    ``setup`` makes one case's Runner, its calls rotating among the inputs' caches."""

    name: str = ""
    label: str = ""
    ours: bool = False
    description: str = ""

    def unavailable(self) -> str | None:
        return None

    def setup(self, problem: DecodeProblem, inputs: DecodeInputs) -> Runner:
        raise NotImplementedError

    def backend_choice(self, problem: DecodeProblem, inputs: DecodeInputs) -> str | None:
        """The backend a call runs, where the implementation chooses one."""
        return None

    def as_dict(self) -> dict:
        return {"name": self.name, "label": self.label, "ours": self.ours, "description": self.description,
                "unavailable": self.unavailable()}


def rotating_runner(inputs: DecodeInputs, attend: Callable[[Any, Any, Any], Any], *,
                    context: Callable[[], Any] | None = None,
                    first: Callable[[Callable[[], Any]], Any] | None = None) -> Runner:
    """A Runner of ``attend(q, k, v)``, each call on the next of the inputs' K/V caches, under ``torch.no_grad`` and
    ``context``; the first call (``first`` wraps it, to read a refusal) is made here, on the clock's stream."""
    import torch

    clock = TorchClock(torch, inputs.device)
    active = contexts(torch.no_grad, context)
    turn = itertools.cycle(inputs.caches)
    q = inputs.q

    def call() -> Any:
        k, v = next(turn)
        return attend(q, k, v)

    with clock.on(), active():
        if first is not None:
            first(call)
        else:
            call()
        clock.synchronize()
    return Runner(call=call, clock=clock, context=active, cycle=len(inputs.caches))


class DecodeOurs(DecodeImpl):
    name, label, ours = "iokernels_torch", "io-torch", True
    description = ("iokernels.torch.attention(q, k, v) on torch tensors, k and v with H_kv heads (grouped-query "
                   "attention native); causal=True (bottom-right) when N_q > 1")

    def unavailable(self) -> str | None:
        return torch_import_reason() or cupy_reason()

    def setup(self, problem: DecodeProblem, inputs: DecodeInputs) -> Runner:
        from ..torch import attention

        causal = problem.causal

        def attend(q: Any, k: Any, v: Any) -> Any:
            return attention(q, k, v, causal=causal)

        return rotating_runner(inputs, attend)


SDPA_LABELS = {backend: label for backend, label in TORCH_BACKENDS.values()}


class DecodeSdpa(DecodeImpl):
    """torch's scaled_dot_product_attention with enable_gqa=True, under one backend (``backend``) or torch's own
    choice (None)."""

    ours = False

    def __init__(self, name: str):
        self.name = name
        if name == "torch_sdpa":
            self.backend, self.label = None, "SDPA"
            how = "no backend forced (torch's own choice, named in each row)"
        else:
            self.backend, self.label = TORCH_BACKENDS[name]
            how = f"sdpa_kernel(SDPBackend.{self.backend}) entered once around the calls"
        self.description = (f"torch F.scaled_dot_product_attention(q, k, v, enable_gqa=True), {how}; N_q > 1: "
                            "attn_mask=torch.nn.attention.bias.causal_lower_right(N_q, N_k)")

    def unavailable(self) -> str | None:
        return torch_import_reason() if self.backend is None else torch_reason(self.backend)

    def setup(self, problem: DecodeProblem, inputs: DecodeInputs) -> Runner:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(problem.n_q, problem.n_k) if problem.causal else None

        def attend(q: Any, k: Any, v: Any) -> Any:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

        context = None if self.backend is None else (lambda: sdpa_kernel(getattr(SDPBackend, self.backend)))
        return rotating_runner(inputs, attend, context=context, first=sdpa_first_call)

    def backend_choice(self, problem: DecodeProblem, inputs: DecodeInputs) -> str | None:
        if self.backend is not None:
            return self.backend
        return sdpa_choice(inputs.q, *inputs.caches[0], causal=problem.causal)


def sdpa_choice(q: Any, k: Any, v: Any, *, causal: bool) -> str:
    """The backend torch's SDPA picks with none forced, as torch reports it: ``torch._fused_sdp_choice`` without a
    mask (and for causal_lower_right with N_q = N_k, which SDPA runs as is_causal); with causal_lower_right and
    N_q < N_k, that mask's own dispatch (torch.nn.attention.bias.CausalBias): FLASH where it takes the inputs, else
    EFFICIENT, else SDPA's choice with the mask materialized."""
    import torch
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention
    from torch.nn.attention import SDPBackend
    from torch.nn.attention.bias import causal_lower_right

    try:
        if causal and q.shape[-2] == k.shape[-2]:
            return SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, True, enable_gqa=True)).name
        if causal:
            params = SDPAParams(q, k, v, None, 0.0, False, True)
            if can_use_flash_attention(params):
                return SDPBackend.FLASH_ATTENTION.name
            if can_use_efficient_attention(params):
                return SDPBackend.EFFICIENT_ATTENTION.name
            mask = causal_lower_right(q.shape[-2], k.shape[-2])._materialize(q.device)
            return SDPBackend(torch._fused_sdp_choice(q, k, v, mask, enable_gqa=True)).name
        return SDPBackend(torch._fused_sdp_choice(q, k, v, enable_gqa=True)).name
    except Exception as exc:
        return one_line(f"unknown ({type(exc).__name__}: {exc})", 120)


DECODE_OURS = ("iokernels_torch",)
DECODE_PEERS = ("torch_flash", "torch_cudnn", "torch_efficient", "torch_sdpa")
DECODE_ORDER = ("iokernels_torch", "torch_flash", "torch_cudnn", "torch_sdpa", "torch_efficient")  # measured first
DECODE_OURS_ALIASES = {"torch": "iokernels_torch", "fast": "iokernels_torch"}
DECODE_PEER_ALIASES = {"sdpa": "torch_sdpa", **{k.split("_", 1)[1]: k for k in DECODE_PEERS[:3]},
                       **{TORCH_BACKENDS[k][0].lower(): k for k in DECODE_PEERS[:3]}}


def make_impls(names: Sequence[str]) -> list[DecodeImpl]:
    return [DecodeOurs() if n == "iokernels_torch" else DecodeSdpa(n) for n in names]


# ---------------------------------------------------------------------------------------------
# the run

def _row(problem: DecodeProblem, impl: DecodeImpl, mode: str, caches: int) -> dict:
    return {"impl": impl.name, "label": impl.label, "ours": impl.ours, "mode": mode, "d": problem.d,
            "dtype": problem.dtype, "batch": problem.batch, "heads": problem.heads, "kv_heads": problem.kv_heads,
            "N_q": problem.n_q, "N_k": problem.n_k, "causal": problem.causal, "caches": caches,
            "kv_bytes": problem.kv_bytes, "status": None, "seconds": None, "kv_tbps": None, "percent_of_copy": None,
            "backend": None, "timed_calls": 0, "loop": None, "method": None, "note": None}


def _failed(row: dict, exc: BaseException) -> None:
    if isinstance(exc, TooSlow):
        row.update(status="skipped", seconds=exc.seconds, timed_calls=1, note=str(exc))
    else:
        status, note = clocks.classify(exc)
        row.update(status=status, note=note)


def _prepare(impl: DecodeImpl, problem: DecodeProblem, inputs: DecodeInputs, timing: clocks.Timing,
             modes: Sequence[str], warmed: set) -> tuple[list[dict], list[tuple[dict, clocks.Prepared]]]:
    """``impl`` set up on the shared caches once for every mode (its rows and the modes ready to time), or its rows'
    status: "not available", "unsupported", "oom", "skipped", "error" with the reason."""
    rows = [_row(problem, impl, mode, len(inputs.caches)) for mode in modes]
    reason = impl.unavailable()
    if reason is not None:
        for row in rows:
            row.update(status="not available", note=reason)
        return rows, []

    def setup() -> clocks.Runner:
        runner = impl.setup(problem, inputs)
        backend = impl.backend_choice(problem, inputs)
        for row in rows:
            row["backend"] = backend
        return runner

    return rows, clocks.prepare_setup(setup, impl.name, warmed, timing, rows, _failed)


def _time(problem: DecodeProblem, timed: list[tuple[dict, clocks.Prepared]], timing: clocks.Timing) -> None:
    """Every prepared mode of a case's implementations timed in turn (:func:`clocks.time_in_turn`), with their KV
    read bandwidth."""
    for row in clocks.time_in_turn(timed, timing.repeats, _failed):
        row["kv_tbps"] = problem.kv_bytes / row["seconds"] / 1e12


def measure(impl: DecodeImpl, problem: DecodeProblem, inputs: DecodeInputs, timing: clocks.Timing,
            modes: Sequence[str] = ("call",), warmed: set | None = None) -> list[dict]:
    """One row per mode of ``impl`` alone: "ok" (seconds, kv_tbps), or "not available", "unsupported", "oom",
    "skipped", "error" with the reason. One setup serves every mode; the modes' loops are taken in turn."""
    rows, timed = _prepare(impl, problem, inputs, timing, modes, warmed if warmed is not None else set())
    try:
        _time(problem, timed, timing)
    finally:
        del timed  # drop the runner's outputs and graphs before giving the memory back
        free_device_memory()
    return rows


CASE_KEYS = ("d", "dtype", "heads", "kv_heads", "batch", "N_q", "N_k")


def _case(r: dict) -> tuple:
    """A row's case (also a ratio row's)."""
    return tuple(r[k] for k in CASE_KEYS)


def ratios(rows: list[dict]) -> list[dict]:
    """Per case and mode where ours and FLASH or CUDNN measured: the faster of FLASH and CUDNN's time over ours
    (``best``, ``ratio``), and every measured peer's time over ours (``peers``)."""
    by_case: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            by_case.setdefault((*_case(r), r["mode"]), {})[r["impl"]] = r
    out = []
    for key, impls in by_case.items():
        best = min((impls[n] for n in BEST_FROM if n in impls), key=lambda r: r["seconds"], default=None)
        if best is None:
            continue
        for ours in (r for r in impls.values() if r["ours"]):
            out.append({**dict(zip((*CASE_KEYS, "mode"), key, strict=True)), "impl": ours["impl"],
                        "best": best["impl"], "ratio": best["seconds"] / ours["seconds"],
                        "peers": {r["impl"]: r["seconds"] / ours["seconds"] for r in impls.values() if not r["ours"]}})
    return out


def _where(r: dict) -> str:
    return f"B={r['batch']} H={r['heads']}:{r['kv_heads']} N_q={r['N_q']} N_k={r['N_k']}"


def criteria(rows: list[dict], ratio_rows: list[dict], modes: Sequence[str]) -> list[dict]:
    """Issue #23's two criteria, per mode and implementation of ours, over the cases measured: percent of copy
    >= COPY_TARGET where N_k >= COPY_FROM_NK, and time ratio >= RATIO_TARGET; each with its worst case."""
    out = []
    ours = list(dict.fromkeys(r["impl"] for r in rows if r["ours"]))
    for mode in modes:
        for impl in ours:
            copy = [r for r in rows if r["impl"] == impl and r["mode"] == mode and r["percent_of_copy"] is not None
                    and r["N_k"] >= COPY_FROM_NK]
            ratio = [r for r in ratio_rows if r["impl"] == impl and r["mode"] == mode]
            for what, got, target in (("percent_of_copy", copy, COPY_TARGET), ("ratio", ratio, RATIO_TARGET)):
                worst = min(got, key=lambda r, what=what: r[what], default=None)
                out.append({"mode": mode, "impl": impl, "criterion": what, "target": target, "cases": len(got),
                            "met": sum(r[what] >= target for r in got),
                            "worst": None if worst is None else worst[what],
                            "worst_at": None if worst is None else _where(worst)})
    return out


def run(problems: Sequence[DecodeProblem], impls: Sequence[DecodeImpl], timing: clocks.Timing, *,
        device: Any = None, modes: Sequence[str] = ("call",), progress: Callable[[str], None] | None = None,
        header: dict | None = None) -> dict:
    """Every implementation on every case, in each mode, on the same inputs per case (``device``: a TorchDevice,
    or a stand-in with its methods)."""
    timing.check()
    for mode in modes:
        if mode not in clocks.MODES:
            raise ValueError(f"mode must be one of {clocks.MODES}, got {mode!r}")
    device = device if device is not None else TorchDevice()
    started = time.monotonic()
    l2 = device.l2_bytes()
    try:
        copy_bw, copy_note = device.copy_bandwidth(), None
    except Exception as exc:
        copy_bw, copy_note = None, one_line(f"no copy bandwidth: {type(exc).__name__}: {exc}")
    device.release()
    order = sorted(impls, key=lambda i: DECODE_ORDER.index(i.name) if i.name in DECODE_ORDER else len(DECODE_ORDER))
    rows: list[dict] = []
    warmed: set = set()

    def report(problem: DecodeProblem, got: list[dict]) -> None:
        if progress is None:
            return
        for r in got:
            value = (f"{r['seconds'] * 1e6:.1f} us, {r['kv_tbps']:.2f} TB/s" if r["status"] == "ok"
                     else f"{r['status']}: {r['note']}")
            progress(f"decode {problem.describe()} caches={r['caches']} {r['mode']} {r['impl']}: {value}")

    def every(problem: DecodeProblem, caches: int, status: str, note: str) -> None:
        got = [_row(problem, impl, mode, caches) for impl in order for mode in modes]
        for r in got:
            r.update(status=status, note=note)
        rows.extend(got)
        report(problem, got)

    for problem in problems:
        caches = problem.caches(l2)
        why = timing.spent(started) or memory_note(problem, caches, device.free_bytes())
        if why is not None:
            every(problem, caches, "skipped", why)
            continue
        try:
            inputs = device.inputs(problem, caches)
        except Exception as exc:
            device.release()
            every(problem, caches, *clocks.classify(exc))
            continue
        timed: list[tuple[dict, clocks.Prepared]] = []
        try:  # every implementation set up on the case's caches, then their loops taken in turn
            got = []
            for impl in order:
                why = timing.spent(started)
                if why is not None:
                    skipped = [_row(problem, impl, mode, caches) for mode in modes]
                    for r in skipped:
                        r.update(status="skipped", note=why)
                    got += skipped
                    continue
                impl_rows, ready = _prepare(impl, problem, inputs, timing, modes, warmed)
                got += impl_rows
                timed += ready
            _time(problem, timed, timing)
            rows.extend(got)
            report(problem, got)
        finally:
            inputs = timed = None
            free_device_memory()
            device.release()
    if copy_bw:
        for r in rows:
            if r["status"] == "ok":
                r["percent_of_copy"] = 100 * r["kv_tbps"] * 1e12 / copy_bw
    ratio_rows = ratios(rows)
    head = {"environment": environment(impls), "table": "decode", "modes": list(modes), "warmup": timing.warmup,
            "repeats": timing.repeats, "max_call_seconds": timing.max_call_seconds,
            "budget_seconds": timing.budget_seconds, "wall_seconds": time.monotonic() - started,
            "impls": [i.as_dict() for i in impls], "timing": TIMING + "; " + ROTATION.format(factor=L2_FACTOR),
            "decode": {"l2_bytes": l2, "l2_factor": L2_FACTOR, "memory_reserve_bytes": MEMORY_RESERVE,
                       "copy_bandwidth_bytes_per_s": copy_bw, "copy_method": COPY_METHOD, "copy_note": copy_note,
                       "kv_bandwidth": KV_BANDWIDTH, "ratio": RATIO, "best_from": list(BEST_FROM),
                       "criteria": f"issue #23: >= {COPY_TARGET:g} % of the copy bandwidth for N_k >= {COPY_FROM_NK}, "
                                   f">= {RATIO_TARGET:.1f}x the faster of FLASH and CUDNN on every case"},
            **(header or {})}
    return {"header": head, "rows": rows, "ratios": ratio_rows, "criteria": criteria(rows, ratio_rows, modes)}


# ---------------------------------------------------------------------------------------------
# text

def _cells(r: dict | None, percent: bool) -> list[str]:
    """us and TB/s (and, for ours, % of copy) of one row."""
    if r is None:
        return ["-"] * (3 if percent else 2)
    if r["status"] != "ok":
        return [CELL.get(r["status"], r["status"]), "-", *(["-"] if percent else [])]
    cells = [f"{r['seconds'] * 1e6:.1f}", f"{r['kv_tbps']:.2f}"]
    if percent:
        cells.append("-" if r["percent_of_copy"] is None else f"{r['percent_of_copy']:.1f}")
    return cells


def render(doc: dict) -> str:
    h, env = doc["header"], doc["header"]["environment"]
    dec = h["decode"]
    modes = list(h["modes"])
    torch_part = (f"  torch {env['torch']} (CUDA {env.get('torch_cuda')}, cuDNN {env.get('cudnn')})"
                  if env.get("torch") else "")
    copy_bw = dec["copy_bandwidth_bytes_per_s"]
    copy = (f"%copy = KV bandwidth over the copy bandwidth, {copy_bw / 1e12:.2f} TB/s: bytes read + written by a "
            "device-to-device copy of 1 GiB (cupy.copyto), measured at the start of this run" if copy_bw else
            f"%copy: {dec['copy_note'] or 'no copy bandwidth'}")
    lines = [f"device: {env.get('gpu', 'none')}  cupy {env.get('cupy', '-')}  CUDA runtime "
             f"{env.get('cuda_runtime', '-')}  driver {env.get('cuda_driver', '-')}{torch_part}  "
             f"commit {env.get('commit')}  {env.get('date')}",
             "decode attention (issue #23): q (B, H, N_q, d), k and v (B, H_kv, N_k, d); N_q > 1 causal bottom-right",
             f"us = median microseconds per call; TB/s = {KV_BANDWIDTH.split(' = ', 1)[1]}",
             copy,
             f"L2 {dec['l2_bytes'] / 2**20:.0f} MiB: " + ROTATION.format(factor=dec["l2_factor"]),
             RATIO + "; SDPA = torch's own backend choice (under 'SDPA picks')",
             f"mode{'s' if len(modes) > 1 else ''} {', '.join(modes)}: "
             + "; ".join({"call": "CUDA events around back-to-back calls of each public function, host time included",
                          "graph": "the calls captured in a CUDA graph, replays timed the same way"}[m] for m in modes)
             + f"; median of {h['repeats']} timed loops after {h['warmup']} warm-ups, the implementations' and modes' "
               "loops taken in turn",
             "cells: n/a = not available, unsup = unsupported, OOM = out of memory, skip = skipped, err = error "
             "(reasons under notes)"]
    impls = [(i["name"], i["label"], i["ours"]) for i in h["impls"]]
    index = {(*_case(r), r["mode"], r["impl"]): r for r in doc["rows"]}
    rindex = {(*_case(r), r["mode"], r["impl"]): r for r in doc["ratios"]}
    cases = {_case(r): r["caches"] for r in doc["rows"]}
    sdpa = any(name == "torch_sdpa" for name, _, _ in impls)
    ours = [name for name, _, is_ours in impls if is_ours]
    labels = {name: label for name, label, _ in impls}
    head = ["d", "dtype", "H:Hkv", "B", "N_k", "N_q", "caches"]
    for _, label, is_ours in impls:
        head += [f"{label} us", "TB/s", *(["%copy"] if is_ours else [])]
    head += [*(["SDPA picks"] if sdpa else []), *(col for name in ours for col in ("best", f"best/{labels[name]}"))]
    for mode in modes:
        body = []
        for case, caches in cases.items():
            d, dtype, heads, kv_heads, batch, n_q, n_k = case
            cells = [str(d), dtype, f"{heads}:{kv_heads}", str(batch), str(n_k), str(n_q), str(caches)]
            for name, _, is_ours in impls:
                cells += _cells(index.get((*case, mode, name)), is_ours)
            if sdpa:
                picked = index.get((*case, mode, "torch_sdpa"))
                backend = picked["backend"] if picked else None  # "unknown (why)" in full in the JSON
                cells.append(SDPA_LABELS.get(backend, backend.split(" ")[0]) if backend else "-")
            for name in ours:
                r = rindex.get((*case, mode, name))
                cells += [labels.get(r["best"], r["best"]), f"{r['ratio']:.2f}x"] if r else ["-", "-"]
            body.append(cells)
        lines += ["", f"mode {mode}:", *text_table(head, body, 2)]
    if doc["criteria"]:
        lines += ["", "issue #23's criteria, over the cases measured (the ratio: where FLASH or CUDNN ran too):"]
        for c in doc["criteria"]:
            what = (f">= {c['target']:g} % of copy for N_k >= {COPY_FROM_NK}" if c["criterion"] == "percent_of_copy"
                    else f">= {c['target']:.2f}x the faster of FLASH and CUDNN")
            if c["worst"] is None:
                worst = ""
            elif c["criterion"] == "percent_of_copy":
                worst = f" (lowest {c['worst']:.1f} % at {c['worst_at']})"
            else:
                worst = f" (lowest {c['worst']:.2f}x at {c['worst_at']})"
            lines.append(f"  {labels.get(c['impl'], c['impl'])} {c['mode']}: {what}: {c['met']} of {c['cases']}"
                         + worst)
    lines += note_lines(doc["rows"], lambda r: f"{r['mode']} {_where(r)}")
    return "\n".join(lines)
