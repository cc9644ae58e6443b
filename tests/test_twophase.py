"""Two-phase update windows (WIN-001..003), derived weight state (DER-001) and the restart
oracle (``Response.fresh``): the model's branches, PF-23's trace at engine level with the
blame split written in docs/rules.md, and the relabelling engine that only a restart oracle
can catch."""

from __future__ import annotations

import json

import pytest
from attrs import evolve

from kvfence.adapters.mutants import (
    DerivedHiddenSkippedOnTensorFunnel,
    FinishPublishesAfterFailedChunk,
    P2pPrepareWritesLive,
    RelabelWithoutLoading,
)
from kvfence.adapters.reference import ClosingEndpoint, InProcessAdapter, ReferenceEndpoint
from kvfence.adapters.registry import client
from kvfence.conformance.replay import replay_actions
from kvfence.conformance.runner import run_check
from kvfence.conformance.trace import observation_from_json, observation_json
from kvfence.model.actions import (
    AbortWeightUpdate,
    BeginWeightUpdate,
    FaultChunkFails,
    FinishWeightUpdate,
    FlushCache,
    ServeRequest,
    SyncWeights,
    UpdateWeightChunk,
    UpdateWeights,
    action_from_json,
)
from kvfence.model.candidates import conforming
from kvfence.model.capabilities import Capability
from kvfence.model.checks import ColdBytes, check_state, compare, evidence
from kvfence.model.observation import Observation, Response, View
from kvfence.model.semantics import step
from kvfence.model.state import Config, Policy, initial_state
from kvfence.model.vocabulary import MIXED, CacheMode, Funnel, Lane, Status

STANDARD = Config()
OPT_OUT = Policy(mode=CacheMode.NONE)


def run(actions, state):
    """Step the model through ``actions``, following the last branch of each."""
    for a in actions:
        branches = step(state, a)
        assert branches, f"{a!r} not enabled"
        state = branches[-1][0]
    return state


def engine(cls, name="under-test", drop=()):
    adapter = InProcessAdapter(cls, name)
    adapter.capabilities = adapter.capabilities - set(drop)
    return adapter


def replay(cls, configs, policy, actions, drop=()):
    return replay_actions(engine(cls, drop=drop), client("reference"), configs, policy, actions)


# ----- the model ------------------------------------------------------------------------


def test_a_landed_chunk_leaves_mixed_weights_with_no_version_and_no_label():
    s = run([BeginWeightUpdate(0, 1)], initial_state((STANDARD,)))
    assert s.endpoint(0).live == 0 and s.endpoint(0).label == 0  # nothing landed yet
    # Two branches since CD-14: staged aside (old weights whole and labelled), or landed.
    ((aside, staged), (s2, outcome)) = step(s, UpdateWeightChunk(0))
    assert aside.endpoint(0).live == 0 and aside.endpoint(0).label == 0
    assert staged.observation.view.weights == 0 and staged.because.weights == "WIN-001"
    ep = s2.endpoint(0)
    assert ep.live == MIXED and ep.label is None and not ep.closed
    assert outcome.observation.view.weights is None
    assert outcome.because.weights == "WIN-001" and outcome.because.label == "WIN-001"
    assert check_state(s2) == []


def test_serving_inside_the_window_is_refused_or_mixed_and_never_new():
    s = run([BeginWeightUpdate(0, 1), UpdateWeightChunk(0)], initial_state((STANDARD,)))
    branches = step(s, ServeRequest(0, "P"))
    statuses = [o.observation.status for _, o in branches]
    assert statuses == [Status.REJECTED, Status.OK]
    refused, served = branches[0][1], branches[1][1]
    assert refused.because.status == "WIN-001"
    assert served.observation.response.sampled == frozenset({MIXED})
    assert 1 not in served.observation.response.sampled
    (entry,) = branches[1][0].endpoint(0).cache
    assert entry.version == MIXED and "mixed weights" in str(entry)


@pytest.mark.parametrize("flush", [None, False, True])
def test_finish_drops_window_kv_whatever_was_asked(flush):
    """WIN-002: KV of the mixed weights never outlives the window, even when the caller
    opted out of the flush."""
    s = run(
        [ServeRequest(0, "P"), BeginWeightUpdate(0, 1), UpdateWeightChunk(0), ServeRequest(0, "Q")],
        initial_state((STANDARD,), OPT_OUT),
    )
    assert any(e.version == MIXED for e in s.endpoint(0).cache)
    finished = [
        (s2, o)
        for s2, o in step(s, FinishWeightUpdate(0, flush))
        if o.observation.status is Status.OK
    ]
    assert finished  # (a finish may also report failure: kept, closed or torn)
    for s2, outcome in finished:
        ep = s2.endpoint(0)
        assert not any(e.version == MIXED for e in ep.cache)
        assert (ep.weights, ep.label, ep.update) == (1, 1, None)
        assert outcome.because.cache == "WIN-002"


def test_failed_chunk_rolls_back_or_closes_and_the_finish_publishes_nothing():
    s = run(
        [BeginWeightUpdate(0, 1), UpdateWeightChunk(0), FaultChunkFails(0)],
        initial_state((STANDARD,)),
    )
    branches = step(s, UpdateWeightChunk(0))
    assert [o.because.status for _, o in branches] == ["WIN-003", "WIN-003"]
    back, closed = (b[0].endpoint(0) for b in branches)
    assert (back.live, back.label, back.closed) == (0, 0, False)
    assert closed.closed and closed.label is None
    for s2, _ in branches:
        ((s3, outcome),) = step(s2, FinishWeightUpdate(0, True))
        assert outcome.observation.status is Status.REJECTED
        assert outcome.because.status == "WIN-003"
        assert s3.endpoint(0).weights == 0 and s3.endpoint(0).label in (0, None)


def test_abort_rolls_back_or_closes():
    s = run([BeginWeightUpdate(0, 1), UpdateWeightChunk(0)], initial_state((STANDARD,)))
    eps = [s2.endpoint(0) for s2, _ in step(s, AbortWeightUpdate(0))]
    assert [(e.update, e.closed, e.label) for e in eps] == [(None, False, 0), (None, True, None)]


def test_nothing_one_shot_runs_inside_a_window():
    s = run([BeginWeightUpdate(0, 1)], initial_state((STANDARD,)))
    assert step(s, UpdateWeights(0, 1)) == ()
    assert step(s, SyncWeights(1)) == ()
    assert step(s, BeginWeightUpdate(0, 1)) == ()


def test_a_finish_that_skips_the_clients_flush_is_off_contract():
    s = run([BeginWeightUpdate(0, 1)], initial_state((STANDARD,)))
    assert not conforming(s, FinishWeightUpdate(0, False))
    assert conforming(s, FinishWeightUpdate(0, True))
    s = run([BeginWeightUpdate(0, 1)], initial_state((STANDARD,), OPT_OUT))
    assert conforming(s, FinishWeightUpdate(0, False))


def test_two_phase_actions_round_trip_through_the_trace_form():
    for a in (
        BeginWeightUpdate(0, 2, Funnel.DISTRIBUTED),
        FinishWeightUpdate(1, False),
        UpdateWeightChunk(0),
        AbortWeightUpdate(0),
        FaultChunkFails(0),
    ):
        assert action_from_json(json.loads(json.dumps(a.to_json()))) == a


# ----- PF-23 at engine level ---------------------------------------------------------------


class KeepsWindowKv(ReferenceEndpoint):
    """Serves under mixed weights and keeps their KV across the finish (not catalogued)."""

    def _drop_window_kv(self) -> None:
        pass


PF23_MIXED = [
    BeginWeightUpdate(0, 1),
    UpdateWeightChunk(0),
    FlushCache(0),  # the client resets too early
    ServeRequest(0, "P"),  # admitted meanwhile: cached under the mixed weights
    FinishWeightUpdate(0, False),  # the client thinks it already reset
    ServeRequest(0, "P"),
]
PF23_OLD = [
    BeginWeightUpdate(0, 1),
    FlushCache(0),
    ServeRequest(0, "P"),  # admitted before any chunk landed: KV of the old whole weights
    UpdateWeightChunk(0),
    FinishWeightUpdate(0, False),
    ServeRequest(0, "P"),
]


@pytest.mark.parametrize("cls", [ReferenceEndpoint, ClosingEndpoint], ids=["serves", "refuses"])
@pytest.mark.parametrize("policy", [Policy(), OPT_OUT], ids=["auto", "opt-out"])
def test_pf23_window_kv_is_dropped_by_a_correct_engine(cls, policy):
    r = replay(cls, (STANDARD,), policy, PF23_MIXED)
    assert r.kind == "PASS", [str(v) for v in r.violations]


def test_pf23_window_kv_kept_across_the_finish_is_the_engines_fault():
    r = replay(KeepsWindowKv, (STANDARD,), OPT_OUT, PF23_MIXED)
    assert r.kind == "FAIL"
    assert [v.rule for v in r.violations] == ["WIN-002"]
    assert r.run.lines[-1]["action"]["action"] == "FinishWeightUpdate"


def test_pf23_old_kv_after_an_early_reset_is_the_callers_choice():
    """KV of the old whole weights kept by a finish asked not to flush: waived where the
    client's policy opts out, else the stale hit (the client rule CLI-008 names the
    cause); the engine did what it was asked either way."""
    waived = replay(ReferenceEndpoint, (STANDARD,), OPT_OUT, PF23_OLD)
    assert waived.kind == "PASS", [str(v) for v in waived.violations]
    stale = replay(ReferenceEndpoint, (STANDARD,), Policy(), PF23_OLD)
    assert stale.kind == "FAIL" and [v.rule for v in stale.violations] == ["INV-001"]
    exact = replay(ReferenceEndpoint, (Config(lane=Lane.EXACT),), Policy(), PF23_OLD)
    assert exact.kind == "PASS"  # ENG-001 flushes at the finish anyway


# ----- the new mutants, by trace ----------------------------------------------------------


def test_p2p_prepare_writes_live_is_caught_at_the_first_chunk():
    r = replay(P2pPrepareWritesLive, (STANDARD,), OPT_OUT, PF23_MIXED)
    assert r.kind == "FAIL" and {v.rule for v in r.violations} == {"WIN-001"}
    # Since CD-14 a chunk may be staged aside, so the probe of the old version after the
    # chunk is no lie by itself; the first forward is: its bytes are not the old version's
    # (the restart oracle, blamed on WIN-001 inside a window that received chunks).
    assert r.run.lines[-1]["action"]["action"] == "ServeRequest"


def test_finish_after_a_failed_chunk_publishing_is_caught():
    trace = [
        BeginWeightUpdate(0, 1),
        FaultChunkFails(0),
        UpdateWeightChunk(0),
        FinishWeightUpdate(0, True),
    ]
    assert replay(ReferenceEndpoint, (STANDARD,), Policy(), trace).kind == "PASS"
    r = replay(FinishPublishesAfterFailedChunk, (STANDARD,), Policy(), trace)
    assert r.kind == "FAIL" and "WIN-003" in {v.rule for v in r.violations}


# ----- derived state and the restart oracle ---------------------------------------------

RELABEL = [ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.TENSOR, True), ServeRequest(0, "P")]


def test_relabel_without_loading_fails_only_through_the_restart_oracle():
    caught = replay(RelabelWithoutLoading, (STANDARD,), Policy(), RELABEL)
    assert caught.kind == "FAIL" and [v.rule for v in caught.violations] == ["INV-003"]
    assert "response.fresh" in caught.violations[0].where
    blind = replay(
        RelabelWithoutLoading, (STANDARD,), Policy(), RELABEL, drop={Capability.RESTART_ORACLE}
    )
    assert blind.kind == "PASS", [str(v) for v in blind.violations]


def test_relabel_without_loading_passes_a_whole_check_without_the_restart_oracle(tmp_path):
    """The known false PASS the restart oracle closes: the same-engine byte oracle agrees
    with itself. (With the oracle, tests/test_mutants.py shows it killed by INV-003.)"""
    blind = engine(
        RelabelWithoutLoading, "relabel-without-loading", drop={Capability.RESTART_ORACLE}
    )
    result = run_check(blind, client("reference"), out_dir=tmp_path, focus="INV-003")
    assert result.verdict == "PASS", [(r.rule.id, r.verdict) for r in result.rules]


def test_derived_state_behind_a_blind_probe_is_caught_by_the_restart_oracle():
    trace = [UpdateWeights(0, 1, Funnel.TENSOR, True), ServeRequest(0, "Q")]
    configs = (Config(derived=True),)
    caught = replay(DerivedHiddenSkippedOnTensorFunnel, configs, Policy(), trace)
    assert caught.kind == "FAIL" and [v.rule for v in caught.violations] == ["DER-001"]
    blind = replay(
        DerivedHiddenSkippedOnTensorFunnel,
        configs,
        Policy(),
        trace,
        drop={Capability.RESTART_ORACLE},
    )
    assert blind.kind == "PASS"
    assert replay(ReferenceEndpoint, configs, Policy(), trace).kind == "PASS"


def _served_outcome(derived: bool):
    s = initial_state((Config(derived=derived),))
    ((_, outcome),) = step(s, ServeRequest(0, "P"))
    return outcome


def test_fresh_bytes_are_evidence_only_once_they_tell_two_versions_apart():
    """A restart oracle whose bytes do not depend on the version could never have shown a
    violation: no evidence until two versions' fresh bytes differ."""
    outcome = _served_outcome(derived=True)
    caps = {Capability.RESTART_ORACLE, Capability.BYTE_ORACLE}
    obs = Observation(
        Status.OK, response=Response(False, output=("x",), cold=("x",), fresh=("x",)), view=View(0)
    )
    oracle = ColdBytes()
    oracle.record_fresh(outcome.served, False, ("x",))
    assert "DER-001" not in evidence(outcome, obs, caps, oracle)
    oracle.record_fresh(evolve(outcome.served, weights=1), False, ("y",))
    assert "DER-001" in evidence(outcome, obs, caps, oracle)
    assert "DER-001" not in evidence(outcome, obs, caps - {Capability.RESTART_ORACLE}, oracle)


def test_restart_oracle_names_der_or_inv_by_the_endpoints_derived_state():
    for derived, rule in ((True, "DER-001"), (False, "INV-003")):
        outcome = _served_outcome(derived)
        got = Response(False, output=("v0",), cold=("v0",), fresh=("v1",))
        caps = {Capability.RESTART_ORACLE, Capability.BYTE_ORACLE}
        bad = compare(outcome, evolve(outcome.observation, response=got), caps)
        assert [v.rule for v in bad] == [rule]


def test_fresh_and_derived_round_trip_through_the_trace():
    obs = Observation(
        Status.OK,
        response=Response(False, output=("a", 1), fresh=("a", 2)),
        view=View(1, label=1, derived=0),
    )
    back = observation_from_json(json.loads(json.dumps(observation_json(obs))), "line 1")
    assert back.response.fresh == ("a", 2) and back.view.derived == 0
    plain = observation_json(Observation(Status.OK, view=View(1)))
    assert "derived" not in plain["view"]  # spec 0.2 readers see what they always saw


def test_a_lockstep_run_records_the_restart_oracles_bytes_as_evidence():
    """The restart oracle's bytes count (DER-001 on a derived endpoint) once they told two
    versions apart for the prompt: serving P at v0 and at v1 is enough (the second serve
    counts); without the oracle's capability only the derived-state probe counts."""
    from kvfence.conformance.record import Recorder

    trace = [ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.TENSOR, True), ServeRequest(0, "P")]
    configs = (Config(derived=True),)
    counts = {}
    for drop in ((), (Capability.RESTART_ORACLE,)):
        recorder = Recorder()
        got = replay_actions(
            engine(ReferenceEndpoint, drop=drop),
            client("reference"),
            configs,
            Policy(),
            trace,
            recorder=recorder,
        )
        assert got.kind == "PASS", [str(v) for v in got.violations]
        counts[drop] = recorder.exercised["DER-001"]
    assert counts[()] == counts[(Capability.RESTART_ORACLE,)] + 1, counts
