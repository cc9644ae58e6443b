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
    "WIN": "Two-phase update windows",
    "DER": "Derived weight state",
}

NOTES: dict[str, tuple[str, ...]] = {
    "WIN": (
        "A window opens with BeginWeightUpdate, lands chunks with UpdateWeightChunk, and",
        "closes with FinishWeightUpdate (which publishes the version, with the prefix cache",
        "obligations of a one-shot UpdateWeights: ENG-001 on exact lanes, ENG-002 when asked,",
        "ENG-012, FC-001, DER-001) or AbortWeightUpdate. Once a chunk has landed the live",
        "weights are mixed (the torn state of FC-004, tagged `mixed weights` on KV).",
        "",
        "**Who is to blame when KV from the window is reused after the finish (PF-23,",
        "huggingface/trl PR #6765).** The client flushed after BeginWeightUpdate, P was served",
        "meanwhile, the finish ran with `flush_cache=False` (the client thought it had already",
        "reset), and P hit after the finish. The spec splits the blame by what the reused KV was",
        "computed under:",
        "",
        "* KV computed under the window's **mixed** weights (P admitted after a chunk landed):",
        "  the engine's fault, WIN-002, whatever `flush_cache` said. Only the engine knows it",
        "  served under mixed weights, and no caller's opt-out covers KV of weights that never",
        "  were a version. The reference drops such KV at finish and abort.",
        "* KV computed under the **old whole** weights (P admitted before any chunk landed, or",
        "  by an engine that stages chunks): the ordinary update question. The engine did what",
        "  was asked (`flush_cache=False`); on a standard lane INV-001's waiver applies if the",
        "  client's policy opts out, and otherwise the stale hit is INV-001, the consequence of",
        "  a client that reset before the weights were final (the client rule CLI-0xx, 'reset",
        "  after final weights', of issue 11). On an exact lane ENG-001 flushes at the finish",
        "  anyway.",
        "",
    ),
    "DER": (
        "DER-001 is judged by the weights probe (`View.derived`, when the engine can show it)",
        "and by the restart oracle (`Response.fresh`, capability `restart_oracle`): the output",
        "of the same prompt from an engine freshly started at the version the endpoint claims.",
        "A difference from the engine's own cold computation is DER-001 on an endpoint with",
        "derived state, and INV-003 on one without (there, only the weights themselves can",
        "differ, so the claimed version is not what computes: e.g. relabel-without-loading).",
        "Like the byte oracle, it counts as evidence only once its outputs have told two",
        "versions apart for the same prompt.",
        "",
    ),
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
        out += NOTES.get(kind, ())
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
            "Nor is an open two-phase update window (BeginWeightUpdate .. FinishWeightUpdate or",
            "AbortWeightUpdate): it is endpoint data. While one is open, UpdateWeights,",
            "FaultUpdateFailsMidway, SyncWeights and Sleep are not enabled; once a chunk has",
            "landed, the endpoint serves under the mixed weights or refuses (WIN-001), and",
            "Restart drops the window with the process.",
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
