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

import copy
import io
import pickle
from collections.abc import Mapping
from typing import Any, ClassVar

from attrs import define, field

from ..model.actions import (
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
    UpdateWeightChunk,
    UpdateWeights,
    WakeUp,
)
from ..model.capabilities import Capability
from ..model.observation import Observation, Response, View
from ..model.state import Config, Entry, StoreEntry, Use
from ..model.vocabulary import (
    ALL_MEMORY,
    MIXED,
    Funnel,
    Kind,
    MemoryTag,
    PauseMode,
    Phase,
    Status,
    Tier,
)
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
class Window:
    """An open two-phase update: its target ``version`` and ``funnel``, whether a chunk
    ``landed`` in the live parameters, whether one ``failed``, and whether the window
    opened on torn weights (``from_torn``: a rollback returns to them)."""

    version: int
    funnel: Funnel
    landed: bool = False
    failed: bool = False
    from_torn: bool = False


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
    stored: StoreEntry | None = None


PROBED_SCHEDULER: frozenset[Capability] = frozenset(
    {
        Capability.WEIGHTS_PROBE,
        Capability.CACHE_PROBE,
        Capability.PROVENANCE,
        Capability.ATTRIBUTION,
        Capability.BYTE_ORACLE,
        Capability.FLUSH_RESULT,
        Capability.PAUSE,
    }
)
"""What every in-process deployment endpoint (ranks, store, P/D, router) can be probed for
and driven by, as one reference scheduler: weights, cache listing, provenance, attribution,
byte oracle, flush result, pause. Each deployment adds its own capabilities to it."""


class ReferenceEndpoint:
    """One correct endpoint. Public methods are its API; ``_hooks`` are what mutants change.

    ``exact_cache``: its adapter declares the ``exact_cache`` capability (the endpoint never
    drops an entry on its own, so a miss is as telling as a hit). Off by default: an
    in-process design may drop KV at will; the reference's own tests opt in.

    State: ``weights``/``draft``/``scales``/``lora_rev`` versions, ``label``, ``torn``,
    ``dirty`` (failed closed), ``phase``, ``cache`` (key -> ``CachedKV``), ``requests``
    (rid -> ``Request``), ``refuse_next_flush`` (an injected fault), ``derived`` (version
    of the state derived from the weights at load time), ``window`` (an open two-phase
    update) and ``fail_next_chunk`` (an injected fault).
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
        self.released: set[MemoryTag] = set()
        self.derived = 0
        self.window: Window | None = None
        self.fail_next_chunk = False

    # ----- probes ---------------------------------------------------------------------

    def get_server_info(self) -> dict[str, object] | None:
        """SGLang ``GET /get_server_info``; ``None`` models an unreachable endpoint."""
        return None if self.config.info is None else dict(self.config.info)

    def weight_info(self) -> View:
        """vLLM ``/weight_info``-style probe plus a listing of the radix cache."""
        entries = frozenset(self._entry(key, kv) for key, kv in self.cache.items())
        return View(
            weights=None if self.torn else self.weights,
            draft=self.draft if self.config.draft else None,
            scales=self.scales if self.config.fp8_kv else None,
            label=self.label,
            cache=entries,
            derived=self.derived if self.config.derived else None,
        )

    def _entry(self, key: Key, kv: CachedKV) -> Entry:
        """The listing's ``Entry`` for ``key``, built once per key and what its KV holds: a
        long session lists thousands of entries at every step, and an ``Entry`` reused
        keeps its cached hash."""
        memo: dict[Key, Entry] = self.__dict__.setdefault("_entries", {})
        e = memo.get(key)
        if (
            e is None
            or e.tier != kv.tier
            or e.version != kv.version
            or e.lora != kv.lora
            or e.namespace != kv.namespace
        ):
            e = memo[key] = Entry(key[0], key[1], kv.tier, kv.version, kv.lora, kv.namespace)
        return e

    @property
    def in_window(self) -> bool:
        return self.window is not None and not self.window.failed

    @property
    def closed(self) -> bool:
        """Torn weights outside a window, or a stale tree: nothing is served (FC-002).
        Inside a window the reference serves under the mixed weights (WIN-001)."""
        return (self.torn and not self.in_window) or self.dirty

    def live(self) -> int:
        """The target version a forward computes with: ``MIXED`` once a chunk landed."""
        return MIXED if self.torn and self.in_window else self.weights

    # ----- requests -------------------------------------------------------------------

    def current_uses(self, lora: bool = False) -> set[Use]:
        """What freshly computed tokens depend on right now."""
        uses = {Use("target", self.live())}
        if self.config.draft:
            uses.add(Use("draft", self.draft))
        if self.config.fp8_kv:
            uses.add(Use("scales", MIXED if self.live() == MIXED else self.scales))
        if self.config.encoder:
            uses.add(Use("encoder", self.live()))
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
            version = self.draft if k[1] is Kind.DRAFT else self.live()
            self.cache[k] = CachedKV(version, lora=self.lora_rev if lora else None, namespace=k[3])

    def generate(self, prefix: str, lora: bool = False, namespace: int | None = None) -> Reply:
        """SGLang ``POST /generate`` for a whole request (``namespace``: its ``extra_key``)."""
        if self.closed:
            return Reply(False, message="endpoint closed: stale cache or torn weights")
        uses, hit = self._prefill(prefix, lora, namespace)
        output = self._numerics(prefix, uses, hit)
        return Reply(True, hit, frozenset(uses), frozenset({self.live()}), output=output)

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
        self.requests[rid] = Request(prefix, lora, {self.live()}, uses, namespace=namespace)
        return Reply(True, hit=hit)

    def finish(self, rid: str) -> Reply:
        """Let a request run to its end and return its response."""
        req = self.requests.pop(rid)
        if self.closed:
            return Reply(False, aborted=frozenset({rid}), message="aborted: endpoint closed")
        req.sampled.add(self.live())
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
        if flush and MemoryTag.KV_CACHE in self.released:
            return self._flush_while_released()
        if flush:
            self._clear_cache()
            self.dirty = False
        return Reply(True)

    def fail_update_midway(self, version: int) -> Reply:
        """A bucketed update that breaks after some buckets: roll back (FC-004)."""
        return Reply(False, message="bucket 3/8 failed; rolled back")

    # ----- two-phase updates -----------------------------------------------------------

    def begin_weight_update(self, version: int, funnel: Funnel) -> Reply:
        """vLLM ``POST /start_weight_update`` (``initialize_layerwise_reload``): open the
        window; nothing lands yet. On torn weights (a failed update left them) the window
        is the retry: its finish installs the version whole."""
        self.window = Window(version, funnel, from_torn=self.torn)
        return Reply(True)

    def update_weight_chunk(self) -> Reply:
        """vLLM ``POST /update_weights``, SGLang a non-final ``update_weights_from_tensor``
        chunk: the chunk lands in the live parameters, which are mixed from now on, so the
        probe shows no whole version and no label (WIN-001). A chunk that fails rolls the
        window back (WIN-003)."""
        window = self.window
        assert window is not None
        if window.failed:
            return Reply(False, message="an earlier chunk failed; the window is dead")
        if self.fail_next_chunk:
            self.fail_next_chunk = False
            window.failed = True
            return self._fail_chunk()
        return self._land_chunk(window)

    def _land_chunk(self, window: Any) -> Reply:
        """Where a good chunk goes: into the live parameters, mixed from now on."""
        window.landed = True
        self.torn, self.label = True, None
        return Reply(True)

    def _fail_chunk(self) -> Reply:
        """What a failed chunk leaves: the old weights, rolled back."""
        self._chunk_failed()
        return Reply(False, message="chunk failed; rolled back to the old weights")

    def finish_weight_update(self, flush_cache: bool | None) -> Reply:
        """vLLM ``POST /finish_weight_update`` (``finalize_layerwise_reload``, then the
        ``weight_version`` label), SGLang's last chunk with ``flush_cache``: KV computed under
        the mixed weights goes whatever was asked (WIN-002), then the update completes as a
        one-shot one; after a failed chunk nothing is published (WIN-003)."""
        window, self.window = self.window, None
        assert window is not None
        self.fail_next_chunk = False
        self._drop_window_kv()
        if window.failed:
            return Reply(False, message="a chunk of this update failed; version not published")
        return self.update_weights(window.version, window.funnel, flush_cache)

    def abort_weight_update(self) -> Reply:
        """Give the window up: back to the old weights, whole (WIN-003)."""
        self.fail_next_chunk = False
        self._chunk_failed()
        self.window = None
        return Reply(True)

    def _chunk_failed(self) -> None:
        """Roll back: the old tensors were kept aside, so the old weights are whole again,
        with their label, unless the window opened on torn ones (then those are back);
        KV of the mixed weights goes (WIN-002)."""
        if self.torn and not (self.window is not None and self.window.from_torn):
            self.torn, self.label = False, self.weights
        self._drop_window_kv()

    def _drop_window_kv(self) -> None:
        """WIN-002: KV computed under mixed weights never outlives the window: cached KV
        goes, and in-flight requests holding such KV are retracted (they recompute)."""
        for k in [k for k, kv in self.cache.items() if kv.version == MIXED]:
            del self.cache[k]
        for req in self.requests.values():
            if any(u.version == MIXED for u in req.uses):
                req.retracted, req.uses = True, set()

    def flush_cache(self) -> Reply:
        """SGLang ``POST /flush_cache``: refused while requests hold KV (LIV-001)."""
        if not self._can_flush():
            self.refuse_next_flush = False
            return Reply(False, flushed=False, message="requests hold KV")
        if MemoryTag.KV_CACHE in self.released:
            reply = self._flush_while_released()
            return Reply(reply.ok, flushed=reply.ok, stopped=reply.stopped, message=reply.message)
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

    def pause_generation(self, mode: PauseMode, clear_cache: bool = False) -> Reply:
        """SGLang ``POST /pause_generation`` with ``mode``; ``clear_cache`` as vLLM
        ``POST /pause?clear_cache=true``: once the mode has dealt with the requests, the
        prefix cache is flushed on every tier, and the result reported."""
        aborted: frozenset[str] = frozenset()
        if mode is PauseMode.ABORT:
            aborted = frozenset(self.requests)
            self.requests.clear()
        elif mode is PauseMode.RETRACT:
            for req in self.requests.values():
                req.retracted, req.uses = True, set()
        self.phase = Phase.PAUSED
        if not clear_cache:
            return Reply(True, aborted=aborted)
        if not self._can_flush():
            self.refuse_next_flush = False
            return Reply(False, aborted=aborted, flushed=False, message="clear refused")
        self._clear_on_pause()
        return Reply(True, aborted=aborted, flushed=True)

    def publish_version(self, version: int, abort_requests: bool) -> Reply:
        """SGLang/vLLM ``POST /update_weight_version`` with ``new_version`` (and SGLang's
        ``abort_all_requests``), checked: the label must name the whole weights installed
        (PUB-001); requests are aborted only when asked (PUB-002)."""
        parts = {self.weights} | ({self.draft} if self.config.draft else set())
        parts |= {self.scales} if self.config.fp8_kv else set()
        if self.torn or parts != {version}:
            return Reply(False, message=f"weights {sorted(parts)} are not version {version}")
        aborted = self._publish_aborts(abort_requests)
        for rid in aborted:
            del self.requests[rid]
        self.label = version
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

    def sleep(self, tags: frozenset[MemoryTag] = ALL_MEMORY) -> Reply:
        """SGLang ``POST /release_memory_occupation`` with ``tags`` (vLLM ``/sleep?level=1``
        for every tag): released KV memory is discarded, and so is its index; released
        weights are kept aside."""
        if MemoryTag.KV_CACHE in tags and MemoryTag.KV_CACHE not in self.released:
            self._on_sleep()
        self.released |= set(tags)
        self.phase = Phase.ASLEEP
        return Reply(True)

    def wake_up(self, tags: frozenset[MemoryTag] = ALL_MEMORY) -> Reply:
        """vLLM ``POST /wake_up?tags=``, SGLang ``/resume_memory_occupation``: serving again
        once nothing is released."""
        if MemoryTag.KV_CACHE in tags and MemoryTag.KV_CACHE in self.released:
            self._on_resume_kv()
        self.released -= set(tags)
        if not self.released:
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
        """Load every tensor of ``version``: target, draft (ENG-004), scales (ENG-005), and
        rebuild the state derived from them (DER-001)."""
        self.weights = self.draft = self.scales = self.label = version
        self.derived = version  # the post-load hook rebuilds derived state (DER-001)
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
        out = (prefix, *sorted((u.component, u.version) for u in uses))
        if self.config.derived:  # the forward also reads the derived tensors
            out += (("derived", self.derived),)
        return out

    def _attribute(self, req: Request) -> set[int]:
        """Every version that sampled the response's tokens (INV-002)."""
        return set(req.sampled)

    def _on_sleep(self) -> None:
        """Device KV memory is gone; its index entries go with it (ENG-006)."""
        for k in [k for k, kv in self.cache.items() if kv.tier is Tier.DEVICE]:
            del self.cache[k]

    # the RL lifecycle hooks

    def _flush_while_released(self) -> Reply:
        """A flush while the KV memory is released: no device pool is touched (there is no
        KV on it), the index and the lower tiers are emptied, and it answers (MEM-001,
        ENG-002/ENG-003 as any update's flush). sgl-project/sglang PR #19029 (PF-19)."""
        self._clear_cache()
        self.dirty = False
        return Reply(True)

    def _on_resume_kv(self) -> None:
        """Resumed KV memory holds nothing reusable: no index entry comes back (MEM-002)."""

    def _clear_on_pause(self) -> None:
        """``/pause?clear_cache=true``: every tier and kind, as a flush (FC-003)."""
        self._clear_cache()
        self.dirty = False

    def _publish_aborts(self, abort_requests: bool) -> frozenset[str]:
        """The requests a publish aborts: all when asked, else none (PUB-002)."""
        return frozenset(self.requests) if abort_requests else frozenset()


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

    @property
    def closed(self) -> bool:
        """Refuses to serve on mixed weights inside a window too (WIN-001's other branch)."""
        return self.torn or self.dirty

    def _chunk_failed(self) -> None:
        """A failed chunk or an abort leaves the mixed weights in place: closed (WIN-003)."""
        if self.window is not None and not self.window.landed:
            return  # nothing landed: the old weights are whole
        if self.torn or (self.window is not None and self.window.failed):
            self.torn, self.label = True, None


def _reply_status(reply: Reply) -> Status:
    if reply.stopped:
        return Status.STOPPED
    if reply.lost:
        return Status.INDETERMINATE
    return Status.OK if reply.ok else Status.REJECTED


class _ConfigIds:
    """A pickler's ``persistent_id`` that names each of ``configs`` by its position (the
    very object, not an equal one), so the pickle holds an index, not a copy."""

    def __init__(self, configs: tuple[Config, ...]) -> None:
        self.ids = {id(c): i for i, c in enumerate(configs)}
        self.configs = configs

    def __call__(self, obj: object) -> int | None:
        i = self.ids.get(id(obj))
        return i if i is not None and self.configs[i] is obj else None


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
        Capability.RANKS,  # the ranked endpoint classes declare it (``ranks.RankedEndpoint``)
        Capability.STORE,  # the store endpoint classes declare it (``store.StoreEndpoint``)
        Capability.ROLES,  # the P/D endpoint classes declare it (``pd.DecodeEndpoint``)
        Capability.ROUTER,  # the router's workers declare it (``router.RouterWorker``)
    }
    fixed_configs = None
    in_process = True
    """Plain Python in this process: the checker calls it directly, without a thread
    handoff, and a SIGALRM watchdog stops a call that hangs (``calls.call_with_timeout``)."""

    def __init__(
        self, endpoint_cls: type[ReferenceEndpoint], name: str, exact: bool | None = None
    ) -> None:
        self.endpoint_cls = endpoint_cls
        self.name = name
        self.endpoints: list[ReferenceEndpoint] = []
        self.fresh_engines: dict[tuple[Config, int], ReferenceEndpoint] = {}
        exact = endpoint_cls.exact_cache if exact is None else exact
        if exact:
            self.capabilities = type(self).capabilities | {Capability.EXACT_CACHE}
        self.profile = dict(endpoint_cls.profile)
        # an endpoint class that is a deployment shape (ranks) names the endpoints it runs
        # and what of the vocabulary it takes
        self.fixed_configs = getattr(endpoint_cls, "fixed_configs", None)
        self.capabilities = getattr(endpoint_cls, "capabilities", self.capabilities)
        if self.profile.get("encoder_reset_separate"):
            self.capabilities = self.capabilities | {Capability.ENCODER_RESET}

    def start(self, configs: tuple[Config, ...]) -> None:
        self.endpoints = [self._endpoint(c) for c in configs]
        attached = [ep for ep in self.endpoints if ep.config.store]
        if attached:  # one KV store shared by every endpoint with Config.store
            from .store import SharedStore

            shared = SharedStore()
            for ep in attached:
                ep.attach(shared)  # type: ignore[attr-defined]
        if any(c.role is not None for c in configs):  # decode endpoints behind the prefill one
            from .pd import attach_roles

            attach_roles(self.endpoints)
        if any(c.router for c in configs):  # workers behind one router
            from .router import attach_router

            attach_router(self.endpoints)

    def _endpoint(self, config: Config) -> ReferenceEndpoint:
        """One endpoint of ``config``. With data-parallel ranks (``Config.ranks`` > 1) and a
        single-scheduler class, the reference DP controller (``ranks.RankedEndpoint``)
        over ranks of that class; a class that is itself a ranked endpoint runs as it is,
        and on a config of one rank it is its ``rank_cls`` (one scheduler). On the shared KV
        store (``Config.store``), a class that is not a store endpoint runs as the
        reference store endpoint (``store.StoreEndpoint``). On a prefill/decode config
        (``Config.role``), the class's engine in that role (``pd.pd_endpoint``). Behind a
        router (``Config.router``), a class that is not a router worker runs as the
        reference worker (``router.RouterWorker``)."""
        from .ranks import RankedEndpoint
        from .store import StoreEndpoint

        if config.role is not None:
            from .pd import pd_endpoint

            return pd_endpoint(self.endpoint_cls, config)

        if config.router:
            from .router import RouterWorker

            if issubclass(self.endpoint_cls, RouterWorker):
                return self.endpoint_cls(config)
            return RouterWorker(config)  # the reference worker behind the router
        if config.store and not issubclass(self.endpoint_cls, StoreEndpoint):
            return StoreEndpoint(config)  # the reference scheduler on the shared store
        ranked = issubclass(self.endpoint_cls, RankedEndpoint)  # type: ignore[arg-type]
        if config.ranks > 1 and not ranked:
            return RankedEndpoint(config, self.endpoint_cls)  # type: ignore[return-value]
        if config.ranks == 1 and ranked:  # a controller of one rank is that rank's scheduler
            return self.endpoint_cls.rank_cls(config)  # type: ignore[attr-defined]
        return self.endpoint_cls(config)

    def server_info(self, endpoint: int) -> Mapping[str, object] | None:
        return self._ep(endpoint).get_server_info()

    def close(self) -> None:
        self.endpoints = []

    def snapshot(self) -> tuple[tuple[Config, ...], bytes] | list[ReferenceEndpoint]:
        """Every endpoint's state, for ``restore`` (the explorer's): pickled (a C-speed
        copy) beside the endpoints' configs, which the pickle names by position
        instead of copying (a config is immutable and fixed for a run; unpickling it cost
        about 40% of a restore); or a deep copy of an endpoint class pickle cannot name (a
        class defined inside a function, as some mutants are)."""
        configs = tuple(ep.config for ep in self.endpoints)
        try:
            out = io.BytesIO()
            pickler = pickle.Pickler(out, pickle.HIGHEST_PROTOCOL)
            pickler.persistent_id = _ConfigIds(configs)  # type: ignore[method-assign]
            pickler.dump(self.endpoints)
            return configs, out.getvalue()
        except (pickle.PicklingError, AttributeError, TypeError):
            fixed = {id(c): c for c in configs}  # immutable: shared
            return copy.deepcopy(self.endpoints, fixed)

    def restore(self, snap: tuple[tuple[Config, ...], bytes] | list[ReferenceEndpoint]) -> None:
        """Put the endpoints back as ``snapshot`` saw them; ``snap`` stays reusable."""
        if isinstance(snap, tuple):
            configs, data = snap
            unpickler = pickle.Unpickler(io.BytesIO(data))
            unpickler.persistent_load = configs.__getitem__  # type: ignore[method-assign]
            self.endpoints = unpickler.load()
            return
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
            fresh = self.fresh_output(ep, action.prefix, action.lora)
            response = Response(
                reply.hit, reply.uses, reply.sampled, reply.output, cold, fresh, reply.stored
            )
        elif isinstance(action, FinishRequest) and reply.ok:
            response = Response(hit=reply.hit, uses=reply.uses, sampled=reply.sampled)
        # an update may abort to flush (CD-08), through either funnel shape
        aborting = (
            PauseGeneration,
            FinishRequest,
            PublishVersion,
            UpdateWeights,
            FinishWeightUpdate,
        )
        aborted = reply.aborted if isinstance(action, aborting) else None
        return Observation(
            status=_reply_status(reply),
            response=response,
            flushed=reply.flushed,
            aborted=aborted,
            view=ep.weight_info(),
            detail=reply.message,
        )

    def fresh_output(self, ep: ReferenceEndpoint, prefix: str, lora: bool) -> tuple | None:
        """The restart oracle: the cold output of ``prefix`` from an engine of the same class
        freshly started (loaded from its checkpoint) at the version ``ep`` claims by its
        label, with the same LoRA revision; ``None`` when it claims none. One fresh engine
        per (config, version), kept."""
        if ep.label is None:
            return None
        key = (ep.config, ep.label)
        fresh = self.fresh_engines.get(key)
        if fresh is None:
            fresh = self.fresh_engines[key] = self._endpoint(ep.config)
            fresh._install(ep.label, Funnel.DISK)
        fresh.lora_rev = ep.lora_rev
        return fresh.cold_output(prefix, lora)

    def _call(self, ep: ReferenceEndpoint, a: Action) -> Reply:
        rank = getattr(a, "rank", 0)
        if rank and isinstance(a, (ServeRequest, StartRequest)):
            # placed on a data-parallel rank: only an endpoint with ranks takes the argument
            if isinstance(a, ServeRequest):
                return ep.generate(a.prefix, a.lora, a.namespace, rank=rank)  # type: ignore[call-arg]
            return ep.start(a.rid, a.prefix, a.lora, a.namespace, rank=rank)  # type: ignore[call-arg]
        call = ENDPOINT_CALLS.get(type(a))
        if call is None:
            raise Unsupported(f"{a.name} is not an engine action")
        return call(ep, a)


ENDPOINT_CALLS: dict[type[Action], Any] = {
    ServeRequest: lambda ep, a: ep.generate(a.prefix, a.lora, a.namespace),
    StartRequest: lambda ep, a: ep.start(a.rid, a.prefix, a.lora, a.namespace),
    FinishRequest: lambda ep, a: ep.finish(a.rid),
    UpdateWeights: lambda ep, a: ep.update_weights(a.version, a.funnel, a.flush_cache),
    FaultUpdateFailsMidway: lambda ep, a: ep.fail_update_midway(a.version),
    FlushCache: lambda ep, a: ep.flush_cache(),
    # the new arguments are passed only when not their default, so an endpoint class
    # written before them (overriding ``pause_generation(mode)``) still runs
    PauseGeneration: lambda ep, a: (
        ep.pause_generation(a.mode, True) if a.clear_cache else ep.pause_generation(a.mode)
    ),
    FlushEncoderCache: lambda ep, a: ep.reset_encoder_cache(),
    ContinueGeneration: lambda ep, a: ep.continue_generation(),
    Sleep: lambda ep, a: ep.sleep(a.tags) if a.tags != ALL_MEMORY else ep.sleep(),
    WakeUp: lambda ep, a: ep.wake_up(a.tags) if a.tags != ALL_MEMORY else ep.wake_up(),
    PublishVersion: lambda ep, a: ep.publish_version(a.version, a.abort_requests),
    Restart: lambda ep, a: ep.restart() or Reply(True),
    EvictPrefix: lambda ep, a: ep.evict(a.prefix, a.tier),
    LoadLora: lambda ep, a: ep.load_lora(),
    FaultRefuseFlush: lambda ep, a: setattr(ep, "refuse_next_flush", True) or Reply(True),
    BeginWeightUpdate: lambda ep, a: ep.begin_weight_update(a.version, a.funnel),
    UpdateWeightChunk: lambda ep, a: ep.update_weight_chunk(),
    FinishWeightUpdate: lambda ep, a: ep.finish_weight_update(a.flush_cache),
    AbortWeightUpdate: lambda ep, a: ep.abort_weight_update(),
    FaultChunkFails: lambda ep, a: setattr(ep, "fail_next_chunk", True) or Reply(True),
    FaultRankUpdateFails: lambda ep, a: ep.fail_rank_update(a.rank),
    LeaveRotation: lambda ep, a: ep.leave_rotation(),
    EnterRotation: lambda ep, a: ep.enter_rotation(),
}
"""How ``InProcessAdapter.apply`` calls an endpoint for each engine action type, built once
(an endpoint subclass's override is what runs); a type not listed is ``Unsupported``."""


__all__ = [
    "CachedKV",
    "ClosingEndpoint",
    "InProcessAdapter",
    "ReferenceEndpoint",
    "Reply",
    "Request",
    "Window",
]
