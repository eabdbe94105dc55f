"""``--window LEFT,RIGHT`` on ``model`` and ``compare`` (CPU: the simulator): every tiled plan's simulated bytes equal
its predicted bytes, the window's plans move fewer bytes than the same plans without it, the formulas name A_v, and
a bad window is a usage error."""

import json

from click.testing import CliRunner

from iokernels.cli import cli


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def totals(doc):
    return {(r["algorithm"], r["schedule"], r["pass"]): r for r in doc["rows"] if r["tensor"] == "total"}


def test_compare_window_simulated_equals_predicted_and_saves_bytes():
    args = ["compare", "--N", "600", "--d", "32", "--dtype", "float16", "--batch", "1", "--heads", "2", "--simulate",
            "--backward", "--json"]
    plain = run(*args)
    window = run(*args, "--window", "16,0")
    assert plain.exit_code == 0 and window.exit_code == 0, window.output
    docs = json.loads(plain.stdout), json.loads(window.stdout)
    for row in docs[1]["rows"] + docs[1]["stages"]:
        assert row["measured_bytes"] == row["predicted_bytes"], row
    before, after = totals(docs[0]), totals(docs[1])
    tiled = [k for k in after if k[0] != "standard"]
    assert {("flash", "fast", "fwd"), ("flash", "fast", "bwd"), ("flash", "q_outer", "fwd")} <= set(tiled)
    for key in tiled:  # a 17-key band of 600: no more block pairs (fewer where there are several key blocks)
        assert after[key]["predicted_bytes"] <= before[key]["predicted_bytes"], key
    for key in (("flash", "fast", "fwd"), ("flash", "fast", "bwd")):  # (tiles of 128: several blocks at N 600)
        assert after[key]["predicted_bytes"] < 0.7 * before[key]["predicted_bytes"], key
    for key in after.keys() - set(tiled):  # standard computes S in full
        assert after[key]["predicted_bytes"] == before[key]["predicted_bytes"], key


def test_model_window_formulas_and_bad_windows():
    result = run("model", "--N", "4096", "--d", "64", "--dtype", "float16", "--window", "256,-1")
    assert result.exit_code == 0, result.output
    assert "Aᵥ" in result.output and "window: A_v the visible elements" in result.output
    bad = CliRunner().invoke(cli, ["model", "--N", "64", "--window", "5"])
    assert bad.exit_code != 0 and "--window" in bad.output


def test_compare_softcap_keeps_the_tma_plans_and_their_bytes():
    """--softcap C: only flash/fast's plans remain (the tma kernels take it), their simulated bytes the predicted
    ones and the same as without the softcap at the same tiles (a softcap moves no byte), the simulator's outputs
    the softcapped reference's; a bad C is a usage error."""
    args = ["compare", "--N", "300", "--d", "64", "--dtype", "float16", "--batch", "1", "--heads", "2", "--causal",
            "--simulate", "--backward", "--json"]
    capped = run(*args, "--softcap", "5")
    assert capped.exit_code == 0, capped.output
    doc = json.loads(capped.stdout)
    rows = totals(doc)
    assert {k[:2] for k in rows} == {("flash", "fast")} and {k[2] for k in rows} == {"fwd", "bwd"}
    assert all(r["measured_bytes"] == r["predicted_bytes"] for r in doc["rows"] + doc["stages"])
    assert all(r["max_rel_err"] < 1e-12 for r in rows.values())
    bad = run(*args, "--softcap", "-1")
    assert bad.exit_code != 0 and "softcap" in bad.output
