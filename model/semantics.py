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

from attrs import evolve

from . import lifecycle
from .actions import (
    Action,
    ContinueGeneration,
    EvictPrefix,
    FaultRefuseFlush,
    FaultUpdateFailsMidway,
    FinishRequest,
    FlushCache,
    FlushEncoderCache,
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
)
from .client import Plan, resolve_plan
from .observation import Blame, Observation, Outcome, Response, View
from .state import Bounds, Endpoint, Policy, Request, Served, ServerInfo, State
from .vocabulary import Kind, PauseMode, Phase, Status, Tier

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
        weights=ep.weights,
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
    """A version the trainer has (or is about to have) that this endpoint lacks."""
    return a.version in (s.trainer, s.trainer + 1) and s.endpoint(a.endpoint).weights < a.version


def _next_sync(s: State, a: SyncWeights) -> bool:
    return a.version == s.trainer + 1 and all(ep.phase is Phase.SERVING for ep in s.endpoints)


def _lower_tier_holds(s: State, a: EvictPrefix) -> bool:
    ep = s.endpoint(a.endpoint)
    tier_ok = a.tier is not Tier.DEVICE and a.tier in ep.config.tiers
    return tier_ok and bool(evictable(ep, a.prefix))


def _lora_idle(s: State, a: LoadLora) -> bool:
    ep = s.endpoint(a.endpoint)
    return ep.config.lora and not any(r.lora and r.holds_kv for r in ep.requests)


def _no_fault_pending(s: State, a: FaultRefuseFlush) -> bool:
    return not s.endpoint(a.endpoint).refuse_flush


def _no_requests(s: State, a: Sleep) -> bool:
    return not s.endpoint(a.endpoint).requests


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
    out = []
    for p in prefills(ep, a.prefix, a.lora, a.namespace):
        served = _served(s, a.endpoint, a, p, {ep.weights})
        response = Response(hit=served.hit, uses=served.uses, sampled=served.sampled)
        s2 = evolve(s.with_endpoint(a.endpoint, p.ep), ledger=(*s.ledger, served))
        outcome = ok(p.ep, cache=cache_rule(p.reused), hit="INV-001")
        outcome = evolve(seen(outcome, response=response), served=served, dropped=p.dropped)
        out.append((s2, outcome))
    return tuple(out)


@action(StartRequest, when=_rid_free)
def start_request(s: State, a: StartRequest) -> Branches:
    """Admit a request: its prefill runs (hit or miss) and it stays in flight holding KV."""
    ep = s.endpoint(a.endpoint)
    if ep.closed:
        return ((s, rejected(ep, "FC-002")),)
    out = []
    for p in prefills(ep, a.prefix, a.lora, a.namespace):
        req = Request(a.rid, a.prefix, a.lora, frozenset({ep.weights}), p.uses, a.namespace)
        ep2 = evolve(p.ep, requests=(*p.ep.requests, req))
        outcome = evolve(ok(ep2, cache=cache_rule(p.reused)), dropped=p.dropped)
        out.append((s.with_endpoint(a.endpoint, ep2), outcome))
    return tuple(out)


@action(FinishRequest, when=_in_flight)
def finish_request(s: State, a: FinishRequest) -> Branches:
    """The request decodes to its end under the weights now in force. Closed: aborted."""
    ep = s.endpoint(a.endpoint)
    req = ep.request(a.rid)
    ep2 = evolve(ep, requests=tuple(r for r in ep.requests if r.rid != a.rid))
    if ep.closed:
        outcome = seen(rejected(ep2, "FC-002", aborted="FC-002"), aborted=frozenset({a.rid}))
        return ((s.with_endpoint(a.endpoint, ep2), outcome),)
    served = Served(
        endpoint=a.endpoint,
        prefix=req.prefix,
        weights=ep.weights,
        uses=req.uses | ep.current(req.lora),
        current=ep.current(req.lora),
        sampled=req.sampled | {ep.weights},
        hit=False,
        exact=ep.config.guarded,
        waived=ep.waived,
        rid=a.rid,
        pinned=_pinned(ep, req.namespace),
        off_policy=_pinned(ep, req.namespace) and s.policy.off_policy_sessions,
    )
    response = Response(hit=False, uses=served.uses, sampled=served.sampled)
    s2 = evolve(s.with_endpoint(a.endpoint, ep2), ledger=(*s.ledger, served))
    outcome = evolve(seen(ok(ep2, sampled="INV-002"), response=response), served=served)
    return ((s2, outcome),)


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
    ep = s.endpoint(a.endpoint)
    guarded = ep.config.guarded
    must_flush = guarded or asked_to_flush(ep, a.flush_cache)
    # With the radix cache off there is nothing to flush, and an engine keying every prefix
    # by version invalidates by namespace: such an update needs no flush, so none can be
    # refused (CD-06, CD-03); it may still try one and honestly report the refusal.
    needless = must_flush and (ep.config.versioned_keys or not ep.config.radix)
    s = evolve(s, trainer=max(s.trainer, a.version))
    blame = {
        "cache": ("ENG-001" if guarded else "ENG-002") if must_flush else "ENG-012",
        "weights": "ENG-001" if guarded else "INV-003",
        "draft": "ENG-004",
        "scales": "ENG-005",
        "label": "INV-003",
    }
    loaded = load(ep, a.version)
    if not ep.config.encoder_reset_separate:
        loaded = derived_dropped(loaded)  # else the client resets it (CLI-009)
    flushed = encoder_kept(loaded, invalidated(loaded, a.version))
    if not ep.config.radix:
        # No prefix cache: only in-flight requests' own KV can cross the update, and no
        # flush protects it (a pause does, the client's CLI-007); INV-001 waives it.
        flushed = evolve(flushed, waived=not ep.config.misreports)
    done = evolve(ok(flushed, "LIV-001", **blame), flushed_from=ep.cache)
    if must_flush and (ep.kv_held or ep.refuse_flush):
        claimed = done
        kept = evolve(ep, refuse_flush=False)
        closed = evolve(loaded, dirty=True, refuse_flush=False)
        fail = {"weights": "FC-001", "label": "INV-003"}
        branches = [
            (kept, evolve(rejected(kept, "FC-001", **fail), completion=claimed)),
            (closed, evolve(rejected(closed, "FC-001", **fail), completion=claimed)),
        ]
        if guarded:
            branches += [(stop(ep), stopped(claimed)), (stop(loaded), stopped(claimed))]
        if needless:
            branches.append((flushed, done))
        return tuple((s.with_endpoint(a.endpoint, e), o) for e, o in branches)
    if not must_flush:
        # INV-001's waiver: only where the spec's own client would skip the flush too, and
        # never for an engine declared to misreport its radix cache.
        skipped = not plan_for(s, a.endpoint).flush or not ep.config.radix
        waived = skipped and not ep.config.misreports
        loaded = evolve(loaded, waived=waived)
        return ((s.with_endpoint(a.endpoint, loaded), ok(loaded, **blame)),)
    return ((s.with_endpoint(a.endpoint, flushed), done),)


def stop(ep: Endpoint) -> Endpoint:
    """The engine process exited: no cache, no requests, nothing served until Restart."""
    phase = lifecycle.next_phase(ep.phase, "EngineStops")
    return evolve(ep, phase=phase, cache=frozenset(), requests=(), pause=None, refuse_flush=False)


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
    outcome = seen(ok(ep2, "LIV-001", flushed="LIV-001", cache="FC-003"), flushed=True)
    return ((s.with_endpoint(a.endpoint, ep2), evolve(outcome, flushed_from=ep.cache)),)


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


@action(PauseGeneration, when=_always)
def pause_generation(s: State, a: PauseGeneration) -> Branches:
    """ENG-009: abort ends requests; retract frees their KV; in_place keeps it."""
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
    return ((s.with_endpoint(a.endpoint, ep2), outcome),)


@action(ContinueGeneration, when=_always)
def continue_generation(s: State, a: ContinueGeneration) -> Branches:
    """Retracted requests recompute their prefix under the weights now in force (each
    recompute may hit or miss, as any prefill)."""
    ep = s.endpoint(a.endpoint)
    ep = evolve(ep, phase=lifecycle.next_phase(ep.phase, a.name), pause=None)
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
        frontier = nxt
    return tuple(
        (s.with_endpoint(a.endpoint, e), evolve(ok(e, cache="ENG-009"), dropped=d))
        for e, d in frontier
    )


@action(Sleep, when=_no_requests)
def sleep(s: State, a: Sleep) -> Branches:
    """ENG-006: device KV memory is discarded, and its index entries with it."""
    ep = s.endpoint(a.endpoint)
    kept = frozenset(e for e in ep.cache if e.tier is not Tier.DEVICE)
    ep2 = evolve(ep, phase=lifecycle.next_phase(ep.phase, a.name), cache=kept)
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2, cache="ENG-006")),)


@action(WakeUp, when=_always)
def wake_up(s: State, a: WakeUp) -> Branches:
    """The endpoint serves again; nothing discarded by Sleep comes back (ENG-006)."""
    ep = s.endpoint(a.endpoint)
    ep2 = evolve(ep, phase=lifecycle.next_phase(ep.phase, a.name))
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2, cache="ENG-006")),)


@action(Restart, when=_always)
def restart(s: State, a: Restart) -> Branches:
    """ENG-010: cold start from the last whole checkpoint (also after a stop)."""
    ep = s.endpoint(a.endpoint)
    ep2 = load(evolve(ep, phase=lifecycle.next_phase(ep.phase, a.name), pause=None), ep.weights)
    ep2 = evolve(ep2, cache=frozenset(), requests=(), dirty=False, waived=False, refuse_flush=False)
    return ((s.with_endpoint(a.endpoint, ep2), ok(ep2, cache="ENG-010", weights="ENG-010")),)


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
    if isinstance(action, LoadLora):
        return state.endpoint(action.endpoint).lora < bounds.lora_revisions
    return bounds.namespaces or getattr(action, "namespace", None) is None
