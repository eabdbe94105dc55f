"""``bench --window``: the option's parsing, the work counted (the visible elements) and which implementations
take a window (CPU only: the peers' refusals need no GPU)."""

import pytest

from iokernels.bench import configs
from iokernels.bench.clocks import Unsupported
from iokernels.bench.implementations import CupyStandard, TorchSdpa
from iokernels.cli.options import parse_window


def test_parse_window():
    assert parse_window("1024,0") == (1024, 0)
    assert parse_window(" 5 , -1 ") == (5, None)
    assert parse_window(None) is None and parse_window("-1,-1") is None
    for bad in ("1024", "1,2,3", "a,0", "-2,0"):
        with pytest.raises(ValueError, match="--window"):
            parse_window(bad)


def test_a_window_counts_its_visible_elements():
    # N 4, window (1, 0): rows see 1, 2, 2, 2 keys -> 7 elements, 4 d FLOPs each (d 8)
    assert configs.attention_flops(1, 1, 4, 4, 8, window=(1, 0)) == 4 * 8 * 7
    # with the causal mask a right side past the diagonal changes nothing: (2, 5) -> 1 + 2 + 3 + 3 = 9
    assert configs.attention_flops(2, 3, 4, 4, 8, causal=True, window=(2, 5), direction="bwd") == 2.5 * 6 * 4 * 8 * 9
    # (1, None): row i sees keys i - 1 onwards -> 4 + 4 + 3 + 2
    problem = configs.Problem(1, 2, 4, 8, "float16", window=(1, None))
    assert problem.flops("fwd") == 2 * 4 * 8 * (4 + 4 + 3 + 2) and "window=1,-1" in problem.describe()


def test_the_peers_without_a_window_refuse_it():
    problem = configs.Problem(1, 2, 64, 64, "float16", window=(16, 0))
    with pytest.raises(Unsupported, match="sliding window"):  # before it needs cupy
        CupyStandard().setup(problem, "fwd")
    pytest.importorskip("torch.nn.attention")
    with pytest.raises(Unsupported, match="sliding window"):
        TorchSdpa("torch_flash").setup(problem, "fwd")
