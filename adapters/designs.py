"""Correct designs that differ from the reference: the pass matrix beside the kill matrix.

The contract is about safety: no token attends to KV computed under other weights, a flush
that was required really happened (or the update failed closed), and every report is
honest. It allows much more than ``ReferenceEndpoint`` does. Each design here is safe, is
shipped or proposed by a real engine or RL framework, and must PASS: a checker that fails a
correct system gets switched off by the people it is for (``shared/cases/correct-designs.md``,
CD-01..CD-07).

Like a mutant, each design is a ``ReferenceEndpoint`` subclass that overrides one decision,
so the difference from the reference is the whole design. The first line of its docstring
is ``Keeps: RULE, ...``: the rules whose safety it keeps by other means than the reference;
then the public source it mirrors. ``tests/test_designs.py`` shows every one passing at the
ci profile and under the product explorer; ``kvfence mutants`` prints them as the pass
matrix (``conformance/matrix.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, ClassVar

from attrs import frozen

from ..model.state import Config, Use
from ..model.vocabulary import (
    ALL_MEMORY,
    GARBAGE,
    MIXED,
    Funnel,
    Kind,
    MemoryTag,
    PauseMode,
    Phase,
    Tier,
)
from .pd import DecodeEndpoint, PrefillEndpoint
from .ranks import RankedEndpoint
from .reference import CachedKV, ClosingEndpoint, Key, ReferenceEndpoint, Reply, Request
from .router import RouterWorker
from .store import SharedStore, StoreEndpoint

# ----- CD-01 ------------------------------------------------------------------------------


class PauseAbortClearsCache(ReferenceEndpoint):
    """Keeps: ENG-002, ENG-009, INV-001.

    ``pause(abort)`` ends every in-flight request and also clears the prefix cache: dropping
    KV is always safe, it only costs cold prefills. vLLM's ``POST /pause`` takes
    ``mode="abort"`` and ``clear_cache=True`` by default (vllm-project/vllm
    ``vllm/entrypoints/rl/online/api_router.py``, passed to ``AsyncLLM.pause_generation`` in
    ``vllm/v1/engine/async_llm.py``); aborted requests hold no KV, so the clear cannot be
    refused.
    """

    def pause_generation(self, mode: PauseMode, clear_cache: bool = False) -> Reply:
        reply = super().pause_generation(mode, clear_cache)
        if mode is PauseMode.ABORT:
            self.cache.clear()
        return reply


# ----- CD-02 ------------------------------------------------------------------------------


class SleepFlushesEveryTier(ReferenceEndpoint):
    """Keeps: ENG-006, ENG-003.

    Sleep releases KV memory through a full flush: every tier and kind is emptied before the
    memory goes, and the result is checked (an index left non-empty is a failed sleep). The
    fix for PF-02 (vllm-project/vllm #17103), not a fault. SGLang's scheduler
    ``release_memory_occupation`` (sgl-project/sglang ``python/sglang/srt/managers/``,
    ``scheduler.py`` in older releases, its weight-update mixin in newer ones) pauses the
    ``kv_cache`` memory and calls ``flush_cache``; upstream ignores the flush's result, this
    design checks it.
    """

    def _on_sleep(self) -> None:
        self._clear_cache()
        if self.cache:
            raise RuntimeError("sleep: the flush left entries behind; not releasing memory")


class ResetsPrefixCacheOnWake(ReferenceEndpoint):
    """Keeps: ENG-006, MEM-002.

    Releasing the KV memory leaves the prefix index as it is; resuming the KV memory resets
    the index first, before the endpoint can serve again. Nothing is served while the KV
    memory is released, so an index that outlives its memory only until the resume never
    attends to garbage: the cleanup of PF-02 (vllm-project/vllm #17103) moved from the
    sleep to the wake, where an engine that resets its prefix cache in ``wake_up`` does it.
    A flush while asleep empties the index as the reference's does.
    """

    def _on_sleep(self) -> None:
        """The memory goes; its index stays listed until the resume (nothing is served)."""

    def _on_resume_kv(self) -> None:
        for k in [k for k, kv in self.cache.items() if kv.tier is Tier.DEVICE]:
            del self.cache[k]


class FlushesInsideSleep(ReferenceEndpoint):
    """Keeps: ENG-006, FC-003.

    Releasing the KV memory runs the engine's own ``/flush_cache`` first, as SGLang's
    scheduler ``release_memory_occupation`` does with the ``kv_cache`` tag
    (sgl-project/sglang, see ``SleepFlushesEveryTier``): an injected refusal of "the next
    flush" is spent on that internal flush, so the caller's next flush succeeds. Refused or
    not, the release then discards the device KV and its index (ENG-006).
    """

    def sleep(self, tags: frozenset[MemoryTag] = ALL_MEMORY) -> Reply:
        if MemoryTag.KV_CACHE in tags and MemoryTag.KV_CACHE not in self.released:
            self.flush_cache()  # its result changes nothing: the release drops the index
        return super().sleep(tags)


# ----- CD-03 ------------------------------------------------------------------------------


class VersionKeyedCache(ReferenceEndpoint):
    """Keeps: INV-001, ENG-001.

    Every prefix is keyed by the weight version in force, as an RL framework does by sending
    a per-request ``cache_salt`` (vLLM ``vllm/v1/core/kv_cache_utils.py`` makes it an extra
    key of the first block's hash) or ``extra_key`` (SGLang ``GenerateReqInput.extra_key`` in
    ``python/sglang/srt/managers/io_struct.py``) equal to that version. KV of older weights
    can never be matched again, so an update never deletes anything: old entries stay listed
    until evicted, unreachable. The profile declares ``versioned_keys`` so that the spec
    knows. An update that must invalidate while a request still holds KV of the old weights
    is refused, like the reference's (that request would decode on old KV). An explicit
    ``/flush_cache`` still empties everything: it is asked for.
    """

    profile: ClassVar[dict[str, bool]] = {"versioned_keys": True}

    def _keys(self, prefix: str, lora: bool, namespace: int | None = None) -> list[Key]:
        """A request without its own salt is salted with the version now loaded."""
        return super()._keys(prefix, lora, self.weights if namespace is None else namespace)

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        invalidate = self._must_flush(funnel, flush_cache)
        if invalidate and not self._can_flush():
            self.refuse_next_flush = False
            return Reply(False, message="requests hold KV of the old weights; not updated")
        self._install(version, funnel)  # the salt moves with the weights: nothing deleted
        self._drop_derived()
        return Reply(True)


# ----- CD-04 ------------------------------------------------------------------------------


class EncoderFollowsWeights(ReferenceEndpoint):
    """Keeps: ENG-003, INV-001.

    Encoder (multimodal) outputs are keyed by content only, so they are dropped on every
    weight update whatever the caller asked; the prefix cache is kept unless a flush is
    asked for. The split vLLM's maintainers settled on (vllm-project/vllm #44910): the GPU
    model runner's ``reload_weights`` (``vllm/v1/worker/gpu_model_runner.py``) clears the
    encoder and multimodal caches itself and leaves the prefix cache to the caller's
    ``reset_prefix_cache``. The fault it fixes is PF-21.
    """

    def _install(self, version: int, funnel: Funnel) -> None:
        super()._install(version, funnel)
        for k in [k for k in self.cache if k[1] is Kind.ENCODER]:
            del self.cache[k]


# ----- CD-05 ------------------------------------------------------------------------------


class OmittedFlushMeansFlush(ReferenceEndpoint):
    """Keeps: ENG-001, ENG-002.

    An update request that omits ``flush_cache`` flushes: SGLang's update request types
    default the field to true (``UpdateWeightFromDiskReqInput``,
    ``UpdateWeightsFromTensorReqInput``, ``UpdateWeightsFromDistributedReqInput`` in
    sgl-project/sglang ``python/sglang/srt/managers/io_struct.py``), and so do the seed
    fork's (togethercomputer/xorl-sglang). Only an explicit ``flush_cache=False`` keeps the
    prefix cache on a standard lane. The profile declares this default (``flush_default``)
    and the spec applies it.
    """

    profile: ClassVar[dict[str, bool]] = {"flush_default": True}

    def _must_flush(self, funnel: Funnel, flush_cache: bool | None) -> bool:
        """The request type's default, written in the engine's own code."""
        return self.config.guarded or flush_cache is not False


# ----- CD-06 ------------------------------------------------------------------------------


class RadixOffSkipsFlush(ReferenceEndpoint):
    """Keeps: FC-001, FC-003, ENG-002.

    With the radix cache off there is no tree to flush: an update that asks for a flush
    skips it, even while requests run, and reports success. The update is honest: nothing
    can ever be reused. SGLang with ``--disable-radix-cache`` serves from a ``ChunkCache``
    (sgl-project/sglang ``python/sglang/srt/mem_cache/chunk_cache.py``, "used when
    RadixCache is disabled"): its ``match_prefix`` never matches and its ``reset`` has
    nothing to drop.
    """

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        if self.config.radix:
            return super().update_weights(version, funnel, flush_cache)
        if self._must_flush(funnel, flush_cache):
            # The asked-for flush is a no-op that cannot be refused; an injected refusal of
            # "the next flush" is spent on it.
            self.refuse_next_flush = False
        self._install(version, funnel)
        self._drop_derived()
        return Reply(True, message="radix cache off: nothing to flush")


class RadixOffFlushesWhileRunning(ReferenceEndpoint):
    """Keeps: LIV-001, FC-003.

    With the radix cache off and nothing on any tier, ``/flush_cache`` has nothing to drop,
    so it answers success even while requests run, where the reference refuses: LIV-001's
    gate keeps a flush from dropping KV a request holds, and with no tree there is none to
    drop. SGLang with ``--disable-radix-cache`` serves from a ``ChunkCache``
    (sgl-project/sglang ``python/sglang/srt/mem_cache/chunk_cache.py``), whose ``reset``
    has nothing to remove. An injected refusal is still a refusal.
    """

    def flush_cache(self) -> Reply:
        if self.config.radix or self.cache or self.refuse_next_flush:
            return super().flush_cache()
        return Reply(True, flushed=True, message="radix cache off: nothing to flush")


# ----- CD-07 ------------------------------------------------------------------------------


class StopsOnRefusedFlush(ReferenceEndpoint):
    """Keeps: FC-001, FC-002.

    On an exact lane, a mandatory flush that is refused raises and the engine process
    exits: no success reply is sent (the caller's connection drops) and nothing is served
    until the process is restarted. Safety holds; the cost is availability. The seed fork's
    guard (togethercomputer/xorl-sglang
    ``python/sglang/srt/managers/scheduler_components/weight_updater.py``,
    ``flush_cache_after_weight_update``): the weights are swapped first, the forced flush is
    refused while requests are in flight, a ``RuntimeError`` escapes the scheduler loop.
    On a standard lane a refused flush the client asked for is answered with a clean failure
    (the fork's bare ``assert`` there is PF-04, the ``crashes-after-swap`` mutant).
    """

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.stopped = False

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        if self.stopped:
            return _gone()
        if not (self.config.guarded and not self._can_flush()):
            return super().update_weights(version, funnel, flush_cache)
        self._install(version, funnel)
        self.refuse_next_flush = False
        self.stopped = True  # the process is gone, and everything it held with it
        self.requests.clear()
        self.cache.clear()
        return Reply(
            False, message="RuntimeError escaped the scheduler; process exited", stopped=True
        )

    def restart(self) -> None:
        super().restart()
        self.stopped = False

    # A process that has exited answers nothing; the spec enables only Restart there, so
    # these are what a client that tries anyway would see.

    def generate(self, prefix: str, lora: bool = False, namespace: int | None = None) -> Reply:
        return _gone() if self.stopped else super().generate(prefix, lora, namespace)

    def start(
        self, rid: str, prefix: str, lora: bool = False, namespace: int | None = None
    ) -> Reply:
        return _gone() if self.stopped else super().start(rid, prefix, lora, namespace)

    def flush_cache(self) -> Reply:
        return _gone() if self.stopped else super().flush_cache()


def _gone() -> Reply:
    return Reply(False, message="connection refused: the engine process has exited")


# ----- CD-08 ------------------------------------------------------------------------------


class AbortsThenFlushes(ReferenceEndpoint):
    """Keeps: FC-001, ENG-001, ENG-009.

    On an exact lane, a mandatory flush that is refused is made possible: the engine aborts
    every request holding KV (running, or paused in place; retracted requests hold none and
    stay queued), flushes again, and the update succeeds with the cache empty. Fail-closed by
    removing the reason for the refusal; the cost is the aborted requests (an availability
    note). vLLM's scheduler does the same for a reset it must not lose:
    ``reset_prefix_cache(reset_running_requests=True)`` (vllm-project/vllm
    ``vllm/v1/core/sched/scheduler.py``) pushes every running request off its KV blocks
    before resetting, and raises if the reset still fails. The update reply lists the
    aborted request IDs.
    """

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        if not (self.config.guarded and not self._can_flush()):
            return super().update_weights(version, funnel, flush_cache)
        self.refuse_next_flush = False  # the first flush attempt was refused
        holders = frozenset(rid for rid, r in self.requests.items() if not r.retracted)
        for rid in holders:
            del self.requests[rid]
        reply = super().update_weights(version, funnel, flush_cache)
        if not reply.ok:
            raise RuntimeError("flush refused even after aborting every request holding KV")
        return Reply(True, aborted=holders, message=f"aborted {sorted(holders)} to flush")


# ----- CD-09 ------------------------------------------------------------------------------


class AlwaysFlushes(ReferenceEndpoint):
    """Keeps: ENG-002, FC-001.

    Every weight update flushes the prefix cache, whatever ``flush_cache`` says: dropping
    more than asked is always safe (ENG-011 makes it a performance note only). When the
    flush cannot run (a request holds KV, or the flush is refused) the update is rejected
    before any tensor is touched, even if the caller opted out of the flush: the engine
    cannot honour both its own rule and the opt-out, and a clean rejection is honest. The
    shape of SGLang's update handlers with ``flush_cache`` hard-wired to true (its request
    types default it to true, sgl-project/sglang ``python/sglang/srt/managers/io_struct.py``)
    and a flush that refuses while requests run (the scheduler's ``flush_cache``); it came to
    kvfence from an adversarial trial, and no shipped engine is known to hard-wire it.
    """

    def _must_flush(self, funnel: Funnel, flush_cache: bool | None) -> bool:
        return True


# ----- CD-10..CD-15: the lifecycle rules (memory tags, publishing, windows,
# derived state), each kept by other means than the reference ---------------------------


class RefusesFlushWhileKvReleased(ReferenceEndpoint):
    """Keeps: MEM-001, ENG-003.

    While the KV memory is released, a flush, or an update that must flush, is refused
    cleanly: the reply reports failure and nothing changes (the update touches no tensor;
    the index and lower tiers stay as they were, all of them KV of the weights still
    installed). The caller resumes ``kv_cache`` first and then updates. The reference
    instead runs such a flush on the index alone and answers success (sgl-project/sglang
    PR #19029, PF-19's fix); refusing is the other answer MEM-001 allows, and it is what
    SGLang's scheduler ``flush_cache`` already does whenever it cannot run safely (it
    returns failure when the scheduler is not idle, ``python/sglang/srt/managers/
    scheduler.py``). The cost is availability: the colocated order (release all, resume
    weights, update with ``flush_cache``, resume KV) must resume KV before the update.
    """

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        if MemoryTag.KV_CACHE in self.released and self._must_flush(funnel, flush_cache):
            self.refuse_next_flush = False  # the flush was attempted: a pending fault is spent
            return Reply(False, message="KV memory released: resume kv_cache first; not updated")
        return super().update_weights(version, funnel, flush_cache)

    def _flush_while_released(self) -> Reply:
        return Reply(False, message="KV memory released: flush refused, nothing changed")


class LabelsOnlyWithUpdates(ReferenceEndpoint):
    """Keeps: PUB-001, PUB-002.

    The label moves only together with the weights: every update (and a window's finish)
    sets it to the version it installed, and a label-only publish (PublishVersion) is
    refused, whatever version it names, and changes nothing (no label move, no abort). The
    engine has no ``/update_weight_version`` route of its own: the label travels with the
    update, as vLLM's ``finish_weight_update(weight_version)`` does (``vllm/entrypoints/
    serve/dev/rlhf/api_router.py``, ``POST /finish_weight_update`` with
    ``weight_version``) and SGLang's update requests with their ``weight_version`` field
    (``python/sglang/srt/managers/io_struct.py``). The reference accepts a publish of the
    version its whole weights are; this design refuses that too, which is safe (a refused
    publish lies about nothing) and costs the caller a label it could have set.
    """

    def publish_version(self, version: int, abort_requests: bool) -> Reply:
        return Reply(False, message="labels are published with updates only")


class AbortsBeforePublishCheck(ReferenceEndpoint):
    """Keeps: PUB-002, PUB-001.

    A publish with ``abort_requests`` aborts every in-flight request first, as asked, and
    only then checks that the weights back the label: a publish the weights do not back is
    refused, with the requests already aborted, and says so (their IDs in the reply).
    SGLang's HTTP handler for ``/update_weight_version`` runs in that order
    (``UpdateWeightVersionReqInput.abort_all_requests``: ``abort_request(abort_all=True)``
    before ``_update_weight_version_if_provided``, sgl-project/sglang
    ``python/sglang/srt/entrypoints/http_server.py``); this design adds the weights check
    SGLang lacks. The aborts were asked for, so PUB-002 holds; the label stays (PUB-001).
    """

    def publish_version(self, version: int, abort_requests: bool) -> Reply:
        aborted = self._publish_aborts(abort_requests)
        for rid in aborted:
            del self.requests[rid]
        reply = super().publish_version(version, abort_requests=False)
        return Reply(reply.ok, aborted=aborted, message=reply.message)


class RefusesInsideWindow(ClosingEndpoint):
    """Keeps: WIN-001, WIN-002.

    While a two-phase update window is open the endpoint serves nothing: every new request
    is refused, a request in flight is aborted when it would decode, and retracted requests
    wait; from the first chunk to the finish or abort no token is computed, so no KV of the
    mixed weights exists. SGLang's tokenizer manager holds every ``generate`` behind
    ``model_update_lock`` (the reader side) while an update holds the writer side
    (``python/sglang/srt/managers/tokenizer_manager.py``); this design keeps the lock for
    the whole window and answers at once instead of queueing. The reference serves under the
    mixed weights (probe unlabelled), and its closing variant refuses only once a chunk has
    landed; this one refuses from the begin.
    """

    @property
    def closed(self) -> bool:
        return self.window is not None or super().closed


class StagesChunksAside(ReferenceEndpoint):
    """Keeps: WIN-001, WIN-003.

    Chunks received inside a window are staged in a side buffer that no forward reads: the
    live weights stay the old version, whole and labelled, and the endpoint serves them
    inside the window, correctly attributed to the old version. The finish swaps the staged
    tensors in whole (then it is a one-shot update: flush, label); a failed chunk or an
    abort drops the buffer, and the old weights never changed. The shape of RD211/actors
    (``docs/updating_weights.md``: workers move streamed weight batches to a CPU cache and
    apply them once all have arrived) and of SGLang's P2P prepare/complete split when
    prepare really stages; vLLM's layerwise reload instead writes the live
    parameters (``vllm/model_executor/model_loader/reload``), the reference's shape.
    """

    def _land_chunk(self, window: Any) -> Reply:
        return Reply(True)  # staged: nothing the forward reads has changed

    def _fail_chunk(self) -> Reply:
        return Reply(False, message="chunk failed; the staged buffer was dropped")


class DerivedRebuiltLazily(ReferenceEndpoint):
    """Keeps: DER-001.

    State derived from the weights (a transposed router gate, repacked quantized operands)
    is rebuilt lazily: an update only loads the parameters, and the first forward after it
    compares the derived state's version with the weights' and rebuilds before computing.
    No token is ever computed with derived state of other weights, but between an update
    and the next forward the probe shows the old derived version. The reference rebuilds in
    a post-load hook, as vLLM's ``process_weights_after_loading``
    (``vllm/model_executor/model_loader/utils.py``) and SGLang's ``post_load_weights``
    (``python/sglang/srt/models/deepseek_v2.py``) do; moving that hook behind a version
    check is the fix shape for hooks a funnel forgets (sgl-project/sglang PR #31937, PF-20).
    """

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.loaded = 0  # the version of the parameters last loaded whole

    def _install(self, version: int, funnel: Funnel) -> None:
        derived = self.derived
        super()._install(version, funnel)
        self.loaded, self.derived = version, derived  # rebuilt by the next forward, not here

    def _forward(self) -> None:
        if self.derived != self.loaded:
            self.derived = self.loaded  # the version check before every forward

    def generate(self, prefix: str, lora: bool = False, namespace: int | None = None) -> Reply:
        if not self.closed:
            self._forward()
        return super().generate(prefix, lora, namespace)

    def start(
        self, rid: str, prefix: str, lora: bool = False, namespace: int | None = None
    ) -> Reply:
        if not self.closed:
            self._forward()
        return super().start(rid, prefix, lora, namespace)

    def finish(self, rid: str) -> Reply:
        if not self.closed:
            self._forward()
        return super().finish(rid)

    def continue_generation(self) -> Reply:
        if not self.closed and any(r.retracted for r in self.requests.values()):
            self._forward()  # the retracted requests' recompute
        return super().continue_generation()

    def cold_output(self, prefix: str, lora: bool = False) -> tuple[object, ...]:
        self._forward()  # the byte oracle's cold prefill is a forward too
        return super().cold_output(prefix, lora)


# ----- failed updates: CD-19 and an engine that refuses updates while requests exist -------


class ClosesOnRaisedFlush(ReferenceEndpoint):
    """Keeps: FC-001, FC-002.

    The post-update flush can raise after the weights were reloaded (here, whenever the
    radix tree holds KV of two or more prefixes: a stand-in for the backend error of
    sgl-project/sglang-omni PR #678, where ``update_weights_from_disk`` reloads the
    weights and then the flush raises). The reply is a failure, and the endpoint serves
    nothing until a flush completes on the whole new weights; a later ``/flush_cache``
    (which does not raise) reopens it (CD-19).
    """

    def _flush_raises(self) -> bool:
        """Whether the flush run inside an update raises: two or more prefixes cached."""
        return len({key[0] for key in self.cache}) >= 2

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        flush = self._must_flush(funnel, flush_cache)
        released = MemoryTag.KV_CACHE in self.released
        if not (flush and self._can_flush() and not released and self._flush_raises()):
            return super().update_weights(version, funnel, flush_cache)
        self._install(version, funnel)
        self._drop_derived()
        self._on_raised_flush()
        return Reply(False, message="weights reloaded; the post-update flush raised")

    def _on_raised_flush(self) -> None:
        """Closed until a flush completes (FC-002)."""
        self.dirty = True


class RefusesUpdatesWhileRequestsExist(ReferenceEndpoint):
    """Keeps: FC-001, LIV-001.

    Takes a weight update only when no request is in flight (running, paused in place, or
    retracted and queued): otherwise it refuses the update before any tensor is touched,
    whatever was asked about the flush, and changes nothing. A refused update is always
    allowed; the flush rules are not at stake (the engine never refused a flush), and its
    explicit ``/flush_cache`` is the reference's (LIV-001). The shape of a scheduler that
    applies updates only between batches, as SGLang's ``update_weights_from_*`` routes do
    behind ``pause_generation`` (sgl-project/sglang
    ``python/sglang/srt/managers/tokenizer_manager.py``), with the wait replaced by a
    refusal.
    """

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        if self.requests:
            return Reply(False, message="requests in flight: update refused, nothing changed")
        return super().update_weights(version, funnel, flush_cache)


# ----- CD-18 ------------------------------------------------------------------------------


class DrainsOverlapBeforeWrite(ReferenceEndpoint):
    """Keeps: INV-001.

    Overlap scheduling: the batch launched before an in-place pause may still be running
    when the pause returns. Before the first weight write the engine waits for that
    forward to finish, so the KV its frozen requests hold is all of the old weights, whole,
    and the update may run with ``flush_cache=False`` under the usual opt-out (CD-18: the
    race of sgl-project/sglang PR #27886 and PR #25319, drained). ``no_version`` holds the
    prefixes whose KV a forward wrote while the weights were being written: none here.
    """

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.no_version: set[Key] = set()

    def _drains(self) -> bool:
        """Whether the overlapped forward finishes before the first weight write."""
        return True

    def _overlapped(self) -> list[Request]:
        """Requests frozen by an in-place pause, whose last forward may still be running."""
        if self.phase is not Phase.PAUSED:
            return []
        return [r for r in self.requests.values() if not r.retracted]

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        racing = [] if self._drains() else self._overlapped()
        reply = super().update_weights(version, funnel, flush_cache)
        if reply.ok:
            for req in racing:  # its KV was written under weights half old, half new
                keys = self._keys(req.prefix, req.lora, req.namespace)
                self.no_version |= {k for k in keys if k in self.cache and k[1] is Kind.TARGET}
                req.uses = {
                    Use(u.component, MIXED) if u.component == "target" else u for u in req.uses
                }
        return reply

    def _prefill(
        self, prefix: str, lora: bool, namespace: int | None = None
    ) -> tuple[set[Use], bool]:
        uses, hit = super()._prefill(prefix, lora, namespace)
        keys = self._keys(prefix, lora, namespace)
        if hit and self.no_version.intersection(keys):
            live = self.live()
            uses = {
                Use("target", MIXED) if u.component == "target" and u.version != live else u
                for u in uses
            }
        return uses, hit

    def _insert(self, keys: list[Key], lora: bool) -> None:
        """Freshly computed KV is of the weights in force."""
        self.no_version.difference_update(keys)
        super()._insert(keys, lora)


# ----- data-parallel ranks behind one endpoint (RNK-001..003) ------------------------------


class MergesEveryFlushReply(RankedEndpoint):
    """Keeps: RNK-001.

    The flush goes to every rank at once and the endpoint's reply is the merge of every
    reply: success only if all succeeded. A rank where a request holds KV refuses, so the
    endpoint reports failure although the other ranks already emptied their trees (dropping
    KV is always safe). The DP controller's merge after sgl-project/sglang PR #39562 and
    lightseekorg/tokenspeed PR #1608 (CD-16).
    """

    def _every_rank_can_flush(self) -> bool:
        """No pre-check: each rank answers for itself, and the merge says the truth."""
        return True


class ClosesOnAnyRankFailure(RankedEndpoint):
    """Keeps: RNK-002, RNK-003.

    An update that fails on any rank closes the endpoint, even when no rank moved, with no
    rollback of the ranks that did: it reports no version and refuses to serve until the
    next update succeeds on every rank (CD-17; sgl-project/sglang PR #39534 review).
    """

    def _merge_update(self, version: int, replies: list[Reply]) -> Reply:
        failed = [k for k, r in enumerate(replies) if not r.ok]
        if not failed:
            return super()._merge_update(version, replies)
        self.torn, self.label = True, None
        return Reply(False, message=f"rank(s) {failed} failed: closed until a whole update")


class RollsBackMovedRanks(RankedEndpoint):
    """Keeps: RNK-002, RNK-003.

    An update that fails on any rank rolls back the ranks that moved: each rank keeps its
    old weights and cache aside until every rank has installed the new ones, and puts them
    back on a failure, so the endpoint stays open at its old version with its cache (the
    spec's other branch of RNK-002; the rollback sgl-project/sglang PR #39534's review asks
    of a DP update, as FC-004's of a bucketed one).
    """

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        kept = copy.deepcopy(self.ranks, {id(self.config): self.config})
        reply = super().update_weights(version, funnel, flush_cache)
        if not reply.ok:
            self.ranks = kept
            self.torn = False
            return Reply(False, message=f"{reply.message}; every rank rolled back")
        return reply

    def _merge_update(self, version: int, replies: list[Reply]) -> Reply:
        failed = [k for k, r in enumerate(replies) if not r.ok]
        if not failed:
            return super()._merge_update(version, replies)
        return Reply(False, message=f"rank(s) {failed} failed")


# ----- the catalog ------------------------------------------------------------------------


@frozen
class Design:
    """One catalogued correct design: ``name`` (registry name), ``case`` (CD-NN, or None
    for the two reference systems), ``side`` (engine or client), how to ``build`` it."""

    name: str
    case: str | None
    side: str
    build: Callable[[], object]

    @property
    def doc(self) -> str:
        return (self.build().__doc__ or "").strip()

    @property
    def keeps(self) -> tuple[str, ...]:
        """The rules of its ``Keeps:`` line."""
        first = self.doc.splitlines()[0] if self.doc else ""
        if not first.startswith("Keeps: "):
            return ()
        return tuple(r.strip() for r in first.removeprefix("Keeps: ").rstrip(".").split(","))


# ----- the encoder cache left to the client -----------------------------------------------


class EncoderLeftToClient(ReferenceEndpoint):
    """Keeps: ENG-012, INV-001.

    A weight update and a prefix-cache reset leave the encoder cache alone; the engine
    exposes its reset as a call of its own, and the client owes it (CLI-009). vLLM keeps
    ``reset_encoder_cache`` (and ``reset_mm_cache``) beside ``reset_prefix_cache``
    (vllm-project/vllm ``vllm/v1/engine/async_llm.py``); vllm-project/vllm-omni #6739 shows
    the three resets needed after an update. Safe as long as the client calls it: the
    reference client does (``resolver_sync`` resets every separately exposed kind).
    """

    profile: ClassVar[dict[str, bool]] = {"encoder_reset_separate": True}

    def _drop_derived(self) -> None:
        """The update leaves encoder outputs to the client's reset."""

    def _clear_cache(self) -> None:
        """A prefix reset: every tier of target and draft KV, not the encoder cache."""
        for k in [k for k in self.cache if k[1] is not Kind.ENCODER]:
            del self.cache[k]


# ----- a storage tier that keeps the entries of the weights in force -----------------------


class KeepsCurrentStorage(ReferenceEndpoint):
    """Keeps: ENG-003, ENG-010, FC-003.

    The storage tier of a hierarchical cache is a disk store whose entries carry the weight
    version (and LoRA revision, namespace) that computed them, and it outlives flushes and
    process restarts: a flush empties device and host and drops the storage entries of any
    other weights, but keeps those of the weights in force; a restart reopens the store and
    keeps the entries of the checkpoint it loads. Nothing it keeps is stale: an update's
    flush runs after the new weights are installed, so every entry of the old ones goes.
    A pause that clears the cache empties every tier, since the update that follows may skip
    its own flush. SGLang's HiCache L3 backends persist pages across restarts
    (sgl-project/sglang ``python/sglang/srt/mem_cache/hicache_storage.py``, ``HiCacheFile``
    keyed by a hash chain of token ids) and LMCache's local-disk backend keys a chunk by model
    name and KV format (LMCache/LMCache ``lmcache/utils.py``, ``CacheEngineKey``); this design
    adds the weight version to that key and keeps what matches.
    """

    def _kept(self, key: Key, kv: CachedKV) -> bool:
        """An entry of the weights, LoRA revision and namespace in force, on the storage tier."""
        version = self.draft if key[1] is Kind.DRAFT else self.weights
        namespace_ok = kv.namespace is None or kv.namespace == self.weights
        lora_ok = kv.lora is None or kv.lora == self.lora_rev
        whole = not self.torn and kv.version not in (MIXED, GARBAGE)
        return (
            kv.tier is Tier.STORAGE and whole and kv.version == version and namespace_ok and lora_ok
        )

    def _clear_cache(self) -> None:
        for k in [k for k, kv in self.cache.items() if not self._kept(k, kv)]:
            del self.cache[k]

    def _clear_on_pause(self) -> None:
        """A clearing pause empties every tier: the next update may skip its own flush."""
        self.cache.clear()
        self.dirty = False

    def restart(self) -> None:
        disk = {k: kv for k, kv in self.cache.items() if kv.tier is Tier.STORAGE}
        super().restart()
        for k, kv in disk.items():
            if self._kept(k, kv):
                self.cache[k] = CachedKV(kv.version, Tier.STORAGE, kv.lora, kv.namespace)


# ----- a KV store shared by several endpoints (STO-001) ------------------------------------


class KeysStoreByWeights(StoreEndpoint):
    """Keeps: STO-001.

    The reference store endpoint as the public design: the store's key carries the prompt,
    the weight lineage, the weight version and the KV format (``StoreEndpoint._store_key``),
    so entries of older weights, of another model or of another KV layout are never matched
    again, across endpoints and restarts, and no flush of the store is needed: old entries
    stay, unreachable, until evicted (CD-20; InternLM/lmdeploy PR #4932). SGLang's L3
    backends (sgl-project/sglang ``python/sglang/srt/mem_cache/hicache_storage.py``,
    ``HiCacheStorage``) key a page by a hash chain of its token ids: this design puts the
    weights' identity in front of that chain.
    """


class RotatesStoreNamespace(StoreEndpoint):
    """Keeps: STO-001.

    A shared store whose keys carry the prompt and a namespace that rotates: every load
    of weights (start, update, restart) takes a namespace the store never handed out
    before, so no entry written under earlier weights, or by another endpoint, ever matches
    again. Keys carry no lineage, version or format, and need none. Costs: no entry is
    shared across endpoints or restarts (the hit rate, never the safety). The shape of a
    key prefix changed on every update in front of the token-hash key of an L3 backend
    (sgl-project/sglang ``python/sglang/srt/mem_cache/hicache_storage.py``; InternLM/lmdeploy
    PR #4932's fix of PF-31)."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.namespace: int | None = None

    def attach(self, store: SharedStore | None) -> None:
        super().attach(store)
        self.namespace = None if store is None else store.fresh_namespace()

    def _install(self, version: int, funnel: Funnel) -> None:
        super()._install(version, funnel)
        if self.store is not None:
            self.namespace = self.store.fresh_namespace()

    def _store_key(self, prefix: str) -> tuple[int | None, str]:
        return (self.namespace, prefix)


# ----- prefill/decode deployments (PD-001, FC-005) ------------------------------------------


class ChecksTransferredKvVersion(DecodeEndpoint):
    """Keeps: PD-001, FC-005.

    The reference P/D engines as a design: the decode engine checks the weight version
    the transferred KV was computed under against its own (a version tag carried with the
    transfer) and refuses the request when they differ, and aborts a live one whose KV an
    update on its side outdated; the prefill engine's flush waits for (refuses during)
    every live transfer. The shape of SGLang's disaggregation transfer
    (sgl-project/sglang ``python/sglang/srt/disaggregation/decode.py``, the decode side's
    prealloc and transfer queues) with the version check PR #18646 adds to a rolling
    update (PF-29)."""


class HoldsAdmissionAcrossVersions(DecodeEndpoint):
    """Keeps: PD-001, FC-005.

    Pauses both roles while they are at two versions: the decode engine asks the prefill
    engine's weight version before any prefill runs (its bootstrap handshake) and admits
    nothing while it differs from its own, so during a rolling update (prefill first,
    then decode, as verl-project/verl PR #7616 orders it) no request is prefilled at all
    between the two updates; the prefill engine then computes nothing it would have to
    throw away. Costs: requests wait (here: are refused) for the whole rolling window.
    sgl-project/sglang ``python/sglang/srt/disaggregation/`` bootstrap server."""

    def _transfer(self, prefix: str) -> tuple[set[Use], bool] | None:
        p = self.prefill
        if p is not None and (p.live() != self.live() or p.closed):
            return None  # held at admission: no prefill runs
        return super()._transfer(prefix)


class DrainsTransfersBeforeUpdate(PrefillEndpoint):
    """Keeps: PD-001, FC-005.

    Drains the transfers before any weight moves: the prefill engine refuses an update
    (changing nothing, reported as a failure the trainer retries after the drain) while a
    transfer it computed is live, whether or not the update asks for a flush; the decode
    engine does the same while it holds a live request. So no transfer is in flight
    across an update on either side, and the flush of an update never meets live KV.
    The drain a rolling P/D update of sgl-project/rbg issue #22 asks for, in the shape of
    sgl-project/sglang's ``POST /pause_generation`` followed by an update once the queues
    are empty."""

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        if self.live_transfers():
            return Reply(False, message="transfers in flight: drain them, then update")
        return super().update_weights(version, funnel, flush_cache)


class DrainingDecode(DecodeEndpoint):
    """The decode engine of ``DrainsTransfersBeforeUpdate``: refuses an update while it
    holds a live request (sgl-project/rbg issue #22's drain)."""

    prefill_cls = DrainsTransfersBeforeUpdate

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        if any(not r.retracted for r in self.requests.values()):
            return Reply(False, message="requests in flight: drain them, then update")
        return super().update_weights(version, funnel, flush_cache)


DrainsTransfersBeforeUpdate.decode_cls = DrainingDecode


# ----- workers behind a router (RTR-001) ----------------------------------------------------


class DrainsServingWorkers(RouterWorker):
    """Keeps: RTR-001.

    The reference router as a design: an update of a serving worker in rotation drains it
    first (it leaves the rotation, then updates), a paused one is updated in place (the
    whole rotation paused: no traffic is admitted), and ``/add_worker`` puts a worker back
    only once its sync settled (serving, not closed, at the deployment's newest weights, no
    KV of other weights in its tree). The shape of SGLang's model gateway registering a
    worker only after its health check passes (sgl-project/sglang PR #2392) and of
    sgl-project/sglang-omni PR #1049, whose router keeps a worker disabled while its weight
    update is unresolved."""


class DrainsAndReadds(RouterWorker):
    """Keeps: RTR-001.

    Takes every worker out of rotation before its update, paused or not (worker out,
    update and flush, settle, back in), and puts it back only once its sync settled: the
    rolling update of a deployment behind a router, one worker at a time, in the order
    sgl-project/sglang issue #4282 describes (update each worker behind the router on its
    own), with the gateway's ``/remove_worker`` and ``/add_worker``
    (sgl-project/sglang PR #2380, PR #2369)."""

    def _drain_for_update(self) -> bool:
        return self.rotation


class UpdatesPausedRotation(RouterWorker):
    """Keeps: RTR-001.

    Never takes a worker out for an update: it refuses the update of a worker in rotation
    that is serving (the trainer pauses the whole rotation first), and updates paused
    workers in place, so the rotation never changes during a sync and no traffic reaches a
    worker until the sync continues it. Unlike the reference, nothing is drained. The
    shape of a trainer that pauses every worker behind the router, updates each, and
    continues each (sgl-project/sglang ``POST /pause_generation`` then
    ``/update_weights_from_disk`` per worker)."""

    def _drain_for_update(self) -> bool:
        return False

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        if self.rotation and self.phase is Phase.SERVING:
            return Reply(False, message="worker serves in rotation: pause the rotation first")
        return super().update_weights(version, funnel, flush_cache)


def _engine(name: str, case: str | None, cls: type[ReferenceEndpoint]) -> Design:
    return Design(name, case, "engine", lambda: cls)


def _programs() -> tuple[Design, ...]:
    """The correct client programs (``adapters/programs.py``), run against the reference."""
    from .clients import BoolOnlyFallbackClient
    from .programs import (
        AnyOnFlushesEverywhere,
        ColocatedProgram,
        ReferenceProgram,
        RequeueLabelsEveryVersion,
        RetriesFailedUpdate,
        TwoPhaseProgram,
    )

    return (
        Design("bool-only-fallback", None, "client", BoolOnlyFallbackClient),
        Design("reference-program", None, "client", ReferenceProgram),
        Design("any-on-flushes-everywhere", None, "client", AnyOnFlushesEverywhere),
        Design("retries-failed-update", None, "client", RetriesFailedUpdate),
        Design("requeue-labels-every-version", None, "client", RequeueLabelsEveryVersion),
        # lifecycle and two-phase syncs
        Design("colocated-program", None, "client", ColocatedProgram),
        Design("two-phase-program", None, "client", TwoPhaseProgram),
    )


DESIGNS: tuple[Design, ...] = (
    _engine("reference", None, ReferenceEndpoint),
    _engine("reference-closing", None, ClosingEndpoint),
    _engine("pause-abort-clears-cache", "CD-01", PauseAbortClearsCache),
    _engine("sleep-flushes-every-tier", "CD-02", SleepFlushesEveryTier),
    _engine("resets-prefix-cache-on-wake", None, ResetsPrefixCacheOnWake),
    _engine("flushes-inside-sleep", None, FlushesInsideSleep),
    _engine("version-keyed-cache", "CD-03", VersionKeyedCache),
    _engine("encoder-follows-weights", "CD-04", EncoderFollowsWeights),
    _engine("omitted-flush-means-flush", "CD-05", OmittedFlushMeansFlush),
    _engine("radix-off-skips-flush", "CD-06", RadixOffSkipsFlush),
    _engine("radix-off-flushes-while-running", None, RadixOffFlushesWhileRunning),
    _engine("stops-on-refused-flush", "CD-07", StopsOnRefusedFlush),
    _engine("aborts-then-flushes", "CD-08", AbortsThenFlushes),
    _engine("always-flushes", "CD-09", AlwaysFlushes),
    # the lifecycle rules: memory tags, publishing, windows, derived state
    _engine("refuses-flush-while-kv-released", "CD-10", RefusesFlushWhileKvReleased),
    _engine("labels-only-with-updates", "CD-11", LabelsOnlyWithUpdates),
    _engine("aborts-before-publish-check", "CD-12", AbortsBeforePublishCheck),
    _engine("refuses-inside-window", "CD-13", RefusesInsideWindow),
    _engine("stages-chunks-aside", "CD-14", StagesChunksAside),
    _engine("derived-rebuilt-lazily", "CD-15", DerivedRebuiltLazily),
    # failed updates (shared/cases/deployments-and-failures.md)
    _engine("drains-overlap-before-write", "CD-18", DrainsOverlapBeforeWrite),
    _engine("closes-on-raised-flush", "CD-19", ClosesOnRaisedFlush),
    # data-parallel ranks behind one endpoint (checked on ranks.RANKS_CONFIGS, explored on
    # the ranks deployment; on a config of one rank each is the reference scheduler)
    _engine("merges-every-flush-reply", "CD-16", MergesEveryFlushReply),  # type: ignore[arg-type]
    _engine("closes-on-any-rank-failure", "CD-17", ClosesOnAnyRankFailure),  # type: ignore[arg-type]
    _engine("rolls-back-moved-ranks", None, RollsBackMovedRanks),  # type: ignore[arg-type]
    # a KV store shared by several endpoints (checked on store.STORE_CONFIGS, explored on
    # the store deployment; on an endpoint without the store each is the reference)
    _engine("keys-store-by-weights", "CD-20", KeysStoreByWeights),
    _engine("rotates-store-namespace", None, RotatesStoreNamespace),
    # prefill/decode deployments (checked on pd.PD_CONFIGS, explored on the pd deployment)
    _engine("checks-transferred-kv-version", None, ChecksTransferredKvVersion),
    _engine("holds-admission-across-versions", None, HoldsAdmissionAcrossVersions),
    _engine("drains-transfers-before-update", None, DrainsTransfersBeforeUpdate),
    # workers behind a router (checked on router.ROUTER_CONFIGS, explored on the router
    # deployment)
    _engine("drains-serving-workers", None, DrainsServingWorkers),
    _engine("drains-and-readds", None, DrainsAndReadds),
    _engine("updates-paused-rotation", None, UpdatesPausedRotation),
    # a storage tier that keeps the entries of the weights in force across flushes, restarts
    _engine("keeps-current-storage", None, KeepsCurrentStorage),
    # (RefusesUpdatesWhileRequestsExist is correct but never updates with a request in
    # flight, so INV-002 cannot be exercised on it: its passes are shown by its own test)
    # client programs and the engine profile they are checked on (docs/clients.md)
    _engine("encoder-left-to-client", None, EncoderLeftToClient),
    *_programs(),
)

DEFERRED_DESIGNS: dict[str, int] = {
    "CD-21": 41,
    "CD-22": 41,
    "CD-23": 41,
    "CD-24": 41,
    "CD-25": 41,
    "CD-26": 41,
}
"""Correct designs of the shared case files not catalogued yet, each with the number of the
tracker issue that will express them (shared/cases/shipped-designs.md: each avoids the harm
another way than the reference, and passes only once mechanism deviations without harm are
notes, not FAILs); ``tests/test_cases.py`` names each as a skip."""

BY_NAME: dict[str, Design] = {d.name: d for d in DESIGNS}
BY_CASE: dict[str, Design] = {d.case: d for d in DESIGNS if d.case is not None}

ALLOWANCES: tuple[str, ...] = (
    "radix-off-flushes-while-running",
    "resets-prefix-cache-on-wake",
    "keeps-current-storage",
    "flushes-inside-sleep",
)
"""The designs of a correct engine unlike the reference, one per allowance of docs/spec.md
("What a correct engine may do": cleanup at another lifecycle point, entries of the weights
in force kept by a flush or a restart, an engine's own flush spending an injected refusal).
The main job runs these at ten times the ci budget on every setup (``kvfence mutants
--designs-times 10 --designs-times-only``): the tests of a spec that bounds what is safe
without prescribing the reference's choices."""

__all__ = [
    "ALLOWANCES",
    "BY_CASE",
    "BY_NAME",
    "DEFERRED_DESIGNS",
    "DESIGNS",
    "AbortsBeforePublishCheck",
    "AbortsThenFlushes",
    "AlwaysFlushes",
    "ChecksTransferredKvVersion",
    "ClosesOnAnyRankFailure",
    "ClosesOnRaisedFlush",
    "DerivedRebuiltLazily",
    "Design",
    "DrainsAndReadds",
    "DrainsOverlapBeforeWrite",
    "DrainsServingWorkers",
    "DrainsTransfersBeforeUpdate",
    "EncoderFollowsWeights",
    "EncoderLeftToClient",
    "FlushesInsideSleep",
    "HoldsAdmissionAcrossVersions",
    "KeepsCurrentStorage",
    "KeysStoreByWeights",
    "LabelsOnlyWithUpdates",
    "MergesEveryFlushReply",
    "OmittedFlushMeansFlush",
    "PauseAbortClearsCache",
    "RadixOffFlushesWhileRunning",
    "RadixOffSkipsFlush",
    "RefusesFlushWhileKvReleased",
    "RefusesInsideWindow",
    "RefusesUpdatesWhileRequestsExist",
    "ResetsPrefixCacheOnWake",
    "RollsBackMovedRanks",
    "RotatesStoreNamespace",
    "SleepFlushesEveryTier",
    "StagesChunksAside",
    "StopsOnRefusedFlush",
    "UpdatesPausedRotation",
    "VersionKeyedCache",
]
