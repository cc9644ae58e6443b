"""Failed updates: any update may report failure, and the check goes on to judge what the
endpoint serves next (shared/cases/deployments-and-failures.md, PF-27, PF-32, CD-19). A wrong
status costs availability when the system refused or stopped, safety when it claimed a
success it did not have."""

from __future__ import annotations

import pytest

from kvfence.adapters import registry
from kvfence.adapters.cases import BY_ID
from kvfence.conformance.replay import replay_actions
from kvfence.conformance.runner import run_check
from kvfence.conformance.verdict import Verdict
from kvfence.model import semantics as spec
from kvfence.model.actions import (
    BeginWeightUpdate,
    ContinueGeneration,
    FaultRefuseFlush,
    FinishRequest,
    FinishWeightUpdate,
    FlushCache,
    PauseGeneration,
    ServeRequest,
    StartRequest,
    UpdateWeights,
)
from kvfence.model.rules import Klass, RuleId
from kvfence.model.state import Config, Policy, initial_state
from kvfence.model.vocabulary import CacheMode, Funnel, PauseMode, Status

STANDARD = Config()
OPT_OUT = Policy(mode=CacheMode.NONE)


def replay(engine: str, case_id: str, actions=None):
    case = BY_ID[case_id]
    steps = list(case.actions if actions is None else actions)
    return replay_actions(
        registry.engine(engine), registry.client("reference"), case.configs, case.policy, steps
    )


# ----- the model -------------------------------------------------------------------------


def test_every_update_may_fail_kept_closed_or_torn():
    """An idle update that needs a flush: completed, or failed three ways (in that order)."""
    s, _ = spec.step(initial_state((STANDARD,)), ServeRequest(0, "P"))[0]
    named = spec.named_updates(s, UpdateWeights(0, 1, Funnel.DISK, True))
    assert [n for n, _, _ in named] == [
        spec.Install.FLUSHED,
        spec.Install.FAILED_KEPT,
        spec.Install.FAILED_CLOSED,
        spec.Install.FAILED_TORN,
    ]
    _, (_, kept, out_kept), (_, closed, _), (_, torn, _) = named
    assert out_kept.observation.status is Status.REJECTED
    assert kept.endpoint(0).weights == 0 and kept.endpoint(0).cache == s.endpoint(0).cache
    assert closed.endpoint(0).weights == 1 and closed.endpoint(0).closed
    assert torn.endpoint(0).torn and torn.endpoint(0).closed and torn.endpoint(0).label is None
    # what each closed endpoint's refusal to serve answers to
    assert spec.step(closed, ServeRequest(0, "P"))[0][1].rule_for("status", "") == RuleId.FC_002
    assert spec.step(torn, ServeRequest(0, "P"))[0][1].rule_for("status", "") == RuleId.FC_004
    # a flush reopens the stale tree, never the torn weights
    assert not spec.step(closed, FlushCache(0))[0][0].endpoint(0).closed
    assert spec.step(torn, FlushCache(0))[0][0].endpoint(0).closed


def test_a_refused_flush_is_not_offered_twice():
    """Where a required flush cannot run, the refusal branches are FC-001's; the failure
    branches add only the torn endpoint (and the kept one with an injected refusal left)."""
    s, _ = spec.step(initial_state((STANDARD,), OPT_OUT), StartRequest(0, "r1", "P"))[0]
    names = [n for n, _, _ in spec.named_updates(s, UpdateWeights(0, 1, Funnel.TENSOR, True))]
    assert names == [
        spec.Install.REFUSED_KEPT,
        spec.Install.REFUSED_CLOSED,
        spec.Install.FAILED_TORN,
    ]


# ----- PF-32 and CD-19 -------------------------------------------------------------------


def test_pf32_is_judged_at_the_request_after_the_failed_update():
    """The failure reply is allowed; serving the stale tree after it is FC-002 (a safety
    violation), not LIV-001 at the update."""
    r = replay("serves-after-raised-flush", "PF-32")
    assert r.kind == "FAIL"
    assert [v.rule for v in r.violations] == [RuleId.FC_002]
    assert r.violations[0].cost is Klass.SAFETY
    assert r.run.lines[-1]["step"] == 3  # the ServeRequest after the update


def test_cd19_closes_and_reopens_after_a_flush():
    case = BY_ID["PF-32"]
    actions = [*case.actions, FlushCache(0), ServeRequest(0, "P")]
    r = replay("closes-on-raised-flush", "PF-32", actions)
    assert r.kind == "PASS", [str(v) for v in r.violations]
    assert len(r.run.actions) == len(actions)
    statuses = [line["observed"]["status"] for line in r.run.lines if "observed" in line]
    assert statuses == ["ok", "ok", "rejected", "rejected", "ok", "ok"]


def test_pf27_serving_on_torn_weights_is_fc004():
    r = replay("bucket-failure-keeps-serving", "PF-27")
    assert r.kind == "FAIL" and [v.rule for v in r.violations] == [RuleId.FC_004]
    assert r.run.lines[-1]["step"] == 2


@pytest.mark.parametrize("flush_cache", [True, False])
def test_an_engine_that_refuses_updates_while_requests_exist_passes(flush_cache):
    """A retracted request never blocks a flush (LIV-001); an engine that refuses the update
    anyway changed nothing, and a refused update is always allowed."""
    actions = [
        ServeRequest(0, "P"),
        StartRequest(0, "r1", "Q"),
        PauseGeneration(0, PauseMode.RETRACT),
        UpdateWeights(0, 1, Funnel.TENSOR, flush_cache),  # refused: r1 is queued
        FlushCache(0),
        ContinueGeneration(0),
        FinishRequest(0, "r1"),
        UpdateWeights(0, 2, Funnel.TENSOR, flush_cache),  # taken: nothing in flight
        ServeRequest(0, "P"),
    ]
    from kvfence.adapters.designs import RefusesUpdatesWhileRequestsExist
    from kvfence.adapters.reference import InProcessAdapter

    engine = InProcessAdapter(RefusesUpdatesWhileRequestsExist, "refuses-updates-while-requests")
    r = replay_actions(engine, registry.client("reference"), (STANDARD,), OPT_OUT, actions)
    assert r.kind == "PASS", [str(v) for v in r.violations]
    updates = [
        line for line in r.run.lines if line.get("action", {}).get("action") == "UpdateWeights"
    ]
    assert [u["observed"]["status"] for u in updates] == ["rejected", "ok"]


# ----- availability and safety, per violation ----------------------------------------------


def test_a_crash_on_a_refused_flush_is_an_availability_failure(tmp_path):
    """PF-04: the engine dies where a failure reply was due: FC-001 broken, safely."""
    r = replay("crashes-after-swap", "PF-04")
    assert r.kind == "FAIL" and {v.rule for v in r.violations} == {RuleId.FC_001}
    assert {v.cost for v in r.violations} == {Klass.AVAILABILITY}
    engine, client = registry.engine("crashes-after-swap"), registry.client("reference")
    result = run_check(engine, client, out_dir=tmp_path, focus=RuleId.FC_001, max_examples=200)
    assert result.availability is Verdict.FAIL
    assert result.safety is not Verdict.FAIL


def test_a_swallowed_flush_is_a_safety_failure(tmp_path):
    """A refused mandatory flush reported as success: the same rule, broken by a lie."""
    engine, client = registry.engine("swallows-failed-flush"), registry.client("reference")
    result = run_check(engine, client, out_dir=tmp_path, focus=RuleId.FC_001, max_examples=200)
    assert result.safety is Verdict.FAIL
    assert any(v.rule == RuleId.FC_001 and v.cost is Klass.SAFETY for v in result.violations)


def test_a_refusal_spent_by_the_engines_own_flush_inside_a_failed_update_is_spent():
    """An engine that flushes on every update (CD-09) meets an injected refusal inside a
    finish nobody asked to flush: it rejects the finish, and the refusal is spent there,
    so its next flush succeeds (the model offers the kept endpoint with and without it)."""
    actions = [
        BeginWeightUpdate(0, 1, Funnel.TENSOR),
        FaultRefuseFlush(0),
        FinishWeightUpdate(0, None),
        FlushCache(0),
    ]
    engine = registry.engine("always-flushes")
    r = replay_actions(engine, registry.client("reference"), (STANDARD,), Policy(), actions)
    assert r.kind == "PASS", [str(v) for v in r.violations]
    statuses = [line["observed"]["status"] for line in r.run.lines if "observed" in line]
    assert statuses == ["ok", "ok", "rejected", "ok"]
