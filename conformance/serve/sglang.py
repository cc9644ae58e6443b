"""SGLang's routes on a ``kvfence serve`` endpoint (``--api sglang``): the route table and
its handlers.

Bodies as SGLang 0.5.23 sends them (read, not copied): ``python/sglang/srt/entrypoints/
http_server.py`` (the routes, ``/flush_cache``'s text answer) and ``python/sglang/srt/
managers/io_struct.py`` (``PauseGenerationReqInput.mode``, ``UpdateWeightFromDiskReqInput``
/ ``UpdateWeightsFromTensorReqInput`` / ``UpdateWeightsFromDistributedReqInput`` with
``flush_cache`` (default true) and ``weight_version``, ``UpdateWeightVersionReqInput.
new_version``, ``Release/ResumeMemoryOccupationReqInput.tags``, ``GenerateReqInput.
extra_key``). ``/update_weight_version`` answers ``{"success", "message", "new_version"}``
and aborts every request first when ``abort_all_requests``.
"""

from __future__ import annotations

import json
import uuid
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from ...model.actions import (
    ContinueGeneration,
    PauseGeneration,
    Sleep,
    WakeUp,
)
from ...model.vocabulary import Funnel, PauseMode, Role, Status
from ..calls import call_with_timeout
from .routes import Route
from .wire import HttpError, Streamed

if TYPE_CHECKING:
    from .session import Session

SGLANG_FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


def get_server_info(s: Session, data, query, entry):
    info = call_with_timeout(lambda: s.engine.server_info(s.index), s.timeout, "server_info")
    if info is None:
        raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "server info unavailable")
    return 200, {**dict(info), "weight_version": s.weights.label(), "version": "kvfence-serve"}


def health(s: Session, data, query, entry):
    return s.health()


def get_model_info(s: Session, data, query, entry):
    latest = s.weights.latest_source()
    return 200, {
        "model_path": latest,
        "is_generation": True,
        "weight_version": s.weights.label(),
    }


def pause_generation(s: Session, data, query, entry):
    mode = data.get("mode", "abort")
    try:
        pause = PauseMode(mode)
    except ValueError:
        raise HttpError(
            HTTPStatus.BAD_REQUEST, f"mode {mode!r}: one of 'abort', 'retract', 'in_place'"
        ) from None
    obs = s.step(PauseGeneration(0, pause), entry)
    if obs.status is not Status.OK:
        raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "pause failed")
    s.paused = True
    return 200, {"message": "Generation paused successfully.", "status": "ok"}


def continue_generation(s: Session, data, query, entry):
    obs = s.step(ContinueGeneration(0), entry)
    s.paused = s.paused and obs.status is not Status.OK
    if obs.status is not Status.OK:
        raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "continue failed")
    return 200, {"message": "Generation continued successfully.", "status": "ok"}


def _update(s: Session, funnel: Funnel, data, required, source: str, entry):
    missing = [f for f in required if f not in data]
    if missing:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"missing field(s): {', '.join(missing)}")
    label = data.get("weight_version")
    if label is not None and not isinstance(label, str):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"weight_version {label!r} is not a string")
    obs = s.update(funnel, data.get("flush_cache"), source, entry)
    ok = obs.status is Status.OK
    if label and s.weights.installed == s.weights.trainer and ok:
        # The update's label names its version (SGLang sets weight_version with it).
        s.weights.name(s.weights.installed, label)
    message = "Succeeded to update model weights." if ok else obs.detail or "update failed"
    return (200 if ok else 400), {"success": ok, "message": message}


def update_weights_from_disk(s: Session, data, query, entry):
    path = data.get("model_path")
    if "model_path" in data and not isinstance(path, str):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"model_path {path!r} is not a string")
    status, body = _update(s, Funnel.DISK, data, ("model_path",), str(path), entry)
    # With DP ranks the tokenizer manager answers after every rank's reply, with each
    # rank's count (``tokenizer_manager.py`` ``_wait_for_model_update_from_disk``).
    ranks = s.config.ranks
    return status, {**body, "num_paused_requests": [0] * ranks if ranks > 1 else 0}


def update_weights_from_tensor(s: Session, data, query, entry):
    label = data.get("weight_version") or "tensor payload"
    return _update(s, Funnel.TENSOR, data, ("serialized_named_tensors",), str(label), entry)


def update_weights_from_distributed(s: Session, data, query, entry):
    label = data.get("weight_version") or f"group {data.get('group_name', 'weight_update_group')}"
    required = ("names", "dtypes", "shapes")
    return _update(s, Funnel.DISTRIBUTED, data, required, str(label), entry)


def flush_cache(s: Session, data, query, entry):
    """200 with ``SGLANG_FLUSHED``, or 400 with a text body when the scheduler refused
    (running or waiting requests): ``http_server.py`` ``flush_cache`` in SGLang 0.5.23."""
    obs = s.reset(entry)
    if obs.status is Status.OK and obs.flushed is not False:
        return 200, SGLANG_FLUSHED.encode()
    return 400, (obs.detail or "Flush cache failed.\n").encode()


def update_weight_version(s: Session, data, query, entry):
    label = data.get("new_version")
    obs = s.publish(label, data.get("abort_all_requests", False), entry)
    if obs.status is not Status.OK:
        message = obs.detail or f"Failed to update weight version: {label}"
        return 400, {"success": False, "message": message}
    message = f"Weight version updated to {label}"
    return 200, {"success": True, "message": message, "new_version": label}


def _memory(s: Session, data, entry, route: str, action, failed: str):
    """``/release_memory_occupation`` and ``/resume_memory_occupation``: ``action``
    (``Sleep`` or ``WakeUp``) with the body's ``tags``; a body naming only tags the model
    does not have is a recorded no-op. SGLang answers 200 with no body, or 400 on failure."""
    tags = s.memory(data.get("tags"), route)
    if tags is None:
        entry["noop"] = "only tags the model does not have"
        return 200, None
    obs = s.step(action(0, tags), entry)
    if obs.status is not Status.OK:
        return 400, {"error": {"message": obs.detail or failed}}
    return 200, None


def release_memory_occupation(s: Session, data, query, entry):
    return _memory(s, data, entry, "/release_memory_occupation", Sleep, "release failed")


def resume_memory_occupation(s: Session, data, query, entry):
    return _memory(s, data, entry, "/resume_memory_occupation", WakeUp, "resume failed")


def generate(s: Session, data, query, entry):
    """``POST /generate`` (``GenerateReqInput``): ServeRequest of ``text`` or
    ``input_ids``; ``extra_key`` the cache key; ``lora_path`` the name of a loaded LoRA
    adapter (SGLang resolves it in its LoRA registry; one not loaded is 400): through the
    endpoint's adapter. ``"stream": true`` streams it (``_stream_generate``). On an
    endpoint of data-parallel ranks it runs on the rank ``Session.place`` picks
    (``routed_dp_rank``, else round robin); on the prefill server of a P/D pair it is the
    router's prefill half (``Session.prefill_half``)."""
    prompt = s.prompt(data, "text", "input_ids")
    if s.config.role is Role.PREFILL:
        return s.prefill_half(prompt, data, entry)
    params = data.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise HttpError(HTTPStatus.BAD_REQUEST, "sampling_params must be an object")
    lora = s.lora_request(data.get("lora_path"), HTTPStatus.BAD_REQUEST)
    n = s.max_tokens(params.get("max_new_tokens"), 8)
    if data.get("stream") is True:
        return _stream_generate(s, prompt, n, lora, data, entry)
    ids, logprobs, hit, n_prompt = s.complete(prompt, n, data, "extra_key", entry, lora)
    meta: dict[str, Any] = {
        "id": data.get("rid") or uuid.uuid4().hex,
        "finish_reason": {"type": "length", "length": n},
        "prompt_tokens": n_prompt,
        "completion_tokens": n,
        "cached_tokens": n_prompt if hit else 0,
        "weight_version": s.weights.label(),
    }
    if data.get("return_logprob"):
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logprobs, ids, strict=True)]
    return 200, {"text": " ".join(f"t{t}" for t in ids), "output_ids": ids, "meta_info": meta}


def _stream_generate(s: Session, prompt: Any, n: int, lora: bool, data, entry):
    """``/generate`` with ``"stream": true``: server-sent events as SGLang 0.5.23 streams
    them (``http_server.py`` ``serve_generate_request``: each ``data: {"text",
    "output_ids", "meta_info"}``, then ``data: [DONE]``; ``meta_info.finish_reason`` is
    null until the end, then ``{"type": "length", "length": n}``, or
    ``managers/schedule_batch.py`` ``FINISH_ABORT``'s ``{"type": "abort", "message",
    "status_code", "err_type"}``). The request is a StartRequest: it holds its KV in
    flight, so a ``/flush_cache`` meanwhile is refused (400, as the scheduler refuses a
    flush while requests run), until it ends ``Session.stream_hold`` seconds later
    (FinishRequest), an ``/abort_request`` naming its ``rid`` (or ``abort_all``) or a
    ``mode=abort`` pause aborts it, or its client goes away (aborted then, as SGLang's
    tokenizer manager aborts a request whose connection closed)."""
    salt = data.get("extra_key")
    if salt is not None and not isinstance(salt, str):
        raise HttpError(HTTPStatus.BAD_REQUEST, "extra_key must be a string")
    name = data.get("rid")
    if name is not None and not isinstance(name, str):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"rid {name!r} is not a string")
    rid = s.start_stream(prompt, salt or None, lora, entry, name, rank=s.place(data))
    meta = {"id": name or rid, "finish_reason": None, "completion_tokens": 0}

    def event(ids: list[int], reason: Any) -> bytes:
        body = {
            "text": " ".join(f"t{t}" for t in ids),
            "output_ids": ids,
            "meta_info": {**meta, "finish_reason": reason, "completion_tokens": len(ids)},
        }
        return f"data: {json.dumps(body)}\n\n".encode()

    def finish() -> bytes:
        from .session import by_checkpoint, tokens_of  # session imports this module

        obs = s.end_stream(rid)
        if obs is None or obs.status is not Status.OK or obs.response is None:
            aborted = {"type": "abort", "message": "Aborted", "status_code": None}
            return event([], {**aborted, "err_type": None}) + b"data: [DONE]\n\n"
        ids, _ = tokens_of(by_checkpoint(obs.response.output, s.weights.sources), n)
        reason = {"type": "length", "length": n}
        return event(ids, reason) + b"data: [DONE]\n\n"

    meta["weight_version"] = s.weights.label()
    return 200, Streamed(event([], None), finish, s.stream_hold, lambda: s.abort_stream(rid))


def load_lora_adapter(s: Session, data, query, entry):
    """``POST /load_lora_adapter {"lora_name", "lora_path", "pinned"?}``
    (``LoadLoRAAdapterReqInput``; ``http_server.py``, ``managers/
    tokenizer_control_mixin.py``, ``lora/lora_registry.py``, SGLang 0.5.23):
    ``LoRAUpdateOutput`` ``{"success": true, "error_message": null, "loaded_adapters":
    {name: path}}``, or 400 with ``success`` false and the error (a name already loaded:
    SGLang's registry refuses it). Each load gets a new ``lora_id``, the key of its KV: the
    first load is the endpoint's adapter (a logged no-op), a load of the same name after an
    unload is LoadLora (new bytes under the same name, ENG-007)."""
    name, path = data.get("lora_name"), data.get("lora_path")
    if not (isinstance(name, str) and name and isinstance(path, str) and path):
        raise HttpError(HTTPStatus.BAD_REQUEST, "lora_name and lora_path must be strings")
    if s.adapter_loaded and name == s.adapter:
        return 400, {
            "success": False,
            "error_message": f"LoRA with name {name} already exists. Loaded LoRAs: [{name!r}]",
            "loaded_adapters": None,
        }
    entry["lora_path"] = path
    obs = s.load_adapter(name, entry)
    if obs is not None and obs.status is not Status.OK:
        return 400, {
            "success": False,
            "error_message": obs.detail or "LoRA load failed",
            "loaded_adapters": None,
        }
    return 200, {"success": True, "error_message": None, "loaded_adapters": {name: path}}


def unload_lora_adapter(s: Session, data, query, entry):
    """``POST /unload_lora_adapter {"lora_name"}`` (``UnloadLoRAAdapterReqInput``, same
    files): ``{"success": true, "error_message": null, "loaded_adapters": {}}``, 400 with
    ``success`` false for a name not loaded. A documented no-op: no request can name the
    adapter until it is loaded again, and that load is LoadLora."""
    name = data.get("lora_name")
    if not isinstance(name, str) or name != s.adapter or not s.adapter_loaded:
        return 400, {
            "success": False,
            "error_message": f"LoRA adapter {name!r} is not loaded",
            "loaded_adapters": None,
        }
    s.adapter_loaded = False
    entry["noop"] = "unloaded: no request names the adapter until its reload (LoadLora)"
    return 200, {"success": True, "error_message": None, "loaded_adapters": {}}


# ----- routes whose engine effect the cache does not depend on (documented no-ops) -------


def abort_request(s: Session, data, query, entry):
    """``POST /abort_request {"rid"?, "abort_all"?}`` (``AbortReq``, ``http_server.py``,
    SGLang 0.5.23): an empty 200. Ends the streamed ``/generate`` of that ``rid`` (or
    every one, ``abort_all``) now (``Session.abort_streams``); a request answered whole has
    already ended, so naming one is a logged no-op, as SGLang ignores an unknown rid."""
    rid, every = data.get("rid"), data.get("abort_all", False)
    if rid is not None and not isinstance(rid, str):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"rid {rid!r} is not a string")
    if not isinstance(every, bool):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"abort_all {every!r} is not a bool")
    ended = s.abort_streams(None if every else rid) if (every or rid) else []
    if ended:
        entry["aborted"] = ended
    else:
        entry["noop"] = "no request in flight to abort"
    return 200, b""


def init_weights_update_group(s: Session, data, query, entry):
    """``POST /init_weights_update_group`` (``InitWeightsUpdateGroupReqInput``:
    ``master_address``, ``master_port``, ``rank_offset``, ``world_size``, ``group_name``,
    ``backend``; SGLang 0.5.23): ``{"success": true, "message"}``. No NCCL rendezvous can
    happen on CPU: a logged no-op; ``/update_weights_from_distributed`` then carries the
    update's metadata (``names``, ``dtypes``, ``shapes``) and is the UpdateWeights."""
    required = ("master_address", "master_port", "rank_offset", "world_size")
    missing = [f for f in required if f not in data]
    if missing:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"missing field(s): {', '.join(missing)}")
    entry["noop"] = "weight-update group init: no rendezvous on serve"
    return 200, {"success": True, "message": "Succeeded to initialize custom process group."}


def destroy_weights_update_group(s: Session, data, query, entry):
    """``POST /destroy_weights_update_group`` (``DestroyWeightsUpdateGroupReqInput``:
    ``group_name``; SGLang 0.5.23 ``http_server.py``, the model runner's
    ``destroy_weights_update_group``): ``{"success": true, "message"}``. Tears down the NCCL
    group ``/init_weights_update_group`` would have formed; the weights and the cache stay as
    they are: a logged no-op."""
    group = data.get("group_name", "weight_update_group")
    if not isinstance(group, str):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"group_name {group!r} is not a string")
    entry["noop"] = "weight-update group teardown: no group on serve"
    return 200, {"success": True, "message": "Succeeded to destroy custom process group."}


def begin_weight_update(s: Session, data, query, entry):
    """``POST /begin_weight_update`` (sgl-project/sglang PR #28001, in 0.5.23): opens the
    scheduler's weight-update session, inside which ``/update_weights_from_*`` run, each
    still one UpdateWeights (their ``flush_cache`` as before). The session is bookkeeping
    around the updates, not an update: a logged no-op answered ``{"success", "message"}``
    as SGLang's other weight routes answer."""
    entry["noop"] = "opens SGLang's weight-update session; each update inside is stepped"
    return 200, {"success": True, "message": "Weight update session started."}


def end_weight_update(s: Session, data, query, entry):
    """``POST /end_weight_update`` (same PR): closes the session (post-load processing of
    the weights already updated): a logged no-op, as ``begin_weight_update``."""
    entry["noop"] = "closes SGLang's weight-update session"
    return 200, {"success": True, "message": "Weight update session finished."}


ROUTES: tuple[Route, ...] = (
    Route("sglang", ("GET",), "/get_server_info", "", get_server_info),
    Route("sglang", ("GET",), "/server_info", "", get_server_info),
    Route("sglang", ("GET",), "/health", "", health),
    Route("sglang", ("GET",), "/get_model_info", "", get_model_info),
    Route("sglang", ("POST",), "/pause_generation", "PauseGeneration", pause_generation),
    Route("sglang", ("POST",), "/continue_generation", "ContinueGeneration", continue_generation),
    Route(
        "sglang", ("POST",), "/update_weights_from_disk", "UpdateWeights", update_weights_from_disk
    ),
    Route(
        "sglang",
        ("POST",),
        "/update_weights_from_tensor",
        "UpdateWeights",
        update_weights_from_tensor,
    ),
    Route(
        "sglang",
        ("POST",),
        "/update_weights_from_distributed",
        "UpdateWeights",
        update_weights_from_distributed,
    ),
    Route("sglang", ("GET", "POST"), "/flush_cache", "FlushCache", flush_cache),
    Route("sglang", ("POST",), "/update_weight_version", "PublishVersion", update_weight_version),
    Route(
        "sglang", ("GET", "POST"), "/release_memory_occupation", "Sleep", release_memory_occupation
    ),
    Route(
        "sglang", ("GET", "POST"), "/resume_memory_occupation", "WakeUp", resume_memory_occupation
    ),
    Route("sglang", ("POST",), "/generate", "ServeRequest", generate),
    Route(
        "sglang",
        ("POST",),
        "/load_lora_adapter",
        "LoadLora",
        load_lora_adapter,
        "LoadLora(second adapter)",
    ),
    Route(
        "sglang",
        ("POST",),
        "/unload_lora_adapter",
        "",
        unload_lora_adapter,
        noop="no request can name the adapter until its reload, which is LoadLora",
    ),
    Route(
        "sglang",
        ("POST",),
        "/abort_request",
        "FinishRequest",
        abort_request,
    ),
    Route(
        "sglang",
        ("POST",),
        "/init_weights_update_group",
        "",
        init_weights_update_group,
        noop="an NCCL group's init: no rendezvous on serve, nothing the cache depends on",
    ),
    Route(
        "sglang",
        ("POST",),
        "/destroy_weights_update_group",
        "",
        destroy_weights_update_group,
        noop="an NCCL group's teardown: weights and cache unchanged",
    ),
    Route(
        "sglang",
        ("POST",),
        "/begin_weight_update",
        "",
        begin_weight_update,
        noop="bookkeeping around the updates it brackets, each stepped",
    ),
    Route(
        "sglang",
        ("POST",),
        "/end_weight_update",
        "",
        end_weight_update,
        noop="bookkeeping around the updates it brackets, each stepped",
    ),
)
"""Every route of ``--api sglang``; anything else is the engine's 404."""
