"""The enumeration the explorer and the stateful machine draw from (``model.candidates``):
its memos (per endpoint, on ``Context``; the capability filter per part) give exactly the
plain enumeration, filtered by ``enabled`` and ``conforming``, on every state a short
search of each setup reaches."""

from __future__ import annotations

import pytest
from attrs import evolve

from kvfence.conformance.explore import DEPLOYMENTS, EXPLORE_BOUNDS, SETUPS
from kvfence.conformance.lockstep import _asleep, enabled_pool
from kvfence.model import candidates
from kvfence.model.actions import StartRequest
from kvfence.model.capabilities import Capability, needed
from kvfence.model.semantics import enabled, memo_step, step
from kvfence.model.state import Bounds, State, initial_state
from kvfence.model.vocabulary import Phase

EVERY_SETUP = (*SETUPS, *(s for group in DEPLOYMENTS.values() for s in group))
BOUNDS = evolve(EXPLORE_BOUNDS, namespaces=True)
"""The explorer's bounds, with requests pinned to namespaces too."""


def plain(state: State, bounds: Bounds, faults: bool) -> tuple:
    """What ``candidates.actions`` means, computed without any memo."""
    return tuple(
        a
        for a in candidates.candidates(state, bounds, faults)
        if enabled(state, a) and candidates.conforming(state, a)
    )


def reached(depth: int, bounds: Bounds) -> list[State]:
    """Every state (without its ledger) within ``depth`` conforming steps of each setup's
    initial state, found by breadth-first search over ``plain``."""
    out: list[State] = []
    for setup in EVERY_SETUP:
        start = initial_state(setup.configs, setup.policy)
        seen, frontier = {start}, [start]
        for _ in range(depth):
            nxt = []
            for s in frontier:
                for a in plain(s, bounds, True):
                    for s2, _ in step(s, a):
                        s2 = s2.without_ledger()
                        if s2 not in seen:
                            seen.add(s2)
                            nxt.append(s2)
            frontier = nxt
        out += seen
    return out


@pytest.fixture(scope="module")
def states() -> list[State]:
    return reached(2, BOUNDS)


def flat(state: State, bounds: Bounds, faults: bool) -> tuple:
    return tuple(a for part in candidates.parts(state, bounds, faults) for a in part)


def test_the_endpoint_memo_gives_the_plain_enumeration(states):
    """Over every state a two-step search of each setup (single schedulers, ranks, store,
    P/D, router) reaches, the memoized parts, their concatenation and ``actions`` equal
    the plain enumeration; the states share endpoints, so most parts come from the memo."""
    assert len(states) > 5000
    for faults in (True, False):
        for s in states:
            want = plain(s, BOUNDS, faults)
            assert flat(s, BOUNDS, faults) == want, s
            assert tuple(candidates.actions(s, BOUNDS, faults)) == want, s


def test_a_context_that_leaves_out_what_a_guard_reads_is_caught(states, monkeypatch):
    """The comparison above can fail: a ``Context`` without the request IDs in flight (what
    ``StartRequest``'s guard reads on other endpoints) hands one endpoint's memoized
    actions to a state where another endpoint took the rid."""
    monkeypatch.setattr(candidates, "_ENDPOINT_MEMO", {})
    blind = candidates.Context.of

    def without_rids(state: State) -> candidates.Context:
        c = blind(state)
        return candidates.Context(c.trainer, c.policy, frozenset(), c.prefill)

    monkeypatch.setattr(candidates.Context, "of", staticmethod(without_rids))
    wrong = [s for s in states if flat(s, BOUNDS, True) != plain(s, BOUNDS, True)]
    assert wrong
    extra = {a for s in wrong for a in set(flat(s, BOUNDS, True)) - set(plain(s, BOUNDS, True))}
    assert extra and all(isinstance(a, StartRequest) for a in extra)


@pytest.mark.parametrize(
    "caps",
    [frozenset(Capability), frozenset(Capability) - {Capability.MEMORY_TAGS, Capability.TIERS}],
    ids=["every", "no-memory-tags"],
)
def test_the_one_state_pool_filters_capabilities_per_action(states, caps):
    """``enabled_pool`` on one candidate state (capabilities filtered per part, memoized)
    equals the per-action filter by ``capabilities.needed``, asleep endpoints included."""
    assert any(ep.phase is Phase.ASLEEP for s in states for ep in s.endpoints)
    faults = Capability.FAULTS in caps
    bounds = evolve(BOUNDS, namespaces=Capability.NAMESPACES in caps)
    for s in states:
        want = tuple(
            a for a in candidates.actions(s, bounds, faults) if needed(a, _asleep(s, a)) <= caps
        )
        assert enabled_pool.__wrapped__((s,), BOUNDS, caps, None) == want, s


def test_the_memoized_step_is_the_step(states):
    for s in states[::500]:
        for a in plain(s, BOUNDS, True):
            assert memo_step(s, a) == step(s, a)
