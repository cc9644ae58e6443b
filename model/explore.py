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

``workers=N`` expands each level of ``PARALLEL_MIN`` states or more on N processes (this
one and N-1 forked children reading the visited set copy-on-write) and merges their chunks
in frontier order: the result is the one-process search's (``_forked``; issue 12: the
default-bound search on both cores). ``kvfence explore`` passes the usable cores.

Standard library and attrs only. No clock or randomness; callers time it. The only I/O is
with its own forked workers (pipes), and the model it runs is pure, so they need no locks.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import closing
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

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


def usable_cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``, where the platform has
    it; else ``os.cpu_count()``): ``kvfence explore``'s default ``--workers``."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


PARALLEL_MIN = 2000
"""Frontier states below which a level is expanded in this process even with ``workers``
> 1: forking, sending the new states back and merging them cost more than such a level
(depth 2 of the CLI's defaults has 388 frontier states, depth 3 about 3,000)."""

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


def _child(conn: Connection, work: Callable[[], object]) -> None:
    """A forked worker: ``work()`` sent back pickled, or the traceback of why it failed."""
    try:
        out: tuple[str, object] = ("ok", work())
    except BaseException:  # the parent raises it, naming this worker
        out = ("error", traceback.format_exc())
    conn.send_bytes(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
    conn.close()


def _here(
    frontier: list[State],
    parent: Mapping[State, object],
    bounds: Bounds,
    faults: bool,
    keyed: Callable[[State], State],
) -> Iterator[tuple[list[_Record], int]]:
    """One level in this process: the whole frontier as one slice."""
    yield _expand(frontier, 0, len(frontier), parent, bounds, faults, keyed)


CHUNKS_PER_WORKER = 8
"""A forked level's frontier is cut into ``CHUNKS_PER_WORKER * workers`` contiguous chunks,
claimed one at a time: states differ in cost (a paused endpoint has few actions), so equal
halves would leave one core idle; small chunks keep both busy to the end."""


def _forked(
    frontier: list[State],
    parent: Mapping[State, object],
    bounds: Bounds,
    faults: bool,
    keyed: Callable[[State], State],
    workers: int,
) -> Iterator[tuple[list[_Record], int]]:
    """One level on ``workers`` processes: this one and ``workers - 1`` forked children
    claim contiguous chunks of ``frontier`` from a shared counter and expand them
    (``_expand``); each child sends its chunks back when none is left. The chunks' results
    are yielded in frontier order. Forked (not spawned): the visited set and frontier are
    shared copy-on-write, nothing is pickled in; only the new states come back. Closing
    the generator (or an exception in it, e.g. a caller's ``SIGALRM``) kills and reaps
    every child still running: none is left behind. ``RuntimeError`` if a child failed or
    died."""
    ctx = multiprocessing.get_context("fork")
    n = len(frontier)
    chunks = min(n, CHUNKS_PER_WORKER * workers)
    cuts = [n * c // chunks for c in range(chunks + 1)]
    claimed = ctx.Value("i", 0)  # the next chunk nobody has claimed

    def work() -> list[tuple[int, list[_Record], int]]:
        done = []
        while True:
            with claimed.get_lock():
                c = claimed.value
                claimed.value = c + 1
            if c >= chunks:
                return done
            records, count = _expand(frontier, cuts[c], cuts[c + 1], parent, bounds, faults, keyed)
            done.append((c, records, count))

    children: list[tuple[BaseProcess, Connection]] = []
    try:
        for _ in range(1, workers):
            reader, writer = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_child, args=(writer, work), daemon=True)
            children.append((child, reader))
            child.start()
            writer.close()
        results: list[tuple[list[_Record], int] | None] = [None] * chunks
        for c, records, count in work():
            results[c] = (records, count)
        for w, (child, reader) in enumerate(children, start=1):
            try:
                status, got = pickle.loads(reader.recv_bytes())
            except EOFError:
                child.join()
                raise RuntimeError(
                    f"explore worker {w} (pid {child.pid}) died without its results "
                    f"(exit code {child.exitcode})"
                ) from None
            if status != "ok":
                raise RuntimeError(f"explore worker {w} (pid {child.pid}) failed:\n{got}")
            for c, records, count in got:
                results[c] = (records, count)
        for c, result in enumerate(results):
            if result is None:  # cannot happen: every chunk is claimed once and sent back
                raise RuntimeError(f"explore: chunk {c} of {chunks} came back from no worker")
            yield result
    finally:
        for child, reader in children:
            reader.close()
            if child.is_alive():
                child.kill()
            child.join()


def explore(
    initial: State | Iterable[State],
    bounds: Bounds = Bounds(),
    depth: int = 6,
    faults: bool = True,
    max_states: int | None = None,
    symmetry: bool = False,
    stop: Callable[[int], bool] | None = None,
    workers: int = 1,
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

    ``workers``: processes expanding each level of ``PARALLEL_MIN`` states or more (level-
    parallel breadth-first search, ``_forked``; 1: this process alone). The slices are
    merged in frontier order, so the result is the serial search's whatever ``workers``:
    the same counts, and the same first violation and trace. Needs the ``fork`` start
    method (POSIX); elsewhere the search runs in this process. ``ValueError`` if
    ``workers`` < 1.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if "fork" not in multiprocessing.get_all_start_methods():
        workers = 1
    # The search makes next to no reference cycles, but millions of objects the cyclic
    # collector would traverse again and again (12% of a serial search's time; in a forked
    # child, its passes would also copy the shared heap page by page): off while it runs.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _search(initial, bounds, depth, faults, max_states, symmetry, stop, workers)
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
    workers: int,
) -> Exploration:
    """``explore``'s search, with its arguments checked."""
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
        frontier.append(key)

    truncated = False
    level = 0
    while frontier and level < depth:
        if stop is not None and stop(level):
            return Exploration(len(parent), transitions, depth_reached, False)
        if workers > 1 and len(frontier) >= PARALLEL_MIN:
            slices = _forked(frontier, parent, bounds, faults, keyed, workers)
        else:
            slices = _here(frontier, parent, bounds, faults, keyed)
        following: list[State] = []
        with closing(slices):  # a violation below ends the level: no child outlives it
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
        if following:
            depth_reached = level + 1
        frontier = following
        level += 1
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
    "usable_cores",
]
