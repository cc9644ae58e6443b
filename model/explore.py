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
--versions 2 --inflight 1 --depth 6``) visits 211,400 states; with every funnel stepped
(``symmetry=False``) over 5,579,668 transitions.

``symmetry=True`` (on in ``kvfence explore``) keys the visited set on a canonical renaming of
prefixes, request IDs and endpoints of equal config, and steps one funnel of each update
action the model cannot tell apart by funnel (``model.symmetry``); a counterexample found
among representatives is re-derived as a concrete path (``_concrete``).

Pure: standard library and attrs only. No I/O, clock or randomness; callers time it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from attrs import frozen

from .actions import Action
from .candidates import actions
from .checks import Violation, check_served, check_state
from .semantics import step
from .state import Bounds, Config, Policy, State, initial_state
from .symmetry import canonical, funnel_bounds, trivial
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
    symmetry: bool = False,
    stop: Callable[[int], bool] | None = None,
) -> Exploration:
    """Breadth-first search from ``initial`` (one state, or several explored together) up
    to ``depth`` top-level actions; stops at the first violation, or when ``max_states``
    distinct states have been seen (then ``complete`` is False).

    ``symmetry``: deduplicate states up to renaming of prefixes, request IDs and endpoints
    of equal config (``symmetry.canonical``), and step each update action through one
    funnel only (``symmetry.funnel_bounds``); ``states`` then counts orbits (the
    ``transitions`` only the representatives' edges), and the
    ``trace`` of a violation is re-derived as a concrete path from ``initial`` in the full
    space (``_concrete``). ``stop(level)``: called before the first state of each new
    level is expanded (``level`` levels are complete); True ends the search there
    (``complete`` False): how a caller bounds the search by time (the model reads no clock).
    """
    roots = (initial,) if isinstance(initial, State) else tuple(initial)
    if symmetry:
        bounds = funnel_bounds(bounds)  # every funnel has the representative's branches
    # Configs are fixed along a path: with no renaming but the identity at the roots (the
    # CLI's defaults), no state has another, and states are keyed as they are.
    if symmetry and not all(trivial(r, bounds) for r in roots):
        # Most transitions lead to a state seen before: its representative is looked up,
        # not recomputed (the renamings cost more than the step itself).
        reps: dict[State, State] = {}
        renamed: dict = {}

        def keyed(s: State) -> State:
            bare = _bare(s)
            rep = reps.get(bare)
            if rep is None:
                rep = reps[bare] = canonical(bare, bounds, renamed)
            return rep
    else:
        keyed = _bare
    parent: dict[State, tuple[State, Action] | None] = {}
    root_of: dict[State, State] = {}
    queue: deque[tuple[State, int]] = deque()
    transitions = 0
    depth_reached = 0

    def found(violations: list[Violation], at: State, last: Action | None) -> Exploration:
        path: list[Action] = [] if last is None else [last]
        node = at
        keys = [at]
        while (link := parent[node]) is not None:
            node, action = link
            path.append(action)
            keys.append(node)
        path.reverse()
        root = root_of[node]
        if symmetry:
            violations, path = _concrete(root, keys[::-1], path, last, bounds, faults, keyed)
        return Exploration(
            len(parent), transitions, depth_reached, False, tuple(violations), tuple(path), root
        )

    for root in roots:
        key = keyed(root)
        if key in parent:
            continue
        parent[key] = None
        root_of[key] = root
        bad = check_state(root)
        if bad:
            return found(bad, key, None)
        queue.append((key, 0))

    truncated = False
    level_done = -1
    while queue:
        state, level = queue.popleft()
        if level >= depth:
            continue
        if level > level_done:
            level_done = level
            if stop is not None and stop(level):
                return Exploration(len(parent), transitions, depth_reached, False)
        for action in actions(state, bounds, faults):
            for nxt, _ in step(state, action):
                transitions += 1
                key = keyed(nxt)
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


def _concrete(
    root: State,
    keys: list[State],
    path: list[Action],
    last: Action | None,
    bounds: Bounds,
    faults: bool,
    keyed: Callable[[State], State],
) -> tuple[list[Violation], list[Action]]:
    """A path found among representatives, as a real path from ``root``: at each step, the
    action (and branch) from the concrete state whose successor has the representative
    the search recorded; then the violating step itself. Returns the violations of the
    concrete path (naming its own prefixes and endpoints) and its actions. Raises
    ``AssertionError`` if no such path exists (the semantics would not be symmetric)."""
    state = root
    out: list[Action] = []
    steps = len(path) - (last is not None)
    for i in range(steps):
        want, final = keys[i + 1], i == steps - 1 and last is None
        state, action = next(
            (nxt, a)
            for a in actions(state, bounds, faults)
            for nxt, _ in step(state, a)
            if keyed(nxt) == want and (not final or check_state(nxt))
        )
        out.append(action)
        if final:
            return check_state(state), out
        state = _bare(state)
    if last is None:  # a violating initial state
        return check_state(root), out
    for a in actions(state, bounds, faults):
        for nxt, _ in step(state, a):
            bad = [v for served in nxt.ledger for v in check_served(served)]
            if bad:
                return bad, [*out, a]
    raise AssertionError("no concrete step repeats the violation found among representatives")


__all__ = [
    "EXACT",
    "STANDARD",
    "Exploration",
    "default_configs",
    "explore",
    "initial_states",
]
