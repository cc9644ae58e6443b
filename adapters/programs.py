"""Client programs: weight-sync code as an RL trainer writes it, correct and faulty.

A client program is ``sync(endpoints, version, policy) -> None`` (``docs/clients.md``):
it gets one handle per endpoint (``Endpoint`` below, implemented by
``kvfence.conformance.program.EndpointHandle``) and makes the engine calls of one weight
sync itself. kvfence applies each call to the engine and the model in lockstep and judges
the sequence (CLI-007..011, ``kvfence.model.obligations``).

Each program is a class with a ``name`` and a ``sync`` method. The correct ones must PASS
(the pass matrix); each mutant makes one general mistake, seen in public code, and its
docstring's first line names the rule that kills it (the kill matrix).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ..model.state import Policy
from ..model.vocabulary import PauseMode
from .clients import ReferenceClient

RETRIES = 3
"""How often a correct program asks again for a refused reset before it gives up on the
endpoint (leaves it paused and fails the sync)."""


class Endpoint(Protocol):
    """The handle a program gets for one endpoint (see ``conformance/program.py``)."""

    index: int
    cache_kinds: tuple[str, ...]

    def server_info(self) -> Mapping[str, object] | None: ...
    def pause(self, mode: str | PauseMode = PauseMode.RETRACT) -> bool: ...
    def update_weights(
        self, version: int, funnel: str | None = None, flush_cache: bool | None = None
    ) -> bool: ...
    def flush_cache(self, kind: str = "prefix") -> bool: ...
    def continue_generation(self) -> bool: ...
    @property
    def aborted(self) -> dict[str, tuple[int, ...]]: ...
    def requeue_request(self, rid: str, keep_partial: bool = True) -> bool: ...
    def deliver_response(self, rid: str, versions: Sequence[int]) -> bool: ...
    def publish_version(self, version: int, abort_requests: bool = False) -> bool: ...
    def release_memory(self, tags: Sequence[str] | None = None) -> bool: ...
    def resume_memory(self, tags: Sequence[str] | None = None) -> bool: ...
    def begin_update(self, version: int, funnel: str | None = None) -> bool: ...
    def update_chunk(self) -> bool: ...
    def finish_update(self, flush_cache: bool | None = None) -> bool: ...
    def abort_update(self) -> bool: ...


class ProgramClient:
    """A client program under test: ``fn(endpoints, version, policy)``, shown as ``name``."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn = fn
        self.name = name

    def sync(self, endpoints: Sequence[Endpoint], version: int, policy: Policy) -> None:
        self.fn(endpoints, version, policy)


def is_program(client: object) -> bool:
    """``client`` is a program (has ``sync``), not a resolver (``resolve``)."""
    return callable(getattr(client, "sync", None)) and not hasattr(client, "resolve")


def check_signature(fn: Callable[..., Any], spec_text: str) -> None:
    """``ValueError`` unless ``fn`` can be called as ``fn(endpoints, version, policy)``."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: let the call say
    try:
        signature.bind(object(), 0, Policy())
    except TypeError as e:
        raise ValueError(
            f"client program {spec_text!r}: {fn.__name__}{signature} cannot be called as "
            f"sync(endpoints, version, policy) ({e})"
        ) from None


def load_program(spec_text: str) -> ProgramClient:
    """``"package.module:function"`` -> a ``ProgramClient``; ``ValueError`` names what is
    wrong (not ``module:function``, not importable, not callable, wrong signature)."""
    module_name, sep, attr = spec_text.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"client program {spec_text!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as e:  # ImportError, SyntaxError, SystemExit of the module
        raise ValueError(
            f"client program {spec_text!r}: cannot import {module_name!r}: {type(e).__name__}: {e}"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"client program {spec_text!r}: {module_name} has no function {attr!r}")
    check_signature(fn, spec_text)
    return ProgramClient(fn, f"program:{spec_text}")


class SyncFailed(RuntimeError):
    """A correct program's way to fail a sync: some endpoints are left paused."""


_DECIDE = ReferenceClient()  # the reference resolver's decision, reused by the programs


def pause_for(policy: Policy, flush: bool) -> PauseMode:
    """The configured pause, upgraded from ``in_place`` to ``retract`` when flushing
    (CLI-007: in-place paused requests hold KV and the flush would be refused, PF-06)."""
    return _DECIDE.pause_mode(policy, flush)


def reset(ep: Endpoint, kind: str) -> bool:
    """Reset one cache kind, asking again when refused (an injected fault or KV released
    meanwhile), at most ``RETRIES`` times; the last answer."""
    return any(ep.flush_cache(kind) for _ in range(RETRIES))


class ReferenceProgram:
    """Keeps: CLI-001, CLI-002, CLI-004, CLI-008, CLI-010, CLI-011.

    A correct program, written as trainers write it against SGLang or vLLM: pause, update
    without the engine's flush, then reset every stale cache kind itself (sgl-project/sglang
    ``/flush_cache``, vllm-project/vllm ``reset_prefix_cache`` / ``reset_encoder_cache``),
    retrying a
    refused reset (pytorch/rl PR #4016 retries a partial reset); an endpoint whose reset
    keeps failing stays paused and the sync fails.

    Decides per endpoint from its own server info, as the reference resolver does
    (``radix_cache_enabled`` wins, else ``disable_radix_cache``; unknown means on).
    """

    name = "reference-program"

    def wants_flush(self, policy: Policy, info: Mapping[str, object] | None) -> bool:
        return _DECIDE.wants_flush(policy, info)

    def decide(self, policy: Policy, infos: list[Mapping[str, object] | None]) -> list[bool]:
        """Whether to reset each endpoint's prefix cache."""
        return [self.wants_flush(policy, info) for info in infos]

    engine_flush = False
    """Whether the prefix-cache reset rides on the update (``flush_cache=True``) rather than
    a separate reset after it; the other cache kinds are reset separately either way."""

    def sync(self, endpoints: Sequence[Endpoint], version: int, policy: Policy) -> None:
        infos = [ep.server_info() for ep in endpoints]
        stuck = []
        for ep, flush in zip(endpoints, self.decide(policy, infos), strict=True):
            ep.pause(pause_for(policy, flush))
            if not self.update(ep, version, flush and self.engine_flush):
                stuck.append(ep.index)  # the engine failed closed (FC-001): stay paused
                continue
            separate = flush and not self.engine_flush
            kinds = [k for k in ep.cache_kinds if k != "prefix" or separate]
            if all([self.reset(ep, k) for k in kinds]):
                ep.continue_generation()
            else:
                stuck.append(ep.index)
        if stuck:
            raise SyncFailed(f"endpoints {stuck} left paused: an update or a reset failed")

    def update(self, ep: Endpoint, version: int, flush: bool) -> bool:
        """One update of ``ep`` to ``version``; whether the engine reported success."""
        return ep.update_weights(version, flush_cache=flush)

    def reset(self, ep: Endpoint, kind: str) -> bool:
        return reset(ep, kind)


class AnyOnFlushesEverywhere(ReferenceProgram):
    """Keeps: CLI-001, CLI-002, CLI-004, CLI-008, CLI-011.

    Decides once for all endpoints, as the xorl resolver does: with
    ``cache_invalidation_mode=auto``, if any endpoint reports its radix cache on or unknown,
    every endpoint is flushed (an extra flush only costs cold prefills), through the
    update's own ``flush_cache=True``. Correct although it decides across endpoints.
    """

    name = "any-on-flushes-everywhere"

    def decide(self, policy: Policy, infos: list[Mapping[str, object] | None]) -> list[bool]:
        each = super().decide(policy, infos)
        if policy.mode.value == "auto" and policy.flush_cache is not True:
            return [any(each)] * len(infos)
        return each

    engine_flush = True


class RetriesFailedUpdate(ReferenceProgram):
    """Keeps: CLI-001, CLI-002, CLI-004, CLI-011, CLI-014.

    Answers a refused or failed update by asking again, at most ``RETRIES`` times, with
    the engine's own flush where the plan wants one (an update refused because a request
    held KV may go through once it finished); an endpoint whose update keeps failing stays
    paused and the sync fails. Unlike the reference program it never resets separately:
    the update's ``flush_cache`` is the reset. What it retries on is the failure reply of
    sglang's update routes (``{"success": false, "message": ...}`` from
    ``/update_weights_from_disk``, python/sglang/srt/entrypoints/http_server.py).
    """

    name = "retries-failed-update"
    engine_flush = True

    def update(self, ep: Endpoint, version: int, flush: bool) -> bool:
        return any(ep.update_weights(version, flush_cache=flush) for _ in range(RETRIES))


# ----- mutants -----------------------------------------------------------------------------


class ResumesAfterFailedUpdate(ReferenceProgram):
    """Violates: CLI-014.

    Never reads the update's answer: after a refused or failed update it resets, resumes
    serving and returns, so the trainer takes the sync as done while the endpoint serves
    the old weights (or whatever a failed update left). sgl-project/sglang-omni PR #678
    (PF-32): the failure is reported and serving goes on.
    """

    name = "resumes-after-failed-update"

    def sync(self, endpoints: Sequence[Endpoint], version: int, policy: Policy) -> None:
        infos = [ep.server_info() for ep in endpoints]
        for ep, flush in zip(endpoints, self.decide(policy, infos), strict=True):
            ep.pause(pause_for(policy, flush))
            ep.update_weights(version, flush_cache=flush)
            for kind in ep.cache_kinds:
                if kind != "prefix" or flush:
                    reset(ep, kind)
            ep.continue_generation()


class ResetBeforeFinishProgram(ReferenceProgram):
    """Violates: CLI-008.

    Resets the prefix cache first and then updates the weights without a flush: the right
    decision in the wrong order, so KV cached between the reset and the end of the update
    survives it. huggingface/trl PR #6765 (review finding, PF-23). Here the reset precedes
    a one-call update; with the two-phase update actions (begin, chunks, finish) the same
    program resets between begin and finish.
    """

    name = "reset-before-finish"

    def sync(self, endpoints: Sequence[Endpoint], version: int, policy: Policy) -> None:
        infos = [ep.server_info() for ep in endpoints]
        for ep, flush in zip(endpoints, self.decide(policy, infos), strict=True):
            ep.pause(pause_for(policy, flush))
            if flush:
                reset(ep, "prefix")
            ep.update_weights(version, flush_cache=False)
            ep.continue_generation()


class RefusedResetIgnored(ReferenceProgram):
    """Violates: CLI-010.

    Calls the reset and never reads its answer: a refused reset (KV still held, a
    pinned block) leaves the old prefix cache in place and serving resumes on it. vLLM's
    ``/reset_prefix_cache`` answered 200 whether or not the reset happened
    (vllm-project/vllm PR #12284), and "a user might not immediately realize the reset has
    failed" (vllm-project/vllm PR #28827).
    """

    name = "refused-reset-ignored"

    def reset(self, ep: Endpoint, kind: str) -> bool:
        ep.flush_cache(kind)
        return True


class Endpoint0InfoOnly(ReferenceProgram):
    """Violates: CLI-001.

    Reads the server info of endpoint 0 only and applies its decision to every endpoint:
    right while all endpoints are configured alike, wrong for a fleet where endpoint 0 runs
    without the radix cache and another with it. Invisible to a check of one endpoint at a
    time; a mistake of multi-endpoint sync code that caches "the" server's info (the XoRL
    resolver reads each endpoint's).
    """

    name = "endpoint0-info-only"

    def sync(self, endpoints: Sequence[Endpoint], version: int, policy: Policy) -> None:
        first = endpoints[0].server_info()
        flush = self.wants_flush(policy, first)
        for ep in endpoints:
            ep.pause(pause_for(policy, flush))
            ep.update_weights(version, flush_cache=flush)
            for k in ep.cache_kinds:
                if k != "prefix":
                    reset(ep, k)
            ep.continue_generation()


class PrefixOnlyReset(ReferenceProgram):
    """Violates: CLI-009.

    Resets the prefix cache and nothing else, on an engine whose update leaves the encoder
    cache to the caller: multimodal prompts reuse encoder outputs of the old weights.
    vLLM exposes ``reset_encoder_cache`` and ``reset_mm_cache`` beside
    ``reset_prefix_cache``; vllm-project/vllm-omni #6739 shows all three needed after an
    update (PF-10, PF-21).
    """

    name = "prefix-only-reset"

    def sync(self, endpoints: Sequence[Endpoint], version: int, policy: Policy) -> None:
        infos = [ep.server_info() for ep in endpoints]
        for ep, flush in zip(endpoints, self.decide(policy, infos), strict=True):
            ep.pause(pause_for(policy, flush))
            ep.update_weights(version, flush_cache=False)
            if flush:
                reset(ep, "prefix")
            ep.continue_generation()


# ----- requeue across versions (CLI-012) --------------------------------------------------


class RequeueLabelsEveryVersion(ReferenceProgram):
    """Keeps: CLI-012.

    Partial rollout done right: after the reference sync, every request the sync's pause
    aborted is requeued with its partial output kept, and the stitched response is
    delivered labelled with every weight version that sampled it (the aborted partial's,
    then the new one). The per-segment ``weight_versions`` list slime keeps on a sample
    (THUDM/slime PR #2092) and the per-token attribution asked for in vllm-project/vllm
    #54443 are this label. A correct client unlike the reference: it keeps what the
    reference drops.
    """

    name = "requeue-labels-every-version"
    keep_partial = True

    def sync(self, endpoints: Sequence[Endpoint], version: int, policy: Policy) -> None:
        super().sync(endpoints, version, policy)  # raises (requests dropped) if it failed
        for ep in endpoints:
            for rid, versions in ep.aborted.items():
                if ep.requeue_request(rid, keep_partial=self.keep_partial):
                    ep.deliver_response(rid, self.label(versions, version))

    def label(self, partial: Sequence[int], version: int) -> list[int]:
        """The versions the stitched response spans: the partial's, then ``version``."""
        return sorted({*partial, version}) if self.keep_partial else [version]


class RequeueAcrossVersions(RequeueLabelsEveryVersion):
    """Violates: CLI-012.

    Requeues each aborted request with its partial output kept and labels the stitched
    response with the one version the sync pushed: tokens sampled under the old weights
    train as if on-policy. THUDM/slime PR #2092 (fully-async requeue of ABORTED groups: a
    sample spanning weight versions 2, 4 and 6, earlier tokens unmasked); rllm-org/rllm PR
    #622 (the version stamped at completion, not dispatch).
    """

    name = "requeue-across-versions"

    def label(self, partial: Sequence[int], version: int) -> list[int]:
        return [version]


# ----- lifecycle and two-phase syncs ----------------------------------------------------------


class ColocatedProgram(ReferenceProgram):
    """Keeps: CLI-001, CLI-002, CLI-004, CLI-008, CLI-010, CLI-011.

    A colocated sync, as trainers that share the GPUs between training and rollout write it
    against sgl-project/sglang (radixark/miles ``SGLangEngine.release_memory_occupation`` /
    ``resume_memory_occupation(tags)``; verl's SGLang rollout): release all of the engine's
    memory, resume the weights alone, update them, reset the prefix cache while the KV is
    still released, then resume the KV memory (which brings the endpoint back to serving).
    An endpoint whose update or reset fails stays asleep (not serving) and the sync fails.

    SGLang refuses a release while requests run (its scheduler asserts it is idle), and an
    encoder cache left to the client cannot be reset asleep: such an endpoint is synced
    with a pause instead, as ``ReferenceProgram`` does.
    """

    name = "colocated-program"

    def sync(self, endpoints: Sequence[Endpoint], version: int, policy: Policy) -> None:
        infos = [ep.server_info() for ep in endpoints]
        stuck = []
        for ep, flush in zip(endpoints, self.decide(policy, infos), strict=True):
            if ep.cache_kinds != ("prefix",) or not self.released(ep):
                if not self.paused_sync(ep, version, policy, flush):
                    stuck.append(ep.index)
                continue
            if not ep.resume_memory(["weights"]) or not ep.update_weights(
                version, flush_cache=False
            ):
                stuck.append(ep.index)  # asleep: not serving
                continue
            if flush and not self.reset(ep, "prefix"):
                stuck.append(ep.index)
                continue
            ep.resume_memory(["kv_cache"])
        if stuck:
            raise SyncFailed(f"endpoints {stuck} left asleep or paused: an update or reset failed")

    def released(self, ep: Endpoint) -> bool:
        try:
            return ep.release_memory()
        except ValueError:  # the handle's ProgramError: the engine's API refuses the release
            return False  # requests in flight (SGLang's scheduler asserts it is idle)

    def paused_sync(self, ep: Endpoint, version: int, policy: Policy, flush: bool) -> bool:
        ep.pause(pause_for(policy, flush))
        if not ep.update_weights(version, flush_cache=False):
            return False
        kinds = [k for k in ep.cache_kinds if k != "prefix" or flush]
        if all([self.reset(ep, k) for k in kinds]):
            return ep.continue_generation()
        return False


class TwoPhaseProgram(ReferenceProgram):
    """Keeps: CLI-001, CLI-002, CLI-004, CLI-008, CLI-011.

    A two-phase (chunked) sync, as SkyRL's weight-sync strategies drive vLLM
    (``skyrl/backends/skyrl_train/weight_sync/broadcast_strategy.py``: start, the chunks,
    finish; vllm-project/vllm ``vllm/entrypoints/rl/online/api_router.py``
    ``/start_weight_update`` / ``/update_weights`` / ``/finish_weight_update``): pause,
    begin, two chunks, finish with the engine's flush where the endpoint needs one, reset
    any other stale cache kind, continue, then publish the version label. A chunk that
    fails aborts the window and leaves the endpoint paused.
    """

    name = "two-phase-program"
    CHUNKS = 2

    def finish_flush(self, flush: bool) -> bool:
        return flush

    def sync(self, endpoints: Sequence[Endpoint], version: int, policy: Policy) -> None:
        infos = [ep.server_info() for ep in endpoints]
        stuck = []
        for ep, flush in zip(endpoints, self.decide(policy, infos), strict=True):
            ep.pause(pause_for(policy, flush))
            if not ep.begin_update(version):
                stuck.append(ep.index)
                continue
            if not all(ep.update_chunk() for _ in range(self.CHUNKS)):
                ep.abort_update()
                stuck.append(ep.index)
                continue
            if not ep.finish_update(flush_cache=self.finish_flush(flush)):
                stuck.append(ep.index)
                continue
            if all([reset(ep, k) for k in ep.cache_kinds if k != "prefix"]):
                ep.continue_generation()
                ep.publish_version(version)
            else:
                stuck.append(ep.index)
        if stuck:
            raise SyncFailed(f"endpoints {stuck} left paused: an update or a reset failed")


class TwoPhaseFinishWithoutFlush(TwoPhaseProgram):
    """Violates: CLI-001.

    Finishes a two-phase update with ``flush_cache=False`` and never resets the prefix
    cache itself, on an endpoint that reports its radix cache on: the weights are final
    but the KV of the old ones is served again. vLLM's ``finish_weight_update`` has no
    flush of its own, and SkyRL's non-colocated sync relies on a separate
    ``reset_prefix_cache`` (``skyrl/backends/skyrl_train/workers/fsdp/fsdp_worker.py``);
    a sync that drops that call is this mutant.
    """

    name = "two-phase-finish-without-flush"

    def finish_flush(self, flush: bool) -> bool:
        return False


PROGRAMS: dict[str, type[ReferenceProgram]] = {
    p.name: p
    for p in (
        ReferenceProgram,
        AnyOnFlushesEverywhere,
        ResetBeforeFinishProgram,
        RefusedResetIgnored,
        Endpoint0InfoOnly,
        PrefixOnlyReset,
        RequeueLabelsEveryVersion,
        RequeueAcrossVersions,
        ColocatedProgram,
        TwoPhaseProgram,
        TwoPhaseFinishWithoutFlush,
    )
}
"""Every program by name (the registry's clients)."""
