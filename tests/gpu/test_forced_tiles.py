"""Forced tiles (``make_plan(block_r=, block_c=)``, ``sweep --vary block``) on the GPU: the kernels'
counters equal the model byte for byte and the outputs match float64, for every tiling the block-size
study of scripts/sweeps.sh runs (plus the backward and two_pass with a forced resident block)."""

import numpy as np
import pytest

from iokernels import model
from iokernels.analysis.sweep import Problem, make_point_plan, resident_tile
from iokernels.kernels import launch
from iokernels.model.specs import current_device_spec
from iokernels.plan import TilesDoNotFit
from iokernels.simulate import reference

from .helpers import naive_backward, naive_forward, problem_scale, rel_err

KB = 1024
# (algorithm, schedule, pass, dtype, resident block): the block study (flash forward, float16 and
# float32, 64..512) and a few more
CASES = [(("flash", s, "fwd"), dtype, block) for s in ("kv_outer", "q_outer") for dtype in ("float16", "float32")
         for block in (64, 128, 256, 512)]
CASES += [(("flash", "kv_outer", "bwd"), "float32", 32), (("flash", "kv_outer", "bwd"), "float16", 128),
          (("two_pass", "store", "fwd"), "float32", 256), (("two_pass", "recompute", "fwd"), "bfloat16", 200)]


@pytest.mark.parametrize(("key", "dtype", "block"), CASES,
                         ids=[f"{'/'.join(k)}-{t}-{b}" for k, t, b in CASES])
def test_forced_tiles_count_the_model_and_match_float64(key, dtype, block):
    limit = current_device_spec().smem_per_block_bytes
    base = Problem(N_q=300, N_k=277, d=64, dtype=dtype, sram=min(227 * KB, limit), batch=1, heads=2)
    try:
        plan = make_point_plan(key, "block", block, base, limit)
    except TilesDoNotFit as exc:
        pytest.skip(str(exc))
    assert plan.tile[resident_tile(key)] == block

    inputs, host = launch.make_device_inputs(plan, seed=block)
    run = launch.run_plan(plan, inputs, counting=True)
    assert run.counts == model.exact(plan)

    names = ("O",) if plan.direction == "fwd" else ("dQ", "dK", "dV")
    got = {n: launch.to_float64(run.buffers[n], plan.dtype) for n in names}
    if plan.direction == "fwd":
        want = {"O": reference.forward(host["Q"], host["K"], host["V"])[0]}
        naive = {"O": naive_forward(host["Q"], host["K"], host["V"], plan.dtype)}
    else:
        want = dict(zip(names, reference.backward(host["Q"], host["K"], host["V"], host["dO"]), strict=True))
        naive = dict(zip(names, naive_backward(host["Q"], host["K"], host["V"], host["dO"], plan.dtype),
                         strict=True))
    scale = problem_scale(want)
    for name in names:
        assert np.all(np.isfinite(got[name])), name
        err = rel_err(got[name], want[name], scale)
        if dtype == "float32":
            assert err < 1e-5, (name, err)
        else:
            assert err <= 2 * rel_err(naive[name], want[name], scale) + 1e-6, (name, err)
