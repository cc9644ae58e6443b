"""Faulty implementations, one per fault class seen in public bug trackers.

Each mutant overrides one hook of ``ReferenceEndpoint`` or ``ReferenceClient`` and makes
the *general* mistake, not a special case for one trace. The first line of its docstring is
``Violates: RULE-ID``: the rule the conformance run must report when it kills it.
``tests/test_mutants.py`` shows every one killed by that rule, and the reference passing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from attrs import frozen

from ..model.observation import View
from ..model.rules import RuleId
from ..model.state import Config, Policy, Use
from ..model.vocabulary import GARBAGE, MIXED, Funnel, Kind, PauseMode, Tier
from .clients import NeverFlushClient, ReferenceClient
from .designs import (
    ClosesOnRaisedFlush,
    DrainsOverlapBeforeWrite,
    MergesEveryFlushReply,
    VersionKeyedCache,
)
from .pd import DecodeEndpoint, PrefillEndpoint
from .ranks import RankedEndpoint
from .reference import CachedKV, Key, ReferenceEndpoint, Reply, Request
from .router import RouterWorker
from .store import StoreEndpoint

# ----- clients ---------------------------------------------------------------------------


class UnreportedMeansDisabledClient(ReferenceClient):
    """Violates: CLI-002.

    Treats an endpoint that does not report its radix state (or cannot be reached) as
    radix off, so ``auto`` skips the flush exactly where it cannot know. Seed contract SC-5.
    """

    name = "unreported-means-disabled"

    def wants_flush(self, policy: Policy, info: Mapping[str, object] | None) -> bool:
        if policy.flush_cache is True or policy.mode.value == "flush":
            return True
        return policy.mode.value == "auto" and self.radix_enabled(info) is True


class Fp8OnlyClient(ReferenceClient):
    """Violates: CLI-001.

    Has no radix rule at all: ``auto`` flushes only when FP8 weights meet an FP8 KV cache
    (the only reason the resolver it copies ever flushed). Seed contract SC-4.
    """

    name = "fp8-only"

    def wants_flush(self, policy: Policy, info: Mapping[str, object] | None) -> bool:
        if policy.flush_cache is True or policy.mode.value == "flush":
            return True
        info = info or {}
        return policy.mode.value == "auto" and info.get("kv_cache_dtype") == "fp8_e4m3"


class IdentityTrueClient(ReferenceClient):
    """Violates: CLI-013.

    Reads a field that is neither a string nor null as on only when it ``is True``, so an
    int ``radix_cache_enabled: 1`` (a shape no engine emits) reads as off and ``auto`` skips
    the flush, where no reading of the report says off. Right on every producer shape (a
    JSON bool, the strings ``"true"``/``"false"``, null, silence): only the robustness rule
    can catch it, as a WARN (FAIL under ``--strict``).
    """

    name = "identity-true"

    def radix_enabled(self, info: Mapping[str, object] | None) -> bool | None:
        if not isinstance(info, Mapping):
            return None
        for field, inverted in (("radix_cache_enabled", False), ("disable_radix_cache", True)):
            value = info.get(field)
            if value is None:
                continue
            if isinstance(value, str):
                word = value.strip().lower()
                if word not in ("true", "false"):
                    continue
                return (word == "true") != inverted
            return (value is True) != inverted
        return None


class KeepsInPlacePauseClient(ReferenceClient):
    """Violates: CLI-007.

    Requests the flush but keeps an ``in_place`` pause, so in-flight requests pin KV and the
    flush is refused. radixark/miles PR #2782 (PF-06); seed contract SC-8.
    """

    name = "keeps-in-place-pause"

    def pause_mode(self, policy: Policy, flush: bool) -> PauseMode:
        return policy.pause_mode


class InPlaceSkipsFlushClient(ReferenceClient):
    """Violates: CLI-007.

    With an ``in_place`` pause it knows the flush would be refused, so it skips the flush
    instead of retracting: old KV lives on across every version. radixark/miles PR #2782
    (PF-06).
    """

    name = "in-place-skips-flush"

    def wants_flush(self, policy: Policy, info: Mapping[str, object] | None) -> bool:
        if policy.pause_mode is PauseMode.IN_PLACE:
            return False
        return super().wants_flush(policy, info)


# ----- engines: the guard ----------------------------------------------------------------


class GuardYieldsToOptOut(ReferenceEndpoint):
    """Violates: ENG-001.

    On an exact lane the guard steps aside when the caller explicitly sent
    ``flush_cache=False`` (client mode ``none``): the opt-out overrides the exact lane.
    Seed contract SC-1, SC-6.
    """

    def _must_flush(self, funnel: Funnel, flush_cache: bool | None) -> bool:
        if flush_cache is False:
            return False
        return super()._must_flush(funnel, flush_cache)


def guard_missing_on(missing: Funnel) -> type[ReferenceEndpoint]:
    """An endpoint whose guard was wired into every funnel but ``missing``."""

    class GuardMissingOnFunnel(ReferenceEndpoint):
        __doc__ = f"""Violates: ENG-001.

        The guard is missing on the {missing.value} funnel: an update through it flushes
        only if asked. PrimeIntellect-ai/prime-rl PR #1650 (PF-07, disk).
        """

        def _must_flush(self, funnel: Funnel, flush_cache: bool | None) -> bool:
            if funnel is missing:
                return flush_cache is True
            return super()._must_flush(funnel, flush_cache)

    GuardMissingOnFunnel.__name__ = f"GuardMissingOn{missing.name.title().replace('_', '')}"
    return GuardMissingOnFunnel


class UpdateNeverFlushes(ReferenceEndpoint):
    """Violates: ENG-001.

    Accepts updates while KV is live and never invalidates, whatever was asked; hit counters
    look normal. InternLM/lmdeploy #4917 (PF-08).
    """

    def _must_flush(self, funnel: Funnel, flush_cache: bool | None) -> bool:
        return False


class ForcesFlushOnStandardLane(ReferenceEndpoint):
    """Violates: ENG-011.

    Applies the exact-lane guard everywhere: standard lanes lose their cache on every
    update though the caller asked to keep it. Safe, so only a SHOULD (a performance note),
    seen only with ``exact_cache``; it was ENG-002 before that rule was narrowed to the
    unsafe direction. Seed contract SC-2.
    """

    exact_cache = True

    def _must_flush(self, funnel: Funnel, flush_cache: bool | None) -> bool:
        return self.config.radix or flush_cache is True


# ----- engines: fail-closed --------------------------------------------------------------


class SwallowsFailedFlush(ReferenceEndpoint):
    """Violates: FC-001.

    A mandatory flush that cannot run is skipped and the update still reports success.
    vllm-project/vllm PR #12284 (PF-03 at the update level); seed contract SC-3.
    """

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        flush = self._must_flush(funnel, flush_cache)
        self._install(version, funnel)
        if flush and self._can_flush():
            self._clear_cache()
        self.refuse_next_flush = False
        return Reply(True)


class ServesAfterFailedFlush(ReferenceEndpoint):
    """Violates: FC-002.

    Installs the weights, finds the flush refused and reports failure, but keeps serving
    from the stale tree. Seed contract SC-3.
    """

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        flush = self._must_flush(funnel, flush_cache)
        self._install(version, funnel)
        if flush and not self._can_flush():
            self.refuse_next_flush = False
            return Reply(False, message="flush refused")
        if flush:
            self._clear_cache()
        return Reply(True)


class CrashesAfterSwap(ReferenceEndpoint):
    """Violates: FC-001.

    Swaps the weights first, then asserts that the flush succeeded: a refused flush kills
    the engine, and the caller sees a dropped connection instead of a failure it can act
    on. areal-project/AReaL #140 (PF-04).
    """

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        flush = self._must_flush(funnel, flush_cache)
        self._install(version, funnel)
        if flush and not self._can_flush():
            self.refuse_next_flush = False
            return Reply(False, message="connection reset: scheduler died", lost=True)
        if flush:
            self._clear_cache()
        return Reply(True)


class FlushRefusalReportedAsSuccess(ReferenceEndpoint):
    """Violates: FC-003.

    ``/reset_prefix_cache`` is refused while blocks are in use, but the route answers
    success. vllm-project/vllm PR #12284 and #28827 (PF-03).
    """

    def flush_cache(self) -> Reply:
        reply = super().flush_cache()
        return Reply(True, flushed=True, message=reply.message)


class RetractBlocksFlush(ReferenceEndpoint):
    """Violates: LIV-001.

    Retracted requests waiting in the queue still count as holding KV, so retract-then-flush
    is refused. sgl-project/sglang PR #31962 (PF-05).
    """

    def _can_flush(self) -> bool:
        return not self.requests and not self.refuse_next_flush


class FlushesAroundPausedKv(ReferenceEndpoint):
    """Violates: FC-005.

    Only running requests block a flush; requests paused in place keep their old KV, the
    tree is cleared around them, and on resume they decode under the new weights on old KV.
    The idle gate forgets the paused requests: the update reports success, and the flush it
    ran, truthfully, went through KV a live request holds. vllm-project/vllm #54443 (PF-17).
    """

    def _can_flush(self) -> bool:
        return self.phase.value == "paused" or super()._can_flush()


class FlushSkipsIdleCheck(ReferenceEndpoint):
    """Violates: FC-005.

    ``/flush_cache`` called without a timeout flushes at once, skipping the scheduler's
    check that no request is running (the immediate path of SGLang's flush wrapper,
    described in sgl-project/sglang PR #36150): the tree and the pool are emptied under the
    running requests, whose pages the next prefills reuse, and the reply, success, is true.
    A request the idle check missed held a node of the freed tree in sgl-project/sglang PR
    #12107. PF-30's gate on a single engine; an injected refusal still refuses.
    """

    def flush_cache(self) -> Reply:
        if self.refuse_next_flush:
            return super().flush_cache()
        for req in self.requests.values():
            if not req.retracted:  # its pages are freed and reused: garbage, no version
                req.uses = {Use(u.component, GARBAGE) for u in req.uses}
        self._clear_cache()
        self.dirty = False
        return Reply(True, flushed=True)


# ----- engines: tiers, draft, LoRA, sleep, scales, labels --------------------------------


class FlushForgetsStorage(ReferenceEndpoint):
    """Violates: ENG-003.

    The flush clears device and host but not the storage tier; the prefix loads back from
    storage with old KV. sgl-project/sglang #26792 (PF-09).
    """

    def _clear_cache(self) -> None:
        for k in [k for k, kv in self.cache.items() if kv.tier is not Tier.STORAGE]:
            del self.cache[k]


class StorageLoadsBackStale(ReferenceEndpoint):
    """Violates: INV-001.

    The storage tier is a backend addressed by the prefix's tokens alone (HiCache's L3:
    a file store, Mooncake, 3FS). A flush clears the radix tree, both upper tiers and the
    tree's record of what storage holds, so the cache the engine shows is empty; but the
    backend keeps its pages, and a later miss on the prefix finds them by hash and loads
    the old KV back (the prefetch from storage). sgl-project/sglang #26792 (PF-09), seen
    where the cache view cannot show it: in what is served.
    """

    def evict(self, prefix: str, tier: Tier) -> Reply:
        reply = super().evict(prefix, tier)
        backend = self.__dict__.setdefault("backend", {})
        for k, kv in self.cache.items():
            if k[0] == prefix and kv.tier is Tier.STORAGE:
                backend[k] = CachedKV(kv.version, Tier.STORAGE, kv.lora, kv.namespace)
        return reply

    def _prefill(
        self, prefix: str, lora: bool, namespace: int | None = None
    ) -> tuple[set[Use], bool]:
        backend = self.__dict__.get("backend", {})
        for k in self._keys(prefix, lora, namespace):
            if k not in self.cache and k in backend:
                kv = backend[k]
                self.cache[k] = CachedKV(kv.version, Tier.STORAGE, kv.lora, kv.namespace)
        return super()._prefill(prefix, lora, namespace)


class FlushSparesQueuedRequests(ReferenceEndpoint):
    """Violates: ENG-003.

    The flush skips tree nodes still referenced by retracted requests waiting in the queue
    and reports success: after the update they resume on the old prefix KV. The naive fix
    for PF-05 (sgl-project/sglang PR #31962) gets this wrong; found by kvfence's own
    adversarial review.
    """

    def _clear_cache(self) -> None:
        queued = {r.prefix for r in self.requests.values() if r.retracted}
        for k in [k for k in self.cache if k[0] not in queued]:
            del self.cache[k]


class FlushForgetsEncoder(ReferenceEndpoint):
    """Violates: ENG-003.

    The flush resets the prefix cache but not the multimodal encoder cache.
    verl-project/verl #6523 (PF-10).
    """

    def _clear_cache(self) -> None:
        for k in [k for k in self.cache if k[1] is not Kind.ENCODER]:
            del self.cache[k]


class DraftLeftBehindOnDistributed(ReferenceEndpoint):
    """Violates: ENG-004.

    ``update_weights_from_distributed`` updates the target model only; the draft stays at
    its old version. sgl-project/sglang #27718 (PF-11).
    """

    def _install(self, version: int, funnel: Funnel) -> None:
        draft = self.draft
        super()._install(version, funnel)
        if funnel is Funnel.DISTRIBUTED:
            self.draft = draft


class LoadBackLosesDraftKv(ReferenceEndpoint):
    """Violates: ENG-008.

    Loading a prefix back from the host tier restores the target KV, but the draft KV slots
    hold unrelated data. sgl-project/sglang PR #17338 (PF-12).
    """

    def _load_back(self, key: Key) -> None:
        kv = self.cache[key]
        if kv.tier is not Tier.DEVICE and key[1] is Kind.DRAFT:
            kv.version = GARBAGE
        kv.tier = Tier.DEVICE


class LoraKeyedByName(ReferenceEndpoint):
    """Violates: ENG-007.

    LoRA KV is keyed by the adapter's name, so a same-name reload with new bytes hits the
    old blocks. vllm-project/vllm #42125 (PF-13); prime-rl PR #1650 (PF-07, LoRA load).
    """

    def _keys(self, prefix: str, lora: bool, namespace: int | None = None) -> list[Key]:
        keys = super()._keys(prefix, lora, namespace)
        return [(p, kind, None if rev is None else "adapter-A", ns) for p, kind, rev, ns in keys]

    def _forget_lora(self) -> None:
        """Nothing to forget: the name did not change."""


class SleepKeepsIndex(ReferenceEndpoint):
    """Violates: ENG-006.

    Sleep discards KV memory but keeps the prefix index: after wake-up a hit attends to
    garbage. vllm-project/vllm #17103 (PF-02).
    """

    def _on_sleep(self) -> None:
        for kv in self.cache.values():
            if kv.tier is Tier.DEVICE:
                kv.version = GARBAGE


class ScalesDroppedOnIpc(ReferenceEndpoint):
    """Violates: ENG-005.

    The IPC funnel loads the weights without the FP8 KV scales; every scale silently falls
    back to its default. NVIDIA-NeMo/RL #3225 (PF-14).
    """

    def _install(self, version: int, funnel: Funnel) -> None:
        scales = self.scales
        super()._install(version, funnel)
        if funnel is Funnel.IPC:
            self.scales = scales


class LabelNotRecordedOnIpc(ReferenceEndpoint):
    """Violates: INV-003.

    The IPC funnel never records the new weight-version label; the endpoint keeps claiming
    the old one. vllm-project/vime PR #45 (PF-15).
    """

    def _install(self, version: int, funnel: Funnel) -> None:
        label = self.label
        super()._install(version, funnel)
        if funnel is Funnel.IPC:
            self.label = label


class LabelsWithFinalVersion(ReferenceEndpoint):
    """Violates: INV-002.

    A response is attributed to the version in force when it finished, though earlier
    tokens were sampled under an older one. areal-project/AReaL PR #1569 (PF-16).
    """

    def _attribute(self, req: Request) -> set[int]:
        return {self.weights}


class HitPathNumericsDiffer(ReferenceEndpoint):
    """Violates: INV-004.

    On a cache hit the engine takes a different kernel path whose numerics differ from a
    cold prefill, on exact lanes too. sgl-project/sglang #34683 (PF-18).
    """

    def _numerics(self, prefix: str, uses: set, hit: bool) -> tuple[object, ...]:
        out = super()._numerics(prefix, uses, hit)
        return (*out, "hit-kernel") if hit else out


# ----- PF-21, PF-22 (shared/cases/more-faults.md) ----------------------------------------


class EncoderKeptOnOptOut(ReferenceEndpoint):
    """Violates: ENG-012.

    Encoder outputs follow the prefix-cache decision: an update the caller asked to run
    without a flush keeps them, though they are keyed by content only and so are stale the
    moment the weights change (the opt-out covers the prefix cache alone).
    vllm-project/vllm #44910 (PF-21).
    """

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        encoder = {k: kv for k, kv in self.cache.items() if k[1] is Kind.ENCODER}
        reply = super().update_weights(version, funnel, flush_cache)
        if reply.ok and not self._must_flush(funnel, flush_cache):
            self.cache.update(encoder)
        return reply


class FlushIsAStub(ReferenceEndpoint):
    """Violates: FC-003.

    The cache reset is a placeholder: it clears nothing and answers 200 with no result. A
    no-op flush must report failure, and this one reports no error at all, so the caller
    goes on as if the cache were clean. It also breaks LIV-001 (a flush nothing blocks must
    complete), which only a live run can show: a trace does not record a missing result.
    vllm-project/vllm-omni #6739 (PF-22; the same stubs in vllm-project/vllm-omni #5513).
    """

    def flush_cache(self) -> Reply:
        return Reply(True, flushed=None, message="reset_prefix_cache: placeholder, no-op")


class FlushStubClaimsSuccess(ReferenceEndpoint):
    """Violates: FC-003.

    The cache reset is a stub that clears nothing and reports success, so the caller
    believes the cache clean and the next request reuses old KV. vllm-project/vllm-omni
    #6739 (PF-22, the variant that answers True); vllm-project/vllm-omni #5513.
    """

    def flush_cache(self) -> Reply:
        return Reply(True, flushed=True, message="reset_prefix_cache: True")


class SessionPinnedNamespace(VersionKeyedCache):
    """Violates: INV-001.

    The serving layer salts each session with the weight version it started under and keeps
    that salt for the session's later turns, across weight updates: a continuing session
    reuses KV of the old weights under the new ones, silently. Some RL frameworks pin
    sessions on purpose; then the policy must say so (``Policy.off_policy_sessions``, with
    the pinned namespace on the request), and the reuse is reported instead of failed.
    PrimeIntellect-ai/prime-rl PR #2266 and #2687 (PF-24).
    """

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.sessions: dict[str, int] = {}

    def _keys(self, prefix: str, lora: bool, namespace: int | None = None) -> list[Key]:
        if namespace is None:
            namespace = self.sessions.setdefault(prefix, self.weights)
        return super()._keys(prefix, lora, namespace)


# ----- two-phase updates, derived weight state, restart oracle ----------------------------


class P2pPrepareWritesLive(ReferenceEndpoint):
    """Violates: WIN-001.

    The P2P prepare step writes the received chunks straight into the live parameters but
    the engine believes them staged: it keeps serving between prepare and finish as the
    old version (probe, label and attribution say v0, its KV is filed as v0 KV), so a
    finish that skips the flush reuses KV of the mixed weights. SGLang's P2P
    prepare/complete weight update; vLLM's layerwise reload writes live parameters too
    (``vllm/model_executor/model_loader/reload``).
    """

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.mixed = False

    def update_weight_chunk(self) -> Reply:
        window = self.window
        if window is None or window.failed or self.fail_next_chunk:
            return super().update_weight_chunk()
        window.landed, self.mixed = True, True  # written live, believed staged
        return Reply(True)

    def _install(self, version: int, funnel: Funnel) -> None:
        super()._install(version, funnel)
        self.mixed = False

    def abort_weight_update(self) -> Reply:
        self.mixed = False  # believes there is nothing to roll back
        return super().abort_weight_update()

    def _numerics(self, prefix: str, uses: set[Use], hit: bool) -> tuple[object, ...]:
        if self.mixed:  # what really computes: the mixed parameters
            uses = {Use(u.component, MIXED) if u.component == "target" else u for u in uses}
        return super()._numerics(prefix, uses, hit)


class FinishPublishesAfterFailedChunk(ReferenceEndpoint):
    """Violates: WIN-003.

    The finish of a window whose chunk failed still publishes the target version: the
    failure was logged per chunk and never reached the commit (SGLang's P2P prepare/complete
    split; FC-004 for bucketed transfers).
    """

    def finish_weight_update(self, flush_cache: bool | None) -> Reply:
        if self.window is not None:
            self.window.failed = False
        return super().finish_weight_update(flush_cache)


class DerivedSkippedOnTensorFunnel(ReferenceEndpoint):
    """Violates: DER-001.

    The tensor (direct load) funnel copies the new parameters but skips the post-load hook
    that rebuilds state derived from them (a transposed router gate, repacked quantized
    operands): every forward mixes v1 parameters with v0 derived tensors, cached or cold,
    while the label says v1. sgl-project/sglang PR #31937, issue #14158 (PF-20).
    """

    def _install(self, version: int, funnel: Funnel) -> None:
        derived = self.derived
        super()._install(version, funnel)
        if funnel is Funnel.TENSOR:
            self.derived = derived


class DerivedHiddenSkippedOnTensorFunnel(DerivedSkippedOnTensorFunnel):
    """The same fault behind a probe that cannot show derived state: only the restart
    oracle sees it (not catalogued: ``tests/test_twophase.py`` runs it)."""

    def weight_info(self) -> View:
        from attrs import evolve

        return evolve(super().weight_info(), derived=None)


class RelabelWithoutLoading(ReferenceEndpoint):
    """Violates: INV-003.

    An update records the new version (label and weights probe say v1) but the tensors are
    written into a detached copy of the parameters: the forward still computes v0. Its cold
    prefill runs on the same stale forward, so the byte oracle agrees with itself; only an
    engine freshly started at v1 (the restart oracle) shows the difference: the known false
    PASS of a same-engine oracle.
    """

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.computing = 0

    def _install(self, version: int, funnel: Funnel) -> None:
        super()._install(version, funnel)
        if funnel is Funnel.DISK:  # a start or restart loads the checkpoint for real
            self.computing = version

    def _numerics(self, prefix: str, uses: set[Use], hit: bool) -> tuple[object, ...]:
        """The forward computes ``computing`` throughout: its target tensors, and the state
        derived from them (rebuilt from the live parameters, which never changed)."""
        uses = {Use(u.component, self.computing) if u.component == "target" else u for u in uses}
        derived, self.derived = self.derived, self.computing
        try:
            return super()._numerics(prefix, uses, hit)
        finally:
            self.derived = derived


# ----- the catalog -----------------------------------------------------------------------


# ----- engines: memory release and version publishing ------------------------------------


class CrashOnFlushWhileKvReleased(ReferenceEndpoint):
    """Violates: MEM-001.

    A flush (an update's or a plain one) while the KV memory is released touches the
    released pools and the scheduler process dies. sgl-project/sglang PR #19029, regression
    PR #40480 (PF-19).
    """

    def _flush_while_released(self) -> Reply:
        self.cache.clear()
        return Reply(False, stopped=True, message="scheduler died: KV pool memory released")


class IndexKeptAcrossRelease(ReferenceEndpoint):
    """Violates: MEM-002.

    Releasing the KV memory stashes the radix tree and resuming it puts the tree back, but
    the pool came back without its contents: every restored entry points at garbage.
    Mirrors SGLang's stash-and-restore of the model's static state on a weights release,
    wrongly applied to the KV index (the contract of PF-02, vllm-project/vllm #17103, on
    the resume side).
    """

    def _on_sleep(self) -> None:
        self._stash = {k: kv for k, kv in self.cache.items() if kv.tier is Tier.DEVICE}
        super()._on_sleep()

    def _on_resume_kv(self) -> None:
        for k, kv in getattr(self, "_stash", {}).items():
            kv.version = GARBAGE
            self.cache[k] = kv
        self._stash = {}


class KvResumedStaleAfterWeightsOnlyUpdate(ReferenceEndpoint):
    """Violates: ENG-003.

    While the KV memory is released an update is treated as weights-only: "the KV is
    released, there is nothing to flush", so the flush is skipped and success reported.
    The KV that outlived the release (a HiCache host or storage tier) is resumed as it was,
    computed under the old weights. The tempting fix of PF-19 (sgl-project/sglang PR
    #19029).
    """

    def _flush_while_released(self) -> Reply:
        return Reply(True)


class PublishLabelWithoutWeights(ReferenceEndpoint):
    """Violates: PUB-001.

    ``/update_weight_version`` sets the label it is given without looking at the weights
    (as SGLang's and vLLM's handlers do): a label published ahead of its weights moves, the
    weights do not.
    """

    def publish_version(self, version: int, abort_requests: bool) -> Reply:
        aborted = self._publish_aborts(abort_requests)
        for rid in aborted:
            del self.requests[rid]
        self.label = version
        return Reply(True, aborted=aborted)


class PublishAbortsKeptRequests(ReferenceEndpoint):
    """Violates: PUB-002.

    Every publish aborts every in-flight request, asked or not (SGLang's
    ``UpdateWeightVersionReqInput.abort_all_requests`` defaults to aborting), including the
    requests a retract or in-place pause promised to keep.
    """

    def _publish_aborts(self, abort_requests: bool) -> frozenset[str]:
        return frozenset(self.requests)


class PauseClearCacheIgnored(ReferenceEndpoint):
    """Violates: FC-003.

    ``/pause?clear_cache=true`` pauses and reports the clear done, but the prefix cache is
    kept: a flush report that lies, and the flush-at-pause client then skips its own.
    (vLLM ``AsyncLLM.pause_generation`` with ``clear_cache``; the class of
    vllm-project/vllm PR #12284, PF-03.)
    """

    def _clear_on_pause(self) -> None:
        """Claims the clear, keeps everything."""


# ----- failed updates (shared/cases/deployments-and-failures.md) -------------------------


class ServesAfterRaisedFlush(ClosesOnRaisedFlush):
    """Violates: FC-002.

    The post-update flush raises after the weights were reloaded; the failure is reported
    (the worker answers 400, the router 502) but nothing closes the endpoint, and the next
    request hits the stale tree under the new weights. sgl-project/sglang-omni PR #678
    (PF-32); its fail-closed twin is ``closes-on-raised-flush`` (CD-19).
    """

    def _on_raised_flush(self) -> None:
        """The failure is logged and the endpoint keeps serving."""


class InPlacePauseRacesWeightWrite(DrainsOverlapBeforeWrite):
    """Violates: INV-001.

    With overlap scheduling, the batch launched before an in-place pause keeps running
    while the update writes the parameters: the KV it writes is of no version (half old,
    half new weights), yet it is filed as ordinary KV of the paused request and reused
    after the resume. An opt-out (``flush_cache=False``) covers KV of whole older weights,
    never this. sgl-project/sglang PR #27886, PR #25319 (PF-28); its correct twin is
    ``drains-overlap-before-write`` (CD-18).
    """

    def _drains(self) -> bool:
        return False


class BucketFailureKeepsServing(ReferenceEndpoint):
    """Violates: FC-004.

    A bucketed update copies its first buckets into the live parameters, the next bucket
    fails, and the abort clears only the staging state: the update reports failure, the
    live weights are mixed (the probe, reading the parameters, names no version), yet the
    serving gate consults the clean staging state and keeps serving on the mixed weights.
    NVIDIA/TensorRT-LLM PR #16642 (review), sgl-project/sglang-omni PR #784 (review); PF-27.
    """

    def fail_update_midway(self, version: int) -> Reply:
        self.torn, self.label = True, None
        return Reply(False, message="bucket 4/8 failed; staging cleared")

    @property
    def closed(self) -> bool:
        """The gate reads the staging state, which the abort cleaned: never torn."""
        return self.dirty

    def live(self) -> int:
        return MIXED if self.torn else self.weights


# ----- data-parallel ranks behind one endpoint ---------------------------------------------


class FlushFirstRankReply(MergesEveryFlushReply):
    """Violates: RNK-001.

    Fans the flush out to every rank but answers with the first rank's reply: rank 0
    emptied its tree, so the endpoint reports success while a rank where a request holds
    KV refused and keeps KV of the old weights. sgl-project/sglang PR #39562,
    lightseekorg/tokenspeed PR #1608 (PF-25).
    """

    def _merge_flush(self, replies: list[Reply]) -> Reply:
        return replies[0]


class UpdateFirstRankReply(RankedEndpoint):
    """Violates: RNK-002.

    Answers a DP weight update with the first rank's reply: rank 0 applied it, so the
    endpoint reports success and labels the new version while a rank that failed stays at
    the old weights and serves them as the new. sgl-project/sglang PR #39534, before the fix
    (PF-26).
    """

    def _merge_update(self, version: int, replies: list[Reply]) -> Reply:
        if replies[0].ok:
            self.torn, self.label = False, version
        return replies[0]


class FailedRankUpdateKeepsServing(RankedEndpoint):
    """Violates: RNK-003.

    Merges the update's replies honestly (failure, no version reported) but neither rolls
    back the ranks that moved nor closes: both ranks keep serving, each under its own
    weights. sgl-project/sglang PR #39534, after the fix (PF-26).
    """

    def _closed(self) -> bool:
        return False


# ----- a KV store shared by several endpoints ----------------------------------------------


class StoreKeyedByTokens(StoreEndpoint):
    """Violates: STO-001.

    Keys the shared store by the prompt's tokens alone (an empty key prefix): an endpoint
    updated to new weights, restarted or not, loads the KV it stored under the old ones,
    and endpoints of another lineage or KV format read each other's entries.
    InternLM/lmdeploy issue #4930, before PR #4932 (PF-31).
    """

    def _store_key(self, prefix: str) -> str:
        return prefix


# ----- prefill/decode deployments -----------------------------------------------------------


class DecodeServesAnyKvVersion(DecodeEndpoint):
    """Violates: PD-001.

    The decode engine attends to whatever KV the prefill engine transferred, under its own
    weights, without checking what version computed it: during a rolling update (one role
    updated, the other not yet) every request is decoded over KV of the other weights, hit
    or miss, while the decode engine's label names its own version; a transfer in flight
    when the decode side's update lands finishes over the old KV too.
    verl-project/verl PR #7616; sgl-project/sglang PR #18646; sgl-project/rbg issue #22
    (PF-29).
    """

    def _accepts(self, uses: set[Use]) -> bool:
        return True


class FlushFreesLiveTransfer(PrefillEndpoint):
    """Violates: FC-005.

    The prefill engine's ``/flush_cache`` reads a missing ``timeout`` as "flush now" and
    skips its idle check for KV transfers: a router that forwards the flush without the
    caller's timeout makes every flush free the pages a live transfer to the decode engine
    is still reading, and reports success, truthfully (the tree is empty). Requests running
    on the prefill engine itself still block it. sgl-project/sglang PR #36150 and PR #36152
    (PF-30).
    """

    decode_cls = DecodeEndpoint

    def flush_cache(self) -> Reply:
        if not ReferenceEndpoint._can_flush(self):  # its own requests and injected faults
            return super().flush_cache()
        self._clear_cache()
        self.dirty = False
        return Reply(True, flushed=True)


# ----- workers behind a router ---------------------------------------------------------------


class ReaddsTooEarly(RouterWorker):
    """Violates: RTR-001.

    ``/add_worker`` puts a worker back into rotation as soon as it is asked, without
    waiting for its sync to settle: a worker still paused for its update, at the old
    weights while the rest of the deployment moved, or with a tree whose flush has not
    run takes traffic again. The registration without a check that sgl-project/sglang PR
    #2392 adds one to, and that sgl-project/sglang-omni PR #1049 blocks while a weight
    update is unresolved.
    """

    def _settled(self) -> bool:
        return True


class ReaddsAtNewestWeights(RouterWorker):
    """Violates: RTR-001.

    A look-alike of the reference router: it puts a worker back once the worker's weights
    are the deployment's newest, but reads only the weight version: a worker still paused
    for its sync, or closed on a stale tree whose flush was refused, re-enters the
    rotation, so the sync's end is taken for its start.
    """

    def _settled(self) -> bool:
        router = self.router
        return router is None or self.weights == router.newest


@frozen
class Mutant:
    """One catalogued mutant: ``name``, the ``rule`` it must be killed by, whether it is a
    client or an engine (``side``), how to build it, and the public ``cases`` it covers."""

    name: str
    rule: str
    side: str
    build: Callable[[], object]
    cases: tuple[str, ...] = ()
    engine: str = "reference"
    """For a client mutant: the engine it runs against in the kill matrix."""

    @property
    def doc(self) -> str:
        obj = self.build()
        return (obj.__doc__ or "").strip()


def _engine(name: str, cls: type[ReferenceEndpoint], rule: str, *cases: str) -> Mutant:
    return Mutant(name, rule, "engine", lambda: cls, cases)


def _client(name: str, cls: type[ReferenceClient], rule: str, *cases: str) -> Mutant:
    return Mutant(name, rule, "client", cls, cases)


MUTANTS: tuple[Mutant, ...] = (
    _client("never-flush", NeverFlushClient, RuleId.CLI_001, "PF-01"),
    _client("unreported-means-disabled", UnreportedMeansDisabledClient, RuleId.CLI_002),
    _client("fp8-only", Fp8OnlyClient, RuleId.CLI_001),
    _client("identity-true", IdentityTrueClient, RuleId.CLI_013),
    _client("keeps-in-place-pause", KeepsInPlacePauseClient, RuleId.CLI_007),
    _client("in-place-skips-flush", InPlaceSkipsFlushClient, RuleId.CLI_007, "PF-06"),
    _engine("guard-yields-to-opt-out", GuardYieldsToOptOut, RuleId.ENG_001),
    *(
        _engine(
            f"guard-missing-on-{f.value.replace('_', '-')}",
            guard_missing_on(f),
            RuleId.ENG_001,
            *{"disk": ("PF-07",)}.get(f.value, ()),
        )
        for f in Funnel
    ),
    _engine("update-never-flushes", UpdateNeverFlushes, RuleId.ENG_001, "PF-08"),
    _engine("forces-flush-on-standard-lane", ForcesFlushOnStandardLane, RuleId.ENG_011),
    _engine("swallows-failed-flush", SwallowsFailedFlush, RuleId.FC_001),
    _engine("serves-after-failed-flush", ServesAfterFailedFlush, RuleId.FC_002),
    _engine("crashes-after-swap", CrashesAfterSwap, RuleId.FC_001, "PF-04"),
    _engine(
        "flush-refusal-reported-as-success", FlushRefusalReportedAsSuccess, RuleId.FC_003, "PF-03"
    ),
    _engine("retract-blocks-flush", RetractBlocksFlush, RuleId.LIV_001, "PF-05"),
    _engine("flushes-around-paused-kv", FlushesAroundPausedKv, RuleId.FC_005, "PF-17"),
    _engine("flush-skips-idle-check", FlushSkipsIdleCheck, RuleId.FC_005, "PF-30"),
    _engine("flush-forgets-storage", FlushForgetsStorage, RuleId.ENG_003, "PF-09"),
    _engine("storage-loads-back-stale", StorageLoadsBackStale, RuleId.INV_001, "PF-09"),
    _engine("flush-forgets-encoder", FlushForgetsEncoder, RuleId.ENG_003, "PF-10"),
    _engine("flush-spares-queued-requests", FlushSparesQueuedRequests, RuleId.ENG_003),
    _engine(
        "draft-left-behind-on-distributed", DraftLeftBehindOnDistributed, RuleId.ENG_004, "PF-11"
    ),
    _engine("load-back-loses-draft-kv", LoadBackLosesDraftKv, RuleId.ENG_008, "PF-12"),
    _engine("lora-keyed-by-name", LoraKeyedByName, RuleId.ENG_007, "PF-13"),
    _engine("sleep-keeps-index", SleepKeepsIndex, RuleId.ENG_006, "PF-02"),
    _engine("scales-dropped-on-ipc", ScalesDroppedOnIpc, RuleId.ENG_005, "PF-14"),
    _engine("label-not-recorded-on-ipc", LabelNotRecordedOnIpc, RuleId.INV_003, "PF-15"),
    _engine("labels-with-final-version", LabelsWithFinalVersion, RuleId.INV_002, "PF-16"),
    _engine("hit-path-numerics-differ", HitPathNumericsDiffer, RuleId.INV_004, "PF-18"),
    # shared/cases/more-faults.md
    _engine("encoder-kept-on-opt-out", EncoderKeptOnOptOut, RuleId.ENG_012, "PF-21"),
    _engine("flush-is-a-stub", FlushIsAStub, RuleId.FC_003, "PF-22"),
    _engine("flush-stub-claims-success", FlushStubClaimsSuccess, RuleId.FC_003, "PF-22"),
    _engine("session-pinned-namespace", SessionPinnedNamespace, RuleId.INV_001, "PF-24"),
    # memory release tags, version publishing, pause(clear_cache)
    _engine(
        "crash-on-flush-while-kv-released", CrashOnFlushWhileKvReleased, RuleId.MEM_001, "PF-19"
    ),
    _engine("index-kept-across-release", IndexKeptAcrossRelease, RuleId.MEM_002),
    _engine(
        "kv-resumed-stale-after-weights-only-update",
        KvResumedStaleAfterWeightsOnlyUpdate,
        RuleId.ENG_003,
    ),
    _engine("publish-label-without-weights", PublishLabelWithoutWeights, RuleId.PUB_001),
    _engine("publish-aborts-kept-requests", PublishAbortsKeptRequests, RuleId.PUB_002),
    _engine("pause-clear-cache-ignored", PauseClearCacheIgnored, RuleId.FC_003),
    # two-phase updates, derived weight state, restart oracle
    _engine("p2p-prepare-writes-live", P2pPrepareWritesLive, RuleId.WIN_001),
    _engine("finish-publishes-after-failed-chunk", FinishPublishesAfterFailedChunk, RuleId.WIN_003),
    _engine(
        "derived-skipped-on-tensor-funnel", DerivedSkippedOnTensorFunnel, RuleId.DER_001, "PF-20"
    ),
    _engine("relabel-without-loading", RelabelWithoutLoading, RuleId.INV_003),
    # failed updates (shared/cases/deployments-and-failures.md)
    _engine("serves-after-raised-flush", ServesAfterRaisedFlush, RuleId.FC_002, "PF-32"),
    _engine("bucket-failure-keeps-serving", BucketFailureKeepsServing, RuleId.FC_004, "PF-27"),
    _engine(
        "in-place-pause-races-weight-write", InPlacePauseRacesWeightWrite, RuleId.INV_001, "PF-28"
    ),
    # data-parallel ranks behind one endpoint
    _engine("flush-first-rank-reply", FlushFirstRankReply, RuleId.RNK_001, "PF-25"),  # type: ignore[arg-type]
    _engine("update-first-rank-reply", UpdateFirstRankReply, RuleId.RNK_002, "PF-26"),  # type: ignore[arg-type]
    _engine(
        "failed-rank-update-keeps-serving",
        FailedRankUpdateKeepsServing,  # type: ignore[arg-type]
        RuleId.RNK_003,
        "PF-26",
    ),
    # a KV store shared by several endpoints
    _engine("store-keyed-by-tokens", StoreKeyedByTokens, RuleId.STO_001, "PF-31"),  # type: ignore[arg-type]
    # prefill/decode deployments
    _engine("decode-serves-any-kv-version", DecodeServesAnyKvVersion, RuleId.PD_001, "PF-29"),
    _engine("flush-frees-live-transfer", FlushFreesLiveTransfer, RuleId.FC_005, "PF-30"),
    # workers behind a router
    _engine("readds-too-early", ReaddsTooEarly, RuleId.RTR_001),  # type: ignore[arg-type]
    _engine("readds-at-newest-weights", ReaddsAtNewestWeights, RuleId.RTR_001),  # type: ignore[arg-type]
)


def _program_mutants() -> tuple[Mutant, ...]:
    """Client programs that make one mistake in their call sequence (``programs.py``)."""
    from .programs import (
        Endpoint0InfoOnly,
        PrefixOnlyReset,
        RefusedResetIgnored,
        RequeueAcrossVersions,
        ResetBeforeFinishProgram,
        ResumesAfterFailedUpdate,
        TwoPhaseFinishWithoutFlush,
    )

    return (
        Mutant(
            "reset-before-finish", RuleId.CLI_008, "client", ResetBeforeFinishProgram, ("PF-23",)
        ),
        Mutant("refused-reset-ignored", RuleId.CLI_010, "client", RefusedResetIgnored),
        Mutant("resumes-after-failed-update", RuleId.CLI_014, "client", ResumesAfterFailedUpdate),
        Mutant("endpoint0-info-only", RuleId.CLI_001, "client", Endpoint0InfoOnly),
        Mutant(
            "prefix-only-reset", RuleId.CLI_009, "client", PrefixOnlyReset, engine=ENCODER_ENGINE
        ),
        # requeue across versions
        Mutant("requeue-across-versions", RuleId.CLI_012, "client", RequeueAcrossVersions),
        # two-phase sync
        Mutant(
            "two-phase-finish-without-flush", RuleId.CLI_001, "client", TwoPhaseFinishWithoutFlush
        ),
    )


ENCODER_ENGINE = "encoder-left-to-client"
"""The engine a client mutant about the encoder cache is run against: one whose update
leaves that cache to the client (``designs.EncoderLeftToClient``)."""

MUTANTS = (*MUTANTS, *_program_mutants())

BY_NAME: dict[str, Mutant] = {m.name: m for m in MUTANTS}
