"""Exhaustive breadth-first search over the model's states, within bounds.

``explore(initial, bounds, depth)`` enumerates every state reachable from ``initial`` in at
most ``depth`` top-level actions (``semantics.actions``: conforming calls only; with
``faults`` the injected faults too), following every branch ``semantics.step`` allows. States
are deduplicated on ``State.without_ledger()``: the ledger only grows and no guard reads
it. Visited states are stored without their ledger, so the ledger a successor arrives
with is exactly what that step served. Every transition is judged: ``check_state`` on
each new state before its ledger is stripped, and ``check_served`` on what a transition
back to a state already seen served (a stale hit can loop back to the very state it
started from, so judging new states alone would miss it). Breadth-first order makes the
first violation found one at the fewest steps, and its ``trace`` a shortest path to it.

Defaults (``initial_states``): endpoint 0 on the exact lane, every other on the standard
lane, radix cache on and reported everywhere, client policy ``Policy()`` (mode auto,
pause retract). ``kvfence explore`` with its defaults (2 endpoints, ``--prefixes 1
--versions 2 --inflight 1 --depth 6``) visits 34,640 states over 1,060,845 transitions.

Pure: standard library and attrs only. No I/O, clock or randomness; callers time it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from attrs import frozen

from .actions import Action
from .candidates import actions
from .checks import Violation, check_served, check_state
from .semantics import step
from .state import Bounds, Config, Policy, State, initial_state
from .vocabulary import Lane


@frozen
class Exploration:
    """What a search saw.

    ``states``: distinct states visited (without their ledgers), initial states included.
    ``transitions``: ``(state, action, branch)`` edges followed. ``depth_reached``: the
    most steps from an initial state of any state visited. ``complete``: every state
    within ``depth`` was expanded (the frontier ran dry or the depth bound was hit), so no
    ``max_states`` truncation and no stop at a violation. ``violation``: the rules the
    first violating transition broke (empty if none). ``trace``: a shortest action path
    from ``initial`` to it. ``initial``: the initial state the trace starts from.
    """

    states: int
    transitions: int
    depth_reached: int
    complete: bool
    violation: tuple[Violation, ...] = ()
    trace: tuple[Action, ...] = ()
    initial: State | None = None

    @property
    def ok(self) -> bool:
        return not self.violation


EXACT = Config(lane=Lane.EXACT)
"""An exact-lane endpoint with the radix cache on and reported on: ENG-001 guards it."""

STANDARD = Config()
"""A standard-lane endpoint with the radix cache on and reported on."""


def default_configs(endpoints: int) -> tuple[Config, ...]:
    """The CLI's default endpoints: the first on the exact lane (``EXACT``), every other
    on the standard lane (``STANDARD``). Radix on and honestly reported everywhere; no
    draft, encoder, FP8 KV, LoRA or lower tiers (each multiplies the state space)."""
    if endpoints < 1:
        raise ValueError(f"need at least one endpoint, got {endpoints}")
    return (EXACT,) + (STANDARD,) * (endpoints - 1)


def initial_states(
    endpoints: int = 2,
    policies: Iterable[Policy] = (Policy(),),
    configs: tuple[Config, ...] | None = None,
) -> tuple[State, ...]:
    """The initial states the CLI explores: ``configs`` (default ``default_configs``) under
    each client policy in ``policies`` (default: one, ``Policy()``: mode ``auto``, no
    explicit flush, pause ``retract``). Every endpoint serves version 0, caches empty."""
    if configs is None:
        configs = default_configs(endpoints)
    elif len(configs) != endpoints:
        raise ValueError(f"{len(configs)} configs for {endpoints} endpoints")
    return tuple(initial_state(configs, p) for p in policies)


def _bare(state: State) -> State:
    """``state.without_ledger()``, without ``evolve``'s cost where there is no ledger."""
    return state.without_ledger() if state.ledger else state


def explore(
    initial: State | Iterable[State],
    bounds: Bounds = Bounds(),
    depth: int = 6,
    faults: bool = True,
    max_states: int | None = None,
) -> Exploration:
    """Breadth-first search from ``initial`` (one state, or several explored together) up
    to ``depth`` top-level actions; stops at the first violation, or when ``max_states``
    distinct states have been seen (then ``complete`` is False)."""
    roots = (initial,) if isinstance(initial, State) else tuple(initial)
    parent: dict[State, tuple[State, Action] | None] = {}
    root_of: dict[State, State] = {}
    queue: deque[tuple[State, int]] = deque()
    transitions = 0
    depth_reached = 0

    def found(violations: list[Violation], at: State, last: Action | None) -> Exploration:
        path: list[Action] = [] if last is None else [last]
        node = at
        while (link := parent[node]) is not None:
            node, action = link
            path.append(action)
        return Exploration(
            len(parent),
            transitions,
            depth_reached,
            False,
            tuple(violations),
            tuple(reversed(path)),
            root_of[node],
        )

    for root in roots:
        key = _bare(root)
        if key in parent:
            continue
        parent[key] = None
        root_of[key] = root
        bad = check_state(root)
        if bad:
            return found(bad, key, None)
        queue.append((key, 0))

    truncated = False
    while queue:
        state, level = queue.popleft()
        if level >= depth:
            continue
        for action in actions(state, bounds, faults):
            for nxt, _ in step(state, action):
                transitions += 1
                key = _bare(nxt)
                new = key not in parent
                # Stored states carry no ledger, so ``nxt.ledger`` is what this step served.
                if new:
                    bad = check_state(nxt)
                else:
                    bad = [v for served in nxt.ledger for v in check_served(served)]
                if bad:
                    if new:
                        parent[key] = (state, action)
                        depth_reached = max(depth_reached, level + 1)
                        return found(bad, key, None)
                    return found(bad, state, action)
                if not new:
                    continue
                if max_states is not None and len(parent) >= max_states:
                    truncated = True
                    continue
                parent[key] = (state, action)
                depth_reached = max(depth_reached, level + 1)
                queue.append((key, level + 1))
    return Exploration(len(parent), transitions, depth_reached, not truncated)


__all__ = [
    "EXACT",
    "STANDARD",
    "Exploration",
    "default_configs",
    "explore",
    "initial_states",
]
