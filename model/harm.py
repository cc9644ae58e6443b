"""Harm and mechanism: what the contract judges, and what explains it.

The bug class is a handful of harms. Only a harm is a safety MUST: a system that avoids
every harm conforms, whatever mechanism it uses to avoid them (a version-keyed cache instead
of a flush, a pause that admits nothing instead of a flush after the update, a frozen draft
instead of one that follows the target). The other safety rules of the registry state *how*
the reference avoids a harm; each names the harm it explains. The contract asks that a
mechanism deviation judged alone be a note, and one judged with the harm it led to be that
harm's explanation ("H1 violated: stale KV served; mechanism: CLI-001"). The checker does
not judge by this classification: a broken mechanism rule still FAILs a check
(docs/spec.md, "The contract: four harms").

The four harms (``HARMS``):

* **H1** a token computed under weights ``w`` uses only KV computed under ``w``, of the same
  model lineage (target, draft, encoder, LoRA each its own) and namespace.
* **H2** what an endpoint or a client reports (an update's status, a flush result, a version
  label, a response's attribution, server info) is true of what it did.
* **H3** an endpoint that could not complete a mandatory flush, or whose weights tore,
  serves nothing from the old tree until one completes (fail-closed).
* **H4** a client never reports a sync done while an endpoint does not hold the version.

``ROLE`` classifies every SAFETY rule of ``rules.RULES`` as ``HARM`` (its violation is the
harm) or ``MECHANISM`` (its violation explains a harm); availability and check rules have no
role. ``tests/test_harm.py`` holds the classification complete.
"""

from __future__ import annotations

from enum import Enum

from attrs import frozen

from .rules import RULES, Klass, RuleId


@frozen
class Harm:
    """One harm property: ``id`` (``H1``..``H4``), a CamelCase ``name``, and its ``text``."""

    id: str
    name: str
    text: str


HARMS: tuple[Harm, ...] = (
    Harm(
        "H1",
        "NoStaleKvServed",
        "A token computed under weights w uses only KV computed under w, of the same model "
        "lineage (target, draft, encoder, LoRA) and namespace.",
    ),
    Harm(
        "H2",
        "ReportsAreTrue",
        "What an endpoint or a client reports (an update's status, a flush result, a version "
        "label, a response's attribution) is true of what it did.",
    ),
    Harm(
        "H3",
        "ClosedServesNothing",
        "An endpoint that could not complete a mandatory flush, or whose weights tore, serves "
        "nothing until a flush completes on whole weights (fail-closed).",
    ),
    Harm(
        "H4",
        "SyncDoneOnlyWhenDone",
        "A client never reports a sync done while an endpoint does not hold the version.",
    ),
)
HARM_BY_ID: dict[str, Harm] = {h.id: h for h in HARMS}


class Role(str, Enum):
    """A safety rule's role: ``HARM`` (breaking it is the harm) or ``MECHANISM`` (breaking
    it explains a harm; alone, a note)."""

    HARM = "harm"
    MECHANISM = "mechanism"

    def __str__(self) -> str:
        return self.value


R = RuleId
ROLE: dict[str, tuple[Role, str]] = {
    # H1: stale or mixed KV served
    R.INV_001: (Role.HARM, "H1"),
    R.INV_004: (Role.HARM, "H1"),
    R.WIN_002: (Role.HARM, "H1"),
    R.STO_001: (Role.HARM, "H1"),
    R.PD_001: (Role.HARM, "H1"),
    R.RNK_003: (Role.HARM, "H1"),
    R.DER_001: (Role.HARM, "H1"),
    R.ENG_008: (Role.HARM, "H1"),
    # H2: a false report
    R.INV_002: (Role.HARM, "H2"),
    R.INV_003: (Role.HARM, "H2"),
    R.FC_001: (Role.HARM, "H2"),
    R.FC_003: (Role.HARM, "H2"),
    R.FC_004: (Role.HARM, "H2"),
    R.RNK_001: (Role.HARM, "H2"),
    R.RNK_002: (Role.HARM, "H2"),
    R.PUB_001: (Role.HARM, "H2"),
    R.WIN_001: (Role.HARM, "H2"),
    R.WIN_003: (Role.HARM, "H2"),
    R.CLI_012: (Role.HARM, "H2"),
    # H3: a closed endpoint serving
    R.FC_002: (Role.HARM, "H3"),
    # H4: a sync reported done that is not
    R.CLI_014: (Role.HARM, "H4"),
    # mechanisms: how the reference keeps H1
    R.CLI_001: (Role.MECHANISM, "H1"),
    R.CLI_002: (Role.MECHANISM, "H1"),
    R.CLI_004: (Role.MECHANISM, "H1"),
    R.CLI_006: (Role.MECHANISM, "H1"),
    R.CLI_008: (Role.MECHANISM, "H1"),
    R.CLI_009: (Role.MECHANISM, "H1"),
    R.CLI_010: (Role.MECHANISM, "H1"),
    R.CLI_013: (Role.MECHANISM, "H1"),
    R.ENG_001: (Role.MECHANISM, "H1"),
    R.ENG_002: (Role.MECHANISM, "H1"),
    R.ENG_003: (Role.MECHANISM, "H1"),
    R.ENG_004: (Role.MECHANISM, "H1"),
    R.ENG_005: (Role.MECHANISM, "H1"),
    R.ENG_006: (Role.MECHANISM, "H1"),
    R.ENG_007: (Role.MECHANISM, "H1"),
    R.ENG_009: (Role.MECHANISM, "H1"),
    R.ENG_010: (Role.MECHANISM, "H1"),
    R.ENG_012: (Role.MECHANISM, "H1"),
    R.FC_005: (Role.MECHANISM, "H1"),
    R.MEM_002: (Role.MECHANISM, "H1"),
    R.RTR_001: (Role.MECHANISM, "H1"),
}
"""Every SAFETY rule's role and the harm it is or explains."""


def role(rule_id: str) -> Role | None:
    """``rule_id``'s role, ``None`` for an availability or check rule."""
    entry = ROLE.get(rule_id)
    return None if entry is None else entry[0]


def harm_of(rule_id: str) -> Harm | None:
    """The harm ``rule_id`` is or explains, ``None`` for an availability or check rule."""
    entry = ROLE.get(rule_id)
    return None if entry is None else HARM_BY_ID[entry[1]]


def is_harm(rule_id: str) -> bool:
    return role(rule_id) is Role.HARM


def is_mechanism(rule_id: str) -> bool:
    return role(rule_id) is Role.MECHANISM


def unclassified() -> list[str]:
    """SAFETY rules with no role, and roles of rules that are not SAFETY (both a registry
    bug; empty when the classification is complete)."""
    safety = {r.id for r in RULES if r.klass is Klass.SAFETY}
    return sorted((safety - set(ROLE)) | (set(ROLE) - safety))
