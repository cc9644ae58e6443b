"""The model's properties by name: what must hold always, and what must happen sometimes.

As in stateright (``Property::always`` / ``Property::sometimes``), the model lists its
properties, each named by the rule it checks. An ``Always`` property holds on every state
and every response a search meets (its violation is a counterexample); a ``Sometimes``
property is a scenario some path must reach (its witness is a path to it), so that a
search, or a conformance run, that never reached it is known to be vacuous for the rules
it puts at risk.

A ``Sometimes`` property is a monitor over transitions: ``observe(memory, state, action)``
reads the state an action is applied to (before it) and what the monitor remembers of the
path so far, and returns the new memory and whether the scenario is reached by this
action. The memory of a path starts at ``start``; REACH-002 and REACH-003 need none
(``start`` is ``None``), REACH-001 remembers the weight version each (endpoint, prefix)
was last asked for under. The model explorer (``model.explore``) and the lockstep checker
(``conformance.lockstep``) call the same monitors.

Pure: standard library and attrs only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import frozen

from .actions import Action, ServeRequest, StartRequest, UpdateWeights
from .checks import Violation, check_served, check_state
from .rules import BY_ID, RuleId
from .semantics import memo_step
from .state import State

Memory = Any
"""What a ``Sometimes`` monitor remembers of a path: immutable and hashable (a search keys
on it), ``None`` when nothing."""


@frozen
class Always:
    """A property every state (``check_state``) or every response (``check_served``) must
    keep; its rules are the violations the check returns."""

    name: str
    text: str
    check: Callable[..., list[Violation]]


@frozen
class Sometimes:
    """A scenario some path must reach: rule ``rule`` (a REACH rule of the registry).
    ``observe(memory, state, action) -> (memory, reached)``; ``start``: the memory of an
    empty path."""

    rule: RuleId
    observe: Callable[[Memory, State, Action], tuple[Memory, bool]]
    start: Memory = None

    @property
    def name(self) -> str:
        """The rule's name in the registry (``ReuseAfterUpdateReached``, ...)."""
        return BY_ID[self.rule].name


LastAsked = tuple[tuple[tuple[int, str], int], ...]
"""REACH-001's memory: ``((endpoint, prefix), weights)`` pairs, sorted, one per key."""


def _reuse_after_update(
    memory: LastAsked | None, state: State, action: Action
) -> tuple[LastAsked | None, bool]:
    """REACH-001: a request (``ServeRequest``, ``StartRequest``) for a prefix the same
    endpoint was last asked for under an older weight version: KV of that prefix was cached
    before a completed update, so stale reuse was at risk. Memory (``LastAsked``, hashable):
    (endpoint, prefix) -> the endpoint's weights when that prefix was last asked for."""
    if not isinstance(action, (ServeRequest, StartRequest)):
        return memory, False
    weights = state.endpoint(action.endpoint).weights
    key = (action.endpoint, action.prefix)
    seen = dict(memory or ())
    reached = seen.get(key, weights) < weights
    if seen.get(key) == weights:
        return memory, reached
    seen[key] = weights
    return tuple(sorted(seen.items())), reached


def _guard_case(memory: None, state: State, action: Action) -> tuple[None, bool]:
    """REACH-002: an update of an exact-lane, radix-on endpoint (``Config.guarded``) whose
    caller did not ask for the flush: the engine guard (ENG-001) alone stands between the
    old KV and the new weights."""
    reached = (
        isinstance(action, UpdateWeights)
        and state.endpoint(action.endpoint).config.guarded
        and action.flush_cache is not True
    )
    return memory, reached


def _refused_flush(memory: None, state: State, action: Action) -> tuple[None, bool]:
    """REACH-003: an update whose flush could not complete: the spec allows more than one
    (fail-closed) branch for it: some outcome of ``semantics.step`` carries the completion
    a claim of success would have had to show (``Outcome.completion``). Every update may
    also report failure; that alone is not a refused flush."""
    if not isinstance(action, UpdateWeights):
        return memory, False
    return memory, any(o.completion is not None for _, o in memo_step(state, action))


def _served(state: State) -> list[Violation]:
    """``check_served`` on every response in the state's ledger."""
    out: list[Violation] = []
    for s in state.ledger:
        out += check_served(s)
    return out


ALWAYS: tuple[Always, ...] = (
    Always("state invariants", "every state keeps the INV, ENG and FC invariants", check_state),
    Always("served responses", "every response served keeps the reuse rules", _served),
)
"""The model's always-properties: a search judges every state and response by them."""

SOMETIMES: tuple[Sometimes, ...] = (
    Sometimes(RuleId.REACH_001, _reuse_after_update),
    Sometimes(RuleId.REACH_002, _guard_case),
    Sometimes(RuleId.REACH_003, _refused_flush),
)
"""The model's sometimes-properties, the REACH rules: a pass that reached none of them puts
nothing at risk."""

BY_RULE: dict[RuleId, Sometimes] = {p.rule: p for p in SOMETIMES}
"""``SOMETIMES`` by rule."""


def reached(
    properties: tuple[Sometimes, ...], memories: list[Memory], state: State, action: Action
) -> list[RuleId]:
    """Observe one transition with every monitor in ``properties`` (``memories`` updated in
    place, one per property, in order); the rules of those it reaches."""
    out = []
    for i, p in enumerate(properties):
        memories[i], hit = p.observe(memories[i], state, action)
        if hit:
            out.append(p.rule)
    return out


__all__ = [
    "ALWAYS",
    "BY_RULE",
    "SOMETIMES",
    "Always",
    "Memory",
    "Sometimes",
    "reached",
]
