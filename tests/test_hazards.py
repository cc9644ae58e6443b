"""The latent hazards (``model.hazards``): each predicate holds on a state the model reaches
where its faults are one event away, and not on the state just before or after it; the
table cites public faults of the catalogue and names only action types that exist."""

from __future__ import annotations

import pytest
from model_steps import go

from kvfence.adapters.cases import CASES
from kvfence.adapters.mutants import MUTANTS
from kvfence.model import hazards
from kvfence.model import semantics as spec
from kvfence.model.actions import (
    ACTION_TYPES,
    AbortWeightUpdate,
    BeginWeightUpdate,
    ContinueGeneration,
    EvictPrefix,
    FaultRefuseFlush,
    FaultUpdateFailsMidway,
    FlushCache,
    PauseGeneration,
    ServeRequest,
    Sleep,
    StartRequest,
    SyncWeights,
    UpdateWeightChunk,
    UpdateWeights,
    WakeUp,
)
from kvfence.model.state import Config, Policy, initial_state
from kvfence.model.vocabulary import Funnel, PauseMode, Tier

TIERED = Config(tiers=frozenset({Tier.DEVICE, Tier.HOST}))


def last(state, action):
    """``state`` after ``action`` on the model's last branch (a fault's worst one)."""
    branches = spec.step(state, action)
    assert branches, f"{action!r} not enabled"
    return branches[-1][0]


def on(configs=(Config(),), policy=Policy()):
    return initial_state(configs, policy)


# (predicate, a state that holds it on endpoint 0, the same run one step short or past it)
CASES_OF: dict[str, tuple] = {
    "lower-tier KV": (
        hazards.lower_tier_kv,
        lambda: go(on((TIERED,)), ServeRequest(0, "P"), EvictPrefix(0, "P", Tier.HOST)),
        lambda: go(on((TIERED,)), ServeRequest(0, "P")),  # device KV only
    ),
    "KV released": (
        hazards.kv_released,
        lambda: go(on(), ServeRequest(0, "P"), Sleep(0)),
        lambda: go(on(), ServeRequest(0, "P"), Sleep(0), WakeUp(0)),
    ),
    "open window": (
        hazards.open_window,
        lambda: go(on(), BeginWeightUpdate(0, 1)),
        lambda: go(on(), BeginWeightUpdate(0, 1), AbortWeightUpdate(0)),
    ),
    "held in place": (
        hazards.held_in_place,
        lambda: go(on(), StartRequest(0, "r1", "P"), PauseGeneration(0, PauseMode.IN_PLACE)),
        # a retracting pause frees the request's KV: nothing is held in place
        lambda: go(on(), StartRequest(0, "r1", "P"), PauseGeneration(0, PauseMode.RETRACT)),
    ),
    "torn or mixed": (
        hazards.torn_or_mixed,
        lambda: last(go(on(), ServeRequest(0, "P")), FaultUpdateFailsMidway(0, 1)),
        lambda: go(on(), ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.TENSOR, True)),
    ),
    "refused flush pending": (
        hazards.refused_flush_pending,
        lambda: go(on(), FaultRefuseFlush(0)),
        lambda: go(on(), FaultRefuseFlush(0), FlushCache(0)),  # the refusal is consumed
    ),
}


def test_every_hazard_has_a_unit_case():
    assert set(CASES_OF) == set(hazards.BY_NAME)
    assert [h.name for h in hazards.HAZARDS] == list(hazards.BY_NAME)


@pytest.mark.parametrize("name", list(CASES_OF))
def test_hazard_holds_where_its_fault_is_one_event_away(name):
    predicate, holding, not_holding = CASES_OF[name]
    hazard = hazards.BY_NAME[name]
    assert hazard.holds is predicate
    yes, no = holding(), not_holding()
    assert predicate(yes.endpoint(0)) and not predicate(no.endpoint(0))
    assert hazards.endpoints_holding(hazard, [yes]) == frozenset({0})
    assert hazards.endpoints_holding(hazard, [no]) == frozenset()
    # held where any candidate state holds it: the system may be in that one
    assert hazards.endpoints_holding(hazard, [no, yes]) == frozenset({0})
    assert (hazard, 0) in hazards.hazards_held([yes])
    assert hazard not in {h for h, _ in hazards.hazards_held([no])}


def test_a_mixed_window_is_torn_or_mixed_and_open():
    s = last(go(on(), ServeRequest(0, "P"), BeginWeightUpdate(0, 1)), UpdateWeightChunk(0))
    held = {h.name for h, i in hazards.hazards_held([s]) if i == 0}
    assert {"open window", "torn or mixed"} <= held


def test_a_hazard_is_held_per_endpoint():
    s = go(on((Config(), TIERED)), ServeRequest(1, "P"), EvictPrefix(1, "P", Tier.HOST))
    tier = hazards.BY_NAME["lower-tier KV"]
    assert hazards.endpoints_holding(tier, [s]) == frozenset({1})
    assert hazards.hazards_held([]) == ()


def test_meets_the_hazard_on_its_endpoint_or_by_a_sync():
    tier = hazards.BY_NAME["lower-tier KV"]
    assert hazards.meets(tier, 1, FlushCache(1))
    assert not hazards.meets(tier, 1, FlushCache(0))  # another endpoint
    assert hazards.meets(tier, 1, SyncWeights(1))  # a sync reaches every endpoint
    assert not hazards.meets(tier, 1, EvictPrefix(1, "P", Tier.STORAGE))  # not an event of it
    held = hazards.BY_NAME["held in place"]
    assert not hazards.meets(held, 0, ContinueGeneration(0))  # ends it without meeting it


def test_every_hazard_mirrors_a_catalogued_fault_and_names_real_actions():
    known = {c.id for c in CASES} | {m.name for m in MUTANTS}
    for h in hazards.HAZARDS:
        assert h.mirrors and set(h.mirrors) <= known, h.name
        assert h.met_by and h.met_by <= set(ACTION_TYPES), h.name
        assert h.holds.__doc__, h.name
        assert all(pf in h.holds.__doc__ for pf in h.mirrors if pf.startswith("PF-")), h.name
