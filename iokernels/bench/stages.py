"""``iokernels kernel-bench``: each kernel stage's speed against the GPU's own yardsticks, in one run.

- row-wise passes (softmax, D, dS, ...): bandwidth from counted bytes, as a fraction of a
  device-to-device copy's bandwidth (bytes read + written per second) measured in the same run;
- matrix-product passes of standard attention: time of ``cupy.matmul`` (cuBLAS) on the same shapes and
  dtype over the kernel's time (bfloat16 has no cupy dtype: its products are compared with float16's);
- every stage of every plan: counting build time over plain build time.
Times are medians of CUDA-event timings of CUDA-graph replays after warm-up (each stage alone, and
the whole plan; see :func:`iokernels.kernels.timing.graph_seconds`), so host launch latency is not kernel time.
"""

from __future__ import annotations

from typing import Any

from .. import model
from ..analysis.compare import environment
from ..kernels import launch, timing
from ..kernels.stages import GEMMS, ROWWISE
from ..plan import Plan


def _matmul_seconds(plan: Plan, stage: str, buffers: dict[str, Any], warmup: int, repeats: int) -> float:
    cp = launch.require_cupy()
    trans_a, trans_b, a, b, c = GEMMS[stage]

    def operand(name: str, trans: int) -> Any:
        x = buffers[name]
        if x.dtype == cp.uint16:  # bfloat16 bits: cuBLAS through cupy has no bfloat16, time float16
            x = x.view(cp.float16)
        return x.transpose(0, 2, 1) if trans else x

    left, right = operand(a, trans_a), operand(b, trans_b)
    out = cp.empty(buffers[c].shape, dtype=left.dtype)
    return timing.event_seconds(lambda: cp.matmul(left, right, out=out), warmup=warmup, repeats=repeats)


def kernel_bench(plans: list[Plan], *, warmup: int = 3, repeats: int = 20) -> dict:
    copy_bw = timing.copy_bandwidth()
    rows = []
    for plan in plans:
        inputs, _ = launch.make_device_inputs(plan, seed=0)
        plain_total, plain = timing.time_plan(plan, inputs, warmup=warmup, repeats=repeats)
        count_total, counted = timing.time_plan(plan, inputs, counting=True, warmup=warmup, repeats=repeats)
        exact = model.exact(plan)
        buffers = launch.run_plan(plan, inputs).buffers
        for stage in plan.stages:
            nbytes = sum(r + w for r, w in exact[stage.name].values())
            row = {"algorithm": plan.algorithm, "schedule": plan.schedule, "pass": plan.direction,
                   "stage": stage.name, "kernel": stage.kernel, "bytes": nbytes,
                   "plain_seconds": plain[stage.name], "counting_seconds": counted[stage.name],
                   "counting_over_plain": counted[stage.name] / plain[stage.name],
                   "bandwidth_bytes_per_s": nbytes / plain[stage.name],
                   "fraction_of_copy": None, "matmul_seconds": None, "fraction_of_matmul": None}
            if stage.kernel in ROWWISE:
                row["fraction_of_copy"] = row["bandwidth_bytes_per_s"] / copy_bw
            if stage.kernel == "gemm":
                row["matmul_seconds"] = _matmul_seconds(plan, stage.name, buffers, warmup, repeats)
                row["fraction_of_matmul"] = row["matmul_seconds"] / plain[stage.name]
            rows.append(row)
        rows.append({"algorithm": plan.algorithm, "schedule": plan.schedule, "pass": plan.direction,
                     "stage": "all", "kernel": "-", "bytes": sum(r["bytes"] for r in rows[-len(plan.stages):]),
                     "plain_seconds": plain_total, "counting_seconds": count_total,
                     "counting_over_plain": count_total / plain_total,
                     "bandwidth_bytes_per_s": None, "fraction_of_copy": None, "matmul_seconds": None,
                     "fraction_of_matmul": None})
        del buffers
    first = plans[0]
    header = {"environment": environment(), "copy_bandwidth_bytes_per_s": copy_bw, "dtype": first.dtype,
              "N_q": first.N_q, "N_k": first.N_k, "d": first.d, "batch": first.batch, "heads": first.heads,
              "sram_bytes": first.sram_bytes, "warmup": warmup, "repeats": repeats,
              "plans": [p.as_dict() for p in plans]}
    return {"header": header, "rows": rows}


def render(doc: dict) -> str:
    h = doc["header"]
    env = h["environment"]
    lines = [f"device: {env.get('gpu')}  cupy {env.get('cupy')}  CUDA runtime {env.get('cuda_runtime')}  "
             f"{env.get('date')}",
             f"N_q={h['N_q']} N_k={h['N_k']} d={h['d']} {h['dtype']} batch={h['batch']} heads={h['heads']} "
             f"M={h['sram_bytes']} bytes; kernels: median of {h['repeats']} CUDA-graph replays after "
             f"{h['warmup']} warm-ups; copy and cupy.matmul: median of {h['repeats']} CUDA-event timings",
             f"device-to-device copy: {h['copy_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s (read + written)", ""]
    head = ["algorithm", "schedule", "pass", "stage", "plain ms", "count ms", "count/plain", "GB/s",
            "of copy", "matmul ms", "of matmul"]
    body = []
    for r in doc["rows"]:
        def f(x, fmt):
            return "-" if x is None else format(x, fmt)
        body.append([r["algorithm"], r["schedule"], r["pass"], r["stage"], f(r["plain_seconds"] * 1e3, ".3f"),
                     f(r["counting_seconds"] * 1e3, ".3f"), f(r["counting_over_plain"], ".2f"),
                     f(r["bandwidth_bytes_per_s"] and r["bandwidth_bytes_per_s"] / 1e9, ".0f"),
                     f(r["fraction_of_copy"], ".0%"), f(r["matmul_seconds"] and r["matmul_seconds"] * 1e3, ".3f"),
                     f(r["fraction_of_matmul"], ".0%")])
    widths = [max(len(x), *(len(b[i]) for b in body)) for i, x in enumerate(head)]
    for row in [head, ["-" * w for w in widths], *body]:
        lines.append("  ".join(c.rjust(w) if i > 3 else c.ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(lines)
