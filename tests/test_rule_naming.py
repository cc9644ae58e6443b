"""Findings are named after the mechanism that failed, not the config they were found on:
an update that never flushed is ENG-001/ENG-002 on an encoder config too (the encoder
outputs an update drops anyway are no sign of a partial flush), and shrinking keeps the
first violated rule while dropping the config features it does not need. A flush that
frees KV a live request holds breaks the idle gate (FC-005), on any endpoint, while a
success the observation contradicts is a false report (FC-003, FC-001 inside an update)."""

from __future__ import annotations

import pytest

from kvfence.adapters import registry
from kvfence.conformance.explore import explore_adapter
from kvfence.conformance.replay import replay_actions, shrink
from kvfence.model.actions import (
    FaultRefuseFlush,
    FlushCache,
    PauseGeneration,
    ServeRequest,
    StartRequest,
    UpdateWeights,
)
from kvfence.model.checks import evidence
from kvfence.model.rules import RuleId
from kvfence.model.semantics import step
from kvfence.model.state import Config, Policy, initial_state
from kvfence.model.vocabulary import CacheMode, Funnel, Lane, PauseMode

OPT_OUT = Policy(mode=CacheMode.NONE)


def _never_flushes(config: Config, flush_cache: bool):
    actions = [
        ServeRequest(0, "P"),
        UpdateWeights(0, 1, Funnel.TENSOR, flush_cache),
        ServeRequest(0, "P"),
    ]
    engine, client = registry.engine("update-never-flushes"), registry.client("reference")
    return engine, client, replay_actions(engine, client, (config,), OPT_OUT, actions)


@pytest.mark.parametrize(
    ("lane", "flush_cache", "rule"),
    [(Lane.EXACT, False, RuleId.ENG_001), (Lane.STANDARD, True, RuleId.ENG_002)],
    ids=["guard", "asked"],
)
def test_an_unflushed_update_on_an_encoder_config_is_named_by_its_flush_rule(
    lane, flush_cache, rule
):
    _, _, r = _never_flushes(Config(encoder=True, lane=lane), flush_cache)
    assert r.kind == "FAIL" and [v.rule for v in r.violations] == [rule]


def test_shrinking_drops_the_encoder_and_keeps_the_rule():
    engine, client, found = _never_flushes(Config(encoder=True, lane=Lane.EXACT), False)
    best = shrink(engine, client, found.run, {RuleId.ENG_001}, True)
    assert best is not None and [v.rule for v in best.hard] == [RuleId.ENG_001]
    assert [c.encoder for c in best.run.configs] == [False]


# ----- the idle gate: a flush that frees KV a live request holds (FC-005) ------------------

LIVE = [StartRequest(0, "r1", "P")]
STALE_UNDER_LIVE = [*LIVE, UpdateWeights(0, 1, Funnel.TENSOR, False), FlushCache(0)]
"""r1 runs on v0 KV the opt-out update left in the tree: the flush had entries to remove."""


def _replay(engine: str, configs, policy, actions):
    return replay_actions(
        registry.engine(engine), registry.client("reference"), configs, policy, actions
    )


def test_a_flush_that_frees_a_running_requests_kv_is_fc_005_not_fc_003():
    """The flush reports success and did empty the tree (its report is true): the rule it
    breaks is the idle gate's. A checker that named every success where a refusal was owed
    FC-003 (a dishonest report) fails here."""
    r = _replay("flush-skips-idle-check", (Config(),), OPT_OUT, STALE_UNDER_LIVE)
    assert r.kind == "FAIL"
    assert {v.rule for v in r.violations} == {RuleId.FC_005}, [str(v) for v in r.violations]


def test_a_success_that_kept_the_entries_is_still_a_dishonest_report():
    """The same claim, but the cache listing shows the old entries kept: the report is
    false (FC-003), not the gate's (PF-03)."""
    r = _replay("flush-refusal-reported-as-success", (Config(),), OPT_OUT, STALE_UNDER_LIVE)
    assert r.kind == "FAIL" and RuleId.FC_003 in {v.rule for v in r.violations}
    assert RuleId.FC_005 not in {v.rule for v in r.violations}


@pytest.mark.parametrize(
    ("engine", "rule"),
    [("flushes-around-paused-kv", RuleId.FC_005), ("swallows-failed-flush", RuleId.FC_001)],
    ids=["flushed-through-paused-kv", "skipped-the-flush"],
)
def test_an_update_that_succeeds_over_held_kv_is_named_by_what_its_flush_did(engine, rule):
    """An update whose flush a paused-in-place request blocks reports success: if the
    listing shows the flush ran, it went through live KV (FC-005); if it shows the tree
    kept, the update swallowed its failed flush (FC-001)."""
    actions = [
        ServeRequest(0, "Q"),
        *LIVE,
        PauseGeneration(0, PauseMode.IN_PLACE),
        UpdateWeights(0, 1, Funnel.TENSOR, True),
    ]
    r = _replay(engine, (Config(),), Policy(), actions)
    assert r.kind == "FAIL", r.kind
    assert r.violations[0].rule == rule, [str(v) for v in r.violations]
    assert ({RuleId.FC_001, RuleId.FC_005} - {rule}).isdisjoint(v.rule for v in r.violations)


def test_the_refusal_the_gate_owes_is_its_evidence():
    s = initial_state((Config(),))
    held = step(s, StartRequest(0, "r1", "P"))[0][0]
    ((_, refused),) = step(held, FlushCache(0))
    assert refused.gate == RuleId.FC_005 and refused.completion is not None
    obs = refused.observation
    assert RuleId.FC_005 in evidence(refused, obs, {"flush_result", "inflight"})
    # an injected refusal is no gate's: FC-003 alone
    faulty = step(s, FaultRefuseFlush(0))[0][0]
    assert all(o.gate is None for _, o in step(faulty, FlushCache(0)))


def test_the_explorer_kills_the_single_endpoint_gate_mutant_with_fc_005():
    x = explore_adapter(
        registry.engine("flush-skips-idle-check"),
        registry.client("reference"),
        focus=RuleId.FC_005,
        depth=2,
        out_dir=None,
    )
    assert {v.rule for v in x.violation} == {RuleId.FC_005}, x.violation
    assert len(x.trace) == 2
