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

from .fast import evolve
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
    Tier,
)

ServerInfo = tuple[tuple[str, object], ...] | None
"""What ``/get_server_info`` returned, as sorted ``(key, value)`` pairs; ``None`` when the
endpoint could not be reached. Kept raw: parsing it is the client's job (CLI-006)."""


def server_info(**fields: object) -> ServerInfo:
    """Build a ``ServerInfo`` from keyword fields: ``server_info(radix_cache_enabled="on")``."""
    return tuple(sorted(fields.items()))


@frozen(cache_hash=True)
class Config:
    """What an endpoint is; fixed for a run.

    ``radix``: the radix (prefix) cache is on. ``lane``: EXACT when ``rl_on_policy_target``
    is set. ``info``: its server info (what it *reports*; an honest endpoint never reports
    the radix cache off while it is on). ``tiers``: tiers its cache spans (HOST and STORAGE
    form a hierarchical cache). ``draft``: a speculative draft model with its own KV.
    ``encoder``: a multimodal encoder cache. ``fp8_kv``: KV stored in FP8 with per-version
    scales. ``lora``: serves one LoRA adapter that can be reloaded in place.

    Engine profile (what the engine does that the client does not choose):
    ``flush_default``: what an omitted ``flush_cache`` means on an update (SGLang's
    ``UpdateWeightFromDiskReqInput`` and the seed fork default it to true; vLLM has no such
    field: false). ``versioned_keys``: the engine keys every prefix by the weight version in
    force (a ``cache_salt`` / ``extra_key`` equal to the version), so KV of older weights can
    never be matched again: invalidation by namespace instead of deletion (CD-03).
    ``misreports``: the adapter declares that the engine's server info may lie about its
    radix flag; INV-001 is then never waived for it (issue 8, F-5).

    ``derived``: the engine keeps state derived from the weights at load time (transposed
    router gates, repacked quantized operands, caches built by a post-load hook), which
    every funnel must rebuild (DER-001; sgl-project/sglang PR #31937, issue #14158).
    ``encoder_reset_separate``: an update leaves the encoder cache alone and the engine
    exposes its reset as a call of its own (vLLM ``reset_encoder_cache`` beside
    ``reset_prefix_cache``): the client owes that reset (CLI-009), not the engine (ENG-012).
    """

    radix: bool = True
    lane: Lane = field(default=Lane.STANDARD, converter=Lane)
    info: ServerInfo = server_info(radix_cache_enabled=True)
    tiers: frozenset[Tier] = frozenset({Tier.DEVICE})
    draft: bool = False
    encoder: bool = False
    fp8_kv: bool = False
    lora: bool = False
    flush_default: bool = False
    versioned_keys: bool = False
    misreports: bool = False
    derived: bool = False
    encoder_reset_separate: bool = False

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


@frozen(cache_hash=True)
class Entry:
    """One cache entry: the KV (or encoder output) of one prefix.

    ``version``: the weight version that computed it (the draft's version for DRAFT KV), or
    ``GARBAGE``. ``lora``: the adapter revision it was computed under; ``None`` for the base
    model. ``namespace``: the weight version its key names (vLLM ``cache_salt``, SGLang
    ``extra_key``, a storage tier's key prefix), ``None`` when the key names no version. The
    lookup key is ``(prefix, kind, lora, namespace)``; ``version`` is provenance, never part
    of the key.
    """

    prefix: str
    kind: Kind = Kind.TARGET
    tier: Tier = Tier.DEVICE
    version: int = 0
    lora: int | None = None
    namespace: int | None = None

    def __str__(self) -> str:
        """``P target KV of v0 on device`` (``of garbage`` when the memory is gone)."""
        made = {GARBAGE: "garbage", MIXED: "mixed weights"}.get(self.version, f"v{self.version}")
        lora = "" if self.lora is None else f" (LoRA revision {self.lora})"
        ns = "" if self.namespace is None else f" in namespace v{self.namespace}"
        return f"{self.prefix} {self.kind.value} KV of {made} on {self.tier.value}{lora}{ns}"


@frozen(cache_hash=True)
class Use:
    """One piece of state a response depended on: ``(component, version)``.

    Components: ``target``/``draft``/``encoder`` KV and ``lora`` revision (what a hit reused),
    ``scales`` (FP8 KV scales in force). Used to judge NoStalePrefixReuse (INV-001).
    """

    component: str
    version: int


@frozen(cache_hash=True)
class Request:
    """An in-flight request.

    ``sampled``: weight versions that have sampled its tokens so far (for INV-002).
    ``uses``: what its held KV depends on; empty once retracted (its KV was freed).
    ``holds_kv``: it pins cache memory, so a flush is refused (LIV-001).
    ``namespace``: the namespace it is pinned to, as its StartRequest carried.
    """

    rid: str
    prefix: str
    lora: bool = False
    sampled: frozenset[int] = frozenset()
    uses: frozenset[Use] = frozenset()
    namespace: int | None = None
    retracted: bool = False

    @property
    def holds_kv(self) -> bool:
        return not self.retracted


@frozen(cache_hash=True)
class Served:
    """One completed response in the ledger.

    ``weights``: the target version that computed its last tokens. ``uses``: every piece of
    cached state it attended to. ``current``: the versions in force when it was served, by
    component. ``sampled``: versions that sampled its tokens. ``hit``: it reused cached KV.
    ``waived``: a standard-lane endpoint whose last update skipped the flush at the
    caller's request (INV-001's waiver, for prefix KV only). ``pinned``: the request was
    pinned to the namespace of older weights (no waiver covers its reuse). ``off_policy``:
    pinned under a policy that declares off-policy sessions (reported, not failed).
    """

    endpoint: int
    prefix: str
    weights: int
    uses: frozenset[Use]
    current: frozenset[Use]
    sampled: frozenset[int]
    hit: bool
    exact: bool
    waived: bool
    rid: str | None = None
    pinned: bool = False
    off_policy: bool = False

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


@frozen(cache_hash=True)
class OpenUpdate:
    """An open two-phase update window (BeginWeightUpdate .. Finish/AbortWeightUpdate).

    ``version``: the target version. ``landed``: some chunk has arrived, in the live
    parameters (they are mixed from then on: ``Endpoint.torn``) or staged aside (CD-14:
    the live weights stay whole; a forward that then differs from the old version's is
    WIN-001's). ``failed``: a chunk
    failed; the finish must then report failure and publish nothing (WIN-003).
    ``from_torn``: the window opened on torn weights (what a failed update or a refused
    finish left): the live weights are mixed from the start, and a rollback returns to
    them, closed (FC-002), not to a whole version. The funnel is the system's business:
    no rule of the spec depends on it.
    """

    version: int
    landed: bool = False
    failed: bool = False
    from_torn: bool = False


@frozen(cache_hash=True)
class Endpoint:
    """One endpoint's dynamic state.

    ``weights``: last completely loaded target version. ``torn``: a failed bucketed update
    left some tensors of a newer version in place. ``draft``/``scales``: versions of the
    draft model and FP8 KV scales. ``lora``: revision of the LoRA adapter's bytes.
    ``label``: the weight-version label it reports. ``cache``: every entry it MAY hold (an
    upper bound: any entry may vanish at any time, and a miss is always allowed).
    ``dirty``: an update changed the weights but its flush could not complete (FC-002
    closes the endpoint). ``waived``: the last
    completed update skipped the flush at the caller's request on a standard lane.
    ``refuse_flush``: an injected fault, consumed by the next flush attempt.

    Memory release (issue #10): ``released`` is the device memory a Sleep released and no
    WakeUp resumed yet (``MemoryTag``s); the phase is ASLEEP while it is not empty.
    ``cleared``: the endpoint is paused by a PauseGeneration with ``clear_cache`` and nothing
    was computed since (PAUSED admits no prefill), so its cache holds nothing an update
    could make stale: an update may then skip its own flush (flush at pause, vLLM
    ``/pause?clear_cache=true``).
    ``derived``: version of the state derived from the weights at load time (DER-001).
    ``update``: the open two-phase update window, if any; inside it, once a chunk landed,
    ``torn`` marks the live weights mixed (``MIXED``) and the endpoint may serve under
    them (WIN-001). ``fail_chunk``: an injected fault, consumed by the next chunk.
    """

    config: Config = Config()
    phase: Phase = Phase.SERVING
    pause: PauseMode | None = None
    weights: int = 0
    torn: bool = False
    draft: int = 0
    scales: int = 0
    lora: int = 0
    label: int | None = 0
    cache: frozenset[Entry] = frozenset()
    requests: tuple[Request, ...] = ()
    dirty: bool = False
    waived: bool = False
    refuse_flush: bool = False
    released: frozenset[MemoryTag] = frozenset()
    cleared: bool = False
    derived: int = 0
    update: OpenUpdate | None = None
    fail_chunk: bool = False

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


@frozen(cache_hash=True)
class Policy:
    """The client's sync policy: ``cache_invalidation_mode``, an explicit ``flush_cache``
    (``None`` when not given) and the configured ``pause_mode``.

    ``off_policy_sessions``: the RL framework declares that a continuing session may keep
    reusing KV of the weights it started under (its requests pinned to that namespace;
    PrimeIntellect-ai/prime-rl PR #2266). Such reuse is then reported, not failed.
    """

    mode: CacheMode = field(default=CacheMode.AUTO, converter=CacheMode)
    flush_cache: bool | None = None
    pause_mode: PauseMode = field(default=PauseMode.RETRACT, converter=PauseMode)
    off_policy_sessions: bool = False


@frozen(cache_hash=True)
class Bounds:
    """How far the model may go: the explorer's search bounds and the machine's draw pool.

    ``prefixes``: prompt prefixes shared across requests (so reuse happens).
    ``rids``: request IDs available for in-flight requests. ``versions``: the newest weight
    version the trainer may produce. ``lora_revisions``: newest LoRA revision.
    ``namespaces``: requests may be pinned to a namespace (any version up to the one in
    force); off, every request carries none. ``funnels``: the weight-update funnels an
    update action may name (the reduced search keeps one: ``symmetry.funnel_bounds``).

    Bounds are the search's, not the spec's: no guard reads them. ``semantics.within`` is
    the one place they are applied.
    """

    prefixes: tuple[str, ...] = ("P", "Q")
    rids: tuple[str, ...] = ("r1", "r2")
    versions: int = 2
    lora_revisions: int = 2
    namespaces: bool = False
    funnels: tuple[Funnel, ...] = tuple(Funnel)


@frozen(cache_hash=True)
class State:
    """The whole system: endpoints, client policy, trainer version and the ledger.

    ``trainer``: the newest weight version the trainer has pushed anywhere.
    ``ledger``: every response served, in order (``Served``).
    """

    endpoints: tuple[Endpoint, ...]
    policy: Policy = Policy()
    trainer: int = 0
    ledger: tuple[Served, ...] = ()

    def endpoint(self, index: int) -> Endpoint:
        return self.endpoints[index]

    def with_endpoint(self, index: int, endpoint: Endpoint) -> State:
        endpoints = list(self.endpoints)
        endpoints[index] = endpoint
        return evolve(self, endpoints=tuple(endpoints))

    def without_ledger(self) -> State:
        """The state the explorer deduplicates on: the ledger only grows."""
        return evolve(self, ledger=())


def initial_state(configs: tuple[Config, ...], policy: Policy = Policy()) -> State:
    """All endpoints serving version 0 with empty caches."""
    return State(endpoints=tuple(Endpoint(config=c) for c in configs), policy=policy)


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
    "Use",
    "initial_state",
    "server_info",
    "with_profile",
]
