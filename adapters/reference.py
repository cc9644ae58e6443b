"""The reference system: a correct SGLang-style endpoint written imperatively, and the
in-process adapter that drives it like a real system.

``ReferenceEndpoint`` is *not* the model: it keeps a mutable radix-cache dict, in-flight
request records and weight versions, and answers SGLang-shaped calls (``generate``,
``update_weights``, ``flush_cache``, ``pause_generation`` ...). Every decision that a public
bug got wrong is one small hook method, so that a mutant (``adapters/mutants.py``) overrides
exactly one hook and nothing else.

Mirrors: SGLang ``python/sglang/srt/managers/scheduler.py`` (``flush_cache`` refuses while
requests are running or queued with KV; ``update_weights_from_*`` with ``flush_cache``),
``mem_cache/radix_cache.py`` (prefix -> KV), HiCache host/storage tiers, and vLLM's
``reset_prefix_cache`` / ``sleep`` / ``wake_up``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from attrs import define, field

from kvfence.model.actions import (
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
    UpdateWeights,
    WakeUp,
)
from kvfence.model.capabilities import Capability
from kvfence.model.observation import Observation, Response, View
from kvfence.model.state import Config, Entry, Use
from kvfence.model.vocabulary import Funnel, Kind, PauseMode, Phase, Status, Tier

from .protocol import AdapterFailure, Unsupported

Key = tuple[str, Kind, "int | None", "int | None"]
"""A radix-cache key: ``(prefix, kind, lora revision or None, namespace or None)``."""


@define
class CachedKV:
    """The KV behind one key: the version that computed it and the tier holding it."""

    version: int
    tier: Tier = Tier.DEVICE
    lora: int | None = None
    namespace: int | None = None


@define
class Request:
    """An in-flight request: its prefix, the versions that sampled it, what its KV used."""

    prefix: str
    lora: bool
    sampled: set[int] = field(factory=set)
    uses: set[Use] = field(factory=set)
    retracted: bool = False
    namespace: int | None = None


@define
class Reply:
    """What one call returned: ``ok`` (HTTP 200 and success), and the call's payload."""

    ok: bool
    hit: bool = False
    uses: frozenset[Use] = frozenset()
    sampled: frozenset[int] = frozenset()
    aborted: frozenset[str] = frozenset()
    flushed: bool | None = None
    message: str = ""
    lost: bool = False
    output: tuple[object, ...] | None = None
    stopped: bool = False


class ReferenceEndpoint:
    """One correct endpoint. Public methods are its API; ``_hooks`` are what mutants change.

    ``exact_cache``: its adapter declares the ``exact_cache`` capability (the endpoint never
    drops an entry on its own, so a miss is as telling as a hit). Off by default: an
    in-process design may drop KV at will; the reference's own tests opt in.

    State: ``weights``/``draft``/``scales``/``lora_rev`` versions, ``label``, ``torn``,
    ``dirty`` (failed closed), ``phase``, ``cache`` (key -> ``CachedKV``), ``requests``
    (rid -> ``Request``), ``refuse_next_flush`` (an injected fault).
    """

    exact_cache: ClassVar[bool] = False
    profile: ClassVar[dict[str, bool]] = {}
    """Engine profile: ``Config`` fields the adapter declares for every endpoint
    (``flush_default``, ``versioned_keys``, ``misreports``); the spec applies them."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.weights = 0
        self.draft = 0
        self.scales = 0
        self.lora_rev = 0
        self.label: int | None = 0
        self.torn = False
        self.dirty = False
        self.waived = False
        self.phase = Phase.SERVING
        self.cache: dict[Key, CachedKV] = {}
        self.requests: dict[str, Request] = {}
        self.refuse_next_flush = False

    # ----- probes ---------------------------------------------------------------------

    def get_server_info(self) -> dict[str, object] | None:
        """SGLang ``GET /get_server_info``; ``None`` models an unreachable endpoint."""
        return None if self.config.info is None else dict(self.config.info)

    def weight_info(self) -> View:
        """vLLM ``/weight_info``-style probe plus a listing of the radix cache."""
        entries = frozenset(
            Entry(key[0], key[1], kv.tier, kv.version, kv.lora, kv.namespace)
            for key, kv in self.cache.items()
        )
        return View(
            weights=None if self.torn else self.weights,
            draft=self.draft if self.config.draft else None,
            scales=self.scales if self.config.fp8_kv else None,
            label=self.label,
            cache=entries,
        )

    @property
    def closed(self) -> bool:
        return self.torn or self.dirty

    # ----- requests -------------------------------------------------------------------

    def current_uses(self, lora: bool = False) -> set[Use]:
        """What freshly computed tokens depend on right now."""
        uses = {Use("target", self.weights)}
        if self.config.draft:
            uses.add(Use("draft", self.draft))
        if self.config.fp8_kv:
            uses.add(Use("scales", self.scales))
        if self.config.encoder:
            uses.add(Use("encoder", self.weights))
        if lora:
            uses.add(Use("lora", self.lora_rev))
        return uses

    def _prefill(
        self, prefix: str, lora: bool, namespace: int | None = None
    ) -> tuple[set[Use], bool]:
        """Match the prefix in the radix cache, load lower tiers back, else insert."""
        uses = self.current_uses(lora)
        if not self.config.radix:
            return uses, False
        keys = self._keys(prefix, lora, namespace)
        found = [k for k in keys if k in self.cache]
        if any(k[1] is Kind.TARGET for k in found):
            for k in found:
                self._load_back(k)
                kv = self.cache[k]
                uses.add(Use(k[1].value, kv.version))
                if kv.lora is not None:
                    uses.add(Use("lora", kv.lora))
            self._insert([k for k in keys if k not in found], lora)
            return uses, True
        self._insert(keys, lora)
        return uses, False

    def _insert(self, keys: list[Key], lora: bool) -> None:
        """Cache freshly computed KV (and encoder output) under ``keys``."""
        for k in keys:
            version = self.draft if k[1] is Kind.DRAFT else self.weights
            self.cache[k] = CachedKV(version, lora=self.lora_rev if lora else None, namespace=k[3])

    def generate(self, prefix: str, lora: bool = False, namespace: int | None = None) -> Reply:
        """SGLang ``POST /generate`` for a whole request (``namespace``: its ``extra_key``)."""
        if self.closed:
            return Reply(False, message="endpoint closed: stale cache or torn weights")
        uses, hit = self._prefill(prefix, lora, namespace)
        output = self._numerics(prefix, uses, hit)
        return Reply(True, hit, frozenset(uses), frozenset({self.weights}), output=output)

    def cold_output(self, prefix: str, lora: bool = False) -> tuple[object, ...]:
        """The bytes a cold prefill of ``prefix`` gives under the weights in force."""
        return self._numerics(prefix, self.current_uses(lora), hit=False)

    def start(
        self, rid: str, prefix: str, lora: bool = False, namespace: int | None = None
    ) -> Reply:
        """Admit a streaming request; its prefill runs now."""
        if self.closed:
            return Reply(False, message="endpoint closed")
        uses, hit = self._prefill(prefix, lora, namespace)
        self.requests[rid] = Request(prefix, lora, {self.weights}, uses, namespace=namespace)
        return Reply(True, hit=hit)

    def finish(self, rid: str) -> Reply:
        """Let a request run to its end and return its response."""
        req = self.requests.pop(rid)
        if self.closed:
            return Reply(False, aborted=frozenset({rid}), message="aborted: endpoint closed")
        req.sampled.add(self.weights)
        uses = req.uses | self.current_uses(req.lora)
        return Reply(True, uses=frozenset(uses), sampled=frozenset(self._attribute(req)))

    # ----- weights --------------------------------------------------------------------

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        """SGLang ``POST /update_weights_from_{funnel}`` with ``flush_cache``.

        The engine guard: on an exact lane with the radix cache on, flush whatever was
        asked (ENG-001); a flush that cannot run rejects the whole update before any tensor
        is touched (FC-001, the 'consistent' branch)."""
        flush = self._must_flush(funnel, flush_cache)
        if flush and not self._can_flush():
            self.refuse_next_flush = False
            return Reply(False, message="flush refused while requests hold KV; not updated")
        self._install(version, funnel)
        self._drop_derived()
        if flush:
            self._clear_cache()
            self.dirty = False
        return Reply(True)

    def fail_update_midway(self, version: int) -> Reply:
        """A bucketed update that breaks after some buckets: roll back (FC-004)."""
        return Reply(False, message="bucket 3/8 failed; rolled back")

    def flush_cache(self) -> Reply:
        """SGLang ``POST /flush_cache``: refused while requests hold KV (LIV-001)."""
        if not self._can_flush():
            self.refuse_next_flush = False
            return Reply(False, flushed=False, message="requests hold KV")
        self._clear_cache()
        self.dirty = False
        return Reply(True, flushed=True)

    def reset_encoder_cache(self) -> Reply:
        """vLLM ``reset_encoder_cache``: drop every cached encoder output (never refused)."""
        for k in [k for k in self.cache if k[1] is Kind.ENCODER]:
            del self.cache[k]
        return Reply(True)

    def load_lora(self) -> Reply:
        """Reload the LoRA adapter in place under the same name."""
        self.lora_rev += 1
        self._forget_lora()
        return Reply(True)

    def evict(self, prefix: str, tier: Tier) -> Reply:
        """HiCache write-back: move a prefix's KV (target and draft) to a lower tier."""
        for k, kv in self.cache.items():
            if k[0] == prefix and kv.tier is Tier.DEVICE and k[1] is not Kind.ENCODER:
                kv.tier = tier
        return Reply(True)

    # ----- lifecycle ------------------------------------------------------------------

    def pause_generation(self, mode: PauseMode) -> Reply:
        """SGLang ``POST /pause_generation`` with ``mode``."""
        aborted: frozenset[str] = frozenset()
        if mode is PauseMode.ABORT:
            aborted = frozenset(self.requests)
            self.requests.clear()
        elif mode is PauseMode.RETRACT:
            for req in self.requests.values():
                req.retracted, req.uses = True, set()
        self.phase = Phase.PAUSED
        return Reply(True, aborted=aborted)

    def continue_generation(self) -> Reply:
        """SGLang ``POST /continue_generation``: retracted requests recompute."""
        self.phase = Phase.SERVING
        if not self.closed:
            for req in self.requests.values():
                if req.retracted:
                    req.uses, _ = self._prefill(req.prefix, req.lora, req.namespace)
                    req.retracted = False
        return Reply(True)

    def sleep(self) -> Reply:
        """vLLM ``POST /sleep?level=1``: KV memory is discarded; so is its index."""
        self._on_sleep()
        self.phase = Phase.ASLEEP
        return Reply(True)

    def wake_up(self) -> Reply:
        self.phase = Phase.SERVING
        return Reply(True)

    def restart(self) -> None:
        """A new process: only the last whole checkpoint survives."""
        weights, lora_rev = self.weights, self.lora_rev
        self.__init__(self.config)  # type: ignore[misc]
        self._install(weights, Funnel.DISK)
        self.lora_rev = lora_rev

    # ----- hooks: the decisions public bugs got wrong ---------------------------------

    def _keys(self, prefix: str, lora: bool, namespace: int | None = None) -> list[Key]:
        """Cache keys of a prefix: target, plus draft KV and encoder output if present.
        LoRA KV is keyed by the adapter's *revision* (ENG-007); the namespace is the
        request's own, else the version in force where the engine keys by version."""
        rev = self.lora_rev if lora else None
        if namespace is None and self.config.versioned_keys:
            namespace = self.weights
        kinds = [Kind.TARGET]
        kinds += [Kind.DRAFT] if self.config.draft else []
        kinds += [Kind.ENCODER] if self.config.encoder else []
        return [(prefix, kind, rev, namespace) for kind in kinds]

    def _must_flush(self, funnel: Funnel, flush_cache: bool | None) -> bool:
        """The engine guard (ENG-001), and the flush the caller asked (ENG-002), an omitted
        field read by the engine's profile (``Config.flush_default``)."""
        asked = self.config.flush_default if flush_cache is None else flush_cache
        return self.config.guarded or asked

    def _can_flush(self) -> bool:
        """LIV-001: only KV pinned by a running or in-place-paused request blocks a flush."""
        held = any(not r.retracted for r in self.requests.values())
        return not held and not self.refuse_next_flush

    def _install(self, version: int, funnel: Funnel) -> None:
        """Load every tensor of ``version``: target, draft (ENG-004), scales (ENG-005)."""
        self.weights = self.draft = self.scales = self.label = version
        self.torn = False

    def _clear_cache(self) -> None:
        """Every tier and kind (ENG-003)."""
        self.cache.clear()

    def _drop_derived(self) -> None:
        """Encoder outputs are keyed by content only: they follow every update, whatever was
        asked about the prefix cache (ENG-012; vllm-project/vllm #44910)."""
        for k in [k for k in self.cache if k[1] is Kind.ENCODER and k[3] is None]:
            del self.cache[k]

    def _load_back(self, key: Key) -> None:
        """A lower-tier hit moves back to device, draft KV with it (ENG-008)."""
        self.cache[key].tier = Tier.DEVICE

    def _forget_lora(self) -> None:
        """Old-revision LoRA KV can never match again; drop it to free memory."""
        for k in [k for k in self.cache if k[2] is not None]:
            del self.cache[k]

    def _numerics(self, prefix: str, uses: set[Use], hit: bool) -> tuple[object, ...]:
        """Stand-in output bytes: a pure function of the prompt and every version the
        computation depended on, so stale KV changes them and a fresh hit does not."""
        return (prefix, *sorted((u.component, u.version) for u in uses))

    def _attribute(self, req: Request) -> set[int]:
        """Every version that sampled the response's tokens (INV-002)."""
        return set(req.sampled)

    def _on_sleep(self) -> None:
        """Device KV memory is gone; its index entries go with it (ENG-006)."""
        for k in [k for k, kv in self.cache.items() if kv.tier is Tier.DEVICE]:
            del self.cache[k]


class ClosingEndpoint(ReferenceEndpoint):
    """A correct endpoint that takes the spec's other fail-closed branch: it installs the
    weights, finds the flush refused, reports failure and refuses to serve until a flush
    completes; a torn bucketed update leaves it torn and closed (FC-004)."""

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        flush = self._must_flush(funnel, flush_cache)
        blocked = flush and not self._can_flush()
        self._install(version, funnel)
        self._drop_derived()
        if blocked:
            self.refuse_next_flush = False
            self.dirty = True
            return Reply(False, message="weights installed, flush refused: closed")
        if flush:
            self._clear_cache()
            self.dirty = False
        return Reply(True)

    def fail_update_midway(self, version: int) -> Reply:
        self.torn, self.label = True, None
        return Reply(False, message="bucket 3/8 failed; weights torn, endpoint closed")


def _reply_status(reply: Reply) -> Status:
    if reply.stopped:
        return Status.STOPPED
    if reply.lost:
        return Status.INDETERMINATE
    return Status.OK if reply.ok else Status.REJECTED


class InProcessAdapter:
    """Drives ``endpoint_cls`` instances in this process, one per endpoint config.

    Every capability is on (these systems can be probed completely) except ``exact_cache``,
    which is the endpoint class's opt-in (``exact``: override it). Exceptions from the
    endpoint propagate to the checker, which reports them as ERROR (ADP-001).
    """

    capabilities = frozenset(Capability) - {
        Capability.EXACT_CACHE,
        Capability.NAMESPACES,
        Capability.ENCODER_RESET,
    }
    fixed_configs = None

    def __init__(
        self, endpoint_cls: type[ReferenceEndpoint], name: str, exact: bool | None = None
    ) -> None:
        self.endpoint_cls = endpoint_cls
        self.name = name
        self.endpoints: list[ReferenceEndpoint] = []
        exact = endpoint_cls.exact_cache if exact is None else exact
        if exact:
            self.capabilities = type(self).capabilities | {Capability.EXACT_CACHE}
        self.profile = dict(endpoint_cls.profile)
        if self.profile.get("encoder_reset_separate"):
            self.capabilities = self.capabilities | {Capability.ENCODER_RESET}

    def start(self, configs: tuple[Config, ...]) -> None:
        self.endpoints = [self.endpoint_cls(c) for c in configs]

    def server_info(self, endpoint: int) -> Mapping[str, object] | None:
        return self._ep(endpoint).get_server_info()

    def close(self) -> None:
        self.endpoints = []

    def snapshot(self) -> list[ReferenceEndpoint]:
        """A deep copy of every endpoint's state, for ``restore`` (the explorer's)."""
        import copy

        fixed = {id(ep.config): ep.config for ep in self.endpoints}  # immutable: shared
        return copy.deepcopy(self.endpoints, fixed)

    def restore(self, snap: list[ReferenceEndpoint]) -> None:
        """Put the endpoints back as ``snapshot`` saw them; ``snap`` stays reusable."""
        import copy

        fixed = {id(ep.config): ep.config for ep in snap}
        self.endpoints = copy.deepcopy(snap, fixed)

    def _ep(self, index: int) -> ReferenceEndpoint:
        try:
            return self.endpoints[index]
        except IndexError:
            n = len(self.endpoints)
            raise AdapterFailure(f"no endpoint {index}; started with {n}") from None

    def apply(self, action: Action) -> Observation:
        index: int = action.endpoint  # type: ignore[attr-defined]
        ep = self._ep(index)
        reply = self._call(ep, action)
        response = None
        if isinstance(action, ServeRequest) and reply.ok:
            cold = ep.cold_output(action.prefix, action.lora)
            response = Response(reply.hit, reply.uses, reply.sampled, reply.output, cold)
        elif isinstance(action, FinishRequest) and reply.ok:
            response = Response(hit=reply.hit, uses=reply.uses, sampled=reply.sampled)
        aborted = reply.aborted if isinstance(action, (PauseGeneration, FinishRequest)) else None
        return Observation(
            status=_reply_status(reply),
            response=response,
            flushed=reply.flushed,
            aborted=aborted,
            view=ep.weight_info(),
            detail=reply.message,
        )

    def _call(self, ep: ReferenceEndpoint, a: Action) -> Reply:
        calls: dict[type, Any] = {
            ServeRequest: lambda: ep.generate(a.prefix, a.lora, a.namespace),
            StartRequest: lambda: ep.start(a.rid, a.prefix, a.lora, a.namespace),
            FinishRequest: lambda: ep.finish(a.rid),
            UpdateWeights: lambda: ep.update_weights(a.version, a.funnel, a.flush_cache),
            FaultUpdateFailsMidway: lambda: ep.fail_update_midway(a.version),
            FlushCache: ep.flush_cache,
            FlushEncoderCache: ep.reset_encoder_cache,
            PauseGeneration: lambda: ep.pause_generation(a.mode),
            ContinueGeneration: ep.continue_generation,
            Sleep: ep.sleep,
            WakeUp: ep.wake_up,
            Restart: lambda: ep.restart() or Reply(True),
            EvictPrefix: lambda: ep.evict(a.prefix, a.tier),
            LoadLora: ep.load_lora,
            FaultRefuseFlush: lambda: setattr(ep, "refuse_next_flush", True) or Reply(True),
        }
        if type(a) not in calls:
            raise Unsupported(f"{a.name} is not an engine action")
        return calls[type(a)]()


__all__ = [
    "CachedKV",
    "ClosingEndpoint",
    "InProcessAdapter",
    "ReferenceEndpoint",
    "Reply",
    "Request",
]
