"""Explicit masks as the tma kernels read them (iokernels/library/explicit.py), on the CPU: the strides of a mask
broadcast to (*lead, N_q, N_k) and the expression made of them, evaluated by the same C-expression evaluator the
reference and the model use, give numpy's broadcast of the mask at every (b, h, q_idx, kv_idx); batch dims no single
stride walks are refused (the library copies those); which calls take the route."""

import numpy as np
import pytest

from iokernels.library import explicit
from iokernels.plan.cexpr import parse
from iokernels.plan.modspec import VARIABLES

LAYOUTS = [  # (lead, the mask's shape)
    ((2, 3), (5, 7)),
    ((2, 3), (1, 1, 5, 7)),
    ((2, 3), (3, 5, 7)),
    ((2, 3), (2, 1, 5, 7)),
    ((2, 3), (2, 3, 5, 7)),
    ((2, 3), (5, 1)),
    ((2, 3), (1, 7)),
    ((4,), (4, 5, 7)),
    ((), (5, 7)),
    ((2, 3, 2), (2, 3, 1, 5, 7)),
    ((2, 3, 2), (1, 1, 2, 5, 7)),
]


def _evaluate(text, what, base, batch, heads, n_q, n_k, score=None):
    """The expression at every (b, h, q_idx, kv_idx), as (batch, heads, n_q, n_k)."""
    names = VARIABLES + (() if what == "mask_mod" else ("score",))
    expr = parse(text, names, [explicit.CAPTURE], what)
    b, h, qi, ki = np.meshgrid(np.arange(batch), np.arange(heads), np.arange(n_q), np.arange(n_k), indexing="ij")
    env = {"b": b, "h": h, "q_idx": qi, "kv_idx": ki, "n_q": n_q, "n_k": n_k}
    if score is not None:
        env["score"] = score
    value, _ = expr.evaluate({n: env[n] for n in expr.names}, {explicit.CAPTURE: base.reshape(-1)})
    return np.broadcast_to(value, (batch, heads, n_q, n_k))


@pytest.mark.parametrize("lead, shape", LAYOUTS)
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_expression_reads_the_broadcast_mask(lead, shape, kind):
    n_q, n_k = 5, 7
    rng = np.random.default_rng(len(lead) * 100 + len(shape))
    base = rng.random(shape) < 0.5 if kind == "bool" else rng.standard_normal(shape)
    full = (*lead, n_q, n_k)
    strides = explicit.strides_of(base, full)
    assert strides is not None
    mask_mod, score_mod = explicit.expressions(kind, strides)
    batch, heads = (int(np.prod(lead[:-1])), lead[-1]) if lead else (1, 1)
    want = np.broadcast_to(base, full).reshape(batch, heads, n_q, n_k)
    if kind == "bool":
        assert score_mod is None
        got = _evaluate(mask_mod, "mask_mod", base.astype(np.uint8), batch, heads, n_q, n_k)
        assert np.array_equal(got != 0, want)
    else:
        assert mask_mod is None
        score = rng.standard_normal((batch, heads, n_q, n_k))
        got = _evaluate(score_mod, "score_mod", base, batch, heads, n_q, n_k, score)
        assert np.array_equal(got, score + want)


@pytest.mark.parametrize("shape", [(2, 1, 2, 5, 7), (1, 3, 2, 5, 7), (2, 1, 1, 5, 7)])
def test_batch_dims_no_stride_walks_are_refused(shape):
    """lead (2, 3, 2): the batch index b = 3 i + j of a mask that varies with i or j alone needs two strides (the
    library copies those)."""
    assert explicit.strides_of(np.zeros(shape), (2, 3, 2, 5, 7)) is None


def test_wide_masks_index_in_64_bits():
    mask_mod, _ = explicit.expressions("bool", [0, 4 * 65536 * 65536, 65536, 1], wide=True)
    assert mask_mod == f"{explicit.CAPTURE}[h * 17179869184l + q_idx * 65536l + kv_idx * 1l] != 0"
    expr = parse(mask_mod, VARIABLES, [explicit.CAPTURE], "mask_mod")
    assert expr.names >= {"h", "q_idx", "kv_idx"}


@pytest.mark.parametrize("change", [{"algorithm": "standard"}, {"schedule": "q_outer"}, {"graph": True},
                                    {"dropout": 0.1}, {"window": (8, 0)}, {"softcap": 30.0}, {"alibi": (0.5,)},
                                    {"deterministic": True}])
def test_calls_the_route_leaves_to_the_research_kernels(change):
    """numpy arrays never take it (the GPU route needs cupy), and neither do the options the variants do not combine
    with, whatever the arrays."""
    q = np.zeros((1, 2, 16, 64), np.float16)
    mask = np.ones((16, 16), bool)
    options = {"algorithm": "flash", "schedule": None} | change
    assert not explicit.takes(q, mask, **options)
    assert not explicit.takes(q, None, algorithm="flash", schedule=None)



def test_a_numpy_mask_has_no_fast_path():
    """A numpy mask with cupy inputs is routed (takes() accepts it) but checked and copied up at every call: no fast
    path is made for it, and none is looked for at its address (numpy arrays have no device pointer)."""
    q = np.zeros((1, 2, 16, 64), np.float16)
    assert explicit.routed_call("fwd", (q, q, q), np.ones((16, 16), bool), causal="", scale=None, block_mask=None,
                                bfloat16=False) is None
