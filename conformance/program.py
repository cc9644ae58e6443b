"""Client programs: a trainer's weight-sync code, run against the engine and the model.

A *client program* performs one weight sync::

    def sync(endpoints: Sequence[EndpointHandle], version: int, policy: Policy) -> None

given one handle per endpoint, the version to push and the run's ``Policy``
(``cache_invalidation_mode`` and the rest). Each handle verb becomes one model action
(``VERBS``), applied to the engine under test and to the model in lockstep and recorded as a
step of the run (``within`` the sync, attributed to the client); the verb returns what the
engine answered. The model judges the call sequence (``kvfence.model.obligations``:
CLI-007..011) and keeps judging the engine as for any other step.

What a verb returns: ``server_info()`` the decoded ``/get_server_info`` body (``None``:
unreachable); every other verb ``True`` when the engine reported success, ``False`` when it
refused or failed (a refused flush, an update rejected by FC-001, an engine that stopped):
an engine's refusal is a value, never an exception, as SGLang's ``{"success": false}``
bodies and vLLM's ``reset_prefix_cache() -> bool`` are. A verb raises ``ProgramError``
(a ``ValueError``) only for the program's own mistake: an unknown word, a call the engine's
phase does not allow (``continue_generation()`` on a serving endpoint), a cache kind the
endpoint does not expose. A program that raises is judged as the client's answer: after a
failed call it is a failed sync (allowed: CLI-010 asks exactly that of a refused reset);
otherwise it is CLI-011.

Lifecycle and two-phase verbs (one contiguous block of ``VERBS``):
``publish_version(version, abort_requests=False)`` (PublishVersion: SGLang
``/update_weight_version``), ``release_memory(tags=None)`` / ``resume_memory(tags=None)``
(Sleep / WakeUp: SGLang ``/release_memory_occupation`` / ``/resume_memory_occupation``,
vLLM ``/sleep`` / ``/wake_up?tags=``; ``None`` is every tag), ``pause(mode,
clear_cache=False)`` (PauseGeneration: vLLM ``/pause?clear_cache=``), and the two-phase
update ``begin_update(version, funnel=None)`` / ``update_chunk()`` /
``finish_update(flush_cache=None)`` / ``abort_update()`` (BeginWeightUpdate /
UpdateWeightChunk / FinishWeightUpdate / AbortWeightUpdate: vLLM ``/collective_rpc``
``start_weight_update`` / ``update_weights`` / ``finish_weight_update``). A finished
two-phase update owes what a one-shot update owes (CLI-001/002/004, CLI-008, CLI-009); a
``resume_memory`` that brings the endpoint back to serving settles them as
``continue_generation`` does. A verb whose action needs a capability the engine under test
does not declare (``model.capabilities.needed``) is an adapter error (ERROR, never a
verdict on the client), except pause and continue, which are no-ops there.

The resolver interface (``resolve(policy, info) -> Plan``) is the thin program
``resolver_sync``: server info of every endpoint, the resolver's plan for each (judged by
CLI-001..007 as before), then pause, update with the plan's flush, a reset of every other
cache kind the endpoint exposes separately, continue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from attrs import evolve

from ..adapters.programs import ProgramClient, check_signature, is_program, load_program
from ..adapters.protocol import ClientAdapter, EngineAdapter
from ..model import semantics as spec
from ..model.actions import (
    AbortWeightUpdate,
    Action,
    BeginWeightUpdate,
    ContinueGeneration,
    FinishWeightUpdate,
    FlushCache,
    FlushEncoderCache,
    PauseGeneration,
    PublishVersion,
    ServeRequest,
    Sleep,
    SyncWeights,
    TraceError,
    UpdateWeightChunk,
    UpdateWeights,
    WakeUp,
    memory_tags,
)
from ..model.capabilities import Capability, needed
from ..model.checks import Violation
from ..model.client import Plan, judge_plan, off_in_booleans, resolve_plan
from ..model.obligations import (
    CACHE_KINDS,
    ENCODER,
    PREFIX,
    SERVING_CALLS,
    Owed,
    Partial,
    delivered,
    evidence,
    flush_asked,
    observe,
    raised,
    resumes,
    resumes_serving,
    returned,
    separate_kinds,
)
from ..model.state import Config, Policy, State
from ..model.vocabulary import ALL_MEMORY, Funnel, MemoryTag, PauseMode, Phase, Status

__all__ = [
    "EndpointHandle",
    "ProgramClient",
    "ProgramError",
    "check_signature",
    "is_program",
    "load_program",
]

from ..model.rules import RuleId
from .calls import call_with_timeout
from .client_table import refusal, resolve
from .errors import AdapterError, BeyondModel, ConformanceFailure, Diverged, NotEnabled
from .record import Recorder
from .trace import ClientCall, InfoCall, PlanRecord, Step

NOT_PROGRAM_RULES = {
    rule_id: "judged on a resolver's plan; a client program is judged on its calls"
    for rule_id in (RuleId.CLI_003, RuleId.CLI_005, RuleId.CLI_006, RuleId.CLI_013)
}
"""Plan rules with no counterpart over a call sequence: N/A for a program, never PASS
(CLI-003 and CLI-005 ask that a flush be left out, which costs only cold prefills; a
program's parsing mistake shows as the CLI-001/002 obligation it then misses; the shapes
CLI-013 judges are asked of a resolver only)."""


NOT_RESOLVER_RULES = {
    RuleId.CLI_012: "a resolver never requeues an aborted request; judged on client programs",
    RuleId.CLI_014: "a resolver's sync is driven by kvfence, which neither raises nor stops "
    "after a failed update; judged on client programs",
}
"""Program rules with no counterpart for a resolver (its thin program drops what a pause
aborted): N/A, never PASS."""


class ProgramError(ValueError):
    """The client program made a call the engine API does not take here (its mistake)."""


def _pause(i: int, mode: str | PauseMode = PauseMode.RETRACT, clear_cache: bool = False) -> Action:
    _bool(clear_cache, "pause(clear_cache)")
    return PauseGeneration(i, _word(PauseMode, mode, "pause(mode)"), clear_cache)


def _bool(value: Any, where: str, none: bool = False) -> None:
    if not (isinstance(value, bool) or (none and value is None)):
        kind = "a bool or None" if none else "a bool"
        raise ProgramError(f"{where}: expected {kind}, got {value!r}")


def _version(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProgramError(f"{where}: expected an int, got {value!r}")
    return value


def _tags(value: Any, where: str) -> frozenset[MemoryTag]:
    """``None`` (or empty) is every tag, as SGLang and vLLM read an omitted ``tags``."""
    if value is None:
        return ALL_MEMORY
    try:
        return memory_tags(value)
    except (TypeError, ValueError):
        words = ", ".join(t.value for t in MemoryTag)
        raise ProgramError(f"{where}: {value!r} is not a list of {words}") from None


def _update(
    i: int, version: int, funnel: str | Funnel | None = None, flush_cache: bool | None = None
) -> Action:
    if not isinstance(version, int) or isinstance(version, bool):
        raise ProgramError(f"update_weights(version): expected an int, got {version!r}")
    if flush_cache not in (None, True, False):
        raise ProgramError(f"update_weights(flush_cache): expected a bool, got {flush_cache!r}")
    return UpdateWeights(i, version, _word(Funnel, funnel, "update_weights(funnel)"), flush_cache)


def _flush(i: int, kind: str = PREFIX) -> Action:
    if kind not in CACHE_KINDS:
        raise ProgramError(f"flush_cache(kind): {kind!r} is not one of {', '.join(CACHE_KINDS)}")
    return FlushCache(i) if kind == PREFIX else FlushEncoderCache(i)


def _continue(i: int) -> Action:
    return ContinueGeneration(i)


def _generate(i: int, prefix: str) -> Action:
    if not isinstance(prefix, str):
        raise ProgramError(f"generate(prefix): expected a str, got {prefix!r}")
    return ServeRequest(i, prefix)


def _requeue(i: int, rid: str, keep_partial: bool = True) -> ClientCall:
    if not isinstance(rid, str):
        raise ProgramError(f"requeue_request(rid): expected a str, got {rid!r}")
    if not isinstance(keep_partial, bool):
        raise ProgramError(f"requeue_request(keep_partial): expected a bool, got {keep_partial!r}")
    return ClientCall(i, 0, "requeue_request", (rid, keep_partial))


def _deliver(i: int, rid: str, versions: Any) -> ClientCall:
    if not isinstance(rid, str):
        raise ProgramError(f"deliver_response(rid): expected a str, got {rid!r}")
    if isinstance(versions, (str, bytes, dict)) or not hasattr(versions, "__iter__"):
        raise ProgramError(f"deliver_response(versions): expected ints, got {versions!r}")
    out = list(versions)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in out):
        raise ProgramError(f"deliver_response(versions): expected ints, got {versions!r}")
    return ClientCall(i, 0, "deliver_response", (rid, sorted(set(out))))


# ----- lifecycle and two-phase verbs ------------------------------------------------------


def _publish(i: int, version: int, abort_requests: bool = False) -> Action:
    _bool(abort_requests, "publish_version(abort_requests)")
    return PublishVersion(i, _version(version, "publish_version(version)"), abort_requests)


def _release(i: int, tags: Any = None) -> Action:
    return Sleep(i, _tags(tags, "release_memory(tags)"))


def _resume(i: int, tags: Any = None) -> Action:
    return WakeUp(i, _tags(tags, "resume_memory(tags)"))


def _begin(i: int, version: int, funnel: str | Funnel | None = None) -> Action:
    version = _version(version, "begin_update(version)")
    return BeginWeightUpdate(i, version, _word(Funnel, funnel, "begin_update(funnel)"))


def _chunk(i: int) -> Action:
    return UpdateWeightChunk(i)


def _finish(i: int, flush_cache: bool | None = None) -> Action:
    _bool(flush_cache, "finish_update(flush_cache)", none=True)
    return FinishWeightUpdate(i, flush_cache)


def _abort(i: int) -> Action:
    return AbortWeightUpdate(i)


VERBS: dict[str, Callable[..., Action | ClientCall]] = {
    "pause": _pause,
    "update_weights": _update,
    "flush_cache": _flush,
    "continue_generation": _continue,
    "generate": _generate,
    # lifecycle and two-phase verbs: one block
    "publish_version": _publish,
    "release_memory": _release,
    "resume_memory": _resume,
    "begin_update": _begin,
    "update_chunk": _chunk,
    "finish_update": _finish,
    "abort_update": _abort,
    # ----- requeue across versions (CLI-012): client-side calls, recorded as ClientCall --
    "requeue_request": _requeue,
    "deliver_response": _deliver,
}
"""Handle verb -> the model action it makes for endpoint ``i`` (the table the pending
verbs join), or a ``ClientCall`` for a call that is the client's own bookkeeping:
``requeue_request`` (then one engine call, a ServeRequest of the request's prefix) and
``deliver_response`` (none)."""

VERB_OF: dict[type[Action], str] = {
    PauseGeneration: "pause",
    UpdateWeights: "update_weights",
    FlushCache: "flush_cache",
    FlushEncoderCache: "flush_cache",
    ContinueGeneration: "continue_generation",
    ServeRequest: "generate",
    PublishVersion: "publish_version",
    Sleep: "release_memory",
    WakeUp: "resume_memory",
    BeginWeightUpdate: "begin_update",
    UpdateWeightChunk: "update_chunk",
    FinishWeightUpdate: "finish_update",
    AbortWeightUpdate: "abort_update",
}
"""The inverse, for replaying a recorded program."""


def _word(enum: Any, value: Any, where: str) -> Any:
    if value is None and enum is Funnel:  # the sync's funnel
        return None
    try:
        return enum(value)
    except ValueError:
        words = ", ".join(m.value for m in enum)
        raise ProgramError(f"{where}: {value!r} is not one of {words}") from None


class EndpointHandle:
    """One endpoint as a client program sees it: ``index``, ``cache_kinds`` (the caches it
    can reset separately: ``("prefix",)``, or ``("prefix", "encoder")`` on an engine whose
    update leaves the encoder cache to the client) and the verbs.

    Verbs: ``server_info()``; ``pause(mode="retract", clear_cache=False)`` (SGLang
    ``/pause_generation``, vLLM ``/pause?mode=&clear_cache=``);
    ``update_weights(version, funnel=None, flush_cache=None)`` (SGLang
    ``/update_weights_from_{disk,tensor,distributed}``: ``flush_cache`` omitted when
    ``None``; ``funnel`` ``None`` is the sync's); ``flush_cache(kind="prefix")`` (SGLang
    ``/flush_cache``, vLLM ``/reset_prefix_cache``); ``continue_generation()`` (SGLang
    ``/continue_generation``, vLLM ``/resume``); ``generate(prefix)`` (SGLang
    ``/generate``); ``publish_version(version, abort_requests=False)`` (SGLang
    ``/update_weight_version``); ``release_memory(tags=None)`` / ``resume_memory(tags=None)``
    (SGLang ``/release_memory_occupation`` / ``/resume_memory_occupation``, vLLM ``/sleep``
    / ``/wake_up``; tags ``"kv_cache"``, ``"weights"``, ``None`` all);
    ``begin_update(version, funnel=None)`` / ``update_chunk()`` /
    ``finish_update(flush_cache=None)`` / ``abort_update()`` (vLLM ``/collective_rpc``
    ``start_weight_update`` / ``update_weights`` / ``finish_weight_update``). Returns: see
    the module docstring.
    """

    def __init__(self, run: SyncRun, index: int) -> None:
        self._run = run
        self.index = index

    def __repr__(self) -> str:
        return f"EndpointHandle({self.index})"

    @property
    def cache_kinds(self) -> tuple[str, ...]:
        return separate_kinds(self._run.state, self.index)

    def server_info(self) -> dict[str, object] | None:
        return self._run.server_info(self.index)

    def pause(self, mode: str | PauseMode = PauseMode.RETRACT, clear_cache: bool = False) -> bool:
        return self._run.call(self.index, "pause", mode, clear_cache)

    def update_weights(
        self, version: int, funnel: str | Funnel | None = None, flush_cache: bool | None = None
    ) -> bool:
        return self._run.call(self.index, "update_weights", version, funnel, flush_cache)

    def flush_cache(self, kind: str = PREFIX) -> bool:
        return self._run.call(self.index, "flush_cache", kind)

    def continue_generation(self) -> bool:
        return self._run.call(self.index, "continue_generation")

    def generate(self, prefix: str) -> bool:
        return self._run.call(self.index, "generate", prefix)

    @property
    def aborted(self) -> dict[str, tuple[int, ...]]:
        """Requests a call of this sync aborted on this endpoint, not yet requeued: request
        ID -> the weight versions that sampled its partial output (SGLang returns an
        aborted request's partial with ``meta_info.weight_version``, sgl-project/sglang PR
        #11673, #17610)."""
        return {
            p.rid: tuple(sorted(p.versions))
            for p in self._run.partials.values()
            if p.endpoint == self.index and not p.requeued
        }

    def requeue_request(self, rid: str, keep_partial: bool = True) -> bool:
        """Resubmit aborted request ``rid`` and let it run to the end (SGLang ``/generate``
        with the partial output appended to the prompt when ``keep_partial``: partial
        rollout, as slime's ``sglang_rollout`` and verl's agent loop do; else from its prompt
        alone). ``True`` when the engine served it. ``ProgramError``: ``rid`` is not an
        aborted request of this endpoint (``aborted``)."""
        return self._run.call(self.index, "requeue_request", rid, keep_partial)

    def deliver_response(self, rid: str, versions: Sequence[int]) -> bool:
        """Hand the response of requeued (or aborted) request ``rid`` to the trainer,
        labelled with the weight ``versions`` it claims (CLI-012 judges the label). No
        engine call; ``True``."""
        return self._run.call(self.index, "deliver_response", rid, versions)

    # lifecycle and two-phase verbs

    def publish_version(self, version: int, abort_requests: bool = False) -> bool:
        return self._run.call(self.index, "publish_version", version, abort_requests)

    def release_memory(self, tags: Sequence[str] | None = None) -> bool:
        return self._run.call(self.index, "release_memory", tags)

    def resume_memory(self, tags: Sequence[str] | None = None) -> bool:
        return self._run.call(self.index, "resume_memory", tags)

    def begin_update(self, version: int, funnel: str | Funnel | None = None) -> bool:
        return self._run.call(self.index, "begin_update", version, funnel)

    def update_chunk(self) -> bool:
        return self._run.call(self.index, "update_chunk")

    def finish_update(self, flush_cache: bool | None = None) -> bool:
        return self._run.call(self.index, "finish_update", flush_cache)

    def abort_update(self) -> bool:
        return self._run.call(self.index, "abort_update")


class SyncHost(Protocol):
    """What a sync needs of the lockstep it runs in (``conformance.lockstep.Lockstep``):
    the run's setup and candidate model states, the engine and client under test with the
    per-call ``timeout`` (seconds) and whether calls are ``direct``, the ``recorder``, and
    the verbs that step the engine and record a verdict. Named here, so this module never
    imports the lockstep (the lockstep imports it)."""

    configs: tuple[Config, ...]
    policy: Policy
    states: frozenset[State]
    engine: EngineAdapter
    client: ClientAdapter
    timeout: float
    direct: bool
    recorder: Recorder
    focus: str | None

    def note(self, text: str) -> None: ...

    def engine_step(self, action: Action, within: int | None) -> Step:
        """Apply ``action`` to the engine and the model; the ``Step`` it recorded."""
        ...

    def client_violation(self, violations: list[Violation]) -> None: ...

    def fail(self, violations: list[Violation], step: int) -> None: ...

    def refused(self, violation: Violation) -> None: ...


class SyncRun:
    """One SyncWeights driven by a client (a program, or a resolver through
    ``resolver_sync``) inside a ``Lockstep``: the handles' calls, the obligations the model
    carries per endpoint, and the first lockstep exception a call hit (``halt``), raised
    again after the program returns whatever the program did with it."""

    def __init__(self, lock: SyncHost, action: SyncWeights, step: Step) -> None:
        self.lock = lock
        self.action = action
        self.step = step
        self.owed = [Owed() for _ in lock.configs]
        self.halt: BaseException | None = None
        self.calls = 0
        self.quiet: set[int] = set()  # endpoints whose resolver plan was already judged
        self.partials: dict[tuple[int, str], Partial] = {}  # aborted requests (CLI-012)
        self.handles = [EndpointHandle(self, i) for i in range(len(lock.configs))]
        self.thin = False  # ``resolver_sync``: a resolver's plans driven by kvfence

    @property
    def state(self):
        return next(iter(self.lock.states))

    def _check_index(self, index: int) -> None:
        if self.halt is not None:
            raise self.halt

    def server_info(self, index: int) -> dict[str, object] | None:
        self._check_index(index)
        try:
            info = call_with_timeout(
                lambda: self.lock.engine.server_info(index),
                self.lock.timeout,
                f"server_info({index})",
                self.lock.direct,
                self.lock.recorder.timing,
            )
        except BaseException as e:
            self.halt = e
            raise
        info = None if info is None else dict(info)
        if self.step.program is not None:
            self.step.program.infos.append(InfoCall(index, self.calls, info))
        return info

    def call(self, index: int, verb: str, *args: Any) -> bool:
        self._check_index(index)
        action = VERBS[verb](index, *args)
        if isinstance(action, ClientCall):
            return self.client_call(action)
        if isinstance(action, (UpdateWeights, BeginWeightUpdate)) and action.funnel is None:
            action = evolve(action, funnel=self.action.funnel)
        return self.apply(action)

    def apply(self, action: Action) -> bool:
        """Drive ``action`` on the engine and the model; judge it as the client's call."""
        self._check_index(0)
        index = getattr(action, "endpoint", 0)
        before = self.state
        caps = self.lock.engine.capabilities
        if isinstance(action, FlushEncoderCache) and ENCODER not in separate_kinds(before, index):
            exposed = ", ".join(separate_kinds(before, index))
            raise ProgramError(
                f"flush_cache('encoder'): endpoint {index} resets separately only: {exposed}"
            )
        # (a pause that clears the cache is not a no-op: without the capability, ERROR)
        pausing = isinstance(action, ContinueGeneration) or (
            isinstance(action, PauseGeneration) and not action.clear_cache
        )
        if pausing and Capability.PAUSE not in caps:
            # The engine cannot pause: nothing is served during a sync in lockstep anyway,
            # so the call is a no-op (its obligations settle at the end of the sync).
            return True
        if not all(spec.modelled(s.endpoint(index), action) for s in self.lock.states):
            self.halt = BeyondModel(
                f"{VERB_OF.get(type(action), action.name)}: endpoint {index}'s deployment "
                f"has no model of {action.name} (beyond the spec's bounds there)"
            )
            raise self.halt
        if not all(spec.enabled(s, action) for s in self.lock.states):
            phase = before.endpoint(index).phase.value
            raise ProgramError(
                f"{VERB_OF.get(type(action), action.name)}: {action!r} is not "
                f"allowed now (endpoint {index} is {phase})"
            )
        asleep = before.endpoint(index).phase is Phase.ASLEEP
        missing = needed(action, asleep) - caps
        if missing:
            # The engine under test cannot take the call: no verdict on the client.
            words = ", ".join(sorted(c.value for c in missing))
            self.halt = AdapterError(
                RuleId.ADP_001, f"{action!r}: the engine does not declare the capability {words}"
            )
            raise self.halt
        if isinstance(action, SERVING_CALLS) or resumes_serving(before, action):
            self.settle(index, f"{action.name}")
        try:
            recorded = self.lock.engine_step(action, within=self.step.step)
        except (AdapterError, ConformanceFailure, Diverged, NotEnabled) as e:
            self.halt = e
            raise
        self.calls += 1
        if flush_asked(before, action):
            self.lock.recorder.exercised[RuleId.CLI_007] += 1  # a flush an in_place pause blocks
        obs = recorded.observed
        assert obs is not None
        self.owed[index], bad = observe(self.owed[index], before, action, obs.status)
        if self.thin:  # kvfence's own thin program drives on after a failed update
            self.owed[index] = evolve(self.owed[index], update_failed=False, updates_failed=0)
        self.report(index, bad)
        self.note_aborted(index, before)
        if isinstance(action, FlushCache) and obs.flushed is not None:
            return bool(obs.flushed) and obs.status is Status.OK
        return obs.status is Status.OK

    def note_aborted(self, index: int, before: Any) -> None:
        """Requests the call just made ended on endpoint ``index`` (the model's account:
        in flight before, gone after) become the client's partials (CLI-012)."""
        after = {r.rid for r in self.state.endpoint(index).requests}
        for r in before.endpoint(index).requests:
            if r.rid not in after:
                self.partials[(index, r.rid)] = Partial(index, r.rid, r.prefix, r.sampled)

    def client_call(self, call: ClientCall) -> bool:
        """A requeue (one engine call) or a delivery (none), recorded for replay at the
        number of engine calls made before it."""
        index, (rid, arg) = call.endpoint, call.args
        partial = self.partials.get((index, rid))
        if partial is None or (call.verb == "requeue_request" and partial.requeued):
            held = ", ".join(repr(r) for (i, r), p in self.partials.items() if i == index)
            raise ProgramError(
                f"{call.verb}({rid!r}): not a request this sync aborted on endpoint {index}"
                f"{' and did not requeue yet' if call.verb == 'requeue_request' else ''} "
                f"(aborted: {held or 'none'})"
            )
        if self.step.program is not None:
            self.step.program.calls.append(ClientCall(index, self.calls, call.verb, call.args))
        if call.verb == "deliver_response":
            self.lock.recorder.exercised[RuleId.CLI_012] += 1
            self.report(index, delivered(partial, frozenset(arg)))
            del self.partials[(index, rid)]
            return True
        live = self.state.endpoint(index).live
        ok = self.apply(ServeRequest(index, partial.prefix))
        continuation = frozenset({live}) if ok else frozenset()
        self.partials[(index, rid)] = evolve(
            partial, requeued=True, kept=bool(arg), continuation=continuation
        )
        return ok

    def settle(self, index: int, how: str) -> None:
        for rule_id in evidence(self.owed[index]):
            self.lock.recorder.exercised[rule_id] += 1
        self.owed[index], bad = resumes(self.owed[index], index, how)
        self.report(index, bad)

    def report(self, index: int, bad: list[Violation]) -> None:
        if bad and index not in self.quiet:
            self.violated(bad)

    def violated(self, bad: list[Violation]) -> None:
        """Record the client's violations; a run focused on one of them ends at this call
        (``Lockstep.end_focus``), and the program's later calls raise the same failure."""
        self.lock.client_violation(bad)
        try:
            self.lock.end_focus({v.rule for v in bad}, self.step.step)
        except ConformanceFailure as e:
            self.halt = e
            raise

    def finish(self, error: BaseException | None) -> None:
        """The program returned (``error`` None) or raised ``error``."""
        if self.halt is not None:
            raise self.halt
        self.lock.recorder.exercised[RuleId.CLI_011] += 1
        # Aborted requests the client dropped (never delivered): CLI-012 judged its answer.
        self.lock.recorder.exercised[RuleId.CLI_012] += len(self.partials)
        if not self.thin and any(o.updates_failed for o in self.owed):
            self.lock.recorder.exercised[RuleId.CLI_014] += 1
        if error is None and not self.thin:
            bad = returned(tuple(self.owed))
            if bad:
                self.violated(bad)
        if error is not None:
            message = f"{type(error).__name__}: {error}"
            if isinstance(error, RecordedRaise):
                message = str(error)
            if self.step.program is not None:
                self.step.program.raised = message
            self.lock.note(f"  the client program raised {message}")
            bad = raised(tuple(self.owed), message)
            if bad:
                self.violated(bad)
        for i in range(len(self.owed)):
            if all(s.endpoint(i).phase is Phase.SERVING for s in self.lock.states):
                self.settle(i, "the end of the sync")
            elif self.owed[i].refusals:
                # A refused reset answered by leaving the endpoint paused: CLI-010 judged it.
                self.lock.recorder.exercised[RuleId.CLI_010] += 1


def run_program(lock: SyncHost, action: SyncWeights, step: Step, program: Any) -> None:
    """Run a client program's sync in ``lock`` (or a recorded one's, for replay)."""
    run = SyncRun(lock, action, step)
    lock.recorder.not_at_stake.update(NOT_PROGRAM_RULES)
    error: BaseException | None = None
    try:
        program.sync(run.handles, action.version, lock.policy)
    except (KeyboardInterrupt, SystemExit, TraceError):
        raise
    except Exception as e:  # the client's answer, judged by ``finish``
        error = e
    run.finish(error)


def resolver_sync(lock: SyncHost, action: SyncWeights, step: Step) -> None:
    """The resolver interface as a thin program: for each endpoint, its server info and the
    resolver's plan (judged against the spec's, CLI-001..007); then for each, pause with the
    plan's mode, update with its flush, reset every other cache kind it exposes separately,
    continue (without ``pause`` capability: the update alone). A plan that breaks the rule
    a run is focused on fails the run once the sync is driven (``ConformanceFailure``)."""
    run = SyncRun(lock, action, step)
    run.thin = True
    lock.recorder.not_at_stake.update(NOT_RESOLVER_RULES)
    p = lock.policy
    plans: list[Plan] = []
    broken: set[RuleId] = set()
    for i in range(len(lock.configs)):
        info = call_with_timeout(
            lambda i=i: lock.engine.server_info(i),
            lock.timeout,
            f"server_info({i})",
            lock.direct,
            lock.recorder.timing,
        )
        expected = resolve_plan(p.mode, p.flush_cache, p.pause_mode, info)
        got = resolve(lock.client, p, info, lock.timeout, lock.recorder.timing)
        if isinstance(got, str):
            lock.refused(refusal(expected, got, f"endpoint {i} plan.flush, {info!r}"))
        step.plans.append(PlanRecord(i, info, expected, got))
        again = None
        if expected.flush and not got.flush and p.pause_mode is PauseMode.IN_PLACE:
            # Was the flush dropped because of the in_place pause (CLI-007, PF-06)? Ask the
            # same question with a retract pause, and record the answer for replay.
            retract = evolve(p, pause_mode=PauseMode.RETRACT)
            spec_retract = resolve_plan(p.mode, p.flush_cache, PauseMode.RETRACT, info)
            again = resolve(lock.client, retract, info, lock.timeout, lock.recorder.timing)
            if isinstance(again, str):
                where = f"endpoint {i} plan.flush (asked with a retract pause), {info!r}"
                lock.refused(refusal(spec_retract, again, where))
            step.plans.append(PlanRecord(i, info, spec_retract, again, asked="retract"))
        bad = [
            Violation(rule, want, was, f"endpoint {i} plan.{f}, server info {info!r}")
            for f, rule, want, was in judge_plan(
                expected,
                got,
                p.pause_mode,
                None if again is None else again.flush,
                extra_flush_charged=off_in_booleans(info),
            )
        ]
        lock.recorder.exercised[expected.rule_for("flush")] += 1
        lock.recorder.exercised[RuleId.CLI_007] += p.pause_mode is PauseMode.IN_PLACE
        if bad:
            run.quiet.add(i)  # the plan's rules already name this endpoint's fault
            lock.client_violation(bad)
            broken.update(v.rule for v in bad)
        plans.append(got)
    for i, plan in enumerate(plans):
        ep = run.handles[i]
        calls: list[tuple[str, tuple[Any, ...]]] = [
            ("pause", (plan.pause_mode,)),
            ("update_weights", (action.version, action.funnel, plan.flush)),
            *(("flush_cache", (k,)) for k in ep.cache_kinds if k != PREFIX),
            ("continue_generation", ()),
        ]
        for verb, args in calls:
            if all(s.endpoint(i).phase is Phase.STOPPED for s in lock.states):
                break  # the engine process exited mid-sync (CD-07): nothing more to drive
            if verb == "continue_generation" and run.owed[i].refused:
                # a refused reset of another cache kind: left paused (fail-closed)
                break
            try:
                getattr(ep, verb)(*args)
            except ProgramError:
                if run.halt is not None:
                    raise run.halt from None
                raise
    run.finish(None)
    lock.end_focus(broken, step.step)  # a run focused on a plan's rule ends with this sync


class RecordedProgram:
    """A program that makes a trace's recorded calls again, in order (model-only replay
    and replay against an engine of a program trace)."""

    name = "recorded-program"

    def __init__(self, steps: list[Step]) -> None:
        self.syncs: list[tuple[Step, list[Step]]] = []
        for s in steps:
            if s.program is not None:
                self.syncs.append((s, []))
            elif s.within is not None and self.syncs and s.within == self.syncs[-1][0].step:
                self.syncs[-1][1].append(s)
        self.cursor = 0

    @property
    def consumed(self) -> bool:
        return self.cursor >= len(self.syncs)

    def sync(self, endpoints: Sequence[EndpointHandle], version: int, policy: Policy) -> None:
        if self.cursor >= len(self.syncs):
            raise TraceError("the trace records fewer program syncs than it replays")
        head, calls = self.syncs[self.cursor]
        self.cursor += 1
        assert head.program is not None
        # server_info() and client-side calls, in recorded order, at their engine-call counts
        events: list[InfoCall | ClientCall] = sorted(
            [*head.program.infos, *head.program.calls], key=lambda c: c.at
        )
        n = 0
        while True:
            while events and events[0].at <= n:
                event = events.pop(0)
                ep = endpoints[event.endpoint]
                if isinstance(event, InfoCall):
                    ep.server_info()
                    continue
                made = ep._run.calls
                getattr(ep, event.verb)(*event.args)
                n += ep._run.calls - made  # a requeue's ServeRequest is the next step
            if n >= len(calls):
                break
            index = getattr(calls[n].action, "endpoint", 0)
            endpoints[index]._run.apply(calls[n].action)
            n += 1
        for event in events:  # recorded after the last engine call
            if isinstance(event, InfoCall):
                endpoints[event.endpoint].server_info()
            else:
                getattr(endpoints[event.endpoint], event.verb)(*event.args)
        if head.program.raised is not None:
            raise RecordedRaise(head.program.raised)


class RecordedRaise(Exception):
    """The recorded program raised here (its message as recorded)."""


# ----- a client's calls one at a time, at the top level (a trainer over HTTP) --------------

NOT_HTTP_RULES = {
    **NOT_PROGRAM_RULES,
    RuleId.CLI_011: "a trainer's exception stays in its own process: an HTTP session shows "
    "its calls, never a raise",
    RuleId.CLI_012: "handing a response to the trainer is no call an HTTP session receives",
}
"""Client rules with no counterpart over HTTP (``kvfence serve``): N/A, never PASS. The
plan rules are a resolver's (as for a program); CLI-011 and CLI-012 judge what the program
does in its own process. CLI-014's other half (a sync that returns after a failed update)
is the program's too; serving resumed after a failed update is judged."""


class CallSequence:
    """The top-level actions of a run taken as a client's calls, one at a time: what a
    trainer talking HTTP to ``kvfence serve`` makes (each request that maps to a model
    action is one call). Judged by the obligations a client program's calls are
    (``model.obligations``): ``before`` each call settles what is owed where serving
    resumes (a request, ContinueGeneration, a WakeUp that resumes serving), ``after``
    observes the call's answer (CLI-007 at the call, CLI-008/009/010/014 and the rule that
    required the reset at resumption), ``end`` settles every serving endpoint when the
    session ends. Violations go to the lockstep's ``client_violation`` (the run goes on,
    FAIL); evidence to its recorder."""

    def __init__(self, lock: SyncHost) -> None:
        self.lock = lock
        self.owed = [Owed() for _ in lock.configs]
        lock.recorder.not_at_stake.update(NOT_HTTP_RULES)

    @property
    def state(self) -> State:
        return next(iter(self.lock.states))

    def before(self, action: Action) -> State:
        """Settle what serving ``action`` resumes; the model state the call is made in."""
        state = self.state
        index = getattr(action, "endpoint", None)
        if index is not None and (
            isinstance(action, SERVING_CALLS) or resumes_serving(state, action)
        ):
            self.settle(index, action.name)
        return state

    def after(self, before: State, action: Action, status: Status, flushed: Any) -> None:
        """The engine answered ``action`` with ``status`` (``flushed``: the observation's
        flag; a reset answered ``success: false`` is a refused reset)."""
        index = getattr(action, "endpoint", None)
        if index is None:
            return
        if isinstance(action, FlushCache) and flushed is False and status is Status.OK:
            status = Status.REJECTED
        if flush_asked(before, action):
            self.lock.recorder.exercised[RuleId.CLI_007] += 1
        self.owed[index], bad = observe(self.owed[index], before, action, status)
        if bad:
            self.lock.client_violation(bad)

    def settle(self, index: int, how: str) -> None:
        for rule_id in evidence(self.owed[index]):
            self.lock.recorder.exercised[rule_id] += 1
        self.owed[index], bad = resumes(self.owed[index], index, how)
        if bad:
            self.lock.client_violation(bad)

    def end(self) -> None:
        """The session ended: an endpoint serving has resumed (its obligations settle); one
        left paused after a refused reset answered it (CLI-010's evidence)."""
        for i, owed in enumerate(self.owed):
            if all(s.endpoint(i).phase is Phase.SERVING for s in self.lock.states):
                self.settle(i, "the end of the session")
            elif owed.refusals:
                self.lock.recorder.exercised[RuleId.CLI_010] += 1
