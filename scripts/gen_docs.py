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
    "MEM": "Memory release and resume",
    "PUB": "Version publishing",
    "WIN": "Two-phase update windows",
    "DER": "Derived weight state",
    "RNK": "Data-parallel ranks behind one endpoint",
    "STO": "A KV store shared by several endpoints",
    "PD": "Prefill/decode deployments",
    "RTR": "Workers behind a router",
}

KIND_NOTES = {
    "MEM": (
        "Sleep and WakeUp take tags (`kv_cache`, `weights`; none means all). What is "
        "released is the endpoint's `released` set; the phase is ASLEEP while it is not "
        "empty. ENG-006 judges the release (the index goes with the KV memory), MEM-002 the "
        "resume, MEM-001 the update or flush in between (the colocated order: "
        "Sleep(all); WakeUp(weights); UpdateWeights(flush_cache=True); WakeUp(kv_cache)). "
        "There is no separate rule for what that flush must remove: it is any update's "
        "flush, judged by ENG-001/ENG-002, and a tier it leaves (only lower tiers outlive "
        "a KV release) by ENG-003; 'the KV is released, nothing to flush' is no excuse "
        "(mutant kv-resumed-stale-after-weights-only-update). A separate MEM rule would "
        "also go unexercised on every design that flushes at release, since its evidence "
        "needs a lower-tier entry that outlived the release. "
        "An update with the weights released is not enabled: nothing writes released "
        "weights (SGLang's release stashes the model's static state and its resume refills "
        "the weights from that stash; colocated trainers resume the weights by tag first)."
    ),
    "PUB": (
        "PUB-001 is a new rule rather than INV-003 extended: INV-003 is an invariant over "
        "every state (the label an update leaves must name whole weights), and its remedy is "
        "in the update funnel; PUB-001 judges one call, a label-only publish, and its remedy "
        "is to refuse that call. A publish the engine refuses changes nothing, so INV-003 "
        "keeps holding; a publish it accepts against other weights breaks both, and is "
        "named PUB-001 because that call is where the fix goes."
    ),
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
        "  after final weights'). On an exact lane ENG-001 flushes at the finish",
        "  anyway.",
        "",
    ),
    "DER": (
        "DER-001 is judged by the weights probe (`View.derived`, when the engine can show it)",
        "and by the restart oracle (`Response.fresh`, capability `restart_oracle`): the output",
        "of the same prompt from an engine freshly started at the version the endpoint claims.",
        "A difference from the engine's own cold computation is named by the mechanism that",
        "differs, the first the evidence does not rule out (`checks.restart_mechanism`): the",
        "engine's bytes equal the oracle's for another version of the prompt, so whole weights",
        "of that version compute under the claimed label (INV-003, relabel-without-loading);",
        "an update of the endpoint failed after moving weights and none completed since, so",
        "the rollback left them torn (FC-004, PF-27); the bytes are a reported miss's own",
        "output on a prompt served under another version before (stale KV, INV-001); a draft",
        "model no probe showed (ENG-004); derived state no probe showed (DER-001); otherwise",
        "INV-003. Inside a window that received chunks it is WIN-001's (WIN-003's after a",
        "failed chunk).",
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
        out += [f"## {kind}: {title}", ""]
        out += [KIND_NOTES[kind], ""] if kind in KIND_NOTES else []
        out += ["| ID | Name | Level | Requirement | Why | Source |"]
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
            "What an ASLEEP endpoint has released (`kv_cache`, `weights`, or both) is its",
            "`released` set, not a phase: Sleep adds its tags, WakeUp removes its tags and",
            "leads back to serving only when nothing stays released (otherwise its outcome is",
            "`WakeUpPartly`, which stays asleep). UpdateWeights and FlushCache are allowed",
            "asleep: the update only while the weights are resident (the colocated order),",
            "and with the KV released they must answer, never crash (MEM-001).",
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
