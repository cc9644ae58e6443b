"""The words a run and a replay end with: ``Verdict`` and ``Replayed`` kinds.

Both are ``str`` enums, so ``result.verdict == "PASS"`` reads as it always did and the
JSON reports carry the plain word. Every other module uses the members, never the strings.
"""

from __future__ import annotations

from enum import Enum


class Verdict(str, Enum):
    """A rule's or a run's verdict, worst first (``ORDER``).

    FAIL: a rule broken. ERROR: the SUT or its adapter could not answer. UNKNOWN: a rule or
    scenario never exercised. WARN: a SHOULD rule broken (FAIL under ``--strict``). PASS:
    exercised with evidence that could have shown a violation. SKIP: the adapter cannot
    observe the rule's evidence (never decides a run). N/A: not at stake, the rule binds
    only engines of another declared profile (``PROFILE_CAPABILITIES``: an engine that
    resets the encoder cache on every update owes no separate reset; never decides a run).
    """

    FAIL = "FAIL"
    ERROR = "ERROR"
    UNKNOWN = "UNKNOWN"
    WARN = "WARN"
    PASS = "PASS"
    SKIP = "SKIP"
    NA = "N/A"

    def __str__(self) -> str:
        return self.value

    @property
    def exit_code(self) -> int:
        """0 pass (or WARN), 1 fail, 2 error or unknown: the CLI's exit codes."""
        return {Verdict.PASS: 0, Verdict.WARN: 0, Verdict.FAIL: 1}.get(self, 2)


ORDER: tuple[Verdict, ...] = tuple(Verdict)
"""Worst first: a run's verdict is the first of these any of its rules holds."""


SILENT: frozenset[Verdict] = frozenset({Verdict.SKIP, Verdict.NA})
"""Verdicts that never decide a run: nothing was judged."""


def worst(verdicts: list[Verdict]) -> Verdict:
    """The run's verdict over its rules' verdicts; SKIP and N/A never decide it, and a run
    with nothing but those is UNKNOWN."""
    present = [v for v in verdicts if v not in SILENT] or [Verdict.UNKNOWN]
    return min(present, key=ORDER.index)


class ReplayKind(str, Enum):
    """How one replay ended: FAIL (a rule broken), PASS (every step agreed with the spec),
    ERROR (the adapter or the trace could not be followed), INVALID (a step the model does
    not enable at its turn: the candidate is dropped while shrinking), UNKNOWN (the
    recorded observations cannot tell a broken rule from a kept one: a trace cut to its
    statuses, judged model-only)."""

    FAIL = "FAIL"
    PASS = "PASS"
    ERROR = "ERROR"
    INVALID = "INVALID"
    UNKNOWN = "UNKNOWN"

    def __str__(self) -> str:
        return self.value


REPLAY_WORDS: dict[ReplayKind, str] = {
    ReplayKind.FAIL: "FAILED",
    ReplayKind.PASS: "FIXED",
    ReplayKind.ERROR: "ERROR",
    ReplayKind.INVALID: "ERROR",
    ReplayKind.UNKNOWN: "UNKNOWN",
}
"""What ``kvfence replay`` prints for each kind."""
