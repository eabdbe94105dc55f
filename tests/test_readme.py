import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


def test_readme_test_command_is_what_ci_runs():
    text = README.read_text()
    assert "<!-- test-command -->" in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert "test-command" in ci and "bash -c" in ci
