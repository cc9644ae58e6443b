"""The actions of the spec, named actor+verb as in the docs and the JSONL traces.

Every action is a frozen attrs value. ``to_json``/``from_json`` give the trace form
``{"action": "UpdateWeights", "endpoint": 0, ...}``; ``from_json`` raises ``TraceError``
naming the bad field, so a garbage trace never crashes the reader.
"""

from __future__ import annotations

from typing import Any, ClassVar

from attrs import NOTHING, fields, frozen

from .vocabulary import Funnel, PauseMode, Tier


class TraceError(ValueError):
    """A trace line that does not describe a valid action or observation."""


@frozen
class Action:
    """Base of all actions; ``fault`` marks injected faults (capability-gated)."""

    fault: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return type(self).__name__

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.name}
        for f in fields(type(self)):
            value = getattr(self, f.name)
            out[f.name] = value.value if hasattr(value, "value") else value
        return out


@frozen
class ServeRequest(Action):
    """A whole request (prefill, decode, finish) for ``prefix`` on ``endpoint``.

    ``lora``: served through the LoRA adapter. ``namespace``: the weight version the
    client keys the request by (vLLM ``cache_salt``, SGLang ``extra_key``); ``None``: none.
    Mirrors SGLang ``/generate`` and vLLM ``/v1/completions``.
    """

    endpoint: int
    prefix: str
    lora: bool = False
    namespace: int | None = None


@frozen
class StartRequest(Action):
    """Admit request ``rid`` for ``prefix``: its prefill runs and it stays in flight.
    ``lora`` and ``namespace`` as for ServeRequest."""

    endpoint: int
    rid: str
    prefix: str
    lora: bool = False
    namespace: int | None = None


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
    """SGLang ``/pause_generation`` with ``mode``; vLLM ``/pause`` (abort/wait/keep)."""

    endpoint: int
    mode: PauseMode = PauseMode.RETRACT


@frozen
class ContinueGeneration(Action):
    """SGLang ``/continue_generation``; vLLM ``/resume``."""

    endpoint: int


@frozen
class Sleep(Action):
    """vLLM ``/sleep?level=1``: weights offloaded, KV memory discarded."""

    endpoint: int


@frozen
class WakeUp(Action):
    """vLLM ``/wake_up``."""

    endpoint: int


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
    FlushEncoderCache,
)
BY_NAME: dict[str, type[Action]] = {t.__name__: t for t in ACTION_TYPES}

_ENUM_FIELDS = {"funnel": Funnel, "mode": PauseMode, "tier": Tier}


def _check(name: str, field_name: str, value: Any, expected: Any) -> Any:
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
