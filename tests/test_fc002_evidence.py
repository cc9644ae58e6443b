"""FC-002's evidence comes only from what could tell its branches apart: "refused before
install, old weights and cache kept" and "installed, failed, kept serving the stale tree"
differ by the weights in force, which hit counts, flush results and requests in flight do
not show."""

from __future__ import annotations

from kvfence.adapters import registry
from kvfence.adapters.mutants import ServesAfterFailedFlush
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.conformance.runner import run_check
from kvfence.model.capabilities import Capability as C
from kvfence.model.checks import ColdBytes, tells_installed_apart
from kvfence.model.observation import Observation, Response, View
from kvfence.model.rules import RuleId
from kvfence.model.vocabulary import Status

HIT_COUNTS_ONLY = frozenset({C.INFLIGHT, C.FLUSH_RESULT, C.FAULTS, C.PAUSE})


def hostile(cls, name):
    engine = InProcessAdapter(cls, name)
    engine.capabilities = HIT_COUNTS_ONLY  # hit counts, flush results, requests in flight
    return engine


def fc002(result):
    return {r.rule.id: r for r in result.rules}[RuleId.FC_002]


def test_hit_counts_cannot_settle_fc002():
    obs = Observation(Status.OK, response=Response(hit=True), flushed=False)
    assert not tells_installed_apart(obs, HIT_COUNTS_ONLY, ColdBytes())
    probed = Observation(Status.OK, view=View(weights=1))
    assert tells_installed_apart(probed, {C.WEIGHTS_PROBE}, ColdBytes())
    assert not tells_installed_apart(probed, HIT_COUNTS_ONLY, ColdBytes())


def test_a_system_serving_after_a_failed_flush_is_unknown_not_pass(out_dir):
    result = run_check(
        hostile(ServesAfterFailedFlush, "serves-after-failed-flush"),
        registry.client("reference"),
        max_examples=150,
        out_dir=out_dir,
    )
    rule = fc002(result)
    assert rule.verdict == "UNKNOWN", rule
    assert "what the update installed" in rule.reason
    assert result.verdict != "PASS"


def test_the_reference_with_hit_counts_only_is_unknown_too(out_dir):
    result = run_check(
        hostile(ReferenceEndpoint, "reference-hit-counts"),
        registry.client("reference"),
        max_examples=150,
        out_dir=out_dir,
    )
    assert fc002(result).verdict == "UNKNOWN"


def test_a_weights_probe_gives_fc002_evidence(out_dir):
    result = run_check(
        registry.engine("reference"),
        registry.client("reference"),
        max_examples=150,
        out_dir=out_dir,
    )
    rule = fc002(result)
    assert rule.verdict == "PASS" and rule.evidence > 0, rule
