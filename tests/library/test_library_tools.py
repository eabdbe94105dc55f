"""`iokernels info`, `iokernels warmup`, the API reference and the measurement scripts, on the CPU."""

import ast
import doctest
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from iokernels.analysis import info
from iokernels.cli import cli
from iokernels.library import apidoc
from iokernels.library.warmup import warmup_plans
from iokernels.model.specs import current_device_spec
from iokernels.plan import SCHEDULES

ROOT = Path(__file__).resolve().parents[2]
HAS_GPU = current_device_spec() is not None


def test_info_lists_every_schedule_and_the_caches():
    result = CliRunner().invoke(cli, ["info", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    keys = {(r["algorithm"], r["schedule"], r["pass"]) for r in doc["algorithms"]}
    assert keys == {(a, s, p) for (a, p), ss in SCHEDULES.items() for s in ss}
    assert doc["kernel_cache"]["sm_90a cubins"].startswith(doc["kernel_cache"]["cupy"])
    fast = [r for r in doc["algorithms"] if r["schedule"] == "fast"]
    assert all(r["dtypes"] == ["float16", "bfloat16"] and r["head_dims"].startswith("64, 128; sm_90: 16-")
               for r in fast)
    if not HAS_GPU:
        assert doc["device"] is None and doc["no_gpu"].startswith("no GPU")
        assert not any(r["available"] for r in doc["algorithms"])
    text = CliRunner().invoke(cli, ["info"]).output
    assert ("no GPU" in text) is (not HAS_GPU) and "kernel cache (cupy)" in text


@pytest.mark.parametrize("cc, fast_available, kernels", [
    ((7, 0), False, ("-", "-")), ((8, 0), True, ("mma.sync", "mma.sync")), ((8, 9), True, ("mma.sync", "mma.sync")),
    ((9, 0), True, ("tma + wgmma (sm_90a)", "tma + wgmma (sm_90a)"))])
def test_info_availability_follows_the_compute_capability(cc, fast_available, kernels):
    rows = info.availability(cc)
    fast = {r["pass"]: r for r in rows if r["schedule"] == "fast"}
    assert sorted(fast) == ["bwd", "fwd"] and all(r["available"] is fast_available for r in fast.values())
    assert (fast["fwd"]["kernel"], fast["bwd"]["kernel"]) == kernels
    assert "16-256" in fast["fwd"]["head_dims"] and "16-256" in fast["bwd"]["head_dims"]
    assert all(r["available"] for r in rows if r["schedule"] != "fast")


def test_warmup_plans_are_the_librarys_choices():
    plans = warmup_plans(["float16", "float32"], [64, 128])
    labels = {(p.label, p.dtype, p.d) for p in plans}
    for d in (64, 128):
        assert ("flash/fast/fwd", "float16", d) in labels and ("flash/q_outer/fwd", "float32", d) in labels
        assert ("flash/kv_outer/bwd", "float32", d) in labels
        assert any(label.startswith("flash/fast/bwd") and t == "float16" and dd == d for label, t, dd in labels)
    assert len(plans) == len(set(plans)) >= 8
    # every kernel the library runs at N = 1024, 4096 and 16384 (the default sequence lengths) is compiled
    from iokernels.kernels.stages import plan_kernels
    from iokernels.library.api import choose_plan

    compiled = {ref for p in plans for _, ref in plan_kernels(p)}
    for n in (1024, 4096, 16384):
        for direction in ("fwd", "bwd"):
            plan, _ = choose_plan(direction, "flash", None, n, n, 64, "float16", (1,), None, 1, "")
            assert {ref for _, ref in plan_kernels(plan)} <= compiled
    more = warmup_plans(["float32"], [64], ("standard", "two_pass"), causal=True, backward=False)
    assert {(p.label, p.causal) for p in more} == {(f"{a}/fwd", c) for a in ("standard/default", "two_pass/store",
                                                                             "two_pass/recompute")
                                                   for c in ("", "bottom_right")}


@pytest.mark.parametrize("args, message", [(["--dtype", "int8"], "unsupported dtype"), (["--d", "60"], "d=60"),
                                           (["--d", "x"], "--d takes"), (["--algorithms", "fast"], "unknown algorithm"),
                                           (["--N", "0"], "--N must be")])
def test_warmup_bad_input_is_one_line_and_exit_code_2(args, message):
    done = subprocess.run([sys.executable, "-m", "iokernels.cli", "warmup", *args], capture_output=True, text=True)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(HAS_GPU, reason="checks the message without a GPU")
def test_warmup_without_a_gpu_says_so():
    done = subprocess.run([sys.executable, "-m", "iokernels.cli", "warmup"], capture_output=True, text=True)
    assert done.returncode == 1 and "needs" in done.stderr and "Traceback" not in done.stderr


def test_api_reference_is_current():
    assert (ROOT / "docs" / "API.md").read_text(encoding="utf-8") == apidoc.generate(), \
        "docs/API.md is out of date: python -m iokernels.library.apidoc > docs/API.md"


def _keyword_parameters(source: str, name: str) -> list[str]:
    tree = ast.parse((ROOT / "iokernels" / source).read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return [a.arg for a in node.args.kwonlyargs]


@pytest.mark.parametrize("public, source, name", [("iokernels.attention", "library/api.py", "attention"),
                                                  ("iokernels.attention_backward", "library/api.py",
                                                   "attention_backward"),
                                                  ("iokernels.memory_needed", "library/api.py", "memory_needed"),
                                                  ("iokernels.torch.attention", "library/torch.py", "attention")])
def test_every_option_is_documented(public, source, name):
    doc = apidoc.examples(public)
    assert "Shapes" in doc or "shape" in doc
    for parameter in _keyword_parameters(source, name):
        assert parameter in doc, f"{public}: {parameter} is not in its docstring"


def _run_examples(text: str, name: str) -> doctest.TestResults:
    test = doctest.DocTestParser().get_doctest(text, {}, name, None, 0)
    assert test.examples, f"{name} has no examples"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    return runner.summarize(verbose=False)


def test_cpu_examples_run():
    results = _run_examples(apidoc.examples("iokernels"), "iokernels")
    assert results.failed == 0 and results.attempted >= 3


def test_every_gpu_example_is_run_by_a_gpu_test():
    with_examples = {name for name, source, obj in apidoc.ENTRIES if ">>>" in apidoc.docstring(source, obj)}
    gpu_tests = (ROOT / "tests" / "gpu" / "test_apidoc_examples.py").read_text(encoding="utf-8")
    assert with_examples - {"iokernels"} == {n for n in with_examples if f'"{n}"' in gpu_tests}
