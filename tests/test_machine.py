"""The stateful machine's draw: steered to an endpoint that holds lower-tier KV
(``machine.tier_steered``), and unchanged for an engine without tiers."""

from __future__ import annotations

from hypothesis import given

from kvfence.adapters import registry
from kvfence.adapters.clients import ReferenceClient
from kvfence.conformance import strategies
from kvfence.conformance.lockstep import NEEDS, Lockstep, enabled_pool
from kvfence.conformance.machine import (
    DRAW_FREQUENCY,
    STEERED_FREQUENCY,
    lower_tier_endpoints,
    tier_steered,
)
from kvfence.conformance.record import Recorder
from kvfence.model.actions import EvictPrefix, ServeRequest
from kvfence.model.capabilities import Capability
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


def test_no_lower_tier_kv_draws_nothing_extra():
    step = _lockstep()
    step.run(ServeRequest(1, "P"))  # device KV only: nothing to steer to
    assert lower_tier_endpoints(step.states) == frozenset()
    pool, steered = tier_steered(step, Draws())  # Draws() fails on any draw
    assert pool == step.enabled_actions() and not steered


def test_lower_tier_kv_steers_to_its_endpoint():
    step = _lockstep()
    step.run(ServeRequest(1, "P"))
    step.run(ServeRequest(0, "P"))
    step.run(EvictPrefix(1, "P", Tier.HOST))
    assert lower_tier_endpoints(step.states) == frozenset({1})
    enabled = step.enabled_actions()
    assert any(getattr(a, "endpoint", None) == 0 for a in enabled)
    data = Draws(3)
    pool, steered = tier_steered(step, data)
    assert steered and data.labels == ["steer to lower-tier KV"]
    assert pool and all(a in enabled and a.endpoint == 1 for a in pool)
    # 0 (where a shrink goes) is the plain draw over every endpoint
    pool, steered = tier_steered(step, Draws(0))
    assert pool == enabled and not steered


def test_steered_weights_name_only_drawn_types():
    assert set(STEERED_FREQUENCY) <= set(DRAW_FREQUENCY)
    assert all(w >= 1 for w in STEERED_FREQUENCY.values())


NO_TIERS = frozenset(Capability) - {Capability.TIERS}


@given(strategies.configs(NO_TIERS))
def test_an_engine_without_tiers_never_holds_lower_tier_kv(configs):
    """Why the draw is unchanged for vLLM and any engine that does not declare ``tiers``:
    no config it is given has a lower tier, and no EvictPrefix is drawn for it."""
    assert all(c.tiers == frozenset({Tier.DEVICE}) for c in configs)
    assert NEEDS[EvictPrefix] is Capability.TIERS


def test_vllm_declares_no_tiers():
    """The vLLM adapter (offline and HTTP) draws from this machine: without ``tiers`` it is
    never steered, so its ci budget still reaches INV-001 as before."""
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


def test_draw_makes_the_choices_data_draw_makes():
    """``machine.draw`` (which skips ``DataObject.draw``'s global-random check) gives the same
    values as ``data.draw`` on the same derandomized examples, cached strategies included."""
    from hypothesis import settings
    from hypothesis import strategies as st

    from kvfence.conformance.machine import draw, sampled

    def values(through) -> list:
        out: list = []

        @settings(derandomize=True, max_examples=40, database=None)
        @given(st.data())
        def run(data):
            out.append(
                tuple(through(data, s) for s in (sampled(tuple("abcdef")), st.integers(0, 9)))
            )

        run()
        return out

    plain = values(lambda data, s: data.draw(s, label="x"))
    assert len(set(plain)) > 10
    assert values(lambda data, s: draw(data, s, "x")) == plain
