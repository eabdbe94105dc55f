"""``--mask-mod`` / ``--score-mod`` / ``--score-grad`` / ``--doc-table`` on ``model`` and ``compare`` (CPU: the
simulator; issue #22): only flash/fast's plans remain, the simulated bytes equal the predicted ones with the captured
table's reads, which a mask without a table does not have; bad expressions and tables are usage errors."""

import json

from click.testing import CliRunner

from iokernels.cli import cli


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


BASE = ["compare", "--N", "600", "--d", "64", "--dtype", "float16", "--batch", "1", "--heads", "2", "--simulate",
        "--backward", "--json"]


def test_compare_mods_simulated_equals_predicted():
    table = run(*BASE, "--mask-mod", "doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx", "--doc-table", "200,250,150")
    plain = run(*BASE, "--mask-mod", "kv_idx <= q_idx", "--score-mod", "30.0f * tanhf(score / 30.0f)")
    assert table.exit_code == 0 and plain.exit_code == 0, table.output + plain.output
    for result in (table, plain):
        doc = json.loads(result.stdout)
        assert {(r["algorithm"], r["schedule"]) for r in doc["rows"]} == {("flash", "fast")}
        for row in doc["rows"] + doc["stages"]:
            assert row["measured_bytes"] == row["predicted_bytes"], row
    captured = [r for r in json.loads(table.stdout)["rows"] if r["tensor"] == "captures"]
    assert captured and all(r["predicted_bytes"] > 0 for r in captured)
    assert not [r for r in json.loads(plain.stdout)["rows"] if r["tensor"] == "captures"]


def test_bad_expressions_and_tables_are_usage_errors():
    for args, words in ((("--mask-mod", "kv_idx <= qidx"), "unknown name 'qidx'"),
                        (("--mask-mod", "doc[q_idx] > 0", "--doc-table", "100,x"), "--doc-table"),
                        (("--mask-mod", "doc[q_idx] > 0", "--doc-table", "100,100"), "sum to 200"),
                        (("--score-grad", "1.0f"), "need a score_mod or a mask_mod")):
        result = CliRunner().invoke(cli, [*BASE, *args])
        assert result.exit_code != 0 and words in result.output, (args, result.output)
