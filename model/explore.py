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
pause retract). ``kvfence explore``'s defaults are 2 endpoints, ``--prefixes 1 --versions
2 --inflight 1 --depth 6``; the counts of searches within them are pinned in
``tests/test_explore.py`` and ``tests/test_speed.py``, and ``scripts/bench.py`` measures
the default-bound one.

``symmetry=True`` (on in ``kvfence explore``) keys the visited set on a canonical renaming of
prefixes, request IDs and endpoints of equal config, and steps one funnel of each update
action the model cannot tell apart by funnel (``model.symmetry``); a counterexample found
among representatives is re-derived as a concrete path (``_concrete``).

How a level's frontier is expanded is the caller's (``levels``, a ``Levels`` runner): in
this process by default (``serial``); ``kvfence.conformance.search`` expands large levels
on forked workers and bounds a search by time, and the merge here, in frontier order,
makes the result the one-process search's.

The model's sometimes-properties (``model.properties``, the REACH rules) are looked for by
a second breadth-first search over (state, monitor memory) (``_witnesses``): each one
reached has a shortest ``Witness`` path.

Standard library and attrs only. No clock, randomness, process or I/O: callers time it,
cap it and run it where they like.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import closing
from functools import partial

from attrs import frozen

from .actions import Action
from .candidates import actions
from .checks import Violation, check_served, check_state
from .properties import SOMETIMES, Sometimes
from .rules import RuleId
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
    ``sometimes``: the sometimes-properties the search looked for (their rules, in the
    order given); ``witnesses``: one ``Witness`` for each it reached, in the order found.
    ``cut``: why a search that found no violation is not ``complete``: ``"max-states"``
    (``max_states`` reached), ``"stop"`` (``stop`` said so), or the reason a ``Cut``
    raised by the level runner gave (``"max-seconds"``: ``conformance.search``'s time cap);
    empty otherwise. A cut search checked nothing beyond ``depth_reached``, and only part
    of that last level.
    """

    states: int
    transitions: int
    depth_reached: int
    complete: bool
    violation: tuple[Violation, ...] = ()
    trace: tuple[Action, ...] = ()
    initial: State | None = None
    sometimes: tuple[RuleId, ...] = ()
    witnesses: tuple[Witness, ...] = ()
    cut: str = ""

    @property
    def ok(self) -> bool:
        return not self.violation

    @property
    def witnessed(self) -> tuple[RuleId, ...]:
        """The sometimes-properties reached, in the order of ``sometimes``."""
        got = {w.rule for w in self.witnesses}
        return tuple(r for r in self.sometimes if r in got)

    @property
    def unwitnessed(self) -> tuple[RuleId, ...]:
        """The sometimes-properties the search looked for and never reached."""
        got = {w.rule for w in self.witnesses}
        return tuple(r for r in self.sometimes if r not in got)


class Cut(Exception):
    """Raised by a ``Levels`` runner (or ``stop``) to end the search where it stands:
    ``reason`` names the cap (``"max-seconds"``). The search returns what it has, not
    complete, with ``Exploration.cut`` the reason. A runner raises it between slices only,
    so every slice it yielded is merged and the counts are those of a real prefix of the
    search."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@frozen
class Witness:
    """A path that reaches a sometimes-property (``model.properties.Sometimes``): the
    ``trace`` of actions from ``initial``, its last action the one that reaches ``rule``.
    Breadth-first order makes it a shortest such path among those the search keeps (one
    path per distinct state: the first found)."""

    rule: RuleId
    trace: tuple[Action, ...]
    initial: State


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


# One successor of a slice, in the order the serial search meets it: ``(key, i, action,
# t, bad, served)``. ``key`` is the successor's key, new to the visited set as it was when
# the level began and to the slice so far, or None for a successor already seen whose
# response broke a rule (``served``, a definite violation: the slice ends there). ``i``:
# index in the frontier of the state expanded; ``t``: the slice's transitions up to and
# including this one. ``bad``: ``check_state`` of a new successor (empty unless it breaks
# a rule), ``served``: the part of it its responses broke (``check_served``). Whether a
# successor new to its slice is new to the search only the merge knows (an earlier slice
# may have found it): new, it is judged by ``bad``; seen, by ``served``, as the serial
# search would. A new successor with a broken response ends the slice either way.
_Record = tuple[State | None, int, Action, int, list[Violation], list[Violation]]


def _expand(
    frontier: list[State],
    lo: int,
    hi: int,
    parent: Mapping[State, object],
    bounds: Bounds,
    faults: bool,
    keyed: Callable[[State], State],
) -> tuple[list[_Record], int]:
    """Expand ``frontier[lo:hi]`` against ``parent`` (read only): the slice's records
    (``_Record``) in serial order, and its transitions (up to the violation that ended it,
    if one did)."""
    records: list[_Record] = []
    seen: set[State] = set()
    t = 0
    for i in range(lo, hi):
        state = frontier[i]
        for action in actions(state, bounds, faults):
            for nxt, _ in step(state, action):
                t += 1
                key = keyed(nxt)
                if key in parent or key in seen:
                    # Stored states carry no ledger: ``nxt.ledger`` is what this step served.
                    if nxt.ledger:
                        served = [v for s in nxt.ledger for v in check_served(s)]
                        if served:
                            records.append((None, i, action, t, served, served))
                            return records, t
                    continue
                seen.add(key)
                bad = check_state(nxt)
                served = [v for s in nxt.ledger for v in check_served(s)] if bad else []
                records.append((key, i, action, t, bad, served))
                if served:
                    return records, t
    return records, t


Slice = tuple[list[_Record], int]
"""What expanding one contiguous slice of a level's frontier gives: its records
(``_Record``) in serial order, and its transitions."""

Expand = Callable[[int, int], Slice]
"""``expand(lo, hi)``: expand ``frontier[lo:hi]`` of the level at hand (pure: it reads the
visited set as it was when the level began and writes nothing)."""

Levels = Callable[[int, Expand], Iterator[Slice]]
"""How a level is expanded: ``levels(n, expand)`` covers a frontier of ``n`` states with
slices and yields their results in frontier order (the first slice starts at 0, each next
where the last ended, the last ends at ``n``). The search closes the iterator when a
violation ends the level early. ``serial`` does it in this process; a runner that expands
slices elsewhere (``kvfence.conformance.search``: forked workers) gives the same result."""


def _slice(
    frontier: list[State],
    parent: Mapping[State, object],
    bounds: Bounds,
    faults: bool,
    keyed: Callable[[State], State],
    lo: int,
    hi: int,
) -> Slice:
    """``_expand`` with the level's arguments first: a level's ``Expand`` is a partial."""
    return _expand(frontier, lo, hi, parent, bounds, faults, keyed)


def serial(n: int, expand: Expand) -> Iterator[Slice]:
    """The whole frontier as one slice, expanded here: the default ``Levels``."""
    yield expand(0, n)


WITNESS_STATES = 100_000
"""The most (state, monitor memory) pairs the witness search (``_witnesses``) visits: it
stops there, and a sometimes-property it has not reached by then is reported unwitnessed."""


def explore(
    initial: State | Iterable[State],
    bounds: Bounds = Bounds(),
    depth: int = 6,
    faults: bool = True,
    max_states: int | None = None,
    symmetry: bool = False,
    stop: Callable[[int], bool] | None = None,
    levels: Levels = serial,
    sometimes: Iterable[Sometimes] = SOMETIMES,
    witness_states: int = WITNESS_STATES,
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

    ``levels``: how each level's frontier is expanded (``Levels``; default ``serial``, in
    this process). The slices are merged in frontier order, so the result is the serial
    search's whatever runner expands them: the same counts, and the same first violation
    and trace (``kvfence.conformance.search.explore`` runs levels on forked workers).

    ``sometimes``: the sometimes-properties to look for (default: the model's,
    ``model.properties.SOMETIMES``, the REACH rules); ``witness_states``: the most pairs
    the witness search visits. When the search ends (however it ends), a second, serial
    breadth-first search over (state, monitor memory) up to ``depth`` finds a shortest
    ``Witness`` for each it can reach (``_witnesses``); it reads no state of the first, so
    the counts above do not depend on it.
    """
    # The search makes next to no reference cycles, but millions of objects the cyclic
    # collector would traverse again and again (12% of a serial search's time; in a forked
    # child, its passes would also copy the shared heap page by page): off while it runs.
    collecting = gc.isenabled()
    gc.disable()
    try:
        props = tuple(sometimes)
        return _search(
            initial,
            bounds,
            depth,
            faults,
            max_states,
            symmetry,
            stop,
            levels,
            props,
            witness_states,
        )
    finally:
        if collecting:
            gc.enable()


def _search(
    initial: State | Iterable[State],
    bounds: Bounds,
    depth: int,
    faults: bool,
    max_states: int | None,
    symmetry: bool,
    stop: Callable[[int], bool] | None,
    levels: Levels,
    props: tuple[Sometimes, ...],
    witness_states: int,
) -> Exploration:
    """``explore``'s search."""
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
    frontier: list[State] = []
    transitions = 0
    depth_reached = 0

    def path_to(at: State) -> tuple[State, list[State], list[Action]]:
        """The root, keys and actions of the recorded path to ``at``."""
        path: list[Action] = []
        node = at
        keys = [at]
        while (link := parent[node]) is not None:
            node, action = link
            path.append(action)
            keys.append(node)
        path.reverse()
        return root_of[node], keys[::-1], path

    def ended(complete: bool, violations=(), path=(), root=None, cut="") -> Exploration:
        rules, witnesses = _witnesses(roots, bounds, depth, faults, props, witness_states)
        return Exploration(
            len(parent),
            transitions,
            depth_reached,
            complete,
            tuple(violations),
            tuple(path),
            root,
            rules,
            witnesses,
            cut,
        )

    def found(violations: list[Violation], at: State, last: Action | None) -> Exploration:
        root, keys, path = path_to(at)
        if last is not None:
            path.append(last)
        if symmetry:
            violations, path = _concrete(root, keys, path, last, bounds, faults, keyed)
        return ended(False, violations, path, root)

    for root in roots:
        key = keyed(root)
        if key in parent:
            continue
        parent[key] = None
        root_of[key] = root
        bad = check_state(root)
        if bad:
            return found(bad, key, None)
        frontier.append(key)

    truncated = False
    level = 0
    while frontier and level < depth:
        following: list[State] = []
        try:
            if stop is not None and stop(level):
                return ended(False, cut="stop")
            expand = partial(_slice, frontier, parent, bounds, faults, keyed)
            slices = levels(len(frontier), expand)
            with closing(slices):  # a violation below ends the level: the runner stops with it
                for records, count in slices:
                    for key, i, action, t, bad, served in records:
                        if key is None or key in parent:  # seen: judged by what it served
                            if served:
                                transitions += t
                                return found(served, frontier[i], action)
                            continue
                        if bad:
                            transitions += t
                            parent[key] = (frontier[i], action)
                            depth_reached = level + 1
                            return found(bad, key, None)
                        if max_states is not None and len(parent) >= max_states:
                            truncated = True
                            continue
                        parent[key] = (frontier[i], action)
                        following.append(key)
                    transitions += count
        except Cut as cut:
            if following:
                depth_reached = level + 1
            return ended(False, cut=cut.reason)
        if following:
            depth_reached = level + 1
        frontier = following
        level += 1
    return ended(not truncated, cut="max-states" if truncated else "")


def _witnesses(
    roots: tuple[State, ...],
    bounds: Bounds,
    depth: int,
    faults: bool,
    props: tuple[Sometimes, ...],
    cap: int,
) -> tuple[tuple[RuleId, ...], tuple[Witness, ...]]:
    """The witness search: breadth-first over pairs (state without ledger, memory of the
    monitors still looking), from ``roots``, up to ``depth`` actions and ``cap`` pairs,
    until every property in ``props`` is reached. The memory is part of what is
    deduplicated, so no path's history is lost to another's (a state reached with and
    without a prefix served before an update is two pairs), and the first transition
    that reaches a property ends a shortest path to it. Concrete states, never renamed:
    each witness is a path of the model as it is. Returns the rules looked for and the
    witnesses found, in the order found."""
    rules = tuple(p.rule for p in props)
    if not props:
        return rules, ()
    found: list[Witness] = []
    looking = list(range(len(props)))
    start = tuple(p.start for p in props)
    parent: dict[tuple[State, tuple], tuple[tuple[State, tuple], Action] | None] = {}
    root_of: dict[tuple[State, tuple], State] = {}
    frontier = []
    for root in roots:
        node = (_bare(root), start)
        if node not in parent:
            parent[node], root_of[node] = None, root
            frontier.append(node)

    def trace(node: tuple[State, tuple], last: Action) -> tuple[State, tuple[Action, ...]]:
        path = [last]
        while (link := parent[node]) is not None:
            node, action = link
            path.append(action)
        return root_of[node], tuple(reversed(path))

    level = 0
    while frontier and looking and level < depth:
        following = []
        for node in frontier:
            state, memories = node
            for action in actions(state, bounds, faults):
                after = list(memories)
                for j in list(looking):
                    after[j], hit = props[j].observe(memories[j], state, action)
                    if hit:
                        looking.remove(j)
                        root, path = trace(node, action)
                        found.append(Witness(props[j].rule, path, root))
                if not looking:
                    return rules, tuple(found)
                # a property reached needs no memory: its slot no longer tells pairs apart
                kept = tuple(m if j in looking else None for j, m in enumerate(after))
                for nxt, _ in step(state, action):
                    child = (_bare(nxt), kept)
                    if child in parent:
                        continue
                    if len(parent) >= cap:
                        return rules, tuple(found)
                    parent[child] = (node, action)
                    following.append(child)
        frontier = following
        level += 1
    return rules, tuple(found)


def witnesses(
    roots: tuple[State, ...],
    bounds: Bounds = Bounds(),
    depth: int = 6,
    faults: bool = True,
    props: tuple[Sometimes, ...] = SOMETIMES,
    cap: int = WITNESS_STATES,
) -> tuple[Witness, ...]:
    """A shortest path from ``roots`` to each of ``props`` (the REACH rules by default)
    within ``depth`` actions and ``cap`` (state, memory) pairs: the witness search of
    ``explore`` on its own, without the exhaustive search before it (the battery's
    witnesses, ``conformance.battery``). A property not reached in those bounds has none."""
    return _witnesses(roots, bounds, depth, faults, props, cap)[1]


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
    "Cut",
    "Exploration",
    "Witness",
    "default_configs",
    "explore",
    "initial_states",
    "serial",
    "witnesses",
]
