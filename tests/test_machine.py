"""The stateful machine's draw: steered to an endpoint that holds a latent hazard
(``machine.hazard_steered``, ``model.hazards``), with the plain draw at choice 0, and
unchanged where no hazard is held."""

from __future__ import annotations

from hypothesis import given

from kvfence.adapters import registry
from kvfence.adapters.clients import ReferenceClient
from kvfence.conformance import strategies
from kvfence.conformance.lockstep import NEEDS, Lockstep, enabled_pool
from kvfence.conformance.machine import DRAW_FREQUENCY, HAZARD_FREQUENCY, hazard_steered
from kvfence.conformance.record import Recorder
from kvfence.model.actions import (
    EvictPrefix,
    FaultRefuseFlush,
    ServeRequest,
    StartRequest,
    SyncWeights,
)
from kvfence.model.capabilities import Capability
from kvfence.model.hazards import BY_NAME, HAZARDS, hazards_held
from kvfence.model.state import Config, Policy
from kvfence.model.vocabulary import Tier

TIERED = Config(tiers=frozenset({Tier.DEVICE, Tier.HOST}))


class Draws:
    """A stand-in for Hypothesis's ``data``: answers each draw from ``answers`` in turn and
    records the labels; no answers left is a draw nobody expected."""

    def __init__(self, *answers: int) -> None:
        self.answers = list(answers)
        self.labels: list[str | None] = []

    def draw(self, strategy, label: str | None = None):
        if not self.answers:
            raise AssertionError(f"unexpected draw {label!r}")
        self.labels.append(label)
        return self.answers.pop(0)


def _lockstep() -> Lockstep:
    step = Lockstep(registry.engine("reference"), ReferenceClient(), Recorder())
    step.start((Config(), TIERED), Policy())
    return step


def test_no_hazard_draws_nothing_extra():
    step = _lockstep()
    step.run(ServeRequest(1, "P"))  # device KV only: nothing to steer to
    assert hazards_held(step.states) == ()
    pool, hazard = hazard_steered(step, Draws())  # Draws() fails on any draw
    assert pool == step.enabled_actions() and hazard is None


def test_lower_tier_kv_steers_to_its_endpoint():
    step = _lockstep()
    step.run(ServeRequest(1, "P"))
    step.run(ServeRequest(0, "P"))
    step.run(EvictPrefix(1, "P", Tier.HOST))
    assert hazards_held(step.states) == ((BY_NAME["lower-tier KV"], 1),)
    enabled = step.enabled_actions()
    assert any(getattr(a, "endpoint", None) == 0 for a in enabled)
    data = Draws(3)
    pool, hazard = hazard_steered(step, data)
    assert hazard is BY_NAME["lower-tier KV"] and data.labels == ["steer to a hazard"]
    assert pool and all(a in enabled for a in pool)
    assert {getattr(a, "endpoint", 1) for a in pool} == {1}  # its endpoint, and the syncs
    assert any(isinstance(a, SyncWeights) for a in pool)


def test_choice_zero_is_the_plain_draw():
    """Where a shrink goes: the integer 0 of the steering draw keeps every enabled action
    and no hazard's weights, so a shrunk counterexample needs no steering to replay."""
    step = _lockstep()
    step.run(ServeRequest(1, "P"))
    step.run(EvictPrefix(1, "P", Tier.HOST))
    data = Draws(0)
    pool, hazard = hazard_steered(step, data)
    assert pool == step.enabled_actions() and hazard is None
    assert data.labels == ["steer to a hazard"]


def test_several_hazards_draw_which_one():
    step = _lockstep()
    step.run(ServeRequest(1, "P"))
    step.run(EvictPrefix(1, "P", Tier.HOST))
    step.run(FaultRefuseFlush(0))
    held = hazards_held(step.states)
    assert held == ((BY_NAME["lower-tier KV"], 1), (BY_NAME["refused flush pending"], 0))
    data = Draws(1, 1)
    pool, hazard = hazard_steered(step, data)
    assert data.labels == ["steer to a hazard", "hazard"]
    assert hazard is BY_NAME["refused flush pending"]
    assert {getattr(a, "endpoint", 0) for a in pool} == {0}


def test_a_request_in_flight_keeps_the_steered_pool_to_what_is_enabled():
    step = _lockstep()
    step.run(ServeRequest(1, "P"))
    step.run(EvictPrefix(1, "P", Tier.HOST))
    step.run(StartRequest(1, "r1", "Q"))
    pool, _ = hazard_steered(step, Draws(2))
    assert set(pool) <= set(step.enabled_actions())


def test_hazard_weights_name_every_hazard_and_only_drawn_types():
    assert list(HAZARD_FREQUENCY) == [h.name for h in HAZARDS]
    for h in HAZARDS:
        weights = HAZARD_FREQUENCY[h.name]
        assert set(weights) <= {k for k, n in DRAW_FREQUENCY.items() if n}, h.name
        assert all(w >= 1 for w in weights.values()), h.name
        # the heaviest weights go to events that meet the hazard
        top = max(weights.values())
        assert any(k in h.met_by for k, w in weights.items() if w == top), h.name


NO_TIERS = frozenset(Capability) - {Capability.TIERS}


@given(strategies.configs(NO_TIERS))
def test_an_engine_without_tiers_never_holds_lower_tier_kv(configs):
    """Why the draw is unchanged for vLLM and any engine that does not declare ``tiers``:
    no config it is given has a lower tier, and no EvictPrefix is drawn for it."""
    assert all(c.tiers == frozenset({Tier.DEVICE}) for c in configs)
    assert NEEDS[EvictPrefix] is Capability.TIERS


def test_vllm_declares_no_tiers():
    """The vLLM adapter (offline and HTTP) draws from this machine: without ``tiers`` it is
    never steered to lower-tier KV."""
    from kvfence.adapters import vllm_engine

    assert Capability.TIERS not in vllm_engine.OFFLINE_CAPABILITIES
    assert Capability.TIERS not in vllm_engine.HTTP_CAPABILITIES


def test_the_pool_is_memoized_per_states_bounds_and_capabilities():
    """``enabled_pool`` is memoized: the pool equals its unmemoized value, an engine with
    fewer capabilities on the same candidate states gets its own pool, and two runs whose
    states differ only in the ledger share one."""
    step = _lockstep()
    step.run(ServeRequest(1, "P"))
    pool = step.enabled_actions()
    states = tuple(s.without_ledger() for s in step.states)
    caps = frozenset(step.engine.capabilities)
    assert tuple(pool) == enabled_pool.__wrapped__(states, step.bounds, caps, None)
    assert any(isinstance(a, EvictPrefix) for a in pool)
    fewer = enabled_pool(states, step.bounds, caps - {Capability.TIERS}, None)
    assert fewer and not any(isinstance(a, EvictPrefix) for a in fewer)
    assert set(fewer) < set(pool)
    again = _lockstep()
    again.run(ServeRequest(1, "P"))
    again.run(ServeRequest(1, "P"))  # a second response: the same state, a longer ledger
    assert again.states != step.states
    assert again.enabled_actions() == pool


def test_a_cached_strategy_makes_the_choices_a_fresh_one_makes():
    """``machine.sampled`` (built once per tuple of elements) gives the same values as a
    ``st.sampled_from`` built afresh at every draw, on the same derandomized examples."""
    from hypothesis import settings
    from hypothesis import strategies as st

    from kvfence.conformance.machine import sampled

    def values(strategy) -> list:
        out: list = []

        @settings(derandomize=True, max_examples=40, database=None)
        @given(st.data())
        def run(data):
            out.append(tuple(data.draw(strategy(), label="x") for _ in range(3)))

        run()
        return out

    fresh = values(lambda: st.sampled_from(tuple("abcdef")))
    assert len(set(fresh)) > 10
    assert values(lambda: sampled(tuple("abcdef"))) == fresh
