"""Regenerate the docs pages that are derived from code: docs/rules.md, docs/lifecycle.md.

Run: python scripts/gen_docs.py  (tests/test_docs.py fails when they are stale)."""

from __future__ import annotations

import sys
from pathlib import Path

from kvfence.model import lifecycle
from kvfence.model.rules import RULES

ROOT = Path(__file__).resolve().parents[1]
KINDS = {
    "CLI": "Client resolver",
    "ENG": "Engine",
    "FC": "Fail-closed",
    "INV": "Invariants",
    "LIV": "Progress",
    "ADP": "Adapter contract",
    "REACH": "Reachability (a pass is never vacuous)",
}


def rules_md() -> str:
    out = [
        "# Rules",
        "",
        "Generated from `model/rules.py` by `scripts/gen_docs.py`; do not edit by hand.",
        "IDs are stable: a published ID never changes meaning. Levels follow RFC 2119.",
        "",
    ]
    for kind, title in KINDS.items():
        out += [f"## {kind}: {title}", "", "| ID | Name | Level | Requirement | Why | Source |"]
        out += ["|---|---|---|---|---|---|"]
        for r in RULES:
            if r.kind == kind:
                out.append(
                    f"| {r.id} | {r.name} | {r.level} | {r.text} | {r.rationale} | {r.source} |"
                )
        out.append("")
    return "\n".join(out)


def lifecycle_md() -> str:
    rows = ["| Action | Allowed in | Leads to |", "|---|---|---|"]
    for action, sources, dest in lifecycle.TABLE:
        rows.append(f"| {action} | {', '.join(sources)} | {dest or '(stays)'} |")
    return "\n".join(
        [
            "# Endpoint lifecycle",
            "",
            "Generated from `model/lifecycle.py` by `scripts/gen_docs.py`; do not edit by hand.",
            "Being *closed* (FC-002) is not a phase: a closed endpoint refuses to serve in any",
            "phase until a flush completes on whole weights.",
            "",
            "```mermaid",
            lifecycle.diagram().strip(),
            "```",
            "",
            *rows,
            "",
        ]
    )


PAGES = {"docs/rules.md": rules_md, "docs/lifecycle.md": lifecycle_md}


def main() -> int:
    for rel, render in PAGES.items():
        (ROOT / rel).write_text(render())
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
