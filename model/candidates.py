"""The enumeration the explorer and the stateful machine draw from: every action instance
worth asking ``enabled`` about within the search bounds, and the conforming enabled ones.

Bounds are the search's, not the spec's: ``within`` is the one place they are applied.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

from attrs import frozen

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
from .semantics import asked_to_flush, enabled, plan_for
from .state import Bounds, Policy, State
from .vocabulary import ALL_MEMORY, MemoryTag, PauseMode, Phase, Tier

TAG_SETS: tuple[frozenset[MemoryTag], ...] = (
    ALL_MEMORY,
    frozenset({MemoryTag.KV_CACHE}),
    frozenset({MemoryTag.WEIGHTS}),
)
"""The tags a Sleep or WakeUp is drawn with: everything first (the plain call), then each."""


NOT_ENUMERATED: dict[type[Action], str] = {
    FlushEncoderCache: "only a client program calls it (flush_cache('encoder')) inside a sync",
}
"""Action types ``candidates`` never yields, each with the reason: every other action type
is yielded (tests/test_action_registries.py holds the two to each other)."""


def candidates(state: State, bounds: Bounds = Bounds(), faults: bool = True) -> Iterator[Action]:
    """Every action instance within ``bounds`` worth asking ``enabled`` about, in a fixed
    order (versions only the trainer's current and next: no other can be enabled): the
    syncs (``sync_candidates``), then each endpoint's (``endpoint_candidates``)."""
    yield from sync_candidates(state.trainer, bounds)
    for i, ep in enumerate(state.endpoints):
        room = ep.lora < bounds.lora_revisions
        yield from endpoint_candidates(
            i, ep.weights, ep.config.ranks, room, state.trainer, bounds, faults
        )


def _versions(trainer: int, bounds: Bounds) -> list[int]:
    """The versions an update may name: the trainer's current and next, within bounds."""
    return [v for v in (trainer, trainer + 1) if 1 <= v <= bounds.versions]


@lru_cache(maxsize=1 << 8)
def sync_candidates(trainer: int, bounds: Bounds) -> tuple[Action, ...]:
    """The ``SyncWeights`` of ``candidates`` with the trainer at version ``trainer``."""
    return tuple(SyncWeights(v, f) for v in _versions(trainer, bounds) for f in bounds.funnels)


@lru_cache(maxsize=1 << 12)
def endpoint_candidates(
    i: int, weights: int, ranks: int, lora_room: bool, trainer: int, bounds: Bounds, faults: bool
) -> tuple[Action, ...]:
    """The actions of ``candidates`` on endpoint ``i``: what they depend on is its installed
    ``weights``, its ``Config.ranks``, whether its LoRA revision is below
    ``Bounds.lora_revisions`` (``lora_room``) and the trainer's version (memoized: many
    states share them)."""
    out: list[Action] = []
    add = out.append
    versions = _versions(trainer, bounds)
    namespaces: list[int | None] = [None]
    if bounds.namespaces:
        namespaces += range(weights + 1)
    on_ranks = range(ranks)
    for p in bounds.prefixes:
        for lora in (False, True):
            for ns in namespaces:
                for k in on_ranks:
                    add(ServeRequest(i, p, lora, ns, k))
                for rid in bounds.rids:
                    for k in on_ranks:
                        add(StartRequest(i, rid, p, lora, ns, k))
        for tier in (Tier.HOST, Tier.STORAGE):
            add(EvictPrefix(i, p, tier))
    for rid in bounds.rids:
        add(FinishRequest(i, rid))
    for v in versions:
        for funnel in bounds.funnels:
            for flush in (None, False, True):
                add(UpdateWeights(i, v, funnel, flush))
        if faults:
            add(FaultUpdateFailsMidway(i, v))
    add(FlushCache(i))
    for mode in PauseMode:
        add(PauseGeneration(i, mode))
        add(PauseGeneration(i, mode, clear_cache=True))
    add(ContinueGeneration(i))
    for tags in TAG_SETS:
        add(Sleep(i, tags))
        add(WakeUp(i, tags))
    add(Restart(i))
    # A publish of the weights installed, and one ahead of them (to be refused, PUB-001).
    for v in sorted({weights, trainer + 1}):
        for abort in (False, True):
            add(PublishVersion(i, v, abort))
    if lora_room:
        add(LoadLora(i))
    if faults:
        add(FaultRefuseFlush(i))
    # two-phase updates: the funnel only matters to the system (derived state, drafts)
    for v in versions:
        for funnel in bounds.funnels:
            add(BeginWeightUpdate(i, v, funnel))
    add(UpdateWeightChunk(i))
    for flush in (None, False, True):
        add(FinishWeightUpdate(i, flush))
    add(AbortWeightUpdate(i))
    if faults:
        add(FaultChunkFails(i))
    if faults:  # enabled only on an endpoint with data-parallel ranks
        for k in on_ranks:
            add(FaultRankUpdateFails(i, k))
    # enabled only on a worker behind a router
    add(LeaveRotation(i))
    add(EnterRotation(i))
    return tuple(out)


def conforming(state: State, action: Action) -> bool:
    """``action`` is a call a conforming client could make.

    The engine API accepts any ``flush_cache``, and ``step`` judges any call. But a raw
    UpdateWeights that skips the flush on an unguarded endpoint where the spec's client
    would flush (or a FinishWeightUpdate that does) breaks the client contract
    (CLI-001/002/004), unless the endpoint is paused after a pause that cleared its cache
    (nothing computed since): the explorer and the stateful machine draw only conforming
    calls, and reach off-contract ones only through a client
    under test that makes them. On an engine that leaves the encoder cache to the client, a
    raw update alone is never conforming: only a sync (with its reset) updates there.
    """
    if not isinstance(action, (UpdateWeights, FinishWeightUpdate)):
        return True
    ep = state.endpoint(action.endpoint)
    if ep.config.encoder and ep.config.encoder_reset_separate:
        return False  # a conforming client resets the encoder cache after it: SyncWeights
    if ep.config.guarded or asked_to_flush(ep, action.flush_cache):
        return True
    if ep.cleared:
        # Flush at pause (vLLM /pause?clear_cache=true): the cache was emptied by this
        # pause and PAUSED admits no prefill, so the update's own flush has nothing to do.
        return True
    return not plan_for(state, action.endpoint).flush


def actions(state: State, bounds: Bounds = Bounds(), faults: bool = True) -> list[Action]:
    """Every conforming action enabled in ``state`` within ``bounds``."""
    return list(_actions(state.without_ledger() if state.ledger else state, bounds, faults))


@lru_cache(maxsize=1 << 12)
def _actions(state: State, bounds: Bounds, faults: bool) -> tuple[Action, ...]:
    """``actions`` memoized: enabledness never depends on the ledger, and the same states
    recur across the examples of a stateful run and its shrinking."""
    return tuple(a for part in parts(state, bounds, faults) for a in part)


def parts(state: State, bounds: Bounds, faults: bool) -> tuple[tuple[Action, ...], ...]:
    """``actions`` in parts, in ``candidates`` order: the enabled syncs, then each endpoint's
    conforming enabled actions (``endpoint_actions``)."""
    syncs = tuple(
        a
        for a in sync_candidates(state.trainer, bounds)
        if enabled(state, a) and conforming(state, a)
    )
    context = Context.of(state)
    return (
        syncs,
        *(endpoint_actions(state, i, context, bounds, faults) for i in range(len(state.endpoints))),
    )


@frozen(cache_hash=True)
class Context:
    """What an action on one endpoint may read of the state beyond that endpoint, in
    ``enabled`` (the phase table, placement, the guards of ``semantics.SPEC``) and
    ``conforming``: the trainer's version (``UpdateWeights``, ``PublishVersion``), the
    client policy (the spec's plan), the request IDs in flight on any endpoint
    (``StartRequest``'s free rid) and the prefill endpoint's index and phase (a P/D
    deployment admits requests only while it does). ``endpoint_actions`` memoizes on it:
    a guard that reads more of the state must add it here (``tests/test_candidates.py``
    compares the memo with the plain enumeration over explored states)."""

    trainer: int
    policy: Policy
    rids: frozenset[str]
    prefill: tuple[int, Phase] | None

    @classmethod
    def of(cls, state: State) -> Context:
        p = state.prefill_index()
        return cls(
            state.trainer,
            state.policy,
            frozenset(r.rid for ep in state.endpoints for r in ep.requests),
            None if p is None else (p, state.endpoints[p].phase),
        )


ENDPOINT_MEMO_SIZE = 1 << 16
"""How many ``endpoint_actions`` results are kept; the memo is emptied when full."""

_ENDPOINT_MEMO: dict[tuple[object, ...], tuple[Action, ...]] = {}


def endpoint_actions(
    state: State, i: int, context: Context, bounds: Bounds, faults: bool
) -> tuple[Action, ...]:
    """The conforming enabled actions on endpoint ``i`` of ``state`` (``context``:
    ``Context.of(state)``), in ``candidates`` order. Memoized on the endpoint, ``context``,
    ``bounds`` and ``faults``, which is all they read: a step changes one endpoint, and
    the others' actions are not computed again."""
    key = (i, state.endpoints[i], context, bounds, faults)
    got = _ENDPOINT_MEMO.get(key)
    if got is None:
        ep = state.endpoints[i]
        room = ep.lora < bounds.lora_revisions
        todo = endpoint_candidates(
            i, ep.weights, ep.config.ranks, room, state.trainer, bounds, faults
        )
        got = tuple(a for a in todo if enabled(state, a) and conforming(state, a))
        if len(_ENDPOINT_MEMO) >= ENDPOINT_MEMO_SIZE:
            _ENDPOINT_MEMO.clear()
        _ENDPOINT_MEMO[key] = got
    return got
