"""The GPU examples of the API reference (docs/API.md, from the docstrings) run and print what they show."""

import doctest

import pytest

from iokernels.library import apidoc


def _run(name):
    test = doctest.DocTestParser().get_doctest(apidoc.examples(name), {}, name, None, 0)
    assert test.examples
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


@pytest.mark.parametrize("name", ["iokernels.attention", "iokernels.attention_backward"])
def test_library_examples(name):
    _run(name)


def test_torch_example():
    pytest.importorskip("torch")
    _run("iokernels.torch.attention")
