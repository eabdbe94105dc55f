"""Variable-length plans (iokernels/plan/varlen.py) on the CPU: the grid and the defines, the simulator's outputs equal
each sequence's float64 reference and its bytes the model's exact ones (both counted from first principles here for a
small case), the launch plan, and clear errors on bad input."""

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import Unsupported
from iokernels.plan.sequences import lengths_from_cu
from iokernels.plan.varlen import make_varlen_plan, varlen_sums
from iokernels.simulate import make_inputs, reference, simulate
from iokernels.simulate.inputs import reference_outputs


def test_grid_defines_and_shapes():
    plan = make_varlen_plan(d=96, dtype="bfloat16", heads=6, kv_heads=2, lengths_q=(3, 300, 0), lengths_k=(9, 1, 2),
                            causal=True)
    stage = plan.stage("main")
    assert stage.grid == (3, 3, 6)  # ⌈300 / 128⌉ tiles, 3 sequences, 6 query heads
    params = dict(stage.params)
    assert params["VARLEN"] == 1 and params["CAUSAL"] == 2 and params["HEAD_D_TILE"] == 128
    assert (plan.N_q, plan.N_k, plan.batch, plan.causal) == (300, 9, 3, "bottom_right")
    assert launch.tensor_shape(plan, "Q") == (303, 6, 96)
    assert launch.tensor_shape(plan, "K") == (12, 2, 96)
    assert launch.tensor_shape(plan, "lse") == (303, 6)
    assert launch.tensor_shape(plan, "cu_seqlens_k") == (4,)
    layout, _ = launch.stage_arg_layout(plan, stage, 0.1)
    assert layout[-2:] == ("cu_seqlens_q", "cu_seqlens_k")
    assert [int(x) for x in layout[5:7]] == [303, 12]  # the packed rows as the kernels' n_q, n_k
    q_map = layout[0]
    assert q_map.packed and (q_map.bh, q_map.n, q_map.d) == (6, 303, 96)


def test_bytes_by_hand():
    """Two sequences, B_r = B_c = 128 at d 64: (200 queries, 130 keys) and (50, 300). Per head, the first's two query
    tiles read 128 + 72 + ... rows; every copy counted inside the packed tensor (250 query rows, 430 key rows)."""
    plan = make_varlen_plan(d=64, dtype="float16", heads=1, lengths_q=(200, 50), lengths_k=(130, 300))
    sums = varlen_sums(plan)
    # query tiles: seq 0 rows [0, 128), [128, 256) (56 of them the next sequence's, all inside the 250 rows... 250 - 128
    # = 122 of the box); seq 1 rows [200, 328) -> 50 inside
    assert sums["rows_q"] == 128 + 122 + 50
    # seq 0's key tiles [0, 128), [128, 256) (all inside 430 keys), for each of its 2 query tiles; seq 1's from key 130:
    # [130, 258), [258, 386), [386, 514) -> 128 + 128 + 44
    assert sums["rows_k"] == 2 * 256 + 300
    assert sums["blocks"] == 2 * 2  # ⌈200 / 128⌉ tiles x 2 sequences
    main = model.exact(plan)["main"]
    assert main["Q"] == (300 * 64 * 2, 0) and main["K"] == main["V"] == (812 * 64 * 2, 0)
    assert main["O"] == (0, 250 * 64 * 2) and main["lse"] == (0, 250 * 4)
    assert main["cu_seqlens_q"] == main["cu_seqlens_k"] == (4 * 2 * 4, 0)
    assert model.predict(plan).flops == 4 * 64 * (200 * 130 + 50 * 300)


@pytest.mark.parametrize("causal", [False, True, "top_left"])
@pytest.mark.parametrize(("lq", "lk"), [((5, 300, 0, 129), None), ((1, 17, 250), (300, 0, 3))])
def test_simulator_equals_model_and_reference(causal, lq, lk):
    plan = make_varlen_plan(d=64, dtype="float16", heads=4, kv_heads=2, lengths_q=lq, lengths_k=lk, causal=causal)
    inputs = make_inputs(plan, seed=1)
    sim = simulate(plan, inputs)
    assert sim.counts == model.exact(plan)
    want = reference_outputs(plan, inputs)["O"]
    assert np.max(np.abs(sim.outputs["O"] - want)) < 1e-12
    # sequence by sequence, the dense reference of that sequence alone
    oq, n, ok, m = plan.varlen.sequences()[-1]
    if n and m:
        q = np.swapaxes(inputs["Q"][oq:oq + n], 0, 1)
        k, v = (np.repeat(np.swapaxes(inputs[x][ok:ok + m], 0, 1), 2, axis=0) for x in ("K", "V"))
        dense = reference.forward(q, k, v, causal=plan.causal)[0]
        assert np.max(np.abs(np.swapaxes(sim.outputs["O"][oq:oq + n], 0, 1) - dense)) < 1e-12


def test_launch_plan_has_no_exact_bytes():
    plan = make_varlen_plan(d=128, dtype="float16", heads=2, batch=3, max_q=500, max_k=700, total_q=900,
                            total_k=1000)
    assert plan.stage("main").grid == (4, 3, 2) and not plan.varlen.known
    with pytest.raises(ValueError, match="not known"):
        model.exact(plan)


def test_bad_input():
    with pytest.raises(ValueError, match="same sequences"):
        make_varlen_plan(d=64, dtype="float16", lengths_q=(1, 2), lengths_k=(1,))
    with pytest.raises(ValueError, match=">= 0"):
        make_varlen_plan(d=64, dtype="float16", lengths_q=(1, -2))
    with pytest.raises(Unsupported, match="tma"):
        make_varlen_plan(d=64, dtype="float32", lengths_q=(1, 2))
    with pytest.raises(ValueError, match="exceed"):
        make_varlen_plan(d=64, dtype="float16", batch=2, max_q=10, max_k=5, total_q=8, total_k=9)
    with pytest.raises(ValueError, match="needs lengths_q"):
        make_varlen_plan(d=64, dtype="float16", batch=2)
    with pytest.raises(ValueError, match="non-decreasing"):
        lengths_from_cu([0, 5, 3])
    assert lengths_from_cu(np.array([0, 5, 5, 9])) == (5, 0, 4)


@pytest.mark.parametrize("d", [64, 256])  # the reduce-add's boxes; the wide tiles' reductions
@pytest.mark.parametrize("causal", [False, True, "top_left"])
@pytest.mark.parametrize(("lq", "lk"), [((5, 300, 0, 129), None), ((1, 17, 250), (300, 0, 3))])
def test_backward_simulator_equals_model_and_reference(d, causal, lq, lk):
    plan = make_varlen_plan(d=d, dtype="bfloat16", heads=4, kv_heads=2, lengths_q=lq, lengths_k=lk, causal=causal,
                            direction="bwd")
    assert [s.name for s in plan.stages] == ["prep", "main", "dq"]
    assert plan.stage("main").grid[1:] == (len(lq), 2)
    inputs = make_inputs(plan, seed=2)
    sim = simulate(plan, inputs)
    assert sim.counts == model.exact(plan)
    want = reference_outputs(plan, inputs)
    for name in ("dQ", "dK", "dV"):
        assert np.max(np.abs(sim.outputs[name] - want[name])) < 1e-10 * max(1.0, np.max(np.abs(want[name])))


def test_backward_bytes_by_hand():
    """One sequence of 100 queries and keys at d 128 (B_r 64, B_c 128): one key block reads K and V once (100 rows),
    Q and dO twice (64 + 36 rows), lse and D 100 floats, dQacc's two 64-row boxes 64 + 36 rows (read and written)."""
    plan = make_varlen_plan(d=128, dtype="float16", heads=1, lengths_q=(100,), direction="bwd")
    main = model.exact(plan)["main"]
    assert main["K"] == main["V"] == (100 * 128 * 2, 0)
    assert main["Q"] == main["dO"] == (100 * 128 * 2, 0)
    assert main["lse"] == main["D"] == (100 * 4, 0)
    assert main["dQacc"] == (100 * 128 * 4, 100 * 128 * 4)
    assert main["dK"] == main["dV"] == (0, 100 * 128 * 2)
    assert model.predict(plan).flops == 5 * 2 * 100 * 100 * 128


def test_forward_block_r_for_tuning():
    """B_r 192 (three consumer warpgroups) is the default at d up to 64, causal or not, 128 elsewhere; 128 can be asked
    for at d 64, 192 nowhere past it."""
    for causal in (False, True):
        assert make_varlen_plan(d=64, dtype="float16", lengths_q=(5,), causal=causal).tile["Br"] == 192
        assert make_varlen_plan(d=72, dtype="float16", lengths_q=(5,), causal=causal).tile["Br"] == 128
    plan = make_varlen_plan(d=64, dtype="float16", lengths_q=(5,), block_r=128)
    assert plan.tile["Br"] == 128 and plan.stages[0].threads == 2 * 128 + 128
    with pytest.raises(ValueError, match="block_r 128"):
        make_varlen_plan(d=128, dtype="float16", lengths_q=(5,), block_r=192)
    with pytest.raises(ValueError, match="dense tma backward's tiles"):
        make_varlen_plan(d=64, dtype="float16", lengths_q=(5,), block_r=128, direction="bwd")
