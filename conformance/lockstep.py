"""Model and system under test in lockstep, one action at a time.

``Lockstep`` is the core of every check: the Hypothesis machine draws actions into it, the
shrinker and ``kvfence replay`` feed it recorded ones, and model-only trace validation
feeds it recorded observations. For each action it asks the SUT, steps the model, and keeps
only the model branches the observation agrees with (the model forks where the spec allows
a choice); no branch left is a FAIL naming the rules broken. An adapter that raises, hangs
or answers garbage is an ERROR (ADP-001, ADP-002).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from functools import lru_cache

from attrs import evolve, field, frozen

from ..adapters.protocol import ClientAdapter, EngineAdapter, tolerance
from ..model import candidates
from ..model import semantics as spec
from ..model.actions import (
    ACTION_TYPES,
    Action,
    BeginWeightUpdate,
    FaultUpdateFailsMidway,
    FinishWeightUpdate,
    Restart,
    ServeRequest,
    StartRequest,
    SyncWeights,
    UpdateWeightChunk,
    UpdateWeights,
)
from ..model.capabilities import (
    NEEDED_BY_ACTION,
    PROFILE_CAPABILITIES,
    Capability,
    needed,
)
from ..model.checks import (
    SpecError,
    Violation,
    check_state,
    compare,
    evidence,
    misreported,
    restart_mechanism,
    tells_installed_apart,
    within_tolerance,
)
from ..model.observation import malformed
from ..model.order import ordered
from ..model.properties import SOMETIMES, Memory
from ..model.rules import BY_ID, RuleId
from ..model.state import Bounds, Config, Policy, State, initial_state, with_profile
from ..model.vocabulary import Funnel, Phase, Status
from .calls import call_with_timeout, is_direct
from .errors import AdapterError, ConformanceFailure, Diverged, NotEnabled, Refused
from .program import CallSequence, is_program, resolver_sync, run_program
from .record import Recorder, Run
from .trace import ProgramRecord, Step

UPDATES = (SyncWeights, UpdateWeights, BeginWeightUpdate)
"""The actions counted as weight updates in ``Recorder.covered``."""

MACHINE_BOUNDS = Bounds(versions=64, lora_revisions=16)
"""Wider than the explorer's: a stateful run must never run out of versions to push."""

NEEDS: dict[type[Action], Capability] = {
    t: NEEDED_BY_ACTION[t.__name__] for t in ACTION_TYPES if t.__name__ in NEEDED_BY_ACTION
}
"""The capability an adapter must declare before an action type is drawn for it."""


def _asleep(state: State, action: Action) -> bool:
    """``action``'s endpoint is ASLEEP in ``state`` (for ``capabilities.needed``)."""
    index = getattr(action, "endpoint", None)
    return index is not None and state.endpoint(index).phase is Phase.ASLEEP


@lru_cache(maxsize=1 << 14)
def enabled_pool(
    states: tuple[State, ...],
    bounds: Bounds,
    caps: frozenset[Capability],
    own: tuple[Funnel, ...] | None,
) -> tuple[Action, ...]:
    """The conforming actions the model enables in every one of ``states`` (candidate
    states without their ledger, which enabledness never reads), within ``bounds`` and the
    capabilities ``caps``, in ``candidates`` order on the first state. ``own``: the update
    funnels the engine's code has (``funnels``), the only ones it is sent; ``None`` for
    every funnel in ``bounds``. Memoized: the same candidate states recur across the
    examples of a stateful run, its shrinking and replays."""
    if not states:
        return ()
    bounds = evolve(bounds, namespaces=Capability.NAMESPACES in caps)
    if own is not None:
        bounds = evolve(bounds, funnels=tuple(f for f in bounds.funnels if f in own))
    first, rest = states[0], states[1:]
    faults = Capability.FAULTS in caps
    if rest:
        return tuple(
            a
            for a in candidates.actions(first, bounds, faults=faults)
            if needed(a, _asleep(first, a)) <= caps
            and all(spec.enabled(s, a, bounds) for s in rest)
        )
    # One candidate state: its actions come in parts (the syncs, then each endpoint's),
    # and a part's capability filter depends only on it and whether its endpoint is asleep.
    syncs, *on_endpoints = candidates.parts(first, bounds, faults)
    pool = _capable(syncs, False, caps)
    for ep, part in zip(first.endpoints, on_endpoints, strict=True):
        pool += _capable(part, ep.phase is Phase.ASLEEP, caps)
    return pool


@lru_cache(maxsize=1 << 14)
def _capable(
    part: tuple[Action, ...], asleep: bool, caps: frozenset[Capability]
) -> tuple[Action, ...]:
    """The actions of ``part`` (of one endpoint, ``asleep`` or not, or of none) an adapter
    declaring ``caps`` is sent (``capabilities.needed``)."""
    return tuple(a for a in part if needed(a, asleep) <= caps)


@frozen
class Cursor:
    """Where a lockstep run stands, enough to resume it (the explorer's nodes): the
    model's candidate ``states``, the client violations ``pending`` so far, whether the run
    is ``off_contract`` (the client broke a rule, so the ledger no longer holds), and
    whether a refused flush is still ``unsettled`` (several fail-closed branches open)."""

    states: frozenset[State]
    pending: tuple[Violation, ...] = ()
    off_contract: bool = False
    unsettled: bool = False
    failed: frozenset[int] = field(default=frozenset(), eq=False)
    """The endpoints where an update failed after moving weights and none completed since
    (what the restart oracle's findings are named after, ``restart_mechanism``); it names a
    violation and changes no verdict, so it does not tell two nodes apart."""


def explanation(candidates: list[list[Violation]]) -> list[Violation]:
    """The violations to report when no model branch agrees: those of the first branch
    whose violations include no MUST rule, else of the first branch. Never "the fewest":
    a single MUST violation must not hide behind a branch with fewer words."""
    for violations in candidates:
        if all(BY_ID[v.rule].level != "MUST" for v in violations if v.rule in BY_ID):
            return violations
    return candidates[0]


def narrowed(state: State, action: Action, obs, capabilities) -> State:
    """The model's upper bound on a cache, narrowed to what a cache listing showed: an
    entry the system no longer lists is gone (dropped entries never come back)."""
    index = getattr(action, "endpoint", None)
    listing = obs.view.cache if obs.view is not None else None
    if index is None or listing is None or Capability.CACHE_PROBE not in capabilities:
        return state
    ep = state.endpoint(index)
    return state.with_endpoint(index, evolve(ep, cache=ep.cache & listing))


class Lockstep:
    """One run: ``start`` the SUT with configs and a policy, then ``run`` actions.

    ``note`` receives a line of text per step (Hypothesis's ``note`` in the machine).
    ``focus``: a rule ID; a run that breaks only other rules raises ``Diverged`` instead of
    failing, so a search continues until it shows that rule broken (how a mutant is shown
    killed by the rule it was written to break). Its other violations stay recorded in
    ``Recorder.other``.
    """

    def __init__(
        self,
        engine: EngineAdapter,
        client: ClientAdapter,
        recorder: Recorder,
        bounds: Bounds = MACHINE_BOUNDS,
        timeout: float = 60.0,
        note: Callable[[str], None] = lambda text: None,
        focus: str | None = None,
        calls: bool = False,
    ) -> None:
        self.engine = engine
        #: ``calls``: the top-level actions are a client's calls (a trainer over HTTP),
        #: judged by the client obligations (``CallSequence``), set up by ``start``.
        self.judge_calls = calls
        self.calls: CallSequence | None = None
        self.client = client
        self.direct = is_direct(engine)  # called in this thread, timed by a watchdog
        self.recorder = recorder
        self.bounds = bounds
        self.timeout = timeout
        self.note = note
        self.focus = focus
        self.states: frozenset[State] = frozenset()
        self.policy = Policy()
        self.configs: tuple[Config, ...] = ()
        self.actions: list[Action] = []
        self.steps: list[Step] = []
        self.pool: list[Action] | None = None
        self.reach_memory: list[Memory] = [p.start for p in SOMETIMES]
        self.pending: list[Violation] = []
        self.off_contract = False
        self.unsettled = False
        self.unproven = False  # a fail-closed branch settled, not yet by what was installed
        self.updates = self.serves = 0  # counted for ``Recorder.covered``
        self.prompts: set[str] = set()
        self.failed: frozenset[int] = frozenset()  # ``Cursor.failed``

    # ----- setup and drawing ----------------------------------------------------------

    def start(self, configs: tuple[Config, ...], policy: Policy) -> None:
        if self.recorder.error is not None:
            # An adapter already failed (perhaps hung): do not call it again; Hypothesis's
            # replay of the failing example then ends on the same error, not on 'Flaky'.
            raise self.recorder.error[1]
        try:  # the engine's declared profile (what an omitted flush_cache means ...)
            profile = getattr(self.engine, "profile", None)
            configs = tuple(with_profile(c, profile) for c in configs)
        except ValueError as e:
            raise AdapterError(RuleId.ADP_002, f"the adapter's {e}") from None
        self.configs, self.policy = configs, policy
        self.note(f"configs={configs!r} policy={policy!r}")
        self.recorder.examples += 1
        # An adapter may need longer to start than to answer (importing and launching an
        # engine): it says so with ``start_timeout``.
        limit = max(self.timeout, getattr(self.engine, "start_timeout", 0.0))
        for i, c in enumerate(configs):
            problem = misreported(c)
            if problem:
                raise AdapterError(RuleId.ADP_002, f"endpoint {i}: {problem}")
        for cap, flag in PROFILE_CAPABILITIES.items():
            if (profile or {}).get(flag) and cap not in self.engine.capabilities:
                why = f"the adapter's profile sets {flag} but it does not declare {cap.value}"
                raise AdapterError(RuleId.ADP_002, why)
        call_with_timeout(
            lambda: self.engine.start(configs), limit, "start", self.direct, self.recorder.timing
        )
        self.states = frozenset({initial_state(configs, policy)})
        self.unsettled = self.unproven = False
        self.calls = CallSequence(self) if self.judge_calls else None
        self.updates = self.serves = 0
        self.prompts = set()
        self.failed = frozenset()

    def resume(self, configs: tuple[Config, ...], policy: Policy, cursor: Cursor) -> None:
        """Continue a run from ``cursor`` without starting the SUT (the caller has put the
        SUT back where the cursor was taken, e.g. ``InProcessAdapter.restore``)."""
        self.configs, self.policy = configs, policy
        self.states = cursor.states
        self.pending = list(cursor.pending)
        self.off_contract = cursor.off_contract
        self.unsettled = cursor.unsettled
        self.failed = cursor.failed
        self.pool = None

    def cursor(self) -> Cursor:
        """Where this run stands now (see ``resume``)."""
        return Cursor(
            self.states, tuple(self.pending), self.off_contract, self.unsettled, self.failed
        )

    def enabled_actions(self) -> list[Action]:
        """Conforming actions the model enables in every candidate state, within the
        adapter's capabilities (``enabled_pool``, kept until the candidate states change)."""
        if self.pool is None:
            caps = frozenset(self.engine.capabilities)
            own = getattr(self.engine, "funnels", None)
            states = tuple(s.without_ledger() for s in self.states)
            own = own if isinstance(own, tuple) else None
            self.pool = list(enabled_pool(states, self.bounds, caps, own))
        return self.pool

    # ----- one top-level action -------------------------------------------------------

    def run(self, action: Action) -> None:
        """Apply one top-level action (a SyncWeights expands into its engine calls)."""
        if not all(spec.enabled(s, action, self.bounds) for s in self.states):
            raise NotEnabled(f"{action!r} is not enabled here")
        self.actions.append(action)
        self.pool = None
        self.recorder.steps += 1
        self._cover(action)
        try:
            if isinstance(action, SyncWeights):
                self.sync(action)
            elif self.calls is not None:
                before = self.calls.before(action)
                obs = self.engine_step(action, within=None).observed
                assert obs is not None
                self.calls.after(before, action, obs.status, obs.flushed)
            else:
                self.engine_step(action, within=None)
        except AdapterError as e:
            if self.recorder.error is None:
                self.recorder.error = (self.snapshot([]), e)  # keep what was recorded
            raise
        except KeyboardInterrupt:  # a stop signal (SIGINT, or SIGTERM in a check)
            if self.recorder.error is None:
                stopped = AdapterError(RuleId.ADP_001, f"stopped by a signal during {action!r}")
                self.recorder.error = (self.snapshot([]), stopped)
            raise

    def _cover(self, action: Action) -> None:
        """Count ``action`` towards the bounds this run covers (``Recorder.covered``)."""
        if isinstance(action, UPDATES):
            self.updates += 1
        if isinstance(action, (ServeRequest, StartRequest)):
            self.serves += 1
            self.prompts.add(action.prefix)
        in_flight = max((sum(len(e.requests) for e in s.endpoints) for s in self.states), default=0)
        self.recorder.covered = self.recorder.covered.widest(
            endpoints=len(self.configs),
            prompts=len(self.prompts),
            in_flight=in_flight + isinstance(action, StartRequest),
            updates=self.updates,
            serves=self.serves,
        )

    def sync(self, action: SyncWeights) -> None:
        """Run the client's sync: a client program (``conformance.program``) makes its own
        calls through endpoint handles; a resolver runs as the thin program
        ``resolver_sync`` (its plans judged against the spec's, then driven). Either way
        every engine call is a step ``within`` this one, and the model judges the call
        sequence (CLI-007..011)."""
        self.note(f"{action!r}")
        if is_program(self.client):
            step = Step(len(self.steps), action, plans=[], program=ProgramRecord())
            self.steps.append(step)
            run_program(self, action, step, self.client)
        else:
            step = Step(len(self.steps), action, plans=[])
            self.steps.append(step)
            resolver_sync(self, action, step)

    def engine_step(self, action: Action, within: int | None) -> Step:
        """Apply ``action`` to the engine and to every candidate model state, keep the
        branches the observation agrees with, and return the ``Step`` recorded for it
        (``within``: the index of the SyncWeights step it is part of, or None)."""
        self.note(f"  {action!r}" if within is not None else f"{action!r}")
        self._note_reach(action)
        obs = call_with_timeout(
            lambda: self.engine.apply(action),
            self.timeout,
            action.name,
            self.direct,
            self.recorder.timing,
        )
        problem = malformed(obs)
        if problem:
            raise AdapterError(RuleId.ADP_002, f"{action.name}: the adapter {problem}")
        try:  # the byte oracle's equality: within the engine's declared numerics
            obs = within_tolerance(obs, tolerance(self.engine))
        except ValueError as e:
            raise AdapterError(RuleId.ADP_002, f"the adapter's {e}") from None
        caps = self.engine.capabilities
        where = f"endpoint {getattr(action, 'endpoint', '')}"
        # in stable_key order: which branch's violations a failing step reports, and the
        # order of the outcomes a trace records, must not depend on PYTHONHASHSEED
        branches = [(s, *b) for s in ordered(self.states) for b in spec.memo_step(s, action)]
        if not branches:
            raise NotEnabled(f"{action!r} is not enabled in the model")
        judged = [
            (s2, o, self.named(s, action, obs, compare(o, obs, caps, where)))
            for s, s2, o in branches
        ]
        step = Step(len(self.steps), action, obs, tuple(o for _, o, _ in judged), within=within)
        self.steps.append(step)
        agreeing = [(s2, o) for s2, o, v in judged if not v]
        if not agreeing:
            self.fail(explanation([v for _, _, v in judged]), step.step)
        self.judge_evidence(action, obs, agreeing)
        if isinstance(action, UpdateWeights):
            # A flush that could not complete (its outcomes say what a claim of success
            # would have had to show; REACH-003, noted by ``_note_reach``), or an update that
            # reported failure: the spec allows several fail-closed branches, and what the
            # endpoint serves next settles them.
            refusal = any(o.completion is not None for _, _, o in branches)
            if refusal or obs.status is Status.REJECTED:
                self.unsettled = True
        self.states = frozenset(narrowed(s2, action, obs, caps) for s2, _ in agreeing)
        self.note_failed(action, obs, [o for _, o in agreeing])
        if self.unsettled and len(self.states) == 1:
            # A later observation (or this one) settled which branch the system took.
            self.unsettled, self.unproven = False, True
        if self.unproven:
            # FC-002's evidence: an observation, from the settling one on, that could tell
            # what the update installed (``tells_installed_apart``), agreeing with the model.
            lora = bool(getattr(action, "lora", False))
            served = next((o.served for _, o in agreeing if o.served is not None), None)
            if tells_installed_apart(obs, caps, self.recorder.cold, served, lora):
                self.recorder.exercised[RuleId.FC_002] += 1
                self.unproven = False
        self.pool = None
        return step

    def named(self, before: State, action: Action, obs, violations: list[Violation]):
        """``violations`` with each restart-oracle finding named by its mechanism
        (``restart_mechanism``)."""
        prefix = getattr(action, "prefix", None)
        if prefix is None or not violations:
            return violations
        lora = bool(getattr(action, "lora", False))
        ep = before.endpoint(action.endpoint)
        failed = action.endpoint in self.failed
        caps = self.engine.capabilities
        oracle = self.recorder.cold
        return [
            restart_mechanism(v, ep, prefix, obs, caps, oracle, lora, failed) for v in violations
        ]

    def note_failed(self, action: Action, obs, agreeing) -> None:
        """Track ``Cursor.failed``: an update that reported failure where the spec blames a
        failure midway (FC-004, RNK-002) marks its endpoint; an update that completed, or a
        restart, clears it."""
        index = getattr(action, "endpoint", None)
        if index is None:
            return
        updates = (UpdateWeights, FinishWeightUpdate, UpdateWeightChunk, FaultUpdateFailsMidway)
        if isinstance(action, updates) and any(
            o.observation.status is Status.REJECTED
            and o.because.status in (RuleId.FC_004, RuleId.RNK_002)
            for o in agreeing
        ):
            self.failed |= {index}
        elif isinstance(action, (UpdateWeights, FinishWeightUpdate, Restart)) and (
            obs.status is Status.OK
        ):
            self.failed -= {index}

    def judge_evidence(self, action: Action, obs, agreeing) -> None:
        """Count, per rule, the agreeing comparisons that could have shown its violation,
        and collect the notes of the branches the system took."""
        caps = self.engine.capabilities
        got = obs.response
        lora = bool(getattr(action, "lora", False))
        restart_oracle = Capability.RESTART_ORACLE in caps
        for _, o in agreeing:
            if got is not None and got.cold is not None and o.served is not None:
                self.recorder.cold.record(o.served, lora, got.cold)
            if (
                got is not None
                and got.fresh is not None
                and o.served is not None
                and restart_oracle
            ):
                # The restart oracle's bytes are evidence (DER-001, or INV-003 through the
                # oracle) once they have told two versions apart for the prompt.
                self.recorder.cold.record_fresh(o.served, lora, got.fresh)
        index = getattr(action, "endpoint", None)
        for _, o in agreeing:
            for rule_id in evidence(o, obs, caps, self.recorder.cold, lora, self.states, index):
                self.recorder.exercised[rule_id] += 1
            if o.note:
                self.recorder.notes.add(f"{o.note} (endpoint {getattr(action, 'endpoint', '')})")
            if o.served is not None and o.served.off_policy and o.served.stale:
                self.recorder.notes.add(
                    f"off-policy reuse declared by the policy: endpoint {o.served.endpoint} "
                    f"prefix {o.served.prefix} reused {sorted(map(str, o.served.stale))}"
                )

    def check_model(self) -> None:
        """The model's own invariants on every candidate: a spec bug fails loudly."""
        for s in self.states:
            bad = check_state(s, ledger=not self.off_contract)
            if bad:
                raise SpecError(f"the model broke its own invariants: {bad}")
        # Checked entries leave the ledger (as in ``model.explore``: no guard reads it), so
        # a step costs the same at step 50,000 as at step 1: replay is linear in length.
        self.states = frozenset(s.without_ledger() if s.ledger else s for s in self.states)

    # ----- verdicts -------------------------------------------------------------------

    def snapshot(self, violations: list[Violation]) -> Run:
        steps, actions = list(self.steps), list(self.actions)
        return Run(self.configs, self.policy, actions, steps, violations, self.pending)

    def refused(self, violation: Violation) -> None:
        """The client raised for this configuration: record it, and set the example aside
        (``Refused``) so that the search judges the client on the others."""
        self.note(f"client refused: {violation}")
        self.recorder.refused.setdefault(violation.rule, violation)
        self.recorder.exercised[violation.rule] += 1
        raise Refused(violation)

    def client_violation(self, violations: list[Violation]) -> None:
        """A plan that breaks a client rule is recorded at once but does not stop the run:
        the engine is driven with the client's own plan, so the stale reuse it causes can
        be observed. A client violation without a consequence is still a FAIL."""
        self.note("client violated: " + "; ".join(str(v) for v in violations))
        for v in violations:
            self.recorder.shown.setdefault(v.rule, self.recorder.examples)
        self.pending += violations
        self.off_contract = True
        soft = self.recorder.soft
        focused = self.focus is None or self.focus in {v.rule for v in self.pending}
        if focused and (soft is None or len(self.actions) < len(soft.actions)):
            self.recorder.soft = self.snapshot(list(self.pending))

    def end_focus(self, rules: Collection[RuleId], step: int) -> None:
        """A run focused on one of ``rules``, client violations ``client_violation`` has
        recorded, ends here: ``fail`` at ``step`` raises its ``ConformanceFailure``. A
        client's mistake need not have a visible consequence to be shown (an early reset
        harms only the traffic admitted meanwhile), and the search stops at its first kill.
        An unfocused run, or one focused on another rule, goes on (nothing happens)."""
        if self.focus is not None and self.focus in rules:
            self.fail([], step)

    def fail(self, violations: list[Violation], step: int) -> None:
        violations = self.pending + [self.blame_server_info(v) for v in violations]
        for v in violations:
            self.recorder.shown.setdefault(v.rule, self.recorder.examples)
        if self.focus is not None and self.focus not in {v.rule for v in violations}:
            for v in violations:
                self.recorder.other.setdefault(v.rule, v)
            if self.recorder.set_aside is None:
                self.recorder.set_aside = self.snapshot(violations)
            raise Diverged(violations)
        tolerated = self.recorder.tolerate
        if tolerated and self.focus is None and {v.rule for v in violations} <= tolerated:
            for v in violations:
                self.recorder.warned.setdefault(v.rule, v)
            if self.recorder.warned_run is None:
                self.recorder.warned_run = self.snapshot(violations)
            raise Diverged(violations)  # noted; the search goes on
        if self.recorder.failure is None:
            self.recorder.failure = self.snapshot(violations)
        self.note("violated: " + "; ".join(str(v) for v in violations))
        raise ConformanceFailure(violations, step)

    def blame_server_info(self, v: Violation) -> Violation:
        """Stale reuse on an endpoint declared to misreport its radix cache names the server
        info as the broken contract: INV-001 was never waived for it."""
        index = v.where.split()[1] if v.where.startswith("endpoint ") else ""
        if v.rule != RuleId.INV_001 or not index.isdigit() or int(index) >= len(self.configs):
            return v
        config = self.configs[int(index)]
        if not config.misreports:
            return v
        info = dict(config.info or ())
        return evolve(v, where=f"{v.where} (its server info {info!r} misreports the radix cache)")

    def _note_reach(self, action: Action) -> None:
        """Observe the action with the model's sometimes-properties (``model.properties``,
        the REACH rules): reached if it is on some candidate state; the path's memory
        follows the first candidate."""
        states = list(self.states)
        for i, prop in enumerate(SOMETIMES):
            memory = self.reach_memory[i]
            for k, state in enumerate(states):
                after, hit = prop.observe(memory, state, action)
                if k == 0:
                    self.reach_memory[i] = after
                if hit:
                    self.recorder.reached.add(prop.rule)
