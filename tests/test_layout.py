"""The package's layout is its architecture (docs/ARCHITECTURE.md): subpackages in layers, no import cycle, no
module reaching into another's underscore names, no module over 600 lines. Read with :mod:`ast` only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "iokernels"
# lowest first; a module may import from its own layer or lower ones
LAYERS = (("plan",), ("model", "simulate", "kernels"), ("library", "analysis", "bench"), ("cli",))
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def import_target(name: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` in module ``name`` reads from."""
    if not node.level:
        return node.module or ""
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str) -> list[tuple[str, tuple[str, ...], int]]:
    """(imported module, names taken from it, line) for every import in module ``name``, at any depth."""
    out = []
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, (), node.lineno) for a in node.names if a.name.startswith("iokernels")]
        elif isinstance(node, ast.ImportFrom):
            target = import_target(name, node)
            if not target.startswith("iokernels"):
                continue
            names = tuple(a.name for a in node.names)
            # `from package import submodule` imports the submodule
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            out += [(s, (), node.lineno) for s in subs]
            rest = tuple(n for n in names if f"{target}.{n}" not in MODULES)
            if rest or not subs:
                out.append((target, rest, node.lineno))
    return out


def graph() -> dict[str, set[str]]:
    return {name: {t for t, _, _ in imports(name) if t in MODULES and t != name} for name in MODULES}


def layer(name: str) -> int | None:
    parts = name.split(".")
    if len(parts) < 2:
        return None
    for i, group in enumerate(LAYERS):
        if parts[1] in group:
            return i
    return None


def test_no_import_cycle() -> None:
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt):], nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_layers_import_downwards() -> None:
    wrong = []
    for name in MODULES:
        mine = layer(name)
        if mine is None:
            continue
        for target, _, line in imports(name):
            theirs = layer(target)
            if theirs is not None and theirs > mine:
                wrong.append(f"{name}:{line} imports {target} (layer {LAYERS[theirs]} above {LAYERS[mine]})")
    assert not wrong, "\n".join(wrong)


def test_no_underscore_names_across_modules() -> None:
    wrong = []
    for name in MODULES:
        for target, names, line in imports(name):
            if target == name:
                continue
            wrong += [f"{name}:{line} imports {target}.{n}" for n in names if n.startswith("_") and n != "__version__"]
    assert not wrong, "\n".join(wrong)


def test_no_underscore_attributes_of_other_modules() -> None:
    """``launch._counts_from(...)`` reaches into a module as much as ``from .launch import _counts_from``."""
    wrong = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = import_target(name, node)
                for a in node.names:
                    if f"{target}.{a.name}" in MODULES:
                        bound[a.asname or a.name] = f"{target}.{a.name}"
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                wrong.append(f"{name}:{node.lineno} uses {bound[node.value.id]}.{node.attr}")
    assert not wrong, "\n".join(wrong)


def test_no_module_over_600_lines() -> None:
    long = {name: n for name, path in MODULES.items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_subpackages_say_what_they_own() -> None:
    subpackages = [p.parent for p in PACKAGE.glob("*/__init__.py")]
    assert len([p for p in subpackages if p.name != "kernels"]) >= 5
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        where = init.relative_to(PACKAGE.parent)
        assert doc and "import" in doc.lower(), f"{where}: its docstring says what it owns and what it imports"


def test_the_checks_see_a_cycle_and_a_layer_breach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above can fail: a planted cycle and an upward import are found."""
    fake = {"iokernels.plan.a": "from .b import x\n", "iokernels.plan.b": "from ..cli import y\nfrom .a import z\n",
            "iokernels.cli": "", "iokernels.plan": ""}
    paths = {}
    for name, text in fake.items():
        parts = name.split(".")
        path = tmp_path.joinpath(*parts[:-1], parts[-1] + ".py") if name.count(".") > 1 else \
            tmp_path.joinpath(*parts, "__init__.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        paths[name] = path
    monkeypatch.setattr(__import__(__name__, fromlist=["MODULES"]), "MODULES", paths)
    edges = graph()
    assert "iokernels.plan.b" in edges["iokernels.plan.a"] and "iokernels.plan.a" in edges["iokernels.plan.b"]
    with pytest.raises(pytest.fail.Exception, match="import cycle"):
        test_no_import_cycle()
    with pytest.raises(AssertionError, match="layer"):
        test_layers_import_downwards()
