"""An entry of the weights in force may outlive a flush or a restart, on any tier; an entry
of other weights may not (ENG-003, FC-003, ENG-010; docs/spec.md "Entries of the weights in
force outlive a flush or a restart").

The model's bound after each event, then the design that keeps such entries
(``keeps-current-storage``) replayed on the spec, and its look-alikes in
tests/test_designs.py."""

from __future__ import annotations

import pytest

from kvfence.adapters import registry
from kvfence.conformance.replay import replay_actions
from kvfence.model import step
from kvfence.model.actions import (
    EvictPrefix,
    FlushCache,
    PauseGeneration,
    Restart,
    ServeRequest,
    Sleep,
    UpdateWeights,
)
from kvfence.model.cache import is_current
from kvfence.model.state import Config, Entry, Policy, State, initial_state
from kvfence.model.vocabulary import Kind, PauseMode, Tier

TIERED = Config(tiers=frozenset(Tier), draft=True, encoder=True)
STORAGE = Config(tiers=frozenset({Tier.DEVICE, Tier.STORAGE}))


def _run(state: State, *actions) -> State:
    """``state`` after ``actions``, each taking the first branch the spec allows."""
    for a in actions:
        branches = step(state, a)
        assert branches, f"{a} not enabled"
        state = branches[0][0]
    return state


def _cache(state: State) -> frozenset[Entry]:
    return state.endpoint(0).cache


def _served_everywhere(config: Config) -> State:
    """P, Q and R served at v0; P's KV written back to storage, Q's to host (where the
    config has those tiers), R's on device."""
    s = _run(initial_state((config,)), *(ServeRequest(0, p) for p in "PQR"))
    for prefix, tier in (("P", Tier.STORAGE), ("Q", Tier.HOST)):
        if tier in config.tiers:
            s = _run(s, EvictPrefix(0, prefix, tier))
    return s


def test_a_flush_may_keep_every_entry_of_the_weights_in_force():
    """Every kind on every tier, all of v0 while v0 is in force: the bound after a completed
    flush keeps them all (it was empty before: a flush had to remove every entry)."""
    s = _served_everywhere(TIERED)
    before = _cache(s)
    assert {e.tier for e in before} == set(Tier) and {e.kind for e in before} == set(Kind)
    after = _run(s, FlushCache(0))
    assert _cache(after) == before
    assert all(is_current(after.endpoint(0), e) for e in before)


def test_a_flush_still_removes_every_entry_of_older_weights():
    """After an opted-out update, v0's entries are stale: the flush must remove each of
    them, on every tier, while an entry of v1 computed since stays."""
    s = _run(_served_everywhere(TIERED), UpdateWeights(0, 1, flush_cache=False))
    s = _run(s, ServeRequest(0, "S"))
    stale = {e for e in _cache(s) if e.version == 0 and e.kind is not Kind.ENCODER}
    assert stale  # the opt-out kept v0's prefix KV on every tier
    after = _cache(_run(s, FlushCache(0)))
    assert not after & stale
    assert {e.prefix for e in after} == {"S"} and {e.version for e in after} == {1}


def test_a_restart_may_keep_the_entries_of_the_version_it_restarts_at():
    s = _served_everywhere(TIERED)
    assert _cache(_run(s, Restart(0))) == _cache(s)


def test_a_restart_drops_entries_of_other_weights_and_of_released_memory():
    """v0's entries after an update to v1 without a flush: gone at the restart (ENG-010).
    Device entries listed while the KV memory is released: gone too, whatever version."""
    s = _run(_served_everywhere(STORAGE), UpdateWeights(0, 1, flush_cache=False))
    assert _cache(s) and not _cache(_run(s, Restart(0)))
    asleep = _served_everywhere(STORAGE)
    branches = step(asleep, Sleep(0))
    listed = [b for b, _ in branches if any(e.tier is Tier.DEVICE for e in _cache(b))]
    assert listed  # the release may leave the device index listed until the resume
    restarted = _cache(_run(listed[0], Restart(0)))
    assert restarted and all(e.tier is Tier.STORAGE for e in restarted)


def test_a_clearing_pause_still_empties_every_entry():
    """The update after a clearing pause may skip its own flush: nothing may stay, not even
    an entry of the weights in force."""
    s = _run(_served_everywhere(STORAGE), PauseGeneration(0, PauseMode.RETRACT, clear_cache=True))
    assert not _cache(s)


@pytest.mark.parametrize(
    "actions",
    [
        (ServeRequest(0, "P"), EvictPrefix(0, "P", Tier.STORAGE), FlushCache(0)),
        (ServeRequest(0, "P"), EvictPrefix(0, "P", Tier.STORAGE), Restart(0)),
    ],
    ids=["flush", "restart"],
)
def test_a_storage_tier_keyed_by_version_passes_where_it_keeps_current_entries(actions):
    """``keeps-current-storage`` shows v0's storage entry after the flush (after the restart)
    and then serves it at v0, then an update removes it. Under the earlier bound (a flush
    and a restart empty every tier) each trace FAILED, at the flush (FC-003, ENG-003) or at
    the restart (ENG-010)."""
    trace = [*actions, ServeRequest(0, "P"), UpdateWeights(0, 1, flush_cache=True)]
    trace.append(ServeRequest(0, "P"))
    adapter = registry.engine("keeps-current-storage")
    try:
        r = replay_actions(adapter, registry.client("reference"), (STORAGE,), Policy(), trace)
    finally:
        adapter.close()
    assert r.kind == "PASS", (r.message, [str(v) for v in r.violations])
    shown = r.run.lines[len(actions) - 1]["observed"]["view"]["cache"]
    assert shown, "the flush (restart) left nothing: the trace does not reach the difference"
