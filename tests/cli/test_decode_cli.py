"""``--decode`` and ``--varlen`` on ``model`` and ``compare`` (CPU): the split-KV decode plan beside the others, its
rows named fast+split, its simulated bytes equal to the predicted ones, and fewer bytes than the tensor-core forward
that reads K and V once per query head; the variable-length plans alone, their simulated bytes the predicted ones."""

import json

from click.testing import CliRunner

from iokernels.cli import cli


def run(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_compare_decode_simulated_equals_predicted():
    doc = json.loads(run("compare", "--Nq", "2", "--Nk", "1000", "--d", "64", "--dtype", "float16", "--batch", "1",
                         "--heads", "8", "--kv-heads", "2", "--decode", "--simulate", "--json").stdout)
    totals = {(r["schedule"], r["pass"]): r for r in doc["rows"] if r["tensor"] == "total"}
    split = totals[("fast+split", "fwd")]
    assert split["measured_bytes"] == split["predicted_bytes"]
    assert all(r["measured_bytes"] == r["predicted_bytes"] for r in doc["rows"] + doc["stages"])
    # K and V once per K/V head (2) against once per query head (8): about 4x fewer bytes
    assert split["predicted_bytes"] < totals[("fast", "fwd")]["predicted_bytes"] / 3


def test_model_decode_prints_the_split_and_its_theta():
    out = run("model", "--Nq", "1", "--Nk", "16384", "--d", "128", "--dtype", "float16", "--heads", "64",
              "--kv-heads", "8", "--decode").output
    assert "fast+split" in out and "S=16" in out and "Θ(N_k d + S N_q d)" in out
    bad = CliRunner().invoke(cli, ["model", "--N", "64", "--decode", "--causal", "--dtype", "float16"])
    assert bad.exit_code != 0 and "--decode" in bad.output


def test_compare_varlen_simulated_equals_predicted():
    """compare --varlen: the variable-length forward and backward plans alone, meas/pred 1.000 on the simulator."""
    result = CliRunner().invoke(cli, ["compare", "--varlen", "5,300,0,129", "--d", "64", "--dtype", "float16",
                                      "--heads", "2", "--kv-heads", "1", "--backward", "--causal", "--simulate",
                                      "--json"], catch_exceptions=False)
    doc = json.loads(result.output[result.output.index("{"):])
    totals = [r for r in doc["rows"] if r["tensor"] == "total"]
    assert {r["schedule"] for r in totals} == {"fast+varlen"} and {r["pass"] for r in totals} == {"fwd", "bwd"}
    assert all(r["measured_bytes"] == r["predicted_bytes"] for r in totals)
    bad = CliRunner().invoke(cli, ["compare", "--varlen", "5,x", "--d", "64", "--dtype", "float16", "--simulate"])
    assert bad.exit_code != 0 and "comma-separated lengths" in bad.output


def test_compare_documents_simulated_equals_predicted():
    """compare --documents: document masking's plans alone (the variable-length plans on the dense layout, a batch
    of 2 x 2 heads), meas/pred 1.000 on the simulator; model --documents the same plans; bad combinations refused."""
    result = CliRunner().invoke(cli, ["compare", "--documents", "300,17,0,129", "--d", "64", "--dtype", "float16",
                                      "--batch", "2", "--heads", "2", "--kv-heads", "1", "--backward", "--causal",
                                      "--simulate", "--json"], catch_exceptions=False)
    doc = json.loads(result.output[result.output.index("{"):])
    totals = [r for r in doc["rows"] if r["tensor"] == "total"]
    assert {r["schedule"] for r in totals} == {"fast+varlen"} and {r["pass"] for r in totals} == {"fwd", "bwd"}
    assert all(r["measured_bytes"] == r["predicted_bytes"] > 0 for r in totals)
    model = run("model", "--documents", "300,17,0,129", "--d", "64", "--dtype", "float16", "--batch", "2",
                "--heads", "2", "--json")
    assert "fast+varlen" in model.output
    for extra, words in ((["--N", "446"], "--N"), (["--window", "8,0"], "causal alone")):
        bad = CliRunner().invoke(cli, ["compare", "--documents", "300,146", "--d", "64", "--dtype", "float16",
                                       "--simulate", *extra])
        assert bad.exit_code != 0 and words in bad.output, bad.output
