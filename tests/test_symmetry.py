"""Symmetry reduction (``model/symmetry.py``) merges only renamings: the semantics are
equivariant under renaming and ignore the funnel, ``canonical`` is one state per orbit, the
reduced counts are pinned, and a reduced counterexample is a concrete path of the full
space. The searches look for no sometimes-property (``sometimes=()``): the witness search
reads no state of the search it follows, and tests/test_sometimes.py holds the witnesses."""

from __future__ import annotations

import typing
from collections import deque

import attrs
import pytest

from kvfence.model.candidates import actions
from kvfence.model.checks import check_served, check_state
from kvfence.model.explore import EXACT, STANDARD, explore, initial_states
from kvfence.model.fast import evolve
from kvfence.model.semantics import step
from kvfence.model.state import (
    Bounds,
    Entry,
    Served,
    State,
    initial_state,
)
from kvfence.model.symmetry import (
    OPAQUE,
    REPRESENTATIVE_FUNNEL,
    canonical,
    images,
)

TWO = Bounds(prefixes=("P", "Q"), rids=("r1", "r2"))
"""Two prefixes and two request IDs: four renamings."""


# ----- symmetry ----------------------------------------------------------------------------


def _attrs_classes(root: type) -> set[type]:
    """Every attrs class reachable from ``root`` through its fields' type hints."""
    seen: set[type] = set()
    todo = [root]
    while todo:
        cls = todo.pop()
        if cls in seen or not attrs.has(cls):
            continue
        seen.add(cls)
        hints = typing.get_type_hints(cls)
        for f in attrs.fields(cls):
            stack = [hints.get(f.name)]
            while stack:
                t = stack.pop()
                if isinstance(t, type) and attrs.has(t):
                    todo.append(t)
                stack += list(typing.get_args(t))
    return seen


def test_every_field_that_names_an_endpoint_is_renamed_or_stripped():
    """Endpoints are renamed by their position in ``State.endpoints`` only. A new field
    that names an endpoint (an index, a reference) must be renamed by ``model.symmetry``
    too, or live in the ledger (which the explorer strips before canonicalising)."""
    covered = {(State, "endpoints"), (Served, "endpoint")}  # Served: in the ledger only
    naming = {
        (cls, f.name)
        for cls in _attrs_classes(State)
        if cls not in OPAQUE
        for f in attrs.fields(cls)
        if "endpoint" in f.name.lower()
    }
    assert naming <= covered, (
        f"fields {sorted((c.__name__, n) for c, n in naming - covered)} name an endpoint: "
        "teach model.symmetry to rename them"
    )


def _reachable(initial: State, bounds: Bounds, depth: int) -> list[State]:
    seen = {initial: 0}
    todo = deque([initial])
    while todo:
        s = todo.popleft()
        if seen[s] >= depth:
            continue
        for a in actions(s, bounds):
            for nxt, _ in step(s, a):
                bare = nxt.without_ledger()
                if bare not in seen:
                    seen[bare] = seen[s] + 1
                    todo.append(bare)
    return list(seen)


def _successors(s: State, bounds: Bounds, memo: dict) -> set[State]:
    """The orbits of ``s``'s successors (``memo``: ``canonical``'s, kept across calls)."""
    return {
        canonical(n.without_ledger(), bounds, memo)
        for a in actions(s, bounds)
        for n, _ in step(s, a)
    }


def test_the_semantics_are_equivariant_under_renaming():
    """Every renaming of a reachable state has the same successors up to renaming, and
    breaks the same rules: what makes merging an orbit sound. Every 14th state of the
    1,065 within two steps, in the order they were reached (77 states, of every depth),
    each with its four renamings."""
    initial = initial_state((STANDARD, STANDARD))
    states = _reachable(initial, TWO, 2)
    assert len(states) > 100
    memo: dict = {}
    for s in states[::14]:
        want = _successors(s, TWO, memo)
        rules = sorted(v.rule for v in check_state(s))
        for image in images(s, TWO):
            assert _successors(image, TWO, memo) == want
            assert sorted(v.rule for v in check_state(image)) == rules


def test_the_semantics_ignore_the_funnel():
    """Every update action has the same branches, outcomes included, through every funnel
    as through its representative's: what lets the reduced search step one funnel. Every
    24th state of the 14,167 within three steps, in the order they were reached (so of
    every depth): 21,468 update actions stepped through another funnel."""
    states = _reachable(initial_state((EXACT, STANDARD)), TWO, 3)
    assert len(states) > 500
    checked = 0
    for s in states[::24]:
        of_rep: dict = {}  # the representative's branches, stepped once per state
        for a in actions(s, TWO):
            if getattr(a, "funnel", REPRESENTATIVE_FUNNEL) is REPRESENTATIVE_FUNNEL:
                continue
            rep = attrs.evolve(a, funnel=REPRESENTATIVE_FUNNEL)
            if rep not in of_rep:
                of_rep[rep] = step(s, rep)
            assert step(s, a) == of_rep[rep], (s, a)
            checked += 1
    assert checked > 10_000


def test_canonical_is_one_state_per_orbit():
    s = _reachable(initial_state((STANDARD, STANDARD)), TWO, 2)[-1]
    reps = {canonical(image, TWO) for image in images(s, TWO)}
    assert len(reps) == 1 and reps.pop() in set(images(s, TWO))


def test_trivial_group_leaves_states_alone():
    """The CLI's defaults (exact + standard, one prefix, one request ID) have no renaming
    but the identity: the states with and without symmetry are the same; only the update
    actions through other funnels than the representative's are not stepped."""
    b = Bounds(prefixes=("P",), rids=("r1",))
    full, reduced = (
        explore(initial_states(2), b, 2, sometimes=()),
        explore(initial_states(2), b, 2, symmetry=True, sometimes=()),
    )  # at depth 2 (725 states); depth 3 (7,203) holds the same, at ten times the cost
    assert full.states == reduced.states
    assert reduced.transitions < full.transitions / 2


@pytest.mark.parametrize(
    ("symmetry", "states", "transitions"),
    [
        # two standard-lane endpoints, prefixes P Q, request IDs r1 r2, depth 3: 8 renamings
        # (re-pinned for the lifecycle vocabulary: memory tags, publish, clearing pause,
        # two-phase windows;
        # then for the lifecycle designs' branches: a refused label-only publish, a refusal
        # anywhere in an open window, a staged chunk, a lagging derived probe; then for a
        # window opened on torn weights: 6,760 -> 6,932 states; then for failed updates:
        # every update may report failure, kept, closed on the new weights, or torn and
        # closed, judged by what follows (semantics.Install.FAILED_*): 6,932 -> 13,636;
        # then for a release that leaves its index listed until the wake, or spends an
        # injected refusal on the engine's own flush: 13,636 -> 13,912; then for an entry of
        # the weights in force outliving a flush or a restart: a flush of current entries
        # leads back to a state already reached, so 13,912 -> 13,904, the same transitions)
        (False, 13904, 184978),
        # up to renaming: 3.6 times fewer states (orbits are smaller near the start, where
        # most states are their own renamings); the transitions then counted only once per
        # funnel class (16,850 stepped every funnel: the same states, 40% fewer edges)
        # (3,810 -> 3,809 with current entries outliving a flush or a restart, as above)
        (True, 3809, 21708),
    ],
    ids=["unreduced", "reduced"],  # the unreduced count in the slow tier (tests/conftest.py)
)
def test_reduced_counts_are_pinned(symmetry, states, transitions):
    x = explore(initial_state((STANDARD, STANDARD)), TWO, 3, symmetry=symmetry, sometimes=())
    assert (x.states, x.transitions) == (states, transitions) and x.complete and x.ok


def _stale(endpoint: int, prefix: str) -> State:
    """Two standard-lane endpoints; ``endpoint`` is at version 1 holding version-0 KV of
    ``prefix`` without a waiver: a hit on it is stale reuse (INV-001). Built, not reached."""
    s = initial_state((STANDARD, STANDARD))
    ep = evolve(
        s.endpoint(endpoint),
        weights=1,
        draft=1,
        scales=1,
        label=1,
        cache=frozenset({Entry(prefix)}),
    )
    return evolve(s.with_endpoint(endpoint, ep), trainer=1)


def _replays(initial: State, trace: tuple, bounds: Bounds) -> set[str]:
    """Follow ``trace`` from ``initial`` in the full space (every branch), each action
    enabled where it is taken; the rules the last step can break."""
    frontier = {initial}
    broken: set[str] = set()
    for i, a in enumerate(trace):
        nxt = set()
        for s in frontier:
            if a not in actions(s, bounds):
                continue
            for n, _ in step(s, a):
                if i == len(trace) - 1:
                    broken |= {v.rule for v in check_state(n)}
                    broken |= {v.rule for sv in n.ledger for v in check_served(sv)}
                nxt.add(n.without_ledger())
        assert nxt, f"{a!r} is not enabled after {trace[:i]}"
        frontier = nxt
    return broken


@pytest.mark.parametrize(("endpoint", "prefix"), [(0, "P"), (0, "Q"), (1, "P"), (1, "Q")])
def test_a_reduced_counterexample_replays_in_the_full_space(endpoint, prefix):
    """The search among representatives finds the same violation at the same depth as the
    full search, and its trace is a concrete path from the state it started in."""
    initial = _stale(endpoint, prefix)
    full = explore(initial, TWO, 3, sometimes=())
    reduced = explore(initial, TWO, 3, symmetry=True, sometimes=())
    assert not full.ok and not reduced.ok
    assert [v.rule for v in reduced.violation] == [v.rule for v in full.violation] == ["INV-001"]
    assert len(reduced.trace) == len(full.trace) and reduced.initial == initial
    assert "INV-001" in _replays(initial, reduced.trace, TWO)
    # the concrete trace names the endpoint and prefix of this initial state
    assert reduced.violation[0].where == full.violation[0].where


def test_cli_explore_has_a_no_symmetry_switch(capsys):
    from kvfence.conformance.cli import main_explore

    code, text = main_explore(2, 2, 1, 2, 2, None, None, symmetry=True)
    code2, text2 = main_explore(2, 2, 1, 2, 2, None, None, symmetry=False)
    assert code == code2 == 0
    assert "up to symmetry" in text and "up to symmetry" not in text2
    # exact + standard lanes: only prefixes and request IDs are renamed, and fewer
    # states are counted
    count = lambda t: int(t.split("distinct states: ")[1].split()[0].replace(",", ""))  # noqa: E731
    assert count(text) < count(text2)
