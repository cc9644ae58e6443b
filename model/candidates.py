"""The enumeration the explorer and the stateful machine draw from: every action instance
worth asking ``enabled`` about within the search bounds, and the conforming enabled ones.

Bounds are the search's, not the spec's: ``within`` is the one place they are applied.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

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
from .semantics import asked_to_flush, enabled, plan_for
from .state import Bounds, State
from .vocabulary import Funnel, PauseMode, Tier


def candidates(state: State, bounds: Bounds = Bounds(), faults: bool = True) -> Iterator[Action]:
    """Every action instance within ``bounds`` worth asking ``enabled`` about, in a fixed
    order (versions only the trainer's current and next: no other can be enabled)."""
    n = len(state.endpoints)
    versions = [v for v in (state.trainer, state.trainer + 1) if 1 <= v <= bounds.versions]
    for v in versions:
        for funnel in Funnel:
            yield SyncWeights(v, funnel)
    for i in range(n):
        namespaces: list[int | None] = [None]
        if bounds.namespaces:
            namespaces += range(state.endpoint(i).weights + 1)
        for p in bounds.prefixes:
            for lora in (False, True):
                for ns in namespaces:
                    yield ServeRequest(i, p, lora, ns)
                    for rid in bounds.rids:
                        yield StartRequest(i, rid, p, lora, ns)
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
        if state.endpoint(i).lora < bounds.lora_revisions:
            yield LoadLora(i)
        if faults:
            yield FaultRefuseFlush(i)


def conforming(state: State, action: Action) -> bool:
    """``action`` is a call a conforming client could make.

    The engine API accepts any ``flush_cache``, and ``step`` judges any call. But a raw
    UpdateWeights that skips the flush on an unguarded endpoint where the spec's client
    would flush breaks the client contract (CLI-001/002/004): the explorer and the stateful
    machine draw only conforming calls, and reach off-contract ones only through a client
    under test that makes them. On an engine that leaves the encoder cache to the client, a
    raw update alone is never conforming: only a sync (with its reset) updates there.
    """
    if not isinstance(action, UpdateWeights):
        return True
    ep = state.endpoint(action.endpoint)
    if ep.config.encoder and ep.config.encoder_reset_separate:
        return False  # a conforming client resets the encoder cache after it: SyncWeights
    if ep.config.guarded or asked_to_flush(ep, action.flush_cache):
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
