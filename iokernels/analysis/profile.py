"""``iokernels profile``: hardware counters (Nsight Compute) beside the kernels' own byte counters and
the model, per kernel launch.

The plain build of each chosen plan runs once in a child process under ``ncu``
(``python -m iokernels.analysis.profile --run SPEC``): inputs and buffers are made first, then each chosen stage
is launched between ``cudaProfilerStart`` and ``cudaProfilerStop`` (ncu runs with
``--profile-from-start off``), so cupy's own kernels (input copies, NaN poisoning) are not profiled.
Stages that are not chosen still run, in plan order, outside the profiled ranges, so that every
profiled stage finds the caches as a real run would leave them (which matters with
``--cache-control none``). After that the child runs the counting build of the same plan on the same
inputs and writes its counted bytes, per stage and tensor, to a file. ncu's ``--csv --page raw``
report is parsed with :mod:`csv`; its launches are matched to plan stages by kernel function name, in
launch order. Clocks are never touched (``--clock-control none``).

Per launch the report gives (atomics count as read and written, as in the kernels' counting rule 4):

- *counted*: the counting build's bytes (DESIGN.md rules); *model*: :func:`iokernels.model.exact`;
- *requested*: bytes the threads' global load, store and atomic instructions asked for
  (``smsp__sass_data_bytes_mem_global_op_{ld,st,red,atom}``, plus
  ``sm__sass_data_bytes_mem_global_op_ldgsts`` for the cp.async copies of the tensor-core kernels,
  which ncu does not count as loads): the hardware's view of what the counters count, so it must
  equal *counted* exactly;
- *L1*: bytes of the 32-byte sectors the L1 looked up for those instructions
  (``l1tex__t_bytes_pipe_lsu_mem_global_op_{ld,st,red,atom}``): at least *requested*, more where an
  instruction uses only part of a sector (one float of m per row uses 4 of 32 bytes);
- *DRAM*: ``dram__bytes_read.sum + dram__bytes_write.sum``; *DRAM/counted* below 1 is what the L2
  saved (re-reads it served), above 1 what partial sectors and write-backs cost;
- *L2 sectors*: 32-byte sectors the L1 sent to the L2 (``lts__t_sectors_srcunit_tex_op_*``), and the
  same seen from the L1 side (``l1tex__m_xbar2l1tex_read_sectors``, ``l1tex__m_l1tex2xbar_write_sectors``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..kernels.launch import copied_tensors
from ..plan import ALGORITHMS, FLOAT32_TENSORS, Plan, Stage
from .ncu import (
    CACHE_CONTROL,
    METRICS,
    check_ncu_output,
    find_ncu,
    first_problem,
    function_base,
    ncu_command,
    ncu_version,
    parse_ncu_csv,
)
from .report import count_text, text_table

# backward plans above this many N_q*N_k*batch*heads elements get inputs made on the device (the
# host reference that make_device_inputs runs for O, lse and P would need several float64 N x N arrays)
HOST_INPUT_LIMIT = 1 << 26


# ---------------------------------------------------------------------------------------------
# choosing plans and stages

def kernel_function(stage: Stage) -> str:
    """The CUDA function name of a stage's kernel, as ncu shows it ("gemm", "flash_q_outer", ...)."""
    from ..kernels.stages import SOURCES

    return SOURCES[stage.kernel][1]


def select_plans(plans: list[Plan], algorithms: str | None) -> list[Plan]:
    """Plans matching any comma-separated ``algorithm[/schedule[/pass]]`` entry (all when None)."""
    if not algorithms:
        return list(plans)
    chosen: list[Plan] = []
    for entry in (e.strip() for e in algorithms.split(",")):
        parts = entry.split("/")
        if not entry or len(parts) > 3 or parts[0] not in ALGORITHMS:
            raise ValueError(f"--algorithms: {entry!r} is not algorithm[/schedule[/pass]] with an algorithm "
                             f"from {', '.join(ALGORITHMS)}")
        hits = [p for p in plans if [p.algorithm, p.schedule, p.direction][:len(parts)] == parts]
        if not hits:
            available = ", ".join(p.label for p in plans)
            raise ValueError(f"--algorithms: {entry!r} matches none of the plans here ({available}); "
                             "backward plans need --backward")
        chosen += [p for p in hits if p not in chosen]
    return [p for p in plans if p in chosen]  # display order


def select_stages(plans: list[Plan], kernels: str | None) -> dict[str, tuple[str, ...]]:
    """Plan label -> names of the stages to profile: those whose stage name, kernel or CUDA function
    is in the comma-separated ``kernels`` (every stage when None). Plans left with none are dropped."""
    names = {k.strip() for k in kernels.split(",")} - {""} if kernels else None
    out: dict[str, tuple[str, ...]] = {}
    seen: set[str] = set()
    for plan in plans:
        stages = []
        for s in plan.stages:
            keys = {s.name, s.kernel, kernel_function(s)}
            if names is None or keys & names:
                stages.append(s.name)
                seen |= keys
        if stages:
            out[plan.label] = tuple(stages)
    if names is not None and names - seen:
        known = sorted({k for p in plans for s in p.stages for k in (s.name, s.kernel, kernel_function(s))})
        raise ValueError(f"--kernels: {', '.join(sorted(names - seen))} matches no stage of the chosen plans; "
                         f"stages and kernels here: {', '.join(known)}")
    if not out:
        raise ValueError("nothing to profile: no plan has a stage to run")
    return out


def expected_launches(plans: list[Plan], selection: dict[str, tuple[str, ...]]) -> list[tuple[Plan, Stage]]:
    """The profiled launches in the order the child makes them: plans in order, stages in plan order."""
    return [(p, s) for p in plans for s in p.stages if s.name in selection.get(p.label, ())]


# ---------------------------------------------------------------------------------------------
# ncu: finding it, running it, reading its output


def check_environment() -> str:
    """The path of ``ncu``, after checking that cupy sees a GPU; RuntimeError (one line) otherwise."""
    from ..kernels.runtime import require_cupy

    ncu = find_ncu()
    require_cupy()
    return ncu


def match_launches(launches: list[dict], expected: list[tuple[Plan, Stage]]) -> tuple[list[tuple], list[dict]]:
    """Pair ncu's launches with the plan stages the child launched, in order, by function name.

    Launches of other functions (cupy's fills and copies) are set aside and returned second. Raises
    RuntimeError when the remaining launches do not line up one to one with ``expected``."""
    functions = {kernel_function(s) for _, s in expected}
    ours = [x for x in launches if x["function"] in functions]
    ignored = [x for x in launches if x["function"] not in functions]
    want = [f"{p.label}:{s.name}({kernel_function(s)})" for p, s in expected]
    got = [x["function"] for x in ours]
    if len(ours) != len(expected) or any(x["function"] != kernel_function(s) for x, (_, s) in
                                         zip(ours, expected, strict=False)):
        raise RuntimeError(f"ncu reported {len(ours)} iokernels launches ({', '.join(got) or 'none'}), "
                           f"expected {len(expected)} ({', '.join(want)})")
    return [(p, s, x) for (p, s), x in zip(expected, ours, strict=True)], ignored


# ---------------------------------------------------------------------------------------------
# the report

def _add(*xs: int | float | None) -> int | float | None:
    return None if any(x is None for x in xs) else sum(xs)


def _ratio(a: int | float | None, b: int | float | None) -> float | None:
    return None if a is None or not b else a / b


def stage_row(plan: Plan, stage: Stage, launch: dict | None, counted: dict[str, tuple[int, int]],
              predicted: dict[str, tuple[int, int]]) -> dict:
    """One report row: a launch's metrics beside the counted and predicted bytes of its stage."""
    m = {k: (launch["metrics"].get(name) if launch else None) for k, name in METRICS.items()}
    cr, cw = sum(r for r, _ in counted.values()), sum(w for _, w in counted.values())
    pr, pw = sum(r for r, _ in predicted.values()), sum(w for _, w in predicted.values())
    rmw_req, rmw_l1 = _add(m["req_red"], m["req_atom"]), _add(m["l1_red"], m["l1_atom"])
    row = {
        "algorithm": plan.algorithm, "schedule": plan.schedule, "pass": plan.direction,
        "stage": stage.name, "kernel": stage.kernel, "function": kernel_function(stage),
        "ncu_id": launch["id"] if launch else None,
        "ncu_kernel_name": launch["kernel_name"] if launch else None,
        "grid": list(stage.grid), "threads": stage.threads,
        "counted_read_bytes": cr, "counted_write_bytes": cw, "counted_bytes": cr + cw,
        "predicted_read_bytes": pr, "predicted_write_bytes": pw, "predicted_bytes": pr + pw,
        "copy_engine_read_bytes": sum(counted.get(t, (0, 0))[0] for t in copied_tensors(stage.kernel)),
        "copy_engine_write_bytes": sum(counted.get(t, (0, 0))[1] for t in copied_tensors(stage.kernel)),
        "requested_read_bytes": _add(m["req_ld"], m["req_ldgsts"], rmw_req),
        "requested_write_bytes": _add(m["req_st"], rmw_req),
        "l1_read_bytes": _add(m["l1_ld"], rmw_l1), "l1_write_bytes": _add(m["l1_st"], rmw_l1),
        "dram_read_bytes": m["dram_read"], "dram_write_bytes": m["dram_write"],
        "l2_read_sectors": m["l2_read_sectors"], "l2_write_sectors": m["l2_write_sectors"],
        "l2_red_sectors": m["l2_red_sectors"], "l2_atom_sectors": m["l2_atom_sectors"],
        "l1_to_l2_read_sectors": m["xbar_read_sectors"], "l1_to_l2_write_sectors": m["xbar_write_sectors"],
        "duration_ns": m["duration_ns"],
        "tensors": [{"tensor": t, "counted_read_bytes": counted.get(t, (0, 0))[0],
                     "counted_write_bytes": counted.get(t, (0, 0))[1],
                     "predicted_read_bytes": predicted.get(t, (0, 0))[0],
                     "predicted_write_bytes": predicted.get(t, (0, 0))[1]}
                    for t in [*predicted, *(t for t in counted if t not in predicted)]],
        "metrics": dict(launch["metrics"]) if launch else {},
    }
    _derived(row)
    return row


def _derived(row: dict) -> None:
    row["requested_bytes"] = _add(row["requested_read_bytes"], row["requested_write_bytes"])
    row["l1_bytes"] = _add(row["l1_read_bytes"], row["l1_write_bytes"])
    row["dram_bytes"] = _add(row["dram_read_bytes"], row["dram_write_bytes"])
    row["requested_over_counted"] = _ratio(row["requested_bytes"], row["counted_bytes"])
    row["l1_over_counted"] = _ratio(row["l1_bytes"], row["counted_bytes"])
    row["dram_over_counted"] = _ratio(row["dram_bytes"], row["counted_bytes"])


_SUMMED = ("counted_read_bytes", "counted_write_bytes", "counted_bytes", "copy_engine_read_bytes",
           "copy_engine_write_bytes",
           "predicted_read_bytes", "predicted_write_bytes", "predicted_bytes", "requested_read_bytes",
           "requested_write_bytes", "l1_read_bytes", "l1_write_bytes", "dram_read_bytes", "dram_write_bytes",
           "l2_read_sectors", "l2_write_sectors", "l2_red_sectors", "l2_atom_sectors", "l1_to_l2_read_sectors",
           "l1_to_l2_write_sectors", "duration_ns")


def total_row(plan: Plan, rows: list[dict]) -> dict:
    """The profiled stages of one plan added up (stage "all")."""
    row = {"algorithm": plan.algorithm, "schedule": plan.schedule, "pass": plan.direction, "stage": "all",
           "kernel": "-", "function": "-", "stages": [r["stage"] for r in rows],
           "complete": len(rows) == len(plan.stages)}
    for key in _SUMMED:
        row[key] = _add(*(r[key] for r in rows))
    _derived(row)
    return row


def build_document(plans: list[Plan], matched: list[tuple], counts: dict[str, dict], header: dict,
                   ignored: list[dict] | None = None) -> dict:
    """The report: ``header`` (extended with the problem and plans), ``rows`` (per plan: its total,
    then one row per profiled launch) and ``ignored_launches``. ``counts``: plan label -> counted
    bytes per stage and tensor (the counting build)."""
    from .. import model

    rows = []
    for plan in plans:
        mine = [(s, x) for p, s, x in matched if p is plan]
        if not mine:
            continue
        exact = model.exact(plan)
        counted = counts.get(plan.label, {})
        stage_rows = [stage_row(plan, s, x, {t: tuple(rw) for t, rw in counted.get(s.name, {}).items()},
                                exact.get(s.name, {})) for s, x in mine]
        rows += [total_row(plan, stage_rows), *stage_rows]
    first = plans[0]
    head = {"dtype": first.dtype, "N_q": first.N_q, "N_k": first.N_k, "d": first.d, "batch": first.batch,
            "heads": first.heads, "sram_bytes": first.sram_bytes, "clock_control": "none",
            "metrics": list(METRICS.values()), **header,
            "plans": [p.as_dict() for p in plans]}
    return {"header": head, "rows": rows,
            "ignored_launches": [{"id": x["id"], "kernel_name": x["kernel_name"]} for x in ignored or []]}


# ---------------------------------------------------------------------------------------------
# running it

def profile(plans: list[Plan], selection: dict[str, tuple[str, ...]] | None = None, *, cache_control: str = "all",
            seed: int = 0, ncu: str | None = None, timeout: float | None = None) -> dict:
    """Profile the chosen stages of ``plans`` under ncu; returns the report document.

    Raises RuntimeError (one line) when ncu is missing (:class:`NcuMissing`), may not read the
    counters (:class:`NcuPermissionError`), there is no GPU or cupy, or the run fails."""
    selection = select_stages(plans, None) if selection is None else selection
    plans = [p for p in plans if p.label in selection]
    if cache_control not in CACHE_CONTROL:
        raise ValueError(f"--cache-control must be one of {', '.join(CACHE_CONTROL)}, got {cache_control!r}")
    ncu = ncu or check_environment()
    expected = expected_launches(plans, selection)
    with tempfile.TemporaryDirectory(prefix="iokernels-profile-") as tmp:
        spec_path, out_path, log_path = (os.path.join(tmp, n) for n in ("spec.pickle", "child.json", "ncu.log"))
        with open(spec_path, "wb") as f:
            pickle.dump({"plans": plans, "selection": selection, "seed": seed, "out": out_path}, f)
        command = ncu_command(ncu, spec_path, log_path, cache_control)
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"ncu did not finish within {timeout} s") from exc
        log = Path(log_path).read_text(errors="replace") if os.path.exists(log_path) else ""
        check_ncu_output(proc.returncode, "\n".join((log, proc.stdout, proc.stderr)))
        launches = parse_ncu_csv(log) or parse_ncu_csv(proc.stdout)
        if not os.path.exists(out_path):
            raise RuntimeError("the profiled program wrote no results: " +
                               (proc.stderr.strip().splitlines() or ["no error output"])[-1])
        child = json.loads(Path(out_path).read_text())
    if not launches:
        raise RuntimeError(f"ncu profiled no kernel launch: {first_problem(log + proc.stdout)}")
    matched, ignored = match_launches(launches, expected)
    shown = [c if c not in (spec_path, log_path) else f"<{Path(c).name}>" for c in command]
    header = {"source": "ncu", "ncu_version": ncu_version(ncu), "ncu_command": [Path(shown[0]).name, *shown[1:]],
              "cache_control": cache_control, "seed": seed, "environment": child.get("environment", {}),
              "inputs": child.get("inputs", {}), "selection": {k: list(v) for k, v in selection.items()},
              "note": "plain build under ncu; counted: counting build on the same inputs; model: model.exact"}
    return build_document(plans, matched, child["counts"], header, ignored)


# ---------------------------------------------------------------------------------------------
# the child process (runs under ncu)

def _profiler(on: bool) -> None:
    from ..kernels.runtime import require_cupy

    cp = require_cupy()
    rt = cp.cuda.runtime
    if hasattr(rt, "profilerStart"):
        (rt.profilerStart if on else rt.profilerStop)()
    else:  # pragma: no cover - older cupy
        (cp.cuda.profiler.start if on else cp.cuda.profiler.stop)()


def device_inputs(plan: Plan, seed: int = 0) -> tuple[dict[str, Any], str]:
    """Inputs for one plan on the device, and how they were made. :func:`launch.make_device_inputs`
    (random, and for backward plans O, lse and P from the float64 reference on the host) up to
    :data:`HOST_INPUT_LIMIT`; larger backward plans get random values made on the device (lse =
    log N_k, P = 1/N_k), which move the same bytes: no kernel's memory accesses depend on values."""
    from ..kernels import launch
    from ..kernels.runtime import require_cupy

    if plan.direction == "fwd" or plan.bh * plan.N_q * plan.N_k <= HOST_INPUT_LIMIT:
        return launch.make_device_inputs(plan, seed)[0], "make_device_inputs"
    cp = require_cupy()
    rng = cp.random.default_rng(seed)
    out = {}
    for name in launch.INPUTS[plan.direction]:
        if name not in launch.plan_tensors(plan):
            continue
        shape = launch.tensor_shape(plan, name)
        if name == "lse":
            x = cp.full(shape, math.log(plan.N_k), dtype=cp.float32)
        elif name == "P":
            x = cp.full(shape, 1.0 / plan.N_k, dtype=cp.float32)
        else:
            x = rng.standard_normal(shape, dtype=cp.float32)
        out[name] = x if name in FLOAT32_TENSORS else launch.to_device(x, plan.dtype)
        del x
    return out, "random on the device (O, lse, P not from a forward pass)"


def run_child(spec_path: str) -> None:
    """Under ncu: launch the chosen stages of each plan (plain build), profiled one by one, then the
    counting build of the whole plan; counted bytes go to the spec's ``out`` file."""
    from ..kernels import launch
    from ..kernels.runtime import require_cupy
    from ..simulate import reference
    from .compare import environment

    with open(spec_path, "rb") as f:
        spec = pickle.load(f)  # written by profile() in this session's own temporary directory
    cp = require_cupy()
    pool = cp.get_default_memory_pool()
    counts, inputs_made = {}, {}
    for plan in spec["plans"]:
        chosen = set(spec["selection"][plan.label])
        inputs, inputs_made[plan.label] = device_inputs(plan, spec["seed"])
        scale = reference.default_scale(plan.d)
        buffers, _ = launch.allocate(plan, inputs)
        launch.compile_plan(plan, counting=False)
        launch.compile_plan(plan, counting=True)
        cp.cuda.Device().synchronize()
        for stage in plan.stages:
            if stage.name in chosen:
                _profiler(True)
            launch.launch_stage(plan, stage, buffers, scale, counting=False)
            cp.cuda.Device().synchronize()
            if stage.name in chosen:
                _profiler(False)
        del buffers
        pool.free_all_blocks()
        run = launch.run_plan(plan, inputs, counting=True, scale=scale)
        counts[plan.label] = {s: {t: list(rw) for t, rw in ts.items()} for s, ts in run.counts.items()}
        del run, inputs
        pool.free_all_blocks()
    with open(spec["out"], "w") as f:
        json.dump({"counts": counts, "inputs": inputs_made, "environment": environment()}, f)


# ---------------------------------------------------------------------------------------------
# text

def _ratio_text(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def header_text(doc: dict) -> str:
    h = doc["header"]
    env = h.get("environment") or {}
    cc = h.get("cache_control")
    cc_text = {"all": "all (L1 and L2 flushed before every replay pass)",
               "none": "none (caches as the previous launch left them)"}.get(cc, str(cc))
    lines = [f"device: {env.get('gpu', '?')}  cupy {env.get('cupy', '?')}  CUDA runtime "
             f"{env.get('cuda_runtime', '?')}  driver {env.get('cuda_driver', '?')}  {env.get('date', '')}",
             f"Nsight Compute {h.get('ncu_version') or '?'}: --cache-control {cc_text}; --clock-control none",
             f"N_q={h['N_q']}  N_k={h['N_k']}  d={h['d']}  {h['dtype']}  batch={h['batch']}  heads={h['heads']}  "
             f"M={h['sram_bytes']:,} bytes",
             f"{h.get('note', '')}"]
    inputs = {v for v in (h.get("inputs") or {}).values() if v != "make_device_inputs"}
    if inputs:
        lines.append("inputs: " + "; ".join(sorted(inputs)))
    return "\n".join(lines)


FOOTNOTES = """\
counted: the counting build (DESIGN.md rules); model: model.exact; requested: bytes the threads' global
  loads, stores and atomics asked for (smsp__sass_data_bytes_mem_global_op_*), must equal counted;
L1: 32-byte sectors the L1 looked up for them (l1tex__t_bytes_pipe_lsu_mem_global_op_*), >= requested;
  atomics count as read and written in counted, requested and L1 alike;
DRAM: dram__bytes_read + dram__bytes_write; DRAM/counted < 1 is what the L2 saved;
L2 sectors: 32-byte sectors the L1 sent to the L2 (lts__t_sectors_srcunit_tex_op_read / write / red+atom)."""


def render(doc: dict, *, detail: bool = False) -> str:
    headers = ["algorithm", "schedule", "pass", "stage", "kernel", "counted B", "model B", "requested B",
               "L1 B", "L1/counted", "DRAM read B", "DRAM write B", "DRAM/counted", "L2 rd sect",
               "L2 wr sect", "L2 red sect", "us"]
    body = []
    for r in doc["rows"]:
        red = _add(r["l2_red_sectors"], r["l2_atom_sectors"])
        dur = r.get("duration_ns")
        body.append([r["algorithm"], r["schedule"], r["pass"], r["stage"], r["function"],
                     count_text(r["counted_bytes"]), count_text(r["predicted_bytes"]), count_text(r["requested_bytes"]),
                     count_text(r["l1_bytes"]), _ratio_text(r["l1_over_counted"]), count_text(r["dram_read_bytes"]),
                     count_text(r["dram_write_bytes"]), _ratio_text(r["dram_over_counted"]),
                     count_text(r["l2_read_sectors"]),
                     count_text(r["l2_write_sectors"]), count_text(red), "-" if dur is None else f"{dur / 1e3:.1f}"])
        if detail:
            for t in r.get("tensors", []):
                body.append(["", "", "", "", f"  {t['tensor']}",
                             f"{t['counted_read_bytes']:,}r {t['counted_write_bytes']:,}w",
                             f"{t['predicted_read_bytes']:,}r {t['predicted_write_bytes']:,}w",
                             *[""] * (len(headers) - 7)])
    out = [header_text(doc), "", text_table(headers, body, set(range(5, len(headers)))), "", FOOTNOTES]
    ignored = doc.get("ignored_launches") or []
    if ignored:
        out.append(f"ignored {len(ignored)} launches of other kernels: "
                   + ", ".join(sorted({function_base(x['kernel_name']) for x in ignored})))
    return "\n".join(out)


def summary(docs: list[dict]) -> str:
    """One line per (N, cache control, plan): the plan totals of several reports side by side."""
    headers = ["N_q", "N_k", "cache", "algorithm", "schedule", "pass", "counted B", "requested B", "L1 B",
               "L1/counted", "DRAM B", "DRAM/counted"]
    body = []
    for doc in sorted(docs, key=lambda d: (d["header"]["N_q"], d["header"]["N_k"], d["header"].get("cache_control"))):
        h = doc["header"]
        for r in (x for x in doc["rows"] if x["stage"] == "all"):
            body.append([str(h["N_q"]), str(h["N_k"]), str(h.get("cache_control")), r["algorithm"], r["schedule"],
                         r["pass"], count_text(r["counted_bytes"]), count_text(r["requested_bytes"]),
                         count_text(r["l1_bytes"]),
                         _ratio_text(r["l1_over_counted"]), count_text(r["dram_bytes"]),
                         _ratio_text(r["dram_over_counted"])])
    return text_table(headers, body, {0, 1, *range(6, len(headers))})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iokernels.analysis.profile",
                                     description="the child process of `iokernels profile`, and report rendering")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--run", metavar="SPEC", help="(under ncu) launch the stages a spec file names")
    group.add_argument("--render", metavar="JSON", help="print the text table of a `profile --json` document")
    group.add_argument("--summary", metavar="JSON", nargs="+", help="plan totals of several documents")
    parser.add_argument("--detail", action="store_true", help="with --render: per-tensor bytes")
    args = parser.parse_args(argv)
    if args.run:
        run_child(args.run)
    elif args.render:
        print(render(json.loads(Path(args.render).read_text()), detail=args.detail))
    else:
        print(summary([json.loads(Path(p).read_text()) for p in args.summary]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
