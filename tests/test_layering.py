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
    package = ["kvfence", rel[0]] if rel[0] in LAYERS else []
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
