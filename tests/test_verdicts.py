"""Verdicts: the spec holds a system to the safety contract, not to the reference's
choices (correct designs unlike the reference PASS, version labels, aborts, refusals), and
a rule PASSes only on evidence that could have shown its violation."""

from __future__ import annotations

import pytest
from attrs import evolve

from kvfence.adapters import registry
from kvfence.adapters.clients import ReferenceClient
from kvfence.adapters.designs import (
    AbortsThenFlushes,
    AlwaysFlushes,
    OmittedFlushMeansFlush,
    PauseAbortClearsCache,
    RadixOffSkipsFlush,
    SleepFlushesEveryTier,
    StopsOnRefusedFlush,
    VersionKeyedCache,
)
from kvfence.adapters.mutants import (
    ForcesFlushOnStandardLane,
    InPlaceSkipsFlushClient,
)
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint, Reply
from kvfence.conformance.client_table import client_table
from kvfence.conformance.errors import AdapterError
from kvfence.conformance.lockstep import Lockstep, explanation
from kvfence.conformance.record import Recorder
from kvfence.conformance.replay import replay_actions
from kvfence.conformance.runner import run_check
from kvfence.model import semantics as spec
from kvfence.model.actions import (
    ContinueGeneration,
    EvictPrefix,
    FaultRefuseFlush,
    FinishRequest,
    FlushCache,
    PauseGeneration,
    ServeRequest,
    Sleep,
    StartRequest,
    UpdateWeights,
    WakeUp,
)
from kvfence.model.checks import ColdBytes, SpecError, Violation, compare, evidence
from kvfence.model.client import (
    REPORTS_WHEN_OFF,
    REPORTS_WHEN_ON,
    ROBUSTNESS_SHAPES,
    parse_radix,
)
from kvfence.model.observation import Observation, Response, View
from kvfence.model.state import Config, Policy, initial_state, server_info
from kvfence.model.vocabulary import CacheMode, Funnel, Kind, Lane, PauseMode, Status, Tier

T = Funnel.TENSOR
EXACT = Config(lane=Lane.EXACT)
STANDARD = Config()
OPT_OUT = Policy(mode=CacheMode.NONE)


def replay(cls, configs, actions, policy=OPT_OUT, client=None):
    engine = cls if isinstance(cls, InProcessAdapter) else InProcessAdapter(cls, cls.__name__)
    return replay_actions(engine, client or ReferenceClient(), configs, policy, actions)


def rules(result) -> set[str]:
    return {v.rule for v in result.violations}


# ----- correct designs that differ from the reference ------------------------------------


# The designs themselves come from adapters/designs.py (the pass matrix's), so that these
# findings are replayed against the very classes `kvfence mutants` shows passing.


class StopsOnEveryRefusedFlush(ReferenceEndpoint):
    """Not a design: CD-07's stop, taken on a standard lane too, where a requested flush
    refused owes a failure reply (PF-04's shape, FC-001)."""

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        if self._must_flush(funnel, flush_cache) and not self._can_flush():
            self.__init__(self.config)  # the process is gone; a restart starts cold
            return Reply(False, message="scheduler exited: flush refused", stopped=True)
        return super().update_weights(version, funnel, flush_cache)


def test_cd01_abort_that_clears_the_cache_passes():
    """Was INV-001 NoStalePrefixReuse (the model insisted the cache kept P)."""
    actions = [ServeRequest(0, "P"), PauseGeneration(0, PauseMode.ABORT)]
    actions += [ContinueGeneration(0), ServeRequest(0, "P")]
    assert replay(PauseAbortClearsCache, (STANDARD,), actions).kind == "PASS"


def test_cd02_sleep_that_flushes_every_tier_passes():
    """Was ENG-006 (the model kept the host tier through sleep)."""
    actions = [ServeRequest(0, "P"), EvictPrefix(0, "P", Tier.HOST), Sleep(0), WakeUp(0)]
    actions.append(ServeRequest(0, "P"))
    config = Config(tiers=frozenset({Tier.DEVICE, Tier.HOST}))
    assert replay(SleepFlushesEveryTier, (config,), actions).kind == "PASS"


@pytest.mark.parametrize("config", [EXACT, STANDARD], ids=["exact", "standard"])
def test_cd03_version_keyed_cache_passes_without_any_flush(config):
    """Was INV-001 'response.hit expected True, got False': blamed for not reusing."""
    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, T, True), ServeRequest(0, "P")]
    r = replay(VersionKeyedCache, (config,), actions, Policy())
    assert r.kind == "PASS", r.violations
    assert r.run.lines[2]["observed"]["response"]["hit"] is False
    listed = r.run.lines[2]["observed"]["view"]["cache"]
    assert {e["namespace"] for e in listed} == {0, 1}  # the old entry stays, unreachable


def test_cd04_encoder_follows_every_update_and_keeping_it_is_eng012():
    """The reference now drops encoder outputs on every update (ENG-012); an engine that
    keeps them across an opted-out update (vllm #44910, PF-21) FAILs ENG-012."""

    class EncoderSurvives(ReferenceEndpoint):
        def _drop_derived(self) -> None:
            pass

    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, T, False), ServeRequest(0, "P")]
    config = Config(encoder=True)
    assert replay(ReferenceEndpoint, (config,), actions).kind == "PASS"
    assert "ENG-012" in rules(replay(EncoderSurvives, (config,), actions))


def test_cd05_omitted_flush_cache_follows_the_engine_profile():
    """Was LIV-002 / ENG-002: the spec read 'omitted' as 'not asked'."""
    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, T, None), ServeRequest(0, "P")]
    r = replay(OmittedFlushMeansFlush, (STANDARD,), actions)
    assert r.kind == "PASS", r.violations
    assert r.run.lines[2]["observed"]["response"]["hit"] is False


def test_cd06_radix_off_skipping_the_no_op_flush_passes():
    """Was FC-001: the spec demanded a refusal of a flush that had nothing to do."""
    config = Config(radix=False, info=server_info(radix_cache_enabled=False))
    actions = [StartRequest(0, "r1", "P"), UpdateWeights(0, 1, T, True), FinishRequest(0, "r1")]
    r = replay(RadixOffSkipsFlush, (config,), actions, Policy(mode=CacheMode.FLUSH))
    assert r.kind == "PASS", r.violations
    assert r.run.lines[1]["observed"]["status"] == "ok"


def test_cd07_exact_lane_stop_passes_with_an_availability_note():
    """Was FC-001 (treated like crashes-after-swap). Safe; availability is the cost."""
    actions = [StartRequest(0, "r1", "P"), UpdateWeights(0, 1, T, False)]
    r = replay(StopsOnRefusedFlush, (EXACT,), actions)
    assert r.kind == "PASS", r.violations
    assert r.run.lines[1]["observed"]["status"] == "stopped"


def test_pf04_a_standard_lane_crash_on_a_requested_flush_stays_fc001():
    """Where a crash stays a fault: the contract asks a failure reply there (PF-04)."""
    actions = [StartRequest(0, "r1", "P"), UpdateWeights(0, 1, T, True)]
    assert "FC-001" in rules(replay(StopsOnEveryRefusedFlush, (STANDARD,), actions))


def test_eng002_narrowed_an_extra_flush_is_only_a_note_with_exact_cache():
    """Dropping more than asked is never a MUST failure: ENG-011 (SHOULD), and only where
    the adapter declares exact_cache."""
    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, T, False), ServeRequest(0, "P")]
    loose = InProcessAdapter(ForcesFlushOnStandardLane, "x", exact=False)
    assert replay(loose, (STANDARD,), actions).kind == "PASS"
    strict = InProcessAdapter(ForcesFlushOnStandardLane, "x", exact=True)
    assert rules(replay(strict, (STANDARD,), actions)) == {"ENG-011"}


def test_a_cache_holding_less_than_expected_is_never_inv001():
    class ForgetsEverything(ReferenceEndpoint):
        def generate(self, prefix, lora=False, namespace=None):
            reply = super().generate(prefix, lora, namespace)
            self.cache.clear()
            return reply

    actions = [ServeRequest(0, "P"), ServeRequest(0, "P"), ServeRequest(0, "P")]
    assert replay(ForgetsEverything, (STANDARD,), actions).kind == "PASS"
    strict = InProcessAdapter(ForgetsEverything, "x", exact=True)
    assert "INV-001" not in rules(replay(strict, (STANDARD,), actions))


class StubFlush(ReferenceEndpoint):
    def flush_cache(self) -> Reply:
        return Reply(True, flushed=True)


def test_a_flush_that_does_nothing_and_reports_success_is_fc003():
    """The flush had KV of older weights to remove (the update before it opted out) and
    removed nothing, yet reported success: a lie (PF-22's variant), FC-003."""
    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, T, False), FlushCache(0)]
    assert rules(replay(StubFlush, (STANDARD,), actions)) == {"FC-003"}


def test_a_flush_that_keeps_only_entries_of_the_weights_in_force_is_no_lie():
    """The same stub where every entry is of the weights in force: nothing had to go, so
    its success is true (an entry of the current weights may outlive a flush)."""
    actions = [ServeRequest(0, "P"), FlushCache(0), ServeRequest(0, "P")]
    assert replay(StubFlush, (STANDARD,), actions).kind == "PASS"


# ----- namespaces (PF-24) ------------------------------------------------------------------


def pinned_session(policy: Policy):
    s = initial_state((STANDARD,), policy)
    s, _ = spec.step(s, StartRequest(0, "g1", "P", namespace=0))[-1]
    s, _ = spec.step(s, FinishRequest(0, "g1"))[0]
    (s, _), *_ = spec.step(s, UpdateWeights(0, 1, T, False))
    return spec.step(s, ServeRequest(0, "P", namespace=0))[0]


def test_a_request_pinned_to_older_weights_is_stale_reuse_even_after_an_opt_out():
    s, out = pinned_session(OPT_OUT)
    assert out.served.hit and out.served.pinned
    assert [v.rule for v in spec_check(s)] == ["INV-001"]


def test_declared_off_policy_sessions_are_reported_not_failed():
    s, out = pinned_session(Policy(mode=CacheMode.NONE, off_policy_sessions=True))
    assert out.served.off_policy and out.served.stale
    assert spec_check(s) == []


def spec_check(s):
    from kvfence.model.checks import check_state

    return check_state(s)


# ----- the client --------------------------------------------------------------------------


def test_shapes_no_engine_emits_are_never_drawn_only_asked():
    """Int and contradictory shapes are asked of a resolver (CLI-013) but never drawn as an
    endpoint's report, where the MUST rules would judge them."""
    on = server_info(radix_cache_enabled=1, disable_radix_cache=True)
    off = server_info(disable_radix_cache=1)
    drawn = {repr(i) for i in (*REPORTS_WHEN_ON, *REPORTS_WHEN_OFF)}  # repr: 1 == True
    assert repr(on) not in drawn and repr(off) not in drawn
    assert {repr(on), repr(off)} <= {repr(i) for i in ROBUSTNESS_SHAPES}
    assert parse_radix(dict(on)) is True and parse_radix(dict(off)) is False


def test_cli006_parsing_mistakes_fail():
    """CLI-006 could never FAIL: its fallback was unreachable."""

    class StringsAreTrue(ReferenceClient):
        def radix_enabled(self, info):
            if info and "disable_radix_cache" in info and "radix_cache_enabled" not in info:
                return not bool(info["disable_radix_cache"])  # "0" is a true string
            return super().radix_enabled(info)

    bad = client_table(StringsAreTrue(), Recorder(), 5.0)
    assert "CLI-006" in {v.rule for v in bad}
    assert client_table(ReferenceClient(), Recorder(), 5.0) == []


def test_cli007_is_judged_against_the_clients_own_flush():
    """A client that never flushes is charged the flush rule, not CLI-007; one that drops
    the flush because of an in_place pause is charged CLI-007 (PF-06)."""
    never = {v.rule for v in client_table(registry.client("never-flush"), Recorder(), 5.0)}
    assert "CLI-007" not in never and "CLI-001" in never
    skips = {v.rule for v in client_table(InPlaceSkipsFlushClient(), Recorder(), 5.0)}
    assert "CLI-007" in skips


# ----- evidence and branch choice ----------------------------------------------------------


def fresh_hit():
    """A model branch believing a hit on fresh KV, on an exact lane."""
    s = initial_state((EXACT,), OPT_OUT)
    s, _ = spec.step(s, ServeRequest(0, "P"))[0]
    return spec.step(s, ServeRequest(0, "P"))[0][1]


def test_f1_unconfirmed_fresh_belief_with_differing_bytes_is_inv001():
    """Was INV-004 (a SHOULD: WARN, exit 0) where the bytes showed stale reuse."""
    outcome = fresh_hit()
    obs = Observation(Status.OK, Response(hit=True, output=("v1", "v0 KV"), cold=("v1",)))
    assert [v.rule for v in compare(outcome, obs, {"byte_oracle"})] == ["INV-001"]
    confirmed = Observation(
        Status.OK,
        Response(hit=True, output=("v1", "odd"), cold=("v1",)),
        view=View(weights=0, label=0, cache=frozenset({spec_entry("P", 0)})),
    )
    caps = {"byte_oracle", "cache_probe"}
    assert [v.rule for v in compare(outcome, confirmed, caps)] == ["INV-004"]


def spec_entry(prefix, version):
    from kvfence.model.state import Entry

    return Entry(prefix, Kind.TARGET, Tier.DEVICE, version)


def test_f6_bytes_count_only_once_the_oracle_told_versions_apart():
    """A stub whose output and cold bytes are always equal gave INV-001 evidence."""
    outcome = fresh_hit()
    obs = Observation(Status.OK, Response(hit=True, output=(), cold=()))
    oracle = ColdBytes()
    oracle.record(outcome.served, False, ())
    assert "INV-001" not in evidence(outcome, obs, {"byte_oracle"}, oracle)
    oracle.record(evolve_served(outcome.served, 1), False, ("other",))
    assert "INV-001" in evidence(outcome, obs, {"byte_oracle"}, oracle)


def evolve_served(served, version):
    from attrs import evolve

    return evolve(served, weights=version)


def test_branch_choice_prefers_no_must_never_fewest():
    must = [Violation("INV-001", 0, 1)]
    shoulds = [Violation("INV-004", 0, 1), Violation("ENG-011", 0, 1)]
    assert explanation([must, shoulds]) == shoulds
    assert explanation([must, [Violation("FC-001", 0, 1)]]) == must


def test_f5_radix_flag_and_server_info_disagree_is_adp002_unless_declared():
    lying = Config(info=server_info(radix_cache_enabled=False))
    step = Lockstep(registry.engine("reference"), ReferenceClient(), Recorder())
    with pytest.raises(AdapterError, match="ADP-002"):
        step.start((lying,), Policy())
    # declared misreporting: INV-001 is never waived for it
    declared = Config(info=server_info(radix_cache_enabled=False), misreports=True)
    s = initial_state((declared,), Policy())
    s, _ = spec.step(s, ServeRequest(0, "P"))[0]
    (s, _), *_ = spec.step(s, UpdateWeights(0, 1, T, False))
    s, out = spec.step(s, ServeRequest(0, "P"))[0]
    assert out.served.stale and not out.served.waived
    assert [v.rule for v in spec_check(s)] == ["INV-001"]


def test_the_model_breaking_its_own_invariants_is_a_spec_error():
    """Was raised as ADP-002, blaming the adapter."""
    from attrs import evolve

    step = Lockstep(registry.engine("reference"), ReferenceClient(), Recorder())
    bad = initial_state((STANDARD,))
    step.states = frozenset({bad.with_endpoint(0, evolve(bad.endpoint(0), label=7))})
    with pytest.raises(SpecError):
        step.check_model()


def test_reference_passes_with_exact_cache_too(out_dir):
    """The reference's own strict test: with exact_cache every entry the model may hold is
    held (ENG-011 has evidence and holds)."""
    engine = InProcessAdapter(ReferenceEndpoint, "reference", exact=True)
    result = run_check(engine, ReferenceClient(), out_dir=out_dir)
    assert result.verdict == "PASS", [(r.rule.id, r.verdict) for r in result.rules]
    assert {r.rule.id: r.verdict for r in result.rules}["ENG-011"] == "PASS"


def test_exact_cache_owes_no_hit_on_a_key_that_holds_only_draft_kv():
    """A window whose chunk landed computes P's target KV under mixed weights; the finish
    drops it (WIN-002) and leaves P's draft KV behind. Only target KV makes a hit, so the
    miss that follows is no entry dropped unasked (ENG-011), even with exact_cache."""
    from kvfence.model.actions import BeginWeightUpdate, FinishWeightUpdate, UpdateWeightChunk

    engine = InProcessAdapter(ReferenceEndpoint, "reference", exact=True)
    actions = [
        BeginWeightUpdate(0, 1, Funnel.DISK),
        UpdateWeightChunk(0),
        StartRequest(0, "r1", "P"),
        FinishWeightUpdate(0, None),
        ServeRequest(0, "P"),
    ]
    r = replay(engine, (Config(draft=True),), actions, Policy())
    assert r.kind == "PASS", r.violations


def test_f5_declared_misreporting_names_the_server_info_in_the_report():
    declared = Config(info=server_info(radix_cache_enabled=False), misreports=True)
    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, T, False), ServeRequest(0, "P")]
    r = replay(ReferenceEndpoint, (declared,), actions, Policy())
    assert r.kind == "FAIL"
    (v,) = [v for v in r.violations if v.rule == "INV-001"]
    assert "misreports the radix cache" in v.where and "radix_cache_enabled" in v.where


# ----- 1. a missing version label is not observed, not a lie ------------------------------


class NoLabel(ReferenceEndpoint):
    """An engine without a version label on its ``/weight_info`` (label ``None``)."""

    def weight_info(self) -> View:
        return evolve(super().weight_info(), label=None)


def test_an_engine_without_a_version_label_is_not_inv003():
    """Was INV-003 'expected 1, got None' after every update."""
    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, T, True), ServeRequest(0, "P")]
    r = replay(NoLabel, (STANDARD,), actions, Policy())
    assert r.kind == "PASS", [str(v) for v in r.violations]


def test_a_wrong_label_is_still_inv003():
    class StaleLabel(ReferenceEndpoint):
        def _install(self, version, funnel):
            super()._install(version, funnel)
            self.label = version - 1

    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, T, True)]
    assert "INV-003" in rules(replay(StaleLabel, (STANDARD,), actions, Policy()))


# ----- 2. abort-then-flush on an exact lane -----------------------------------------------


def test_abort_then_flush_on_an_exact_lane_passes():
    """Was FC-001: the refused mandatory flush was made possible by aborting the requests
    holding KV, then the flush ran; safe."""
    actions = [StartRequest(0, "r1", "P"), UpdateWeights(0, 1, T, False), ServeRequest(0, "P")]
    r = replay(AbortsThenFlushes, (EXACT,), actions)
    assert r.kind == "PASS", [str(v) for v in r.violations]
    assert r.run.lines[1]["observed"]["status"] == "ok"
    assert r.run.lines[2]["observed"]["response"]["hit"] is False


def test_abort_then_flush_after_a_retract_pause_and_an_injected_refusal_passes():
    """Was ENG-003: with retract pause nothing holds KV; the injected refusal of the first
    flush is met by aborting the retracted requests and flushing again."""
    actions = [
        StartRequest(0, "r1", "P"),
        PauseGeneration(0, PauseMode.RETRACT),
        FaultRefuseFlush(0),
        UpdateWeights(0, 1, T, False),
        ContinueGeneration(0),
        ServeRequest(0, "P"),
    ]
    r = replay(AbortsThenFlushes, (EXACT,), actions)
    assert r.kind == "PASS", [str(v) for v in r.violations]
    assert r.run.lines[3]["observed"]["status"] == "ok"


def test_an_update_that_aborts_but_keeps_the_stale_cache_still_fails():
    """The new branch is no blanket waiver: aborting and then not flushing is ENG-001."""

    class AbortsOnly(ReferenceEndpoint):
        def update_weights(self, version, funnel, flush_cache):
            self.requests.clear()
            self._install(version, funnel)
            return Reply(True)

    actions = [
        ServeRequest(0, "P"),
        StartRequest(0, "r1", "Q"),
        UpdateWeights(0, 1, T, False),
        ServeRequest(0, "P"),
    ]
    assert replay(AbortsOnly, (EXACT,), actions).kind == "FAIL"


# ----- 3. an always-flush engine may refuse an update it cannot flush for -----------------


def test_always_flush_rejecting_an_unflushable_opt_out_update_passes():
    """Was LIV-002: flush_cache=False while a request holds KV; the engine flushes on every
    update, cannot here, and rejects the update cleanly (nothing changed)."""
    actions = [
        StartRequest(0, "r1", "P"),
        UpdateWeights(0, 1, T, False),
        FinishRequest(0, "r1"),
        UpdateWeights(0, 1, T, False),
        ServeRequest(0, "P"),
    ]
    r = replay(AlwaysFlushes, (STANDARD,), actions)
    assert r.kind == "PASS", [str(v) for v in r.violations]
    assert [line["observed"]["status"] for line in r.run.lines[1:2]] == ["rejected"]
    assert r.run.lines[4]["observed"]["response"]["hit"] is False


def test_rejecting_every_update_is_allowed_but_never_a_pass(tmp_path):
    """A refused update that changed nothing is always allowed: no flush rule fires, and
    judging goes on to what the endpoint serves next. An engine that refuses every update
    still never PASSes: no update completes, so reuse after one (REACH-001) is never
    reached and the run is UNKNOWN, not PASS."""
    from kvfence.conformance.runner import run_check
    from kvfence.conformance.verdict import Verdict

    class RefusesUpdates(ReferenceEndpoint):
        def update_weights(self, version, funnel, flush_cache):
            return Reply(False, message="no")

    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, T, False), ServeRequest(0, "P")]
    assert rules(replay(RefusesUpdates, (STANDARD,), actions)) == set()
    engine = InProcessAdapter(RefusesUpdates, "refuses-every-update")
    result = run_check(engine, ReferenceClient(), out_dir=tmp_path, max_examples=40)
    assert result.verdict is not Verdict.PASS and not result.violations
    assert {r.rule.id: r.verdict for r in result.rules}["REACH-001"] is Verdict.UNKNOWN
