"""The actions of the spec, named actor+verb as in the docs and the JSONL traces.

Every action is a frozen attrs value. ``to_json``/``from_json`` give the trace form
``{"action": "UpdateWeights", "endpoint": 0, ...}``; ``from_json`` raises ``TraceError``
naming the bad field, so a garbage trace never crashes the reader.
"""

from __future__ import annotations

from typing import Any, ClassVar

from attrs import NOTHING, field, fields, frozen

from .vocabulary import ALL_MEMORY, Funnel, MemoryTag, PauseMode, Tier


class TraceError(ValueError):
    """A trace line that does not describe a valid action or observation."""


OMIT_DEFAULT = "omit_default"
"""Field metadata key: ``to_json`` leaves the field out while it holds its default."""


def rank_field() -> Any:
    """The ``rank`` of a request action: the data-parallel rank it is placed on (0 .. the
    endpoint's ``Config.ranks`` - 1), as SGLang's ``GenerateReqInput.data_parallel_rank``
    and vLLM's ``data_parallel_rank`` argument of ``AsyncLLM.generate`` route it."""
    return field(default=0, metadata={OMIT_DEFAULT: True})


@frozen
class Action:
    """Base of all actions; ``fault`` marks injected faults (capability-gated)."""

    fault: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return type(self).__name__

    def to_json(self) -> dict[str, Any]:
        """The trace form; a field marked ``OMIT_DEFAULT`` is written only when it is not its
        default (a ``rank`` 0 is left out, so single-scheduler traces read as before)."""
        out: dict[str, Any] = {"action": self.name}
        for f in fields(type(self)):
            value = getattr(self, f.name)
            if f.metadata.get(OMIT_DEFAULT) and value == f.default:
                continue
            if isinstance(value, frozenset):  # memory tags: a sorted list of words
                value = sorted(v.value for v in value)
            out[f.name] = value.value if hasattr(value, "value") else value
        return out


def memory_tags(value: Any) -> frozenset[MemoryTag]:
    """Tags of a Sleep or WakeUp as a frozenset of ``MemoryTag``; an empty collection means
    every tag, as in SGLang (``tags`` None or empty: ``GPU_MEMORY_ALL_TYPES``). ``ValueError``
    names a word that is not a tag."""
    if isinstance(value, str):
        value = (value,)
    tags = frozenset(MemoryTag(v) for v in value)
    return tags or ALL_MEMORY


@frozen
class ServeRequest(Action):
    """A whole request (prefill, decode, finish) for ``prefix`` on ``endpoint``.

    ``lora``: served through the LoRA adapter. ``namespace``: the weight version the
    client keys the request by (vLLM ``cache_salt``, SGLang ``extra_key``); ``None``: none.
    ``rank``: the data-parallel rank it is placed on (``rank_field``); 0 on a single
    scheduler. Mirrors SGLang ``/generate`` and vLLM ``/v1/completions``.
    """

    endpoint: int
    prefix: str
    lora: bool = False
    namespace: int | None = None
    rank: int = rank_field()


@frozen
class StartRequest(Action):
    """Admit request ``rid`` for ``prefix``: its prefill runs and it stays in flight.
    ``lora``, ``namespace`` and ``rank`` as for ServeRequest: the request and its KV live on
    that rank until it finishes."""

    endpoint: int
    rid: str
    prefix: str
    lora: bool = False
    namespace: int | None = None
    rank: int = rank_field()


@frozen
class FinishRequest(Action):
    """Let in-flight request ``rid`` decode to the end and return its response."""

    endpoint: int
    rid: str


@frozen
class SyncWeights(Action):
    """The client pushes ``version`` to every endpoint through ``funnel``.

    For each endpoint the client resolves a plan from its policy and the endpoint's server
    info (CLI-001..007), then drives PauseGeneration(plan.pause_mode),
    UpdateWeights(flush_cache=plan.flush), ContinueGeneration.
    """

    version: int
    funnel: Funnel = Funnel.TENSOR


@frozen
class UpdateWeights(Action):
    """A raw engine update of ``endpoint`` to ``version`` through ``funnel``.

    ``flush_cache``: what the caller asked; ``None`` when the field was not sent (what that
    means is the engine's ``Config.flush_default``). Mirrors
    SGLang ``/update_weights_from_{disk,tensor,distributed}`` with ``flush_cache``.
    """

    endpoint: int
    version: int
    funnel: Funnel = Funnel.TENSOR
    flush_cache: bool | None = None


@frozen
class FlushCache(Action):
    """Flush the prefix cache: SGLang ``/flush_cache``, vLLM ``/reset_prefix_cache``."""

    endpoint: int


@frozen
class FlushEncoderCache(Action):
    """Reset the encoder cache alone: vLLM ``reset_encoder_cache`` (``vllm/v1/engine/``
    ``async_llm.py``), beside ``reset_prefix_cache``. Only an engine whose profile leaves the
    encoder cache to the client on an update (``Config.encoder_reset_separate``) needs it;
    client programs call it (``flush_cache("encoder")``), the machine never draws it."""

    endpoint: int


@frozen
class PauseGeneration(Action):
    """SGLang ``/pause_generation`` with ``mode``; vLLM ``/pause`` (abort/wait/keep).

    ``clear_cache``: the prefix cache is flushed as part of the pause, once the mode has
    dealt with in-flight requests (vLLM ``POST /pause?clear_cache=``,
    vllm/entrypoints/serve/rlhf/api_router.py, passed to ``AsyncLLM.pause_generation``,
    vllm/v1/engine/async_llm.py). Not drawn with ``in_place``: requests paused in place pin
    their KV, so the clear could not complete (LIV-001).
    """

    endpoint: int
    mode: PauseMode = PauseMode.RETRACT
    clear_cache: bool = False


@frozen
class ContinueGeneration(Action):
    """SGLang ``/continue_generation``; vLLM ``/resume``."""

    endpoint: int


@frozen
class Sleep(Action):
    """Release the device memory named by ``tags`` (a frozenset of ``MemoryTag``; default
    every tag, which is vLLM ``/sleep?level=1``: weights offloaded, KV memory discarded).

    Mirrors SGLang ``POST /release_memory_occupation`` with
    ``ReleaseMemoryOccupationReqInput.tags`` (python/sglang/srt/managers/
    scheduler_update_weights_mixin.py ``release_memory_occupation``). Released KV memory is
    garbage: its prefix index goes with it (ENG-006). Released weights are restored as they
    were by WakeUp (SGLang stashes the model's static state; vLLM level 1 offloads to CPU).
    """

    endpoint: int
    tags: frozenset[MemoryTag] = field(
        default=ALL_MEMORY, converter=memory_tags, repr=lambda t: repr(sorted(x.value for x in t))
    )


@frozen
class WakeUp(Action):
    """Resume the device memory named by ``tags`` (default every tag released); the
    endpoint serves again once nothing is released. vLLM ``POST /wake_up?tags=``, SGLang
    ``POST /resume_memory_occupation`` with ``tags``. Resumed KV memory holds no reusable
    KV (MEM-002)."""

    endpoint: int
    tags: frozenset[MemoryTag] = field(
        default=ALL_MEMORY, converter=memory_tags, repr=lambda t: repr(sorted(x.value for x in t))
    )


@frozen
class Restart(Action):
    """The engine process restarts from its last completely loaded checkpoint."""

    endpoint: int


@frozen
class EvictPrefix(Action):
    """Move ``prefix``'s KV from device to a lower ``tier`` (HiCache host or storage)."""

    endpoint: int
    prefix: str
    tier: Tier = Tier.HOST


@frozen
class LoadLora(Action):
    """Reload the LoRA adapter in place under the same name with new bytes."""

    endpoint: int


# ----- version publishing -----------------------------------------------------------------


@frozen
class PublishVersion(Action):
    """Publish the weight-version label ``version`` without touching the weights.

    ``abort_requests``: abort every in-flight request as part of the publish. Mirrors SGLang
    ``POST /update_weight_version`` (``UpdateWeightVersionReqInput``: ``new_version``,
    ``abort_all_requests``) and vLLM ``POST /update_weight_version`` (``new_version`` only,
    vllm/entrypoints/serve/dev/rlhf/api_router.py: never aborts). PUB-001: the label names
    the whole weights installed, so a publish of another version is refused; PUB-002: it
    aborts nothing unless ``abort_requests``.
    """

    endpoint: int
    version: int
    abort_requests: bool = False


@frozen
class FaultRefuseFlush(Action):
    """Fault: the next flush on ``endpoint`` is refused (as if KV were pinned)."""

    fault: ClassVar[bool] = True
    endpoint: int


@frozen
class FaultUpdateFailsMidway(Action):
    """Fault: a bucketed update of ``endpoint`` to ``version`` fails after some buckets."""

    fault: ClassVar[bool] = True
    endpoint: int
    version: int


@frozen
class FaultRankUpdateFails(Action):
    """Fault: the next update of ``endpoint`` fails on data-parallel ``rank`` alone, which
    stays at its old weights with its cache while the other ranks may apply it (an
    exception in one scheduler's ``update_weights_from_tensor``; sgl-project/sglang
    PR #39534, PF-26)."""

    fault: ClassVar[bool] = True
    endpoint: int
    rank: int


# ----- two-phase updates (WIN-001..003) ----------------------------------------------------


@frozen
class BeginWeightUpdate(Action):
    """Open a two-phase update of ``endpoint`` to ``version`` through ``funnel``: nothing
    lands yet. Mirrors vLLM ``POST /start_weight_update`` (vllm/entrypoints/serve/dev/rlhf/
    api_router.py; ``initialize_layerwise_reload``), SGLang ``/init_weights_update_group``
    and the P2P prepare step."""

    endpoint: int
    version: int
    funnel: Funnel = Funnel.TENSOR


@frozen
class UpdateWeightChunk(Action):
    """One chunk (bucket) of the open update lands in the live parameters. Mirrors vLLM
    ``POST /update_weights`` and SGLang ``/update_weights_from_tensor`` for a non-final
    chunk."""

    endpoint: int


@frozen
class FinishWeightUpdate(Action):
    """Close the open update and publish its version; ``flush_cache`` as for UpdateWeights
    (``None``: not sent). Mirrors vLLM ``POST /finish_weight_update`` (with
    ``weight_version``; ``finalize_layerwise_reload``) and SGLang's last chunk of
    ``/update_weights_from_tensor`` with ``flush_cache``."""

    endpoint: int
    flush_cache: bool | None = None


@frozen
class AbortWeightUpdate(Action):
    """Give up the open update: the endpoint rolls back to its old weights or closes."""

    endpoint: int


@frozen
class FaultChunkFails(Action):
    """Fault: the next chunk of the open update on ``endpoint`` fails (like
    FaultUpdateFailsMidway, inside a two-phase window)."""

    fault: ClassVar[bool] = True
    endpoint: int


@frozen
class LeaveRotation(Action):
    """The router takes worker ``endpoint`` out of its rotation: it sends it no more traffic
    (requests it already admitted run on). Mirrors SGLang's model gateway removing a worker
    (sgl-router ``/remove_worker``, sgl-project/sglang PR #2380)."""

    endpoint: int


@frozen
class EnterRotation(Action):
    """The router puts worker ``endpoint`` back into its rotation; it must refuse while the
    worker's sync has not settled (RTR-001). Mirrors SGLang's model gateway registering a
    worker after a health check (sgl-router ``/add_worker``, sgl-project/sglang PR #2369,
    PR #2392)."""

    endpoint: int


TWO_PHASE_ACTIONS: tuple[type[Action], ...] = (
    BeginWeightUpdate,
    UpdateWeightChunk,
    FinishWeightUpdate,
    AbortWeightUpdate,
    FaultChunkFails,
)


ACTION_TYPES: tuple[type[Action], ...] = (
    ServeRequest,
    StartRequest,
    FinishRequest,
    SyncWeights,
    UpdateWeights,
    FlushCache,
    PauseGeneration,
    ContinueGeneration,
    Sleep,
    WakeUp,
    Restart,
    EvictPrefix,
    LoadLora,
    FaultRefuseFlush,
    FaultUpdateFailsMidway,
    # the RL lifecycle: publishing, two-phase updates
    PublishVersion,
    *TWO_PHASE_ACTIONS,
    FlushEncoderCache,
    # data-parallel ranks behind one endpoint (RNK-001..003)
    FaultRankUpdateFails,
    # workers behind a router (RTR-001)
    LeaveRotation,
    EnterRotation,
)
BY_NAME: dict[str, type[Action]] = {t.__name__: t for t in ACTION_TYPES}

_ENUM_FIELDS = {"funnel": Funnel, "mode": PauseMode, "tier": Tier}


def _check(name: str, field_name: str, value: Any, expected: Any) -> Any:
    if expected == "frozenset[MemoryTag]":
        words = ", ".join(m.value for m in MemoryTag)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TraceError(
                f"{name}.{field_name}: expected a list of tags ({words}), got {value!r}"
            )
        try:
            return memory_tags(value)
        except ValueError:
            bad = [v for v in value if v not in {m.value for m in MemoryTag}]
            raise TraceError(f"{name}.{field_name}: {bad!r} not tags; known: {words}") from None
    if field_name in _ENUM_FIELDS:
        enum = _ENUM_FIELDS[field_name]
        try:
            return enum(value)
        except ValueError:
            words = ", ".join(m.value for m in enum)
            raise TraceError(f"{name}.{field_name}: {value!r} is not one of {words}") from None
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "bool | None": value is None or isinstance(value, bool),
        "int | None": value is None or (isinstance(value, int) and not isinstance(value, bool)),
    }.get(expected)
    if ok is None:
        raise TraceError(f"{name}.{field_name}: unsupported field type {expected!r}")
    if not ok:
        raise TraceError(f"{name}.{field_name}: expected {expected}, got {value!r}")
    return value


def action_from_json(obj: Any) -> Action:
    """Parse the trace form of an action; ``TraceError`` names the action and field."""
    if not isinstance(obj, dict):
        raise TraceError(f"an action must be a JSON object, got {type(obj).__name__}")
    name = obj.get("action")
    if not isinstance(name, str) or name not in BY_NAME:
        known = ", ".join(BY_NAME)
        raise TraceError(f"unknown action {name!r}; known actions: {known}")
    cls = BY_NAME[name]
    kwargs: dict[str, Any] = {}
    allowed = {f.name: f for f in fields(cls)}
    extra = set(obj) - set(allowed) - {"action"}
    if extra:
        raise TraceError(f"{name}: unknown field(s) {', '.join(sorted(extra))}")
    for fname, f in allowed.items():
        if fname not in obj:
            if f.default is NOTHING:
                raise TraceError(f"{name}: missing field {fname!r}")
            continue
        kwargs[fname] = _check(name, fname, obj[fname], f.type)
    return cls(**kwargs)
