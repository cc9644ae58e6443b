"""The model's sometimes-properties (``model.properties``, the REACH rules): the model
explorer finds a shortest witness for each it can reach, and the lockstep checker notes
them with the same monitors."""

from __future__ import annotations

import pytest

import kvfence.conformance.lockstep as lockstep
from kvfence.adapters import registry
from kvfence.adapters.clients import ReferenceClient
from kvfence.conformance.lockstep import Lockstep
from kvfence.conformance.record import Recorder
from kvfence.model.actions import ServeRequest
from kvfence.model.explore import STANDARD, explore, initial_states
from kvfence.model.properties import SOMETIMES, Sometimes
from kvfence.model.rules import BY_ID, Klass, RuleId
from kvfence.model.semantics import step
from kvfence.model.state import Bounds, initial_state

CLI_DEFAULT = Bounds(prefixes=("P",), rids=("r1",), versions=2)
"""``kvfence explore``'s default bounds (its default depth is 6)."""

REACH = (RuleId.REACH_001, RuleId.REACH_002, RuleId.REACH_003)


def _skip_the_state_search(level: int) -> bool:
    """A ``stop`` that ends the state search before its first level: the witness search
    runs all the same, with the depth and bounds given (it reads nothing of the state
    search), so a test gets the default-bound witnesses without the depth-6 search."""
    return True


def _reaches(prop: Sometimes, initial, trace) -> bool:
    """``trace`` is a path of the model from ``initial`` (each action has a branch; the
    first is followed, as the witness search's first successor may be any branch, so the
    monitor alone is replayed on the states), and the monitor reaches ``prop`` exactly at
    its last action, not before."""
    state, memory = initial, prop.start
    for i, action in enumerate(trace):
        branches = step(state, action)
        assert branches, f"step {i + 1} {action!r} is not enabled"
        memory, hit = prop.observe(memory, state, action)
        if hit:
            return i == len(trace) - 1
        state = branches[0][0].without_ledger()
    return False


def test_the_model_lists_the_reach_rules_as_sometimes_properties():
    assert tuple(p.rule for p in SOMETIMES) == REACH
    assert all(BY_ID[p.rule].klass is Klass.CHECK for p in SOMETIMES)
    assert [p.name for p in SOMETIMES] == [BY_ID[r].name for r in REACH]


def test_the_default_bound_explore_witnesses_every_reach_rule():
    x = explore(initial_states(2), CLI_DEFAULT, 6, symmetry=True, stop=_skip_the_state_search)
    assert x.sometimes == REACH
    assert x.witnessed == REACH and x.unwitnessed == ()
    by_rule = {w.rule: w for w in x.witnesses}
    # shortest: a guarded update needs one step, a refused flush a request in flight
    # first, a reuse after an update a request, the update, the request again
    assert {r: len(w.trace) for r, w in by_rule.items()} == {
        RuleId.REACH_001: 3,
        RuleId.REACH_002: 1,
        RuleId.REACH_003: 2,
    }
    for prop in SOMETIMES:
        w = by_rule[prop.rule]
        assert w.initial == initial_states(2)[0]
        assert _reaches(prop, w.initial, w.trace), (prop.rule, w.trace)


def test_a_scenario_the_setup_cannot_reach_is_unwitnessed():
    """One standard-lane endpoint: no update is guarded by the engine (REACH-002)."""
    x = explore(initial_state((STANDARD,)), CLI_DEFAULT, 4, symmetry=True)
    assert x.complete and x.ok
    assert x.unwitnessed == (RuleId.REACH_002,)
    assert set(x.witnessed) == {RuleId.REACH_001, RuleId.REACH_003}


def test_the_witness_search_keeps_the_history_a_flush_erases():
    """REACH-001's witness on the exact lane is a request, a sync that flushes, the request
    again: the state after the flush equals the state after the sync alone, so a search
    that kept one history per state would lose the first request and find no witness."""
    x = explore(initial_states(2), CLI_DEFAULT, 3, stop=_skip_the_state_search)
    (w,) = [w for w in x.witnesses if w.rule == RuleId.REACH_001]
    first, sync, again = w.trace
    assert isinstance(first, ServeRequest) and first == again
    after_first = step(w.initial, first)[0][0].without_ledger()
    flushed = step(after_first, sync)[0][0].without_ledger()
    assert flushed in {s.without_ledger() for s, _ in step(w.initial, sync)}


def test_the_witness_search_stops_at_its_cap():
    x = explore(initial_states(2), CLI_DEFAULT, 6, stop=_skip_the_state_search, witness_states=3)
    assert x.unwitnessed and len(x.witnesses) < 3


def test_no_properties_no_witnesses():
    x = explore(initial_states(2), CLI_DEFAULT, 2, sometimes=())
    assert x.sometimes == () and x.witnesses == ()


@pytest.mark.parametrize("rule", REACH)
def test_the_lockstep_notes_what_the_model_witnesses(rule):
    """Each witness the model explorer finds, run in lockstep against the reference, is
    noted reached by the lockstep: both read the same monitors."""
    x = explore(initial_states(2), CLI_DEFAULT, 6, symmetry=True, stop=_skip_the_state_search)
    (w,) = [w for w in x.witnesses if w.rule == rule]
    recorder = Recorder()
    lock = Lockstep(registry.engine("reference"), ReferenceClient(), recorder, timeout=30.0)
    lock.start(tuple(ep.config for ep in w.initial.endpoints), w.initial.policy)
    for action in w.trace[:-1]:
        lock.run(action)
        lock.check_model()
    assert rule not in recorder.reached
    lock.run(w.trace[-1])
    assert rule in recorder.reached


def test_the_lockstep_reads_its_reach_rules_from_the_model(monkeypatch):
    """Swap the model's monitors for one that reaches REACH-002 on any request: the
    lockstep notes exactly that."""

    def on_any_request(memory, state, action):
        return memory, isinstance(action, ServeRequest)

    monkeypatch.setattr(lockstep, "SOMETIMES", (Sometimes(RuleId.REACH_002, on_any_request),))
    recorder = Recorder()
    lock = Lockstep(registry.engine("reference"), ReferenceClient(), recorder, timeout=30.0)
    lock.start((STANDARD,), initial_state((STANDARD,)).policy)
    lock.run(ServeRequest(0, "P"))
    assert recorder.reached == {RuleId.REACH_002}
