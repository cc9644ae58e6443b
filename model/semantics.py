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
from functools import cache

from . import lifecycle
from .actions import (
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
    FlushEncoderCache,
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
    invalidated,
    load,
    prefills,
    window_dropped,
)
from .client import Plan, resolve_plan
from .fast import evolve
from .observation import Blame, Observation, Outcome, Response, View
from .state import Bounds, Endpoint, Entry, OpenUpdate, Policy, Request, Served, ServerInfo, State
from .vocabulary import MIXED, Kind, MemoryTag, PauseMode, Phase, Status, Tier

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


def ok(ep: Endpoint, status: str = "LIV-002", **blame: str) -> Outcome:
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
        return ((s, rejected(ep, "FC-002")),)
    out = list(_window_refusal(s, ep, mixed=True))
    for p in prefills(ep, a.prefix, a.lora, a.namespace):
        served = _served(s, a.endpoint, a, p, {ep.live})
        response = Response(hit=served.hit, uses=served.uses, sampled=served.sampled)
        s2 = evolve(s.with_endpoint(a.endpoint, p.ep), ledger=(*s.ledger, served))
        outcome = ok(p.ep, cache=cache_rule(p.reused), hit="INV-001", **_window_blame(ep))
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
        return ((s, rejected(ep, "WIN-001", cache="WIN-002")),)
    if not mixed and ep.update is not None and ep.live == ep.weights:
        return ((s, rejected(ep, "WIN-001")),)
    return ()


def _window_blame(ep: Endpoint) -> dict[str, str]:
    """Who answers for a response's probe, attribution and restart-oracle bytes: inside a
    window with mixed weights, WIN-001 (never labelled with the new version); the restart
    oracle otherwise names DER-001 where derived state could explain the difference, else
    INV-003 (the claimed version is not what computes)."""
    if ep.live != ep.weights:
        return {"weights": "WIN-001", "label": "WIN-001", "sampled": "WIN-001"}
    if ep.update is not None and ep.update.landed:
        # Inside a window that received chunks, on whole (old) weights: output that differs
        # from an engine freshly started at the claimed version means a chunk reached the
        # live parameters while the probe claims them whole (WIN-001), or a failed chunk
        # was not rolled back (WIN-003).
        return {"fresh": "WIN-003" if ep.update.failed else "WIN-001"}
    return {"fresh": "DER-001" if ep.config.derived else "INV-003"}


@action(StartRequest, when=_rid_free)
def start_request(s: State, a: StartRequest) -> Branches:
    """Admit a request: its prefill runs (hit or miss) and it stays in flight holding KV."""
    ep = s.endpoint(a.endpoint)
    if ep.closed:
        return ((s, rejected(ep, "FC-002")),)
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
    aborted = seen(rejected(ep2, "FC-002", aborted="FC-002"), aborted=frozenset({a.rid}))
    if ep.closed:
        return ((s.with_endpoint(a.endpoint, ep2), aborted),)
    # WIN-001: inside a window the request may be aborted instead (first once the weights
    # are mixed; after the serving branch while no chunk has landed, see _window_refusal).
    refused = (
        [
            (
                s.with_endpoint(a.endpoint, ep2),
                evolve(
                    aborted, because=evolve(aborted.because, status="WIN-001", aborted="WIN-001")
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
    blame = {"sampled": "INV-002", **_window_blame(ep)}
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


def _install(
    s: State, index: int, ep: Endpoint, version: int, flush_cache: bool | None
) -> Branches:
    """A completed update of endpoint ``index`` (now ``ep``) to ``version``: the body of
    UpdateWeights, also what FinishWeightUpdate publishes (after a finish, the prefix cache
    obligations are those of a one-shot update)."""
    guarded = ep.config.guarded
    must_flush = guarded or asked_to_flush(ep, flush_cache)
    # With the radix cache off there is nothing to flush, and an engine keying every prefix
    # by version invalidates by namespace: such an update needs no flush, so none can be
    # refused (CD-06, CD-03); it may still try one and honestly report the refusal.
    needless = must_flush and (ep.config.versioned_keys or not ep.config.radix)
    s = evolve(s, trainer=max(s.trainer, version))
    asleep = ep.kv_released  # the colocated order: KV released, weights resident
    # With the KV released the flush is judged as any update's (ENG-001/002, ENG-003 for
    # a tier it left): the released device pool is no reason to skip it.
    flush_rule = "ENG-001" if guarded else "ENG-002"
    blame = {
        "cache": flush_rule if must_flush else "ENG-012",
        "weights": "ENG-001" if guarded else "INV-003",
        "draft": "ENG-004",
        "scales": "ENG-005",
        "label": "INV-003",
        "derived": "DER-001",
    }
    loaded = load(ep, version)
    if not ep.config.encoder_reset_separate:
        loaded = derived_dropped(loaded)  # else the client resets it (CLI-009)
    flushed = encoder_kept(loaded, invalidated(loaded, version))
    if not ep.config.radix:
        # No prefix cache: only in-flight requests' own KV can cross the update, and no
        # flush protects it (a pause does, the client's CLI-007); INV-001 waives it.
        flushed = evolve(flushed, waived=not ep.config.misreports)
    done = evolve(ok(flushed, "MEM-001" if asleep else "LIV-001", **blame), flushed_from=ep.cache)
    if must_flush and (ep.kv_held or ep.refuse_flush):
        claimed = done
        kept = evolve(ep, refuse_flush=False)
        closed = evolve(loaded, dirty=True, refuse_flush=False)
        fail = {"weights": "FC-001", "label": "INV-003"}
        branches = [
            (kept, evolve(rejected(kept, "FC-001", **fail), completion=claimed)),
            (closed, evolve(rejected(closed, "FC-001", **fail), completion=claimed)),
        ]
        if guarded:  # an injected refusal is FC-001's, asleep or not (CD-07 may stop)
            branches += [(stop(ep), stopped(claimed)), (stop(loaded), stopped(claimed))]
            branches.append(aborted_then_flushed(ep, version, blame))
        if needless:
            branches.append((flushed, done))
        return tuple((s.with_endpoint(index, e), o) for e, o in branches)
    if must_flush and asleep:
        # MEM-001: with the KV released the flush succeeds (nothing on device to remove,
        # the index and lower tiers emptied) or the whole update is refused cleanly.
        refused = evolve(
            rejected(ep, "MEM-001", weights="MEM-001", label="INV-003"), completion=done
        )
        return ((s.with_endpoint(index, flushed), done), (s, refused))
    if not must_flush and (ep.kv_held or ep.refuse_flush):
        # An engine that flushes on every update whatever was asked (ENG-011 allows the
        # extra flush) cannot run that flush now: it may reject the update cleanly, as
        # FC-001 describes, instead of breaking its own rule or the caller's opt-out.
        kept = evolve(ep, refuse_flush=False)
        closed = evolve(loaded, dirty=True, refuse_flush=False)
        fail = {"weights": "FC-001", "label": "INV-003"}
        note = "availability: the engine rejected an update it flushes for though not asked"
        extra = tuple(
            (s.with_endpoint(index, e), evolve(rejected(e, "LIV-002", **fail), note=note))
            for e in (kept, closed)
        )
    else:
        extra = ()
    if not must_flush:
        # INV-001's waiver: only where the spec's own client would skip the flush too, and
        # never for an engine declared to misreport its radix cache.
        skipped = not plan_for(s, index).flush or not ep.config.radix
        waived = skipped and not ep.config.misreports
        loaded = evolve(loaded, waived=waived)
        return ((s.with_endpoint(index, loaded), ok(loaded, **blame)), *extra)
    return ((s.with_endpoint(index, flushed), done),)


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
    outcome = evolve(ok(flushed, "FC-001", aborted="ENG-009", **blame), flushed_from=ep.cache)
    outcome = evolve(seen(outcome, aborted=holders), note=note if holders else "")
    return flushed, evolve(outcome, shows_aborts=bool(holders))


def stop(ep: Endpoint) -> Endpoint:
    """The engine process exited: no cache, no requests, nothing served until Restart."""
    phase = lifecycle.next_phase(ep.phase, "EngineStops")
    return evolve(
        ep,
        phase=phase,
        cache=frozenset(),
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
        Observation(Status.STOPPED), because=Blame(status="FC-001"), completion=claimed, note=note
    )


@action(FaultUpdateFailsMidway, when=_newer_version)
def fault_update_fails_midway(s: State, a: FaultUpdateFailsMidway) -> Branches:
    """FC-004: rolled back (consistent) or torn and closed; either way, failure."""
    ep = s.endpoint(a.endpoint)
    s = evolve(s, trainer=max(s.trainer, a.version))
    torn = evolve(ep, torn=True, label=None)
    blame = {"weights": "FC-004", "label": "INV-003"}
    return (
        (s, rejected(ep, "FC-004", **blame)),
        (s.with_endpoint(a.endpoint, torn), rejected(torn, "FC-004", **blame)),
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
        return ((s, rejected(ep, "WIN-003")),)
    if ep.fail_chunk:
        failed = evolve(ep.update, failed=True)
        back = evolve(_rolled_back(ep), update=failed)
        closed = evolve(ep, torn=True, label=None, fail_chunk=False, update=failed)
        blame = {"weights": "WIN-003", "label": "WIN-003", **_mixed_kv_blame(ep)}
        return tuple(
            (s.with_endpoint(a.endpoint, e), rejected(e, "WIN-003", **blame))
            for e in (back, closed)
        )
    ep2 = evolve(ep, torn=True, label=None, update=evolve(ep.update, landed=True))
    landed = (s.with_endpoint(a.endpoint, ep2), ok(ep2, weights="WIN-001", label="WIN-001"))
    # Or the chunk is staged aside (a buffer the forward never reads) and swapped in whole
    # at the finish: the live weights stay the old version, whole and labelled as before.
    staged_ep = evolve(ep, update=evolve(ep.update, landed=True))
    staged = (
        s.with_endpoint(a.endpoint, staged_ep),
        ok(staged_ep, weights="WIN-001", label="WIN-001"),
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
        blame = {"weights": "WIN-003", "label": "WIN-003", "derived": "WIN-003"}
        return ((s.with_endpoint(a.endpoint, shut), rejected(shut, "WIN-003", **blame)),)
    branches = _install(s, a.endpoint, shut, ep.update.version, a.flush_cache)
    if not _mixed_kv_blame(ep):
        return branches
    mixed = frozenset(e for e in ep.cache if e.version == MIXED)
    return tuple((s2, _window_cache_blame(o, mixed)) for s2, o in branches)


def _mixed_kv_blame(ep: Endpoint) -> dict[str, str]:
    """WIN-002 answers for the cache listing only where there was KV of mixed weights to
    drop (a listing that could not have shown it kept is no evidence)."""
    return {"cache": "WIN-002"} if any(e.version == MIXED for e in ep.cache) else {}


def _window_cache_blame(o: Outcome, mixed: frozenset[Entry]) -> Outcome:
    """A finish that keeps KV of the mixed weights breaks WIN-002, whether or not a flush
    was also due (then it broke that flush's rule too; WIN-002 is the one it cannot be
    waived from)."""
    if o.because.cache is None:
        return o
    before = mixed | (o.flushed_from or frozenset())
    return evolve(o, because=evolve(o.because, cache="WIN-002"), flushed_from=before)


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
    blame = {"weights": "WIN-003", "label": "WIN-003", **_mixed_kv_blame(ep)}
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
    """LIV-001: refused only while KV is held or a refusal is injected. FC-003: the
    reported result is the truth (a flush that removed nothing yet reports success is
    FC-003's; one that removed some entries but not all, ENG-003's). A flush on torn
    weights still leaves the endpoint closed."""
    ep = s.endpoint(a.endpoint)
    if ep.kv_held or ep.refuse_flush:
        ep2 = evolve(ep, refuse_flush=False)
        outcome = seen(rejected(ep2, "FC-003", flushed="FC-003"), flushed=False)
        return ((s.with_endpoint(a.endpoint, ep2), outcome),)
    ep2 = encoder_kept(ep, emptied(ep))
    # MEM-001: with the KV released there is nothing on device to remove; the flush empties
    # the index (and lower tiers) and answers, it never touches the released pools.
    status = "MEM-001" if ep.kv_released else "LIV-001"
    outcome = seen(ok(ep2, status, flushed=status, cache="FC-003"), flushed=True)
    done = (s.with_endpoint(a.endpoint, ep2), evolve(outcome, flushed_from=ep.cache))
    if ep.kv_released:  # or refused cleanly, changing nothing (MEM-001)
        refused = seen(rejected(ep, "MEM-001", flushed="FC-003"), flushed=False)
        return (done, (s, refused))
    return (done,)


@action(FlushEncoderCache, when=_always)
def flush_encoder_cache(s: State, a: FlushEncoderCache) -> Branches:
    """vLLM ``reset_encoder_cache``: every cached encoder output is dropped; it holds no
    request's KV, so it is never refused (CLI-009 is the client's obligation to call it)."""
    ep = s.endpoint(a.endpoint)
    ep2 = evolve(ep, cache=frozenset(e for e in ep.cache if e.kind is not Kind.ENCODER))
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2, cache="ENG-012")),)


@action(EvictPrefix, when=_lower_tier_holds)
def evict_prefix(s: State, a: EvictPrefix) -> Branches:
    """Hierarchical cache: a prefix's target and draft KV move down a tier together."""
    ep = s.endpoint(a.endpoint)
    moving = evictable(ep, a.prefix)
    ep2 = evolve(ep, cache=(ep.cache - moving) | {evolve(e, tier=a.tier) for e in moving})
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2, cache="ENG-008")),)


@action(LoadLora, when=_lora_idle)
def load_lora(s: State, a: LoadLora) -> Branches:
    """ENG-007: the old revision's KV becomes unreachable (here: dropped)."""
    ep = s.endpoint(a.endpoint)
    cache_ = frozenset(e for e in ep.cache if e.lora is None)
    ep2 = evolve(ep, lora=ep.lora + 1, cache=cache_)
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2, cache="ENG-007")),)


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
    outcome = seen(ok(ep2, aborted="ENG-009"), aborted=aborted)
    if not a.clear_cache:
        return ((s.with_endpoint(a.endpoint, ep2), outcome),)
    if ep2.refuse_flush:
        ep3 = evolve(ep2, refuse_flush=False)
        refused = rejected(ep3, "FC-003", flushed="FC-003", aborted="ENG-009")
        return ((s.with_endpoint(a.endpoint, ep3), seen(refused, flushed=False, aborted=aborted)),)
    ep3 = evolve(encoder_kept(ep2, emptied(ep2)), cleared=True)  # as FlushCache
    done = ok(ep3, "LIV-001", flushed="LIV-001", cache="FC-003", aborted="ENG-009")
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
            evolve(ok(e, cache="ENG-009"), dropped=d, forward=recomputes),
        )
        for e, d in frontier
    )


@action(Sleep, when=_releases_more)
def sleep(s: State, a: Sleep) -> Branches:
    """Release the memory of ``a.tags``. ENG-006: released device KV memory is discarded,
    and its index entries with it (lower tiers live in host memory and stay); released
    weights are kept aside and come back unchanged."""
    ep = s.endpoint(a.endpoint)
    cache_ = ep.cache
    if MemoryTag.KV_CACHE in a.tags:
        cache_ = frozenset(e for e in ep.cache if e.tier is not Tier.DEVICE)
    phase = lifecycle.next_phase(ep.phase, a.name)
    ep2 = evolve(ep, phase=phase, cache=cache_, released=ep.released | a.tags)
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2, cache="ENG-006")),)


@action(WakeUp, when=_resumes_some)
def wake_up(s: State, a: WakeUp) -> Branches:
    """Resume the released memory of ``a.tags``; the endpoint serves again once nothing is
    released. MEM-002: resumed KV memory holds no reusable KV, so no index entry comes back
    with it (an index stashed at release and restored here points at garbage)."""
    ep = s.endpoint(a.endpoint)
    left = ep.released - a.tags
    phase = lifecycle.next_phase(ep.phase, "WakeUp" if not left else "WakeUpPartly")
    ep2 = evolve(ep, phase=phase, released=left)
    rule = "MEM-002" if MemoryTag.KV_CACHE in (a.tags & ep.released) else "ENG-006"
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
    out = seen(ok(ep2, label="PUB-001", aborted="PUB-002"), aborted=aborted)
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
    out = seen(rejected(ep2, "PUB-001", label="PUB-001", aborted="PUB-002"), aborted=aborted)
    return (s.with_endpoint(index, ep2), evolve(out, at_risk=at_risk))


@action(Restart, when=_always)
def restart(s: State, a: Restart) -> Branches:
    """ENG-010: cold start from the last whole checkpoint (also after a stop)."""
    ep = s.endpoint(a.endpoint)
    ep2 = load(evolve(ep, phase=lifecycle.next_phase(ep.phase, a.name), pause=None), ep.weights)
    ep2 = evolve(
        ep2,
        cache=frozenset(),
        requests=(),
        dirty=False,
        waived=False,
        refuse_flush=False,
        released=frozenset(),
        cleared=False,
        update=None,  # an open window dies with the process
        fail_chunk=False,
    )
    done = ok(ep2, cache="ENG-010", weights="ENG-010", derived="DER-001")
    return ((s.with_endpoint(a.endpoint, ep2), done),)


# ----- the next-state relation ------------------------------------------------------------


def enabled(state: State, action: Action, bounds: Bounds | None = None) -> bool:
    """``action`` may be taken in ``state``: its endpoint exists, the phase table allows
    it, and its guard holds (and it lies ``within`` ``bounds``, when given). Cheap: no
    effect is computed."""
    index = getattr(action, "endpoint", None)
    if index is not None:
        if not 0 <= index < len(state.endpoints):
            return False
        if not lifecycle.allows(state.endpoint(index).phase, action.name):
            return False
    if bounds is not None and not within(state, action, bounds):
        return False
    guard, _ = SPEC[type(action)]
    return bool(guard(state, action))


def step(state: State, action: Action) -> Branches:
    """Every allowed ``(next_state, outcome)``; empty when ``action`` is not enabled."""
    if not enabled(state, action):
        return ()
    _, effect = SPEC[type(action)]
    return effect(state, action)


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
