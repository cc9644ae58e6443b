"""A KV store shared by several endpoints: the vocabulary (``Config.store``, ``lineage``,
``kv_format``, ``State.store``, ``Response.stored``), what the spec lets a prefill load
(STO-001), the reference store endpoint (``adapters/store.py``), and the store deployment
of the explorer. The catalog's store mutant and designs are also in the catalog-wide
tests (tests/test_mutants.py, tests/test_designs.py, tests/test_cases.py)."""

from __future__ import annotations

import pytest
from conftest import after

from kvfence.adapters import registry
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.adapters.store import STORE_CONFIGS, StoreEndpoint
from kvfence.conformance.cli import main_explore
from kvfence.conformance.explore import deployment, explore_adapter
from kvfence.conformance.trace import config_from_json, config_json
from kvfence.model.actions import (
    FlushCache,
    Restart,
    ServeRequest,
    Sleep,
    StartRequest,
    SyncWeights,
    UpdateWeights,
)
from kvfence.model.capabilities import Capability
from kvfence.model.checks import compare
from kvfence.model.fast import evolve
from kvfence.model.rules import RuleId
from kvfence.model.semantics import enabled, step
from kvfence.model.state import Config, StoreEntry, initial_state
from kvfence.model.vocabulary import Funnel

BF16 = Config(store=True)
FP8 = Config(store=True, kv_format="fp8")
OTHER = Config(store=True, lineage="sft-b")
DISK = Funnel.DISK


# ----- vocabulary ---------------------------------------------------------------------------


def test_a_store_endpoint_is_one_plain_scheduler():
    with pytest.raises(ValueError, match=r"Config\.store with ranks"):
        Config(store=True, ranks=2)
    with pytest.raises(ValueError, match=r"Config\.store with draft"):
        Config(store=True, draft=True)
    s = initial_state((BF16,))
    assert s.store == frozenset() and initial_state((Config(),)).store == frozenset()
    assert not enabled(s, Sleep(0)) and not enabled(s, StartRequest(0, "r1", "P"))
    assert enabled(s, Restart(0)) and enabled(s, SyncWeights(1, DISK))


def test_config_fields_round_trip_and_stay_out_of_plain_traces():
    assert "store" not in config_json(Config())
    for c in (BF16, FP8, OTHER):
        assert config_from_json(config_json(c), "c") == c


# ----- the spec: what a prefill may load ----------------------------------------------------


def test_every_response_writes_its_entry_and_the_store_survives_restart_flush_update():
    s = after(initial_state((BF16, FP8)), ServeRequest(0, "P"))
    mine = StoreEntry("P", "base", 0, "bf16")
    assert s.store == {mine}
    s = after(s, Restart(0), FlushCache(0), UpdateWeights(0, 1, DISK, True))
    assert s.store == {mine}


def test_a_miss_may_load_only_the_entry_of_its_lineage_version_and_format():
    s = after(initial_state((BF16, FP8)), ServeRequest(0, "P"), Restart(0))
    branches = step(s, ServeRequest(0, "P"))
    loads = [o for _, o in branches if o.observation.response.hit]
    # the store's hit after the restart (and the device KV of the weights in force, which
    # the restart may have kept: the same hit, observed alike)
    assert loads and all(o.served.hit and o.served.weights == 0 for o in loads)
    assert any(not o.observation.response.hit for _, o in branches)  # or a cold prefill
    assert {o.observation.response.stored for _, o in branches} == {
        StoreEntry("P", "base", 0, "bf16")
    }
    # the fp8 endpoint may not load the bf16 entry: its only branch is a miss
    other = step(s, ServeRequest(1, "P"))
    assert [o.observation.response.hit for _, o in other] == [False]
    assert other[0][1].because.stored == RuleId.STO_001  # a wrong key would have matched
    # after an update, the v0 entry is no longer the endpoint's
    s2 = after(s, UpdateWeights(0, 1, DISK, True))
    assert [o.observation.response.hit for _, o in step(s2, ServeRequest(0, "P"))] == [False]


def test_a_load_of_another_entry_is_sto_001_and_only_with_the_capability():
    s = after(initial_state((BF16, FP8)), ServeRequest(0, "P"))
    _, outcome = step(s, ServeRequest(1, "P"))[0]
    wrong = StoreEntry("P", "base", 0, "bf16")
    got = evolve(
        outcome.observation,
        response=evolve(outcome.observation.response, hit=True, stored=wrong),
    )
    caps = frozenset({Capability.STORE})
    assert [v.rule for v in compare(outcome, got, caps)] == [RuleId.STO_001]
    assert compare(outcome, got, frozenset()) == []  # not shown: never judged
    right = evolve(got, response=evolve(got.response, stored=outcome.observation.response.stored))
    assert compare(outcome, right, caps) == []


# ----- the reference store endpoint ---------------------------------------------------------


def test_the_reference_engine_on_store_configs_shares_one_store_across_restarts():
    engine = InProcessAdapter(ReferenceEndpoint, "reference")
    engine.start((BF16, FP8))
    assert all(isinstance(ep, StoreEndpoint) for ep in engine.endpoints)
    assert engine.endpoints[0].store is engine.endpoints[1].store
    engine.apply(ServeRequest(0, "P"))
    engine.apply(Restart(0))
    again = engine.apply(ServeRequest(0, "P")).response
    assert again.hit and again.stored == StoreEntry("P", "base", 0, "bf16")
    other = engine.apply(ServeRequest(1, "P")).response
    assert not other.hit and other.stored is None  # another format: never matched


def test_the_keyed_store_runs_on_the_store_configs():
    """Its check at ci (PASS, STO-001 PASS with evidence) is its pass-matrix row:
    tests/test_designs.py::test_design_passes_at_ci[keys-store-by-weights]."""
    assert registry.engine("keys-store-by-weights").fixed_configs == STORE_CONFIGS


# ----- the explorer's store deployment ------------------------------------------------------


def test_the_store_model_state_count_is_pinned():
    """``kvfence explore --deployment store --depth 4`` at the CLI's other default bounds
    (one prefix, one request ID, versions <= 2, symmetry on): two standard endpoints of
    another lineage and KV format on one store. 4,199 orbits: requests on either endpoint,
    their updates, flushes, pauses and restarts, and the entries the store may hold; the
    count moves only with the store semantics, and with what an endpoint's own cache keeps
    across a flush or a restart (entries of the weights in force: a flush of only those
    leads back to a state already reached, 4,532 -> 4,199 orbits)."""
    code, text = main_explore(depth=4, workers=1, deployment_name="store")
    assert code == 0, text
    assert "distinct states: 4,199 up to symmetry" in text and "transitions: 25,422" in text
    assert "PASS" in text


def test_the_explorer_kills_the_token_keyed_store_with_sto_001():
    x = explore_adapter(
        registry.engine("store-keyed-by-tokens"),
        registry.client("reference"),
        focus=RuleId.STO_001,
        depth=4,
        out_dir=None,
        setups=deployment("store"),
    )
    assert RuleId.STO_001 in {v.rule for v in x.violation}
    assert len(x.trace) == 2  # endpoint 0 stores P, endpoint 1 (fp8, sft-b) loads it


def test_the_store_semantics_are_equivariant_under_renaming():
    """Renaming prefixes (which store entries carry) and swapping two endpoints of one
    config maps every successor onto a successor: the explorer's orbits stay sound with a
    store (states whose store holds entries, the fullest first). Lineages and KV formats are never
    prefix or request names here."""
    from kvfence.model.candidates import actions
    from kvfence.model.state import Bounds
    from kvfence.model.symmetry import canonical, images

    two = Bounds(prefixes=("P", "Q"), rids=("r1", "r2"))
    seen, todo = {initial_state((BF16, BF16))}, [initial_state((BF16, BF16))]
    for _ in range(2):
        todo = [n.without_ledger() for s in todo for a in actions(s, two) for n, _ in step(s, a)]
        todo = [s for s in todo if s not in seen and not seen.add(s)]
    states = sorted((s for s in seen if s.store), key=lambda s: -len(s.store))[:8]
    assert len(states) == 8 and len(states[0].store) > 1

    def successors(s):
        return {canonical(n.without_ledger(), two) for a in actions(s, two) for n, _ in step(s, a)}

    for s in states:
        want = successors(s)
        for image in images(s, two):
            assert successors(image) == want
