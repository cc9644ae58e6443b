"""Cross-references hold: generated docs are current, and every rule, mutant and public
case the code knows is in the docs under the same name."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvfence.adapters.cases import CASES
from kvfence.adapters.mutants import MUTANTS
from kvfence.model.actions import ACTION_TYPES
from kvfence.model.rules import RULES

ROOT = Path(__file__).resolve().parents[1]


def gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["docs/rules.md", "docs/lifecycle.md"])
def test_generated_pages_are_current(page):
    render = gen_docs().PAGES[page]
    assert (ROOT / page).read_text() == render(), f"run: python scripts/gen_docs.py ({page})"


def test_every_rule_is_documented():
    text = (ROOT / "docs" / "rules.md").read_text()
    for r in RULES:
        assert f"| {r.id} | {r.name} |" in text


def test_every_action_is_named_in_the_spec_page():
    text = (ROOT / "docs" / "spec.md").read_text()
    for action in ACTION_TYPES:
        assert f"`{action.__name__}" in text, action.__name__


def test_fault_page_names_every_mutant_and_case():
    text = (ROOT / "docs" / "faults.md").read_text()
    for m in MUTANTS:
        assert m.name in text, m.name
    for c in CASES:
        assert c.id in text and c.mutant in text, c.id


def test_readme_commands_parse():
    """Every `kvfence ...` command the README shows is one the CLI accepts (a renamed
    subcommand or flag fails here, not in a reader's shell)."""
    import shlex

    from kvfence.conformance.cli import build_parser

    readme = (ROOT / "README.md").read_text().replace("\\\n", " ")  # join continued lines
    commands = [
        shlex.split(line.split("#")[0])[1:]
        for line in readme.splitlines()
        if line.startswith(".venv/bin/kvfence ")
    ]
    assert {c[0] for c in commands} >= {"check", "replay", "mutants", "explore", "rules"}
    for argv in commands:
        build_parser().parse_args(argv)  # SystemExit(3) on an unknown command or flag


def test_every_capability_is_in_the_adapter_contract():
    from kvfence.adapters import protocol
    from kvfence.model.capabilities import Capability

    for c in Capability:
        assert f"``{c.value}``" in protocol.__doc__, c
