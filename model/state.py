"""The state of the spec: endpoints, their caches and requests, the client policy, the ledger.

Everything here is a frozen attrs value, so a state can be hashed, compared and kept in a
set by the explorer. Weight versions are small non-negative ints (``0`` is the initial
policy); ``GARBAGE`` tags KV whose memory is gone.

What is NOT modelled, and why:

* Token-level content. A cache entry is one prefix; whether it hits is all-or-nothing.
  Partial hits change counts, not the question "was any reused KV stale".
* Eviction under memory pressure. Real engines may drop entries at will; the checker treats
  a miss as always allowed and judges only what a hit reused.
* Time. Timeouts are the adapters' business (ADP-001); the model is untimed.
* More than one LoRA adapter: one adapter, reloaded under its name, shows the whole fault.
"""

from __future__ import annotations

from attrs import field, frozen

from .fast import evolve, identity_eq
from .vocabulary import (
    GARBAGE,
    MIXED,
    CacheMode,
    Funnel,
    Kind,
    Lane,
    MemoryTag,
    PauseMode,
    Phase,
    Role,
    Tier,
)

ServerInfo = tuple[tuple[str, object], ...] | None
"""What ``/get_server_info`` returned, as sorted ``(key, value)`` pairs; ``None`` when the
endpoint could not be reached. Kept raw: parsing it is the client's job (CLI-006)."""


def server_info(**fields: object) -> ServerInfo:
    """Build a ``ServerInfo`` from keyword fields: ``server_info(radix_cache_enabled="on")``."""
    return tuple(sorted(fields.items()))


SCHEDULER_FEATURES = ("draft", "encoder", "fp8_kv", "lora", "derived", "encoder_reset_separate")
"""Config features of one scheduler that a deployment part (ranks, the store, a P/D role, a
router's worker) is not modelled with."""


def _scheduler_features(instance: Config) -> list[str]:
    """The ``SCHEDULER_FEATURES`` (and lower tiers) ``instance`` turns on, by name: what a
    deployment's validator names in its ``ValueError``."""
    on = [f for f in SCHEDULER_FEATURES if getattr(instance, f)]
    return on + (["tiers"] if instance.tiers != frozenset({Tier.DEVICE}) else [])


def _at_least_one_rank(instance: Config, attribute: object, value: object) -> None:
    """``Config.ranks`` is a positive int, and ranks are modelled for the prefix cache and
    lanes alone; ``ValueError`` names the bad value or the feature ranks do not combine with."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Config.ranks={value!r}: expected an int of at least 1")
    if value == 1:
        return
    on = _scheduler_features(instance)
    if on:
        raise ValueError(
            f"Config.ranks={value} with {', '.join(on)}: ranks are modelled "
            "with the radix cache, lanes and profile flags only"
        )


def _plain_store_endpoint(instance: Config, attribute: object, value: object) -> None:
    """An endpoint attached to the shared store is modelled with the radix cache and lanes
    alone, as one scheduler; ``ValueError`` names the feature it does not combine with."""
    if not value:
        return
    on = _scheduler_features(instance)
    on += ["ranks"] if instance.ranks != 1 else []
    if on:
        raise ValueError(
            f"Config.store with {', '.join(on)}: an endpoint on the shared store is "
            "modelled as one scheduler with the radix cache, lanes and profile flags only"
        )


def _plain_role_endpoint(instance: Config, attribute: object, value: object) -> None:
    """An endpoint of a prefill/decode deployment is modelled as one scheduler on the
    standard lane with the radix cache alone, and a decode endpoint with its own radix cache
    off (every prefix it decodes arrives by transfer from the prefill engine);
    ``ValueError`` names the feature it does not combine with. The exact lane's guard may
    abort requests to make its flush possible (CD-08), which the prefill side cannot do to
    a transfer the decode side holds: not modelled."""
    if value is None:
        return
    on = _scheduler_features(instance)
    on += ["ranks"] if instance.ranks != 1 else []
    on += ["store"] if instance.store else []
    on += ["radix"] if value is Role.DECODE and instance.radix else []
    on += ["the exact lane"] if instance.lane is Lane.EXACT else []
    if on:
        raise ValueError(
            f"Config.role={Role(value).value} with {', '.join(on)}: an endpoint of a "
            "prefill/decode deployment is modelled as one scheduler with the radix cache "
            "(off on the decode side), the standard lane and profile flags only"
        )


def _plain_router_worker(instance: Config, attribute: object, value: object) -> None:
    """A worker behind a router is modelled as one scheduler on the standard lane with the
    radix cache and profile flags alone; ``ValueError`` names the feature it does not
    combine with."""
    if not value:
        return
    on = _scheduler_features(instance)
    on += ["ranks"] if instance.ranks != 1 else []
    on += ["store"] if instance.store else []
    on += ["role"] if instance.role is not None else []
    on += ["the exact lane"] if instance.lane is Lane.EXACT else []
    if on:
        raise ValueError(
            f"Config.router with {', '.join(on)}: a worker behind a router is modelled as "
            "one scheduler with the radix cache, the standard lane and profile flags only"
        )


@identity_eq
@frozen(cache_hash=True)
class Config:
    """What an endpoint is; fixed for a run. The fields that say "Profile" (``PROFILE_FIELDS``)
    are what the engine does that the client does not choose: the engine adapter declares
    them for every endpoint."""

    radix: bool = True
    """The radix (prefix) cache is on."""
    lane: Lane = field(default=Lane.STANDARD, converter=Lane)
    """EXACT when ``rl_on_policy_target`` is set (the lane ENG-001 guards), else STANDARD."""
    info: ServerInfo = server_info(radix_cache_enabled=True)
    """The server info it reports (``/get_server_info``); an honest endpoint never reports the
    radix cache off while it is on."""
    tiers: frozenset[Tier] = frozenset({Tier.DEVICE})
    """The tiers its cache spans: HOST and STORAGE beside DEVICE form a hierarchical cache."""
    draft: bool = False
    """It runs a speculative draft model with KV of its own."""
    encoder: bool = False
    """It keeps a multimodal encoder cache."""
    fp8_kv: bool = False
    """Its KV is stored in FP8 with per-version scales."""
    lora: bool = False
    """It serves one LoRA adapter that can be reloaded in place."""
    flush_default: bool = False
    """Profile: what an omitted ``flush_cache`` means on an update (SGLang's
    ``UpdateWeightFromDiskReqInput`` and the seed fork: true; vLLM has no such field: false)."""
    versioned_keys: bool = False
    """Profile: every prefix is keyed by the weight version in force (``cache_salt`` /
    ``extra_key`` equal to it), so KV of older weights is never matched again: invalidation by
    namespace, not deletion (CD-03)."""
    misreports: bool = False
    """Profile: the adapter declares that the server info may lie about the radix flag; INV-001
    is then never waived for it."""
    derived: bool = False
    """The engine keeps state derived from the weights at load time (transposed router gates,
    repacked quantized operands, post-load caches) that every funnel must rebuild (DER-001;
    sgl-project/sglang PR #31937, issue #14158)."""
    encoder_reset_separate: bool = False
    """Profile: an update leaves the encoder cache alone and its reset is a call of its own (vLLM
    ``reset_encoder_cache``): the client owes it (CLI-009), not the engine (ENG-012)."""
    ranks: int = field(default=1, validator=_at_least_one_rank)
    """Its data-parallel ranks (schedulers behind the one endpoint, as SGLang's
    ``--dp-size`` under its DP controller): each has its own weights, radix cache, in-flight
    requests and reply to a flush or an update, and the endpoint's reply is the merge of
    theirs (RNK-001/002). 1: a single scheduler, as every other config."""
    store: bool = field(default=False, validator=_plain_store_endpoint)
    """It is attached to the deployment's shared KV store (``State.store``: Mooncake,
    LMCache, SGLang HiCache's L3 backend, lmdeploy's cache server): every prefix it serves
    is stored there, and a prefill that misses its own radix cache may load an entry from
    it, across endpoints and restarts (STO-001). Off: no store, as every other config."""
    lineage: str = "base"
    """The weight lineage it serves (the checkpoint family its versions descend from: the
    model path and the training run); matters only with ``store``."""
    kv_format: str = "bf16"
    """The layout of its KV bytes (dtype, page size, heads per rank); matters only with
    ``store``."""
    role: Role | None = field(
        default=None,
        converter=lambda v: None if v is None else Role(v),
        validator=_plain_role_endpoint,
    )
    """Its part in a prefill/decode deployment (``Role``): the deployment's PREFILL
    endpoint computes each request's KV and transfers it to the DECODE endpoint the request
    was sent to, which decodes under its own weights; each side has its own weight version
    (PD-001), and a transfer is live from its admission on the decode side to its finish
    (FC-005). ``None``: a single endpoint, as every other config."""
    router: bool = field(default=False, validator=_plain_router_worker)
    """It is a worker behind the deployment's router (SGLang's model gateway, sgl-router;
    vLLM's router): the router sends it traffic only while it is in the rotation
    (``Endpoint.rotation``), takes it out (``LeaveRotation``, the gateway's worker removal)
    and puts it back (``EnterRotation``, its worker registration), and fans each control
    call out to it as its own call. Off: no router, as every other config."""

    @property
    def guarded(self) -> bool:
        """ENG-001 applies: exact lane with the radix cache on."""
        return self.lane is Lane.EXACT and self.radix


PROFILE_FIELDS = ("flush_default", "versioned_keys", "misreports", "encoder_reset_separate")
"""The ``Config`` fields an engine adapter declares for every endpoint (its ``profile``)."""


def with_profile(config: Config, profile: object) -> Config:
    """``config`` with the engine's declared ``profile`` (a mapping of ``PROFILE_FIELDS`` to
    bools) applied; ``ValueError`` names a field that is not a profile field or not a bool."""
    if not profile:
        return config
    if not isinstance(profile, dict):
        raise ValueError(f"profile {profile!r:.80} is not a mapping of Config fields")
    for name, value in profile.items():
        if name not in PROFILE_FIELDS or not isinstance(value, bool):
            raise ValueError(
                f"profile field {name!r}={value!r}: expected one of {', '.join(PROFILE_FIELDS)}"
                " with a bool"
            )
    return evolve(config, **profile)


@identity_eq
@frozen(cache_hash=True)
class Entry:
    """One cache entry: the KV (or encoder output) of one prefix. The lookup key is
    ``(prefix, kind, lora, namespace)``; ``version`` is provenance, never part of the key."""

    prefix: str
    """The prompt prefix whose KV (or encoder output) it holds."""
    kind: Kind = Kind.TARGET
    """What computed it: the target model, the draft model, or the encoder."""
    tier: Tier = Tier.DEVICE
    """Where it lives: DEVICE, or a lower tier (HOST, STORAGE) of a hierarchical cache."""
    version: int = 0
    """The weight version that computed it (the draft's for DRAFT KV), ``MIXED`` under a window's
    mixed weights, ``GARBAGE`` once its memory is gone; provenance, never part of the key."""
    lora: int | None = None
    """The LoRA adapter revision it was computed under; ``None`` for the base model."""
    namespace: int | None = None
    """The weight version its key names (vLLM ``cache_salt``, SGLang ``extra_key``, a storage
    tier's key prefix); ``None`` when the key names none."""

    def __str__(self) -> str:
        """``P target KV of v0 on device`` (``of garbage`` when the memory is gone)."""
        made = {GARBAGE: "garbage", MIXED: "mixed weights"}.get(self.version, f"v{self.version}")
        lora = "" if self.lora is None else f" (LoRA revision {self.lora})"
        ns = "" if self.namespace is None else f" in namespace v{self.namespace}"
        return f"{self.prefix} {self.kind.value} KV of {made} on {self.tier.value}{lora}{ns}"


@identity_eq
@frozen(cache_hash=True)
class StoreEntry:
    """One entry of the shared KV store: the KV of one prefix, with what computed it. The
    store matches on what its keys carry (the engine's business: the prompt's tokens, and
    the model, lineage, version, format or a namespace when it puts them in); the spec
    allows a load only where all three of ``lineage``, ``version`` and ``kv_format`` are
    those of the engine loading it (STO-001)."""

    prefix: str
    """The prompt prefix whose KV it holds."""
    lineage: str
    """The weight lineage of the engine that stored it (``Config.lineage``)."""
    version: int
    """The weight version that computed it."""
    kv_format: str
    """The KV format it was stored in (``Config.kv_format``)."""

    def __str__(self) -> str:
        """``P KV of v0 (lineage base, bf16)``."""
        return f"{self.prefix} KV of v{self.version} (lineage {self.lineage}, {self.kv_format})"


@identity_eq
@frozen(cache_hash=True)
class Use:
    """One piece of state a response depended on: ``(component, version)``. Used to judge
    NoStalePrefixReuse (INV-001)."""

    component: str
    """What was depended on: ``target``, ``draft`` or ``encoder`` KV, the ``lora`` revision, or
    the FP8 ``scales``."""
    version: int
    """The version of that component (``GARBAGE``, ``MIXED`` as for ``Entry.version``)."""


@identity_eq
@frozen(cache_hash=True)
class Request:
    """An in-flight request. ``holds_kv``: it pins cache memory, so a flush is refused
    (LIV-001)."""

    rid: str
    """Its request ID, unique among the endpoint's in-flight requests."""
    prefix: str
    """The prompt prefix it was admitted with."""
    lora: bool = False
    """It is served through the LoRA adapter."""
    sampled: frozenset[int] = frozenset()
    """The weight versions that have sampled its tokens so far (INV-002)."""
    uses: frozenset[Use] = frozenset()
    """What its held KV depends on; empty once retracted (its KV was freed)."""
    namespace: int | None = None
    """The namespace it is pinned to, as its StartRequest carried; ``None``: none."""
    retracted: bool = False
    """A retracting pause freed its KV: it recomputes on resume and pins no memory."""

    @property
    def holds_kv(self) -> bool:
        return not self.retracted


@identity_eq
@frozen(cache_hash=True)
class Served:
    """One completed response in the ledger: what it was computed with and what was in
    force, for INV-001 and INV-002."""

    endpoint: int
    """The index of the endpoint that served it."""
    prefix: str
    """Its prompt prefix."""
    weights: int
    """The target version that computed its last tokens."""
    uses: frozenset[Use]
    """Every piece of cached state it attended to."""
    current: frozenset[Use]
    """The versions in force when it was served, by component."""
    sampled: frozenset[int]
    """The weight versions that sampled its tokens."""
    hit: bool
    """It reused cached KV."""
    exact: bool
    """It was served on an exact lane with the radix cache on (``Config.guarded``)."""
    waived: bool
    """The endpoint is on a standard lane and its last update skipped the flush at the caller's
    request: INV-001's waiver, for prefix KV only."""
    rid: str | None = None
    """Its request ID when it was admitted by StartRequest; ``None`` for a ServeRequest."""
    pinned: bool = False
    """The request was pinned to the namespace of older weights (no waiver covers its reuse)."""
    off_policy: bool = False
    """Pinned under a policy that declares off-policy sessions: its reuse is reported, not
    failed."""

    @property
    def stale(self) -> frozenset[Use]:
        """The uses that were not current when it was served."""
        return self.uses - self.current

    @property
    def unwaived(self) -> frozenset[Use]:
        """The stale uses INV-001 forbids: the waiver covers prefix KV (target and draft KV,
        and the FP8 scales it was stored with) on a standard lane only; cached encoder
        outputs and LoRA revisions are never waived (ENG-012, ENG-007)."""
        if self.off_policy:
            return frozenset()
        if self.waived and not self.exact and not self.pinned:
            # An in-flight request's encoder output went into its KV at prefill time.
            prefix_kv = ("target", "draft", "scales", *(("encoder",) if self.rid else ()))
            return frozenset(u for u in self.stale if u.component not in prefix_kv)
        return self.stale


@identity_eq
@frozen(cache_hash=True)
class OpenUpdate:
    """An open two-phase update window (BeginWeightUpdate .. Finish/AbortWeightUpdate). The
    funnel is the system's business: no rule of the spec depends on it."""

    version: int
    """The target version the window installs."""
    landed: bool = False
    """Some chunk has arrived, in the live parameters (mixed from then on: ``Endpoint.torn``) or
    staged aside (CD-14: a forward that differs from the old version's is WIN-001's)."""
    failed: bool = False
    """A chunk failed: the finish must report failure and publish nothing (WIN-003)."""
    from_torn: bool = False
    """The window opened on torn weights: mixed from the start, and a rollback returns to them,
    closed (FC-002), not to a whole version."""


@identity_eq
@frozen(cache_hash=True)
class Endpoint:
    """One endpoint's dynamic state."""

    config: Config = Config()
    """What the endpoint is; fixed for the run."""
    phase: Phase = Phase.SERVING
    """Its lifecycle phase (``lifecycle.TABLE`` says what may run in it)."""
    pause: PauseMode | None = None
    """The mode of the PauseGeneration that paused it; ``None`` when not paused."""
    weights: int = 0
    """The last target version completely loaded."""
    torn: bool = False
    """A failed bucketed update left some tensors of a newer version in place; inside an open
    window once a chunk landed: the live weights are mixed (``MIXED``)."""
    draft: int = 0
    """The version of the draft model's weights."""
    scales: int = 0
    """The version of the FP8 KV scales in force."""
    lora: int = 0
    """The revision of the LoRA adapter's bytes."""
    label: int | None = 0
    """The weight-version label it reports; ``None``: it reports none."""
    cache: frozenset[Entry] = frozenset()
    """Every entry it MAY hold: an upper bound (any entry may vanish at any time, and a miss is
    always allowed)."""
    requests: tuple[Request, ...] = ()
    """Its in-flight requests, in admission order."""
    dirty: bool = False
    """An update changed the weights but its flush could not complete: closed (FC-002) until
    flushed."""
    waived: bool = False
    """The last completed update skipped the flush at the caller's request on a standard lane."""
    refuse_flush: bool = False
    """An injected fault (FaultRefuseFlush), consumed by the next flush attempt."""
    released: frozenset[MemoryTag] = frozenset()
    """The device memory a Sleep released and no WakeUp resumed yet; ASLEEP while not empty."""
    cleared: bool = False
    """Paused by a PauseGeneration with ``clear_cache`` and nothing computed since, so an update
    may skip its own flush (flush at pause, vLLM ``/pause?clear_cache=true``)."""
    derived: int = 0
    """The version of the state derived from the weights at load time (DER-001)."""
    update: OpenUpdate | None = None
    """The open two-phase update window, if any; the endpoint may serve under mixed weights
    inside it (WIN-001)."""
    fail_chunk: bool = False
    """An injected fault (FaultChunkFails), consumed by the next chunk."""
    ranks: tuple[Endpoint, ...] = ()
    """Its data-parallel ranks when ``config.ranks`` > 1, rank k at ``ranks[k]``: each a
    single-scheduler ``Endpoint`` with its own weights, radix cache and in-flight requests;
    empty for a single scheduler. The endpoint's own fields are then the merge of its ranks
    (``semantics.ranked``): the union of their caches and requests, the oldest of their
    weights, its own label, ``torn`` while closed until an update completes on every rank."""
    fail_update: bool = False
    """An injected fault (FaultRankUpdateFails) on a rank: its next update fails and leaves
    it at its old weights with its cache; consumed by that update."""
    rotation: bool = True
    """In the router's rotation: the router sends it traffic (only with ``config.router``;
    always True elsewhere). RTR-001: it leaves before an update it takes while serving, and
    re-enters only once its sync settled (``semantics.settled``)."""

    @property
    def kv_released(self) -> bool:
        """The KV memory is released: the flush of an update has no pool to touch."""
        return MemoryTag.KV_CACHE in self.released

    @property
    def weights_released(self) -> bool:
        """The weights' memory is released: nothing may write them (no update)."""
        return MemoryTag.WEIGHTS in self.released

    @property
    def in_window(self) -> bool:
        """A two-phase window is open and no chunk of it has failed."""
        return self.update is not None and not self.update.failed

    @property
    def closed(self) -> bool:
        """FC-002: nothing may be served (torn weights, or a stale tree not yet flushed).
        Mixed weights inside an open window are not closed: WIN-001 lets the endpoint
        serve under them or refuse."""
        return (self.torn and not self.in_window) or self.dirty

    @property
    def live(self) -> int:
        """The target weights a forward computes with now: ``MIXED`` inside a window once
        a chunk landed, else ``weights``."""
        return MIXED if self.torn and self.in_window else self.weights

    @property
    def kv_held(self) -> bool:
        """Some request pins KV, so a flush must be refused (LIV-001)."""
        return any(r.holds_kv for r in self.requests)

    def current(self, lora: bool = False) -> frozenset[Use]:
        """The versions in force, per component: what a fresh computation depends on
        (the LoRA revision only for a request served through the adapter)."""
        # Inside a window with mixed weights a forward is under no version: KV of the old
        # whole weights and of the mixed ones are both as current as anything (WIN-001 keeps
        # such a response unlabelled; WIN-002 keeps its KV from outliving the window).
        lives = {self.live, self.weights}
        uses = {Use("target", v) for v in lives}
        if self.config.encoder:
            uses |= {Use("encoder", v) for v in lives}
        if self.config.draft:
            uses.add(Use("draft", self.draft))
        if self.config.fp8_kv:
            uses |= {Use("scales", v) for v in lives}
        if lora:
            uses.add(Use("lora", self.lora))
        return frozenset(uses)

    def request(self, rid: str) -> Request:
        for r in self.requests:
            if r.rid == rid:
                return r
        raise KeyError(f"no in-flight request {rid!r}")


@identity_eq
@frozen(cache_hash=True)
class Policy:
    """The client's sync policy."""

    mode: CacheMode = field(default=CacheMode.AUTO, converter=CacheMode)
    """The client's ``cache_invalidation_mode``: auto, flush or none."""
    flush_cache: bool | None = None
    """An explicit ``flush_cache`` the client is configured with; ``None`` when not given."""
    pause_mode: PauseMode = field(default=PauseMode.RETRACT, converter=PauseMode)
    """The configured ``pause_mode`` of the client's pauses."""
    off_policy_sessions: bool = False
    """The RL framework declares that a continuing session may keep reusing KV of the weights it
    started under (PrimeIntellect-ai/prime-rl PR #2266): such reuse is reported, not failed."""


@identity_eq
@frozen(cache_hash=True)
class Bounds:
    """How far the model may go: the explorer's search bounds and the machine's draw pool.

    Bounds are the search's, not the spec's: no guard reads them. ``semantics.within`` is
    the one place they are applied.
    """

    prefixes: tuple[str, ...] = ("P", "Q")
    """Prompt prefixes shared across requests (so reuse happens)."""
    rids: tuple[str, ...] = ("r1", "r2")
    """Request IDs available for in-flight requests."""
    versions: int = 2
    """The newest weight version the trainer may produce."""
    lora_revisions: int = 2
    """The newest LoRA revision."""
    namespaces: bool = False
    """Requests may be pinned to a namespace (any version up to the one in force); off, every
    request carries none."""
    funnels: tuple[Funnel, ...] = tuple(Funnel)
    """The weight-update funnels an update action may name (the reduced search keeps one:
    ``symmetry.funnel_bounds``)."""


@identity_eq
@frozen(cache_hash=True)
class State:
    """The whole system: endpoints, client policy, trainer version and the ledger."""

    endpoints: tuple[Endpoint, ...]
    """Every endpoint's state, by index."""
    policy: Policy = Policy()
    """The client's sync policy."""
    trainer: int = 0
    """The newest weight version the trainer has pushed anywhere."""
    ledger: tuple[Served, ...] = ()
    """Every response served, in order (``Served``)."""
    store: frozenset[StoreEntry] = frozenset()
    """Every entry the shared KV store MAY hold (an upper bound, as an endpoint's cache):
    written by every endpoint with ``Config.store``, read by any of them, kept across their
    restarts, flushes and updates. Empty in every deployment without one."""

    def endpoint(self, index: int) -> Endpoint:
        return self.endpoints[index]

    def prefill_index(self) -> int | None:
        """The index of the deployment's prefill endpoint (the first with
        ``Config.role`` PREFILL), which computes the KV of every request a decode endpoint
        admits; ``None`` where there is none."""
        for i, ep in enumerate(self.endpoints):
            if ep.config.role is Role.PREFILL:
                return i
        return None

    def with_endpoint(self, index: int, endpoint: Endpoint) -> State:
        endpoints = list(self.endpoints)
        endpoints[index] = endpoint
        return evolve(self, endpoints=tuple(endpoints))

    def without_ledger(self) -> State:
        """The state the explorer deduplicates on: the ledger only grows."""
        return evolve(self, ledger=())


def initial_endpoint(config: Config) -> Endpoint:
    """An endpoint serving version 0 with empty caches; with ``config.ranks`` > 1, as many
    ranks, each a single scheduler of the same config."""
    if config.ranks == 1:
        return Endpoint(config=config)
    rank = Endpoint(config=evolve(config, ranks=1))
    return Endpoint(config=config, ranks=(rank,) * config.ranks)


def initial_state(configs: tuple[Config, ...], policy: Policy = Policy()) -> State:
    """All endpoints serving version 0 with empty caches."""
    return State(endpoints=tuple(initial_endpoint(c) for c in configs), policy=policy)


__all__ = [
    "GARBAGE",
    "Bounds",
    "Config",
    "Endpoint",
    "Entry",
    "OpenUpdate",
    "Policy",
    "Request",
    "Served",
    "ServerInfo",
    "State",
    "StoreEntry",
    "Use",
    "initial_endpoint",
    "initial_state",
    "server_info",
    "with_profile",
]
