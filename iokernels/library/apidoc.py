"""The API reference, ``docs/API.md``, generated from the docstrings: ``python -m iokernels.library.apidoc``
prints it, ``--check`` exits 1 when the file differs.

Docstrings are read from the source files with :mod:`ast`, so neither cupy, torch nor a GPU is
needed. Doctest examples become ``pycon`` blocks; the tests run them (``tests/library/test_library_tools.py`` on
the CPU, ``tests/gpu/test_apidoc_examples.py`` on a GPU).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
DOC = PACKAGE.parent / "docs" / "API.md"

# (public name, source file, object in it: "" for the module docstring, "def name", "class name")
ENTRIES: tuple[tuple[str, str, str], ...] = (
    ("iokernels", "library/api.py", ""),
    ("iokernels.attention", "library/api.py", "attention"),
    ("iokernels.attention_backward", "library/api.py", "attention_backward"),
    ("iokernels.attention_with_kvcache", "library/kvcache.py", "attention_with_kvcache"),
    ("iokernels.attention_varlen", "library/varlen.py", "attention_varlen"),
    ("iokernels.attention_varlen_backward", "library/varlen.py", "attention_varlen_backward"),
    ("iokernels.attention_mods", "library/mods.py", "attention_mods"),
    ("iokernels.attention_mods_backward", "library/mods.py", "attention_mods_backward"),
    ("iokernels.create_block_mask", "library/mods.py", "create_block_mask"),
    ("iokernels.memory_needed", "library/api.py", "memory_needed"),
    ("iokernels.DeviceMemoryError", "library/memory.py", "DeviceMemoryError"),
    ("iokernels.clear_graphs", "library/execute.py", "clear_graphs"),
    ("iokernels.count_io", "kernels/launch.py", "count_io"),
    ("iokernels.plan.dropout", "plan/dropout.py", ""),
    ("iokernels.Dropout", "plan/dropout.py", "Dropout"),
    ("iokernels.manual_seed", "plan/dropout.py", "manual_seed"),
    ("iokernels.torch", "library/torch.py", ""),
    ("iokernels.torch.attention", "library/torch.py", "attention"),
    ("iokernels.torch.attention_with_kvcache", "library/torch.py", "attention_with_kvcache"),
    ("iokernels.torch.attention_varlen", "library/torch.py", "attention_varlen"),
    ("iokernels.torch.attention_mods", "library/torch_mods.py", "attention_mods"),
    ("iokernels warmup", "library/warmup.py", ""),
    ("iokernels info", "analysis/info.py", ""),
)

HEADER = """# API reference

Generated from the docstrings by `python -m iokernels.library.apidoc > docs/API.md`; a test fails when this
file is out of date, and the examples run in the tests (those needing a GPU in `tests/gpu/`).
"""


def _node(tree: ast.Module, name: str) -> ast.AST:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
    raise LookupError(f"no function or class {name!r}")


def docstring(source: str, name: str) -> str:
    """The docstring of ``name`` (a top-level function or class; "" for the module) in a source file."""
    tree = ast.parse((PACKAGE / source).read_text(encoding="utf-8"))
    node = tree if not name else _node(tree, name)
    return ast.get_docstring(node) or ""


def signature(source: str, name: str) -> str:
    tree = ast.parse((PACKAGE / source).read_text(encoding="utf-8"))
    node = _node(tree, name)
    if isinstance(node, ast.ClassDef):
        bases = ", ".join(ast.unparse(b) for b in node.bases)
        return f"class {name}({bases})"
    assert isinstance(node, ast.FunctionDef)
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    return f"{name}({ast.unparse(node.args)}){returns}"


def _markdown(text: str) -> str:
    """Docstring text as Markdown: ``code`` and :role:`x` as `x`, doctest examples as pycon blocks."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    out: list[str] = []
    in_example = False
    for line in text.splitlines():
        if line.startswith(">>>") and not in_example:
            out.append("```pycon")
            in_example = True
        elif in_example and not line.strip():
            out.append("```")
            in_example = False
        out.append(line)
    if in_example:
        out.append("```")
    return "\n".join(out).strip()


def generate() -> str:
    parts = [HEADER]
    for public, source, name in ENTRIES:
        parts.append(f"## `{public}`\n")
        if name:
            parts.append(f"```python\n{signature(source, name)}\n```\n")
        parts.append(_markdown(docstring(source, name)) + "\n")
    return "\n".join(parts)


def examples(public: str) -> str:
    """The docstring of an entry by its public name (what the example tests run)."""
    for name, source, obj in ENTRIES:
        if name == public:
            return docstring(source, obj)
    raise LookupError(public)


def main(argv: list[str]) -> int:
    text = generate()
    if argv == ["--check"]:
        if DOC.read_text(encoding="utf-8") != text:
            print(f"{DOC} is out of date: run python -m iokernels.library.apidoc > docs/API.md", file=sys.stderr)
            return 1
        return 0
    if argv:
        print("usage: python -m iokernels.library.apidoc [--check]", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
