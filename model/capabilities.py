"""What an adapter can show or do: the ``Capability`` words and the one table of what each
unlocks.

An engine adapter declares a set of capabilities. The checker draws an action only when the
adapter declares the capability that unlocks it, and a rule counts as exercised only when the
adapter declares every capability its evidence needs; otherwise the rule is SKIP, with the
missing capability named as the reason (ADP rules: a checker that cannot see never passes).

Every other copy (the lockstep's drawable actions, the runner's SKIP reasons, replay's
recorded capabilities, the strategies' config features, the docs table) is derived from
``TABLE`` here.
"""

from __future__ import annotations

from enum import Enum

from attrs import frozen

from .rules import RuleId


class Capability(str, Enum):
    """One thing an adapter can observe or do. A ``str`` subclass: ``"cache_probe"`` and
    ``Capability.CACHE_PROBE`` are equal and hash alike, so sets of either mix."""

    WEIGHTS_PROBE = "weights_probe"
    CACHE_PROBE = "cache_probe"
    EXACT_CACHE = "exact_cache"
    PROVENANCE = "provenance"
    ATTRIBUTION = "attribution"
    BYTE_ORACLE = "byte_oracle"
    FLUSH_RESULT = "flush_result"
    FAULTS = "faults"
    INFLIGHT = "inflight"
    PAUSE = "pause"
    SLEEP = "sleep"
    RESTART = "restart"
    EXACT_LANE = "exact_lane"
    TIERS = "tiers"
    DRAFT = "draft"
    ENCODER = "encoder"
    FP8_KV = "fp8_kv"
    LORA = "lora"
    NAMESPACES = "namespaces"
    # the RL lifecycle: memory tags, publishing, clearing at pause
    MEMORY_TAGS = "memory_tags"
    PUBLISH = "publish"
    PAUSE_CLEAR = "pause_clear"
    TWO_PHASE = "two_phase"
    DERIVED = "derived"
    RESTART_ORACLE = "restart_oracle"
    ENCODER_RESET = "encoder_reset"
    # deployments
    RANKS = "ranks"
    STORE = "store"
    ROLES = "roles"
    ROUTER = "router"


@frozen
class Unlocks:
    """What one capability gives the checker.

    ``text``: what the adapter must do to declare it. ``actions``: action type names that
    are drawn only for adapters declaring it. ``config``: it is a config feature the SUT can
    be started with (endpoints drawn with it on).
    """

    text: str
    actions: tuple[str, ...] = ()
    config: bool = False
    fields: tuple[tuple[str, str], ...] = ()
    """``(action type name, field)``: a value other than the field's default is drawn only
    for adapters declaring it (a partial Sleep, a pause that clears the cache)."""


C = Capability

TABLE: dict[Capability, Unlocks] = {
    C.WEIGHTS_PROBE: Unlocks("View.weights/draft/scales/label after each action"),
    C.CACHE_PROBE: Unlocks("View.cache: every cache entry with its version and tier"),
    C.EXACT_CACHE: Unlocks("the SUT never evicts on its own, so a miss is as telling as a hit"),
    C.PROVENANCE: Unlocks("Response.uses: the versions the reused KV was computed under"),
    C.ATTRIBUTION: Unlocks("Response.sampled: the versions the SUT attributes to a response"),
    C.BYTE_ORACLE: Unlocks("Response.output and Response.cold (a cold prefill's bytes)"),
    C.FLUSH_RESULT: Unlocks("Observation.flushed: the flush call's reported result"),
    C.FAULTS: Unlocks(
        "faults can be injected",
        actions=(
            "FaultRefuseFlush",
            "FaultUpdateFailsMidway",
            "FaultChunkFails",
        ),
    ),
    C.INFLIGHT: Unlocks("requests can stay in flight", actions=("StartRequest", "FinishRequest")),
    C.PAUSE: Unlocks(
        "pause and continue are supported", actions=("PauseGeneration", "ContinueGeneration")
    ),
    C.SLEEP: Unlocks("sleep and wake up are supported", actions=("Sleep", "WakeUp")),
    C.RESTART: Unlocks("restart is supported", actions=("Restart",)),
    C.EXACT_LANE: Unlocks("endpoints can run an exact lane (rl_on_policy_target)", config=True),
    C.TIERS: Unlocks(
        "a hierarchical cache (host, storage tiers)", actions=("EvictPrefix",), config=True
    ),
    C.DRAFT: Unlocks("a speculative draft model with its own KV", config=True),
    C.ENCODER: Unlocks("a multimodal encoder cache", config=True),
    C.FP8_KV: Unlocks("KV stored in FP8 with per-version scales", config=True),
    C.LORA: Unlocks(
        "one LoRA adapter, reloadable in place under its name", actions=("LoadLora",), config=True
    ),
    C.NAMESPACES: Unlocks(
        "requests may carry a namespace (vLLM cache_salt, SGLang extra_key) and are drawn "
        "pinned to any version up to the one in force"
    ),
    # the RL lifecycle: memory tags, publishing, clearing at pause
    C.MEMORY_TAGS: Unlocks(
        "Sleep and WakeUp take tags (kv_cache, weights): SGLang release/resume_memory_"
        "occupation tags, vLLM /wake_up?tags=; the colocated order updates or flushes with "
        "the KV released (UpdateWeights, FlushCache drawn asleep)",
        fields=(("Sleep", "tags"), ("WakeUp", "tags")),
    ),
    C.PUBLISH: Unlocks(
        "a label-only version publish (/update_weight_version), with its abort option",
        actions=("PublishVersion",),
    ),
    C.PAUSE_CLEAR: Unlocks(
        "pause clears the prefix cache on request (vLLM /pause?clear_cache=)",
        fields=(("PauseGeneration", "clear_cache"),),
    ),
    # two-phase updates, derived weight state, restart oracle
    C.TWO_PHASE: Unlocks(
        "two-phase updates: begin, chunks, finish (publishing the version) and abort",
        actions=(
            "BeginWeightUpdate",
            "UpdateWeightChunk",
            "FinishWeightUpdate",
            "AbortWeightUpdate",
        ),
    ),
    C.DERIVED: Unlocks(
        "state derived from the weights at load time (post-load caches, repacked operands), "
        "shown as View.derived when the engine can",
        config=True,
    ),
    C.RESTART_ORACLE: Unlocks(
        "Response.fresh: the output of the same prompt from an engine freshly started at the "
        "version the endpoint claims to serve"
    ),
    C.ENCODER_RESET: Unlocks(
        "an update leaves the encoder cache to the client, which resets it on its own "
        "(vLLM reset_encoder_cache; profile field encoder_reset_separate)"
    ),
    C.RANKS: Unlocks(
        "endpoints with data-parallel ranks (Config.ranks > 1): a request placed on a rank, "
        "a flush, update or pause fanned out to every rank and answered with the merge, "
        "FaultRankUpdateFails",
        actions=("FaultRankUpdateFails",),
    ),
    C.STORE: Unlocks(
        "endpoints attached to a KV store shared across endpoints and restarts "
        "(Config.store): Response.stored, the store entry a prefill loaded, with the "
        "lineage, version and KV format that computed it"
    ),
    C.ROLES: Unlocks(
        "prefill/decode deployments (Config.role): a request admitted on a decode endpoint "
        "whose KV the prefill endpoint computes and transfers, live until it finishes"
    ),
    C.ROUTER: Unlocks(
        "workers behind a router (Config.router): LeaveRotation and EnterRotation, the "
        "router's answer to putting a worker back, traffic only to workers in rotation",
        actions=("LeaveRotation", "EnterRotation"),
    ),
}
"""Capability -> what it unlocks: the single source."""

PROFILE_CAPABILITIES: dict[Capability, str] = {C.ENCODER_RESET: "encoder_reset_separate"}
"""Capability -> the profile field (``state.PROFILE_FIELDS``) of the engines that declare it,
and only they: a rule whose evidence needs one is an obligation only on such engines, so
elsewhere it is N/A (not at stake), no gap in the run and no MUST-SKIP warning. An engine
whose profile sets the field must declare the capability (ADP-002 otherwise)."""

DEPLOYMENT_CAPABILITIES: dict[Capability, str] = {
    C.RANKS: "endpoints with data-parallel ranks",
    C.STORE: "endpoints sharing a KV store",
    C.ROLES: "prefill/decode deployments",
    C.ROUTER: "workers behind a router",
}
"""Capability -> the deployment shape of the engines that declare it, and only they: a rule
whose evidence needs one binds only such engines, so elsewhere it is N/A (not at stake), as
for ``PROFILE_CAPABILITIES``."""

NEEDED_BY_ACTION: dict[str, Capability] = {
    name: cap for cap, unlocks in TABLE.items() for name in unlocks.actions
}
"""Action type name -> the capability an adapter must declare before it is drawn."""

NEEDED_BY_FIELD: dict[tuple[str, str], Capability] = {
    f: cap for cap, unlocks in TABLE.items() for f in unlocks.fields
}
"""``(action type name, field)`` -> the capability a non-default value of it needs."""


ASLEEP_NEEDS_TAGS = ("UpdateWeights", "FlushCache")
"""Actions drawn on an ASLEEP endpoint only for adapters declaring ``memory_tags``: the
colocated order (an update or flush with the KV released) is that capability's, so an
adapter that only sleeps and wakes whole is never sent a flush while asleep."""


def needed(action: object, asleep: bool = False) -> frozenset[Capability]:
    """Every capability an adapter must declare before ``action`` is drawn for it: its
    type's, that of each field holding a value other than the field's default, and
    ``memory_tags`` for an update or flush of an endpoint that is ``asleep``."""
    cls = type(action)
    plan = _NEEDS.get(cls)
    if plan is None:
        plan = _NEEDS[cls] = _needs_plan(cls)
    base, by_field, tags_if_asleep = plan
    extra = [cap for name, default, cap in by_field if getattr(action, name) != default]
    if asleep and tags_if_asleep:
        extra.append(Capability.MEMORY_TAGS)
    return base.union(extra) if extra else base


def _needs_plan(cls: type) -> _NeedsPlan:
    """What ``needed`` reads for an action type, looked up once: the type's own capability,
    each ``(field, default, capability)`` of ``NEEDED_BY_FIELD``, and whether an asleep
    endpoint adds ``memory_tags``."""
    from attrs import fields as attrs_fields

    name = cls.__name__
    base = frozenset({NEEDED_BY_ACTION[name]} if name in NEEDED_BY_ACTION else ())
    by_field = tuple(
        (f.name, f.default, NEEDED_BY_FIELD[(name, f.name)])
        for f in attrs_fields(cls)
        if (name, f.name) in NEEDED_BY_FIELD
    )
    return base, by_field, name in ASLEEP_NEEDS_TAGS


_NeedsPlan = tuple[frozenset[Capability], tuple[tuple[str, object, Capability], ...], bool]
_NEEDS: dict[type, _NeedsPlan] = {}


EVIDENCE: dict[str, tuple[Capability, ...]] = {
    RuleId.ENG_001: (C.EXACT_LANE, C.CACHE_PROBE),
    RuleId.ENG_002: (C.CACHE_PROBE,),
    RuleId.ENG_003: (C.CACHE_PROBE,),
    RuleId.ENG_004: (C.DRAFT, C.WEIGHTS_PROBE),
    RuleId.ENG_005: (C.FP8_KV, C.WEIGHTS_PROBE),
    RuleId.ENG_006: (C.SLEEP, C.CACHE_PROBE),
    RuleId.ENG_007: (C.LORA, C.CACHE_PROBE),
    RuleId.ENG_008: (C.TIERS, C.CACHE_PROBE),
    RuleId.ENG_009: (C.PAUSE, C.INFLIGHT),
    RuleId.ENG_010: (C.RESTART, C.CACHE_PROBE),
    RuleId.ENG_011: (C.EXACT_CACHE, C.CACHE_PROBE),
    RuleId.ENG_012: (C.ENCODER, C.CACHE_PROBE),
    RuleId.FC_001: (C.INFLIGHT,),
    RuleId.FC_002: (C.INFLIGHT,),
    RuleId.FC_003: (C.FLUSH_RESULT, C.INFLIGHT),
    RuleId.FC_004: (C.FAULTS,),
    # a flush while a request holds KV (a live transfer on a P/D deployment)
    RuleId.FC_005: (C.INFLIGHT,),
    RuleId.INV_002: (C.ATTRIBUTION, C.INFLIGHT, C.PAUSE),
    RuleId.INV_003: (C.WEIGHTS_PROBE,),
    RuleId.INV_004: (C.BYTE_ORACLE, C.EXACT_LANE),
    RuleId.LIV_001: (C.INFLIGHT,),
    RuleId.MEM_001: (C.SLEEP, C.MEMORY_TAGS),
    RuleId.MEM_002: (C.SLEEP, C.CACHE_PROBE),
    RuleId.PUB_001: (C.PUBLISH, C.WEIGHTS_PROBE),
    RuleId.PUB_002: (C.PUBLISH, C.INFLIGHT),
    RuleId.REACH_002: (C.EXACT_LANE,),
    RuleId.REACH_003: (C.INFLIGHT,),
    RuleId.WIN_001: (C.TWO_PHASE, C.WEIGHTS_PROBE),
    RuleId.WIN_002: (C.TWO_PHASE, C.CACHE_PROBE),
    RuleId.WIN_003: (C.TWO_PHASE, C.FAULTS),
    RuleId.DER_001: (C.DERIVED,),
    RuleId.CLI_009: (C.ENCODER, C.ENCODER_RESET),
    # A refused reset inside a sync comes reliably only from an injected refusal: running
    # requests on a real engine refuse one by chance within a ci budget (vLLM: never in 25).
    RuleId.CLI_010: (C.INFLIGHT, C.FAULTS),
    # A failed update inside a sync, as a refused reset: an injected fault or a refused flush.
    RuleId.CLI_014: (C.INFLIGHT, C.FAULTS),
    # An aborted request exists only where requests stay in flight and a pause aborts them.
    RuleId.CLI_012: (C.PAUSE, C.INFLIGHT),
    # data-parallel ranks: a refusing rank needs a request in flight on it; a torn update
    # needs a rank's injected failure
    RuleId.RNK_001: (C.RANKS, C.FLUSH_RESULT, C.INFLIGHT),
    RuleId.RNK_002: (C.RANKS, C.FAULTS, C.WEIGHTS_PROBE),
    RuleId.RNK_003: (C.RANKS, C.FAULTS, C.INFLIGHT),
    # a shared store: the entry a prefill loaded, shown with what computed it
    RuleId.STO_001: (C.STORE,),
    # a P/D deployment: the request's status and what its transferred KV was computed with
    RuleId.PD_001: (C.ROLES, C.INFLIGHT),
    # workers behind a router: the router's answer to putting a worker back
    RuleId.RTR_001: (C.ROUTER,),
}
"""Rule ID -> the capabilities its evidence needs; an adapter lacking one gets SKIP."""

CONFIG_FEATURES: tuple[Capability, ...] = tuple(c for c, u in TABLE.items() if u.config)
"""Capabilities that are config features an endpoint can be started with."""


def parse(names: object) -> frozenset[Capability]:
    """An adapter's declared capabilities as ``Capability`` values.

    Raises ``ValueError`` naming the first unknown name, or saying what the value is when it
    is not a set of strings (a typo would otherwise silently turn rules into SKIP)."""
    if not isinstance(names, (set, frozenset)) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"capabilities {names!r:.80} is not a set of names")
    unknown = sorted(n for n in names if n not in {c.value for c in Capability})
    if unknown:
        known = ", ".join(c.value for c in Capability)
        raise ValueError(f"unknown capabilities {unknown}; known: {known}")
    return frozenset(Capability(n) for n in names)


__all__ = [
    "ASLEEP_NEEDS_TAGS",
    "CONFIG_FEATURES",
    "DEPLOYMENT_CAPABILITIES",
    "EVIDENCE",
    "NEEDED_BY_ACTION",
    "NEEDED_BY_FIELD",
    "TABLE",
    "Capability",
    "Unlocks",
    "needed",
    "parse",
]
