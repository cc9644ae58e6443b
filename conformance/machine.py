"""The stateful conformance machine: Hypothesis draws, ``Lockstep`` judges.

``build_machine(engine, client, recorder)`` returns a Hypothesis ``RuleBasedStateMachine``
class. Each example starts the SUT fresh with drawn endpoint configs and a client policy;
each step draws one action the model enables in every candidate state
(``Lockstep.enabled_actions``) and runs it in lockstep.

The draw: an action type by ``DRAW_FREQUENCY`` among the enabled ones (traffic and syncs
dominate, disruptions stay rare), then one of its instances. While an endpoint holds a
latent hazard (``model.hazards``: lower-tier KV, released memory, an open window, requests
held in place, torn or mixed weights, a refused flush pending), three steps in four draw
only among that endpoint's enabled actions, weighted by that hazard's
``HAZARD_FREQUENCY`` (``hazard_steered``): a fault hides behind a chain on one endpoint
(serve, evict, release, flush) that the plain draw, spread over every endpoint and
dominated by traffic, completed in 8 of 3,713 focused ci examples. A state that holds no
hazard draws nothing extra. No verdict of a correct system rests on the steering: the
battery, run before the search, gives each rule its evidence (``battery``'s evidence
witnesses). Like zarr's ``testing/stateful.py``, the machine ships inside the
library and takes the system under test as an argument.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hypothesis import event, note, reject
from hypothesis import strategies as st
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
from ..model.hazards import Hazard, hazards_held, meets
from ..model.state import Bounds
from . import strategies
from .calls import stop_if_asked
from .errors import BeyondModel, Diverged, Refused
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


HAZARD_FREQUENCY: dict[str, dict[type[Action], int]] = {
    "lower-tier KV": {
        Sleep: 4,
        EvictPrefix: 4,
        FlushCache: 3,
        UpdateWeights: 3,
        WakeUp: 2,
        ServeRequest: 2,
    },
    "KV released": {WakeUp: 4, FlushCache: 3, UpdateWeights: 3, SyncWeights: 2},
    "open window": {
        UpdateWeightChunk: 3,
        ServeRequest: 3,
        FinishWeightUpdate: 3,
        AbortWeightUpdate: 2,
        FaultChunkFails: 2,
    },
    "held in place": {UpdateWeights: 3, SyncWeights: 3, FlushCache: 3, ContinueGeneration: 2},
    "torn or mixed": {ServeRequest: 4, FlushCache: 3, UpdateWeights: 3, SyncWeights: 2},
    "refused flush pending": {FlushCache: 3, UpdateWeights: 3, SyncWeights: 3, Sleep: 2},
}
"""How often each action type is drawn on an endpoint that holds a hazard, per hazard
(``model.hazards.HAZARDS``, by name; a type not listed: 1): what a fault hides behind is
the event that meets the hazard next (``Hazard.met_by``), not traffic. Lower-tier KV: a
release, a flush, an update, a resume, a reuse (a request in flight even keeps a release
from being enabled); released memory: the resume, a flush or an update while released; an
open window: its chunks, a forward under mixed weights, its finish or abort; requests held
in place: an update, a sync or a flush under them; torn or mixed weights: a serve, a
flush, an update; a refused flush pending: the flush or update that meets it."""


def hazard_steered(
    lockstep: Lockstep,
    data: st.DataObject,
    held: tuple[tuple[Hazard, int], ...] | None = None,
) -> tuple[list[Action], Hazard | None]:
    """``(pool, hazard)``: the actions the next one is drawn from, and the hazard they are
    steered to (``None``: the plain draw, ``lockstep.enabled_actions()``). While some
    endpoint holds a hazard (``model.hazards.hazards_held``, in every candidate state), an
    integer 0..3 is drawn: 0, where a shrink goes, is the plain draw; otherwise one of the
    held ``(hazard, endpoint)`` pairs is drawn (no draw when there is one) and the pool
    keeps the enabled actions on that endpoint and the syncs (``SyncWeights`` reaches every
    endpoint), to be weighted by that hazard's ``HAZARD_FREQUENCY``.

    A fault of the catalogue shows only on the endpoint that holds the hazard, and only if
    that endpoint's next few actions come before something else removes it: drawn over
    every endpoint, the chain serve, evict, release, flush reached its last step in 8 of
    3,713 focused ci examples. Every steered action is one the model enables in every
    candidate state (the pool is a subset of ``enabled_actions``), so the checker judges it
    as any other. A state that holds no hazard draws nothing extra: its draw is the plain
    one. ``held``: ``hazards_held(lockstep.states)`` when the caller has it."""
    pool = lockstep.enabled_actions()
    if held is None:
        held = hazards_held(lockstep.states)
    choices = [
        (h, there)
        for h, i in held
        if (there := [a for a in pool if getattr(a, "endpoint", i) == i])
    ]
    if not choices or data.draw(st.integers(0, 3), label="steer to a hazard") == 0:
        return pool, None
    if len(choices) == 1:
        hazard, there = choices[0]
    else:
        hazard, there = choices[data.draw(st.integers(0, len(choices) - 1), label="hazard")]
    return there, hazard


@lru_cache(maxsize=1 << 14)
def sampled(elements: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """``st.sampled_from(elements)``, built once per tuple: the same choices and labels as a
    strategy built afresh, without Hypothesis validating a new strategy at every step."""
    return st.sampled_from(elements)


@lru_cache(maxsize=1 << 10)
def type_draw(kinds: frozenset[type[Action]], hazard: str | None) -> st.SearchStrategy[Any]:
    """The draw of an action type among ``kinds`` (those with an enabled action): each
    type of ``DRAW_FREQUENCY`` with a non-zero count, in that order, repeated by its weight
    (``HAZARD_FREQUENCY[hazard]`` when the draw is steered to that hazard, else
    ``DRAW_FREQUENCY``)."""
    weights = DRAW_FREQUENCY if hazard is None else HAZARD_FREQUENCY[hazard]
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
        instances, and run it in lockstep. While an endpoint holds a hazard, the draw is
        first steered to that endpoint's actions three times in four, weighted by the
        hazard's ``HAZARD_FREQUENCY`` (``hazard_steered``). Events: the action type, and
        ``<hazard> met`` where the action meets a hazard held on its endpoint. A stop signal
        received since (``calls.STOPPED``) ends the search here."""
        stop_if_asked()
        held = hazards_held(self.lockstep.states)
        pool, hazard = hazard_steered(self.lockstep, data, held)
        kinds = frozenset(type(a) for a in pool)
        steered = None if hazard is None else hazard.name
        kind = data.draw(type_draw(kinds, steered), label="action type")
        action = data.draw(sampled(tuple(a for a in pool if type(a) is kind)), label="action")
        event(kind.__name__)
        for h, i in held:
            if meets(h, i, action):
                event(f"{h.name} met")
        try:
            self.lockstep.run(action)
        except Diverged:
            reject()  # broke only other rules: this example says nothing about the focus
        except BeyondModel:
            reject()  # the client called what this deployment has no model of
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
