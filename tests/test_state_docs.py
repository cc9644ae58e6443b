"""Every field of the spec's state and observation types is documented where it is
declared (a docstring right after the field, as a TLA+ module documents each variable)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("model/state.py", "model/observation.py")


def undocumented(source: str) -> list[str]:
    """``Class.field`` for every field of an attrs class (decorated ``@frozen`` or
    ``@define``) in ``source`` that no string literal follows."""
    out = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        names = {
            getattr(d, "id", getattr(getattr(d, "func", None), "id", ""))
            for d in node.decorator_list
        }
        if not names & {"frozen", "define"}:
            continue
        body = node.body
        for i, stmt in enumerate(body):
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            after = body[i + 1] if i + 1 < len(body) else None
            documented = (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
                and after.value.value.strip()
            )
            if not documented:
                out.append(f"{node.name}.{stmt.target.id}")
    return out


@pytest.mark.parametrize("module", MODULES)
def test_every_field_has_a_docstring(module):
    source = (ROOT / module).read_text(encoding="utf-8")
    assert "@frozen" in source
    missing = undocumented(source)
    assert not missing, f"{module}: fields without a docstring: {', '.join(missing)}"


def test_the_check_names_an_undocumented_field():
    source = (
        "@frozen(cache_hash=True)\n"
        "class Probe:\n"
        "    kept: int = 0\n"
        '    """Documented."""\n'
        "    bare: bool = False\n"
        "    last: int = 1\n"
        "class Plain:\n"
        "    x: int = 0\n"
    )
    assert undocumented(source) == ["Probe.bare", "Probe.last"]
