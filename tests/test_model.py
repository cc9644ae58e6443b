"""Unit tests of the spec itself: rules registry, lifecycle table, guards, effects,
invariants. The model is pure, so these are plain function calls."""

from __future__ import annotations

import re

import pytest
from attrs import evolve
from model_steps import go

from kvfence.model import candidates, lifecycle
from kvfence.model import semantics as spec
from kvfence.model.actions import (
    ContinueGeneration,
    EvictPrefix,
    FaultRefuseFlush,
    FaultUpdateFailsMidway,
    FinishRequest,
    FlushCache,
    LoadLora,
    PauseGeneration,
    Restart,
    ServeRequest,
    Sleep,
    StartRequest,
    SyncWeights,
    UpdateWeights,
    WakeUp,
)
from kvfence.model.checks import check_state
from kvfence.model.rules import BY_ID, RULES, rule
from kvfence.model.state import Config, Policy, initial_state
from kvfence.model.vocabulary import CacheMode, Funnel, Kind, Lane, PauseMode, Phase, Tier

T = Funnel.TENSOR


def test_rule_ids_are_stable_unique_and_well_formed():
    assert len(BY_ID) == len(RULES)
    assert len({r.name for r in RULES}) == len(RULES)
    for r in RULES:
        assert re.fullmatch(
            r"(CLI|ENG|FC|INV|LIV|ADP|REACH|MEM|PUB|WIN|DER|RNK|STO|PD|RTR)-\d{3}", r.id
        ), r.id
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", r.name), r.name
        assert r.level in ("MUST", "SHOULD")
        assert r.text and r.rationale and r.source
    with pytest.raises(KeyError, match="no rule 'XYZ-001'"):
        rule("XYZ-001")


def test_lifecycle_table():
    assert lifecycle.allows(Phase.SERVING, "ServeRequest")
    assert not lifecycle.allows(Phase.PAUSED, "ServeRequest")
    assert lifecycle.allows(Phase.PAUSED, "UpdateWeights")
    # the colocated order updates while asleep (a guard keeps released weights
    # unwritten), but nothing is served there.
    assert lifecycle.allows(Phase.ASLEEP, "UpdateWeights")
    assert not lifecycle.allows(Phase.ASLEEP, "PublishVersion")
    assert lifecycle.next_phase(Phase.ASLEEP, "WakeUpPartly") is Phase.ASLEEP
    assert lifecycle.next_phase(Phase.SERVING, "PauseGeneration") is Phase.PAUSED
    assert lifecycle.next_phase(Phase.ASLEEP, "Restart") is Phase.SERVING
    with pytest.raises(ValueError, match="not allowed in phase asleep"):
        lifecycle.next_phase(Phase.ASLEEP, "ServeRequest")
    diagram = lifecycle.diagram()
    assert "stateDiagram" in diagram and "PauseGeneration" in diagram


def test_disabled_actions_have_no_branches():
    s = initial_state((Config(),))
    assert spec.step(s, FinishRequest(0, "r1")) == ()
    assert spec.step(s, ContinueGeneration(0)) == ()  # not paused
    assert spec.step(s, UpdateWeights(0, 5, T, True)) == ()  # not the next version
    assert spec.step(s, ServeRequest(3, "P")) == ()  # no such endpoint
    assert spec.step(s, ServeRequest(0, "P", lora=True)) == ()  # no LoRA configured
    assert spec.step(s, EvictPrefix(0, "P", Tier.HOST)) == ()  # no host tier
    assert not spec.enabled(go(s, Sleep(0)), ServeRequest(0, "P"))


def test_pause_modes():
    s = go(initial_state((Config(),), Policy(mode=CacheMode.NONE)), StartRequest(0, "r1", "P"))
    in_place = go(s, PauseGeneration(0, PauseMode.IN_PLACE))
    assert in_place.endpoint(0).kv_held
    assert spec.step(in_place, FlushCache(0))[0][1].observation.flushed is False
    retract = go(s, PauseGeneration(0, PauseMode.RETRACT))
    assert not retract.endpoint(0).kv_held
    flushed = go(retract, FlushCache(0), UpdateWeights(0, 1, T, True), ContinueGeneration(0))
    (req,) = flushed.endpoint(0).requests
    assert {u.version for u in req.uses if u.component == "target"} == {1}
    abort = spec.step(s, PauseGeneration(0, PauseMode.ABORT))[0]
    assert abort[1].observation.aborted == frozenset({"r1"})
    assert abort[0].endpoint(0).requests == ()


def test_mixed_response_is_attributed_to_every_version():
    s = initial_state((Config(),))
    s = go(s, StartRequest(0, "r1", "P"), PauseGeneration(0, PauseMode.RETRACT))
    s = go(s, UpdateWeights(0, 1, T, True), ContinueGeneration(0), FinishRequest(0, "r1"))
    assert s.ledger[-1].sampled == frozenset({0, 1})
    assert not check_state(s)


def test_flush_clears_every_tier_and_kind_of_older_weights():
    """Every entry computed under weights no longer in force goes, whatever its tier or
    kind; entries of the weights in force may stay (tests/test_current_entries.py)."""
    cfg = Config(tiers=frozenset(Tier), draft=True, encoder=True)
    s = go(initial_state((cfg,)), ServeRequest(0, "P"), EvictPrefix(0, "P", Tier.STORAGE))
    assert {e.tier for e in s.endpoint(0).cache} == {Tier.STORAGE, Tier.DEVICE}
    assert {e.kind for e in s.endpoint(0).cache} == set(Kind)
    stale = go(s, PauseGeneration(0, PauseMode.ABORT), UpdateWeights(0, 1, T, False))
    assert {e.version for e in stale.endpoint(0).cache} == {0}
    assert go(stale, FlushCache(0)).endpoint(0).cache == frozenset()


def test_load_back_restores_draft_kv_with_target():
    cfg = Config(tiers=frozenset({Tier.DEVICE, Tier.HOST}), draft=True)
    s = go(initial_state((cfg,)), ServeRequest(0, "P"), EvictPrefix(0, "P", Tier.HOST))
    branches = spec.step(s, ServeRequest(0, "P"))
    s2, out = branches[0]
    assert out.observation.response.hit
    assert {(e.kind, e.tier) for e in s2.endpoint(0).cache} == {
        (Kind.TARGET, Tier.DEVICE),
        (Kind.DRAFT, Tier.DEVICE),
    }
    assert out.rule_for("view.cache", "") == "ENG-008"


def test_sleep_drops_device_index_keeps_lower_tiers():
    cfg = Config(tiers=frozenset({Tier.DEVICE, Tier.HOST}))
    s = go(initial_state((cfg,)), ServeRequest(0, "P"), EvictPrefix(0, "P", Tier.HOST))
    s = go(s, ServeRequest(0, "Q"), Sleep(0), WakeUp(0))
    assert {e.prefix for e in s.endpoint(0).cache} == {"P"}


def test_lora_reload_makes_old_revision_unreachable():
    s = go(initial_state((Config(lora=True),)), ServeRequest(0, "P", lora=True), LoadLora(0))
    _, out = spec.step(s, ServeRequest(0, "P", lora=True))[0]
    assert out.observation.response.hit is False


def test_torn_update_is_rolled_back_or_closed():
    s = go(initial_state((Config(),)), ServeRequest(0, "P"))
    (rolled, _), (torn, out) = spec.step(s, FaultUpdateFailsMidway(0, 1))
    assert rolled.endpoint(0) == s.endpoint(0)
    assert torn.endpoint(0).torn and torn.endpoint(0).closed and torn.endpoint(0).label is None
    assert out.observation.view.weights is None
    # serving on the torn weights is the failed update's own rule: rolled back or closed
    assert spec.step(torn, ServeRequest(0, "P"))[0][1].rule_for("status", "") == "FC-004"
    still = go(torn, FlushCache(0))
    assert still.endpoint(0).closed  # a flush does not mend torn weights
    assert not go(torn, Restart(0)).endpoint(0).closed
    assert not go(torn, UpdateWeights(0, 1, T, True)).endpoint(0).closed


def test_refused_flush_fault_is_consumed():
    s = go(initial_state((Config(),)), FaultRefuseFlush(0))
    s, out = spec.step(s, FlushCache(0))[0]
    assert out.observation.flushed is False
    assert spec.step(s, FlushCache(0))[0][1].observation.flushed is True


def test_sync_composes_pause_update_continue_for_every_endpoint():
    s = initial_state((Config(), Config(lane=Lane.EXACT)), Policy(pause_mode=PauseMode.IN_PLACE))
    calls = spec.sync_actions(s, SyncWeights(1, T))
    assert [type(c).__name__ for c in calls] == [
        "PauseGeneration",
        "UpdateWeights",
        "ContinueGeneration",
    ] * 2
    assert calls[0].mode is PauseMode.RETRACT  # SC-8
    branches = spec.step(s, SyncWeights(1, T))
    # each update completes, or fails kept, closed or torn (spec.FAILED): 4 x 4 syncs
    assert len(branches) == 16
    s2, _ = branches[0]
    assert {ep.weights for ep in s2.endpoints} == {1}
    assert s2.trainer == 1


def test_conforming_calls_only_skip_the_flush_where_the_spec_client_would():
    s = initial_state((Config(), Config(lane=Lane.EXACT)))
    assert not candidates.conforming(s, UpdateWeights(0, 1, T, False))  # auto, radix reported on
    assert candidates.conforming(s, UpdateWeights(1, 1, T, False))  # guarded: the engine flushes
    opt_out = evolve(s, policy=Policy(mode=CacheMode.NONE))
    assert candidates.conforming(opt_out, UpdateWeights(0, 1, T, False))
    assert all(candidates.conforming(s, a) for a in candidates.actions(s))


def test_label_soundness_invariant():
    s = initial_state((Config(draft=True),))
    ep = evolve(s.endpoint(0), draft=0, weights=1, label=1)
    bad = check_state(s.with_endpoint(0, ep))
    assert [v.rule for v in bad] == ["INV-003"]


def test_stale_entry_on_open_exact_endpoint_is_a_violation():
    s = go(initial_state((Config(lane=Lane.EXACT),)), ServeRequest(0, "P"))
    ep = evolve(s.endpoint(0), weights=1, label=1, draft=1, scales=1)
    assert [v.rule for v in check_state(s.with_endpoint(0, ep))] == ["INV-001"]


def test_a_sync_keeps_the_branch_where_an_engine_stopped():
    """CD-07 inside a sync: the stop branch survives the composition (nothing more is
    driven on the stopped endpoint) instead of vanishing from the explorer's view."""
    s = initial_state((Config(lane="exact"),))
    s, _ = spec.step(s, StartRequest(0, "r1", "P"))[0]
    s, _ = spec.step(s, FaultRefuseFlush(0))[0]
    branches = spec.step(s, SyncWeights(1, T))
    assert any(b[0].endpoint(0).phase is Phase.STOPPED for b in branches)
