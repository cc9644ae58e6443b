"""The layering as an executable rule: model <- adapters <- conformance.

The three folders are installed as ``kvfence.model``, ``kvfence.adapters`` and
``kvfence.conformance`` (``package-dir`` in pyproject.toml), so an import of a bare
``model``/``adapters``/``conformance`` only works from a checkout, by accident of the
working directory, and shadows the installed package (one such bug already happened).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("model", "adapters", "conformance")
SOURCES = sorted(
    p
    for folder in (*LAYERS, "tests", "scripts", "src")
    for p in (ROOT / folder).rglob("*.py")
    if ".venv" not in p.parts
)
ALLOWED: dict[str, set[str]] = {
    "model": {"model"},
    "adapters": {"model", "adapters"},
    "conformance": {"model", "adapters", "conformance"},
}
"""What each layer may import from kvfence: never a layer above it."""


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, absolute (relative imports resolved within its
    package), with the line it is on."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(ROOT).parts
    # The package a module sits in: kvfence.<layer> for model/x.py, kvfence.<layer>.<sub>
    # for a subpackage such as conformance/serve/x.py.
    package = ["kvfence", *rel[:-1]] if rel[0] in LAYERS else []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            out.append((node.lineno, name))
    return out


def test_sources_were_found():
    names = {p.relative_to(ROOT).parts[0] for p in SOURCES}
    assert set(LAYERS) <= names and "tests" in names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_bare_layer_imports(path):
    bare = [(n, m) for n, m in imports(path) if m.split(".")[0] in LAYERS]
    assert not bare, f"{path.relative_to(ROOT)} imports {bare}: use kvfence.<layer>"


@pytest.mark.parametrize(
    "path",
    [p for p in SOURCES if p.relative_to(ROOT).parts[0] in LAYERS],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_each_layer_imports_only_layers_below(path):
    wrong = upward(path)
    assert not wrong, f"{path.relative_to(ROOT)} must not import {wrong}"


def upward(path: Path) -> list[tuple[int, str]]:
    """The imports of ``path`` that reach a layer above its own."""
    layer = path.relative_to(ROOT).parts[0]
    return [
        (n, m)
        for n, m in imports(path)
        if m.startswith("kvfence.") and m.split(".")[1] in LAYERS
        if m.split(".")[1] not in ALLOWED[layer]
    ]


def test_the_rule_catches_a_violation(monkeypatch):
    """The rule itself can fail: a model module importing upwards, absolutely or
    relatively, is caught."""
    probe = ROOT / "model" / "_layering_probe.py"
    source = "from kvfence.conformance import runner\nfrom ..adapters import registry\n"
    monkeypatch.setattr(Path, "read_text", lambda self, **kw: source)
    assert [m for _, m in upward(probe)] == ["kvfence.conformance", "kvfence.adapters"]


CONFORMANCE = ROOT / "conformance"


def sibling_imports(path: Path, package: str = "kvfence.conformance") -> set[str]:
    """The modules of ``package`` that ``path`` imports anywhere in it: at module level,
    inside a function, or under ``if TYPE_CHECKING`` (a deferred import hides a cycle, it
    does not remove it). ``from . import x`` counts as importing ``x``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [f"{package}.{node.module}"] if node.module else []
            names += [] if node.module else [f"{package}.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if node.module == package:
                names = [f"{package}.{a.name}" for a in node.names]
        else:
            continue
        out |= {
            n.removeprefix(f"{package}.").split(".")[0]
            for n in names
            if n.startswith(package + ".")
        }
    return out - {path.stem}


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (module -> the modules it imports) as a path that ends where
    it starts, or None when the graph is acyclic (depth-first search, three colours)."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt)
            if found:
                return found
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start)
        if found:
            return found
    return None


def test_conformance_imports_have_no_cycle():
    """The modules of conformance/ import one another one way only: no cycle, whether
    the imports sit at module level or are deferred into a function."""
    graph = {p.stem: sibling_imports(p) for p in CONFORMANCE.glob("*.py")}
    assert {"lockstep", "program", "calls", "errors", "record"} <= set(graph)
    assert "program" in graph["lockstep"] and "lockstep" not in graph["program"]
    cycle = import_cycle(graph)
    assert cycle is None, "conformance/ import cycle: " + " -> ".join(cycle or ())


def test_the_cycle_check_catches_a_deferred_import(monkeypatch):
    """The check can fail: an import hidden inside a function still closes the cycle."""
    sources = {
        "a": "from .b import f\n",
        "b": "def f():\n    from kvfence.conformance import a\n    return a\n",
    }
    monkeypatch.setattr(Path, "read_text", lambda self, **kw: sources[self.stem])
    graph = {name: sibling_imports(CONFORMANCE / f"{name}.py") for name in sources}
    assert graph == {"a": {"b"}, "b": {"a"}}
    assert import_cycle(graph) == ["a", "b", "a"]
    assert import_cycle({"a": {"b"}, "b": set()}) is None


PROCESS_MODULES = frozenset({"os", "multiprocessing", "pickle", "signal", "select", "subprocess"})
"""Process, pipe and signal code: the search's worker pool lives in conformance/, never in
the pure model (the model reads no clock, forks nothing, talks to nothing)."""


def process_imports(path: Path) -> list[tuple[int, str]]:
    """The imports of ``path`` that reach a process, pipe or signal module."""
    return [(n, m) for n, m in imports(path) if m.split(".")[0] in PROCESS_MODULES]


@pytest.mark.parametrize(
    "path",
    [p for p in SOURCES if p.relative_to(ROOT).parts[0] == "model"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_model_has_no_process_or_pipe_code(path):
    found = process_imports(path)
    assert not found, f"{path.relative_to(ROOT)} imports {found}: move it to conformance/"


def test_the_process_rule_catches_a_violation(monkeypatch):
    """The rule can fail: a model module importing any of them, plainly or from a
    submodule, is caught."""
    probe = ROOT / "model" / "_process_probe.py"
    source = "import os\nfrom multiprocessing.connection import Connection\nimport pickle as p\n"
    monkeypatch.setattr(Path, "read_text", lambda self, **kw: source)
    assert [m for _, m in process_imports(probe)] == ["os", "multiprocessing.connection", "pickle"]


@pytest.mark.parametrize(
    "path",
    [p for p in SOURCES if p.relative_to(ROOT).parts[0] in LAYERS],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_imports_inside_the_package_are_relative(path):
    """Inside model/, adapters/ and conformance/ the package's own modules are imported
    relatively (``from ..model.state import Config``), so a tool that maps a module to its
    folder (an import graph drawn from the tree, a type checker run without installing)
    follows every arrow model <- adapters <- conformance; ``package-dir`` hides an absolute
    ``kvfence.model`` import from it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    absolute = [
        (node.lineno, name)
        for node in ast.walk(tree)
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level == 0
            else []
        )
        if name.split(".")[:2] in (["kvfence", layer] for layer in LAYERS)
    ]
    assert not absolute, f"{path.relative_to(ROOT)} imports {absolute}: import it relatively"
