"""softcap= on the library's calls, on the CPU: what a softcapped call refuses before it reaches the GPU (another
algorithm or schedule, dropout, masks, the wide backward, deterministic=True, bad values) and the plan it runs."""

import numpy as np
import pytest

import iokernels
from iokernels.library.planning import choose_plan
from iokernels.plan import Unsupported


def test_refusals_before_the_gpu():
    q = np.zeros((2, 100, 64), np.float16)
    for options in ({"algorithm": "standard"}, {"schedule": "q_outer"}, {"dropout": 0.1},
                    {"mask": np.ones((100, 100), bool)}):
        with pytest.raises(Unsupported, match="softcap"):
            iokernels.attention(q, q, q, softcap=30.0, **options)
    for bad, error in ((0.0, ValueError), (-2.0, ValueError), (float("nan"), TypeError), ("30", TypeError)):
        with pytest.raises(error, match="softcap"):
            iokernels.attention(q, q, q, softcap=bad)
    wide = np.zeros((2, 100, 256), np.float16)
    with pytest.raises(Unsupported, match="softcap"):
        iokernels.attention_backward(wide, wide, wide, wide, wide, np.zeros((2, 100), np.float32), softcap=30.0)
    with pytest.raises(Unsupported, match="softcap"):
        iokernels.attention_backward(q, q, q, q, q, np.zeros((2, 100), np.float32), softcap=30.0, deterministic=True)


def test_the_plan():
    for direction in ("fwd", "bwd"):
        plan, expand = choose_plan(direction, "flash", None, 300, 300, 128, "float16", (2, 4), None, 2, "bottom_right",
                                   softcap=20.0)
        assert not expand and plan.softcap == 20.0 and dict(plan.stage("main").params)["SOFTCAP"] == 1
        assert plan.stage("main").kernel in ("flash_tma_fwd", "flash_tma_bwd")
