"""Replaying actions: against an adapter, against a recorded trace (model only), and the
shrinker that turns a failing run into a minimal counterexample.

The shrinker works on the durable record, the action list, not on Hypothesis's choice
sequence: delta debugging (ddmin) over top-level steps, with weight versions renumbered so
that a step can go without breaking the ones after it, then plainer endpoint configs and
client policy. Each candidate is replayed from a fresh start; one is kept only if it still
breaks one of the rules the original run broke. The result is 1-minimal in steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations

from attrs import evolve, frozen

from ..adapters.protocol import ClientAdapter, EngineAdapter
from ..model.actions import (
    Action,
    BeginWeightUpdate,
    FaultUpdateFailsMidway,
    SyncWeights,
    TraceError,
    UpdateWeights,
)
from ..model.capabilities import NEEDED_BY_ACTION, Capability
from ..model.checks import SpecError, Violation
from ..model.client import Plan
from ..model.observation import Observation
from ..model.rules import BY_ID
from ..model.semantics import enabled
from ..model.state import Bounds, Config, Policy
from ..model.vocabulary import CacheMode, Lane, PauseMode, Tier
from . import strategies
from .calls import Timing
from .errors import AdapterError, BeyondModel, ConformanceFailure, NotEnabled, Refused
from .lockstep import MACHINE_BOUNDS, Lockstep
from .program import RecordedProgram
from .record import Recorder, Run
from .trace import Step, Trace
from .verdict import ReplayKind

VERSIONED = (SyncWeights, UpdateWeights, FaultUpdateFailsMidway, BeginWeightUpdate)


@frozen
class Replayed:
    """How one replay ended. ``kind``: a ``ReplayKind`` (INVALID: a step the model does
    not enable). ``hard``: violations that stopped it; ``soft``: client violations seen."""

    kind: ReplayKind
    hard: tuple[Violation, ...]
    soft: tuple[Violation, ...]
    run: Run
    message: str = ""

    @property
    def violations(self) -> tuple[Violation, ...]:
        return self.soft + tuple(v for v in self.hard if v not in self.soft)


def _deltas(actions: list[Action]) -> list[int]:
    """Each versioned action's version relative to the trainer's version at its turn."""
    trainer, out = 0, []
    for a in actions:
        if isinstance(a, VERSIONED):
            out.append(a.version - trainer)
            trainer = max(trainer, a.version)
        else:
            out.append(0)
    return out


def replay_actions(
    engine: EngineAdapter,
    client: ClientAdapter,
    configs: tuple[Config, ...],
    policy: Policy,
    actions: list[Action],
    deltas: list[int] | None = None,
    bounds: Bounds = MACHINE_BOUNDS,
    timeout: float = 60.0,
    recorder: Recorder | None = None,
    timing: Timing | None = None,
    calls: bool = False,
) -> Replayed:
    """Run ``actions`` in lockstep from a fresh start. With ``deltas``, versioned actions
    are renumbered relative to the trainer's version at their turn (for shrinking).
    ``timing``: a run's ``Timing`` to add the replay's engine and client seconds to (when
    no ``recorder`` is given). ``calls``: the top-level actions are a client's calls (a
    ``kvfence serve`` session), judged by the client obligations (``CallSequence``), the
    last settled at the end as the session's were."""
    lock = Lockstep(engine, client, recorder or Recorder(timing), bounds, timeout, calls=calls)
    try:
        lock.start(configs, policy)
        for i, action in enumerate(actions):
            if deltas is not None and isinstance(action, VERSIONED):
                trainer = next(iter(lock.states)).trainer
                action = evolve(action, version=trainer + deltas[i])
                if deltas[i] == 0 and not all(enabled(s, action, bounds) for s in lock.states):
                    # The action that pushed the version it reused was shrunk away: push it.
                    action = evolve(action, version=trainer + 1)
            lock.run(action)
            lock.check_model()
        if lock.calls is not None:
            lock.calls.end()
    except ConformanceFailure as e:
        hard = tuple(v for v in e.violations if v not in lock.pending)
        return Replayed(ReplayKind.FAIL, hard, tuple(lock.pending), lock.snapshot(e.violations))
    except Refused as e:
        run = lock.snapshot([*lock.pending, e.violation])
        return Replayed(ReplayKind.FAIL, (e.violation,), tuple(lock.pending), run)
    except (NotEnabled, BeyondModel) as e:
        return Replayed(ReplayKind.INVALID, (), tuple(lock.pending), lock.snapshot([]), str(e))
    except AdapterError as e:
        return Replayed(ReplayKind.ERROR, (), tuple(lock.pending), lock.snapshot([]), str(e))
    kind = ReplayKind.FAIL if lock.pending else ReplayKind.PASS
    return Replayed(kind, (), tuple(lock.pending), lock.snapshot(list(lock.pending)))


def holding(bounds: Bounds, actions: Sequence[Action]) -> Bounds:
    """``bounds`` widened to hold ``actions``: their newest version, and every prompt and
    request ID they name (a battery scenario's third prompt and request, a long recorded
    session's versions). Bounds are the search's, not the spec's: a trace outside them is
    still a run of the model."""
    newest = max((getattr(a, "version", 0) for a in actions), default=0)
    prefixes = [p for a in actions if isinstance(p := getattr(a, "prefix", None), str)]
    rids = [r for a in actions if isinstance(r := getattr(a, "rid", None), str)]
    return evolve(
        bounds,
        versions=max(bounds.versions, newest),
        prefixes=tuple(dict.fromkeys((*bounds.prefixes, *prefixes))),
        rids=tuple(dict.fromkeys((*bounds.rids, *rids))),
    )


def _without_fp8_dtype(info):
    return None if info is None else tuple(kv for kv in info if kv[0] != "kv_cache_dtype")


def _simpler_setups(configs: tuple[Config, ...], policy: Policy):
    """Plainer variants of a setup, one change at a time, each one the generator could
    have drawn (``strategies.configs``): FP8 off takes the FP8 ``kv_cache_dtype`` out of
    the server info, and a plainer server info keeps it while FP8 is on."""
    for i, c in enumerate(configs):
        plain_info = (strategies.REPORTS_WHEN_ON if c.radix else strategies.REPORTS_WHEN_OFF)[0]
        if c.fp8_kv and plain_info is not None:
            plain_info = tuple(sorted((*plain_info, ("kv_cache_dtype", "fp8_e4m3"))))
        for change in (
            {"draft": False},
            {"encoder": False},
            {"fp8_kv": False, "info": _without_fp8_dtype(c.info)},
            {"lora": False},
            {"tiers": frozenset({Tier.DEVICE})},
            {"lane": Lane.STANDARD},
            {"info": plain_info},
        ):
            simpler = evolve(c, **change)
            if simpler != c:
                yield (*configs[:i], simpler, *configs[i + 1 :]), policy
    for change in (
        {"mode": CacheMode.AUTO},
        {"flush_cache": None},
        {"pause_mode": PauseMode.RETRACT},
    ):
        simpler_policy = evolve(policy, **change)
        if simpler_policy != policy:
            yield configs, simpler_policy


def reference_contrast(
    engine: EngineAdapter, client: ClientAdapter, rules: Iterable[str] = ()
) -> tuple[EngineAdapter, ClientAdapter] | None:
    """The system a counterexample of ``engine`` + ``client`` must pass on to show their
    fault: the side at fault, swapped for the reference. ``rules``: every rule the run
    broke. When one is a client rule (CLI-*), the client is at fault (a stale hit it then
    causes is its consequence, on any engine), so the contrast is the same engine with the
    reference client; otherwise the engine is, and the contrast is the reference engine
    with the same client. When that side already is the reference, the other side is
    swapped; ``None`` for the reference itself."""
    from ..adapters import registry

    on_engine = getattr(engine, "name", "") != "reference"
    on_client = getattr(client, "name", "") != "reference"
    judges_client = any(BY_ID[r].kind == "CLI" for r in rules if r in BY_ID)
    if on_client and (judges_client or not on_engine):
        return engine, registry.client("reference")
    if on_engine:
        return registry.engine("reference"), client
    return None


def shrink(
    engine: EngineAdapter,
    client: ClientAdapter,
    run: Run,
    targets: set[str],
    hard: bool,
    bounds: Bounds = MACHINE_BOUNDS,
    timeout: float = 60.0,
    budget: int = 400,
    timing: Timing | None = None,
    contrast: tuple[EngineAdapter, ClientAdapter] | None = None,
    calls: bool = False,
) -> Replayed | None:
    """The smallest run that still breaks a rule in ``targets`` (among the violations that
    stopped it if ``hard``, else among its client violations), the same one the original
    broke first (a shrink step that trades it for another rule is rejected), or ``None`` if
    the original does not reproduce (a nondeterministic SUT). ``budget``: replays at most.
    ``timing``: the check's ``Timing``, which every replay's engine and client calls add to.

    ``contrast`` (an engine and a client, ``reference_contrast``): a candidate that breaks
    a target on the contrast too is rejected, since it shows no fault of the system under
    test (a standard-lane stale hit a faulty client causes on any engine, kept while the
    engine's own exact-lane fault is shrunk away). The original run is not held to it: it
    is what the search found, and the caller says so if it does not discriminate.
    ``calls``: the run is a ``kvfence serve`` session (``replay_actions``)."""

    lead: list[str] = []  # the first target rule the original breaks: kept stable

    def first(r: Replayed) -> str | None:
        return next((v.rule for v in (r.hard if hard else r.soft) if v.rule in targets), None)

    def breaks(r: Replayed) -> bool:
        rule = first(r) if r.kind is ReplayKind.FAIL else None
        return rule is not None and (not lead or rule == lead[0])

    def attempt(cfgs, pol, acts, dts) -> Replayed | None:
        r = replay_actions(
            engine, client, cfgs, pol, acts, dts, bounds, timeout, timing=timing, calls=calls
        )
        if not breaks(r):
            return None
        if contrast is not None:
            c = replay_actions(
                *contrast, cfgs, pol, acts, dts, bounds, timeout, timing=timing, calls=calls
            )
            if c.kind is ReplayKind.FAIL and first(c) is not None:
                return None
        return r

    configs, policy, actions = run.configs, run.policy, list(run.actions)
    deltas = _deltas(actions)
    best = replay_actions(
        engine,
        client,
        configs,
        policy,
        actions,
        deltas,
        bounds,
        timeout,
        timing=timing,
        calls=calls,
    )
    if not breaks(best):
        return None
    lead.append(first(best))
    tries = 1
    n = 2
    while len(actions) >= 2 and tries < budget:
        chunk = -(-len(actions) // n)
        for start in range(0, len(actions), chunk):
            cand = actions[:start] + actions[start + chunk :]
            cand_deltas = deltas[:start] + deltas[start + chunk :]
            r = attempt(configs, policy, cand, cand_deltas)
            tries += 1
            if r is not None:
                actions, deltas, best = cand, cand_deltas, r
                n = max(n - 1, 2)
                break
        else:
            if n >= len(actions):
                break
            n = min(len(actions), 2 * n)
    # ddmin removes contiguous chunks; an action and the one that undoes its phase (Sleep
    # and WakeUp, Pause and Continue) are often apart: try every pair too.
    improved = True
    while improved and len(actions) >= 2 and tries < budget:
        improved = False
        for i, j in combinations(range(len(actions)), 2):
            keep = [k for k in range(len(actions)) if k not in (i, j)]
            cand, cand_deltas = [actions[k] for k in keep], [deltas[k] for k in keep]
            r = attempt(configs, policy, cand, cand_deltas)
            tries += 1
            if r is not None:
                actions, deltas, best, improved = cand, cand_deltas, r, True
                break
            if tries >= budget:
                break
    if engine.fixed_configs is None:
        improved = True
        while improved and tries < budget:
            improved = False
            for cand_configs, cand_policy in _simpler_setups(configs, policy):
                r = attempt(cand_configs, cand_policy, actions, deltas)
                tries += 1
                if r is not None:
                    configs, policy, best, improved = cand_configs, cand_policy, r, True
                    break
    return best


# ----- model-only validation of a recorded trace ------------------------------------------


class RecordedEngine:
    """An 'engine' that answers with a trace's recorded observations, in order, so the
    lockstep judges what a real system once did against the spec (trace validation)."""

    name = "recorded"

    def __init__(self, trace: Trace) -> None:
        self.fixed_configs = trace.configs
        self.steps = [s for s in trace.steps if s.observed is not None]
        self.capabilities = recorded_capabilities(trace.steps, trace.declared, trace.unanswered)
        self.infos = [
            info
            for s in trace.steps
            for info in (
                [c.server_info for c in s.program.infos]
                if s.program is not None
                else [p.server_info for p in s.shown]
            )
        ]
        self.cursor = 0
        self.info_cursor = 0

    def unconsumed(self) -> Step | None:
        """The first recorded engine step the replay never reached, if any."""
        return self.steps[self.cursor] if self.cursor < len(self.steps) else None

    def start(self, configs: tuple[Config, ...]) -> None:
        self.cursor = self.info_cursor = 0

    def apply(self, action: Action) -> Observation:
        if self.cursor >= len(self.steps):
            raise TraceError(f"the trace ends before {action!r}")
        step = self.steps[self.cursor]
        self.cursor += 1
        if step.action != action:
            raise TraceError(
                f"line {step.line}: recorded {step.action!r}, but the spec drives {action!r} here"
            )
        assert step.observed is not None
        return step.observed

    def server_info(self, endpoint: int) -> Mapping[str, object] | None:
        info = self.infos[self.info_cursor] if self.info_cursor < len(self.infos) else None
        self.info_cursor += 1
        return info

    def close(self) -> None:
        """Nothing to release."""


def recorded_capabilities(
    steps: list[Step], declared: frozenset[Capability] = frozenset(), unanswered: bool = False
) -> frozenset[Capability]:
    """Claim only what the trace recorded: a field no step carries is not evidence, so its
    rules judge nothing rather than pass on silence; an action capability only where an
    action it unlocks was recorded (a trace from an adapter without ``pause`` has syncs that
    drive UpdateWeights alone, and is replayed that way). Two declared capabilities (the
    header's ``declared``) make a recorded ``None`` a reading, judged as the live lockstep
    judges it, not silence: ``flush_result`` where a step recorded ``"flushed": null``
    (``unanswered``: a flush the spec expected a result of, answered without one: failed,
    FC-003; a step without the key says nothing), and ``weights_probe`` where a probe was
    recorded (its ``weights`` ``None`` means torn weights, FC-004, not an unread field)."""
    C = Capability
    names = {type(s.action).__name__ for s in steps}
    caps = {NEEDED_BY_ACTION[n] for n in names if n in NEEDED_BY_ACTION}
    obs = [s.observed for s in steps if s.observed is not None]
    probed = C.WEIGHTS_PROBE in declared and any(o.view is not None for o in obs)
    if probed or any(o.view is not None and o.view.weights is not None for o in obs):
        caps.add(C.WEIGHTS_PROBE)
    if any(o.view is not None and o.view.cache is not None for o in obs):
        caps.add(C.CACHE_PROBE)  # never exact_cache: a recorded listing may hold less
    responses = [o.response for o in obs if o.response is not None]
    if any(r.uses is not None for r in responses):
        caps.add(C.PROVENANCE)
    if any(r.sampled is not None for r in responses):
        caps.add(C.ATTRIBUTION)
    if any(r.output is not None and r.cold is not None for r in responses):
        caps.add(C.BYTE_ORACLE)
    answered = any(o.flushed is not None for o in obs)
    if answered or (unanswered and C.FLUSH_RESULT in declared):
        caps.add(C.FLUSH_RESULT)
    if any(r.fresh is not None for r in responses):
        caps.add(C.RESTART_ORACLE)
    if any(r.stored is not None for r in responses):
        caps.add(C.STORE)  # a load from the shared store, shown with what computed it
    return frozenset(caps)


class RecordedClient:
    """A client that answers with a trace's recorded plans, in order."""

    name = "recorded"

    def __init__(self, trace: Trace) -> None:
        self.plans: list[Plan] = [plan for s in trace.steps for plan in s.answers]
        self.cursor = 0

    @property
    def consumed(self) -> bool:
        return self.cursor >= len(self.plans)

    def resolve(self, policy: Policy, info: Mapping[str, object] | None) -> Plan:
        if self.cursor >= len(self.plans):
            raise TraceError("the trace records fewer plans than its syncs need")
        plan = self.plans[self.cursor]
        self.cursor += 1
        return plan


def trace_actions(trace: Trace) -> list[Action]:
    """The top-level actions of a trace (SyncWeights sub-steps are driven, not listed)."""
    return [s.action for s in trace.steps if s.within is None]


def undiscriminating(trace: Trace) -> str:
    """Why the trace's recorded observations cannot show stale reuse (``""`` when they
    can): a served request recorded as a bare status, with no response (its output, the
    KV it used), as in a trace cut to its statuses. Judged against such a trace the spec
    can only agree: UNKNOWN, never FIXED."""
    for s in trace.steps:
        o = s.observed
        served = o is not None and o.status.value == "ok"
        if s.action.name == "ServeRequest" and served and o.response is None:
            where = f"line {s.line}" if s.line else f"step {s.step}"
            return (
                f"{where}: a served request is recorded without its response, so the "
                "recorded observations cannot show stale reuse"
            )
    return ""


def unobserved_failure(trace: Trace) -> str:
    """Why the trace's recorded FAIL cannot be shown fixed from its recorded observations
    (``""`` when it can): the field a recorded violation read (``where``: ``endpoint 0
    flushed``, ``... view.cache``, ``... response.hit``) is absent from the observation
    recorded at its step, as when an engine declared a flush result and answered none, or
    a trace was cut to its statuses. Nothing observed is no evidence: UNKNOWN, never FIXED."""
    verdict = trace.verdict or {}
    if verdict.get("verdict") != "FAIL":
        return ""
    at = verdict.get("step")
    step = next((s for s in trace.steps if s.step == at and s.within is None), None)
    if step is None or step.observed is None:
        return ""
    for v in verdict.get("violations") or ():
        where = str(v.get("where", "")) if isinstance(v, dict) else ""
        path = where.split()[-1] if where.split() else ""
        if path.split(".")[0] not in ("flushed", "aborted", "view", "response"):
            continue
        value: object = step.observed
        for name in path.split("."):
            value = getattr(value, name, None)
            if value is None:
                return (
                    f"step {at}: the recorded FAIL of {v.get('rule')} read {path}, which the "
                    "recorded observation does not hold, so the spec cannot judge it fixed"
                )
    return ""


def replay_trace(
    trace: Trace,
    engine: EngineAdapter | None,
    client: ClientAdapter | None,
    timeout: float = 60.0,
) -> Replayed:
    """Replay ``trace`` against ``engine`` (and ``client``), or with both ``None`` judge
    its recorded observations against the spec alone. ERROR, never PASS, when the trace
    has no top-level action, or when model-only validation passes without consuming every
    recorded step and plan (the spec never judged them)."""
    empty = Run(trace.configs, trace.policy, [], [], [])
    actions = trace_actions(trace)
    if not actions:
        return Replayed(ReplayKind.ERROR, (), (), empty, "the trace has no top-level action")
    recorded = None
    if engine is None:
        programs = any(s.program is not None for s in trace.steps)
        answers = RecordedProgram(trace.steps) if programs else RecordedClient(trace)
        engine, client = recorded = RecordedEngine(trace), answers
    assert client is not None
    # A long recorded session (``kvfence serve``) may push more versions than a search
    # draws: the bounds widen to hold the trace (they are the search's, not the spec's).
    keyed = any(getattr(a, "namespace", None) is not None for a in actions)
    bounds = evolve(holding(MACHINE_BOUNDS, actions), namespaces=keyed)
    blind = (undiscriminating(trace) or unobserved_failure(trace)) if recorded is not None else ""
    try:
        out = replay_actions(
            engine,
            client,
            trace.configs,
            trace.policy,
            actions,
            bounds=bounds,
            timeout=timeout,
            calls=trace.header.get("profile") == "serve",  # a trainer's calls over HTTP
        )
    except TraceError as e:
        return Replayed(ReplayKind.ERROR, (), (), empty, str(e))
    except SpecError as e:
        # The recorded answers led the model into a state its own invariants forbid: what
        # the engine really answered there is not in the trace.
        kind = ReplayKind.UNKNOWN if blind else ReplayKind.ERROR
        return Replayed(kind, (), (), empty, f"{blind or 'the trace cannot be judged'} ({e})")
    if blind and out.kind is ReplayKind.PASS:
        return evolve(out, kind=ReplayKind.UNKNOWN, message=blind)
    if recorded is not None and out.kind is ReplayKind.PASS:
        left = recorded[0].unconsumed()
        if left is not None or not recorded[1].consumed:
            where = f"line {left.line} ({left.action!r})" if left else "a recorded plan"
            message = f"the spec never drove {where}: the trace does not follow the spec's sync"
            return evolve(out, kind=ReplayKind.ERROR, message=message)
    return out
