"""The lifecycle vocabulary: Sleep/WakeUp tags and the colocated order (MEM rules),
the label-only PublishVersion (PUB rules), PauseGeneration(clear_cache). The model is pure,
so most of these are plain calls of ``step``; a few replay short traces against the
reference and a mutant to show the rule that names each mistake."""

from __future__ import annotations

import json

import pytest
from model_steps import go

from kvfence.adapters import registry
from kvfence.conformance.lockstep import Lockstep
from kvfence.conformance.record import Recorder
from kvfence.conformance.replay import replay_actions
from kvfence.model import candidates
from kvfence.model import semantics as spec
from kvfence.model.actions import (
    ContinueGeneration,
    EvictPrefix,
    FaultRefuseFlush,
    FlushCache,
    PauseGeneration,
    PublishVersion,
    ServeRequest,
    Sleep,
    StartRequest,
    TraceError,
    UpdateWeights,
    WakeUp,
    action_from_json,
)
from kvfence.model.capabilities import Capability, needed
from kvfence.model.checks import check_state
from kvfence.model.state import Config, Entry, Policy, initial_state
from kvfence.model.vocabulary import (
    ALL_MEMORY,
    CacheMode,
    Funnel,
    Lane,
    MemoryTag,
    PauseMode,
    Phase,
    Status,
    Tier,
)

T = Funnel.TENSOR
KV = frozenset({MemoryTag.KV_CACHE})
WEIGHTS = frozenset({MemoryTag.WEIGHTS})
HOST = Config(tiers=frozenset({Tier.DEVICE, Tier.HOST}))


def statuses(state, action):
    return {o.observation.status for _, o in spec.step(state, action)}


def replay(engine, actions, configs=(Config(),), policy=Policy()):
    return replay_actions(
        registry.engine(engine), registry.client("reference"), configs, policy, list(actions)
    )


# ----- trace form ---------------------------------------------------------------------------


def test_tags_round_trip_and_old_traces_mean_everything():
    for a in (
        Sleep(0, KV),
        WakeUp(1, WEIGHTS),
        Sleep(0),
        PublishVersion(0, 2, True),
        PauseGeneration(0, PauseMode.ABORT, clear_cache=True),
    ):
        assert action_from_json(json.loads(json.dumps(a.to_json()))) == a
    assert Sleep(0).to_json()["tags"] == ["kv_cache", "weights"]
    # a spec-0.2 line has no tags: it releases (and resumes) everything, as it always did
    assert action_from_json({"action": "Sleep", "endpoint": 0}).tags == ALL_MEMORY
    assert action_from_json({"action": "WakeUp", "endpoint": 0, "tags": []}).tags == ALL_MEMORY
    old = action_from_json({"action": "PauseGeneration", "endpoint": 0, "mode": "retract"})
    assert old.clear_cache is False


def test_bad_tags_are_named():
    with pytest.raises(TraceError, match=r"Sleep\.tags: \['cuda_graf'\] not tags"):
        action_from_json({"action": "Sleep", "endpoint": 0, "tags": ["kv_cache", "cuda_graf"]})
    with pytest.raises(TraceError, match=r"WakeUp\.tags: expected a list of tags"):
        action_from_json({"action": "WakeUp", "endpoint": 0, "tags": "weights"})
    with pytest.raises(TraceError, match=r"PublishVersion: missing field 'version'"):
        action_from_json({"action": "PublishVersion", "endpoint": 0})


# ----- memory release: the colocated order (MEM-001..003) ----------------------------------


def test_colocated_order_is_enabled_and_serves_fresh_kv():
    s = go(initial_state((Config(),)), ServeRequest(0, "P"), Sleep(0))
    assert s.endpoint(0).released == ALL_MEMORY and s.endpoint(0).cache == frozenset()
    # released weights are never written: no update before they are resumed
    assert not spec.enabled(s, UpdateWeights(0, 1, T, True))
    s = go(s, WakeUp(0, WEIGHTS))
    assert s.endpoint(0).phase is Phase.ASLEEP and s.endpoint(0).released == KV
    assert not spec.enabled(s, ServeRequest(0, "P"))
    update = UpdateWeights(0, 1, T, True)
    assert statuses(s, update) == {Status.OK, Status.REJECTED}  # never STOPPED (MEM-001)
    s = go(s, update, WakeUp(0, KV))
    assert s.endpoint(0).phase is Phase.SERVING and s.endpoint(0).weights == 1
    s = go(s, ServeRequest(0, "P"))
    assert s.ledger[-1].uses == frozenset(s.endpoint(0).current()) and not check_state(s)


def test_no_stop_while_kv_released_unless_a_refusal_is_injected():
    exact = Config(lane=Lane.EXACT)
    s = go(initial_state((exact,)), FaultRefuseFlush(0), Sleep(0, KV))
    # an injected refusal is FC-001's, as on any exact lane: the engine may stop (CD-07),
    # or abort what holds KV and flush again (CD-08; here nothing holds KV, so it is OK)
    got = statuses(s, UpdateWeights(0, 1, T, False))
    assert got == {Status.OK, Status.REJECTED, Status.STOPPED}
    s = go(initial_state((exact,)), Sleep(0, KV))
    assert statuses(s, FlushCache(0)) == {Status.OK, Status.REJECTED}
    # (every update may also report failure and change nothing: allowed, not MEM-001's)
    done = [
        o
        for _, o in spec.step(s, UpdateWeights(0, 1, T, False))
        if o.observation.status is Status.OK
    ]
    assert done
    for o in done:
        assert o.because.status == "MEM-001"


def test_weights_only_release_keeps_the_kv_index():
    s = go(initial_state((Config(),)), ServeRequest(0, "P"), Sleep(0, WEIGHTS))
    assert {e.prefix for e in s.endpoint(0).cache} == {"P"}
    assert not spec.enabled(s, UpdateWeights(0, 1, T, True))
    assert not spec.enabled(s, Sleep(0, WEIGHTS))  # nothing more to release
    assert not spec.enabled(s, WakeUp(0, KV))  # nothing of that tag released
    s = go(s, WakeUp(0))
    assert s.endpoint(0).phase is Phase.SERVING and s.endpoint(0).cache


def test_update_while_kv_released_still_invalidates_lower_tiers():
    s = go(
        initial_state((HOST,)),
        ServeRequest(0, "P"),
        EvictPrefix(0, "P", Tier.HOST),
        Sleep(0, KV),
    )
    assert s.endpoint(0).cache == {Entry("P", tier=Tier.HOST)}  # host memory is not released
    (done, outcome), *_ = spec.step(s, UpdateWeights(0, 1, T, True))  # then the failures
    assert done.endpoint(0).cache == frozenset()
    assert outcome.because.cache == "ENG-002" and outcome.flushed_from


def test_resuming_kv_is_judged_by_mem_002():
    s = go(initial_state((Config(),)), ServeRequest(0, "P"), Sleep(0))
    ((_, outcome),) = spec.step(s, WakeUp(0, KV))
    assert outcome.because.cache == "MEM-002"
    ((_, outcome),) = spec.step(s, WakeUp(0, WEIGHTS))
    assert outcome.because.cache == "ENG-006"


@pytest.mark.parametrize(
    ("engine", "rule"),
    [
        ("crash-on-flush-while-kv-released", "MEM-001"),
        ("index-kept-across-release", "MEM-002"),
    ],
)
def test_colocated_mistakes_named(engine, rule):
    actions = [
        ServeRequest(0, "P"),
        Sleep(0),
        WakeUp(0, WEIGHTS),
        UpdateWeights(0, 1, T, True),
        WakeUp(0, KV),
        ServeRequest(0, "P"),
    ]
    assert replay("reference", actions).kind == "PASS"
    r = replay(engine, actions)
    assert r.kind == "FAIL" and rule in {v.rule for v in r.violations}, r.message


COLOCATED_WITH_HOST_TIER = [
    ServeRequest(0, "P"),
    EvictPrefix(0, "P", Tier.HOST),
    Sleep(0, KV),
    UpdateWeights(0, 1, T, True),
    WakeUp(0, KV),
    ServeRequest(0, "P"),
]
"""The colocated order with KV that outlives the release in the host tier."""


def test_weights_only_update_while_released_leaves_a_tier():
    actions = COLOCATED_WITH_HOST_TIER
    assert replay("reference", actions, (HOST,)).kind == "PASS"
    r = replay("kv-resumed-stale-after-weights-only-update", actions, (HOST,))
    assert r.kind == "FAIL" and {v.rule for v in r.violations} == {"ENG-003"}, r.message


def test_flush_at_release_design_passes_the_colocated_order():
    """SGLang's release flushes the radix cache with the kv_cache tag (CD-02): with tags."""
    assert replay("sleep-flushes-every-tier", COLOCATED_WITH_HOST_TIER, (HOST,)).kind == "PASS"


# ----- version publishing (PUB-001, PUB-002) -----------------------------------------------


def test_publish_names_only_whole_installed_weights():
    s = initial_state((Config(draft=True),))
    ((s_ahead, ahead),) = spec.step(s, PublishVersion(0, 1))
    assert ahead.observation.status is Status.REJECTED and s_ahead.endpoint(0).label == 0
    assert ahead.because.status == "PUB-001"
    s = go(s, UpdateWeights(0, 1, T, True))
    # A publish the weights back succeeds, or is refused changing nothing (CD-11).
    ((s2, done), (s3, refused)) = spec.step(s, PublishVersion(0, 1))
    assert done.observation.status is Status.OK and s2.endpoint(0).label == 1
    assert refused.observation.status is Status.REJECTED and s3 == s and refused.note
    assert not check_state(s2)
    assert not spec.enabled(s, PublishVersion(0, 3))  # no such version anywhere


def test_publish_aborts_only_when_asked_and_keeps_paused_requests():
    s = go(
        initial_state((Config(),), Policy(mode=CacheMode.NONE)),
        StartRequest(0, "r1", "P"),
        PauseGeneration(0, PauseMode.RETRACT),
    )
    (kept, o), *refusals = spec.step(s, PublishVersion(0, 0))
    assert o.observation.aborted == frozenset() and kept.endpoint(0).requests and o.at_risk
    # a refusal (CD-11) aborts nothing unasked
    assert [r.observation.aborted for _, r in refusals] == [frozenset()]
    (gone, o), *refusals = spec.step(s, PublishVersion(0, 0, abort_requests=True))
    assert o.observation.aborted == {"r1"} and not gone.endpoint(0).requests
    # refused, the asked-for abort may have run first (SGLang's order, CD-12) or not
    assert [r.observation.aborted for _, r in refusals] == [frozenset(), {"r1"}]
    assert all(r.observation.status is Status.REJECTED for _, r in refusals)


def test_a_publish_that_kept_requests_it_could_have_aborted_is_pub002_evidence():
    """``at_risk``: requests were in flight, a publish without ``abort_requests`` showed
    it ended none. That observation could have shown PUB-002's violation, so it counts; a
    publish with nothing in flight, or an engine that shows no aborts, does not."""
    from kvfence.model.checks import evidence
    from kvfence.model.observation import Observation

    def published(state):
        # the branch that publishes (an engine may also refuse a label-only publish: CD-11)
        (out,) = [
            o
            for _, o in spec.step(state, PublishVersion(0, 0))
            if o.observation.status is Status.OK
        ]
        return out

    s = go(initial_state((Config(),)), StartRequest(0, "r1", "P"))
    kept = published(s)
    shown = Observation(Status.OK, aborted=frozenset())
    assert "PUB-002" in evidence(kept, shown, set())
    assert "PUB-002" not in evidence(kept, Observation(Status.OK), set())
    idle = published(initial_state((Config(),)))
    assert "PUB-002" not in evidence(idle, shown, set())


@pytest.mark.parametrize(
    ("engine", "actions", "rule"),
    [
        ("publish-label-without-weights", [PublishVersion(0, 1)], "PUB-001"),
        (
            "publish-aborts-kept-requests",
            [StartRequest(0, "r1", "P"), PublishVersion(0, 0)],
            "PUB-002",
        ),
    ],
)
def test_publish_mistakes_named(engine, actions, rule):
    assert replay("reference", actions).kind == "PASS"
    r = replay(engine, actions)
    assert r.kind == "FAIL" and {v.rule for v in r.violations} == {rule}, r.message


# ----- pause(clear_cache): flush at pause -------------------------------------------------


def test_clear_at_pause_empties_every_tier_and_marks_the_endpoint():
    s = go(initial_state((HOST,)), ServeRequest(0, "P"), EvictPrefix(0, "P", Tier.HOST))
    assert not spec.enabled(s, PauseGeneration(0, PauseMode.IN_PLACE, clear_cache=True))
    ((p, o),) = spec.step(s, PauseGeneration(0, PauseMode.RETRACT, clear_cache=True))
    assert p.endpoint(0).cache == frozenset() and p.endpoint(0).cleared
    assert o.observation.flushed is True and o.because.cache == "FC-003"
    s = go(s, FaultRefuseFlush(0))
    ((p, o),) = spec.step(s, PauseGeneration(0, PauseMode.ABORT, clear_cache=True))
    assert o.observation.status is Status.REJECTED and not p.endpoint(0).cleared


def test_flush_at_pause_is_sound_only_while_nothing_was_computed_since():
    """An update that skips its flush after a clearing pause conforms: PAUSED admits no
    prefill, so nothing stale can be hit. Once the endpoint continued and served, a later
    pause without the clear gives no such licence, and the same unflushed update would let
    a stale hit through (INV-001 in the model's own ledger)."""
    policy = Policy()  # auto: the spec's client would flush
    base = go(initial_state((Config(),), policy), ServeRequest(0, "P"))
    skip = UpdateWeights(0, 1, T, False)
    cleared = go(base, PauseGeneration(0, PauseMode.RETRACT, clear_cache=True))
    assert candidates.conforming(cleared, skip)
    after = go(cleared, skip, ContinueGeneration(0))
    assert all(not o.served.hit for _, o in spec.step(after, ServeRequest(0, "P")))
    again = go(after, ServeRequest(0, "P"), PauseGeneration(0, PauseMode.RETRACT))
    skip2 = UpdateWeights(0, 2, T, False)
    assert not again.endpoint(0).cleared and not candidates.conforming(again, skip2)
    stale = go(again, skip2, ContinueGeneration(0))
    hits = [s2 for s2, o in spec.step(stale, ServeRequest(0, "P")) if o.served.hit]
    assert hits and {v.rule for v in check_state(hits[0])} == {"INV-001"}


def test_flush_at_pause_replays_on_the_reference_and_catches_an_ignored_clear():
    actions = [
        ServeRequest(0, "P"),
        PauseGeneration(0, PauseMode.RETRACT, clear_cache=True),
        UpdateWeights(0, 1, T, False),
        ContinueGeneration(0),
        ServeRequest(0, "P"),
    ]
    assert replay("reference", actions).kind == "PASS"
    r = replay("pause-clear-cache-ignored", actions)
    assert r.kind == "FAIL" and "FC-003" in {v.rule for v in r.violations}, r.message


# ----- capability gating ----------------------------------------------------------------------


def test_new_vocabulary_is_drawn_only_with_its_capability():
    C = Capability
    assert needed(Sleep(0)) == {C.SLEEP}
    assert needed(Sleep(0, KV)) == {C.SLEEP, C.MEMORY_TAGS}
    assert needed(PauseGeneration(0)) == {C.PAUSE}
    assert needed(PauseGeneration(0, clear_cache=True)) == {C.PAUSE, C.PAUSE_CLEAR}
    assert needed(PublishVersion(0, 0)) == {C.PUBLISH}
    assert needed(FlushCache(0), asleep=True) == {C.MEMORY_TAGS}
    assert needed(FlushCache(0)) == frozenset()

    class Plain:
        name = "plain"
        capabilities = frozenset({C.SLEEP, C.PAUSE, C.CACHE_PROBE})
        fixed_configs = None
        profile: dict = {}

        def start(self, configs):
            pass

    lock = Lockstep(Plain(), registry.client("reference"), Recorder(), timeout=5.0)
    lock.start((Config(),), Policy())
    pool = lock.enabled_actions()
    assert Sleep(0) in pool and PauseGeneration(0) in pool
    assert not [a for a in pool if isinstance(a, PublishVersion)]
    assert not [a for a in pool if isinstance(a, Sleep) and a.tags != ALL_MEMORY]
    assert not [a for a in pool if isinstance(a, PauseGeneration) and a.clear_cache]
    lock.states = frozenset(spec.step(s, Sleep(0))[0][0] for s in lock.states)
    lock.pool = None
    assert not [a for a in lock.enabled_actions() if isinstance(a, FlushCache)]
