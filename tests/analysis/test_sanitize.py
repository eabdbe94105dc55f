"""iokernels.analysis.sanitize on the CPU: the variants it runs cover every kernel, schedule, direction, dtype and
build the plans offer; the parser of compute-sanitizer's summaries; the shard runner's restarts (with a
stand-in for compute-sanitizer). On a GPU, one shard of the driver runs for real (no sanitizer)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from iokernels.analysis import sanitize, sanitize_cases
from iokernels.kernels import launch
from iokernels.kernels.sources import list_sources
from iokernels.kernels.stages import SOURCES, plan_kernels
from iokernels.plan import CAUSAL_ALIGNMENTS, CAUSAL_STAGES, SCHEDULES, Unsupported, make_plan
from iokernels.plan.decode import DECODE_VARIANTS
from iokernels.plan.fast import FAST_HEAD_DIMS
from iokernels.plan.units import DTYPE_ITEMSIZE

FULL = sanitize_cases.variants()
QUICK = sanitize_cases.variants(quick=True)
KEYS = [(a, s, p) for (a, p), ss in SCHEDULES.items() for s in ss]


def _dtypes_offered(key: tuple[str, str, str]) -> set[str]:
    algorithm, schedule, direction = key
    offered = set()
    for dtype in DTYPE_ITEMSIZE:
        try:
            make_plan(algorithm, schedule, N_q=17, d=64, dtype=dtype, sram=227 * 1024, direction=direction)
        except Unsupported:
            continue
        offered.add(dtype)
    return offered


@pytest.mark.parametrize("variants", [FULL, QUICK], ids=["full", "quick"])
def test_every_kernel_the_launcher_knows_is_exercised(variants):
    # a kernel added to launch.ARGS or kernels/stages.SOURCES without a variant here fails this test
    kernels = {stage.kernel for v in variants for stage in v.plan.stages}
    assert kernels == set(SOURCES), f"not exercised: {sorted(set(SOURCES) - kernels)}"
    assert set(launch.ARGS) <= kernels, f"not exercised: {sorted(set(launch.ARGS) - kernels)}"
    sources = {ref.source for v in variants for _, ref in plan_kernels(v.plan)}
    # (mod_blocks.cu: a mask_mod's block mask, launched by the library outside any plan; the sanitizers run it in
    # results/h100/issue22/mods/scripts/san_mods.py)
    assert sources == set(list_sources()) - {"selftest.cu", "mod_blocks.cu"}


@pytest.mark.parametrize("variants", [FULL, QUICK], ids=["full", "quick"])
@pytest.mark.parametrize("key", KEYS, ids="/".join)
def test_every_schedule_direction_dtype_and_build(key, variants):
    mine = [v for v in variants if (v.plan.algorithm, v.plan.schedule, v.plan.direction) == key
            and v.plan.variant not in (*DECODE_VARIANTS, "varlen")]  # (the decode and varlen plans: tests of theirs)
    offered = _dtypes_offered(key)
    assert offered and {v.plan.dtype for v in mine} == offered
    head_dims = set(FAST_HEAD_DIMS) if key[1] == "fast" else set(sanitize_cases.RESEARCH_HEAD_DIMS)
    if key == ("flash", "fast", "bwd"):  # the wgmma backward's d inside a wider tile too
        head_dims |= set(sanitize_cases.FAST_BWD_WIDER_HEAD_DIMS)
    shapes = set(sanitize_cases.QUICK_SHAPES if variants is QUICK else sanitize_cases.SHAPES)
    for dtype in offered:
        for d in head_dims:
            got = {((v.plan.N_q, v.plan.N_k), v.counting) for v in mine if (v.plan.dtype, v.plan.d) == (dtype, d)}
            assert got == {(shape, counting) for shape in shapes for counting in (True, False)}, (dtype, d)


@pytest.mark.parametrize("variants", [FULL, QUICK], ids=["full", "quick"])
def test_decode_variants(variants):
    """The split-KV decode at every shape, with N_k + DECODE_EXTRA_KEYS keys: split and (full) not, a cache of
    per-sequence lengths contiguous and paged, both builds, both dtypes."""
    mine = [v for v in variants if v.plan.variant in DECODE_VARIANTS]
    shapes = sanitize_cases.QUICK_SHAPES if variants is QUICK else sanitize_cases.SHAPES
    extra = sanitize_cases.DECODE_EXTRA_KEYS
    assert {(v.plan.N_q, v.plan.N_k - extra) for v in mine} == set(shapes)
    assert {v.counting for v in mine} == {True, False} and {v.plan.dtype for v in mine} == {"float16", "bfloat16"}
    caches = {(v.plan.variant, None if v.plan.kv_cache is None else v.plan.kv_cache.page_size) for v in mine}
    assert {("split", None), ("split", 0), ("split", 16)} <= caches
    assert variants is QUICK or {("packed", None), ("packed", 0)} <= caches


@pytest.mark.parametrize("variants", [FULL, QUICK], ids=["full", "quick"])
def test_varlen_variants(variants):
    """Variable-length batches at every shape: the shape's sequence among an empty one, one of a single row and one
    of 130 rows; forward and backward, causal and not, both builds, both dtypes."""
    mine = [v for v in variants if v.plan.variant == "varlen"]
    shapes = sanitize_cases.QUICK_SHAPES if variants is QUICK else sanitize_cases.SHAPES
    assert {v.plan.varlen.lengths_q[1:2] + v.plan.varlen.lengths_k[1:2] for v in mine} == set(shapes)
    assert {v.plan.varlen.lengths_q[2] for v in mine} == {0}
    assert {v.counting for v in mine} == {True, False} and {v.plan.dtype for v in mine} == {"float16", "bfloat16"}
    assert {v.plan.direction for v in mine} == {"fwd", "bwd"} and {bool(v.plan.causal) for v in mine} == {True, False}


def test_sizes_are_small_ragged_and_batched():
    dense = [v for v in FULL if v.plan.variant not in (*DECODE_VARIANTS, "varlen")]
    assert {n for v in dense for n in (v.plan.N_q, v.plan.N_k)} == {1, 17, 113}
    assert all(v.plan.N_q != v.plan.N_k and v.plan.bh == 2 for v in FULL if v.plan.varlen is None)
    assert {v.plan.d for v in FULL} == {16, 64, 96, 128, 256}
    assert [v.index for v in FULL] == list(range(len(FULL)))
    assert len({v.label for v in FULL}) == len(FULL)


@pytest.mark.parametrize("variants, alignments", [(FULL, set(CAUSAL_ALIGNMENTS)), (QUICK, {"bottom_right"})],
                         ids=["full", "quick"])
def test_causal_kernels_in_both_alignments(variants, alignments):
    for (algorithm, schedule, direction), stages in CAUSAL_STAGES.items():
        if not stages:
            continue  # standard backward: the unmasked kernels
        got = {v.plan.causal for v in variants
               if (v.plan.algorithm, v.plan.schedule, v.plan.direction) == (algorithm, schedule, direction)}
        assert got == {"", *alignments}, (algorithm, schedule, direction)
    for v in variants:
        if v.plan.causal:
            assert any({"CAUSAL", "PACKED_CAUSAL"} & set(dict(s.params)) for s in v.plan.stages), v.label


@pytest.mark.parametrize("variants", [FULL, QUICK], ids=["full", "quick"])
def test_tensor_core_kernels_deterministic_and_grouped_query(variants):
    fast = [v.plan for v in variants if v.plan.schedule == "fast" and v.plan.variant not in DECODE_VARIANTS]
    fwd = {s.kernel for p in fast if p.direction == "fwd" for s in p.stages}
    bwd = {s.kernel for p in fast if p.direction == "bwd" for s in p.stages}
    assert {"flash_wgmma_fwd", "flash_tc_fwd"} <= fwd
    assert {"flash_tma_bwd", "flash_tma_bwd_wide", "flash_wgmma_bwd", "flash_tc_bwd", "flash_tc_bwd_dq",
            "flash_tc_bwd_dkdv"} <= bwd
    assert any(p.variant == "deterministic" for p in fast)
    assert any(p.kv_heads < p.heads for p in fast if p.direction == "fwd")
    assert all(p.dtype in ("float16", "bfloat16") for p in fast)
    # d other than 64 and 128: the tma forward (d 96 and 256), the sm_90 backwards (d 96) and tma's wide tiles (d
    # 256), each in the tile of the next multiple of 64
    wider = [p for p in fast if p.d not in FAST_HEAD_DIMS]
    assert {(p.direction, p.d) for p in wider} == {("fwd", 96), ("fwd", 256), ("bwd", 96), ("bwd", 256)}
    kernels = {"fwd": ("flash_tma_fwd",), "bwd": ("flash_tma_bwd", "flash_wgmma_bwd", "flash_tma_bwd_wide")}
    assert all(p.stage("main").kernel in kernels[p.direction] for p in wider)
    assert all(p.stage("main").kernel == "flash_tma_bwd_wide" for p in wider if p.direction == "bwd" and p.d > 128)
    assert all(dict(p.stage("main").params).get("HEAD_D_TILE", p.d) == -(-p.d // 64) * 64 for p in wider)
    bwd = [p for p in wider if p.direction == "bwd"]
    if variants is FULL:
        assert {p.causal for p in bwd} == {"", *CAUSAL_ALIGNMENTS} and any(p.dropout for p in bwd)
        assert any(p.kv_heads < p.heads for p in bwd)


def test_quick_is_a_subset_and_no_configuration_is_listed_twice():
    assert {v.config for v in QUICK} <= {v.config for v in FULL}
    assert len(QUICK) < len(FULL) / 3
    modules = {}
    for v in FULL:
        if (v.plan.N_q, v.plan.N_k) == sanitize_cases.SHAPES[0] and v.counting:
            key = sanitize_cases.module_key(v.plan)
            assert key not in modules, (v.config, modules.get(key))
            modules[key] = v.config


@pytest.mark.parametrize("count", [1, 3, 7])
def test_shards_partition_whole_configurations(count):
    parts = [sanitize_cases.shard(FULL, i, count) for i in range(count)]
    indices = [v.index for part in parts for v in part]
    assert sorted(indices) == list(range(len(FULL)))
    configs = [{v.config for v in part} for part in parts]
    for i in range(count):
        for j in range(i + 1, count):
            assert not configs[i] & configs[j]


# ---------------------------------------------------------------------------------------------
# parsing

CLEAN_MEMCHECK = """\
========= COMPUTE-SANITIZER
IOK-SANITIZE device name='NVIDIA H200' cc=90 cupy=14.2.0 cuda_runtime=13020 driver=13020
IOK-SANITIZE begin 4 flash/q_outer/fwd float32 d=16 N_q=113 N_k=17 count
IOK-SANITIZE end 4 ok 0.51s
IOK-SANITIZE begin 5 flash/q_outer/fwd float32 d=16 N_q=113 N_k=17 plain
IOK-SANITIZE end 5 ok 0.20s
IOK-SANITIZE done
========= ERROR SUMMARY: 0 errors
"""

DIRTY_MEMCHECK = """\
IOK-SANITIZE begin 8 two_pass/store/fwd float16 d=128 N_q=1 N_k=113 count
========= Invalid __global__ read of size 16 bytes
=========     at two_pass_stats<__half, 1>+0x1a0 in two_pass.cu:77
=========     by thread (3,0,0) in block (0,0,1)
========= Invalid __global__ read of size 16 bytes
IOK-SANITIZE end 8 fail 0.30s CUDARuntimeError: cudaErrorLaunchFailure: unspecified launch failure
IOK-SANITIZE abort 8 the CUDA context is unusable
========= ERROR SUMMARY: 2 errors
IOK-SANITIZE begin 9 two_pass/store/fwd float16 d=128 N_q=1 N_k=113 plain
IOK-SANITIZE end 9 skip sm_90a only
IOK-SANITIZE done
========= ERROR SUMMARY: 1 error
"""

RACECHECK_ONLY = """\
IOK-SANITIZE begin 0 standard/default/fwd float32 d=16 N_q=113 N_k=17 count
========= Error: Race reported between Write access at flash_q_outer+0x60 in flash_fwd.cu:90
=========     and Read access at flash_q_outer+0x80 in flash_fwd.cu:95 [128 hazards]
IOK-SANITIZE end 0 ok 2.00s
IOK-SANITIZE done
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 2 warnings)
"""


def test_parse_clean_output():
    s = sanitize.parse_output(CLEAN_MEMCHECK)
    assert (s.errors, s.warnings, s.summaries, s.ok, s.failed, s.reported) == (0, 0, 1, [4, 5], {}, {})


def test_parse_errors_are_summed_over_processes_and_attributed():
    s = sanitize.parse_output(DIRTY_MEMCHECK)
    assert (s.errors, s.summaries) == (3, 2)
    assert s.reported == {8: 2} and s.unattributed == 0
    assert list(s.failed) == [8] and "cudaErrorLaunchFailure" in s.failed[8]
    assert s.skipped == {9: "sm_90a only"}


def test_parse_racecheck_summary():
    s = sanitize.parse_output(RACECHECK_ONLY)
    assert (s.errors, s.warnings, s.summaries, s.reported) == (1, 2, 1, {0: 1})
    both = RACECHECK_ONLY + "========= ERROR SUMMARY: 1 error\n"  # versions that print both count once
    assert sanitize.parse_output(both).errors == 1


def test_parse_nothing_is_not_clean():
    s = sanitize.parse_output("Traceback (most recent call last):\nImportError: no cupy\n")
    assert s.summaries == 0 and not s.ok


def test_progress():
    assert sanitize.progress(CLEAN_MEMCHECK) == (True, 5, True)
    assert sanitize.progress("IOK-SANITIZE begin 3 x\nIOK-SANITIZE end 3 ok\nIOK-SANITIZE begin 7 y\n") == (
        False, 7, False)
    assert sanitize.progress("Segmentation fault\n") == (False, None, False)


def test_nul_bytes_in_a_log_read_as_spaces(tmp_path):
    """H200 logs had NUL bytes where some lines' spaces were; the progress lines must still parse."""
    code = "import sys; sys.stdout.write('IOK-SANITIZE\\x00begin\\x003\\x00x\\nIOK-SANITIZE\\x00end\\x003\\x00ok\\n')"
    rc, text = sanitize._run_logged([sys.executable, "-c", code], tmp_path / "log", timeout=60)
    assert rc == 0 and "\x00" not in text
    assert sanitize.progress(text) == (False, 3, True)


# ---------------------------------------------------------------------------------------------
# the shard runner, with a stand-in for compute-sanitizer that prints what the driver would

FAKE = """\
#!{python}
import sys
from iokernels.analysis import sanitize_cases
args = sys.argv[1:]
tool = args[args.index("--tool") + 1]
index, count = map(int, args[args.index("--shard") + 1].split("/"))
resume = int(args[args.index("--resume-after") + 1])
crash = {crash}
for v in sanitize_cases.shard(sanitize_cases.variants("--quick" in args), index, count):
    if v.index <= resume:
        continue
    print("IOK-SANITIZE begin", v.index, v.label, flush=True)
    if v.index == crash:
        print("========= Invalid __global__ write of size 4 bytes", flush=True)
        print("========= ERROR SUMMARY: 1 error", flush=True)
        sys.exit(1)  # ended during a variant, as a crashed process does
    print("IOK-SANITIZE end", v.index, "ok", "0.01s", flush=True)
print("IOK-SANITIZE done")
print("========= ERROR SUMMARY: 0 errors")
"""


def _fake_sanitizer(tmp_path: Path, crash: int) -> str:
    path = tmp_path / "compute-sanitizer"
    path.write_text(FAKE.format(python=sys.executable, crash=crash))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_shard_runner_clean(tmp_path):
    fake = _fake_sanitizer(tmp_path, crash=-1)
    runs = [sanitize._run_shard(fake, "memcheck", i, 2, True, tmp_path, 120) for i in range(2)]
    row = sanitize.tool_row("memcheck", runs, {v.index for v in QUICK})
    assert row["status"] == "ok" and row["ok"] == len(QUICK) and row["processes"] == 2 and row["errors"] == 0


def test_shard_runner_restarts_after_a_crash_and_fails(tmp_path):
    mine = sanitize_cases.shard(QUICK, 1, 2)
    crash = mine[3].index
    fake = _fake_sanitizer(tmp_path, crash=crash)
    runs = [sanitize._run_shard(fake, "racecheck", i, 2, True, tmp_path, 120) for i in range(2)]
    assert runs[1].crashed == [crash] and runs[1].exit_codes == [1, 0]
    row = sanitize.tool_row("racecheck", runs, {v.index for v in QUICK})
    assert row["status"] == "FAIL" and row["errors"] == 1 and row["crashed"] == [crash]
    assert row["ok"] == len(QUICK) - 1 and row["missing"] == [crash] and row["reported"] == {str(crash): 1}
    text = sanitize.render([row], {v.index: v.label for v in QUICK})
    assert f"process ended during #{crash} {mine[3].label}" in text
    assert "FAIL" in text.splitlines()[1]


def test_missing_sanitizer_is_one_message_and_exit_2(monkeypatch, tmp_path):
    monkeypatch.setattr(sanitize, "find_sanitizer", lambda explicit=None: None)
    result = CliRunner().invoke(sanitize.main, ["--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "compute-sanitizer not found" in result.output and "Traceback" not in result.output


def test_find_sanitizer_takes_an_explicit_path(tmp_path, monkeypatch):
    fake = _fake_sanitizer(tmp_path, crash=-1)
    assert sanitize.find_sanitizer(fake) == fake
    monkeypatch.setenv("COMPUTE_SANITIZER", fake)
    assert sanitize.find_sanitizer() == fake
    assert sanitize.find_sanitizer(str(tmp_path / "nothing")) == fake  # falls back to the others


def test_unknown_tool_is_a_usage_error():
    result = CliRunner().invoke(sanitize.main, ["--tools", "memcheck,leakcheck"])
    assert result.exit_code == 2 and "leakcheck" in result.output


# ---------------------------------------------------------------------------------------------
# the driver itself, without the sanitizer (needs a GPU)

def _has_gpu() -> bool:
    from iokernels.model.specs import current_device_spec

    return current_device_spec() is not None


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA device and cupy (none found)")
def test_driver_runs_a_shard_on_the_gpu():
    env = dict(os.environ, PYTHONPATH=str(Path(sanitize.__file__).resolve().parents[2]))
    result = subprocess.run([sys.executable, "-m", "iokernels.analysis.sanitize", "--driver", "--quick",
                             "--shard", "0/8"],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, textwrap.shorten(result.stdout + result.stderr, 4000)
    s = sanitize.parse_output(result.stdout)
    assert s.ok and not s.failed and sanitize.progress(result.stdout)[0]
    assert len(s.ok) + len(s.skipped) == len(sanitize_cases.shard(QUICK, 0, 8))
