"""Trust fixes found by adversarial and new-user trials: each test reproduces one finding
(it failed on main at 1f24e52) and shows the fix.

False FAILs (a correct system failed), a false PASS (few capabilities, MUST rules SKIP), and
the CLI's exit codes and messages a new user met.
"""

from __future__ import annotations

from attrs import evolve

from kvfence.adapters.clients import ReferenceClient
from kvfence.adapters.designs import AbortsThenFlushes, AlwaysFlushes
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint, Reply
from kvfence.conformance.replay import replay_actions
from kvfence.model.actions import (
    ContinueGeneration,
    FaultRefuseFlush,
    FinishRequest,
    PauseGeneration,
    ServeRequest,
    StartRequest,
    UpdateWeights,
)
from kvfence.model.observation import View
from kvfence.model.state import Config, Policy
from kvfence.model.vocabulary import CacheMode, Funnel, Lane, PauseMode

T = Funnel.TENSOR
EXACT = Config(lane=Lane.EXACT)
STANDARD = Config()
OPT_OUT = Policy(mode=CacheMode.NONE)


def replay(cls, configs, actions, policy=OPT_OUT):
    engine = InProcessAdapter(cls, cls.__name__)
    return replay_actions(engine, ReferenceClient(), configs, policy, actions)


def rules(result) -> set[str]:
    return {v.rule for v in result.violations}


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


def test_rejecting_an_update_that_holds_nothing_is_still_liv002():
    """The branch exists only where the extra flush could not run: a refusal with nothing
    holding KV is LIV-002 as before."""

    class RefusesUpdates(ReferenceEndpoint):
        def update_weights(self, version, funnel, flush_cache):
            return Reply(False, message="no")

    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, T, False)]
    assert "LIV-002" in rules(replay(RefusesUpdates, (STANDARD,), actions))
