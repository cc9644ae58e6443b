"""Prefill/decode deployments: the vocabulary (``Config.role``, live transfers), what the
spec allows a request and a flush there (PD-001, and FC-005's idle gate for live
transfers), the reference P/D engines (``adapters/pd.py``), the live-KV naming (a flush that
frees KV a live transfer holds is FC-005's, never FC-003's: its report is true), and the pd
deployment of the explorer. The
catalog's P/D mutants and designs are also in the catalog-wide tests
(tests/test_mutants.py, tests/test_designs.py, tests/test_cases.py)."""

from __future__ import annotations

import pytest
from conftest import after

from kvfence.adapters import registry
from kvfence.adapters.pd import PD_CONFIGS, DecodeEndpoint, PrefillEndpoint
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.conformance.cli import main_explore
from kvfence.conformance.explore import deployment, explore_adapter
from kvfence.conformance.replay import replay_actions
from kvfence.conformance.runner import run_check
from kvfence.conformance.trace import config_from_json, config_json
from kvfence.model.actions import (
    FinishRequest,
    FlushCache,
    PauseGeneration,
    Restart,
    ServeRequest,
    Sleep,
    StartRequest,
    SyncWeights,
    UpdateWeights,
)
from kvfence.model.rules import RuleId
from kvfence.model.semantics import enabled, step, transfers
from kvfence.model.state import Config, Policy, initial_state
from kvfence.model.vocabulary import Funnel, PauseMode, Role, Status

P, D = PD_CONFIGS
DISK = Funnel.DISK


def _statuses(state, action):
    return [(o.observation.status, o.because.status) for _, o in step(state, action)]


def _gates(state, action):
    return [(o.observation.status, o.gate) for _, o in step(state, action)]


# ----- vocabulary ---------------------------------------------------------------------------


def test_a_role_endpoint_is_one_plain_scheduler_and_decode_has_no_tree_of_its_own():
    assert P.role is Role.PREFILL and D.role is Role.DECODE and Config().role is None
    with pytest.raises(ValueError, match=r"Config\.role=decode with radix"):
        Config(role=Role.DECODE)
    with pytest.raises(ValueError, match=r"Config\.role=prefill with ranks"):
        Config(role=Role.PREFILL, ranks=2)
    with pytest.raises(ValueError, match="the exact lane"):
        Config(role="prefill", lane="exact")
    s = initial_state((P, D))
    assert s.prefill_index() == 0 and initial_state((Config(),)).prefill_index() is None
    # requests go to the decode engine; the prefill engine takes none of its own
    assert enabled(s, ServeRequest(1, "P")) and not enabled(s, ServeRequest(0, "P"))
    assert not enabled(s, Sleep(0)) and not enabled(s, Restart(1))
    assert enabled(s, SyncWeights(1, DISK))
    # while the prefill engine is paused the decode engine admits nothing
    paused = after(s, PauseGeneration(0, PauseMode.RETRACT))
    assert not enabled(paused, ServeRequest(1, "P"))


def test_config_fields_round_trip_and_stay_out_of_plain_traces():
    assert "role" not in config_json(Config())
    for c in PD_CONFIGS:
        assert config_from_json(config_json(c), "c") == c


# ----- the spec: PD-001 ----------------------------------------------------------------------


def test_a_request_is_prefilled_on_p_and_served_by_d_at_one_version():
    s = initial_state((P, D))
    ((s1, o),) = [b for b in step(s, ServeRequest(1, "P"))]
    assert o.observation.status is Status.OK and o.served.endpoint == 1
    assert s1.endpoint(0).cache and not s1.endpoint(1).cache  # P's tree holds the KV
    # a hit on P's tree at the same version is served
    hits = [o for _, o in step(s1, ServeRequest(1, "P")) if o.observation.response.hit]
    assert hits and {u.version for u in hits[0].served.uses} == {0}


def test_at_two_versions_a_request_is_refused_by_pd_001_before_or_after_the_prefill():
    s = after(initial_state((P, D)), UpdateWeights(1, 1, DISK, True))
    branches = step(s, ServeRequest(1, "P"))
    assert {(o.observation.status, o.because.status) for _, o in branches} == {
        (Status.REJECTED, RuleId.PD_001)
    }
    # the prefill side may have run first (a handshake after the transfer) or not
    assert {bool(s2.endpoint(0).cache) for s2, _ in branches} == {False, True}


def test_a_live_transfer_outdated_by_an_update_on_the_decode_side_is_aborted():
    s = after(initial_state((P, D)), StartRequest(1, "r1", "P"), UpdateWeights(1, 1, DISK, False))
    ((_, o),) = step(s, FinishRequest(1, "r1"))
    assert o.observation.status is Status.REJECTED and o.because.status == RuleId.PD_001
    assert o.observation.aborted == frozenset({"r1"})
    # at one version the live request finishes as any
    fresh = after(initial_state((P, D)), StartRequest(1, "r1", "P"))
    assert [o.observation.status for _, o in step(fresh, FinishRequest(1, "r1"))] == [Status.OK]


# ----- the spec: FC-005 on a live transfer, and the live-KV naming -------------------------


def test_a_live_transfer_holds_the_prefill_side_kv():
    s = after(initial_state((P, D)), StartRequest(1, "r1", "P"))
    assert [r.rid for r in transfers(s)] == ["r1"] and s.endpoint(0).requests == ()
    assert _gates(s, FlushCache(0)) == [(Status.REJECTED, RuleId.FC_005)]
    # an update whose flush is required fails while it lives, each refusal the gate's
    refusals = [st for st in _gates(s, UpdateWeights(0, 1, DISK, True)) if st[1] is not None]
    assert refusals and all(st == (Status.REJECTED, RuleId.FC_005) for st in refusals)
    # no state the model reaches puts a phantom request on the prefill side
    assert all(s2.endpoint(0).requests == () for s2, _ in step(s, UpdateWeights(0, 1, DISK, True)))
    # a retract frees the transfer's KV: the flush may run
    retracted = after(s, PauseGeneration(1, PauseMode.RETRACT))
    assert transfers(retracted) == ()
    assert [st[0] for st in _statuses(retracted, FlushCache(0))] == [Status.OK]


def test_a_flush_that_frees_a_live_transfer_is_fc_005_and_not_fc_003():
    """PF-30's naming: the flush's report is true (it emptied the tree), so the rule it
    breaks is the idle gate's (FC-005). A checker that named the report (FC-003) fails
    here."""
    r = replay_actions(
        registry.engine("flush-frees-live-transfer"),
        registry.client("reference"),
        PD_CONFIGS,
        Policy(),
        [StartRequest(1, "r1", "P"), FlushCache(0)],
    )
    assert r.kind == "FAIL"
    rules = {v.rule for v in r.violations}
    assert rules == {RuleId.FC_005}, rules
    assert RuleId.FC_003 not in rules


# ----- the reference P/D engines -------------------------------------------------------------


def test_the_reference_engine_on_pd_configs_runs_the_reference_roles():
    engine = InProcessAdapter(ReferenceEndpoint, "reference")
    engine.start(PD_CONFIGS)
    p, d = engine.endpoints
    assert type(p) is PrefillEndpoint and type(d) is DecodeEndpoint and d.prefill is p
    assert engine.apply(StartRequest(1, "r1", "P")).status is Status.OK
    assert p.transfers == {"r1"}
    assert engine.apply(FlushCache(0)).status is Status.REJECTED
    assert engine.apply(FinishRequest(1, "r1")).status is Status.OK and p.transfers == set()
    assert engine.apply(UpdateWeights(1, 1, DISK, True)).status is Status.OK
    assert engine.apply(ServeRequest(1, "P")).status is Status.REJECTED  # v0 KV at v1
    assert engine.apply(UpdateWeights(0, 1, DISK, True)).status is Status.OK
    served = engine.apply(ServeRequest(1, "P"))
    assert served.status is Status.OK and {u.version for u in served.response.uses} == {1}


def test_the_reference_pd_engine_passes_at_ci_with_evidence_for_both_rules(out_dir):
    engine = registry.engine("checks-transferred-kv-version")
    assert engine.fixed_configs == PD_CONFIGS
    result = run_check(engine, registry.client("reference"), out_dir=out_dir, battery=False)
    assert result.verdict == "PASS", [(r.rule.id, r.verdict, r.reason) for r in result.rules]
    verdicts = {r.rule.id: r for r in result.rules}
    for rule in ("PD-001", "FC-005"):
        assert verdicts[rule].verdict == "PASS" and verdicts[rule].evidence > 0, rule


# ----- the explorer's pd deployment ----------------------------------------------------------


def test_the_pd_model_state_count_is_pinned():
    """``kvfence explore --deployment pd --depth 4`` at the CLI's other default bounds
    (one prefix, one request ID, versions <= 2, symmetry on): a prefill and a decode
    engine. 3,436 states: requests and live transfers on the decode side, each side's
    updates, flushes, pauses and continues; the count moves only with the P/D semantics.
    (At the CLI's default depth 6: 7,345 states, about 30 s on two cores.)"""
    code, text = main_explore(depth=4, workers=1, deployment_name="pd")
    assert code == 0, text
    assert "distinct states: 3,436 up to symmetry" in text and "transitions: 29,536" in text
    assert "PASS" in text


@pytest.mark.parametrize(
    ("mutant", "rule"),
    [
        ("decode-serves-any-kv-version", RuleId.PD_001),
        ("flush-frees-live-transfer", RuleId.FC_005),
    ],
)
def test_the_explorer_kills_each_pd_mutant_with_its_rule(mutant, rule):
    x = explore_adapter(
        registry.engine(mutant),
        registry.client("reference"),
        focus=rule,
        depth=4,
        out_dir=None,
        setups=deployment("pd"),
    )
    assert {v.rule for v in x.violation} == {rule}, x.violation
    assert len(x.trace) == 2


def test_the_pd_semantics_are_equivariant_under_renaming():
    """Renaming prefixes and request IDs (which live transfers carry) maps every successor
    onto a successor: the explorer's orbits stay sound on a P/D deployment (its two
    endpoints differ in role, so they are never swapped), on states with live transfers."""
    from kvfence.model.candidates import actions
    from kvfence.model.state import Bounds
    from kvfence.model.symmetry import canonical, images

    two = Bounds(prefixes=("P", "Q"), rids=("r1", "r2"))
    start = initial_state((P, D))
    seen, todo = {start}, [start]
    for _ in range(2):
        todo = [n.without_ledger() for s in todo for a in actions(s, two) for n, _ in step(s, a)]
        todo = [s for s in todo if s not in seen and not seen.add(s)]
    states = sorted((s for s in seen if transfers(s)), key=lambda s: -len(transfers(s)))[:8]
    assert len(states) == 8 and len(transfers(states[0])) > 1

    def successors(s):
        return {canonical(n.without_ledger(), two) for a in actions(s, two) for n, _ in step(s, a)}

    for s in states:
        want = successors(s)
        for image in images(s, two):
            assert successors(image) == want
