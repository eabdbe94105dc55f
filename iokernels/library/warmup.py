"""``iokernels warmup``: compile the kernels the library's common calls run, before the first call.

Each kernel is compiled once per device and process (``launch.kernel_function`` is memoized on the kernel,
build, device and shared memory) and cupy keeps the compiled modules in its on-disk cache
(``CUPY_CACHE_DIR``), so a warm-up in one process also shortens the first call of the next.
"""

from __future__ import annotations

import time
from typing import Any

from ..plan import Plan

# sequence lengths whose plans are compiled: the tensor-core forward picks its tiles by N, and standard
# attention's row-wise kernels their rows per block by N_k (the same from N_k = 4096 on)
WARMUP_NS = (1024, 4096, 16384)
WARMUP_ALGORITHMS = ("flash", "two_pass", "standard")
_SCHEDULES = {"flash": (None,), "standard": (None,), "two_pass": ("store", "recompute")}


def warmup_plans(dtypes: list[str], ds: list[int], algorithms: tuple[str, ...] = ("flash",), *,
                 causal: bool = False, backward: bool = True, ns: tuple[int, ...] = WARMUP_NS) -> list[Plan]:
    """The plans ``iokernels.attention`` (and with ``backward``, ``attention_backward``) picks on this
    device for each dtype, head dim and algorithm, at N_q = N_k = each of ``ns``, keeping a plan only
    when it brings a kernel (module) the earlier ones do not; ``causal`` adds the causal plans. No GPU
    needed (without one: the H200's plans)."""
    from ..kernels.stages import plan_kernels
    from ..plan import normalize_causal
    from .api import choose_plan

    for algorithm in algorithms:
        if algorithm not in WARMUP_ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}: expected one of {', '.join(WARMUP_ALGORITHMS)}")
    plans: list[Plan] = []
    kernels: set = set()
    masks = ("", normalize_causal(True)) if causal else ("",)
    for dtype in dtypes:
        for d in ds:
            for algorithm in algorithms:
                for mask in masks:
                    jobs = [("fwd", s) for s in _SCHEDULES[algorithm]]
                    if backward and algorithm != "two_pass":
                        jobs.append(("bwd", None))
                    for direction, schedule in jobs:
                        for n in ns:
                            plan, _ = choose_plan(direction, algorithm, schedule, n, n, d, dtype, (1,), None, 1,
                                                   mask)
                            refs = {ref for _, ref in plan_kernels(plan)}
                            if not refs <= kernels:
                                kernels |= refs
                                plans.append(plan)
    return plans


def warmup(plans: list[Plan], progress: Any = None) -> list[dict[str, Any]]:
    """Compile (plain build) every plan's kernels on the current device; one row per plan with the
    seconds it took (about 0 for kernels an earlier plan or the on-disk cache already had). The plans
    of the smallest N also run once, on zeros, so that the cupy kernels a call uses besides the plan's
    (the NaN fill of outputs, copies, the logsumexp) are compiled and cached too."""
    from ..kernels import launch

    rows = []
    smallest = min((p.N_q for p in plans), default=0)
    for plan in plans:
        if progress is not None:
            progress(plan)
        start = time.perf_counter()
        launch.compile_plan(plan)
        if plan.N_q == smallest:
            cp = launch.require_cupy()
            needed = set(launch.plan_tensors(plan))
            inputs = {name: cp.zeros(launch.tensor_shape(plan, name), dtype=launch.tensor_dtype(plan, name))
                      for name in launch.INPUTS[plan.direction] if name in needed}
            launch.run_plan(plan, inputs)
            cp.cuda.get_current_stream().synchronize()
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
