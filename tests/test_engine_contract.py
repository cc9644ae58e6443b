"""The engine half of the contract, SC-1..SC-3, on the model and on the reference system,
and the byte-level SC-9 shape on the in-process byte oracle."""

from __future__ import annotations

import pytest

from kvfence.adapters import registry
from kvfence.conformance.replay import replay_actions
from kvfence.model import semantics as spec
from kvfence.model.actions import (
    FinishRequest,
    FlushCache,
    ServeRequest,
    StartRequest,
    UpdateWeights,
)
from kvfence.model.state import Config, Policy, initial_state
from kvfence.model.vocabulary import CacheMode, Funnel, Lane, Phase, Status

EXACT = Config(lane=Lane.EXACT)
STANDARD = Config()
OPT_OUT = Policy(mode=CacheMode.NONE)


def only(branches):
    assert len(branches) == 1, branches
    return branches[0]


def completed(s, action):
    """The update's branches but those of a failure of the engine's own (always allowed:
    ``spec.FAILED``, judged by what the endpoint serves next)."""
    return [(s2, o) for name, s2, o in spec.named_updates(s, action) if name not in spec.FAILED]


def served_twice(config: Config, policy: Policy = OPT_OUT):
    s = initial_state((config,), policy)
    s, _ = only(spec.step(s, ServeRequest(0, "P")))
    return s


@pytest.mark.parametrize("funnel", list(Funnel))
@pytest.mark.parametrize("asked", [False, None])
def test_sc1_exact_lane_flushes_whatever_was_asked(funnel, asked):
    s = served_twice(EXACT)
    s, out = only(completed(s, UpdateWeights(0, 1, funnel, asked)))
    assert out.observation.status is Status.OK
    assert s.endpoint(0).cache == frozenset()
    assert out.rule_for("view.cache", "") == "ENG-001"
    s, out = only(spec.step(s, ServeRequest(0, "P")))
    assert out.observation.response.hit is False


@pytest.mark.parametrize("funnel", list(Funnel))
@pytest.mark.parametrize(("asked", "flushed"), [(True, True), (False, False), (None, False)])
def test_sc2_standard_lane_does_what_was_asked(funnel, asked, flushed):
    s = served_twice(STANDARD)
    s, out = only(completed(s, UpdateWeights(0, 1, funnel, asked)))
    assert out.observation.status is Status.OK
    assert (s.endpoint(0).cache == frozenset()) is flushed
    # a kept entry breaks the flush that was asked (ENG-002); without one, only what must
    # follow every update (ENG-012, encoder outputs) can be kept wrongly
    assert out.rule_for("view.cache", "") == ("ENG-002" if flushed else "ENG-012")


def test_sc2_radix_off_is_standard_even_on_exact_lane():
    s = served_twice(Config(radix=False, lane=Lane.EXACT))
    s, out = only(completed(s, UpdateWeights(0, 1, Funnel.TENSOR, True)))
    assert out.rule_for("view.cache", "") == "ENG-002"


def test_sc3_mandatory_flush_that_cannot_complete_fails_closed():
    s = initial_state((EXACT,), OPT_OUT)
    s, _ = only(spec.step(s, StartRequest(0, "r1", "P")))
    branches = completed(s, UpdateWeights(0, 1, Funnel.TENSOR, False))
    # rejected unchanged, rejected and closed, or (exact lane only) the engine stops, or it
    # aborts the request holding KV and then flushes (CD-08)
    assert [o.observation.status for _, o in branches] == [Status.REJECTED] * 2 + [
        Status.STOPPED
    ] * 2 + [Status.OK]
    for _, out in branches:
        assert out.rule_for("status", "") == "FC-001"
    aborted, out = branches[4]
    assert out.observation.aborted == frozenset({"r1"}) and out.note
    assert aborted.endpoint(0).requests == () and aborted.endpoint(0).cache == frozenset()
    assert aborted.endpoint(0).weights == 1 and not aborted.endpoint(0).closed
    for stopped, out in branches[2:4]:
        assert stopped.endpoint(0).phase is Phase.STOPPED and out.note
        assert not spec.step(stopped, ServeRequest(0, "P"))  # nothing more is served
    rejected, closed = (b[0].endpoint(0) for b in branches[:2])
    assert (rejected.weights, rejected.closed) == (0, False)  # consistent: nothing changed
    assert (closed.weights, closed.closed) == (1, True)  # closed: nothing served
    s_closed = branches[1][0]
    _, out = only(spec.step(s_closed, ServeRequest(0, "P")))
    assert out.observation.status is Status.REJECTED
    assert out.rule_for("status", "") == "FC-002"
    # the in-flight request is aborted, then a flush reopens the endpoint
    s_closed, out = only(spec.step(s_closed, FinishRequest(0, "r1")))
    assert out.observation.aborted == frozenset({"r1"})
    s_closed, out = only(spec.step(s_closed, FlushCache(0)))
    assert out.observation.flushed is True
    assert not s_closed.endpoint(0).closed


@pytest.mark.parametrize("engine_name", ["reference", "reference-closing"])
def test_sc3_both_reference_systems_fail_closed(engine_name):
    actions = [
        StartRequest(0, "r1", "P"),
        UpdateWeights(0, 1, Funnel.TENSOR, False),
        ServeRequest(0, "P"),
        FinishRequest(0, "r1"),
        FlushCache(0),
        ServeRequest(0, "P"),
    ]
    r = replay_actions(
        registry.engine(engine_name), registry.client("reference"), (EXACT,), OPT_OUT, actions
    )
    assert r.kind == "PASS", r.violations
    statuses = [line["observed"]["status"] for line in r.run.lines]
    assert statuses[1] == "rejected"
    if engine_name == "reference-closing":
        assert statuses[2:5] == ["rejected", "rejected", "ok"]


def test_sc9_shape_stale_hit_differs_from_cold_prefill_fresh_hit_does_not():
    """On a standard lane with an explicit opt-out the stale hit is allowed, and the byte
    oracle shows it differs from a cold prefill; after a flush the bytes are equal."""
    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.TENSOR, False)]
    r = replay_actions(
        registry.engine("reference"),
        registry.client("reference"),
        (STANDARD,),
        OPT_OUT,
        [*actions, ServeRequest(0, "P"), FlushCache(0), ServeRequest(0, "P")],
    )
    assert r.kind == "PASS", r.violations
    stale, fresh = r.run.lines[2]["observed"]["response"], r.run.lines[4]["observed"]["response"]
    assert stale["hit"] is True and stale["output"] != stale["cold"]
    assert fresh["hit"] is False and fresh["output"] == fresh["cold"]


def test_standard_lane_requested_flush_refused_may_not_stop_the_engine():
    """Fail-closed by stopping is the exact lane's (the seed guard, CD-07); a standard-lane
    update whose client-requested flush is refused owes a failure reply (PF-04)."""
    s = initial_state((STANDARD,), OPT_OUT)
    s, _ = only(spec.step(s, StartRequest(0, "r1", "P")))
    branches = completed(s, UpdateWeights(0, 1, Funnel.TENSOR, True))
    assert [o.observation.status for _, o in branches] == [Status.REJECTED] * 2
