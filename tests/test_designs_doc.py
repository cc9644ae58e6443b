"""docs/designs.md's matrix tables name every correct design and every mutant of the
catalog, each with the rules it keeps or must be killed by."""

from __future__ import annotations

from pathlib import Path

from kvfence.adapters.designs import DESIGNS
from kvfence.adapters.mutants import MUTANTS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "designs.md"


def test_every_design_is_a_row_with_what_it_keeps():
    text = PAGE.read_text()
    for d in DESIGNS:
        row = f"| `{d.name}` | {d.case or 'reference'} | {d.side} | {', '.join(d.keeps)} |"
        assert row in text, row


def test_every_mutant_is_a_row_with_its_rule():
    text = PAGE.read_text()
    for m in MUTANTS:
        row = f"| `{m.name}` | {m.side} | {m.rule} | {', '.join(m.cases)} |"
        assert row in text, row
