"""Dropout through the library and the CLI, without a GPU: bad input fails before the GPU, the
generator's seed and offsets, the plans chosen, and the CLI's options."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

import iokernels
from iokernels.cli import cli
from iokernels.library.api import choose_plan
from iokernels.plan import Unsupported, make_plan, supports_dropout
from iokernels.plan import dropout as dr

Q = np.zeros((2, 3, 10, 64), np.float32)
LSE = np.zeros((2, 3, 10), np.float32)


@pytest.mark.parametrize("p, error", [(1.0, ValueError), (-0.1, ValueError), (float("nan"), ValueError),
                                      (True, TypeError), ("0.1", TypeError)])
def test_bad_dropout_is_refused_before_the_gpu(p, error):
    with pytest.raises(error, match="dropout probability"):
        iokernels.attention(Q, Q, Q, dropout=p)


def test_backward_takes_the_forwards_dropout_object():
    with pytest.raises(TypeError, match="Dropout the forward used"):
        iokernels.attention_backward(Q, Q, Q, Q, Q, LSE, dropout=0.1)
    h = Q.astype(np.float16)
    with pytest.raises(ValueError, match="no dropout kernel"):
        iokernels.attention_backward(h, h, h, h, h, LSE, dropout=iokernels.Dropout(0.1, 1), deterministic=True)


@pytest.mark.parametrize("seed, offset", [(-1, 0), (2**64, 0), (0, 2**32), (0, -1), (0.5, 0)])
def test_dropout_words_are_checked(seed, offset):
    with pytest.raises(ValueError, match=r"dropout (seed|offset)"):
        iokernels.Dropout(0.1, seed, offset)


def test_generator_takes_the_next_offset_and_manual_seed_restarts_it():
    iokernels.manual_seed(1234)
    a, b = dr.next_dropout(0.1), dr.next_dropout(0.2)
    assert (a.seed, a.offset, b.seed, b.offset) == (1234, 0, 1234, 1)
    iokernels.manual_seed(1234)
    assert dr.next_dropout(0.1) == a
    given = dr.next_dropout(0.3, seed=7, offset=9)
    assert (given.seed, given.offset) == (7, 9)
    assert dr.next_dropout(0.1).offset == 1  # a given offset does not advance the stream


def test_a_probability_of_zero_is_no_dropout():
    from iokernels.library.api import _forward_dropout

    assert _forward_dropout(0.0) is None and _forward_dropout(None) is None
    d = iokernels.Dropout(0.0, 3)
    assert _forward_dropout(d) is d and d.threshold == 0 and d.keep_scale == 1.0


def test_kernel_arguments_and_keep_probability():
    d = iokernels.Dropout(0.25, 2**40 + 5, 17)
    t, s, seed, off = d.kernel_args()
    assert (int(t), float(s), int(seed), int(off)) == (64, np.float32(1 / 0.75), 2**40 + 5, 17)  # 64 = 0.25 · 256
    assert d.keep_probability == 0.75


def test_library_plans_with_dropout():
    """Every plan the library picks for dropout implements it; flash takes the fast path only where its
    kernels apply dropout, else the research default."""
    d = iokernels.Dropout(0.1, 0)
    for direction in ("fwd", "bwd"):
        for algorithm in ("flash", "standard"):
            for dtype, dh in (("float16", 64), ("float32", 64)):
                try:
                    plan, _ = choose_plan(direction, algorithm, None, 256, 256, dh, dtype, (2,), None, 1, "",
                                           dropout=d)
                except Unsupported:
                    assert not any(supports_dropout(algorithm, s, direction) for s in
                                   iokernels.SCHEDULES[(algorithm, direction)])
                    continue
                assert plan.dropout == d
                assert any(dict(s.params).get("DROPOUT") for s in plan.stages)


def test_dropout_plans_move_the_bytes_of_the_plans_without_it():
    from iokernels import model

    d = iokernels.Dropout(0.2, 5, 1)
    for (algorithm, schedule, direction) in [k for k in iokernels.plan.DROPOUT_STAGES]:
        kw = dict(N_q=200, N_k=130, d=32, dtype="float16", sram=64 * 1024, direction=direction, batch=2)
        if schedule == "fast":
            kw.update(d=64, sram=227 * 1024)
        plain, dropped = make_plan(algorithm, schedule, **kw), make_plan(algorithm, schedule, dropout=d, **kw)
        assert model.predict(dropped).per_tensor == model.predict(plain).per_tensor


def _cli(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_cli_dropout_and_mask_options():
    r = _cli("model", "--N", "512", "--dropout", "0.1", "--backward", "--json")
    if r.exit_code == 0:
        doc = json.loads(r.output)
        assert doc["header"]["dropout"] == {"p": 0.1, "seed": 0, "offset": 0}
        labels = {p["algorithm"] + "/" + p["schedule"] + "/" + p["pass"] for p in doc["header"]["plans"]}
        assert labels and all(supports_dropout(*x.split("/")) for x in labels)
    else:
        assert not iokernels.plan.DROPOUT_STAGES
    r = _cli("model", "--N", "512", "--mask", "additive", "--mask-per-head", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["header"]["mask"] == {"kind": "additive", "shared": False}
    assert all(row["predicted_bytes"] > 0 for row in doc["rows"] if row["tensor"] == "mask")
    for args, message in [(("--dropout", "1.0"), "must be in [0, 1)"), (("--dropout-seed", "3"), "needs --dropout"),
                          (("--mask-per-head",), "needs --mask")]:
        r = CliRunner().invoke(cli, ["model", "--N", "512", *args])
        assert r.exit_code == 2 and message in r.output, r.output
