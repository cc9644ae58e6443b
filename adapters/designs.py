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

from collections.abc import Callable
from typing import ClassVar

from attrs import frozen

from kvfence.model.state import Config
from kvfence.model.vocabulary import Funnel, Kind, PauseMode

from .reference import ClosingEndpoint, Key, ReferenceEndpoint, Reply

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


def _engine(name: str, case: str | None, cls: type[ReferenceEndpoint]) -> Design:
    return Design(name, case, "engine", lambda: cls)


def _programs() -> tuple[Design, ...]:
    """The correct client programs (``adapters/programs.py``), run against the reference."""
    from .programs import (
        AnyOnFlushesEverywhere,
        ColocatedProgram,
        ReferenceProgram,
        TwoPhaseProgram,
    )

    return (
        Design("reference-program", None, "client", ReferenceProgram),
        Design("any-on-flushes-everywhere", None, "client", AnyOnFlushesEverywhere),
        # lifecycle and two-phase syncs (spec 0.3)
        Design("colocated-program", None, "client", ColocatedProgram),
        Design("two-phase-program", None, "client", TwoPhaseProgram),
    )


DESIGNS: tuple[Design, ...] = (
    _engine("reference", None, ReferenceEndpoint),
    _engine("reference-closing", None, ClosingEndpoint),
    _engine("pause-abort-clears-cache", "CD-01", PauseAbortClearsCache),
    _engine("sleep-flushes-every-tier", "CD-02", SleepFlushesEveryTier),
    _engine("version-keyed-cache", "CD-03", VersionKeyedCache),
    _engine("encoder-follows-weights", "CD-04", EncoderFollowsWeights),
    _engine("omitted-flush-means-flush", "CD-05", OmittedFlushMeansFlush),
    _engine("radix-off-skips-flush", "CD-06", RadixOffSkipsFlush),
    _engine("stops-on-refused-flush", "CD-07", StopsOnRefusedFlush),
    _engine("aborts-then-flushes", "CD-08", AbortsThenFlushes),
    _engine("always-flushes", "CD-09", AlwaysFlushes),
    # client programs and the engine profile they are checked on (docs/clients.md)
    _engine("encoder-left-to-client", None, EncoderLeftToClient),
    *_programs(),
)

BY_NAME: dict[str, Design] = {d.name: d for d in DESIGNS}
BY_CASE: dict[str, Design] = {d.case: d for d in DESIGNS if d.case is not None}

__all__ = [
    "BY_CASE",
    "BY_NAME",
    "DESIGNS",
    "AbortsThenFlushes",
    "AlwaysFlushes",
    "Design",
    "EncoderFollowsWeights",
    "EncoderLeftToClient",
    "OmittedFlushMeansFlush",
    "PauseAbortClearsCache",
    "RadixOffSkipsFlush",
    "SleepFlushesEveryTier",
    "StopsOnRefusedFlush",
    "VersionKeyedCache",
]
