"""``bench --attn-mask additive|bool`` (issue #22: an explicit mask per batch and head, as attn_mask): the problems and
their labels, the work counted (as without), the mask made once with the same values for every implementation, what
ours, SDPA and FlexAttention are given (SDPA's output on the CPU against softmax(s + mask) written out), and the
command's refusals (CPU only)."""

import pytest
from click.testing import CliRunner

from iokernels.bench import configs, implementations
from iokernels.bench.clocks import Unsupported
from iokernels.cli import cli


def test_problems_carry_the_mask_kind_and_count_as_without():
    problems = configs.main_problems([64], [4096], ["float16"], heads=16, attn_mask="additive", causal=True)
    assert [p.attn_mask for p in problems] == ["additive"] and problems[0].describe().endswith("attn_mask=additive")
    plain = configs.Problem(4, 16, 4096, 64, "float16", causal=True)
    assert problems[0].flops("fwd") == plain.flops("fwd") and problems[0].flops("bwd") == plain.flops("bwd")
    with pytest.raises(ValueError, match="--attn-mask must be one of"):
        configs.main_problems([64], [4096], ["float16"], attn_mask="float")


@pytest.mark.parametrize("kind", configs.ATTN_MASKS)
def test_every_implementation_gets_the_same_mask(kind):
    torch = pytest.importorskip("torch")
    problem = configs.Problem(2, 3, 64, 16, "float32", attn_mask=kind)
    a, b = configs.explicit_mask(problem, "cpu"), configs.explicit_mask(problem, "cpu")
    assert a.shape == (2, 3, 64, 64) and torch.equal(a, b)
    if kind == "bool":
        assert a.dtype == torch.bool and 0.85 < a.float().mean().item() < 0.95
    else:
        assert a.dtype == torch.float32 and abs(a.mean().item()) < 0.05 and 0.9 < a.std().item() < 1.1


def test_ours_and_sdpa_get_the_mask(monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.nn.attention")
    import iokernels.torch as iotorch

    problem = configs.Problem(1, 2, 32, 16, "float32", attn_mask="additive")
    mask = configs.explicit_mask(problem, "cpu")
    calls = []
    monkeypatch.setattr(iotorch, "attention", lambda q, k, v, **kw: calls.append(kw) or q.clone())
    implementations.IokernelsTorch(device="cpu").setup(problem, "fwd").call()
    assert calls and all(torch.equal(c["attn_mask"], mask) for c in calls)
    out = implementations.TorchSdpa("torch_math", device="cpu").setup(problem, "fwd").call()
    gen = torch.Generator(device="cpu").manual_seed(0)  # the runner's inputs (torch_runner's make)
    q, k, v, _ = (torch.randn(1, 2, 32, 16, generator=gen) for _ in range(4))
    s = q.double() @ k.double().transpose(-1, -2) / 16 ** 0.5 + mask.double()
    want = torch.softmax(s, dim=-1) @ v.double()
    assert torch.allclose(out.double(), want, atol=1e-5)


def test_flex_adds_the_mask_and_refuses_a_boolean_one(monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.nn.attention.flex_attention")
    problem = configs.Problem(1, 2, 16, 16, "float32", attn_mask="additive")
    mask = configs.explicit_mask(problem, "cpu")
    score_mod = implementations.flex_score_mod(problem, "cpu")
    got = score_mod(torch.tensor(0.5), torch.tensor(0), torch.tensor(1), torch.tensor(3), torch.tensor(7))
    assert got.item() == pytest.approx(0.5 + mask[0, 1, 3, 7].item())
    with pytest.raises(Unsupported, match="attn-mask bool"):
        implementations.TorchFlex(device="cpu").setup(configs.Problem(1, 2, 16, 16, "float32", attn_mask="bool"),
                                                      "fwd")


@pytest.mark.parametrize("other", [["--window", "64,0"], ["--dropout", "0.1"], ["--alibi"], ["--softcap", "30"],
                                   ["--overhead"]])
def test_the_command_takes_it_with_causal_only(other):
    result = CliRunner().invoke(cli, ["bench", "--attn-mask", "additive", "--d", "64", "--N", "1024", *other])
    assert result.exit_code != 0 and "--attn-mask combines with --causal only" in result.output
