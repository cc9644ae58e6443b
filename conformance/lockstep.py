"""Model and system under test in lockstep, one action at a time.

``Lockstep`` is the core of every check: the Hypothesis machine draws actions into it, the
shrinker and ``kvfence replay`` feed it recorded ones, and model-only trace validation
feeds it recorded observations. For each action it asks the SUT, steps the model, and keeps
only the model branches the observation agrees with (the model forks where the spec allows
a choice); no branch left is a FAIL naming the rules broken. An adapter that raises, hangs
or answers garbage is an ERROR (ADP-001, ADP-002).
"""

from __future__ import annotations

import _signal
import concurrent.futures
import os
import queue
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from itertools import product
from typing import Any

from attrs import define, evolve, frozen

from kvfence.adapters.protocol import (
    AdapterFailure,
    ClientAdapter,
    EngineAdapter,
    Unsupported,
)
from kvfence.model import candidates
from kvfence.model import semantics as spec
from kvfence.model.actions import (
    ACTION_TYPES,
    Action,
    ServeRequest,
    StartRequest,
    SyncWeights,
    TraceError,
    UpdateWeights,
)
from kvfence.model.capabilities import (
    NEEDED_BY_ACTION,
    PROFILE_CAPABILITIES,
    Capability,
    needed,
    parse,
)
from kvfence.model.checks import (
    ColdBytes,
    SpecError,
    Violation,
    check_state,
    compare,
    evidence,
    misreported,
)
from kvfence.model.client import (
    REPORTS_WHEN_OFF,
    REPORTS_WHEN_ON,
    Plan,
    judge_plan,
    plain_form,
    resolve_plan,
)
from kvfence.model.observation import malformed
from kvfence.model.rules import BY_ID
from kvfence.model.state import Bounds, Config, Policy, State, initial_state, with_profile
from kvfence.model.vocabulary import CacheMode, PauseMode, Phase

from .trace import ProgramRecord, Step, step_json

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


class ConformanceFailure(AssertionError):
    """The SUT did something the spec forbids. ``violations`` name the rules."""

    def __init__(self, violations: list[Violation], step: int) -> None:
        self.violations = violations
        self.step = step
        super().__init__("; ".join(str(v) for v in violations))


class AdapterError(Exception):
    """The SUT or its adapter could not answer (crash, hang, malformed observation).
    ``raised``: the adapter call raised an ``Exception`` of its own (not a hang, not an
    ``AdapterFailure`` or malformed answer): for a client resolver that is a refusal the
    checker can judge."""

    def __init__(self, rule: str, message: str, raised: bool = False) -> None:
        self.rule = rule
        self.raised = raised
        super().__init__(f"{rule}: {message}")


class Refused(Exception):
    """The client under test raised instead of answering for one configuration: the
    refusal is recorded (``Recorder.refused``) and the example set aside, so the run goes on
    to judge the client on the others."""

    def __init__(self, violation: Violation) -> None:
        self.violation = violation
        super().__init__(str(violation))


class Diverged(Exception):
    """The SUT broke rules other than the one a focused run is after: this run ends
    without a verdict, and the search goes on (``Lockstep.focus``)."""


class NotEnabled(Exception):
    """A recorded action the model does not enable at its turn (replay and shrinking)."""


@define(slots=True)
class Timing:
    """Where a run's time went: seconds spent inside the system under test, per side.

    ``engine_seconds`` / ``engine_calls``: every call into the engine adapter that
    ``call_with_timeout`` makes for the run (``start``, which for a real engine includes
    importing it and loading the model; ``apply`` per action; ``server_info``; ``close``),
    shrinking's replays included. ``client_seconds`` / ``client_calls``: the client
    resolver's ``resolve`` calls. Seconds are ``time.perf_counter`` spans taken on the
    thread that runs the call (this one for an in-process adapter, the adapter worker
    otherwise), so a thread handoff counts as the checker's time, not the engine's; a call
    that times out counts the time waited for it. A client *program*'s own code runs inside
    the checker's sync and is not split out: only its engine calls are engine time.
    Everything else in a run's wall time (the model, Hypothesis, judging, writing the
    counterexample) is the checker's own (``runner.TimeSplit``).
    """

    engine_seconds: float = 0.0
    client_seconds: float = 0.0
    engine_calls: int = 0
    client_calls: int = 0

    def add(self, seconds: float, client: bool = False) -> None:
        """Account one call of ``seconds`` to the engine, or to the client resolver."""
        if client:
            self.client_seconds += seconds
            self.client_calls += 1
        else:
            self.engine_seconds += seconds
            self.engine_calls += 1


class Recorder:
    """What a run learns across every lockstep run it hosts.

    ``exercised``: rule ID -> comparisons that gave it evidence. ``reached``: REACH rules
    seen. ``failure``: ``(configs, policy, actions, lines, violations)`` of the first
    failing run; ``soft``: the same for the shortest run whose client broke a rule without
    (yet) a visible consequence. ``error``: ``(Run, AdapterError)`` of the first run an
    adapter error ended, kept so that nothing recorded before the error is lost (and so
    that no later example calls a hung adapter again). ``other``: rule ID -> the first
    violation of it in an example a focused run set aside; ``set_aside``: the first such
    run, so that a focused run that FAILs only on it still writes a counterexample.
    ``refused``: rule ID -> the violation of a configuration the client raised on.
    ``skipped``: rule ID -> why the client under test cannot be judged by it (a program,
    for plan rules): SKIP. ``timing``: the seconds spent inside the engine and the client
    (``Timing``); pass one to share it across recorders (shrinking's replays).
    """

    def __init__(self, timing: Timing | None = None) -> None:
        self.timing = Timing() if timing is None else timing
        self.exercised: Counter[str] = Counter()
        self.reached: set[str] = set()
        self.examples = 0
        self.steps = 0
        self.failure: Run | None = None
        self.cold = ColdBytes()
        self.notes: set[str] = set()
        self.soft: Run | None = None
        self.error: tuple[Run, AdapterError] | None = None
        self.other: dict[str, Violation] = {}
        self.set_aside: Run | None = None
        self.refused: dict[str, Violation] = {}
        #: rule -> why it binds only the other kind of client here (N/A, not at stake)
        self.not_at_stake: dict[str, str] = {}


class Run:
    """One lockstep run as data: setup, the top-level actions, the recorded ``Step``
    values, violations (``pending``: the client's, recorded on the way)."""

    def __init__(self, configs, policy, actions, steps, violations, pending=()) -> None:
        self.configs: tuple[Config, ...] = configs
        self.policy: Policy = policy
        self.actions: list[Action] = actions
        self.steps: list[Step] = steps
        self.violations: list[Violation] = violations
        self.pending: list[Violation] = list(pending)

    @property
    def lines(self) -> list[dict[str, Any]]:
        """The steps as trace lines (JSON data), serialised on demand."""
        return [step_json(s) for s in self.steps]

    @property
    def hard(self) -> list[Violation]:
        """The violations that stopped the run (not the client's, recorded on the way)."""
        return [v for v in self.violations if v not in self.pending]


class _Worker:
    """One daemon thread that runs adapter calls in turn. A daemon, unlike a thread pool's
    workers, is not joined at interpreter exit: a call that hangs for ever cannot keep
    kvfence (or pytest) from exiting with its verdict."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="kvfence-adapter", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, future = self.jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            started = time.perf_counter()
            try:
                result = fn()
            except BaseException as e:  # handed to the caller, which classifies it
                future.seconds = time.perf_counter() - started  # read by the caller
                future.set_exception(e)
            else:
                future.seconds = time.perf_counter() - started
                future.set_result(result)
            del fn, future

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.jobs.put((fn, future))
        return future


_WORKER: list[_Worker] = []
# A forked child (a process pool running matrix jobs) has none of its parent's threads:
# it must start its own worker rather than queue calls for one that does not exist there.
os.register_at_fork(after_in_child=_WORKER.clear)


class _Alarm(BaseException):
    """Raised into a direct (in-process) adapter call by the watchdog's SIGALRM. A
    ``BaseException``, so that an adapter's own ``except Exception`` does not swallow it."""


class _Watchdog:
    """One daemon thread per process that times direct calls: every ``PERIOD`` seconds it
    reads the running call's ``deadline`` and, once it has passed, sends SIGALRM to the
    main thread (again every period, so a call that swallows one alarm gets the next).
    A call costs two attribute writes, no system call and no thread handoff: on a loaded
    machine a per-call ``setitimer`` or handoff costs a scheduling round each."""

    PERIOD = 0.05

    def __init__(self) -> None:
        self.deadline: float | None = None  # monotonic; None while no direct call runs
        self.main = threading.main_thread().ident
        threading.Thread(target=self._loop, name="kvfence-watchdog", daemon=True).start()

    def _loop(self) -> None:
        while True:
            time.sleep(self.PERIOD)
            deadline = self.deadline
            if deadline is not None and time.monotonic() > deadline and self.main is not None:
                signal.pthread_kill(self.main, signal.SIGALRM)


_DOG: list[_Watchdog] = []
os.register_at_fork(after_in_child=_DOG.clear)  # a forked child has no watchdog thread

# The raw handler lookup: ``signal.getsignal`` maps it to an enum, which costs more (a
# failed enum lookup per call for a Python handler) than the whole direct call.
_getsignal = getattr(_signal, "getsignal", signal.getsignal)


def _on_alarm(signum: int, frame: Any) -> None:
    """Raise into the main thread only while a direct call is past its deadline (a late
    or foreign SIGALRM is ignored)."""
    deadline = _DOG[0].deadline if _DOG else None
    if deadline is not None and time.monotonic() > deadline:
        raise _Alarm


def _direct_possible() -> bool:
    """A direct call can be timed: POSIX ``pthread_kill``, the main thread, and SIGALRM
    free or already ours (not pytest-timeout's or a caller's)."""
    if (
        not hasattr(signal, "pthread_kill")
        or threading.current_thread() is not threading.main_thread()
    ):
        return False
    handler = _getsignal(signal.SIGALRM)
    if handler is not _on_alarm:
        if handler not in (signal.SIG_DFL, signal.SIG_IGN, None):
            return False
        signal.signal(signal.SIGALRM, _on_alarm)  # installed once, left in place
    return True


def _call_direct(fn: Callable[[], Any], timeout: float) -> Any:
    """Run ``fn`` in this thread under the watchdog (started on first use)."""
    if not _DOG:
        _DOG.append(_Watchdog())
    dog = _DOG[0]
    dog.deadline = time.monotonic() + timeout
    try:
        return fn()
    finally:
        dog.deadline = None


def is_direct(adapter: object) -> bool:
    """The adapter declares ``in_process = True``: its calls are plain Python in this
    process (the in-process reference, its mutants and designs, the reference client), so
    the checker calls it directly and times it with a watchdog (``call_with_timeout``)."""
    return getattr(adapter, "in_process", False) is True


_clock = time.perf_counter  # one global lookup per read on the direct path


def call_with_timeout(
    fn: Callable[[], Any],
    timeout: float,
    what: str,
    direct: bool = False,
    timing: Timing | None = None,
    client: bool = False,
) -> Any:
    """Run an adapter call; its exceptions and hangs become ``AdapterError`` (ADP-001).

    ``timing``: the run's ``Timing``, which gets the call's seconds (as a client resolver
    call when ``client``), whether it answered, raised or timed out: two
    ``perf_counter`` reads per call (issue 12: the explorer makes tens of thousands a second).

    ``direct`` (an in-process adapter, ``is_direct``): the call runs in this thread, and one
    watchdog thread per process (``_Watchdog``) interrupts it with SIGALRM once
    ``timeout`` has passed: no thread handoff per call (issue 12). Where SIGALRM cannot be
    used (not the main thread, someone else's handler in force), or for an adapter that is not
    in-process (a real engine, a user's resolver), calls run on one daemon worker thread,
    reused while calls return. A hung call's thread cannot be killed: it is abandoned (the
    next call gets a new worker; the process can still exit) and the run stops with ERROR
    naming the timeout. ``Unsupported`` is an error too: the checker only sends what the
    adapter's capabilities allow, so refusing it breaks the adapter contract. A
    ``TraceError`` (a recorded trace the spec cannot follow) passes through: it is the
    trace's fault, not an adapter's.
    """
    try:
        if direct and _direct_possible():
            started = _clock()
            try:
                return _call_direct(fn, timeout)
            except _Alarm:
                raise concurrent.futures.TimeoutError from None
            finally:
                if timing is not None:  # inlined ``Timing.add``: the hot path (explorer)
                    if client:
                        timing.client_seconds += _clock() - started
                        timing.client_calls += 1
                    else:
                        timing.engine_seconds += _clock() - started
                        timing.engine_calls += 1
        if not _WORKER:
            _WORKER.append(_Worker())
        started = time.perf_counter()
        future = _WORKER[0].submit(fn)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            _WORKER.pop()  # abandoned with its hung call; a daemon, so never joined
            raise
        finally:
            if timing is not None:
                # the worker's own span (set before the result); a hung call: the wait
                spent = getattr(future, "seconds", None)
                timing.add(time.perf_counter() - started if spent is None else spent, client)
    except concurrent.futures.TimeoutError:
        raise AdapterError("ADP-001", f"{what} did not answer within {timeout:g} s") from None
    except TraceError:
        raise
    except Unsupported as e:
        raise AdapterError(
            "ADP-001", f"{what}: unsupported ({e}), though the adapter's capabilities allow it"
        ) from e
    except AdapterFailure as e:
        raise AdapterError("ADP-001", f"{what} failed: {e}") from e
    except KeyboardInterrupt:
        raise
    except Exception as e:
        raise AdapterError("ADP-001", f"{what} raised {type(e).__name__}: {e}", raised=True) from e
    except BaseException as e:  # SystemExit from an adapter must not end the run as 'exit 0'
        raise AdapterError("ADP-001", f"{what} raised {type(e).__name__}: {e}") from e


def resolve(
    client: ClientAdapter, policy: Policy, info: Any, timeout: float, timing: Timing | None = None
) -> Plan | str:
    """The client's plan for one configuration, or the message of the ``Exception`` it
    raised instead (a refusal, which the caller records against that configuration's
    rule). Hangs, ``SystemExit`` and ill-typed plans stay adapter errors. ``timing``: the
    run's ``Timing`` (the call counts as client time)."""
    try:
        got = call_with_timeout(
            lambda: client.resolve(policy, info),
            timeout,
            "resolve",
            is_direct(client),
            timing,
            client=True,
        )
    except AdapterError as e:
        if e.raised:
            return str(e).removeprefix("ADP-001: ")
        raise
    check_plan(got)
    return got


def refusal(expected: Plan, error: str, where: str) -> Violation:
    """The violation of a configuration the client raised on: the rule that decides its
    flush, expected that plan's flush, got the exception."""
    return Violation(expected.rule_for("flush"), expected.flush, error, where)


def client_table(client: ClientAdapter, recorder: Recorder, timeout: float) -> list[Violation]:
    """Ask the client under test for its plan on every policy and every server-info shape
    (CLI-001..007), whatever the engine reports: a real engine shows one shape only, and a
    pure resolver is cheap to ask. Mismatches name the policy and the server info."""
    out: list[Violation] = []
    infos = [None if i is None else dict(i) for i in (*REPORTS_WHEN_ON, *REPORTS_WHEN_OFF)]
    # Both orders, so a resolver that remembers the first answer it saw is asked the
    # unsafe way round too.
    grid = list(product(CacheMode, (None, True, False), PauseMode, infos))
    answered, refused = 0, []
    for mode, flush, pause, info in grid + grid[::-1]:
        policy = Policy(mode, flush, pause)
        expected = resolve_plan(mode, flush, pause, info)
        got = resolve(client, policy, info, timeout, recorder.timing)
        where = f"plan.flush for policy {policy_words(policy)}, server info {info!r}"
        if isinstance(got, str):
            out.append(refusal(expected, got, where))
            refused.append(out[-1].rule)
            continue
        answered += 1
        retract = evolve(policy, pause_mode=PauseMode.RETRACT)
        again = resolve(client, retract, info, timeout, recorder.timing)
        if isinstance(again, str):
            asked = resolve_plan(mode, flush, PauseMode.RETRACT, info)
            where = f"plan.flush for policy {policy_words(retract)}, server info {info!r}"
            out.append(refusal(asked, again, where))
            continue
        plain, plain_flush = plain_form(info), None
        if plain is not None:
            on_plain = resolve(client, policy, plain, timeout, recorder.timing)
            if isinstance(on_plain, str):
                where = f"plan.flush for policy {policy_words(policy)}, server info {plain!r}"
                out.append(refusal(resolve_plan(mode, flush, pause, plain), on_plain, where))
                continue
            plain_flush = on_plain.flush
            recorder.exercised["CLI-006"] += 1
        recorder.exercised[expected.rule_for("flush")] += 1
        recorder.exercised["CLI-007"] += pause is PauseMode.IN_PLACE
        for f, rule, want, was in judge_plan(expected, got, pause, again.flush, plain_flush):
            where = f"plan.{f} for policy {policy_words(policy)}, server info {info!r}"
            out.append(Violation(rule, want, was, where))
    if not answered:
        # Not a refusal of some configurations but a client that cannot answer at all: the
        # client crashed (an ERROR of the client under test, never an engine FAIL).
        raise AdapterError(
            "ADP-001",
            f"the client {client.name!r} crashed: resolve raised on every configuration "
            f"({out[0].actual if out else 'no answer'})",
        )
    recorder.exercised.update(refused)  # a refusal is evidence against its rule
    return out


def check_plan(plan: object) -> None:
    """ADP-002 for a client answer that is not a well-typed ``Plan``."""
    if not isinstance(plan, Plan):
        raise AdapterError("ADP-002", f"the client returned {plan!r:.80}, not a Plan")
    if not isinstance(plan.flush, bool):
        raise AdapterError("ADP-002", f"the client's plan.flush {plan.flush!r} is not a bool")
    if not isinstance(plan.pause_mode, PauseMode):
        raise AdapterError(
            "ADP-002", f"the client's plan.pause_mode {plan.pause_mode!r} is not a PauseMode"
        )


def check_capabilities(engine: EngineAdapter) -> frozenset[Capability]:
    """The engine's capabilities, parsed (``capabilities.parse``); ADP-002 for what is not
    a set of known names (a typo would silently turn rules into SKIP)."""
    try:
        return parse(getattr(engine, "capabilities", None))
    except ValueError as e:
        raise AdapterError("ADP-002", str(e)) from None


def policy_words(p: Policy) -> str:
    return f"mode={p.mode.value} flush_cache={p.flush_cache} pause_mode={p.pause_mode.value}"


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


def explanation(candidates: list[list[Violation]]) -> list[Violation]:
    """The violations to report when no model branch agrees: those of the first branch
    whose violations include no MUST rule, else of the first branch. Never "the fewest":
    a single MUST violation must not hide behind a branch with fewer words (issue 8)."""
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
    ) -> None:
        self.engine = engine
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
        self.served_at: dict[tuple[int, str], int] = {}
        self.pending: list[Violation] = []
        self.off_contract = False
        self.unsettled = False

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
            raise AdapterError("ADP-002", f"the adapter's {e}") from None
        self.configs, self.policy = configs, policy
        self.note(f"configs={configs!r} policy={policy!r}")
        self.recorder.examples += 1
        # An adapter may need longer to start than to answer (importing and launching an
        # engine): it says so with ``start_timeout``.
        limit = max(self.timeout, getattr(self.engine, "start_timeout", 0.0))
        for i, c in enumerate(configs):
            problem = misreported(c)
            if problem:
                raise AdapterError("ADP-002", f"endpoint {i}: {problem}")
        for cap, flag in PROFILE_CAPABILITIES.items():
            if (profile or {}).get(flag) and cap not in self.engine.capabilities:
                why = f"the adapter's profile sets {flag} but it does not declare {cap.value}"
                raise AdapterError("ADP-002", why)
        call_with_timeout(
            lambda: self.engine.start(configs), limit, "start", self.direct, self.recorder.timing
        )
        self.states = frozenset({initial_state(configs, policy)})
        self.unsettled = False

    def resume(self, configs: tuple[Config, ...], policy: Policy, cursor: Cursor) -> None:
        """Continue a run from ``cursor`` without starting the SUT (the caller has put the
        SUT back where the cursor was taken, e.g. ``InProcessAdapter.restore``)."""
        self.configs, self.policy = configs, policy
        self.states = cursor.states
        self.pending = list(cursor.pending)
        self.off_contract = cursor.off_contract
        self.unsettled = cursor.unsettled
        self.pool = None

    def cursor(self) -> Cursor:
        """Where this run stands now (see ``resume``)."""
        return Cursor(self.states, tuple(self.pending), self.off_contract, self.unsettled)

    def enabled_actions(self) -> list[Action]:
        """Conforming actions the model enables in every candidate state, within the
        adapter's capabilities."""
        if self.pool is None:
            caps = self.engine.capabilities
            bounds = evolve(self.bounds, namespaces=Capability.NAMESPACES in caps)
            states = list(self.states)
            if not states:
                return []
            first, rest = states[0], states[1:]
            self.pool = [
                a
                for a in candidates.actions(first, bounds, faults=Capability.FAULTS in caps)
                if needed(a, _asleep(first, a)) <= caps
                and all(spec.enabled(s, a, bounds) for s in rest)
            ]
        return self.pool

    # ----- one top-level action -------------------------------------------------------

    def run(self, action: Action) -> None:
        """Apply one top-level action (a SyncWeights expands into its engine calls)."""
        if not all(spec.enabled(s, action, self.bounds) for s in self.states):
            raise NotEnabled(f"{action!r} is not enabled here")
        self.actions.append(action)
        self.pool = None
        self.recorder.steps += 1
        try:
            if isinstance(action, SyncWeights):
                self.sync(action)
            else:
                self.engine_step(action, within=None)
        except AdapterError as e:
            if self.recorder.error is None:
                self.recorder.error = (self.snapshot([]), e)  # keep what was recorded
            raise

    def sync(self, action: SyncWeights) -> None:
        """Run the client's sync: a client program (``conformance.program``) makes its own
        calls through endpoint handles; a resolver runs as the thin program
        ``resolver_sync`` (its plans judged against the spec's, then driven). Either way
        every engine call is a step ``within`` this one, and the model judges the call
        sequence (CLI-007..011)."""
        from .program import is_program, resolver_sync, run_program

        self.note(f"{action!r}")
        if is_program(self.client):
            step = Step(len(self.steps), action, plans=[], program=ProgramRecord())
            self.steps.append(step)
            run_program(self, action, step, self.client)
        else:
            step = Step(len(self.steps), action, plans=[])
            self.steps.append(step)
            resolver_sync(self, action, step)

    def engine_step(self, action: Action, within: int | None) -> None:
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
            raise AdapterError("ADP-002", f"{action.name}: the adapter {problem}")
        caps = self.engine.capabilities
        where = f"endpoint {getattr(action, 'endpoint', '')}"
        branches = [b for s in self.states for b in spec.step(s, action)]
        if not branches:
            raise NotEnabled(f"{action!r} is not enabled in the model")
        judged = [(s2, o, compare(o, obs, caps, where)) for s2, o in branches]
        step = Step(len(self.steps), action, obs, tuple(o for _, o, _ in judged), within=within)
        self.steps.append(step)
        agreeing = [(s2, o) for s2, o, v in judged if not v]
        if not agreeing:
            self.fail(explanation([v for _, _, v in judged]), step.step)
        self.judge_evidence(action, obs, agreeing)
        if isinstance(action, UpdateWeights) and len(branches) > len(self.states):
            # A refused flush: the spec allows several fail-closed branches.
            self.recorder.reached.add("REACH-003")
            self.unsettled = True
        self.states = frozenset(narrowed(s2, action, obs, caps) for s2, _ in agreeing)
        if self.unsettled and len(self.states) == 1:
            # A later observation (or this one) settled which branch the system took.
            self.recorder.exercised["FC-002"] += 1
            self.unsettled = False
        self.pool = None

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
        for _, o in agreeing:
            for rule_id in evidence(o, obs, caps, self.recorder.cold, lora):
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
        self.pending += violations
        self.off_contract = True
        soft = self.recorder.soft
        focused = self.focus is None or self.focus in {v.rule for v in self.pending}
        if focused and (soft is None or len(self.actions) < len(soft.actions)):
            self.recorder.soft = self.snapshot(list(self.pending))

    def fail(self, violations: list[Violation], step: int) -> None:
        violations = self.pending + [self.blame_server_info(v) for v in violations]
        if self.focus is not None and self.focus not in {v.rule for v in violations}:
            for v in violations:
                self.recorder.other.setdefault(v.rule, v)
            if self.recorder.set_aside is None:
                self.recorder.set_aside = self.snapshot(violations)
            raise Diverged(violations)
        if self.recorder.failure is None:
            self.recorder.failure = self.snapshot(violations)
        self.note("violated: " + "; ".join(str(v) for v in violations))
        raise ConformanceFailure(violations, step)

    def blame_server_info(self, v: Violation) -> Violation:
        """Stale reuse on an endpoint declared to misreport its radix cache names the server
        info as the broken contract (issue 8 F-5): INV-001 was never waived for it."""
        index = v.where.split()[1] if v.where.startswith("endpoint ") else ""
        if v.rule != "INV-001" or not index.isdigit() or int(index) >= len(self.configs):
            return v
        config = self.configs[int(index)]
        if not config.misreports:
            return v
        info = dict(config.info or ())
        return evolve(v, where=f"{v.where} (its server info {info!r} misreports the radix cache)")

    def _note_reach(self, action: Action) -> None:
        state = next(iter(self.states))
        if isinstance(action, (ServeRequest, StartRequest)):
            ep = state.endpoint(action.endpoint)
            key = (action.endpoint, action.prefix)
            if self.served_at.get(key, ep.weights) < ep.weights:
                self.recorder.reached.add("REACH-001")
            self.served_at[key] = ep.weights
        if isinstance(action, UpdateWeights):
            ep = state.endpoint(action.endpoint)
            if ep.config.guarded and action.flush_cache is not True:
                self.recorder.reached.add("REACH-002")
