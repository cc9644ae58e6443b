"""The semantics: the next-state relation of the spec.

``step(state, action)`` returns every allowed ``(next_state, outcome)`` pair; an empty tuple
means the action is not enabled. Where the spec leaves a choice (a prefill may hit or miss;
an update whose flush is refused may be rejected outright, applied and closed, or on an
exact lane stop the engine), every branch is returned and the checker follows whichever one
the system under test took.

The cache of the model is what an endpoint MAY hold, an upper bound: any entry may vanish at
any moment (eviction, a clear on abort, a flush on sleep, an extra flush), and a miss is
always allowed. What the spec forbids is reuse of KV computed under other weights, keeping
what a required invalidation must have removed, serving while closed, and dishonest reports.

Read top to bottom: outcome helpers (the only place a rule is attributed to a field), the
guards, then each action in one place (its registration names its guard, its body is its
effect), then ``enabled``, ``step`` and ``within`` (the one place search bounds apply). What
a cache may hold after each event is ``cache.py``; the phase table that also gates every
action is ``lifecycle.py``; the invariants are ``checks.py``; the enumeration the explorer
and the stateful machine draw from is ``candidates.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from functools import cache, lru_cache

from . import lifecycle
from .actions import (
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
from .cache import (
    Prefill,
    cache_rule,
    derived_dropped,
    emptied,
    encoder_kept,
    evictable,
    flushed,
    invalidated,
    load,
    prefills,
    restarted_cache,
    window_dropped,
)
from .client import Plan, resolve_plan
from .fast import evolve
from .observation import Blame, Observation, Outcome, Response, View
from .rules import RuleId
from .state import (
    Bounds,
    Endpoint,
    Entry,
    OpenUpdate,
    Policy,
    Request,
    Served,
    ServerInfo,
    State,
    StoreEntry,
    Use,
)
from .vocabulary import MIXED, Kind, MemoryTag, PauseMode, Phase, Role, Status, Tier

Branch = tuple[State, Outcome]
Branches = tuple[Branch, ...]


# ----- outcomes: the only place a Blame is built ------------------------------------------


def view(ep: Endpoint) -> View:
    """The probe a correct endpoint shows."""
    return View(
        weights=None if ep.torn else ep.weights,
        draft=ep.draft if ep.config.draft else None,
        scales=ep.scales if ep.config.fp8_kv else None,
        label=ep.label,
        cache=ep.cache,
        derived=ep.derived if ep.config.derived else None,
    )


def ok(ep: Endpoint, status: str = RuleId.LIV_002, **blame: str) -> Outcome:
    """The endpoint did what was asked; ``status`` and ``blame`` name the rules that fix the
    observation's fields. Fields of the observation itself go through ``seen``."""
    return Outcome(Observation(Status.OK, view=view(ep)), because=Blame(status=status, **blame))


def rejected(ep: Endpoint, status: str, **blame: str) -> Outcome:
    """The endpoint reported failure; ``status`` is the rule that required the failure."""
    return Outcome(
        Observation(Status.REJECTED, view=view(ep)), because=Blame(status=status, **blame)
    )


def seen(outcome: Outcome, **fields) -> Outcome:
    """``outcome`` whose observation also shows ``fields`` (response, flushed, aborted)."""
    return evolve(outcome, observation=evolve(outcome.observation, **fields))


def closed_rule(ep: Endpoint) -> RuleId:
    """The rule a closed endpoint's refusal to serve answers to: FC-004 on torn weights (a
    failed update left them mixed, so it must not serve: sgl-project/sglang-omni PR #784,
    PF-27), FC-002 on a stale tree whose flush has not completed; RNK-003 on an endpoint
    whose ranks a failed update left torn (sgl-project/sglang PR #39534, PF-26)."""
    if ep.ranks and ep.torn:
        return RuleId.RNK_003
    return RuleId.FC_004 if ep.torn and not ep.dirty else RuleId.FC_002


def plan_for(s: State, index: int) -> Plan:
    """The plan the spec's client resolves for endpoint ``index``."""
    return _plan(s.policy, s.endpoint(index).config.info)


@cache
def _plan(p: Policy, info: ServerInfo) -> Plan:
    return resolve_plan(p.mode, p.flush_cache, p.pause_mode, None if info is None else dict(info))


def asked_to_flush(ep: Endpoint, flush_cache: bool | None) -> bool:
    """What the caller asked, with an omitted field read by the engine's profile."""
    return ep.config.flush_default if flush_cache is None else flush_cache


def _served(s: State, index: int, a, p: Prefill, sampled, rid=None) -> Served:
    ep = s.endpoint(index)
    return Served(
        endpoint=index,
        prefix=a.prefix,
        weights=ep.live,
        uses=frozenset(p.uses),
        current=ep.current(a.lora),
        sampled=frozenset(sampled),
        hit=bool(p.reused),
        exact=ep.config.guarded,
        waived=ep.waived,
        rid=rid,
        pinned=_pinned(ep, getattr(a, "namespace", None)),
        off_policy=_pinned(ep, getattr(a, "namespace", None)) and s.policy.off_policy_sessions,
    )


def _pinned(ep: Endpoint, namespace: int | None) -> bool:
    """A request pinned to the namespace of older weights than those in force (PF-24): no
    waiver covers its reuse, unless the policy declares off-policy sessions."""
    return namespace is not None and namespace < ep.weights


# ----- guards: the enabling conditions beyond the phase table ----------------------------


def _always(s: State, a: Action) -> bool:
    return True


def _lora_served(s: State, a: ServeRequest | StartRequest) -> bool:
    return not a.lora or s.endpoint(a.endpoint).config.lora


def _rid_free(s: State, a: StartRequest) -> bool:
    free = all(r.rid != a.rid for e in s.endpoints for r in e.requests)
    return free and _lora_served(s, a)


def _in_flight(s: State, a: FinishRequest) -> bool:
    return any(r.rid == a.rid for r in s.endpoint(a.endpoint).requests)


def _newer_version(s: State, a: UpdateWeights | FaultUpdateFailsMidway) -> bool:
    """A version the trainer has (or is about to have) that this endpoint lacks, on weights
    whose memory is resident, with no two-phase window open on it (a one-shot update does
    not run inside one). Nothing writes released weights: SGLang's scheduler
    ``release_memory_occupation`` stashes the model's static state and pauses the weights'
    memory for the ``weights`` tag, so an update there would write into memory the resume
    refills from the stash; colocated trainers resume the weights by tag before updating
    (miles' ``SGLangEngine.resume_memory_occupation(tags)``); vLLM level-1 sleep keeps them
    offloaded until ``/wake_up``."""
    ep = s.endpoint(a.endpoint)
    return (
        a.version in (s.trainer, s.trainer + 1)
        and ep.weights < a.version
        and not ep.weights_released
        and not ep.update
    )


def _next_sync(s: State, a: SyncWeights) -> bool:
    return a.version == s.trainer + 1 and all(
        ep.phase is Phase.SERVING and ep.update is None for ep in s.endpoints
    )


def _lower_tier_holds(s: State, a: EvictPrefix) -> bool:
    ep = s.endpoint(a.endpoint)
    tier_ok = a.tier is not Tier.DEVICE and a.tier in ep.config.tiers
    return tier_ok and bool(evictable(ep, a.prefix))


def _lora_idle(s: State, a: LoadLora) -> bool:
    ep = s.endpoint(a.endpoint)
    return ep.config.lora and not any(r.lora and r.holds_kv for r in ep.requests)


def _no_fault_pending(s: State, a: FaultRefuseFlush) -> bool:
    return not s.endpoint(a.endpoint).refuse_flush


def _releases_more(s: State, a: Sleep) -> bool:
    """Nothing in flight (SGLang asserts the scheduler is idle before a release), no
    two-phase window open, and some tag not yet released."""
    ep = s.endpoint(a.endpoint)
    return not ep.requests and ep.update is None and bool(a.tags - ep.released)


def _resumes_some(s: State, a: WakeUp) -> bool:
    """Some of ``a.tags`` is released (a resume of resident memory is not drawn)."""
    return bool(a.tags & s.endpoint(a.endpoint).released)


def _clear_can_complete(s: State, a: PauseGeneration) -> bool:
    """``clear_cache`` is not drawn with ``in_place``: those requests pin their KV."""
    return not (a.clear_cache and a.mode is PauseMode.IN_PLACE)


def _known_version(s: State, a: PublishVersion) -> bool:
    """A label of a version that exists or is about to (the trainer's next)."""
    return 0 <= a.version <= s.trainer + 1


def _window_open(s: State, a: Action) -> bool:
    return s.endpoint(a.endpoint).update is not None  # type: ignore[attr-defined]


def _window_healthy(s: State, a: Action) -> bool:
    """A window is open and no chunk of it has failed (nor is set to fail)."""
    ep = s.endpoint(a.endpoint)  # type: ignore[attr-defined]
    return ep.in_window and not ep.fail_chunk


# ----- actions: one registration each (type, guard), the body is the effect ---------------

Effect = Callable[[State, Action], Branches]
Guard = Callable[[State, Action], bool]
SPEC: dict[type[Action], tuple[Guard, Effect]] = {}
"""Action type -> (guard, effect): the whole next-state relation, filled by ``@action``."""


def action(kind: type[Action], when: Guard) -> Callable[[Effect], Effect]:
    """Register ``effect`` as the meaning of ``kind``, enabled when ``when`` holds (and the
    phase table allows it). ``step`` calls the effect only then: no effect re-checks it."""

    def register(effect: Effect) -> Effect:
        SPEC[kind] = (when, effect)
        return effect

    return register


@action(ServeRequest, when=_lora_served)
def serve_request(s: State, a: ServeRequest) -> Branches:
    """A whole request: prefill (hit or miss), decode, answer. Closed: refused (FC-002)."""
    ep = s.endpoint(a.endpoint)
    if ep.closed:
        return ((s, rejected(ep, closed_rule(ep))),)
    out = list(_window_refusal(s, ep, mixed=True))
    for p in prefills(ep, a.prefix, a.lora, a.namespace):
        served = _served(s, a.endpoint, a, p, {ep.live})
        response = Response(hit=served.hit, uses=served.uses, sampled=served.sampled)
        s2 = evolve(s.with_endpoint(a.endpoint, p.ep), ledger=(*s.ledger, served))
        outcome = ok(p.ep, cache=cache_rule(p.reused), hit=RuleId.INV_001, **_window_blame(ep))
        outcome = evolve(seen(outcome, response=response), served=served, dropped=p.dropped)
        out.append((s2, outcome))
    out += _window_refusal(s, ep, mixed=False)
    return tuple(out)


def _window_refusal(s: State, ep: Endpoint, mixed: bool) -> Branches:
    """WIN-001: inside an open window an endpoint may refuse to serve (changing nothing)
    instead of serving: under mixed weights once a chunk has landed (``mixed``), or at all
    while the window is open (``not mixed``: no chunk landed, or chunks staged aside), as
    SGLang's tokenizer manager holds every generate behind ``model_update_lock`` while an
    update holds it for writing. Refusing is always safe; a refusal before any chunk landed
    is appended after the serving branches, so that a wrong answer there is still blamed on
    the rule it breaks, not on the refusal it did not make."""
    # A refusal that a cache listing confirms is evidence that no KV of the mixed weights
    # exists to outlive the window (WIN-002).
    if mixed and ep.live != ep.weights:
        return ((s, rejected(ep, RuleId.WIN_001, cache=RuleId.WIN_002)),)
    if not mixed and ep.update is not None and ep.live == ep.weights:
        return ((s, rejected(ep, RuleId.WIN_001)),)
    return ()


def _window_blame(ep: Endpoint) -> dict[str, str]:
    """Who answers for a response's probe, attribution and restart-oracle bytes: inside a
    window with mixed weights, WIN-001 (never labelled with the new version); the restart
    oracle otherwise names DER-001 where derived state could explain the difference, else
    INV-003 (the claimed version is not what computes)."""
    if ep.live != ep.weights:
        return {"weights": RuleId.WIN_001, "label": RuleId.WIN_001, "sampled": RuleId.WIN_001}
    if ep.update is not None and ep.update.landed:
        # Inside a window that received chunks, on whole (old) weights: output that differs
        # from an engine freshly started at the claimed version means a chunk reached the
        # live parameters while the probe claims them whole (WIN-001), or a failed chunk
        # was not rolled back (WIN-003).
        return {"fresh": RuleId.WIN_003 if ep.update.failed else RuleId.WIN_001}
    return {"fresh": RuleId.DER_001 if ep.config.derived else RuleId.INV_003}


@action(StartRequest, when=_rid_free)
def start_request(s: State, a: StartRequest) -> Branches:
    """Admit a request: its prefill runs (hit or miss) and it stays in flight holding KV."""
    ep = s.endpoint(a.endpoint)
    if ep.closed:
        return ((s, rejected(ep, closed_rule(ep))),)
    out = list(_window_refusal(s, ep, mixed=True))
    for p in prefills(ep, a.prefix, a.lora, a.namespace):
        req = Request(a.rid, a.prefix, a.lora, frozenset({ep.live}), p.uses, a.namespace)
        ep2 = evolve(p.ep, requests=(*p.ep.requests, req))
        outcome = evolve(ok(ep2, cache=cache_rule(p.reused)), dropped=p.dropped, forward=True)
        out.append((s.with_endpoint(a.endpoint, ep2), outcome))
    out += _window_refusal(s, ep, mixed=False)
    return tuple(out)


@action(FinishRequest, when=_in_flight)
def finish_request(s: State, a: FinishRequest) -> Branches:
    """The request decodes to its end under the weights now in force. Closed: aborted."""
    ep = s.endpoint(a.endpoint)
    req = ep.request(a.rid)
    ep2 = evolve(ep, requests=tuple(r for r in ep.requests if r.rid != a.rid))
    shut = closed_rule(ep)
    aborted = seen(rejected(ep2, shut, aborted=shut), aborted=frozenset({a.rid}))
    if ep.closed:
        return ((s.with_endpoint(a.endpoint, ep2), aborted),)
    # WIN-001: inside a window the request may be aborted instead (first once the weights
    # are mixed; after the serving branch while no chunk has landed, see _window_refusal).
    refused = (
        [
            (
                s.with_endpoint(a.endpoint, ep2),
                evolve(
                    aborted,
                    because=evolve(aborted.because, status=RuleId.WIN_001, aborted=RuleId.WIN_001),
                ),
            )
        ]
        if ep.update is not None
        else []
    )
    mixed = ep.live != ep.weights
    served = Served(
        endpoint=a.endpoint,
        prefix=req.prefix,
        weights=ep.live,
        uses=req.uses | ep.current(req.lora),
        current=ep.current(req.lora),
        sampled=req.sampled | {ep.live},
        hit=False,
        exact=ep.config.guarded,
        waived=ep.waived,
        rid=a.rid,
        pinned=_pinned(ep, req.namespace),
        off_policy=_pinned(ep, req.namespace) and s.policy.off_policy_sessions,
    )
    response = Response(hit=False, uses=served.uses, sampled=served.sampled)
    s2 = evolve(s.with_endpoint(a.endpoint, ep2), ledger=(*s.ledger, served))
    blame = {"sampled": RuleId.INV_002, **_window_blame(ep)}
    blame.pop("fresh", None)
    outcome = evolve(seen(ok(ep2, **blame), response=response), served=served)
    if not mixed:
        return ((s2, outcome), *refused)
    return (*refused, (s2, outcome))


@action(UpdateWeights, when=_newer_version)
def update_weights(s: State, a: UpdateWeights) -> Branches:
    """The heart of the spec.

    ENG-001: a guarded endpoint invalidates its prefix cache whatever was asked; ENG-002:
    otherwise it does so when asked (an omitted ``flush_cache`` read by the engine's
    profile). ENG-012: encoder outputs follow every update. FC-001: if a required flush
    cannot complete (KV held, or an injected refusal) the update reports failure, and
    either changes nothing or installs the weights and closes the endpoint (FC-002) until a
    flush completes; on an exact lane the engine may instead stop (fail-closed by stopping,
    safe, reported as an availability note).
    """
    return _install(s, a.endpoint, s.endpoint(a.endpoint), a.version, a.flush_cache)


class Install(Enum):
    """The named outcomes of a completed update (``_install``), in the order the checker
    tries them (the first branch's violations explain a mismatch no branch agrees with).

    ``FLUSHED``: installed and invalidated as required. ``OPT_OUT``: installed without a
    flush, as asked (INV-001's waiver where the spec's client would skip it too).
    ``REFUSED_KEPT`` / ``REFUSED_CLOSED``: a required flush could not complete (KV held or
    an injected refusal): failure reported, nothing changed, or the weights installed and
    the endpoint closed until a flush completes (FC-001, FC-002). ``STOPPED`` /
    ``STOPPED_LOADED``: on an exact lane the engine may stop instead, before or after the
    load (CD-07). ``ABORTED_THEN_FLUSHED``: on an exact lane the holders are aborted and the
    flush completes (CD-08). ``REFUSED_ASLEEP``: with the KV released, the update refused
    cleanly (MEM-001). ``FAILED_KEPT`` / ``FAILED_CLOSED`` / ``FAILED_TORN``: the update
    failed for a reason of the engine's own (its flush raised, a bucket or a rank failed):
    failure reported, and the endpoint at its old weights with its cache, or closed with
    whole new weights (FC-002) or torn ones (FC-004). A failed update may always be
    reported; what the endpoint serves next is what is judged."""

    FLUSHED = "flushed"
    OPT_OUT = "opt-out"
    REFUSED_KEPT = "refused, kept"
    REFUSED_CLOSED = "refused, closed"
    STOPPED = "stopped"
    STOPPED_LOADED = "stopped after the load"
    ABORTED_THEN_FLUSHED = "aborted then flushed"
    REFUSED_ASLEEP = "refused while the KV is released"
    FAILED_KEPT = "failed, kept"
    FAILED_CLOSED = "failed, closed"
    FAILED_TORN = "failed, torn"


_FAILED = {"weights": RuleId.FC_004, "label": RuleId.INV_003}
"""Who answers for the probe after a failed update: FC-004 (old weights with their cache,
or closed), INV-003 for the label."""


FAILED = frozenset({Install.FAILED_KEPT, Install.FAILED_CLOSED, Install.FAILED_TORN})
"""The outcomes of an update that failed for a reason of the engine's own."""


def named_updates(s: State, a: UpdateWeights) -> list[tuple[Install, State, Outcome]]:
    """The branches of ``UpdateWeights`` with their ``Install`` names, in ``step``'s order
    (empty where the update is not enabled)."""
    if not step(s, a):
        return []
    ep = s.endpoint(a.endpoint)
    s = evolve(s, trainer=max(s.trainer, a.version))
    branches = _install_branches(ep, a.version, a.flush_cache, plan_for(s, a.endpoint))
    return [(name, s.with_endpoint(a.endpoint, e), o) for name, e, o in branches]


def _install(
    s: State, index: int, ep: Endpoint, version: int, flush_cache: bool | None
) -> Branches:
    """A completed update of endpoint ``index`` (now ``ep``) to ``version``: the body of
    UpdateWeights, also what FinishWeightUpdate publishes (after a finish, the prefix cache
    obligations are those of a one-shot update). Its branches are the ``Install`` outcomes
    the spec allows here, each built in one place below."""
    s = evolve(s, trainer=max(s.trainer, version))
    branches = _install_branches(ep, version, flush_cache, plan_for(s, index))
    return tuple((s.with_endpoint(index, e), o) for _, e, o in branches)


InstallBranches = tuple[tuple[Install, Endpoint, Outcome], ...]


@lru_cache(maxsize=1 << 14)
def _install_branches(
    ep: Endpoint, version: int, flush_cache: bool | None, plan: Plan
) -> InstallBranches:
    """The ``Install`` outcomes of updating ``ep`` to ``version``, each with the endpoint
    it leaves and the outcome it answers. A function of its arguments alone, so memoized:
    a search installs the same endpoint value in many states (to depth 3 on the default
    bounds, about 50,000 installs of under 1,000 distinct arguments)."""
    guarded = ep.config.guarded
    must_flush = guarded or asked_to_flush(ep, flush_cache)
    # With the radix cache off there is nothing to flush, and an engine keying every prefix
    # by version invalidates by namespace: such an update needs no flush, so none can be
    # refused (CD-06, CD-03); it may still try one and honestly report the refusal.
    needless = must_flush and (ep.config.versioned_keys or not ep.config.radix)
    asleep = ep.kv_released  # the colocated order: KV released, weights resident
    # With the KV released the flush is judged as any update's (ENG-001/002, ENG-003 for
    # a tier it left): the released device pool is no reason to skip it.
    flush_rule = RuleId.ENG_001 if guarded else RuleId.ENG_002
    blame = {
        "cache": flush_rule if must_flush else RuleId.ENG_012,
        "weights": RuleId.ENG_001 if guarded else RuleId.INV_003,
        "draft": RuleId.ENG_004,
        "scales": RuleId.ENG_005,
        "label": RuleId.INV_003,
        "derived": RuleId.DER_001,
    }
    loaded = load(ep, version)
    if not ep.config.encoder_reset_separate:
        loaded = derived_dropped(loaded)  # else the client resets it (CLI-009)
    flushed = encoder_kept(loaded, invalidated(loaded, version))
    if not ep.config.radix:
        # No prefix cache: only in-flight requests' own KV can cross the update, and no
        # flush protects it (a pause does, the client's CLI-007); INV-001 waives it.
        flushed = evolve(flushed, waived=not ep.config.misreports)
    done = evolve(
        ok(flushed, RuleId.MEM_001 if asleep else RuleId.LIV_001, **blame), flushed_from=ep.cache
    )
    kept = evolve(ep, refuse_flush=False)
    closed = evolve(loaded, dirty=True, refuse_flush=False)
    out: list[tuple[Install, Endpoint, Outcome]] = []
    if must_flush and (ep.kv_held or ep.refuse_flush):
        fail = {"weights": RuleId.FC_001, "label": RuleId.INV_003}
        # The idle gate (FC-005) owes the refusal to a live request's KV, not to a fault: a
        # success that shows the flush done freed that KV; one that shows it skipped, FC-001.
        gate = None if ep.refuse_flush else RuleId.FC_005
        for name, e in ((Install.REFUSED_KEPT, kept), (Install.REFUSED_CLOSED, closed)):
            refused = rejected(e, RuleId.FC_001, **fail)
            out.append((name, e, evolve(refused, completion=done, gate=gate)))
        if guarded:  # an injected refusal is FC-001's, asleep or not (CD-07 may stop)
            out.append((Install.STOPPED, stop(ep), evolve(stopped(done), gate=gate)))
            out.append((Install.STOPPED_LOADED, stop(loaded), evolve(stopped(done), gate=gate)))
            out.append((Install.ABORTED_THEN_FLUSHED, *aborted_then_flushed(ep, version, blame)))
        if needless:
            out.append((Install.FLUSHED, flushed, done))
    elif must_flush and asleep:
        # MEM-001: with the KV released the flush succeeds (nothing on device to remove,
        # the index and lower tiers emptied) or the whole update is refused cleanly.
        refused = rejected(ep, RuleId.MEM_001, weights=RuleId.MEM_001, label=RuleId.INV_003)
        out.append((Install.FLUSHED, flushed, done))
        out.append((Install.REFUSED_ASLEEP, ep, evolve(refused, completion=done)))
    elif must_flush:
        out.append((Install.FLUSHED, flushed, done))
    else:
        # INV-001's waiver: only where the spec's own client would skip the flush too, and
        # never for an engine declared to misreport its radix cache.
        skipped = not plan.flush or not ep.config.radix
        opted = evolve(loaded, waived=skipped and not ep.config.misreports)
        out.append((Install.OPT_OUT, opted, ok(opted, **blame)))
    return (*out, *_failed(ep, closed, out))


_FAILED_NOTE = (
    "availability: the engine reported an update failed (allowed; judged by what it served next)"
)


def _failed(
    ep: Endpoint, closed: Endpoint, taken: list[tuple[Install, Endpoint, Outcome]]
) -> list[tuple[Install, Endpoint, Outcome]]:
    """The ``FAILED_*`` branches: an update that reports failure for a reason of the
    engine's own (sgl-project/sglang-omni PR #678: the post-update flush raised after the
    weights were reloaded, PF-32; a bucket that failed after others were copied into the
    live parameters, PF-27). Each is allowed; none already taken here is offered twice."""
    torn = evolve(ep, torn=True, label=None)
    rejected_states = {e for _, e, o in taken if o.observation.status is Status.REJECTED}
    out = []
    # An injected flush refusal may have been spent by a flush the engine ran on its own
    # inside the failed update (one it runs on every update, asked or not), or not.
    spent = evolve(ep, refuse_flush=False)
    for name, e, status in (
        (Install.FAILED_KEPT, ep, RuleId.FC_004),
        *(((Install.FAILED_KEPT, spent, RuleId.FC_004),) if ep.refuse_flush else ()),
        (Install.FAILED_CLOSED, closed, RuleId.FC_002),
        (Install.FAILED_TORN, torn, RuleId.FC_004),
    ):
        if e not in rejected_states:
            outcome = evolve(rejected(e, status, **_FAILED), note=_FAILED_NOTE)
            out.append((name, e, outcome))
    return out


def aborted_then_flushed(ep: Endpoint, version: int, blame: dict[str, str]) -> tuple:
    """Fail-closed by making the flush possible (CD-08): on an exact lane, the engine
    aborts every request holding KV (running or paused in place; retracted ones stay
    queued), its retried flush then completes (an injected refusal was spent on the first
    attempt), and the update succeeds. Safe: nothing that held old KV survives; the cost
    is the aborted requests, reported as an availability note. Mirrors vLLM
    ``Scheduler.reset_prefix_cache(reset_running_requests=True)``
    (``vllm/v1/core/sched/scheduler.py``), which preempts the running requests so that the
    reset cannot be refused."""
    holders = frozenset(r.rid for r in ep.requests if r.holds_kv)
    rest = tuple(r for r in ep.requests if not r.holds_kv)
    freed = evolve(ep, requests=rest, refuse_flush=False)
    flushed = invalidated(derived_dropped(load(freed, version)), version)
    note = "availability: the engine aborted the requests holding KV to flush"
    outcome = evolve(
        ok(flushed, RuleId.FC_001, aborted=RuleId.ENG_009, **blame), flushed_from=ep.cache
    )
    outcome = evolve(seen(outcome, aborted=holders), note=note if holders else "")
    return flushed, evolve(outcome, shows_aborts=bool(holders))


def stop(ep: Endpoint) -> Endpoint:
    """The engine process exited: no requests, nothing served until Restart; of the cache,
    only entries of the weights in force may outlive the process (a disk tier), and the
    restart judges them again (``restarted_cache``)."""
    phase = lifecycle.next_phase(ep.phase, "EngineStops")
    return evolve(
        ep,
        phase=phase,
        cache=restarted_cache(ep, ep),
        requests=(),
        pause=None,
        refuse_flush=False,
        released=frozenset(),
        cleared=False,
    )


def stopped(claimed: Outcome) -> Outcome:
    """The STOPPED answer: allowed only where ``update_weights`` offers it (FC-001)."""
    note = "availability: the engine stopped after a refused mandatory flush (safe)"
    return Outcome(
        Observation(Status.STOPPED),
        because=Blame(status=RuleId.FC_001),
        completion=claimed,
        note=note,
    )


@action(FaultUpdateFailsMidway, when=_newer_version)
def fault_update_fails_midway(s: State, a: FaultUpdateFailsMidway) -> Branches:
    """FC-004: rolled back (consistent) or torn and closed; either way, failure."""
    ep = s.endpoint(a.endpoint)
    s = evolve(s, trainer=max(s.trainer, a.version))
    torn = evolve(ep, torn=True, label=None)
    blame = {"weights": RuleId.FC_004, "label": RuleId.INV_003}
    return (
        (s, rejected(ep, RuleId.FC_004, **blame)),
        (s.with_endpoint(a.endpoint, torn), rejected(torn, RuleId.FC_004, **blame)),
    )


# ----- two-phase updates (WIN-001..003) ----------------------------------------------------


@action(BeginWeightUpdate, when=_newer_version)
def begin_weight_update(s: State, a: BeginWeightUpdate) -> Branches:
    """Open the window: nothing lands yet, the endpoint serves its old weights as before.
    On torn weights (a failed update or a refused finish left them) the window is how a
    client retries the update, as SkyRL's next sync does against vLLM: the live weights
    are mixed from the start, so serving inside the window is WIN-001's mixed serving, and
    a rollback returns to the torn weights, closed (``OpenUpdate.from_torn``)."""
    ep = s.endpoint(a.endpoint)
    ep = evolve(ep, update=OpenUpdate(a.version, from_torn=ep.torn))
    s = evolve(s, trainer=max(s.trainer, a.version))
    return ((s.with_endpoint(a.endpoint, ep), ok(ep)),)


def _rolled_back(ep: Endpoint) -> Endpoint:
    """``ep`` with its window given up and the weights as the window found them: whole and
    labelled, or the torn weights it opened on (``from_torn``: closed, no label). KV of the
    mixed weights goes either way (WIN-002)."""
    assert ep.update is not None
    whole = not ep.update.from_torn
    label = ep.weights if whole else None
    return window_dropped(evolve(ep, update=None, fail_chunk=False, torn=not whole, label=label))


@action(UpdateWeightChunk, when=_window_open)
def update_weight_chunk(s: State, a: UpdateWeightChunk) -> Branches:
    """A chunk lands in the live parameters: they are mixed from now on (the torn state a
    failed bucketed update leaves, but inside an open window: no whole version, no label;
    WIN-001); or it is staged aside and the live weights stay the old version, whole and
    labelled, until the finish swaps the staged tensors in (CD-14). A chunk after a failed
    one is refused (WIN-003). A chunk that fails reports failure and leaves the endpoint
    rolled back (old weights whole, its label, and no KV of the mixed weights: WIN-002) or
    closed (torn, FC-002 until a new update or restart)."""
    ep = s.endpoint(a.endpoint)
    assert ep.update is not None
    if ep.update.failed:
        return ((s, rejected(ep, RuleId.WIN_003)),)
    if ep.fail_chunk:
        failed = evolve(ep.update, failed=True)
        back = evolve(_rolled_back(ep), update=failed)
        closed = evolve(ep, torn=True, label=None, fail_chunk=False, update=failed)
        blame = {"weights": RuleId.WIN_003, "label": RuleId.WIN_003, **_mixed_kv_blame(ep)}
        return tuple(
            (s.with_endpoint(a.endpoint, e), rejected(e, RuleId.WIN_003, **blame))
            for e in (back, closed)
        )
    ep2 = evolve(ep, torn=True, label=None, update=evolve(ep.update, landed=True))
    landed = (
        s.with_endpoint(a.endpoint, ep2),
        ok(ep2, weights=RuleId.WIN_001, label=RuleId.WIN_001),
    )
    # Or the chunk is staged aside (a buffer the forward never reads) and swapped in whole
    # at the finish: the live weights stay the old version, whole and labelled as before.
    staged_ep = evolve(ep, update=evolve(ep.update, landed=True))
    staged = (
        s.with_endpoint(a.endpoint, staged_ep),
        ok(staged_ep, weights=RuleId.WIN_001, label=RuleId.WIN_001),
    )
    return (staged, landed)


@action(FinishWeightUpdate, when=_window_open)
def finish_weight_update(s: State, a: FinishWeightUpdate) -> Branches:
    """Close the window and publish its version, exactly as a completed UpdateWeights
    (ENG-001/002/012, FC-001, DER-001), after dropping every KV computed under the mixed
    weights whatever ``flush_cache`` asked (WIN-002: only the engine knows it served under
    them). After a failed chunk the finish reports failure and publishes nothing: the
    endpoint stays as the failure left it, rolled back or closed (WIN-003)."""
    ep = s.endpoint(a.endpoint)
    assert ep.update is not None
    shut = window_dropped(evolve(ep, update=None, fail_chunk=False))
    if ep.update.failed:
        blame = {"weights": RuleId.WIN_003, "label": RuleId.WIN_003, "derived": RuleId.WIN_003}
        return ((s.with_endpoint(a.endpoint, shut), rejected(shut, RuleId.WIN_003, **blame)),)
    branches = _install(s, a.endpoint, shut, ep.update.version, a.flush_cache)
    if not _mixed_kv_blame(ep):
        return branches
    mixed = frozenset(e for e in ep.cache if e.version == MIXED)
    return tuple((s2, _window_cache_blame(o, mixed)) for s2, o in branches)


def _mixed_kv_blame(ep: Endpoint) -> dict[str, str]:
    """WIN-002 answers for the cache listing only where there was KV of mixed weights to
    drop (a listing that could not have shown it kept is no evidence)."""
    return {"cache": RuleId.WIN_002} if any(e.version == MIXED for e in ep.cache) else {}


def _window_cache_blame(o: Outcome, mixed: frozenset[Entry]) -> Outcome:
    """A finish that keeps KV of the mixed weights breaks WIN-002, whether or not a flush
    was also due (then it broke that flush's rule too; WIN-002 is the one it cannot be
    waived from)."""
    if o.because.cache is None:
        return o
    before = mixed | (o.flushed_from or frozenset())
    return evolve(o, because=evolve(o.because, cache=RuleId.WIN_002), flushed_from=before)


@action(AbortWeightUpdate, when=_window_open)
def abort_weight_update(s: State, a: AbortWeightUpdate) -> Branches:
    """Give up the window: rolled back (old weights whole, label back, no KV of the mixed
    weights: WIN-002; or, for a window opened on torn weights, back to them) or, once a
    chunk landed, closed (torn: FC-002). Either is a done abort; a window that never
    landed a chunk simply closes."""
    ep = s.endpoint(a.endpoint)
    back = _rolled_back(ep)
    if ep.label is None and not ep.torn:
        back = evolve(back, label=None)  # a label that was already gone stays gone
    blame = {"weights": RuleId.WIN_003, "label": RuleId.WIN_003, **_mixed_kv_blame(ep)}
    out = [(s.with_endpoint(a.endpoint, back), ok(back, **blame))]
    if ep.torn:
        closed = evolve(ep, update=None, fail_chunk=False, label=None)
        out.append((s.with_endpoint(a.endpoint, closed), ok(closed, **blame)))
    return tuple(out)


@action(FaultChunkFails, when=_window_healthy)
def fault_chunk_fails(s: State, a: FaultChunkFails) -> Branches:
    """Fault: the next chunk of the open window fails."""
    ep2 = evolve(s.endpoint(a.endpoint), fail_chunk=True)
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2)),)


def sync_actions(s: State, a: SyncWeights) -> list[Action]:
    """The engine calls a sync makes, endpoint by endpoint, from the spec's plans."""
    calls: list[Action] = []
    for i in range(len(s.endpoints)):
        plan = plan_for(s, i)
        calls += [
            PauseGeneration(i, plan.pause_mode),
            UpdateWeights(i, a.version, a.funnel, plan.flush),
            ContinueGeneration(i),
        ]
    return calls


@action(SyncWeights, when=_next_sync)
def sync_weights(s: State, a: SyncWeights) -> Branches:
    """The composition of ``sync_actions``: every combination of their branches.

    The outcome of a sync is that of its last call; the stateful machine drives the calls
    one by one and compares each.
    """
    frontier: list[Branch] = [(s, ok(s.endpoint(0)))]
    for call in sync_actions(s, a):
        frontier = [b for here in frontier for b in step(here[0], call) or _if_stopped(here, call)]
    return tuple(frontier)


def _if_stopped(branch: Branch, call: Action) -> Branches:
    """A sync drives nothing more on an endpoint whose engine stopped mid-sync (CD-07)."""
    stopped = branch[0].endpoint(call.endpoint).phase is Phase.STOPPED  # type: ignore[attr-defined]
    return (branch,) if stopped else ()


@action(FlushCache, when=_always)
def flush_cache(s: State, a: FlushCache) -> Branches:
    """LIV-001: refused only while KV is held or a refusal is injected (while KV is held
    with nothing to flush, a success that changes nothing is allowed too). FC-005: while a
    live request holds KV the flush is refused (the idle gate; ``Outcome.gate``). ENG-003: a
    completed flush removes every entry of other weights, lineage or KV format on every
    tier; an entry of the weights in force may stay (``flushed``: a storage tier keyed by
    version keeps it). FC-003: the reported result is the truth (a flush that removed
    nothing it had to yet reports success is FC-003's; one that removed some but not all,
    ENG-003's). A flush on torn weights still leaves the endpoint closed."""
    ep = s.endpoint(a.endpoint)
    if ep.kv_held or ep.refuse_flush:
        ep2 = evolve(ep, refuse_flush=False)
        outcome = seen(rejected(ep2, RuleId.FC_003, flushed=RuleId.FC_003), flushed=False)
        if ep.refuse_flush or ep.config.radix or ep.cache:
            if not ep.refuse_flush:
                # The idle gate (FC-005): a live request holds KV. A success that shows
                # this completed flush freed it; one that shows entries kept lied (FC-003).
                outcome = evolve(outcome, gate=RuleId.FC_005, completion=_completed(s, a)[1])
            return ((s.with_endpoint(a.endpoint, ep2), outcome),)
        refused = (s.with_endpoint(a.endpoint, ep2), outcome)
        # Nothing to flush (the radix cache off, no entry on any tier): the KV the requests
        # hold is nowhere a flush could drop it, so a success that changes nothing is as
        # allowed as the refusal.
        nothing = ok(ep, RuleId.LIV_001, flushed=RuleId.FC_003, cache=RuleId.FC_003)
        nothing = seen(nothing, flushed=True)
        return (refused, (s, evolve(nothing, flushed_from=ep.cache)))
    done = _completed(s, a)
    if ep.kv_released:  # or refused cleanly, changing nothing (MEM-001)
        refused = seen(rejected(ep, RuleId.MEM_001, flushed=RuleId.FC_003), flushed=False)
        return (done, (s, refused))
    return (done,)


def _completed(s: State, a: FlushCache) -> Branch:
    """A flush of ``a.endpoint`` that completed: every entry of other weights, lineage or
    KV format gone on every tier (ENG-003), reported done (FC-003)."""
    ep = s.endpoint(a.endpoint)
    ep2 = encoder_kept(ep, flushed(ep))
    # MEM-001: with the KV released there is nothing on device to remove; the flush empties
    # the index (and lower tiers) and answers, it never touches the released pools.
    status = RuleId.MEM_001 if ep.kv_released else RuleId.LIV_001
    outcome = seen(ok(ep2, status, flushed=status, cache=RuleId.FC_003), flushed=True)
    # ``flushed_from``: what it had to remove, so that a listing after a flush of current
    # entries alone is no evidence (nothing there could be wrongly kept); ``droppable``: the
    # current entries it kept, which it may as well have removed.
    kept = ep2.cache & ep.cache
    outcome = evolve(outcome, flushed_from=ep.cache - ep2.cache, droppable=kept)
    return (s.with_endpoint(a.endpoint, ep2), outcome)


@action(FlushEncoderCache, when=_always)
def flush_encoder_cache(s: State, a: FlushEncoderCache) -> Branches:
    """vLLM ``reset_encoder_cache``: every cached encoder output is dropped; it holds no
    request's KV, so it is never refused (CLI-009 is the client's obligation to call it)."""
    ep = s.endpoint(a.endpoint)
    ep2 = evolve(ep, cache=frozenset(e for e in ep.cache if e.kind is not Kind.ENCODER))
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2, cache=RuleId.ENG_012)),)


@action(EvictPrefix, when=_lower_tier_holds)
def evict_prefix(s: State, a: EvictPrefix) -> Branches:
    """Hierarchical cache: a prefix's target and draft KV move down a tier together."""
    ep = s.endpoint(a.endpoint)
    moving = evictable(ep, a.prefix)
    ep2 = evolve(ep, cache=(ep.cache - moving) | {evolve(e, tier=a.tier) for e in moving})
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2, cache=RuleId.ENG_008)),)


@action(LoadLora, when=_lora_idle)
def load_lora(s: State, a: LoadLora) -> Branches:
    """ENG-007: the old revision's KV becomes unreachable (here: dropped)."""
    ep = s.endpoint(a.endpoint)
    cache_ = frozenset(e for e in ep.cache if e.lora is None)
    ep2 = evolve(ep, lora=ep.lora + 1, cache=cache_)
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2, cache=RuleId.ENG_007)),)


@action(FaultRefuseFlush, when=_no_fault_pending)
def fault_refuse_flush(s: State, a: FaultRefuseFlush) -> Branches:
    """Fault: the next flush attempt on the endpoint is refused."""
    ep2 = evolve(s.endpoint(a.endpoint), refuse_flush=True)
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2)),)


@action(PauseGeneration, when=_clear_can_complete)
def pause_generation(s: State, a: PauseGeneration) -> Branches:
    """ENG-009: abort ends requests; retract frees their KV; in_place keeps it.

    ``clear_cache`` (vLLM ``/pause?clear_cache=true``): then the prefix cache is flushed on
    every tier, and honestly reported (FC-003: a pause that claims the clear but keeps KV
    is a flush report that lies). An injected refusal makes the pause report failure
    (still paused, nothing removed). A completed clear marks the endpoint ``cleared``:
    PAUSED admits no prefill, so no KV is computed between this pause and an update, and
    that update may skip its own flush (the flush-at-pause design)."""
    ep = s.endpoint(a.endpoint)
    aborted: frozenset[str] = frozenset()
    requests = ep.requests
    if a.mode is PauseMode.ABORT:
        aborted, requests = frozenset(r.rid for r in requests), ()
    elif a.mode is PauseMode.RETRACT:
        requests = tuple(evolve(r, uses=frozenset(), retracted=True) for r in requests)
    phase = lifecycle.next_phase(ep.phase, a.name)
    ep2 = evolve(ep, phase=phase, pause=a.mode, requests=requests)
    outcome = seen(ok(ep2, aborted=RuleId.ENG_009), aborted=aborted)
    if not a.clear_cache:
        return ((s.with_endpoint(a.endpoint, ep2), outcome),)
    if ep2.refuse_flush:
        ep3 = evolve(ep2, refuse_flush=False)
        refused = rejected(ep3, RuleId.FC_003, flushed=RuleId.FC_003, aborted=RuleId.ENG_009)
        return ((s.with_endpoint(a.endpoint, ep3), seen(refused, flushed=False, aborted=aborted)),)
    # Every entry goes, of the weights in force too (stricter than FlushCache): the update
    # after a clearing pause may skip its own flush, so what stayed here would be stale then.
    ep3 = evolve(encoder_kept(ep2, emptied(ep2)), cleared=True)
    done = ok(
        ep3, RuleId.LIV_001, flushed=RuleId.LIV_001, cache=RuleId.FC_003, aborted=RuleId.ENG_009
    )
    done = evolve(seen(done, flushed=True, aborted=aborted), flushed_from=ep.cache)
    return ((s.with_endpoint(a.endpoint, ep3), done),)


@action(ContinueGeneration, when=_always)
def continue_generation(s: State, a: ContinueGeneration) -> Branches:
    """Retracted requests recompute their prefix under the weights now in force (each
    recompute may hit or miss, as any prefill); inside a window with mixed weights they
    may instead wait (WIN-001's refusal)."""
    ep = s.endpoint(a.endpoint)
    ep = evolve(ep, phase=lifecycle.next_phase(ep.phase, a.name), pause=None, cleared=False)
    frontier = [(evolve(ep, requests=()), False)]
    for r in ep.requests:
        nxt = []
        for e, dropped in frontier:
            if not r.retracted or ep.closed:
                nxt.append((evolve(e, requests=(*e.requests, r)), dropped))
                continue
            for p in prefills(e, r.prefix, r.lora, r.namespace):
                again = evolve(r, uses=p.uses, retracted=False)
                nxt.append((evolve(p.ep, requests=(*p.ep.requests, again)), dropped or p.dropped))
            if ep.update is not None:  # WIN-001: it may wait while the window is open
                nxt.append((evolve(e, requests=(*e.requests, r)), dropped))
        frontier = nxt
    recomputes = any(r.retracted for r in ep.requests) and not ep.closed
    return tuple(
        (
            s.with_endpoint(a.endpoint, e),
            evolve(ok(e, cache=RuleId.ENG_009), dropped=d, forward=recomputes),
        )
        for e, d in frontier
    )


@action(Sleep, when=_releases_more)
def sleep(s: State, a: Sleep) -> Branches:
    """Release the memory of ``a.tags``. ENG-006: released device KV memory is discarded,
    and its index entries with it (lower tiers live in host memory and stay); released
    weights are kept aside and come back unchanged.

    Nothing is served while KV memory is released, so the index entries of the released
    device KV may also stay listed until the resume drops them (``wake_up``: an engine that
    resets its prefix cache on wake instead of at sleep). A release of KV memory may run the
    engine's own flush first (SGLang's ``release_memory_occupation`` with the ``kv_cache``
    tag): an injected refusal is then spent on it, or not."""
    ep = s.endpoint(a.endpoint)
    phase = lifecycle.next_phase(ep.phase, a.name)
    kept = evolve(ep, phase=phase, released=ep.released | a.tags)
    if MemoryTag.KV_CACHE not in a.tags:
        return ((s.with_endpoint(a.endpoint, kept), ok(kept, cache=RuleId.ENG_006)),)
    dropped = evolve(kept, cache=frozenset(e for e in ep.cache if e.tier is not Tier.DEVICE))
    ends = [dropped, *((kept,) if kept.cache != dropped.cache else ())]
    if ep.refuse_flush:
        ends += [evolve(e, refuse_flush=False) for e in ends]
    return tuple((s.with_endpoint(a.endpoint, e), ok(e, cache=RuleId.ENG_006)) for e in ends)


@action(WakeUp, when=_resumes_some)
def wake_up(s: State, a: WakeUp) -> Branches:
    """Resume the released memory of ``a.tags``; the endpoint serves again once nothing is
    released. MEM-002: resumed KV memory holds no reusable KV, so no index entry comes back
    with it (an index stashed at release and restored here points at garbage)."""
    ep = s.endpoint(a.endpoint)
    left = ep.released - a.tags
    phase = lifecycle.next_phase(ep.phase, "WakeUp" if not left else "WakeUpPartly")
    ep2 = evolve(ep, phase=phase, released=left)
    resumed = MemoryTag.KV_CACHE in (a.tags & ep.released)
    if resumed:  # index entries a release left listed go now, before anything is served
        ep2 = evolve(ep2, cache=frozenset(e for e in ep.cache if e.tier is not Tier.DEVICE))
    rule = RuleId.MEM_002 if resumed else RuleId.ENG_006
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2, cache=rule)),)


@action(PublishVersion, when=_known_version)
def publish_version(s: State, a: PublishVersion) -> Branches:
    """PUB-001: the label names the whole weights installed. A publish of any other version
    (ahead of the weights, behind them, or on torn weights) is refused and leaves the label
    as it was: a label the weights do not back is a lie (the engine checks; SGLang and vLLM
    set it unchecked). A publish the weights back may succeed or be refused (an engine that
    labels only through its updates, CD-11). PUB-002: it aborts in-flight requests only when
    ``abort_requests`` (SGLang ``abort_all_requests``), whether or not the label moves (SGLang
    aborts before it sets the label, CD-12); requests a pause kept (retract, in place) stay
    kept."""
    ep = s.endpoint(a.endpoint)
    parts = {ep.weights, *((ep.draft,) if ep.config.draft else ())}
    parts |= {ep.scales} if ep.config.fp8_kv else set()
    whole = not ep.torn and parts == {a.version}
    at_risk = bool(ep.requests)
    aborted = frozenset(r.rid for r in ep.requests) if a.abort_requests else frozenset()
    requests = () if a.abort_requests else ep.requests
    refusals = [_publish_refused(s, a.endpoint, ep, frozenset(), ep.requests, at_risk)]
    if aborted:  # the asked-for abort may run before the check (SGLang's order), CD-12
        refusals.append(_publish_refused(s, a.endpoint, ep, aborted, requests, at_risk))
    if not whole:
        return tuple(refusals)
    ep2 = evolve(ep, label=a.version, requests=requests)
    out = seen(ok(ep2, label=RuleId.PUB_001, aborted=RuleId.PUB_002), aborted=aborted)
    # An engine may also refuse a publish the weights back: it publishes labels only with
    # an update (CD-11). Refusing changes nothing and lies about nothing.
    note = "availability: the engine refused a label-only publish its weights back"
    later = [evolve(b, note=note) for s2, b in refusals]
    return (
        (s.with_endpoint(a.endpoint, ep2), evolve(out, at_risk=at_risk)),
        *((s2, o) for (s2, _), o in zip(refusals, later, strict=True)),
    )


def _publish_refused(
    s: State, index: int, ep: Endpoint, aborted: frozenset[str], requests, at_risk: bool
) -> Branch:
    """A refused publish: the label stays as it was (PUB-001); requests are aborted only if
    the caller asked (PUB-002), and SGLang's handler runs that abort before anything else,
    so a refused publish may have aborted them (``aborted``) or not."""
    ep2 = evolve(ep, requests=requests)
    out = seen(
        rejected(ep2, RuleId.PUB_001, label=RuleId.PUB_001, aborted=RuleId.PUB_002), aborted=aborted
    )
    return (s.with_endpoint(index, ep2), evolve(out, at_risk=at_risk))


@action(Restart, when=_always)
def restart(s: State, a: Restart) -> Branches:
    """ENG-010: start from the last whole checkpoint (also after a stop), with no request
    in flight; of the cache, only entries of the weights, lineage and format it restarts
    at may survive, on any tier (``restarted_cache``: a disk tier reopened)."""
    ep = s.endpoint(a.endpoint)
    ep2 = load(evolve(ep, phase=lifecycle.next_phase(ep.phase, a.name), pause=None), ep.weights)
    ep2 = evolve(
        ep2,
        requests=(),
        dirty=False,
        waived=False,
        refuse_flush=False,
        released=frozenset(),
        cleared=False,
        update=None,  # an open window dies with the process
        fail_chunk=False,
    )
    ep2 = evolve(ep2, cache=restarted_cache(ep, ep2))
    done = ok(ep2, cache=RuleId.ENG_010, weights=RuleId.ENG_010, derived=RuleId.DER_001)
    return ((s.with_endpoint(a.endpoint, ep2), evolve(done, droppable=ep2.cache)),)


# ----- data-parallel ranks behind one endpoint (RNK-001..003) ------------------------------
#
# A ranked endpoint (``Config.ranks`` > 1) is its ranks, each a single-scheduler Endpoint
# stepped by the effects above; what is the endpoint's own is the merge of their replies
# and its closing. A request names its rank (``rank``, SGLang's ``data_parallel_rank``); a
# flush, an update, a pause and a continue go to every rank, and the endpoint replies with
# the merge (all must succeed). Sleeps, restarts, two-phase windows, publishes, tiers and a
# pause that clears the cache are not modelled across ranks: not enabled on such an endpoint.

SCHEDULER_CALLS: frozenset[type[Action]] = frozenset(
    {
        ServeRequest,
        StartRequest,
        FinishRequest,
        UpdateWeights,
        FlushCache,
        PauseGeneration,
        ContinueGeneration,
    }
)
"""The requests and control calls every deployment part takes as one scheduler would (a
ranked endpoint, a worker behind a router); each deployment adds its own."""

RANKED_ACTIONS: frozenset[type[Action]] = SCHEDULER_CALLS | {
    FaultUpdateFailsMidway,
    FaultRankUpdateFails,
}
"""The actions enabled on a ranked endpoint (a client's SyncWeights drives them)."""


def _placed(ep: Endpoint, a: Action) -> bool:
    """``a`` may run on ``ep`` as far as ranks go: a ranked endpoint takes only
    ``RANKED_ACTIONS``, and a request's ``rank`` names one of the endpoint's ranks."""
    if ep.ranks and (type(a) not in RANKED_ACTIONS or getattr(a, "clear_cache", False)):
        return False
    if ep.config.store and not _on_store(a):
        return False
    return 0 <= getattr(a, "rank", 0) < ep.config.ranks


def ranked(ep: Endpoint, ranks: tuple[Endpoint, ...], **own: object) -> Endpoint:
    """``ep`` with ``ranks`` and the fields merged from them: the union of their caches and
    in-flight requests, the oldest of their weights; ``own`` sets the endpoint's own fields
    (``label``, ``torn``)."""
    return evolve(
        ep,
        ranks=ranks,
        cache=frozenset().union(*(r.cache for r in ranks)),
        requests=tuple(q for r in ranks for q in r.requests),
        weights=min(r.weights for r in ranks),
        **own,
    )


def _shown(o: Outcome, ep: Endpoint) -> Outcome:
    """``o`` (a rank's outcome) with the probe of the whole endpoint ``ep``."""
    return evolve(o, observation=evolve(o.observation, view=view(ep)))


def _on_rank(s: State, a: Action, k: int, effect: Effect) -> Branches:
    """Step rank ``k`` of endpoint ``a.endpoint`` with a single scheduler's ``effect``."""
    i = a.endpoint  # type: ignore[attr-defined]
    ep = s.endpoint(i)
    out = []
    for s2, o in effect(s.with_endpoint(i, ep.ranks[k]), a):
        ranks = (*ep.ranks[:k], s2.endpoint(i), *ep.ranks[k + 1 :])
        ep2 = ranked(ep, ranks)
        o = _shown(o, ep2)
        if o.observation.status is Status.OK:
            # a probe showing one whole version while it serves: RNK-003's evidence
            o = evolve(o, because=evolve(o.because, weights=RuleId.RNK_003))
        out.append((s2.with_endpoint(i, ep2), o))
    return tuple(out)


def _on_every_rank(s: State, a: Action, effect: Effect) -> Branches:
    """Fan ``a`` out to every rank of endpoint ``a.endpoint`` (each stepped by a single
    scheduler's ``effect``, seeing the endpoint closed while its ranks are torn): every
    combination of the ranks' branches, merged: the first rank's outcome with the whole
    endpoint's probe, the union of the requests they ended, the endpoint in their phase,
    closed (``torn``, no label) once a rank's own weights are torn."""
    i = a.endpoint  # type: ignore[attr-defined]
    ep = s.endpoint(i)
    frontier: list[tuple[tuple[Endpoint, ...], tuple[Outcome, ...]]] = [((), ())]
    trainer = s.trainer
    for r in ep.ranks:
        here = s.with_endpoint(i, evolve(r, torn=r.torn or ep.torn))
        nxt = []
        for s2, o in effect(here, a):
            trainer = max(trainer, s2.trainer)
            e = s2.endpoint(i)
            e = e if e.torn and not r.torn and not ep.torn else evolve(e, torn=r.torn)
            nxt += [((*done, e), (*outs, o)) for done, outs in frontier]
        frontier = nxt
    s = evolve(s, trainer=trainer)
    out = []
    for ranks, outs in frontier:
        torn = ep.torn or any(r.torn for r in ranks)
        label = None if torn and not ep.torn else ep.label
        ep2 = ranked(ep, ranks, phase=ranks[0].phase, pause=ranks[0].pause, torn=torn, label=label)
        ended = [o.observation.aborted for o in outs if o.observation.aborted is not None]
        merged = seen(_shown(outs[0], ep2), aborted=frozenset().union(*ended) if ended else None)
        merged = evolve(
            merged, dropped=any(o.dropped for o in outs), forward=any(o.forward for o in outs)
        )
        out.append((s.with_endpoint(i, ep2), merged))
    return tuple(out)


def ranked_fails_midway(s: State, a: FaultUpdateFailsMidway) -> Branches:
    """A bucketed update fails midway on every rank: each rolls back or is torn (FC-004);
    a torn rank closes the endpoint until an update completes on every rank."""
    return _on_every_rank(s, a, fault_update_fails_midway)  # type: ignore[arg-type]


def ranked_pause(s: State, a: PauseGeneration) -> Branches:
    """The pause goes to every rank, each dealing with its own requests (ENG-009)."""
    return _on_every_rank(s, a, pause_generation)  # type: ignore[arg-type]


def ranked_continue(s: State, a: ContinueGeneration) -> Branches:
    """Every rank continues; its retracted requests recompute there (not while torn)."""
    return _on_every_rank(s, a, continue_generation)  # type: ignore[arg-type]


def ranked_request(s: State, a: ServeRequest | StartRequest) -> Branches:
    """A request on rank ``a.rank``: that rank's prefill, cache and weights, as a single
    scheduler's; refused while the ranks are torn (RNK-003)."""
    ep = s.endpoint(a.endpoint)
    if ep.torn:
        return ((s, rejected(ep, RuleId.RNK_003)),)
    effect = serve_request if isinstance(a, ServeRequest) else start_request
    return _on_rank(s, a, a.rank, effect)  # type: ignore[arg-type]


def ranked_finish(s: State, a: FinishRequest) -> Branches:
    """The request finishes on the rank that holds it; aborted while the ranks are torn."""
    ep = s.endpoint(a.endpoint)
    k = next(k for k, r in enumerate(ep.ranks) if any(q.rid == a.rid for q in r.requests))
    if not ep.torn:
        return _on_rank(s, a, k, finish_request)  # type: ignore[arg-type]
    rank = evolve(ep.ranks[k], requests=tuple(q for q in ep.ranks[k].requests if q.rid != a.rid))
    ep2 = ranked(ep, (*ep.ranks[:k], rank, *ep.ranks[k + 1 :]))
    aborted = rejected(ep2, RuleId.RNK_003, aborted=RuleId.RNK_003)
    return ((s.with_endpoint(a.endpoint, ep2), seen(aborted, aborted=frozenset({a.rid}))),)


def ranked_flush(s: State, a: FlushCache) -> Branches:
    """RNK-001: every rank flushes (a rank where a request holds KV refuses, LIV-001) and
    the endpoint reports success only if every rank did. On a refusal the ranks that could
    flush have emptied their trees (sgl-project/sglang's DP controller, CD-16), or none has
    (a controller that asks every rank before any flushes): both are failures."""
    i = a.endpoint
    ep = s.endpoint(i)
    done = tuple(flush_cache(s.with_endpoint(i, r), a)[0] for r in ep.ranks)
    ep2 = ranked(ep, tuple(b[0].endpoint(i) for b in done))
    if all(b[1].observation.status is Status.OK for b in done):
        outcome = seen(
            ok(ep2, RuleId.LIV_001, flushed=RuleId.RNK_001, cache=RuleId.FC_003), flushed=True
        )
        return ((s.with_endpoint(i, ep2), evolve(outcome, flushed_from=ep.cache)),)
    # a rank refused for a request holding KV there: the idle gate's refusal (FC-005's
    # evidence; the merged claim of success stays RNK-001's)
    gate = next((b[1].gate for b in done if b[1].gate is not None), None)
    out = []
    for e in dict.fromkeys(
        (ep2, ranked(ep, tuple(evolve(r, refuse_flush=False) for r in ep.ranks)))
    ):
        refused = rejected(e, RuleId.RNK_001, flushed=RuleId.RNK_001)
        out.append((s.with_endpoint(i, e), evolve(seen(refused, flushed=False), gate=gate)))
    return tuple(out)


def ranked_update(s: State, a: UpdateWeights) -> Branches:
    """RNK-002: the update goes to every rank; each installs it as a single scheduler
    (flushing as ENG-001/002 ask) or fails: its injected fault (FaultRankUpdateFails), or a
    required flush refused there (FC-001's consistent branch). All installed: success, the
    endpoint labelled with the version (and open again if a failed update had closed it).
    Any failed: failure, and either every rank back at its old weights with its cache (the
    ranks that moved rolled back), or the endpoint closed (``torn``, no label) with the
    ranks where they are, until an update completes on every rank (CD-17). A failure that
    only refused flushes caused answers to FC-001 (the update whose flush could not
    complete reports failure), and a claim of success is judged against the update as if
    every flush had run (``completion``); one that a rank's own failure caused, to RNK-002."""
    i = a.endpoint
    ep = s.endpoint(i)
    s = evolve(s, trainer=max(s.trainer, a.version))
    plan = plan_for(s, i)
    after: list[Endpoint] = []
    outcomes: list[Outcome] = []
    claims: list[Outcome] = []  # per rank: what a claim of success would have had to show
    faulted = refused = False
    gate = None  # a rank's flush refused for a request holding KV there (FC-005)
    for r in ep.ranks:
        kept = evolve(r, fail_update=False, refuse_flush=False)
        if r.fail_update:
            after.append(kept)
            faulted = True
            continue
        _, e, o = _install_branches(r, a.version, a.flush_cache, plan)[0]
        if o.observation.status is Status.OK:
            after.append(e)
            outcomes.append(o)
            claims.append(o)
        else:
            after.append(kept)
            refused = True
            gate = gate or o.gate
            if o.completion is not None:
                claims.append(o.completion)
    if not faulted and not refused:
        ep2 = ranked(ep, tuple(after), torn=False, label=a.version)
        done = evolve(_shown(outcomes[0], ep2), flushed_from=ep.cache)
        return ((s.with_endpoint(i, ep2), done),)
    back = ranked(ep, tuple(evolve(r, fail_update=False, refuse_flush=False) for r in ep.ranks))
    shut = ranked(ep, tuple(after), torn=True, label=None)
    status = RuleId.RNK_002 if faulted else RuleId.FC_001
    blame = {"weights": RuleId.RNK_002, "label": RuleId.RNK_002}
    completion = None
    if not faulted and len(claims) == len(ep.ranks):
        cache_ = frozenset().union(*(c.observation.view.cache or () for c in claims))  # type: ignore[union-attr]
        whole = View(weights=a.version, label=a.version, cache=cache_)
        completion = evolve(claims[0], observation=evolve(claims[0].observation, view=whole))
        completion = evolve(completion, flushed_from=ep.cache)
    gate = None if faulted else gate
    return tuple(
        (
            s.with_endpoint(i, e),
            evolve(rejected(e, status, **blame), completion=completion, gate=gate),
        )
        for e in dict.fromkeys((back, shut))
    )


RANKED: dict[type[Action], Effect] = {
    ServeRequest: ranked_request,  # type: ignore[dict-item]
    StartRequest: ranked_request,  # type: ignore[dict-item]
    FinishRequest: ranked_finish,  # type: ignore[dict-item]
    FlushCache: ranked_flush,  # type: ignore[dict-item]
    UpdateWeights: ranked_update,  # type: ignore[dict-item]
    PauseGeneration: ranked_pause,  # type: ignore[dict-item]
    ContinueGeneration: ranked_continue,  # type: ignore[dict-item]
    FaultUpdateFailsMidway: ranked_fails_midway,  # type: ignore[dict-item]
}
"""The effects of ``RANKED_ACTIONS`` on a ranked endpoint (FaultRankUpdateFails is ranked
only, registered as any action)."""


def _rank_can_fail(s: State, a: FaultRankUpdateFails) -> bool:
    ep = s.endpoint(a.endpoint)
    return 0 <= a.rank < len(ep.ranks) and not ep.ranks[a.rank].fail_update


@action(FaultRankUpdateFails, when=_rank_can_fail)
def fault_rank_update_fails(s: State, a: FaultRankUpdateFails) -> Branches:
    """Fault: rank ``a.rank``'s next update fails (consumed by it)."""
    ep = s.endpoint(a.endpoint)
    rank = evolve(ep.ranks[a.rank], fail_update=True)
    ep2 = ranked(ep, (*ep.ranks[: a.rank], rank, *ep.ranks[a.rank + 1 :]))
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2)),)


# ----- a KV store shared by several endpoints (STO-001) ------------------------------------
#
# An endpoint with ``Config.store`` is one scheduler whose requests also write and read the
# deployment's shared store (``State.store``; LMCache, Mooncake, HiCache's L3 backend,
# lmdeploy's cache server). Every response it serves stores the KV of its prefix, tagged
# with the lineage, version and KV format that computed it; a prefill that misses the
# endpoint's own radix cache may load an entry instead, and the spec allows only one of the
# same lineage, version and format (STO-001). A restart, flush or update of an endpoint
# leaves the store as it is: old entries may stay, unreachable, until evicted (CD-20). Only
# ``STORE_ACTIONS`` are enabled on such an endpoint.

STORE_ACTIONS: frozenset[type[Action]] = frozenset(
    {ServeRequest, FlushCache, UpdateWeights, PauseGeneration, ContinueGeneration, Restart}
)
"""The actions enabled on an endpoint attached to the shared store (a client's SyncWeights
drives pauses, updates and continues)."""


def _on_store(a: Action) -> bool:
    """``a`` is modelled on an endpoint attached to the shared store: one of
    ``STORE_ACTIONS``, with no namespace and no clearing pause."""
    plain = getattr(a, "namespace", None) is None and not getattr(a, "clear_cache", False)
    return type(a) in STORE_ACTIONS and plain


def store_key(ep: Endpoint, prefix: str) -> StoreEntry:
    """The one store entry ``ep`` may load for ``prefix``, and the one it writes after
    serving it: its own lineage, weight version and KV format."""
    return StoreEntry(prefix, ep.config.lineage, ep.weights, ep.config.kv_format)


def stored_request(s: State, a: ServeRequest) -> Branches:
    """A request on an endpoint attached to the shared store: a single scheduler's
    branches, each showing the only entry a load may show (``Response.stored``) and each
    writing the prefix's KV to the store; plus, where the endpoint's own prefill missed and
    the store may hold the entry of its lineage, version and format, a hit loaded from it.
    A load is judged by STO-001 when the store may also hold an entry of the prefix that a
    key without those fields would have matched."""
    ep = s.endpoint(a.endpoint)
    key = store_key(ep, a.prefix)
    risky = any(e.prefix == a.prefix and e != key for e in s.store)
    out: list[Branch] = []
    for s2, o in serve_request(s, a):
        if o.served is None:  # refused: nothing prefilled, nothing stored
            out.append((s2, o))
            continue
        response = evolve(o.observation.response, stored=key)
        shown = seen(o, response=response)
        if risky:
            shown = evolve(shown, because=evolve(shown.because, stored=RuleId.STO_001))
        s3 = evolve(s2, store=s2.store | {key})
        out.append((s3, shown))
        if not o.served.hit and ep.config.radix and key in s.store:
            served = evolve(o.served, hit=True)
            loaded = evolve(seen(shown, response=evolve(response, hit=True)), served=served)
            out.append((evolve(s3, ledger=(*s2.ledger[:-1], served)), loaded))
    return tuple(out)


# ----- prefill/decode deployments (PD-001, FC-005) ------------------------------------------
#
# An endpoint with ``Config.role`` is one side of a prefill/decode deployment. Requests are
# sent to a DECODE endpoint: the deployment's PREFILL endpoint (``State.prefill_index``)
# computes the prompt's KV (hit or miss on its own radix cache, under its own weights) and
# transfers it; the decode endpoint decodes under its own weights. Each side is updated,
# flushed, paused and continued by its own calls, so the two may be at two versions: a
# request is then refused, and a live request whose transferred KV is of another version
# than the decode side's is aborted (PD-001). A request admitted with StartRequest is a
# live transfer until it finishes: the prefill side holds its KV as well, so a flush there,
# asked or inside an update, is refused while it lives (FC-005). Only ``PREFILL_ACTIONS``
# and ``DECODE_ACTIONS`` are enabled on such endpoints, with no namespace, LoRA or clearing
# pause; a decode endpoint admits only while the prefill endpoint's phase admits requests.

PREFILL_ACTIONS: frozenset[type[Action]] = frozenset(
    {FlushCache, UpdateWeights, PauseGeneration, ContinueGeneration}
)
"""The actions enabled on a prefill endpoint (it takes no request of its own)."""

DECODE_ACTIONS: frozenset[type[Action]] = PREFILL_ACTIONS | {
    ServeRequest,
    StartRequest,
    FinishRequest,
}
"""The actions enabled on a decode endpoint (a client's SyncWeights drives the first four)."""


def _on_role(s: State, ep: Endpoint, a: Action) -> bool:
    """``a`` is modelled on ``ep``, one side of a prefill/decode deployment: one of its
    role's actions, plain (no namespace, LoRA or clearing pause), and a request only while
    the deployment's prefill endpoint admits requests."""
    allowed = DECODE_ACTIONS if ep.config.role is Role.DECODE else PREFILL_ACTIONS
    plain = getattr(a, "namespace", None) is None and not getattr(a, "clear_cache", False)
    if type(a) not in allowed or not plain or getattr(a, "lora", False):
        return False
    if type(a) in (ServeRequest, StartRequest):
        p = s.prefill_index()
        return p is not None and lifecycle.allows(s.endpoint(p).phase, "ServeRequest")
    return True


def transfers(s: State) -> tuple[Request, ...]:
    """The live KV transfers of the deployment: every request a decode endpoint admitted
    that still holds its transferred KV (running or paused in place); the prefill endpoint
    holds that KV too until the request ends."""
    return tuple(
        r for ep in s.endpoints if ep.config.role is Role.DECODE for r in ep.requests if r.holds_kv
    )


def _kv_version_differs(uses: frozenset[Use], version: int) -> bool:
    """Some target KV in ``uses`` was computed under another version than ``version``."""
    return any(u.component == "target" and u.version != version for u in uses)


def pd_request(s: State, a: ServeRequest | StartRequest) -> Branches:
    """A request on a decode endpoint. PD-001: refused while the prefill and decode
    endpoints are at two versions (the prefill side may or may not have run first: a
    handshake that checks the transferred KV's version refuses after it, a deployment that
    holds admission refuses before); refused while either is closed. Otherwise each of the
    prefill endpoint's prefills (a hit or a miss on its own cache, judged as any prefill),
    transferred: a whole request is decoded and answered; an admitted one stays live on the
    decode endpoint, holding the transferred KV (a live transfer)."""
    d = s.endpoint(a.endpoint)
    pi = s.prefill_index()
    p = s.endpoint(pi)  # type: ignore[arg-type]
    for side in (d, p):
        if side.closed:
            return ((s, rejected(d, closed_rule(side))),)
    if p.live != d.live:
        refused = rejected(d, RuleId.PD_001)
        after = [s] + [s.with_endpoint(pi, pf.ep) for pf in prefills(p, a.prefix, False, None)]  # type: ignore[arg-type]
        return tuple((s2, refused) for s2 in dict.fromkeys(after))
    out: list[Branch] = []
    for pf in prefills(p, a.prefix, False, None):
        s2 = s.with_endpoint(pi, pf.ep)  # type: ignore[arg-type]
        if isinstance(a, StartRequest):
            req = Request(a.rid, a.prefix, False, frozenset({d.live}), pf.uses)
            d2 = evolve(d, requests=(*d.requests, req))
            outcome = evolve(ok(d2), dropped=pf.dropped, forward=True)
            out.append((s2.with_endpoint(a.endpoint, d2), outcome))
            continue
        # the prefill side's KV, judged as its own (its waiver, its lane), decoded here
        served = evolve(_served(s, pi, a, pf, {d.live}), endpoint=a.endpoint)  # type: ignore[arg-type]
        response = Response(hit=served.hit, uses=served.uses, sampled=served.sampled)
        outcome = ok(d, hit=RuleId.INV_001, sampled=RuleId.PD_001)
        outcome = evolve(seen(outcome, response=response), served=served, dropped=pf.dropped)
        out.append((evolve(s2, ledger=(*s.ledger, served)), outcome))
    # A hit on the prefill side's KV of older weights (an opt-out update left it there,
    # INV-001's waiver) is KV of another version: a handshake on the transferred KV's
    # version may refuse it (PD-001), as refusing is always safe.
    for pf in prefills(p, a.prefix, False, None):
        if _kv_version_differs(pf.uses, d.live):
            out.append((s.with_endpoint(pi, pf.ep), rejected(d, RuleId.PD_001)))  # type: ignore[arg-type]
    return tuple(out)


def pd_finish(s: State, a: FinishRequest) -> Branches:
    """A live request on a decode endpoint finishes: as a single scheduler's, except that
    one whose transferred KV is of another version than the decode endpoint's weights (an
    update landed on the decode side while the transfer was live) is aborted (PD-001)."""
    d = s.endpoint(a.endpoint)
    req = d.request(a.rid)
    if d.closed or not req.holds_kv or not _kv_version_differs(req.uses, d.live):
        return finish_request(s, a)
    d2 = evolve(d, requests=tuple(r for r in d.requests if r.rid != a.rid))
    aborted = seen(rejected(d2, RuleId.PD_001, aborted=RuleId.PD_001), aborted=frozenset({a.rid}))
    return ((s.with_endpoint(a.endpoint, d2), aborted),)


def _holding_transfers(s: State, a: FlushCache | UpdateWeights, effect: Effect) -> Branches:
    """``effect`` on the prefill endpoint as if the live transfers were its own in-flight
    requests (they hold its KV: a flush must wait for them, FC-005's idle gate), then
    without them again."""
    i = a.endpoint
    held = transfers(s)
    p = s.endpoint(i)
    out = []
    for s2, o in effect(s.with_endpoint(i, evolve(p, requests=held)), a):
        e = evolve(s2.endpoint(i), requests=())
        out.append((s2.with_endpoint(i, e), o))
    return tuple(out)


def pd_flush(s: State, a: FlushCache) -> Branches:
    """FC-005: a flush of the prefill endpoint is refused while a transfer is live (an
    injected refusal stays FC-003's); otherwise any single scheduler's flush."""
    if s.endpoint(a.endpoint).refuse_flush or not transfers(s):
        return flush_cache(s, a)
    return _holding_transfers(s, a, flush_cache)  # type: ignore[arg-type]


def pd_update(s: State, a: UpdateWeights) -> Branches:
    """An update of the prefill endpoint: a single scheduler's, with the live transfers
    holding its KV, so an update whose flush is required fails while one lives (FC-001's
    branches, the refusal owed to FC-005's idle gate: its flush would free a transfer's
    KV)."""
    if s.endpoint(a.endpoint).refuse_flush or not transfers(s):
        return update_weights(s, a)
    return _holding_transfers(s, a, update_weights)  # type: ignore[arg-type]


def _pd_effect(s: State, a: Action) -> Effect | None:
    """The P/D effect of ``a`` on its endpoint, ``None`` where a single scheduler's holds."""
    role = s.endpoint(a.endpoint).config.role  # type: ignore[attr-defined]
    if role is Role.DECODE:
        return {ServeRequest: pd_request, StartRequest: pd_request, FinishRequest: pd_finish}.get(  # type: ignore[return-value]
            type(a)
        )
    return {FlushCache: pd_flush, UpdateWeights: pd_update}.get(type(a))  # type: ignore[return-value]


# ----- workers behind a router (RTR-001) ---------------------------------------------------
#
# An endpoint with ``Config.router`` is a worker behind the deployment's router. The router
# sends requests only to workers in its rotation (``Endpoint.rotation``): a request on a
# worker out of rotation is not enabled (the router routes it elsewhere), while requests it
# already admitted run on. The router fans each control call (pause, update, flush,
# continue) out to the worker as the worker's own call, judged as a single scheduler's; the
# merge of several workers' replies to one fan-out is RNK-001's (a ranked endpoint is the
# same merge). ``LeaveRotation`` takes a worker out; ``EnterRotation`` puts it back only
# once its sync settled (``settled``), else the router refuses. An update of a worker in
# rotation that is serving either drains it first (it leaves the rotation, then updates) or
# is refused; a paused worker (the whole rotation paused for the sync) may be updated in
# place, staying in rotation, or drained first. Only ``ROUTER_ACTIONS`` are enabled on a
# worker, with no namespace, LoRA or clearing pause.

ROUTER_ACTIONS: frozenset[type[Action]] = SCHEDULER_CALLS | {LeaveRotation, EnterRotation}
"""The actions enabled on a worker behind a router."""


def _on_router(ep: Endpoint, a: Action) -> bool:
    """``a`` is modelled on ``ep``, a worker behind a router: one of ``ROUTER_ACTIONS``,
    plain (no namespace, LoRA or clearing pause), and a request only while ``ep`` is in
    the rotation."""
    plain = getattr(a, "namespace", None) is None and not getattr(a, "clear_cache", False)
    if type(a) not in ROUTER_ACTIONS or not plain or getattr(a, "lora", False):
        return False
    return ep.rotation or type(a) not in (ServeRequest, StartRequest)


def deployment_version(s: State) -> int:
    """The newest whole weight version among the workers behind the router: what a sync
    moved the deployment to so far (0 when there is no worker)."""
    return max((ep.weights for ep in s.endpoints if ep.config.router), default=0)


def settled(s: State, index: int) -> bool:
    """RTR-001: worker ``index``'s sync settled, so the router may put it back: it serves
    (continued, not paused), is not closed and has no open or torn update, holds the
    deployment's newest weights (``deployment_version``), and its tree holds no KV of
    other weights (the update's flush ran)."""
    ep = s.endpoint(index)
    return (
        ep.phase is Phase.SERVING
        and not ep.closed
        and not ep.torn
        and ep.update is None
        and ep.weights == deployment_version(s)
        and all(e.version == ep.weights for e in ep.cache if e.kind is Kind.TARGET)
    )


def _in_rotation(s: State, a: LeaveRotation) -> bool:
    ep = s.endpoint(a.endpoint)
    return ep.config.router and ep.rotation


def _out_of_rotation(s: State, a: EnterRotation) -> bool:
    ep = s.endpoint(a.endpoint)
    return ep.config.router and not ep.rotation


@action(LeaveRotation, when=_in_rotation)
def leave_rotation(s: State, a: LeaveRotation) -> Branches:
    """The router takes the worker out of its rotation: no more traffic reaches it; the
    requests it admitted run on."""
    ep = evolve(s.endpoint(a.endpoint), rotation=False)
    return ((s.with_endpoint(a.endpoint, ep), ok(ep, RuleId.RTR_001)),)


@action(EnterRotation, when=_out_of_rotation)
def enter_rotation(s: State, a: EnterRotation) -> Branches:
    """RTR-001: the router puts the worker back only once its sync settled (``settled``);
    before that it refuses, and the worker stays out."""
    ep = s.endpoint(a.endpoint)
    if not settled(s, a.endpoint):
        return ((s, rejected(ep, RuleId.RTR_001)),)
    ep2 = evolve(ep, rotation=True)
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2, RuleId.RTR_001)),)


def routed_update(s: State, a: UpdateWeights) -> Branches:
    """RTR-001: an update of a worker in rotation. Serving: refused, or the router drains
    the worker first (it leaves the rotation, then updates as a single scheduler). Paused
    (no traffic is admitted): in place, staying in rotation, or drained first. Out of
    rotation: a single scheduler's update."""
    i = a.endpoint
    ep = s.endpoint(i)
    if not ep.rotation:
        return update_weights(s, a)
    drained = update_weights(s.with_endpoint(i, evolve(ep, rotation=False)), a)
    if ep.phase is Phase.SERVING:
        return ((s, rejected(ep, RuleId.RTR_001)), *drained)
    return (*update_weights(s, a), *drained)


# ----- the next-state relation ------------------------------------------------------------


def modelled(ep: Endpoint, a: Action) -> bool:
    """Whether the deployment ``ep`` belongs to models ``a``'s type at all, whatever the
    phase or guard: a ranked endpoint only ``RANKED_ACTIONS``, one attached to the shared
    store only ``STORE_ACTIONS``, one side of a prefill/decode pair only its role's
    actions, a worker behind a router only ``ROUTER_ACTIONS``. A call outside them (a
    two-phase update on a store endpoint) is beyond the spec's bounds there: the spec
    neither allows nor forbids it."""
    kind = type(a)
    if ep.ranks and kind not in RANKED_ACTIONS:
        return False
    if ep.config.store and kind not in STORE_ACTIONS:
        return False
    if ep.config.role is not None:
        allowed = DECODE_ACTIONS if ep.config.role is Role.DECODE else PREFILL_ACTIONS
        if kind not in allowed:
            return False
    return not (ep.config.router and kind not in ROUTER_ACTIONS)


def enabled(state: State, action: Action, bounds: Bounds | None = None) -> bool:
    """``action`` may be taken in ``state``: its endpoint exists, the phase table allows
    it, and its guard holds (and it lies ``within`` ``bounds``, when given). Cheap: no
    effect is computed."""
    kind = type(action)
    index = getattr(action, "endpoint", None)
    if index is not None:
        endpoints = state.endpoints
        if not 0 <= index < len(endpoints):
            return False
        ep = endpoints[index]
        if not lifecycle.allows(ep.phase, kind.__name__):
            return False
        if not _placed(ep, action):
            return False
        config = ep.config
        if config.role and not _on_role(state, ep, action):
            return False
        if config.router and not _on_router(ep, action):
            return False
    if bounds is not None and not within(state, action, bounds):
        return False
    return bool(SPEC[kind][0](state, action))


def step(state: State, action: Action) -> Branches:
    """Every allowed ``(next_state, outcome)``; empty when ``action`` is not enabled."""
    if not enabled(state, action):
        return ()
    index = getattr(action, "endpoint", None)
    if index is not None and state.endpoint(index).ranks and type(action) in RANKED:
        return RANKED[type(action)](state, action)
    if index is not None and state.endpoint(index).config.store and type(action) is ServeRequest:
        return stored_request(state, action)  # type: ignore[arg-type]
    if index is not None and state.endpoint(index).config.role:
        pd = _pd_effect(state, action)
        if pd is not None:
            return pd(state, action)
    if index is not None and state.endpoint(index).config.router and type(action) is UpdateWeights:
        return routed_update(state, action)  # type: ignore[arg-type]
    _, effect = SPEC[type(action)]
    return effect(state, action)


@lru_cache(maxsize=1 << 14)
def memo_step(state: State, action: Action) -> Branches:
    """``step(state, action)``, memoized (the model is pure): for callers where the same
    state and action recur, the lockstep checker (across the examples of a stateful run, its
    shrinking and replays) and the REACH-003 monitor (which looks at an update's branches
    before the checker steps it)."""
    return step(state, action)


def within(state: State, action: Action, bounds: Bounds) -> bool:
    """``action`` stays inside the search ``bounds``: the one place bounds are applied."""
    version = getattr(action, "version", None)
    if version is not None and version > bounds.versions:
        return False
    if getattr(action, "funnel", None) not in (None, *bounds.funnels):
        return False
    if isinstance(action, LoadLora):
        return state.endpoint(action.endpoint).lora < bounds.lora_revisions
    return bounds.namespaces or getattr(action, "namespace", None) is None
