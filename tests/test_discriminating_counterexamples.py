"""A counterexample discriminates: the reference counterpart (the reference engine with the
same client, same configs and policy) passes it, so it shows a fault of the system under
test. A shrink step whose result the reference also fails is rejected."""

from __future__ import annotations

from kvfence.adapters import registry
from kvfence.adapters.mutants import UpdateNeverFlushes
from kvfence.adapters.reference import InProcessAdapter
from kvfence.conformance.replay import reference_contrast, replay_actions, shrink
from kvfence.model.actions import ServeRequest, SyncWeights
from kvfence.model.capabilities import Capability
from kvfence.model.rules import RuleId
from kvfence.model.state import Config, Policy
from kvfence.model.vocabulary import Funnel, Lane

CONFIGS = (Config(lane=Lane.EXACT), Config())
ACTIONS = [
    ServeRequest(0, "P"),
    ServeRequest(1, "P"),
    SyncWeights(1, Funnel.TENSOR),
    ServeRequest(0, "P"),  # the engine's fault: stale KV on the exact lane
    ServeRequest(1, "P"),  # the client's: it skipped the flush the standard lane needed
]


def _blind_engine() -> InProcessAdapter:
    """An engine that never flushes, seen without a cache listing: its fault shows only as
    stale reuse (INV-001), the rule a faulty client's consequence also breaks."""
    engine = InProcessAdapter(UpdateNeverFlushes, "update-never-flushes-unlisted")
    engine.capabilities = engine.capabilities - {Capability.CACHE_PROBE}
    return engine


def _fails_on_reference(replayed) -> bool:
    engine, client = registry.engine("reference"), registry.client("never-flush")
    r = replay_actions(
        engine, client, replayed.run.configs, replayed.run.policy, replayed.run.actions
    )
    return RuleId.INV_001 in {v.rule for v in r.hard}


def test_a_shrink_that_keeps_only_the_clients_fault_is_rejected():
    engine, client = _blind_engine(), registry.client("never-flush")
    found = replay_actions(engine, client, CONFIGS, Policy(), list(ACTIONS))
    assert found.kind == "FAIL"
    assert [v.where for v in found.hard] == ["endpoint 0 prefix P"]  # the exact-lane serve
    assert not _fails_on_reference(found)  # what the search found discriminates
    # Without the contrast the shrinker keeps any stale hit: the client's, on the standard
    # lane, which the reference engine shows as well.
    plain = shrink(engine, client, found.run, {RuleId.INV_001}, True)
    assert plain is not None and _fails_on_reference(plain)
    # With it, every step it takes keeps the engine's own fault.
    contrast = reference_contrast(engine, client)
    assert contrast is not None and contrast[0].name == "reference" and contrast[1] is client
    best = shrink(engine, client, found.run, {RuleId.INV_001}, True, contrast=contrast)
    assert best is not None and RuleId.INV_001 in {v.rule for v in best.hard}
    assert not _fails_on_reference(best)
    assert len(best.run.actions) < len(ACTIONS)


def test_the_reference_has_no_contrast_and_a_client_is_contrasted_with_the_reference_client():
    ref_engine, ref_client = registry.engine("reference"), registry.client("reference")
    assert reference_contrast(ref_engine, ref_client) is None
    client = registry.client("never-flush")
    engine, contrast_client = reference_contrast(ref_engine, client)
    assert engine is ref_engine and contrast_client.name == "reference"


def test_a_client_rule_is_contrasted_with_the_reference_client_on_the_same_engine():
    """A CLI rule judges the client: its counterexample must pass with the reference client
    on the engine it ran on (an engine profile that leaves a cache kind to the client would
    fail the faulty client's trace with the reference engine too, and the shrink would be
    rejected at every step)."""
    engine, client = registry.engine("encoder-left-to-client"), registry.client("never-flush")
    same, reference = reference_contrast(engine, client, {RuleId.CLI_009})
    assert same is engine and reference.name == "reference"
    other, kept = reference_contrast(engine, client, {RuleId.INV_001})
    assert other.name == "reference" and kept is client
