"""Latent hazards: endpoint states in which a catalogued fault is one event away from showing.

A hazard is KV, or a promise about KV, that the endpoint's next event (a flush, an update,
a release, a resume, a reuse) must honour: lower-tier KV a flush must reach, released
memory an update must not touch, an open window whose mixed KV a finish must drop. The
state itself breaks no rule; the fault shows only if that event comes before something
else (an eviction, an unrelated restart) removes the hazard. Each ``Hazard`` names one such
condition, the predicate that tells it on an ``Endpoint``, and the public faults it
mirrors (``shared/cases/*.md``, ``adapters/cases.py``). The conformance machine steers its
random draw towards the endpoints that hold one (``conformance.machine.hazard_steered``),
by one mechanism for every hazard of this table.

Pure: the predicates read the state and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from attrs import frozen

from .actions import (
    AbortWeightUpdate,
    Action,
    BeginWeightUpdate,
    FinishWeightUpdate,
    FlushCache,
    PauseGeneration,
    PublishVersion,
    ServeRequest,
    Sleep,
    StartRequest,
    SyncWeights,
    UpdateWeightChunk,
    UpdateWeights,
    WakeUp,
)
from .state import Endpoint, State
from .vocabulary import GARBAGE, MIXED, PauseMode, Tier


def lower_tier_kv(ep: Endpoint) -> bool:
    """KV on a lower tier (host or storage) of a hierarchical cache: a flush, an update or
    a release must reach it too (PF-09 storage tier survives the flush, sgl-project/sglang
    #26792; PF-12 draft KV not restored from the host tier, sgl-project/sglang PR #17338;
    and the KV resumed stale after a weights-only update, the tempting fix of PF-19,
    sgl-project/sglang PR #19029)."""
    return any(e.tier is not Tier.DEVICE for e in ep.cache)


def kv_released(ep: Endpoint) -> bool:
    """Device memory released by a Sleep and not resumed: a flush or an update must not
    touch the released pools, and an index that survived them must not be reused (PF-02
    prefix index survives sleep, vllm-project/vllm #17103; PF-19 update with flush while KV
    memory is released kills the scheduler, sgl-project/sglang PR #19029)."""
    return bool(ep.released)


def open_window(ep: Endpoint) -> bool:
    """An open two-phase update window (BeginWeightUpdate, not yet finished or aborted):
    a chunk may land in the live weights, a forward may run under mixed weights, and the
    finish must drop their KV and publish nothing after a failed chunk (SGLang's P2P
    prepare/complete weight update: the ``p2p-prepare-writes-live`` and
    ``finish-publishes-after-failed-chunk`` mutants; vLLM's layerwise reload)."""
    return ep.update is not None


def held_in_place(ep: Endpoint) -> bool:
    """Requests paused in place with their KV kept: an update must not write under them,
    and a flush must not free their KV (PF-06 in-place pause skips the flush forever,
    radixark/miles PR #2782; PF-17 keep-mode pause resumes a request on old KV,
    vllm-project/vllm #54443; PF-28 an in-place pause races the weight write,
    sgl-project/sglang PR #27886)."""
    return ep.pause is PauseMode.IN_PLACE and ep.kv_held


def torn_or_mixed(ep: Endpoint) -> bool:
    """Weights or KV of no whole version: torn weights after an update failed midway, a
    tree left stale by a flush that could not complete, or cache entries of mixed weights
    or of released memory; the endpoint must stay closed, or drop that KV, until a whole
    update completes (PF-27 a bucketed update fails midway and the mixed weights keep
    serving, NVIDIA/TensorRT-LLM PR #16642; PF-32 the flush raises after the weights moved,
    sgl-project/sglang-omni PR #678; PF-02's KV of no version)."""
    return ep.torn or ep.dirty or any(e.version in (MIXED, GARBAGE) for e in ep.cache)


def refused_flush_pending(ep: Endpoint) -> bool:
    """An injected refusal waiting for the next flush attempt: the update or flush it meets
    must report the failure and stay fail-closed (PF-03 flush refused, reported as success,
    vllm-project/vllm PR #12284 and #28827; PF-04 flush refused while requests run,
    areal-project/AReaL #140)."""
    return ep.refuse_flush


@frozen
class Hazard:
    """One latent hazard: its ``name`` (the key of the machine's steering weights), the
    predicate ``holds`` on one endpoint, the public faults it mirrors (``mirrors``: the
    ``PF-NN`` cases, or the mutant where the fault has no case), and the action types that
    meet it (``met_by``): run on the endpoint that holds it (a ``SyncWeights`` reaches every
    endpoint), each puts the hazard at stake, where the faults it mirrors show."""

    name: str
    holds: Callable[[Endpoint], bool]
    mirrors: tuple[str, ...]
    met_by: frozenset[type[Action]]


_INVALIDATIONS = frozenset({FlushCache, UpdateWeights, SyncWeights})
"""A flush, an update and a sync: every hazard of KV is met by an invalidation."""

HAZARDS: tuple[Hazard, ...] = (
    Hazard(
        "lower-tier KV",
        lower_tier_kv,
        ("PF-09", "PF-12", "PF-19"),
        _INVALIDATIONS | {Sleep, WakeUp, ServeRequest, StartRequest, PauseGeneration},
    ),
    Hazard("KV released", kv_released, ("PF-02", "PF-19"), _INVALIDATIONS | {WakeUp}),
    Hazard(
        "open window",
        open_window,
        ("p2p-prepare-writes-live", "finish-publishes-after-failed-chunk"),
        frozenset(
            {UpdateWeightChunk, ServeRequest, StartRequest, FinishWeightUpdate, AbortWeightUpdate}
        ),
    ),
    Hazard(
        "held in place",
        held_in_place,
        ("PF-06", "PF-17", "PF-28"),
        _INVALIDATIONS | {BeginWeightUpdate, UpdateWeightChunk, PublishVersion},
    ),
    Hazard(
        "torn or mixed",
        torn_or_mixed,
        ("PF-02", "PF-27", "PF-32"),
        _INVALIDATIONS | {ServeRequest, StartRequest, FinishWeightUpdate},
    ),
    Hazard(
        "refused flush pending",
        refused_flush_pending,
        ("PF-03", "PF-04"),
        _INVALIDATIONS | {FinishWeightUpdate, Sleep, PauseGeneration},
    ),
)
"""Every hazard the machine steers to, in the order its draw lists them."""

BY_NAME: dict[str, Hazard] = {h.name: h for h in HAZARDS}


def endpoints_holding(hazard: Hazard, states: Collection[State]) -> frozenset[int]:
    """The endpoints that hold ``hazard`` in some one of ``states`` (a lockstep run's
    candidate states: the system is in one of them, and where the model forked, as after an
    update that failed midway, the hazard may be the branch it took); empty for no states."""
    return frozenset(i for s in states for i, ep in enumerate(s.endpoints) if hazard.holds(ep))


def meets(hazard: Hazard, endpoint: int, action: Action) -> bool:
    """``action`` meets ``hazard`` held on ``endpoint``: its type is one of ``met_by`` and it
    runs on that endpoint (a ``SyncWeights``, which names none, on every endpoint)."""
    return type(action) in hazard.met_by and getattr(action, "endpoint", endpoint) == endpoint


def hazards_held(states: Collection[State]) -> tuple[tuple[Hazard, int], ...]:
    """Every ``(hazard, endpoint)`` pair held in some one of ``states``
    (``endpoints_holding``), in ``HAZARDS`` order, endpoints ascending."""
    return tuple((h, i) for h in HAZARDS for i in sorted(endpoints_holding(h, states)))


__all__ = [
    "BY_NAME",
    "HAZARDS",
    "Hazard",
    "endpoints_holding",
    "hazards_held",
    "held_in_place",
    "kv_released",
    "lower_tier_kv",
    "meets",
    "open_window",
    "refused_flush_pending",
    "torn_or_mixed",
]
