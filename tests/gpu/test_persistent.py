"""The persistent tma forward (kernels/flash_tma.cu with PERSISTENT: blocks take work items in turn) with many items
per block: the plan's grid cut to 1–7 blocks, so the K/V rings, the Q barriers and the warpgroups' turns run on
across items, with items of zero and one key tile among longer ones. Each block's items are the same work whatever
block takes them, so O and lse equal the full grid's bit for bit, in both builds, and the counted bytes equal
model.exact. (The review of the persistent kernel found no GPU test that ran several items per block.)

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_persistent.py`` (skips without an sm_90 device).
"""

import dataclasses

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan import make_plan
from iokernels.plan.dropout import Dropout

cp = pytest.importorskip("cupy")
KB = 1024


pytestmark = pytest.mark.usefixtures("sm90")


def _regrid(plan, blocks):
    stages = tuple(dataclasses.replace(s, grid=(blocks, 1, 1)) if s.name == "main" else s for s in plan.stages)
    return dataclasses.replace(plan, stages=stages)


CASES = [  # (grids, problem)
    ((5, 1), dict(N_q=2000, N_k=300, d=64, dtype="float16", heads=16, kv_heads=4, window=(64, 0))),  # zero-tile items
    ((3,), dict(N_q=2000, N_k=300, d=64, dtype="bfloat16", heads=16, kv_heads=4, window=(64, 0),
                dropout=Dropout(0.1, 12345, 7))),
    ((3,), dict(N_q=1000, d=128, dtype="float16", heads=24)),  # dense
    ((2,), dict(N_q=777, N_k=1500, d=256, dtype="float16", heads=6, causal="bottom_right", window=(200, None))),
    ((7,), dict(N_q=1000, d=96, dtype="bfloat16", heads=20, window=(100, 20), dropout=Dropout(0.2, 99, 3))),
    ((1,), dict(N_q=1000, d=64, dtype="float16", heads=20, window=(0, 0))),  # one-tile items
    # three consumer warpgroups (192-row tiles, plan.fast.with_wide_persistent): dense, d 64 and 32
    ((4, 1), dict(N_q=1000, N_k=2000, d=64, dtype="float16", heads=16, kv_heads=4)),
    ((3,), dict(N_q=300, d=32, dtype="bfloat16", heads=8)),
]


@pytest.mark.parametrize("grids, problem", CASES, ids=lambda c: "-".join(map(str, c)) if isinstance(c, tuple) else
                         "-".join(f"{k}{v}" for k, v in c.items() if k not in ("dropout",)))
def test_few_blocks_give_the_full_grids_outputs_and_bytes(grids, problem):
    plan = make_plan("flash", "fast", sram=227 * KB, **problem)
    assert dict(plan.stage("main").params).get("PERSISTENT") == 1
    inputs, _ = launch.make_device_inputs(plan, seed=7)
    for counting in (True, False):  # each build against its own full grid
        full = launch.run_plan(plan, inputs, counting=counting)
        want = {n: cp.asnumpy(full.buffers[n]) for n in ("O", "lse")}
        for blocks in grids:
            run = launch.run_plan(_regrid(plan, blocks), inputs, counting=counting)
            if counting:
                assert run.counts == full.counts == model.exact(plan)
            for name, w in want.items():
                got = cp.asnumpy(run.buffers[name])
                assert np.array_equal(got.view(np.uint8), w.view(np.uint8)), (blocks, counting, name)


@pytest.mark.parametrize("d", [64, 32])
def test_wide_persistent_equals_a_block_per_item(d):
    """The persistent grid with three consumer warpgroups (B_r 192) gives a block per item's O and lse bit for bit, and
    the same bytes: every item is the same work whichever block takes it."""
    from iokernels.plan.fast import make_fast_plan

    plan = make_plan("flash", "fast", N_q=1500, d=d, dtype="float16", sram=227 * KB, batch=3, heads=16)
    per_item = make_fast_plan(N_q=1500, d=d, dtype="float16", batch=3, heads=16, kernel="tma", persistent=False)
    assert plan.tile == per_item.tile and plan.stage("main").grid == (132, 1, 1) != per_item.stage("main").grid
    inputs, _ = launch.make_device_inputs(plan, seed=11)
    for counting in (True, False):
        a, b = (launch.run_plan(p, inputs, counting=counting) for p in (plan, per_item))
        if counting:
            assert a.counts == b.counts == model.exact(plan)
        for name in ("O", "lse"):
            got, want = (cp.asnumpy(r.buffers[name]).view(np.uint8) for r in (a, b))
            assert np.array_equal(got, want), (counting, name)
