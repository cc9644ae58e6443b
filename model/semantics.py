"""The semantics: which actions are enabled, and what each one may do.

``step(state, action)`` returns every allowed ``(next_state, outcome)`` pair; an empty tuple
means the action is not enabled. Where the spec leaves a choice (an update whose flush is
refused may be rejected outright or applied and closed), both branches are returned and the
checker follows whichever one the system under test took.

Read top to bottom: cache lookup and insertion, then one function per action (guards
first, then updates), then the dispatch table and ``actions``, the enumeration of every
enabled action that the explorer and the stateful machine draw from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache, lru_cache
from typing import Any

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
from .client import Plan, resolve_plan
from .observation import Observation, Outcome, Response, View
from .state import Bounds, Endpoint, Entry, Policy, Request, Served, ServerInfo, State, Use
from .vocabulary import Funnel, Kind, PauseMode, Phase, Status, Tier

Branch = tuple[State, Outcome]


# ----- views and cache helpers ----------------------------------------------------------


def view(ep: Endpoint) -> View:
    """The probe a correct endpoint shows."""
    return View(
        weights=None if ep.torn else ep.weights,
        draft=ep.draft if ep.config.draft else None,
        scales=ep.scales if ep.config.fp8_kv else None,
        label=ep.label,
        cache=ep.cache,
    )


def _namespace(ep: Endpoint, lora: bool) -> int | None:
    """The LoRA revision a request's KV is keyed by; ``None`` for the base model."""
    return ep.lora if lora else None


def lookup(ep: Endpoint, prefix: str, lora: bool) -> frozenset[Entry]:
    """Entries a request for ``prefix`` reuses, on any tier (ENG-007: keyed by revision)."""
    if not ep.config.radix:
        return frozenset()
    ns = _namespace(ep, lora)
    return frozenset(e for e in ep.cache if e.prefix == prefix and e.lora == ns)


def uses_of(entries: frozenset[Entry]) -> frozenset[Use]:
    """What reusing ``entries`` makes a response depend on."""
    uses = {Use(e.kind.value, e.version) for e in entries}
    uses |= {Use("lora", e.lora) for e in entries if e.lora is not None}
    return frozenset(uses)


def _prefill(
    ep: Endpoint, prefix: str, lora: bool
) -> tuple[Endpoint, frozenset[Use], frozenset[Entry]]:
    """Prefill ``prefix``: reuse what is cached (loading lower tiers back to device, draft KV
    with it, ENG-008), else compute and insert fresh entries. Returns the endpoint, the
    response's uses and the entries it reused."""
    reused = lookup(ep, prefix, lora)
    ns = _namespace(ep, lora)
    if reused:
        back = frozenset(evolve(e, tier=Tier.DEVICE) for e in reused)
        cache = (ep.cache - reused) | back
    elif ep.config.radix:
        fresh = {Entry(prefix, Kind.TARGET, Tier.DEVICE, ep.weights, ns)}
        if ep.config.draft:
            fresh.add(Entry(prefix, Kind.DRAFT, Tier.DEVICE, ep.draft, ns))
        if ep.config.encoder:
            fresh.add(Entry(prefix, Kind.ENCODER, Tier.DEVICE, ep.weights, ns))
        cache = ep.cache | fresh
    else:
        cache = ep.cache
    uses = uses_of(reused) | ep.current(lora)
    return evolve(ep, cache=cache), uses, reused


def _cache_rule(reused: frozenset[Entry]) -> str:
    """The rule a cache mismatch after a prefill breaks: a load-back is ENG-008's."""
    return "ENG-008" if any(e.tier is not Tier.DEVICE for e in reused) else "INV-001"


def _served(
    ep: Endpoint, index: int, prefix: str, lora: bool, uses, sampled, hit, rid=None
) -> Served:
    return Served(
        endpoint=index,
        prefix=prefix,
        weights=ep.weights,
        uses=frozenset(uses),
        current=ep.current(lora),
        sampled=frozenset(sampled),
        hit=hit,
        exact=ep.config.guarded,
        waived=ep.waived,
        rid=rid,
    )


def _load(ep: Endpoint, version: int) -> Endpoint:
    """Install ``version`` completely: target, draft (ENG-004), scales (ENG-005), label."""
    return evolve(ep, weights=version, torn=False, draft=version, scales=version, label=version)


def _flushed(ep: Endpoint) -> Endpoint:
    """A completed flush: every tier and kind emptied (ENG-003); a dirty tree is clean."""
    return evolve(ep, cache=frozenset(), dirty=False, waived=False, refuse_flush=False)


def _ok(ep: Endpoint, because: tuple[tuple[str, str], ...] = (), **fields) -> Outcome:
    if not any(f == "status" for f, _ in because):
        because = (("status", "LIV-002"), *because)
    return Outcome(Observation(Status.OK, view=view(ep), **fields), because=because)


def _rejected(ep: Endpoint, because: tuple[tuple[str, str], ...], **fields) -> Outcome:
    return Outcome(Observation(Status.REJECTED, view=view(ep), **fields), because=because)


def _phase_allows(ep: Endpoint, action: Action) -> bool:
    return lifecycle.allows(ep.phase, action.name)


def _next(ep: Endpoint, action: Action) -> Phase:
    """The phase after ``action``, read from the lifecycle table (its single source)."""
    return lifecycle.next_phase(ep.phase, action.name)


# ----- requests ---------------------------------------------------------------------------


def serve_request(s: State, a: ServeRequest, bounds: Bounds) -> tuple[Branch, ...]:
    ep = s.endpoint(a.endpoint)
    if ep.closed:
        return ((s, _rejected(ep, (("status", "FC-002"),))),)
    ep2, uses, reused = _prefill(ep, a.prefix, a.lora)
    served = _served(ep2, a.endpoint, a.prefix, a.lora, uses, {ep.weights}, bool(reused))
    response = Response(hit=bool(reused), uses=served.uses, sampled=served.sampled)
    s2 = evolve(s.with_endpoint(a.endpoint, ep2), ledger=(*s.ledger, served))
    because = (("response.hit", "INV-001"), ("view.cache", _cache_rule(reused)))
    because = (("status", "LIV-002"), *because)
    return ((s2, Outcome(Observation(Status.OK, response, view=view(ep2)), served, because)),)


def start_request(s: State, a: StartRequest, bounds: Bounds) -> tuple[Branch, ...]:
    ep = s.endpoint(a.endpoint)
    if ep.closed:
        return ((s, _rejected(ep, (("status", "FC-002"),))),)
    ep2, uses, reused = _prefill(ep, a.prefix, a.lora)
    req = Request(a.rid, a.prefix, a.lora, frozenset({ep.weights}), uses)
    ep2 = evolve(ep2, requests=(*ep2.requests, req))
    because = (("view.cache", _cache_rule(reused)),)
    return ((s.with_endpoint(a.endpoint, ep2), _ok(ep2, because)),)


def finish_request(s: State, a: FinishRequest, bounds: Bounds) -> tuple[Branch, ...]:
    ep = s.endpoint(a.endpoint)
    req = ep.request(a.rid)
    rest = tuple(r for r in ep.requests if r.rid != a.rid)
    if ep.closed:
        ep2 = evolve(ep, requests=rest)
        because = (("status", "FC-002"), ("aborted", "FC-002"))
        outcome = _rejected(ep2, because, aborted=frozenset({a.rid}))
        return ((s.with_endpoint(a.endpoint, ep2), outcome),)
    ep2 = evolve(ep, requests=rest)
    sampled = req.sampled | {ep.weights}
    uses = req.uses | ep.current(req.lora)
    served = _served(ep2, a.endpoint, req.prefix, req.lora, uses, sampled, hit=False, rid=a.rid)
    response = Response(hit=False, uses=served.uses, sampled=served.sampled)
    s2 = evolve(s.with_endpoint(a.endpoint, ep2), ledger=(*s.ledger, served))
    because = (("status", "LIV-002"), ("response.sampled", "INV-002"))
    return ((s2, Outcome(Observation(Status.OK, response, view=view(ep2)), served, because)),)


# ----- weights ----------------------------------------------------------------------------


def _version_ok(s: State, ep: Endpoint, version: int, bounds: Bounds) -> bool:
    """A version the trainer has (or is about to have) that this endpoint lacks."""
    return version in (s.trainer, s.trainer + 1) and ep.weights < version <= bounds.versions


def update_endpoint(
    s: State, index: int, version: int, flush_cache: bool | None
) -> tuple[Branch, ...]:
    """UpdateWeights on one endpoint, guards already checked. The heart of the spec.

    ENG-001: a guarded endpoint flushes whatever was asked; ENG-002: otherwise it flushes
    iff asked. FC-001: if that flush cannot complete (KV held, or an injected refusal) the
    update reports failure, and either changes nothing or installs the weights and closes
    the endpoint (FC-002) until a flush completes.
    """
    ep = s.endpoint(index)
    guarded = ep.config.guarded
    must_flush = guarded or flush_cache is True
    why = "ENG-001" if guarded else "ENG-002"
    s = evolve(s, trainer=max(s.trainer, version))
    because_done = (
        ("status", "LIV-001" if must_flush else "LIV-002"),
        ("view.cache", why),
        ("view.weights", why),
        ("view.draft", "ENG-004"),
        ("view.scales", "ENG-005"),
        ("view.label", "INV-003"),
    )
    loaded = _load(ep, version)
    if must_flush and (ep.kv_held or ep.refuse_flush):
        ep = evolve(ep, refuse_flush=False)
        closed = evolve(loaded, dirty=True, refuse_flush=False)
        because = (("status", "FC-001"), ("view.weights", "FC-001"), ("view.label", "INV-003"))
        claimed = evolve(_ok(_flushed(loaded), because_done), flushed_from=ep.cache)
        return (
            (s.with_endpoint(index, ep), evolve(_rejected(ep, because), completion=claimed)),
            (
                s.with_endpoint(index, closed),
                evolve(_rejected(closed, because), completion=claimed),
            ),
        )
    if not must_flush:
        # INV-001's waiver: only where the spec's own client would skip the flush too.
        loaded = evolve(loaded, waived=not plan_for(s, index).flush)
        return ((s.with_endpoint(index, loaded), _ok(loaded, because_done)),)
    loaded = _flushed(loaded)
    done = evolve(_ok(loaded, because_done), flushed_from=ep.cache)
    return ((s.with_endpoint(index, loaded), done),)


def update_weights(s: State, a: UpdateWeights, bounds: Bounds) -> tuple[Branch, ...]:
    return update_endpoint(s, a.endpoint, a.version, a.flush_cache)


def fault_update_fails_midway(
    s: State, a: FaultUpdateFailsMidway, bounds: Bounds
) -> tuple[Branch, ...]:
    """FC-004: rolled back (consistent) or torn and closed; either way, failure."""
    ep = s.endpoint(a.endpoint)
    s = evolve(s, trainer=max(s.trainer, a.version))
    torn = evolve(ep, torn=True, label=None)
    because = (("status", "FC-004"), ("view.weights", "FC-004"), ("view.label", "INV-003"))
    return (
        (s, _rejected(ep, because)),
        (s.with_endpoint(a.endpoint, torn), _rejected(torn, because)),
    )


def plan_for(s: State, index: int) -> Plan:
    """The plan the spec's client resolves for endpoint ``index``."""
    return _plan(s.policy, s.endpoint(index).config.info)


@cache
def _plan(p: Policy, info: ServerInfo) -> Plan:
    return resolve_plan(p.mode, p.flush_cache, p.pause_mode, None if info is None else dict(info))


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


def sync_weights(s: State, a: SyncWeights, bounds: Bounds) -> tuple[Branch, ...]:
    """The composition of ``sync_actions``: every combination of their branches.

    The outcome of a sync is that of its last call; the stateful machine drives the calls
    one by one and compares each.
    """
    frontier: list[Branch] = [(s, _ok(s.endpoint(0)))]
    for call in sync_actions(s, a):
        nxt: list[Branch] = []
        for state, _ in frontier:
            nxt += step(state, call, bounds)
        frontier = nxt
    return tuple(frontier)


# ----- cache control ----------------------------------------------------------------------


def flush_cache(s: State, a: FlushCache, bounds: Bounds) -> tuple[Branch, ...]:
    """LIV-001: refused only while KV is held or a refusal is injected. FC-003: the
    reported result is the truth. A flush on torn weights still leaves it closed."""
    ep = s.endpoint(a.endpoint)
    if ep.kv_held or ep.refuse_flush:
        ep2 = evolve(ep, refuse_flush=False)
        because = (("status", "FC-003"), ("flushed", "FC-003"))
        return ((s.with_endpoint(a.endpoint, ep2), _rejected(ep2, because, flushed=False)),)
    ep2 = _flushed(ep)
    because = (("status", "LIV-001"), ("flushed", "LIV-001"), ("view.cache", "ENG-003"))
    done = evolve(_ok(ep2, because, flushed=True), flushed_from=ep.cache)
    return ((s.with_endpoint(a.endpoint, ep2), done),)


def evict_prefix(s: State, a: EvictPrefix, bounds: Bounds) -> tuple[Branch, ...]:
    """Hierarchical cache: a prefix's target and draft KV move down a tier together."""
    ep = s.endpoint(a.endpoint)
    moving = _evictable(ep, a.prefix)
    cache = (ep.cache - moving) | {evolve(e, tier=a.tier) for e in moving}
    ep2 = evolve(ep, cache=frozenset(cache))
    return ((s.with_endpoint(a.endpoint, ep2), _ok(ep2, (("view.cache", "ENG-008"),))),)


def load_lora(s: State, a: LoadLora, bounds: Bounds) -> tuple[Branch, ...]:
    """ENG-007: the old revision's KV becomes unreachable (here: dropped)."""
    ep = s.endpoint(a.endpoint)
    cache = frozenset(e for e in ep.cache if e.lora is None)
    ep2 = evolve(ep, lora=ep.lora + 1, cache=cache)
    return ((s.with_endpoint(a.endpoint, ep2), _ok(ep2, (("view.cache", "ENG-007"),))),)


def fault_refuse_flush(s: State, a: FaultRefuseFlush, bounds: Bounds) -> tuple[Branch, ...]:
    ep2 = evolve(s.endpoint(a.endpoint), refuse_flush=True)
    return ((s.with_endpoint(a.endpoint, ep2), _ok(ep2)),)


# ----- lifecycle --------------------------------------------------------------------------


def pause_generation(s: State, a: PauseGeneration, bounds: Bounds) -> tuple[Branch, ...]:
    """ENG-009: abort ends requests; retract frees their KV; in_place keeps it."""
    ep = s.endpoint(a.endpoint)
    aborted: frozenset[str] = frozenset()
    requests = ep.requests
    if a.mode is PauseMode.ABORT:
        aborted, requests = frozenset(r.rid for r in requests), ()
    elif a.mode is PauseMode.RETRACT:
        requests = tuple(evolve(r, uses=frozenset(), retracted=True) for r in requests)
    ep2 = evolve(ep, phase=_next(ep, a), pause=a.mode, requests=requests)
    because = (("aborted", "ENG-009"),)
    return ((s.with_endpoint(a.endpoint, ep2), _ok(ep2, because, aborted=aborted)),)


def continue_generation(s: State, a: ContinueGeneration, bounds: Bounds) -> tuple[Branch, ...]:
    """Retracted requests recompute their prefix under the weights now in force."""
    ep = s.endpoint(a.endpoint)
    ep2 = evolve(ep, phase=_next(ep, a), pause=None)
    if not ep2.closed:
        requests = []
        for r in ep2.requests:
            if r.retracted:
                ep2, uses, _ = _prefill(ep2, r.prefix, r.lora)
                r = evolve(r, uses=uses, retracted=False)
            requests.append(r)
        ep2 = evolve(ep2, requests=tuple(requests))
    return ((s.with_endpoint(a.endpoint, ep2), _ok(ep2, (("view.cache", "ENG-009"),))),)


def sleep(s: State, a: Sleep, bounds: Bounds) -> tuple[Branch, ...]:
    """ENG-006: device KV memory is discarded, and its index entries with it."""
    ep = s.endpoint(a.endpoint)
    cache = frozenset(e for e in ep.cache if e.tier is not Tier.DEVICE)
    ep2 = evolve(ep, phase=_next(ep, a), cache=cache)
    return ((s.with_endpoint(a.endpoint, ep2), _ok(ep2, (("view.cache", "ENG-006"),))),)


def wake_up(s: State, a: WakeUp, bounds: Bounds) -> tuple[Branch, ...]:
    ep = s.endpoint(a.endpoint)
    ep2 = evolve(ep, phase=_next(ep, a))
    return ((s.with_endpoint(a.endpoint, ep2), _ok(ep2, (("view.cache", "ENG-006"),))),)


def restart(s: State, a: Restart, bounds: Bounds) -> tuple[Branch, ...]:
    """ENG-010: cold start from the last whole checkpoint."""
    ep = s.endpoint(a.endpoint)
    ep2 = _load(evolve(ep, phase=_next(ep, a), pause=None), ep.weights)
    ep2 = evolve(ep2, cache=frozenset(), requests=(), dirty=False, waived=False)
    ep2 = evolve(ep2, refuse_flush=False)
    because = (("view.cache", "ENG-010"), ("view.weights", "ENG-010"))
    return ((s.with_endpoint(a.endpoint, ep2), _ok(ep2, because)),)


# ----- guards: when each action is enabled (the phase table is checked first) ------------


def _evictable(ep: Endpoint, prefix: str) -> frozenset[Entry]:
    """A prefix's device KV (target and draft) that can move to a lower tier."""
    return frozenset(
        e
        for e in ep.cache
        if e.prefix == prefix and e.tier is Tier.DEVICE and e.kind is not Kind.ENCODER
    )


def _rid_free(s: State, rid: str) -> bool:
    return all(r.rid != rid for e in s.endpoints for r in e.requests)


def _always(s: State, a: Action, bounds: Bounds) -> bool:
    return True


_GUARDS: dict[type[Action], Callable[[State, Any, Bounds], bool]] = {
    ServeRequest: lambda s, a, b: not a.lora or s.endpoint(a.endpoint).config.lora,
    StartRequest: lambda s, a, b: (
        (not a.lora or s.endpoint(a.endpoint).config.lora) and _rid_free(s, a.rid)
    ),
    FinishRequest: lambda s, a, b: any(r.rid == a.rid for r in s.endpoint(a.endpoint).requests),
    SyncWeights: lambda s, a, b: (
        a.version == s.trainer + 1 <= b.versions
        and all(ep.phase is Phase.SERVING for ep in s.endpoints)
    ),
    UpdateWeights: lambda s, a, b: _version_ok(s, s.endpoint(a.endpoint), a.version, b),
    FaultUpdateFailsMidway: lambda s, a, b: _version_ok(s, s.endpoint(a.endpoint), a.version, b),
    FlushCache: _always,
    EvictPrefix: lambda s, a, b: (
        a.tier is not Tier.DEVICE
        and a.tier in s.endpoint(a.endpoint).config.tiers
        and bool(_evictable(s.endpoint(a.endpoint), a.prefix))
    ),
    LoadLora: lambda s, a, b: (
        s.endpoint(a.endpoint).config.lora
        and s.endpoint(a.endpoint).lora < b.lora_revisions
        and not any(r.lora and r.holds_kv for r in s.endpoint(a.endpoint).requests)
    ),
    FaultRefuseFlush: lambda s, a, b: not s.endpoint(a.endpoint).refuse_flush,
    PauseGeneration: _always,
    ContinueGeneration: _always,
    Sleep: lambda s, a, b: not s.endpoint(a.endpoint).requests,
    WakeUp: _always,
    Restart: _always,
}
"""Each action's guard beyond the phase table. ``step`` calls an effect only when its guard
holds, so no effect function re-checks it."""


# ----- dispatch ---------------------------------------------------------------------------

_STEPS: dict[type[Action], Callable[[State, Action, Bounds], tuple[Branch, ...]]] = {
    ServeRequest: serve_request,
    StartRequest: start_request,
    FinishRequest: finish_request,
    SyncWeights: sync_weights,
    UpdateWeights: update_weights,
    FlushCache: flush_cache,
    PauseGeneration: pause_generation,
    ContinueGeneration: continue_generation,
    Sleep: sleep,
    WakeUp: wake_up,
    Restart: restart,
    EvictPrefix: evict_prefix,
    LoadLora: load_lora,
    FaultRefuseFlush: fault_refuse_flush,
    FaultUpdateFailsMidway: fault_update_fails_midway,
}


def enabled(state: State, action: Action, bounds: Bounds = Bounds()) -> bool:
    """``action`` may be taken in ``state``: its endpoint exists, the phase table allows
    it, and its guard holds. Cheap: no effect is computed."""
    index = getattr(action, "endpoint", None)
    if index is not None:
        if not 0 <= index < len(state.endpoints):
            return False
        if not _phase_allows(state.endpoint(index), action):
            return False
    return bool(_GUARDS[type(action)](state, action, bounds))


def step(state: State, action: Action, bounds: Bounds = Bounds()) -> tuple[Branch, ...]:
    """Every allowed ``(next_state, outcome)``; empty when ``action`` is not enabled."""
    if not enabled(state, action, bounds):
        return ()
    return _STEPS[type(action)](state, action, bounds)


def candidates(state: State, bounds: Bounds = Bounds(), faults: bool = True) -> Iterator[Action]:
    """Every action instance within ``bounds`` worth asking ``enabled`` about, in a fixed
    order (versions only the trainer's current and next: no other can be enabled)."""
    n = len(state.endpoints)
    versions = [v for v in (state.trainer, state.trainer + 1) if 1 <= v <= bounds.versions]
    for v in versions:
        for funnel in Funnel:
            yield SyncWeights(v, funnel)
    for i in range(n):
        for p in bounds.prefixes:
            for lora in (False, True):
                yield ServeRequest(i, p, lora)
                for rid in bounds.rids:
                    yield StartRequest(i, rid, p, lora)
            for tier in (Tier.HOST, Tier.STORAGE):
                yield EvictPrefix(i, p, tier)
        for rid in bounds.rids:
            yield FinishRequest(i, rid)
        for v in versions:
            for funnel in Funnel:
                for flush in (None, False, True):
                    yield UpdateWeights(i, v, funnel, flush)
            if faults:
                yield FaultUpdateFailsMidway(i, v)
        yield FlushCache(i)
        for mode in PauseMode:
            yield PauseGeneration(i, mode)
        yield ContinueGeneration(i)
        yield Sleep(i)
        yield WakeUp(i)
        yield Restart(i)
        yield LoadLora(i)
        if faults:
            yield FaultRefuseFlush(i)


def conforming(state: State, action: Action) -> bool:
    """``action`` is a call a conforming client could make.

    The engine API accepts any ``flush_cache``, and ``step`` judges any call. But a raw
    UpdateWeights that skips the flush on an unguarded endpoint where the spec's client
    would flush breaks the client contract (CLI-001/002/004): the explorer and the stateful
    machine draw only conforming calls, and reach off-contract ones only through a client
    under test that makes them.
    """
    if not isinstance(action, UpdateWeights) or action.flush_cache is True:
        return True
    return (
        state.endpoint(action.endpoint).config.guarded or not plan_for(state, action.endpoint).flush
    )


def actions(state: State, bounds: Bounds = Bounds(), faults: bool = True) -> list[Action]:
    """Every conforming action enabled in ``state`` within ``bounds``."""
    return list(_actions(state.without_ledger(), bounds, faults))


@lru_cache(maxsize=1 << 16)
def _actions(state: State, bounds: Bounds, faults: bool) -> tuple[Action, ...]:
    """``actions`` memoized: enabledness never depends on the ledger, and the same states
    recur across the examples of a stateful run and its shrinking."""
    return tuple(
        a
        for a in candidates(state, bounds, faults)
        if enabled(state, a, bounds) and conforming(state, a)
    )
