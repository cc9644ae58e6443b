"""What a prefix cache does to its entries: keys, lookup, prefill, flush, invalidation.

Pure functions of one ``Endpoint``, used by the actions of ``semantics.py``. The cache an
endpoint holds in the model is an upper bound (``Endpoint.cache``): these functions say what
it MAY hold after each event, and a prefill returns every way it may go.
"""

from __future__ import annotations

from attrs import frozen

from .fast import evolve
from .rules import RuleId
from .state import Endpoint, Entry, Use
from .vocabulary import GARBAGE, MIXED, Kind, Tier


def key_namespace(ep: Endpoint, namespace: int | None) -> int | None:
    """The namespace a request's key names: its own, else the version in force where the
    engine keys every prefix by version (``Config.versioned_keys``), else none."""
    if namespace is not None:
        return namespace
    return ep.weights if ep.config.versioned_keys else None


def lookup(ep: Endpoint, prefix: str, lora: bool, namespace: int | None = None) -> frozenset[Entry]:
    """Entries a prefill of ``prefix`` may reuse, on any tier: same prefix, same LoRA revision
    (ENG-007), same namespace. Nothing with the radix cache off."""
    if not ep.config.radix:
        return frozenset()
    rev, ns = (ep.lora if lora else None), key_namespace(ep, namespace)
    return frozenset(
        e for e in ep.cache if e.prefix == prefix and e.lora == rev and e.namespace == ns
    )


def computed(ep: Endpoint, prefix: str, lora: bool, namespace: int | None) -> frozenset[Entry]:
    """The entries a cold prefill of ``prefix`` inserts, one per kind the endpoint has."""
    rev, ns = (ep.lora if lora else None), key_namespace(ep, namespace)
    kinds = [(Kind.TARGET, ep.live)]
    kinds += [(Kind.DRAFT, ep.draft)] if ep.config.draft else []
    kinds += [(Kind.ENCODER, ep.live)] if ep.config.encoder else []
    return frozenset(Entry(prefix, k, Tier.DEVICE, v, rev, ns) for k, v in kinds)


def uses_of(entries: frozenset[Entry]) -> frozenset[Use]:
    """What reusing ``entries`` makes a response depend on."""
    uses = {Use(e.kind.value, e.version) for e in entries}
    uses |= {Use("lora", e.lora) for e in entries if e.lora is not None}
    return frozenset(uses)


@frozen
class Prefill:
    """One way a prefill may go: the endpoint after it, what the response depends on, the
    entries it reused (empty: a miss), and whether it supposes cached KV was dropped."""

    ep: Endpoint
    uses: frozenset[Use]
    reused: frozenset[Entry]
    dropped: bool


def prefills(ep: Endpoint, prefix: str, lora: bool, namespace: int | None) -> list[Prefill]:
    """A hit reuses what the key finds (lower tiers load back to device, draft KV with it:
    ENG-008; kinds missing are computed). A miss computes everything and replaces the key's
    entries; it is always allowed, since any entry may have been evicted."""
    if not ep.config.radix:
        return [Prefill(ep, ep.current(lora), frozenset(), False)]
    found = lookup(ep, prefix, lora, namespace)
    fresh = computed(ep, prefix, lora, namespace)
    # Only target KV makes a hit: a key that finds nothing else (draft KV left behind by a
    # window's dropped target KV, say) is a miss the system had no choice about.
    hit_possible = any(e.kind is Kind.TARGET for e in found)
    miss = Prefill(
        evolve(ep, cache=(ep.cache - found) | fresh), ep.current(lora), frozenset(), hit_possible
    )
    if not hit_possible:
        return [miss]
    kept = {e.kind for e in found}
    back = {evolve(e, tier=Tier.DEVICE) for e in found} | {e for e in fresh if e.kind not in kept}
    hit = Prefill(
        evolve(ep, cache=(ep.cache - found) | back),
        uses_of(found) | ep.current(lora),
        found,
        False,
    )
    return [hit, miss]


def cache_rule(reused: frozenset[Entry]) -> str:
    """The rule a cache mismatch after a prefill breaks: a load-back is ENG-008's."""
    return RuleId.ENG_008 if any(e.tier is not Tier.DEVICE for e in reused) else RuleId.INV_001


def load(ep: Endpoint, version: int) -> Endpoint:
    """Install ``version`` completely: target, draft (ENG-004), scales (ENG-005), derived
    state (DER-001), label."""
    return evolve(
        ep,
        weights=version,
        torn=False,
        draft=version,
        scales=version,
        derived=version,
        label=version,
    )


def window_dropped(ep: Endpoint) -> Endpoint:
    """WIN-002: KV computed under the mixed weights of a window never outlives it: cached
    entries go, and in-flight requests holding such KV are retracted (their KV freed; they
    recompute under the weights then in force)."""
    requests = tuple(
        evolve(r, uses=frozenset(), retracted=True)
        if any(u.version == MIXED for u in r.uses)
        else r
        for r in ep.requests
    )
    cache = frozenset(e for e in ep.cache if e.version != MIXED)
    return evolve(ep, cache=cache, requests=requests)


def emptied(ep: Endpoint) -> Endpoint:
    """Every tier and kind emptied; a dirty tree is clean. What a clearing pause must do
    (the update after it may skip its own flush), and the start of every flush."""
    return evolve(ep, cache=frozenset(), dirty=False, waived=False, refuse_flush=False)


def is_current(ep: Endpoint, e: Entry) -> bool:
    """``e`` is KV of the weights, lineage and KV format ``ep`` serves now, so reusing it is
    no stale reuse: computed under whole weights of the version in force (the draft's for
    DRAFT KV), with the scales in force (FP8 KV), the LoRA revision loaded, a namespace that
    is none or the version in force, and still backed by memory (not ``MIXED``, not
    ``GARBAGE``, not device KV whose memory is released). An engine's own lineage and KV
    format are fixed for a run (``Config``); a shared store's entries carry theirs
    (STO-001)."""
    if ep.torn or e.version in (MIXED, GARBAGE):
        return False
    if ep.config.fp8_kv and ep.scales != ep.weights:
        return False
    if e.tier is Tier.DEVICE and ep.kv_released:
        return False
    version = ep.draft if e.kind is Kind.DRAFT else ep.weights
    lora_ok = e.lora is None or e.lora == ep.lora
    return e.version == version and lora_ok and e.namespace in (None, ep.weights)


def flushed(ep: Endpoint) -> Endpoint:
    """A completed flush (ENG-003, FC-003): every entry of other weights, lineage or KV
    format removed, on every tier and of every kind; an entry of the weights in force
    (``is_current``) may stay, as a storage tier keyed by version keeps it (nothing stale
    survives). A dirty tree is clean."""
    return evolve(emptied(ep), cache=frozenset(e for e in ep.cache if is_current(ep, e)))


def restarted_cache(before: Endpoint, after: Endpoint) -> frozenset[Entry]:
    """What may survive a restart (ENG-010): the entries of ``before`` (the endpoint as the
    process ended) that are of the weights, lineage and format the restarted endpoint
    ``after`` serves, on any tier (a disk tier reopened, a store outside the process).
    Device KV whose memory was released is gone."""
    kept = (e for e in before.cache if not (e.tier is Tier.DEVICE and before.kv_released))
    return frozenset(e for e in kept if is_current(after, e))


def invalidated(ep: Endpoint, version: int) -> Endpoint:
    """A required invalidation by ``version``: deleted, or moved out of reach by namespace
    (an entry keyed by an older version is reachable only by a request pinned to it, and
    that reuse is judged when it happens)."""
    unreachable = frozenset(
        e for e in ep.cache if e.namespace is not None and e.namespace != version
    )
    return evolve(emptied(ep), cache=unreachable)


def derived_dropped(ep: Endpoint) -> Endpoint:
    """ENG-012: encoder outputs keyed without a weight version follow every update."""
    keep = frozenset(e for e in ep.cache if e.kind is not Kind.ENCODER or e.namespace is not None)
    return evolve(ep, cache=keep)


def encoder_kept(before: Endpoint, after: Endpoint) -> Endpoint:
    """``after`` with ``before``'s encoder outputs back, where the engine leaves the encoder
    cache to the client (``Config.encoder_reset_separate``: vLLM's prefix reset and weight
    reload do not touch it; ``reset_encoder_cache`` does)."""
    if not before.config.encoder_reset_separate:
        return after
    kept = frozenset(e for e in before.cache if e.kind is Kind.ENCODER)
    return evolve(after, cache=after.cache | kept)


def evictable(ep: Endpoint, prefix: str) -> frozenset[Entry]:
    """A prefix's device KV (target and draft) that can move to a lower tier."""
    return frozenset(
        e
        for e in ep.cache
        if e.prefix == prefix and e.tier is Tier.DEVICE and e.kind is not Kind.ENCODER
    )
