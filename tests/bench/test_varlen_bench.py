"""``iokernels bench --varlen`` (issue #23) without a GPU: the problem's lengths and FLOPs (worked out by hand), the
ratios and the efficiency from measured rows, the text table, and the command's errors for options it does not take."""

import pytest
from click.testing import CliRunner

from iokernels.bench import varlen
from iokernels.cli import cli


def test_lengths_are_seeded_and_flops_count_real_tokens():
    p = varlen.VarlenProblem(batch=3, max_len=10, heads=2, d=8, seed=1)
    assert p.lengths == varlen.VarlenProblem(batch=3, max_len=10, heads=2, d=8, seed=1).lengths
    assert len(p.lengths) == 3 and all(1 <= n <= 10 for n in p.lengths)
    assert p.flops("fwd") == 4 * 8 * 2 * sum(n * n for n in p.lengths)
    assert p.flops("bwd", [4, 4, 4]) == 2.5 * 4 * 8 * 2 * 48
    causal = varlen.VarlenProblem(batch=3, max_len=10, heads=2, d=8, seed=1, causal=True)
    assert causal.flops("fwd") == p.flops("fwd") / 2
    # the mean length rounded to 128, at least 128
    assert p.mean_len == 128
    assert varlen.VarlenProblem(batch=2, max_len=1000, seed=3).mean_len % 128 == 0


def _row(impl, seconds, real, own=None, mode="call"):
    problem = varlen.VarlenProblem(batch=2, max_len=100)
    row = varlen._row(problem, varlen.make_impls([impl])[0], "fwd", mode)
    row.update(status="ok", seconds=seconds, tflops_real=real, tflops_own=own if own is not None else real)
    return row


def test_ratios_and_efficiency():
    rows = [_row("iokernels_varlen", 1.0, 300.0), _row("iokernels_padded", 2.5, 120.0, 360.0),
            _row("iokernels_dense", 0.9, 333.0, 400.0), _row("torch_flash", 3.0, 100.0, 300.0)]
    (r,) = varlen.ratios(rows)
    assert r["over"] == {"iokernels_padded": 2.5, "iokernels_dense": 0.9, "torch_flash": 3.0}
    assert r["efficiency"] == 300.0 / 400.0
    doc = {"header": {"environment": {}, "repeats": 5, "warmup": 1, "problems": [],
                      "impls": [i.as_dict() for i in varlen.make_impls(varlen.VARLEN_IMPLS)]},
           "rows": rows, "ratios": [r]}
    text = varlen.render(doc)
    assert "2.50x" in text and "3.00x" in text and "0.75" in text


def test_unknown_implementation():
    with pytest.raises(ValueError, match="unknown --varlen implementation"):
        varlen.make_impls(["torch_flex"])


def test_cli_refuses_options_it_does_not_take():
    result = CliRunner().invoke(cli, ["bench", "--varlen", "--window", "4,4"])
    assert result.exit_code != 0 and "do not apply" in result.output
    result = CliRunner().invoke(cli, ["bench", "--varlen-batch", "8"])
    assert result.exit_code != 0 and "--varlen only" in result.output
