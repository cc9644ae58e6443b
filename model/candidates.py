"""The enumeration the explorer and the stateful machine draw from: every action instance
worth asking ``enabled`` about within the search bounds, and the conforming enabled ones.

Bounds are the search's, not the spec's: ``within`` is the one place they are applied.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

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
from .state import Bounds, State
from .vocabulary import ALL_MEMORY, MemoryTag, PauseMode, Tier

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
    order (versions only the trainer's current and next: no other can be enabled)."""
    n = len(state.endpoints)
    versions = [v for v in (state.trainer, state.trainer + 1) if 1 <= v <= bounds.versions]
    for v in versions:
        for funnel in bounds.funnels:
            yield SyncWeights(v, funnel)
    for i in range(n):
        namespaces: list[int | None] = [None]
        if bounds.namespaces:
            namespaces += range(state.endpoint(i).weights + 1)
        ranks = range(state.endpoint(i).config.ranks)
        for p in bounds.prefixes:
            for lora in (False, True):
                for ns in namespaces:
                    for k in ranks:
                        yield ServeRequest(i, p, lora, ns, k)
                    for rid in bounds.rids:
                        for k in ranks:
                            yield StartRequest(i, rid, p, lora, ns, k)
            for tier in (Tier.HOST, Tier.STORAGE):
                yield EvictPrefix(i, p, tier)
        for rid in bounds.rids:
            yield FinishRequest(i, rid)
        for v in versions:
            for funnel in bounds.funnels:
                for flush in (None, False, True):
                    yield UpdateWeights(i, v, funnel, flush)
            if faults:
                yield FaultUpdateFailsMidway(i, v)
        yield FlushCache(i)
        for mode in PauseMode:
            yield PauseGeneration(i, mode)
            yield PauseGeneration(i, mode, clear_cache=True)
        yield ContinueGeneration(i)
        for tags in TAG_SETS:
            yield Sleep(i, tags)
            yield WakeUp(i, tags)
        yield Restart(i)
        # A publish of the weights installed, and one ahead of them (to be refused, PUB-001).
        for v in sorted({state.endpoint(i).weights, state.trainer + 1}):
            for abort in (False, True):
                yield PublishVersion(i, v, abort)
        if state.endpoint(i).lora < bounds.lora_revisions:
            yield LoadLora(i)
        if faults:
            yield FaultRefuseFlush(i)
        # two-phase updates: the funnel only matters to the system (derived state, drafts)
        for v in versions:
            for funnel in bounds.funnels:
                yield BeginWeightUpdate(i, v, funnel)
        yield UpdateWeightChunk(i)
        for flush in (None, False, True):
            yield FinishWeightUpdate(i, flush)
        yield AbortWeightUpdate(i)
        if faults:
            yield FaultChunkFails(i)
        if faults:  # enabled only on an endpoint with data-parallel ranks
            for k in ranks:
                yield FaultRankUpdateFails(i, k)
        # enabled only on a worker behind a router
        yield LeaveRotation(i)
        yield EnterRotation(i)


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
    return list(_actions(state.without_ledger(), bounds, faults))


@lru_cache(maxsize=1 << 12)
def _actions(state: State, bounds: Bounds, faults: bool) -> tuple[Action, ...]:
    """``actions`` memoized: enabledness never depends on the ledger, and the same states
    recur across the examples of a stateful run and its shrinking."""
    return tuple(
        a for a in candidates(state, bounds, faults) if enabled(state, a) and conforming(state, a)
    )
