"""Data-parallel ranks behind one endpoint: the vocabulary (``Config.ranks``, a request's
``rank``, FaultRankUpdateFails), the merged replies and closing of the spec (RNK-001..003),
the reference DP controller (``adapters/ranks.py``), and the ranks deployment of the
explorer. The catalog's ranked mutants and designs are also in the catalog-wide tests
(tests/test_mutants.py, tests/test_explore.py, tests/test_designs.py)."""

from __future__ import annotations

import pytest
from conftest import after

from kvfence.adapters import registry
from kvfence.adapters.designs import BY_NAME as DESIGNS
from kvfence.adapters.protocol import Unsupported
from kvfence.adapters.ranks import RANKS_CONFIGS, RankedEndpoint
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.conformance.cli import main_explore
from kvfence.conformance.runner import run_check
from kvfence.conformance.trace import config_from_json, config_json
from kvfence.model.actions import (
    FaultRankUpdateFails,
    FinishRequest,
    FlushCache,
    PauseGeneration,
    ServeRequest,
    Sleep,
    StartRequest,
    SyncWeights,
    TraceError,
    UpdateWeights,
    action_from_json,
)
from kvfence.model.candidates import actions
from kvfence.model.checks import check_state
from kvfence.model.fast import evolve
from kvfence.model.rules import RuleId
from kvfence.model.semantics import enabled, step
from kvfence.model.state import Bounds, Config, initial_state
from kvfence.model.vocabulary import Funnel, PauseMode, Status

RANKED = Config(ranks=2)
DISK = Funnel.DISK


# ----- vocabulary ---------------------------------------------------------------------------


def test_a_ranked_endpoint_starts_with_one_scheduler_per_rank():
    ep = initial_state((Config(ranks=3),)).endpoint(0)
    assert len(ep.ranks) == 3 and all(r.config == Config() for r in ep.ranks)
    assert initial_state((Config(),)).endpoint(0).ranks == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ranks": 0}, "Config.ranks=0: expected an int of at least 1"),
        ({"ranks": True}, "Config.ranks=True"),
        ({"ranks": 2, "draft": True}, "ranks=2 with draft"),
        ({"ranks": 2, "lora": True, "fp8_kv": True}, "with fp8_kv, lora"),
    ],
)
def test_bad_ranks_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Config(**kwargs)


def test_a_request_names_its_rank_and_traces_omit_rank_zero():
    on_one = StartRequest(0, "r1", "P", rank=1)
    assert on_one.to_json()["rank"] == 1 and action_from_json(on_one.to_json()) == on_one
    assert "rank" not in ServeRequest(0, "P").to_json()
    assert action_from_json({"action": "ServeRequest", "endpoint": 0, "prefix": "P"}).rank == 0
    with pytest.raises(TraceError, match=r"ServeRequest\.rank: expected int"):
        action_from_json({"action": "ServeRequest", "endpoint": 0, "prefix": "P", "rank": "1"})


def test_a_trace_config_keeps_its_ranks():
    assert config_from_json(config_json(RANKED), "c") == RANKED
    assert "ranks" not in config_json(Config())
    with pytest.raises(TraceError, match="'ranks' must be an int of at least 1"):
        config_from_json({**config_json(RANKED), "ranks": 0}, "c")
    with pytest.raises(TraceError, match="ranks=2 with draft"):
        config_from_json({**config_json(RANKED), "draft": True}, "c")


def test_ranks_are_enabled_only_where_they_exist():
    one, two = initial_state((Config(),)), initial_state((RANKED,))
    assert not enabled(one, ServeRequest(0, "P", rank=1))
    assert not enabled(one, FaultRankUpdateFails(0, 0))  # a single scheduler has no ranks
    assert enabled(two, ServeRequest(0, "P", rank=1))
    assert not enabled(two, ServeRequest(0, "P", rank=2))
    assert enabled(two, FaultRankUpdateFails(0, 1))
    # not modelled across ranks: never drawn on a ranked endpoint
    assert not enabled(two, Sleep(0))
    assert not enabled(two, PauseGeneration(0, PauseMode.RETRACT, clear_cache=True))
    assert enabled(two, SyncWeights(1))


def test_single_scheduler_enumeration_is_unchanged():
    """Rank arguments are enumerated per rank, so one rank adds no action to draw."""
    drawn = actions(initial_state((Config(),)), Bounds())
    assert all(getattr(a, "rank", 0) == 0 for a in drawn)
    assert not any(isinstance(a, FaultRankUpdateFails) for a in drawn)


# ----- the spec: merged replies and closing --------------------------------------------------


def test_a_flush_is_a_success_only_if_every_rank_flushed():
    """PF-25: r1 holds KV on rank 1; rank 0 can flush, rank 1 cannot."""
    s = after(initial_state((RANKED,)), ServeRequest(0, "P"), StartRequest(0, "r1", "Q", rank=1))
    branches = step(s, FlushCache(0))
    assert {o.observation.status for _, o in branches} == {Status.REJECTED}
    assert {o.observation.flushed for _, o in branches} == {False}
    assert {o.because.status for _, o in branches} == {RuleId.RNK_001}
    # rank 0 emptied its tree (CD-16) or no rank flushed (an all-or-nothing controller):
    # P is KV of the weights in force, which a flush may keep, so either way it may remain
    caches = {frozenset(e.prefix for e in t.endpoint(0).ranks[0].cache) for t, _ in branches}
    assert caches == {frozenset({"P"})}
    # rank 1 keeps the KV its request holds in every branch
    assert all({e.prefix for e in t.endpoint(0).ranks[1].cache} == {"Q"} for t, _ in branches)
    s = after(s, FinishRequest(0, "r1"))
    ((_, done),) = step(s, FlushCache(0))
    assert done.observation.status is Status.OK and done.observation.flushed is True


def test_an_update_failing_on_one_rank_rolls_back_or_closes():
    """PF-26: rank 1's update fails, rank 0's goes through."""
    s = after(initial_state((RANKED,)), ServeRequest(0, "P"), FaultRankUpdateFails(0, 1))
    branches = step(s, UpdateWeights(0, 1, DISK, True))
    assert {o.observation.status for _, o in branches} == {Status.REJECTED}
    assert {o.because.status for _, o in branches} == {RuleId.RNK_002}
    views = {(o.observation.view.weights, o.observation.view.label) for _, o in branches}
    assert views == {(0, 0), (None, None)}  # rolled back, or closed reporting no version
    (back,) = [t for t, o in branches if o.observation.view.weights == 0]
    (shut,) = [t for t, o in branches if o.observation.view.weights is None]
    assert [r.weights for r in back.endpoint(0).ranks] == [0, 0]
    assert {e.prefix for e in back.endpoint(0).cache} == {"P"}  # with its cache
    assert [r.weights for r in shut.endpoint(0).ranks] == [1, 0] and shut.endpoint(0).torn
    # closed: nothing is served on either rank until an update completes on every rank
    for k in (0, 1):
        ((_, refused),) = step(shut, ServeRequest(0, "P", rank=k))
        assert refused.observation.status is Status.REJECTED
        assert refused.because.status is RuleId.RNK_003
    ((whole, done),) = step(shut, UpdateWeights(0, 1, DISK, True))
    assert done.observation.status is Status.OK and done.observation.view.weights == 1
    assert not whole.endpoint(0).torn and [r.weights for r in whole.endpoint(0).ranks] == [1, 1]


def test_a_flush_refused_on_one_rank_fails_the_update_as_fc_001():
    s = after(initial_state((RANKED,)), StartRequest(0, "r1", "P", rank=1))
    branches = step(s, UpdateWeights(0, 1, DISK, True))
    assert {o.because.status for _, o in branches} == {RuleId.FC_001}
    # a claim of success is judged against the update as if every flush had run (REACH-003)
    assert all(o.completion is not None for _, o in branches)
    assert {o.completion.observation.view.weights for _, o in branches} == {1}


def test_a_request_runs_on_its_rank():
    s = after(initial_state((RANKED,)), ServeRequest(0, "P", rank=1))
    assert [{e.prefix for e in r.cache} for r in s.endpoint(0).ranks] == [set(), {"P"}]
    ((_, o),) = [(t, o) for t, o in step(s, ServeRequest(0, "P", rank=0)) if not o.dropped]
    assert o.observation.response.hit is False  # rank 0's tree holds nothing
    hits = {o.observation.response.hit for _, o in step(s, ServeRequest(0, "P", rank=1))}
    assert True in hits


def test_ranks_at_two_versions_on_an_open_endpoint_break_rnk_003():
    s = initial_state((RANKED,))
    ep = s.endpoint(0)
    split = evolve(ep, ranks=(ep.ranks[0], evolve(ep.ranks[1], weights=1)))
    bad = check_state(s.with_endpoint(0, split))
    assert [v.rule for v in bad] == [RuleId.RNK_003]
    assert check_state(s.with_endpoint(0, evolve(split, torn=True, label=None))) == []


# ----- the reference DP controller -----------------------------------------------------------


def test_the_reference_engine_on_ranked_configs_is_the_dp_controller():
    adapter = InProcessAdapter(ReferenceEndpoint, "reference")
    adapter.start((RANKED, Config()))
    ranked, single = adapter.endpoints
    assert isinstance(ranked, RankedEndpoint) and len(ranked.ranks) == 2
    assert type(single) is ReferenceEndpoint
    design = InProcessAdapter(DESIGNS["merges-every-flush-reply"].build(), "d")
    design.start((Config(),))
    assert type(design.endpoints[0]) is ReferenceEndpoint  # one rank: its scheduler


def test_a_call_not_modelled_across_ranks_is_unsupported():
    with pytest.raises(Unsupported, match="sleep is not modelled"):
        RankedEndpoint(RANKED).sleep()


def test_the_reference_ranks_engine_passes_at_ci(out_dir):
    engine = registry.engine("reference-ranks")
    assert engine.fixed_configs == RANKS_CONFIGS
    result = run_check(engine, registry.client("reference"), out_dir=out_dir)
    assert result.verdict == "PASS", [(r.rule.id, r.verdict, r.reason) for r in result.rules]
    verdicts = {r.rule.id: r.verdict for r in result.rules}
    assert {verdicts[r] for r in ("RNK-001", "RNK-002", "RNK-003")} == {"PASS"}
    assert {v for k, v in verdicts.items() if k.startswith("REACH")} == {"PASS"}


# ----- the explorer's ranks deployment ------------------------------------------------------


@pytest.mark.parametrize(
    ("depth", "states", "transitions"),
    [(4, "1,678", "7,885"), (6, "6,716", "51,276")],
    ids=["depth4", "depth6"],  # depth 6 in the slow tier (tests/conftest.py)
)
def test_the_ranks_model_state_count_is_pinned(depth, states, transitions):
    """``kvfence explore --deployment ranks`` at the CLI's default bounds (one prefix, one
    request ID, versions <= 2, depth 6, symmetry on) and at depth 4: one standard endpoint
    of two ranks. The orbits: a request on either rank, a flush or update fanned out, a
    rank's failure and the closed endpoint it may leave; the counts move only with the
    ranks semantics."""
    code, text = main_explore(depth=depth, workers=1, deployment_name="ranks")
    assert code == 0, text
    assert f"distinct states: {states} up to symmetry" in text, text
    assert f"transitions: {transitions}" in text and "PASS" in text, text
