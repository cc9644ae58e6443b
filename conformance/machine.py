"""The stateful conformance machine: model and system under test, in lockstep.

``build_machine(engine, client, recorder)`` returns a Hypothesis ``RuleBasedStateMachine``
class. Each example starts the SUT fresh with drawn endpoint configs and a client policy;
each rule draws one action the model enables (preconditions come from ``model.enabled``),
applies it to the SUT, steps the model, and keeps only the model branches the observation
agrees with (the model forks where the spec allows a choice). No branch left is a FAIL
naming the rules broken. An adapter that raises or hangs is an ERROR (ADP-001).

Like zarr's ``testing/stateful.py``, the machine ships inside the library and takes the
system under test as an argument.
"""

from __future__ import annotations

import concurrent.futures
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kvfence.adapters.protocol import AdapterFailure, ClientAdapter, EngineAdapter, Unsupported
from kvfence.model import engine as spec
from kvfence.model.actions import (
    ACTION_TYPES,
    Action,
    ContinueGeneration,
    EvictPrefix,
    FaultRefuseFlush,
    FaultUpdateFailsMidway,
    FinishRequest,
    LoadLora,
    PauseGeneration,
    Restart,
    ServeRequest,
    Sleep,
    StartRequest,
    SyncWeights,
    UpdateWeights,
    WakeUp,
)
from kvfence.model.checks import Violation, check_state, compare, evidence
from kvfence.model.client import Plan, resolve_plan
from kvfence.model.observation import Observation
from kvfence.model.state import Bounds, Config, Policy, State, initial_state

from . import strategies
from .trace import observation_json, outcome_json, plan_json

NEEDS: dict[type[Action], str] = {
    StartRequest: "inflight",
    FinishRequest: "inflight",
    PauseGeneration: "pause",
    ContinueGeneration: "pause",
    Sleep: "sleep",
    WakeUp: "sleep",
    Restart: "restart",
    EvictPrefix: "tiers",
    LoadLora: "lora",
    FaultRefuseFlush: "faults",
    FaultUpdateFailsMidway: "faults",
}
"""The capability an adapter must declare before the machine draws an action type."""


MACHINE_BOUNDS = Bounds(versions=8, lora_revisions=4)
"""Wider than the explorer's: a stateful run must never run out of versions to push."""


class ConformanceFailure(AssertionError):
    """The SUT did something the spec forbids. ``violations`` name the rules."""

    def __init__(self, violations: list[Violation], step: int) -> None:
        self.violations = violations
        self.step = step
        super().__init__("; ".join(str(v) for v in violations))


class AdapterError(Exception):
    """The SUT or its adapter could not answer (crash, hang, malformed observation)."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(f"{rule}: {message}")


class Recorder:
    """What a run learns across every example Hypothesis tries.

    ``exercised``: rule ID -> how many comparisons gave it evidence. ``reached``: REACH
    rules seen. ``trace``: the lines of the example running now; ``failure``: the lines
    and violations of the last failing example (Hypothesis replays the minimal one last).
    """

    def __init__(self) -> None:
        self.exercised: Counter[str] = Counter()
        self.reached: set[str] = set()
        self.examples = 0
        self.steps = 0
        self.trace: list[dict[str, Any]] = []
        self.failure: tuple[list[dict[str, Any]], list[Violation]] | None = None
        self.error: tuple[list[dict[str, Any]], AdapterError] | None = None
        self.features: set[str] = set()


def call_with_timeout(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """Run an adapter call; its exceptions and hangs become ``AdapterError`` (ADP-001).

    A hung call's thread cannot be killed; it is abandoned and the run stops with ERROR.
    ``Unsupported`` passes through (the action is outside the adapter's reach).
    """
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn)
    try:
        return future.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        raise AdapterError("ADP-001", f"{what} did not answer within {timeout:g} s") from None
    except Unsupported:
        raise
    except AdapterFailure as e:
        raise AdapterError("ADP-001", f"{what} failed: {e}") from e
    except Exception as e:
        raise AdapterError("ADP-001", f"{what} raised {type(e).__name__}: {e}") from e
    finally:
        pool.shutdown(wait=False)


class KvfenceMachine(RuleBasedStateMachine):
    """Base machine; ``build_machine`` binds ``engine``, ``client`` and ``recorder``."""

    engine: EngineAdapter
    client: ClientAdapter
    recorder: Recorder
    bounds: Bounds = MACHINE_BOUNDS
    timeout: float = 60.0

    def __init__(self) -> None:
        super().__init__()
        self.states: frozenset[State] = frozenset()
        self.policy = Policy()
        self.pool: list[Action] | None = None
        self.served_at: dict[tuple[int, str], int] = {}
        self.recorder.trace = []
        self.recorder.examples += 1
        self.recorder.error = None

    # ----- setup ----------------------------------------------------------------------

    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        caps = self.engine.capabilities
        fixed = self.engine.fixed_configs
        configs = fixed if fixed is not None else data.draw(strategies.configs(caps))
        self.policy = data.draw(strategies.policies, label="policy")
        note(f"configs={configs!r} policy={self.policy!r}")
        self.recorder.trace.append({"setup": {"configs": configs, "policy": self.policy}})
        self._features(configs)
        call_with_timeout(lambda: self.engine.start(configs), self.timeout, "start")
        self.states = frozenset({initial_state(configs, self.policy)})

    def _features(self, configs: tuple[Config, ...]) -> None:
        for c in configs:
            for name in ("draft", "encoder", "fp8_kv", "lora"):
                if getattr(c, name):
                    self.recorder.features.add(name)
            if c.guarded:
                self.recorder.features.add("exact_lane")
            if len(c.tiers) > 1:
                self.recorder.features.add("tiers")

    # ----- drawing actions ------------------------------------------------------------

    def enabled_actions(self) -> list[Action]:
        """Actions the model enables in every candidate state, within the adapter's reach."""
        if self.pool is None:
            caps = self.engine.capabilities
            states = list(self.states)
            if not states:
                return []
            first, rest = states[0], states[1:]
            pool = [
                a
                for a in spec.actions(first, self.bounds, faults="faults" in caps)
                if NEEDS.get(type(a), "") in caps | {""}
                and all(spec.enabled(s, a, self.bounds) for s in rest)
            ]
            self.pool = pool
        return self.pool

    def pool_of(self, kind: type[Action]) -> list[Action]:
        return [a for a in self.enabled_actions() if type(a) is kind]

    def act(self, kind: type[Action], data: st.DataObject) -> None:
        action = data.draw(st.sampled_from(self.pool_of(kind)), label=kind.__name__)
        self.pool = None
        self.recorder.steps += 1
        event(kind.__name__)
        if isinstance(action, SyncWeights):
            self.sync(action)
        else:
            self.engine_step(action, within=None)

    # ----- one step -------------------------------------------------------------------

    def sync(self, action: SyncWeights) -> None:
        """Resolve each endpoint's plan with the client under test, check it, drive it."""
        n = len(next(iter(self.states)).endpoints)
        line: dict[str, Any] = {"step": len(self.recorder.trace), "action": action.to_json()}
        self.recorder.trace.append(line)
        note(f"{action!r}")
        plans: list[Plan] = []
        for i in range(n):
            info = call_with_timeout(
                lambda i=i: self.engine.server_info(i), self.timeout, f"server_info({i})"
            )
            expected = resolve_plan(
                self.policy.mode, self.policy.flush_cache, self.policy.pause_mode, info
            )
            got = call_with_timeout(
                lambda info=info: self.client.resolve(self.policy, info), self.timeout, "resolve"
            )
            if not isinstance(got, Plan):
                raise AdapterError("ADP-002", f"client returned {got!r}, not a Plan")
            line.setdefault("plans", []).append(
                {"endpoint": i, "server_info": info, "expected": plan_json(expected)}
                | {"observed": plan_json(got)}
            )
            bad = [
                Violation(expected.rule_for(f), getattr(expected, f), getattr(got, f), f"{i} {f}")
                for f in ("flush", "pause_mode")
                if getattr(expected, f) != getattr(got, f)
            ]
            for f in ("flush", "pause_mode"):
                self.recorder.exercised[expected.rule_for(f)] += 1
            self.recorder.exercised["CLI-006"] += 1
            if bad:
                self.fail(bad, line["step"])
            plans.append(expected)
        for i, plan in enumerate(plans):
            for call in (
                PauseGeneration(i, plan.pause_mode),
                UpdateWeights(i, action.version, action.funnel, plan.flush),
                ContinueGeneration(i),
            ):
                self.engine_step(call, within=line["step"])

    def engine_step(self, action: Action, within: int | None) -> None:
        note(f"  {action!r}" if within is not None else f"{action!r}")
        self._note_reach(action)
        obs = call_with_timeout(lambda: self.engine.apply(action), self.timeout, action.name)
        if not isinstance(obs, Observation):
            raise AdapterError("ADP-002", f"{action.name} returned {obs!r}, not an Observation")
        caps = self.engine.capabilities
        where = f"endpoint {getattr(action, 'endpoint', '')}"
        branches = [b for s in self.states for b in spec.step(s, action, self.bounds)]
        if not branches:
            raise AdapterError("ADP-002", f"{action!r} is not enabled in the model (a bug)")
        judged = [(s2, o, compare(o, obs, caps, where)) for s2, o in branches]
        line = {
            "step": len(self.recorder.trace),
            "action": action.to_json(),
            "observed": observation_json(obs),
            "expected": [outcome_json(o) for _, o, _ in judged],
        }
        if within is not None:
            line["within"] = within
        self.recorder.trace.append(line)
        agreeing = [(s2, o) for s2, o, v in judged if not v]
        if not agreeing:
            self.fail(min((v for _, _, v in judged), key=len), line["step"])
        for _, o in agreeing:
            for rule_id in evidence(o, obs, caps):
                self.recorder.exercised[rule_id] += 1
        if isinstance(action, UpdateWeights) and len(branches) > 1:
            # A refused flush, and the SUT chose a branch that keeps the tree sound.
            self.recorder.reached.add("REACH-003")
            self.recorder.exercised["FC-002"] += 1
        self.states = frozenset(s2 for s2, _ in agreeing)
        self.pool = None

    def fail(self, violations: list[Violation], step: int) -> None:
        """Record this example as the latest failure (Hypothesis replays the minimal one
        last, so the last recorded is the counterexample) and stop it."""
        self.recorder.failure = (list(self.recorder.trace), violations)
        note("violated: " + "; ".join(str(v) for v in violations))
        raise ConformanceFailure(violations, step)

    def _note_reach(self, action: Action) -> None:
        state = next(iter(self.states))
        if isinstance(action, (ServeRequest, StartRequest)):
            ep = state.endpoint(action.endpoint)
            key = (action.endpoint, action.prefix)
            if self.served_at.get(key, ep.weights) < ep.weights:
                self.recorder.reached.add("REACH-001")
                event("REACH-001 reuse after update")
            self.served_at[key] = ep.weights
        if isinstance(action, UpdateWeights):
            ep = state.endpoint(action.endpoint)
            if ep.config.guarded and action.flush_cache is not True:
                self.recorder.reached.add("REACH-002")

    @invariant()
    def spec_invariants_hold(self) -> None:
        """The model's own invariants, on every candidate: a spec bug fails loudly."""
        for s in self.states:
            bad = check_state(s)
            if bad:
                raise AdapterError("ADP-002", f"the model broke its own invariants: {bad}")


def _rule_for(kind: type[Action]) -> Callable[..., None]:
    def body(self: KvfenceMachine, data: st.DataObject) -> None:
        self.act(kind, data)

    body.__name__ = kind.__name__
    body.__doc__ = f"Draw one enabled {kind.__name__} and run it in lockstep."
    return precondition(lambda self: bool(self.pool_of(kind)))(rule(data=st.data())(body))


def build_machine(
    engine: EngineAdapter,
    client: ClientAdapter,
    recorder: Recorder,
    bounds: Bounds = MACHINE_BOUNDS,
    timeout: float = 60.0,
) -> type[KvfenceMachine]:
    """A machine class bound to one SUT; one rule per action type."""
    namespace: dict[str, Any] = {
        "engine": engine,
        "client": client,
        "recorder": recorder,
        "bounds": bounds,
        "timeout": timeout,
    }
    for kind in ACTION_TYPES:
        namespace[kind.__name__] = _rule_for(kind)
    return type("Kvfence", (KvfenceMachine,), namespace)
