"""The restart oracle's findings are named by the mechanism that differs, whatever the
endpoint's config could also hide (``checks.restart_mechanism``): label vs weights
(INV-003), torn weights after a failed update (FC-004), a stale draft (ENG-004), derived
state (DER-001), stale KV behind a reported miss (INV-001). Each engine below is caught by
the restart oracle alone (the probes that would name it first are taken away), on a config
with derived state, where the config alone would name every such finding DER-001."""

from __future__ import annotations

from kvfence.adapters.mutants import (
    BucketFailureKeepsServing,
    DerivedHiddenSkippedOnTensorFunnel,
    DraftLeftBehindOnDistributed,
    RelabelWithoutLoading,
    UpdateNeverFlushes,
)
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.adapters.registry import client
from kvfence.conformance.replay import replay_actions
from kvfence.model.actions import FaultUpdateFailsMidway, ServeRequest, UpdateWeights
from kvfence.model.capabilities import Capability as C
from kvfence.model.state import Config, Policy
from kvfence.model.vocabulary import Funnel

DERIVED = Config(derived=True)
# What a blind engine shows: responses with their restart-oracle bytes, nothing probed.
BLIND = {C.WEIGHTS_PROBE, C.CACHE_PROBE, C.PROVENANCE, C.ATTRIBUTION, C.FLUSH_RESULT}


def replay(cls, configs, actions, drop=BLIND):
    adapter = InProcessAdapter(cls, "under-test")
    adapter.capabilities = adapter.capabilities - set(drop)
    return replay_actions(adapter, client("reference"), configs, Policy(), actions)


def rules(result):
    assert result.kind == "FAIL", [str(v) for v in result.violations]
    assert all("response.fresh" in v.where for v in result.violations), result.violations
    return [v.rule for v in result.violations]


def test_label_vs_weights_is_inv_003_on_a_derived_config():
    """The relabelling engine computes whole v0 weights under a v1 label: its bytes are the
    oracle's own for v0."""
    trace = [ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.TENSOR, True), ServeRequest(0, "P")]
    assert rules(replay(RelabelWithoutLoading, (DERIVED,), trace)) == ["INV-003"]


class TornKeepsLabel(BucketFailureKeepsServing):
    """PF-27's engine whose abort also restores the old label from the staging state: it
    claims a rollback it did not make (a test engine, not catalogued)."""

    def fail_update_midway(self, version):
        label = self.label
        reply = super().fail_update_midway(version)
        self.label = label
        return reply


def test_torn_weights_after_a_failed_update_are_fc_004(monkeypatch):
    """A bucket failed, the engine reports failure and keeps serving on the mixed weights
    under its old label (PF-27); with no weights probe only the restart oracle shows it.
    The model keeps two branches (rolled back, or torn and closed); the restart oracle
    judges the rolled-back one, so every branch's findings are read, not only the one the
    report explains with."""
    from kvfence.conformance import lockstep

    seen = []
    explain = lockstep.explanation
    monkeypatch.setattr(
        lockstep, "explanation", lambda candidates: seen.extend(candidates) or explain(candidates)
    )
    trace = [FaultUpdateFailsMidway(0, 1), ServeRequest(0, "P")]
    assert [v.rule for v in replay(TornKeepsLabel, (DERIVED,), trace).violations] == ["FC-004"]
    restart = [v.rule for vs in seen for v in vs if v.where.endswith("response.fresh")]
    assert restart == ["FC-004"], seen


def test_a_stale_draft_is_eng_004():
    trace = [UpdateWeights(0, 1, Funnel.DISTRIBUTED, True), ServeRequest(0, "P")]
    configs = (Config(draft=True, derived=True),)
    assert rules(replay(DraftLeftBehindOnDistributed, configs, trace)) == ["ENG-004"]


def test_derived_state_left_behind_is_der_001():
    trace = [UpdateWeights(0, 1, Funnel.TENSOR, True), ServeRequest(0, "Q")]
    assert rules(replay(DerivedHiddenSkippedOnTensorFunnel, (DERIVED,), trace)) == ["DER-001"]


class StaleHitReportedAsMiss(UpdateNeverFlushes):
    """Never flushes, and reports every hit as a miss: the stale KV shows only in the
    response's bytes (a test engine, not catalogued)."""

    def generate(self, prefix, lora=False, namespace=None):
        reply = super().generate(prefix, lora, namespace)
        reply.hit = False
        return reply


def test_stale_kv_behind_a_reported_miss_is_inv_001():
    """With no cold prefill to separate the computation from its KV, a reported miss whose
    bytes differ, on a prefix computed under the old weights, is stale reuse."""
    trace = [ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.TENSOR, True), ServeRequest(0, "P")]
    drop = BLIND | {C.BYTE_ORACLE}
    assert rules(replay(StaleHitReportedAsMiss, (DERIVED,), trace, drop)) == ["INV-001"]


def test_the_reference_passes_every_trace_above_blind():
    for configs, trace in (
        ((DERIVED,), [ServeRequest(0, "P"), FaultUpdateFailsMidway(0, 1), ServeRequest(0, "P")]),
        (
            (Config(draft=True, derived=True),),
            [UpdateWeights(0, 1, Funnel.DISTRIBUTED, True), ServeRequest(0, "P")],
        ),
        (
            (DERIVED,),
            [ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.TENSOR, True), ServeRequest(0, "P")],
        ),
    ):
        got = replay(ReferenceEndpoint, configs, trace, BLIND | {C.BYTE_ORACLE})
        assert got.kind == "PASS", [str(v) for v in got.violations]
