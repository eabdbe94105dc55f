"""compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over every kernel variant in use.

``python -m iokernels.analysis.sanitize [--tools memcheck,racecheck,initcheck,synccheck] [--quick] [--out DIR]``

:func:`variants` lists what runs: every algorithm, schedule and direction of
:data:`iokernels.plan.SCHEDULES`, every dtype its plans take, the causal mask in both alignments where a
plan has it, the tensor-core ``flash/fast`` kernels (``wgmma`` and ``mma`` forward with and without
grouped-query K/V, the backward's tile fallbacks and ``deterministic=True``) and the forced tiles of the
block-size study, each in its counting and its plain build, at small ragged sizes (N of 1, 17 and 113,
N_q ≠ N_k; d of 16 and 128, or 64 and 128 on the tensor-core path, and 96 for its wgmma backward), batch·heads = 2.

Each tool runs a driver (this module with ``--driver``) under ``compute-sanitizer --tool X
--error-exitcode 1``; the variants are split in shards (all sizes and builds of one configuration in the
same shard, so that its modules load once) that run side by side. Before that, one pass without the
sanitizer compiles every module into cupy's cache. The driver disables cupy's memory pool, so every
tensor is its own ``cudaMalloc``: memcheck sees the end of each tensor, and initcheck sees workspace that no
kernel wrote (the driver leaves outputs and workspace unfilled, as ``run_plan`` does unless
``IOKERNELS_DEBUG_POISON`` asks for NaN). It synchronizes after every launch, so each report lands between
the ``begin`` and ``end`` lines of its variant, and checks each counting run against ``model.exact``. A
variant that leaves the CUDA context unusable (memcheck stops a faulting kernel) ends its process; the shard
restarts after it.

The per-tool table sums the "ERROR SUMMARY: N errors" lines (racecheck: its "RACECHECK SUMMARY");
the exit code is 0 only when every tool reports 0 errors and every variant ran; 2 when
compute-sanitizer is missing. The logs, ``summary.txt`` and ``summary.json`` go to ``--out``.
API errors are not reported (``--report-api-errors no``): cupy and NVRTC probe calls that fail by
design, and a failing launch of ours raises in the driver, which the table counts as a failed variant.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import click
import numpy as np

from ..kernels.runtime import source_commit
from .sanitize_cases import QUICK_SHAPES, SHAPES, Variant, shard, variants

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
MARK = "IOK-SANITIZE"
DEFAULT_OUT = "results/sanitize"
MAX_RESTARTS = 50  # per shard: a variant that breaks the CUDA context ends its process; the next one restarts


# ---------------------------------------------------------------------------------------------
# the driver: runs under compute-sanitizer, one process per (tool, shard)

def _say(*parts: object) -> None:
    print(MARK, *parts, flush=True)


def _run_variant(v: Variant) -> str:
    """Launch every stage of the variant's plan once, synchronizing after each; "" or what went wrong."""
    from .. import model
    from ..kernels import launch
    from ..plan.tensors import OUTPUTS
    from ..simulate import reference

    cp = launch.require_cupy()
    plan = v.plan
    inputs, _ = launch.make_device_inputs(plan, seed=v.index)
    # outputs and workspace left unwritten, for initcheck; masks as every launch gets them
    buffers, _ = launch.allocate(plan, inputs, poison_outputs=False)
    scale = reference.default_scale(plan.d)
    counts = {}
    for stage in plan.stages:
        counters = launch.new_counters() if v.counting else None
        launch.launch_stage(plan, stage, buffers, scale, v.counting, counters)
        cp.cuda.Device().synchronize()
        if v.counting:
            counts[stage.name] = launch.counts_from(cp.asnumpy(counters))
    problems = []
    if v.counting and counts != model.exact(plan):
        problems.append("counters differ from model.exact")
    for name in OUTPUTS[plan.direction]:
        if not np.all(np.isfinite(launch.to_float64(buffers[name], plan.dtype))):
            problems.append(f"{name} is not finite")
    return "; ".join(problems)


def _context_usable() -> bool:
    import cupy as cp

    try:
        cp.cuda.Device().synchronize()
        cp.zeros(1).sum().item()
    except Exception:
        return False
    return True


def drive(quick: bool, shard_index: int, shard_count: int, resume_after: int, compile_only: bool) -> int:
    """Run (or, ``compile_only``, compile) this shard's variants after index ``resume_after``."""
    from ..kernels import launch

    cp = launch.require_cupy()
    cp.cuda.set_allocator(None)  # every tensor its own cudaMalloc: the sanitizers see each tensor's bounds
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    _say("device", f"name={name!r}", f"cc={cp.cuda.Device().compute_capability}", f"cupy={cp.__version__}",
         f"cuda_runtime={cp.cuda.runtime.runtimeGetVersion()}", f"driver={cp.cuda.runtime.driverGetVersion()}")
    failed = False
    for v in shard(variants(quick), shard_index, shard_count):
        if v.index <= resume_after:
            continue
        _say("begin", v.index, v.label)
        start = time.perf_counter()
        try:
            if compile_only:
                launch.compile_plan(v.plan, v.counting)
                problem = ""
            else:
                problem = _run_variant(v)
        except launch.ArchUnavailable as exc:
            _say("end", v.index, "skip", str(exc))
            continue
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}".replace("\n", " ")
            if not compile_only and not _context_usable():
                _say("end", v.index, "fail", problem)
                _say("abort", v.index, "the CUDA context is unusable")
                return 3
        seconds = f"{time.perf_counter() - start:.2f}s"
        if problem:
            failed = True
            _say("end", v.index, "fail", seconds, problem)
        else:
            _say("end", v.index, "ok", seconds)
    _say("done")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# parsing the sanitizer's output

_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_REPORT = re.compile(r"^=+ (?:Invalid|Uninitialized|Error|Warning|Barrier|Program hit|Misaligned|Race|Potential|"
                     r"Out-of-range|Illegal|Address|Cuda|Malloc|Free|Leaked|Divergent|Syncwarp)")
_EVENT = re.compile(rf"^{MARK} (begin|end|abort) (\d+)(?: (\S+))?(?: (.*))?$")


@dataclass
class Summary:
    """What one tool's output says: errors (summed over its processes' summary lines), racecheck
    warnings, how many summary lines there were, variants by outcome, and the variants with reports."""

    errors: int = 0
    warnings: int = 0
    summaries: int = 0
    ok: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)
    reported: dict[int, int] = field(default_factory=dict)  # variant index -> sanitizer report lines
    unattributed: int = 0  # report lines outside any variant


def parse_output(text: str) -> Summary:
    """Parse a driver's output under compute-sanitizer (several processes' outputs concatenated)."""
    out = Summary()
    current: int | None = None
    for line in text.splitlines():
        m = _ERROR_SUMMARY.search(line)
        if m:
            out.errors += int(m.group(1))
            out.summaries += 1
            continue
        m = _RACE_SUMMARY.search(line)
        if m:
            out.warnings += int(m.group(3))
            out.summaries += 1
            if "ERROR SUMMARY" not in text:  # versions that print only the racecheck line
                out.errors += int(m.group(2))
            continue
        m = _EVENT.match(line)
        if m:
            kind, index, outcome, rest = m.group(1), int(m.group(2)), m.group(3), m.group(4) or ""
            if kind == "begin":
                current = index
            elif kind == "end":
                current = None
                if outcome == "ok":
                    out.ok.append(index)
                elif outcome == "skip":
                    out.skipped[index] = rest
                else:
                    out.failed[index] = rest
            continue
        if _REPORT.match(line):
            if current is None:
                out.unattributed += 1
            else:
                out.reported[current] = out.reported.get(current, 0) + 1
    return out


def progress(text: str) -> tuple[bool, int | None, bool]:
    """Where one driver process got to: (it printed ``done``, the last variant it began, whether that
    variant ended)."""
    done, last, ended = False, None, False
    for line in text.splitlines():
        m = _EVENT.match(line)
        if m and m.group(1) == "begin":
            last, ended = int(m.group(2)), False
        elif m and m.group(1) == "end" and int(m.group(2)) == last:
            ended = True
        elif line.strip() == f"{MARK} done":
            done = True
    return done, last, ended


# ---------------------------------------------------------------------------------------------
# the parent: finds compute-sanitizer, runs the shards, writes the table

def find_sanitizer(explicit: str | None = None) -> str | None:
    """compute-sanitizer: ``explicit``, $COMPUTE_SANITIZER, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, or a
    pip wheel's copy (nvidia-cuda-sanitizer-api) under site-packages."""
    candidates = [explicit, os.environ.get("COMPUTE_SANITIZER"), shutil.which("compute-sanitizer")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "bin", "compute-sanitizer"))
    site = sysconfig.get_paths().get("purelib", "")
    candidates += sorted(glob.glob(os.path.join(site, "nvidia", "**", "compute-sanitizer"), recursive=True))
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _driver_cmd(quick: bool, index: int, count: int, resume_after: int, compile_only: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "iokernels.analysis.sanitize", "--driver", "--shard", f"{index}/{count}",
           "--resume-after", str(resume_after)]
    return cmd + (["--quick"] if quick else []) + (["--compile-only"] if compile_only else [])


def _run_logged(cmd: list[str], log: Path, timeout: float) -> tuple[int | str, str]:
    """Run ``cmd`` appending its output to ``log``; (exit code or "timeout", the new output)."""
    start = log.stat().st_size if log.exists() else 0
    with open(log, "ab") as f:
        f.write(f"$ {' '.join(cmd)}\n".encode())
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
        try:
            rc: int | str = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session this call started: the sanitizer and its target
            proc.wait()
            rc = "timeout"
    with open(log, "rb") as f:
        f.seek(start)
        # NUL bytes in place of the spaces of some lines were seen in H200 logs (cause unknown); read them as
        # spaces, so that the progress lines still parse
        return rc, f.read().decode(errors="replace").replace("\x00", " ")


@dataclass
class ShardRun:
    tool: str
    index: int
    log: Path
    exit_codes: list = field(default_factory=list)
    crashed: list[int] = field(default_factory=list)  # variants during which a process ended
    seconds: float = 0.0


def _run_shard(sanitizer: str | None, tool: str | None, index: int, count: int, quick: bool, out: Path,
               timeout: float, extra: tuple[str, ...] = ()) -> ShardRun:
    """One shard under one tool (``tool=None``: the compile pass, without the sanitizer), restarting after a
    variant that ended its process."""
    name = f"{tool or 'compile'}-{index}.log"
    run = ShardRun(tool or "compile", index, out / name)
    run.log.unlink(missing_ok=True)
    start, resume = time.perf_counter(), -1
    for _ in range(MAX_RESTARTS):
        cmd = _driver_cmd(quick, index, count, resume, compile_only=tool is None)
        if tool is not None:
            cmd = [sanitizer, "--tool", tool, "--error-exitcode", "1", "--target-processes", "all",
                   "--report-api-errors", "no", *extra, *cmd]
        rc, text = _run_logged(cmd, run.log, timeout)
        run.exit_codes.append(rc)
        done, last, ended = progress(text)
        if done or rc == "timeout" or last is None:
            break  # finished, out of time, or it never got to a variant (the log says why)
        if not ended:
            run.crashed.append(last)
        resume = last
    run.seconds = time.perf_counter() - start
    return run


def _sanitizer_version(sanitizer: str) -> str:
    try:
        text = subprocess.run([sanitizer, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def tool_row(tool: str, runs: list[ShardRun], expected: set[int], sanitized: bool = True) -> dict:
    """One row of the table from a tool's shard runs: errors, warnings, variants, and whether it passed
    (``sanitized``: each process must have printed a summary line; False for the compile pass)."""
    text = "".join(r.log.read_text(errors="replace") for r in runs if r.log.exists())
    s = parse_output(text)
    processes = sum(len(r.exit_codes) for r in runs)
    crashed = sorted({i for r in runs for i in r.crashed})
    timeouts = sum(rc == "timeout" for r in runs for rc in r.exit_codes)
    done = set(s.ok) | set(s.failed) | set(s.skipped)
    missing = sorted(expected - done)
    passed = (s.errors == 0 and not s.failed and not missing and not crashed and not timeouts
              and (s.summaries >= processes or not sanitized))
    return {"tool": tool, "errors": s.errors, "warnings": s.warnings, "summaries": s.summaries,
            "processes": processes, "variants": len(expected), "ok": len(s.ok), "skipped": len(s.skipped),
            "failed": {str(k): v for k, v in sorted(s.failed.items())}, "crashed": crashed, "missing": missing,
            "timeouts": timeouts, "reported": {str(k): n for k, n in sorted(s.reported.items())},
            "unattributed": s.unattributed, "seconds": round(max((r.seconds for r in runs), default=0.0), 1),
            "status": "ok" if passed else "FAIL"}


def render(rows: list[dict], labels: dict[int, str]) -> str:
    head = ("tool", "errors", "warnings", "variants", "ok", "skipped", "failed", "seconds", "status")
    body = [(r["tool"], r["errors"], r["warnings"], r["variants"], r["ok"], r["skipped"],
             len(r["failed"]) + len(r["crashed"]) + len(r["missing"]), r["seconds"], r["status"]) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip() for line in (head, *body)]
    for r in rows:
        for what, items in (("sanitizer reports in", r["reported"]), ("failed", r["failed"])):
            for index, detail in items.items():
                lines.append(f"{r['tool']}: {what} #{index} {labels.get(int(index), '?')}: {detail}")
        for index in r["crashed"]:
            lines.append(f"{r['tool']}: process ended during #{index} {labels.get(index, '?')}")
        if r["missing"]:
            lines.append(f"{r['tool']}: {len(r['missing'])} variants never ran (first #{r['missing'][0]})")
        if r["timeouts"]:
            lines.append(f"{r['tool']}: {r['timeouts']} process(es) timed out")
        if r["tool"] != "compile" and r["summaries"] < r["processes"]:
            lines.append(f"{r['tool']}: {r['processes'] - r['summaries']} process(es) printed no summary line")
        if r["unattributed"]:
            lines.append(f"{r['tool']}: {r['unattributed']} sanitizer report lines outside any variant")
    return "\n".join(lines)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--tools", default=",".join(TOOLS), show_default=True, help="comma-separated compute-sanitizer tools")
@click.option("--quick", is_flag=True, help="one size (113 x 17), one causal alignment, default tiles only")
@click.option("--out", "out_dir", default=DEFAULT_OUT, show_default=True, type=click.Path(file_okay=False),
              help="folder for the logs and summary.txt / summary.json")
@click.option("--jobs", type=int, default=None, help="processes side by side (default: CPU cores, at most 16)")
@click.option("--timeout", type=float, default=1200.0, show_default=True, help="seconds per process")
@click.option("--sanitizer", default=None, help="path of compute-sanitizer (default: $COMPUTE_SANITIZER, PATH, CUDA)")
@click.option("--padding", type=int, default=0, show_default=True,
              help="memcheck: bytes of padding after each allocation (catches reads past a tensor into the next)")
@click.option("--list", "list_only", is_flag=True, help="print the variants and exit")
@click.option("--driver", is_flag=True, hidden=True)
@click.option("--shard", "shard_spec", default="0/1", hidden=True)
@click.option("--resume-after", type=int, default=-1, hidden=True)
@click.option("--compile-only", is_flag=True, hidden=True)
def main(tools: str, quick: bool, out_dir: str, jobs: int | None, timeout: float, sanitizer: str | None,
         padding: int, list_only: bool, driver: bool, shard_spec: str, resume_after: int, compile_only: bool) -> None:
    """Run compute-sanitizer's tools over every kernel variant; print a table; exit 1 on any error."""
    if driver:
        index, count = (int(x) for x in shard_spec.split("/"))
        sys.exit(drive(quick, index, count, resume_after, compile_only))
    all_variants = variants(quick)
    labels = {v.index: v.label for v in all_variants}
    if list_only:
        for v in all_variants:
            click.echo(f"{v.index:5d}  {v.label}")
        return
    chosen = [t.strip() for t in tools.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in TOOLS]
    if unknown or not chosen:
        raise click.UsageError(f"unknown tool(s) {', '.join(unknown) or '(none)'}: expected some of {', '.join(TOOLS)}")
    path = find_sanitizer(sanitizer)
    if path is None:
        click.echo("iokernels.analysis.sanitize: compute-sanitizer not found. It comes with the CUDA toolkit "
                   "(/usr/local/cuda/bin) or the nvidia-cuda-sanitizer-api wheel; put it on PATH, or pass "
                   "--sanitizer PATH / set COMPUTE_SANITIZER.", err=True)
        sys.exit(2)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = jobs or min(16, os.cpu_count() or 1)
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    click.echo(f"{len(all_variants)} variants, tools {', '.join(chosen)}, {jobs} processes side by side; "
               f"logs in {out}", err=True)

    # compile every module once, without the sanitizer (cupy's cache then serves each tool's processes)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        compiled = list(pool.map(lambda i: _run_shard(None, None, i, jobs, quick, out, timeout), range(jobs)))
    compile_row = tool_row("compile", compiled, {v.index for v in all_variants}, sanitized=False)
    click.echo(f"compiled in {time.perf_counter() - t0:.0f} s ({compile_row['status']})", err=True)
    if not compile_row["ok"] and not compile_row["skipped"]:  # no GPU, no cupy, a broken build: say why
        tail = compiled[0].log.read_text(errors="replace").strip().splitlines()[-5:]
        click.echo(f"iokernels.analysis.sanitize: nothing compiled; the end of {compiled[0].log}:\n" + "\n".join(tail),
                   err=True)
        sys.exit(1)

    # each tool's shards; racecheck, the slowest, gets twice the shards and starts first
    weights = {t: (2 if t == "racecheck" else 1) for t in chosen}
    per = max(1, jobs // sum(weights.values()))
    tasks = [(t, i, per * weights[t]) for t in sorted(chosen, key=lambda t: -weights[t])
             for i in range(per * weights[t])]
    extra = {t: (("--padding", str(padding)) if padding and t == "memcheck" else ()) for t in chosen}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = list(pool.map(lambda job: _run_shard(path, job[0], job[1], job[2], quick, out, timeout, extra[job[0]]),
                             tasks))
    expected = {v.index for v in all_variants}
    rows = [tool_row(t, [r for r in runs if r.tool == t], expected) for t in chosen]
    if compile_row["status"] != "ok":
        rows.insert(0, compile_row)
    table = render(rows, labels)
    device = next((line for r in [*compiled, *runs] if r.log.exists()
                   for line in r.log.read_text(errors="replace").splitlines() if line.startswith(f"{MARK} device")), "")
    header = [f"iokernels.analysis.sanitize {'--quick ' if quick else ''}--tools {','.join(chosen)}",
              f"date: {started.isoformat(timespec='seconds')}, commit {source_commit() or 'unknown'}, "
              f"wall {time.perf_counter() - t0:.0f} s",
              f"device: {device.removeprefix(f'{MARK} device ')}",
              f"compute-sanitizer: {path}: {_sanitizer_version(path)}",
              f"variants: {len(all_variants)} ({len({v.config for v in all_variants})} configurations x sizes "
              f"{', '.join(f'{a}x{b}' for a, b in (QUICK_SHAPES if quick else SHAPES))} x counting/plain builds)", ""]
    text = "\n".join(header) + table + "\n"
    (out / "summary.txt").write_text(text)
    (out / "variants.txt").write_text("".join(f"{i:5d}  {label}\n" for i, label in labels.items()))
    (out / "summary.json").write_text(json.dumps({"header": header[:-1], "rows": rows}, indent=1) + "\n")
    click.echo(text, nl=False)
    sys.exit(0 if all(r["status"] == "ok" for r in rows) else 1)


if __name__ == "__main__":
    main()
