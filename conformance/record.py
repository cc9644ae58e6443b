"""What a check records: ``Recorder`` (across every lockstep run of a check) and ``Run``
(one lockstep run as data: setup, actions, steps, violations)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from attrs import frozen

from ..model.actions import Action
from ..model.checks import ColdBytes, Violation
from ..model.state import Config, Policy
from .calls import Timing
from .errors import AdapterError
from .trace import Step, step_json


@frozen
class Covered:
    """The bounds a check's examples covered, each the most any one example (a battery
    scenario or a drawn example) reached: ``endpoints`` started, distinct ``prompts``
    asked, requests ``in_flight`` at once, weight ``updates`` (syncs, direct and two-phase
    updates) and ``serves`` (requests served or started). A bug that needs more than
    these was out of the check's reach."""

    endpoints: int = 0
    prompts: int = 0
    in_flight: int = 0
    updates: int = 0
    serves: int = 0

    def words(self) -> str:
        """``"bounds covered: 2 endpoints, 3 prompts, 3 in flight, 10 updates and 20
        serves per example"``."""

        def n(count: int, word: str) -> str:
            return f"{count} {word}" if count == 1 else f"{count} {word}s"

        return (
            f"bounds covered: {n(self.endpoints, 'endpoint')}, {n(self.prompts, 'prompt')}, "
            f"{n(self.in_flight, 'request')} in flight, {n(self.updates, 'update')} and "
            f"{n(self.serves, 'serve')} per example"
        )

    def to_json(self) -> dict[str, int]:
        return {
            "endpoints": self.endpoints,
            "prompts": self.prompts,
            "in_flight": self.in_flight,
            "updates": self.updates,
            "serves": self.serves,
        }

    def widest(self, **seen: int) -> Covered:
        """These bounds, each raised to what ``seen`` gives for it."""
        return Covered(**{k: max(v, seen.get(k, 0)) for k, v in self.to_json().items()})


class Recorder:
    """What a run learns across every lockstep run it hosts.

    ``exercised``: rule ID -> comparisons that gave it evidence. ``reached``: REACH rules
    seen. ``failure``: ``(configs, policy, actions, lines, violations)`` of the first
    failing run; ``soft``: the same for the shortest run whose client broke a rule without
    (yet) a visible consequence. ``error``: ``(Run, AdapterError)`` of the first run an
    adapter error ended, kept so that nothing recorded before the error is lost (and so
    that no later example calls a hung adapter again). ``other``: rule ID -> the first
    violation of it in an example a focused run set aside; ``set_aside``: the first such
    run, so that a focused run that FAILs only on it still writes a counterexample.
    ``refused``: rule ID -> the violation of a configuration the client raised on.
    ``skipped``: rule ID -> why the client under test cannot be judged by it (a program,
    for plan rules): SKIP. ``timing``: the seconds spent inside the engine and the client
    (``Timing``); pass one to share it across recorders (shrinking's replays).
    ``shown``: rule ID -> ``examples`` when a violation of it was first recorded (the
    example that showed it, counted from 1: a battery scenario or a drawn example), as
    ``scripts/budget.py`` reports examples-to-kill.
    """

    def __init__(self, timing: Timing | None = None) -> None:
        self.timing = Timing() if timing is None else timing
        self.exercised: Counter[str] = Counter()
        self.reached: set[str] = set()
        self.examples = 0
        self.shown: dict[str, int] = {}
        self.steps = 0
        self.failure: Run | None = None
        self.cold = ColdBytes()
        self.notes: set[str] = set()
        self.soft: Run | None = None
        self.error: tuple[Run, AdapterError] | None = None
        self.other: dict[str, Violation] = {}
        self.set_aside: Run | None = None
        self.refused: dict[str, Violation] = {}
        # SHOULD rules a non-strict run notes and searches past (WARN, not a stop that would
        # leave every later rule UNKNOWN); ``warned``: the first violation of each, and
        # ``warned_run`` the first example that broke only such rules.
        self.tolerate: frozenset[str] = frozenset()
        self.warned: dict[str, Violation] = {}
        self.warned_run: Run | None = None
        #: rule -> why it binds only the other kind of client here (N/A, not at stake)
        self.not_at_stake: dict[str, str] = {}
        #: the bounds the examples covered (``Covered``), raised by each lockstep run
        self.covered = Covered()


class Run:
    """One lockstep run as data: setup, the top-level actions, the recorded ``Step``
    values, violations (``pending``: the client's, recorded on the way)."""

    def __init__(self, configs, policy, actions, steps, violations, pending=()) -> None:
        self.configs: tuple[Config, ...] = configs
        self.policy: Policy = policy
        self.actions: list[Action] = actions
        self.steps: list[Step] = steps
        self.violations: list[Violation] = violations
        self.pending: list[Violation] = list(pending)

    @property
    def lines(self) -> list[dict[str, Any]]:
        """The steps as trace lines (JSON data), serialised on demand."""
        return [step_json(s) for s in self.steps]

    @property
    def hard(self) -> list[Violation]:
        """The violations that stopped the run (not the client's, recorded on the way)."""
        return [v for v in self.violations if v not in self.pending]
