"""``iokernels warmup``: compile the kernels the library's common calls run, before the first call.

Each kernel is compiled once per device and process (``gpu._function`` is memoized on the kernel,
build, device and shared memory) and cupy keeps the compiled modules in its on-disk cache
(``CUPY_CACHE_DIR``), so a warm-up in one process also shortens the first call of the next.
"""

from __future__ import annotations

import time
from typing import Any

from .plan import Plan

WARMUP_N = 4096  # standard attention's row-wise kernels take rows per block from N_k; the others do not
WARMUP_ALGORITHMS = ("flash", "two_pass", "standard")
_SCHEDULES = {"flash": (None,), "standard": (None,), "two_pass": ("store", "recompute")}


def warmup_plans(dtypes: list[str], ds: list[int], algorithms: tuple[str, ...] = ("flash",), *,
                 causal: bool = False, backward: bool = True, n: int = WARMUP_N) -> list[Plan]:
    """The plans ``iokernels.attention`` (and with ``backward``, ``attention_backward``) picks on this
    device for each dtype, head dim and algorithm, at N_q = N_k = ``n``; ``causal`` adds the causal
    plans. No GPU needed (without one: the H200's plans)."""
    from .api import _choose_plan
    from .plan import normalize_causal

    for algorithm in algorithms:
        if algorithm not in WARMUP_ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}: expected one of {', '.join(WARMUP_ALGORITHMS)}")
    plans: list[Plan] = []
    masks = ("", normalize_causal(True)) if causal else ("",)
    for dtype in dtypes:
        for d in ds:
            for algorithm in algorithms:
                for mask in masks:
                    jobs = [("fwd", s) for s in _SCHEDULES[algorithm]]
                    if backward and algorithm != "two_pass":
                        jobs.append(("bwd", None))
                    for direction, schedule in jobs:
                        plan, _ = _choose_plan(direction, algorithm, schedule, n, n, d, dtype, (1,), None, 1, mask)
                        if plan not in plans:
                            plans.append(plan)
    return plans


def warmup(plans: list[Plan], progress: Any = None) -> list[dict[str, Any]]:
    """Compile (plain build) every plan's kernels on the current device; one row per plan with the
    seconds it took (about 0 for kernels an earlier plan or the on-disk cache already had)."""
    from . import gpu

    rows = []
    for plan in plans:
        if progress is not None:
            progress(plan)
        start = time.perf_counter()
        gpu.compile_plan(plan)
        rows.append({"plan": plan.label, "dtype": plan.dtype, "d": plan.d, "causal": plan.causal or "-",
                     "kernels": ",".join(dict.fromkeys(s.kernel for s in plan.stages)),
                     "seconds": time.perf_counter() - start})
    return rows


def render(rows: list[dict[str, Any]], cache: str) -> str:
    headers = ["plan", "dtype", "d", "causal", "kernels", "seconds"]
    body = [[r["plan"], r["dtype"], str(r["d"]), r["causal"], r["kernels"], f"{r['seconds']:.2f}"] for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(headers)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in [headers, ["-" * w for w in widths], *body]]
    total = sum(r["seconds"] for r in rows)
    lines.append(f"\ncompiled {len(rows)} plans in {total:.2f} s; kernel cache: {cache}")
    return "\n".join(lines)
