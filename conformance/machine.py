"""The stateful conformance machine: Hypothesis draws, ``Lockstep`` judges.

``build_machine(engine, client, recorder)`` returns a Hypothesis ``RuleBasedStateMachine``
class. Each example starts the SUT fresh with drawn endpoint configs and a client policy;
each step draws one action the model enables in every candidate state
(``Lockstep.enabled_actions``) and runs it in lockstep.

The draw: an action type by ``DRAW_FREQUENCY`` among the enabled ones (traffic and syncs
dominate, disruptions stay rare), then one of its instances. While an endpoint holds KV on a
lower tier (host or storage), three steps in four draw only among that endpoint's enabled
actions, by ``STEERED_FREQUENCY`` (``tier_steered``): a tier bug hides behind a chain on one
endpoint (serve, evict, release, flush) that the plain draw, spread over every endpoint and
dominated by traffic, completed in 8 of 3,713 focused ci examples. Lower-tier KV exists only
where the engine declares ``tiers``, so for other engines (vLLM) no extra choice is drawn and
the distribution is the plain one. Like zarr's ``testing/stateful.py``, the machine ships inside the
library and takes the system under test as an argument.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hypothesis import event, note, reject
from hypothesis import strategies as st
from hypothesis.control import should_note
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ..adapters.protocol import ClientAdapter, EngineAdapter
from ..model.actions import (
    AbortWeightUpdate,
    Action,
    BeginWeightUpdate,
    ContinueGeneration,
    EnterRotation,
    EvictPrefix,
    FaultChunkFails,
    FaultRankUpdateFails,
    FaultRefuseFlush,
    FaultUpdateFailsMidway,
    FinishRequest,
    FinishWeightUpdate,
    FlushCache,
    FlushEncoderCache,
    LeaveRotation,
    LoadLora,
    PauseGeneration,
    PublishVersion,
    Restart,
    ServeRequest,
    Sleep,
    StartRequest,
    SyncWeights,
    UpdateWeightChunk,
    UpdateWeights,
    WakeUp,
)
from ..model.state import Bounds, State
from ..model.vocabulary import Tier
from . import strategies
from .calls import stop_if_asked
from .errors import Diverged, Refused
from .lockstep import MACHINE_BOUNDS, Lockstep
from .record import Recorder

DRAW_FREQUENCY: dict[type[Action], int] = {
    ServeRequest: 4,
    StartRequest: 3,
    FinishRequest: 3,
    SyncWeights: 3,
    UpdateWeights: 2,
    ContinueGeneration: 2,
    WakeUp: 2,
    EvictPrefix: 2,
    FlushCache: 2,
    PauseGeneration: 2,
    Sleep: 1,
    Restart: 1,
    LoadLora: 1,
    FaultRefuseFlush: 1,
    FaultUpdateFailsMidway: 1,
    PublishVersion: 1,
    # two-phase windows: once open, chunks and traffic inside the window dominate
    BeginWeightUpdate: 2,
    UpdateWeightChunk: 3,
    FinishWeightUpdate: 2,
    AbortWeightUpdate: 1,
    FaultChunkFails: 1,
    FlushEncoderCache: 0,  # never drawn: a client program's call (candidates.NOT_ENUMERATED)
    FaultRankUpdateFails: 1,  # enabled only on an endpoint with data-parallel ranks
    LeaveRotation: 1,  # enabled only on a worker behind a router
    EnterRotation: 2,
}
"""How often each action type is drawn when enabled: traffic and syncs dominate, so that
requests live long enough to span an update; disruptions stay rare. Every action type has
an entry (0: never drawn, for a type ``candidates`` does not enumerate), so that a type
left out is an omission the registry test names, not a silent "never drawn"."""


STEERED_FREQUENCY: dict[type[Action], int] = {
    Sleep: 4,
    FlushCache: 3,
    UpdateWeights: 3,
    WakeUp: 2,
    ServeRequest: 2,
    EvictPrefix: 4,
}
"""How often each action type is drawn on an endpoint that holds lower-tier KV
(``tier_steered``; a type not listed: 1). What a tier bug hides behind is the event that
meets the lower-tier KV next (a release, a flush, an update, a resume, a reuse), not
traffic: a request in flight even keeps a release (``Sleep``) from being enabled."""


def lower_tier_endpoints(states: frozenset[State]) -> frozenset[int]:
    """Endpoints that hold KV on a lower tier (host or storage) in every candidate state."""
    held = [
        {i for i, ep in enumerate(s.endpoints) if any(e.tier is not Tier.DEVICE for e in ep.cache)}
        for s in states
    ]
    return frozenset(set.intersection(*held)) if held else frozenset()


def tier_steered(lockstep: Lockstep, data: st.DataObject) -> tuple[list[Action], bool]:
    """``(pool, steered)``: the actions the next one is drawn from, and whether they are
    steered. Plain: ``lockstep.enabled_actions()``. While some endpoint holds KV on a lower
    tier, three draws in four (an integer 0..3 is drawn; 0, where a shrink goes, is the
    plain draw) keep only the enabled actions on such an endpoint, to be weighted by
    ``STEERED_FREQUENCY``.

    A tier bug (a flush, update, release or resume that forgets host or storage KV:
    PF-19, sgl-project/sglang PR #19029) shows only on the endpoint that holds the lower-tier
    KV, and only if that endpoint's next few actions come before something else drops the
    KV: drawn over every endpoint, the chain serve, evict, release, flush reached its last
    step in 8 of 3,713 focused ci examples. Steering keeps the draws on that endpoint until
    the KV is gone. Every steered action is one the model enables in every candidate state
    (the pool is a subset of ``enabled_actions``), so the checker judges it as any other.
    Lower-tier KV exists only where the engine declares ``tiers`` (an ``EvictPrefix`` needs
    it), so for any other engine no extra choice is drawn and the draw is unchanged."""
    pool = lockstep.enabled_actions()
    held = lower_tier_endpoints(lockstep.states)
    if not held:
        return pool, False
    there = [a for a in pool if getattr(a, "endpoint", None) in held]
    if there and data.draw(st.integers(0, 3), label="steer to lower-tier KV") > 0:
        return there, True
    return pool, False


def draw(data: st.DataObject, strategy: st.SearchStrategy[Any], label: str) -> Any:
    """``data.draw(strategy, label=label)``: the same choices, spans and argument span
    (Hypothesis's ``ConjectureData.draw`` inside ``track_arg_span``, as ``DataObject.draw``
    makes it), without the check ``DataObject.draw`` wraps around every draw that the
    strategy left Python's global ``random`` as it found it: two copies of the generator's
    state per draw, about 7% of a ci check's CPU, for strategies that never touch it.
    ``data.draw`` itself where the draws are printed (a final replay, ``should_note``) or
    where this Hypothesis has no ``track_arg_span``."""
    cd = getattr(data, "conjecture_data", None)
    track = getattr(cd, "track_arg_span", None)
    if track is None or should_note():
        return data.draw(strategy, label=label)
    data.count += 1
    with track():
        return cd.draw(strategy, observe_as=f"generate:Draw {data.count} ({label})")


@lru_cache(maxsize=1 << 14)
def sampled(elements: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """``st.sampled_from(elements)``, built once per tuple: the same choices and labels as a
    strategy built afresh, without Hypothesis validating a new strategy at every step."""
    return st.sampled_from(elements)


@lru_cache(maxsize=1 << 10)
def type_draw(kinds: frozenset[type[Action]], steered: bool) -> st.SearchStrategy[Any]:
    """The draw of an action type among ``kinds`` (those with an enabled action): each
    type of ``DRAW_FREQUENCY`` with a non-zero count, in that order, repeated by its weight
    (``STEERED_FREQUENCY`` when ``steered``, else ``DRAW_FREQUENCY``)."""
    weights = STEERED_FREQUENCY if steered else DRAW_FREQUENCY
    drawn = [k for k, n in DRAW_FREQUENCY.items() if n and k in kinds]
    return sampled(tuple(k for k in drawn for _ in range(weights.get(k, 1))))


class KvfenceMachine(RuleBasedStateMachine):
    """Base machine; ``build_machine`` binds ``engine``, ``client`` and ``recorder``."""

    engine: EngineAdapter
    client: ClientAdapter
    recorder: Recorder
    bounds: Bounds = MACHINE_BOUNDS
    timeout: float = 60.0
    focus: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.lockstep = Lockstep(
            self.engine, self.client, self.recorder, self.bounds, self.timeout, note, self.focus
        )

    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        """Draw endpoint configs (unless the SUT is fixed) and a client policy."""
        fixed = self.engine.fixed_configs
        caps = self.engine.capabilities
        configs = fixed if fixed is not None else data.draw(strategies.configs_for(frozenset(caps)))
        policy = data.draw(strategies.policies, label="policy")
        self.lockstep.start(configs, policy)

    @precondition(lambda self: bool(self.lockstep.enabled_actions()))
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """Draw an action type by ``DRAW_FREQUENCY`` among those enabled, then one of its
        instances, and run it in lockstep. While an endpoint holds KV on a lower tier, the
        draw is first steered to that endpoint's actions three times in four
        (``tier_steered``). A stop signal received since (``calls.STOPPED``) ends the
        search here."""
        stop_if_asked()
        pool, steered = tier_steered(self.lockstep, data)
        kinds = frozenset(type(a) for a in pool)
        kind = draw(data, type_draw(kinds, steered), "action type")
        action = draw(data, sampled(tuple(a for a in pool if type(a) is kind)), "action")
        event(kind.__name__)
        try:
            self.lockstep.run(action)
        except Diverged:
            reject()  # broke only other rules: this example says nothing about the focus
        except Refused:
            reject()  # the client raised here: recorded; judge it on other configurations

    @invariant()
    def spec_invariants_hold(self) -> None:
        self.lockstep.check_model()


def build_machine(
    engine: EngineAdapter,
    client: ClientAdapter,
    recorder: Recorder,
    bounds: Bounds = MACHINE_BOUNDS,
    timeout: float = 60.0,
    focus: str | None = None,
) -> type[KvfenceMachine]:
    """A machine class bound to one SUT (``focus``: see ``Lockstep``)."""
    namespace: dict[str, Any] = {
        "engine": engine,
        "client": client,
        "recorder": recorder,
        "bounds": bounds,
        "timeout": timeout,
        "focus": focus,
    }
    return type("Kvfence", (KvfenceMachine,), namespace)
