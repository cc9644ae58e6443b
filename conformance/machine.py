"""The stateful conformance machine: Hypothesis draws, ``Lockstep`` judges.

``build_machine(engine, client, recorder)`` returns a Hypothesis ``RuleBasedStateMachine``
class. Each example starts the SUT fresh with drawn endpoint configs and a client policy;
each step draws one action the model enables (preconditions come from ``model.enabled``)
and runs it in lockstep. Like zarr's ``testing/stateful.py``, the machine ships inside the
library and takes the system under test as an argument.
"""

from __future__ import annotations

from typing import Any

from hypothesis import event, note, reject
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvfence.adapters.protocol import ClientAdapter, EngineAdapter
from kvfence.model.actions import (
    AbortWeightUpdate,
    Action,
    BeginWeightUpdate,
    ContinueGeneration,
    EvictPrefix,
    FaultChunkFails,
    FaultRefuseFlush,
    FaultUpdateFailsMidway,
    FinishRequest,
    FinishWeightUpdate,
    FlushCache,
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
from kvfence.model.state import Bounds

from . import strategies
from .lockstep import MACHINE_BOUNDS, Diverged, Lockstep, Recorder, Refused

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
}
"""How often each action type is drawn when enabled: traffic and syncs dominate, so that
requests live long enough to span an update; disruptions stay rare."""


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
        configs = fixed if fixed is not None else data.draw(strategies.configs(caps))
        policy = data.draw(strategies.policies, label="policy")
        self.lockstep.start(configs, policy)

    @precondition(lambda self: bool(self.lockstep.enabled_actions()))
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """Draw an action type by ``DRAW_FREQUENCY`` among those enabled, then one of its
        instances, and run it in lockstep."""
        pool = self.lockstep.enabled_actions()
        kinds = {type(a) for a in pool}
        weighted = [k for k in DRAW_FREQUENCY if k in kinds for _ in range(DRAW_FREQUENCY[k])]
        kind = data.draw(st.sampled_from(weighted), label="action type")
        action = data.draw(st.sampled_from([a for a in pool if type(a) is kind]), label="action")
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
