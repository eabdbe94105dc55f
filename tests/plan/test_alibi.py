"""ALiBi (issue #22: the tma kernels' ALIBI): the plans (the tma kernels, a block per work item, the slopes per
batch·head), the simulator's bytes == model.exact (a float per block and query head) and its outputs == the float64
reference with the bias, the library's slopes (per head or per batch row and head), and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from iokernels import model
from iokernels.library.planning import alibi_for, alibi_values
from iokernels.plan import Dropout, Unsupported, make_plan
from iokernels.plan.masks import pattern
from iokernels.plan.variants import ALIBI_GROUP, geometric_slopes
from iokernels.simulate import make_inputs, max_relative_error, reference, reference_outputs, simulate

KB = 1024


def _plan(direction, n_q=300, n_k=400, d=64, causal="", batch=2, heads=4, kv_heads=2, slopes=(0.5, 0.25, 0.1, 0.0),
          **kw):
    return make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * KB, batch=batch,
                     heads=heads, kv_heads=kv_heads, causal=causal, alibi=slopes, direction=direction, **kw)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("causal", ["", "top_left", "bottom_right"])
@pytest.mark.parametrize("d", [64, 96, 128])
def test_simulator_bytes_equal_the_model_and_outputs_the_reference(direction, causal, d):
    plan = _plan(direction, d=d, causal=causal)
    main = plan.stage("main")
    assert main.kernel.startswith("flash_tma") and dict(main.params)["ALIBI"] == ALIBI_GROUP
    assert "PERSISTENT" not in dict(main.params)
    assert plan.alibi == (0.5, 0.25, 0.1, 0.0) * 2  # the heads' slopes for every batch row
    inputs = make_inputs(plan, seed=d)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan)
    assert max_relative_error(result.outputs, reference_outputs(plan, inputs)) < 1e-10
    # a float per block and query head: T_r blocks per batch·head forward, T_c backward
    blocks = math.ceil(plan.N_q / plan.tile["Br"]) if direction == "fwd" else math.ceil(plan.N_k / plan.tile["Bc"])
    assert result.counts["main"]["alibi"] == (4 * plan.bh * blocks, 0)


def test_with_a_block_mask_and_a_window():
    for kw in ({"block_mask": pattern("random", 0.5, n_q=300, n_k=400, seed=2)}, {"window": (50, 10)}):
        for direction in ("fwd", "bwd"):
            plan = _plan(direction, causal="bottom_right", **kw)
            inputs = make_inputs(plan, seed=5)
            result = simulate(plan, inputs)
            assert result.counts == model.exact(plan)
            assert max_relative_error(result.outputs, reference_outputs(plan, inputs)) < 1e-10


def test_the_bias():
    """−slope · |j − i − (N_k − N_q)|, written out for 2 queries and 3 keys (offset 1)."""
    want = -0.5 * np.array([[1, 0, 1], [2, 1, 0]], dtype=float)
    assert np.array_equal(reference.alibi_bias(np.array([0.5]), 2, 3)[0], want)


def test_refusals():
    with pytest.raises(Unsupported, match="ALiBi"):
        _plan("fwd", softcap=5.0)
    with pytest.raises(Unsupported, match="d up to 128"):
        _plan("fwd", d=160)
    # with dropout: the same bytes (dropout moves none)
    assert model.exact(_plan("bwd", dropout=Dropout(0.1, 1, 0))) == model.exact(_plan("bwd"))
    with pytest.raises(Unsupported, match="ALiBi"):
        make_plan("flash", "q_outer", N_q=300, d=64, dtype="float16", sram=96 * KB, alibi=(0.5,))
    with pytest.raises(Unsupported, match=f"at most {ALIBI_GROUP} query heads"):
        _plan("bwd", batch=1, heads=2 * ALIBI_GROUP, kv_heads=1, slopes=(0.1,) * (2 * ALIBI_GROUP))
    with pytest.raises(ValueError, match="numbers"):
        _plan("fwd", slopes=(0.5, 0.25, 0.1))
    with pytest.raises(ValueError, match=">= 0"):
        _plan("fwd", slopes=(0.5, -0.25, 0.1, 0.0))


def test_library_slopes():
    assert alibi_values(None) is None
    assert alibi_values(np.array([[1, 2]], dtype=np.float32)) == (1.0, 2.0)
    assert alibi_for((1.0, 2.0), (3, 2)) == (1.0, 2.0) * 3
    assert alibi_for(tuple(range(6)), (3, 2)) == tuple(range(6))
    with pytest.raises(ValueError, match="leading dims"):
        alibi_for((1.0, 2.0, 3.0), (3, 2))
    with pytest.raises(ValueError, match=">= 0"):
        alibi_values([float("nan")])
    with pytest.raises(TypeError, match="numbers"):
        alibi_values(["a"])


def test_cli_compare_alibi_simulated():
    """`compare --alibi --simulate`: the flash/fast plans alone (the others take no slopes), meas/pred 1 and the
    float64 reference; `model --alibi` shows the slopes' bytes."""
    import json

    from click.testing import CliRunner

    from iokernels.cli import cli

    result = CliRunner().invoke(cli, ["compare", "--simulate", "--N", "300", "--d", "64", "--dtype", "float16",
                                      "--sram", "227KB", "--batch", "1", "--heads", "4", "--alibi", "--causal",
                                      "--backward", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    totals = [r for r in json.loads(result.stdout)["rows"] if r["tensor"] == "total"]
    assert {(r["schedule"], r["pass"]) for r in totals} == {("fast", "fwd"), ("fast", "bwd")}
    assert all(r["measured_bytes"] == r["predicted_bytes"] and r["max_rel_err"] < 1e-10 for r in totals)
    doc = json.loads(CliRunner().invoke(cli, ["model", "--N", "1024", "--d", "64", "--dtype", "float16", "--sram",
                                              "227KB", "--batch", "1", "--heads", "2", "--alibi", "--json"]).stdout)
    assert [r["predicted_read_bytes"] for r in doc["rows"] if r["tensor"] == "alibi"] == [4 * 2 * 8]
    assert geometric_slopes(4) == (0.25, 0.0625, 0.015625, 0.00390625)
