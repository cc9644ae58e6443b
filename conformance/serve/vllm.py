"""vLLM's routes on a ``kvfence serve`` endpoint (``--api vllm``): the route table and its
handlers.

Bodies as vLLM 0.32 sends them (read, not copied): ``vllm/entrypoints/serve/dev/*``
(``/collective_rpc``, ``/reset_prefix_cache`` answering ``{"success": bool}``,
``/is_paused``; ``dev/sleep/api_router.py``: ``/sleep`` reads only the ``level`` and
``mode`` query parameters, ``/wake_up`` reads ``tags`` as a repeated query parameter, none
meaning all, both answer an empty 200), ``vllm/entrypoints/rl/online/api_router.py``
(``/pause?mode=abort|wait|keep&clear_cache=`` with ``clear_cache`` true by default and
ignored for ``keep``, answering ``{"status": "paused"}``; ``/resume``; ``/weight_info``;
``/update_weight_version {"new_version"}``; the two-phase update ``/start_weight_update``,
``/update_weights {"update_info"}``, ``/finish_weight_update {"weight_version"?}``, each
answering ``{"message"}``), ``vllm/entrypoints/openai`` (``/v1/completions`` with
``cache_salt``, ``return_token_ids``, ``usage.prompt_tokens_details.cached_tokens``).
SkyRL 0.3.0's ``RemoteInferenceClient`` (``skyrl/backends/skyrl_train/inference_servers/
remote_inference_client.py``) drives the same two-phase update through ``/collective_rpc``
methods (``TWO_PHASE_METHODS``) and sends ``/sleep?level=&tags=`` (tags vLLM ignores).
"""

from __future__ import annotations

import json
import time
import zlib
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from ...model.actions import (
    ContinueGeneration,
    PauseGeneration,
    Sleep,
    UpdateWeightChunk,
    WakeUp,
)
from ...model.observation import Observation
from ...model.vocabulary import Funnel, PauseMode, Phase, Status
from ..calls import call_with_timeout
from .routes import Route
from .wire import HttpError, PendingRoute, Streamed

if TYPE_CHECKING:
    from .session import Session

SERVED_MODEL = "kvfence-serve"
"""The model name ``/v1/models`` lists and completions answer with."""

TWO_PHASE_METHODS: dict[str, str] = {
    "skyrl_start_weight_update": "BeginWeightUpdate",
    "update_weights_ipc": "UpdateWeightChunk",
    "update_weights_nccl": "UpdateWeightChunk",
    "skyrl_finish_weight_update": "FinishWeightUpdate",
    "start_weight_update": "BeginWeightUpdate",
    "update_weights": "UpdateWeightChunk",
    "finish_weight_update": "FinishWeightUpdate",
}
"""``/collective_rpc`` methods of a two-phase (chunked) update -> the model action: SkyRL
0.3's ``RemoteInferenceClient`` (``start_weight_update``, ``update_weights_ipc``,
``update_weights_nccl``, ``finish_weight_update`` call these worker methods) and the worker
methods behind vLLM's native ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``."""


def health(s: Session, data, query, entry):
    return s.health()


def models(s: Session, data, query, entry):
    """The base model, and the LoRA adapter while it is loaded (vLLM lists both)."""
    listed = [SERVED_MODEL] + ([s.adapter] if s.adapter_loaded else [])
    return 200, {"object": "list", "data": [{"id": m, "object": "model"} for m in listed]}


def _lora(s: Session, data) -> bool:
    """Whether a request goes through the endpoint's LoRA adapter: its ``model`` names the
    adapter the trainer loaded (vLLM routes a request to a LoRA by the ``model`` field;
    an adapter not loaded now is 404 ``The model ... does not exist``). Any other model
    name is the base model: serve cannot know the base model's name a trainer was
    configured with."""
    name = data.get("model")
    if s.adapter is None or name != s.adapter:
        return False
    return s.lora_request(name, HTTPStatus.NOT_FOUND)


def is_paused(s: Session, data, query, entry):
    return 200, {"is_paused": s.paused}


def weight_info(s: Session, data, query, entry):
    return 200, {"weight_version": s.weights.label()}


def pause(s: Session, data, query, entry):
    """``/pause?mode=abort|wait|keep&clear_cache=true|false``: ``keep`` is an in-place
    pause and ignores ``clear_cache`` (as vLLM does); ``wait`` drains nothing here (see
    the package doc); ``clear_cache`` (vLLM's default true) is PauseGeneration's."""
    mode = query.get("mode", ["abort"])[-1]
    clear = query.get("clear_cache", ["true"])[-1].lower()
    if mode not in ("abort", "wait", "keep") or clear not in ("true", "false"):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"mode {mode!r} / clear_cache {clear!r}")
    how = PauseMode.IN_PLACE if mode == "keep" else PauseMode.ABORT
    clear_cache = clear == "true" and how is not PauseMode.IN_PLACE
    obs = s.step(PauseGeneration(0, how, clear_cache), entry)
    s.paused = True  # a refused clear still pauses (PauseGeneration)
    if obs.status is not Status.OK:
        raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "pause failed")
    return 200, {"status": "paused"}


def resume(s: Session, data, query, entry):
    obs = s.step(ContinueGeneration(0), entry)
    s.paused = s.paused and obs.status is not Status.OK
    if obs.status is not Status.OK:
        raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "resume failed")
    return 200, {"status": "resumed"}


def reset_prefix_cache(s: Session, data, query, entry):
    """``{"success": bool}`` with 200 either way: vLLM's route returns the engine's
    ``reset_prefix_cache() -> bool`` as the body (a refused reset is ``false``, never an
    HTTP error; ``vllm/entrypoints/serve/dev``, vLLM 0.32). vLLM reads
    ``reset_running_requests`` from the query string only (SkyRL's JSON body field is
    ignored, as vLLM ignores it); a true one preempts the running requests, a form the
    model has no action for yet (``PENDING``: 501)."""
    if query.get("reset_running_requests", ["false"])[-1].lower() == "true":
        raise PendingRoute("/reset_prefix_cache?reset_running_requests=true", "FlushCache(preempt)")
    if isinstance(data.get("reset_running_requests"), bool):
        entry["ignored"] = {"reset_running_requests": data["reset_running_requests"]}
    obs = s.reset(entry)
    return 200, {"success": obs.status is Status.OK and obs.flushed is not False}


def _two_phase(s: Session, action: str, source: str, label: Any, entry) -> Observation:
    """One step of a two-phase update (vLLM's native routes or ``/collective_rpc``); a
    failed step is the engine's 500, as vLLM raises it."""
    if action == "BeginWeightUpdate":
        obs = s.begin(source, entry)
    elif action == "UpdateWeightChunk":
        obs = s.step(UpdateWeightChunk(0), entry)
    else:
        obs = s.finish(label, entry)
    if obs.status is not Status.OK:
        raise HttpError(HTTPStatus.INTERNAL_SERVER_ERROR, obs.detail or f"{action} failed")
    return obs


def start_weight_update(s: Session, data, query, entry):
    _two_phase(s, "BeginWeightUpdate", "/start_weight_update", None, entry)
    return 200, {"message": "Weight update started"}


def update_weights(s: Session, data, query, entry):
    if not isinstance(data.get("update_info"), dict):
        raise HttpError(HTTPStatus.BAD_REQUEST, "missing field: update_info (an object)")
    _two_phase(s, "UpdateWeightChunk", "/update_weights", None, entry)
    return 200, {"message": "Weights updated"}


def finish_weight_update(s: Session, data, query, entry):
    _two_phase(s, "FinishWeightUpdate", "", data.get("weight_version"), entry)
    return 200, {"message": "Weight update finished"}


def collective_rpc(s: Session, data, query, entry):
    method, kwargs = data.get("method"), data.get("kwargs") or {}
    if not isinstance(method, str):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"collective_rpc method {method!r} is not a string")
    if method in TWO_PHASE_METHODS:
        _two_phase(s, TWO_PHASE_METHODS[method], f"collective_rpc {method}", None, entry)
        return 200, {"results": [None]}
    if method != "reload_weights":
        known = ", ".join(["reload_weights", *TWO_PHASE_METHODS])
        raise HttpError(
            HTTPStatus.BAD_REQUEST,
            f"kvfence serve: collective_rpc method {method!r}: one of {known}",
        )
    path = kwargs.get("weights_path") if isinstance(kwargs, dict) else None
    if not isinstance(path, str):
        raise HttpError(HTTPStatus.BAD_REQUEST, "kwargs.weights_path must be a string")
    obs = s.update(Funnel.DISK, None, path, entry)
    if obs.status is not Status.OK:
        raise HttpError(HTTPStatus.INTERNAL_SERVER_ERROR, obs.detail or "reload failed")
    return 200, {"results": [None]}


def sleep(s: Session, data, query, entry):
    """``/sleep?level=N``: every level releases the weights (offloaded or discarded) and
    the KV memory: Sleep of every tag. vLLM reads no ``tags`` here (SkyRL sends them): they
    are logged as ignored, as vLLM ignores them."""
    level = query.get("level", ["1"])[-1]
    if level not in ("0", "1", "2"):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"level {level!r}: 0, 1 or 2")
    if query.get("tags"):
        entry["ignored"] = {"tags": query["tags"]}
    obs = s.step(Sleep(0), entry)
    if obs.status is not Status.OK:
        raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "sleep failed")
    return 200, b""


def wake_up(s: Session, data, query, entry):
    """``/wake_up?tags=weights&tags=kv_cache`` (none: every tag)."""
    tags = s.memory(query.get("tags"), "/wake_up")
    if tags is None:
        entry["noop"] = "only tags the model does not have"
        return 200, b""
    obs = s.step(WakeUp(0, tags), entry)
    if obs.status is not Status.OK:
        raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "wake_up failed")
    return 200, b""


def update_weight_version(s: Session, data, query, entry):
    label = data.get("new_version")
    obs = s.publish(label, False, entry)
    if obs.status is not Status.OK:
        raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or f"label {label!r} refused")
    return 200, {"success": True, "new_version": label}


def completions(s: Session, data, query, entry):
    """``POST /v1/completions`` (``vllm/entrypoints/openai``, vLLM 0.32): ``prompt`` a
    string, a list of token ids, or a batch (a list of either: one ServeRequest per prompt,
    as TRL's ``VLLMClient.generate`` sends); ``n`` choices per prompt, prompt-major;
    ``return_tokens_as_token_ids`` writes each token as ``"token_id:<id>"``; each choice
    has ``token_ids``, ``prompt_token_ids`` and ``logprobs`` (``tokens``,
    ``token_logprobs``, ``top_logprobs`` one ``{token: logprob}`` per position). A
    ``model`` naming the loaded LoRA adapter serves through it (``_lora``). ``"stream":
    true`` streams it (``_stream_completion``)."""
    if data.get("stream") is True:
        return _stream_completion(s, data, entry)
    prompts = _batch(s, data)
    n = s.max_tokens(data.get("max_tokens"), 16)
    copies = data.get("n", 1)
    if not isinstance(copies, int) or isinstance(copies, bool) or copies < 1:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"n {copies!r} is not a positive int")
    as_ids = data.get("return_tokens_as_token_ids") is True
    lora = _lora(s, data)
    choices, n_prompt, n_out, cached = [], 0, 0, 0
    for prompt in prompts:
        ids, logprobs, hit, count = s.complete(prompt, n, data, "cache_salt", entry, lora)
        n_prompt += count
        cached += count if hit else 0
        tokens = [f"token_id:{t}" if as_ids else f"t{t}" for t in ids]
        for _ in range(copies):
            n_out += n
            choices.append(
                {
                    "index": len(choices),
                    "text": " ".join(f"t{t}" for t in ids),
                    "token_ids": ids,
                    "prompt_token_ids": _prompt_ids(prompt),
                    "logprobs": {
                        "tokens": tokens,
                        "token_logprobs": logprobs,
                        "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs, strict=True)],
                        "text_offset": list(range(n)),
                    },
                    "finish_reason": "length",
                }
            )
    usage = {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_out,
        "total_tokens": n_prompt + n_out,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    return 200, {
        "id": f"cmpl-{next(s.rids)}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": SERVED_MODEL,
        "choices": choices,
        "usage": usage,
    }


def _stream_completion(s: Session, data, entry):
    """``/v1/completions`` with ``"stream": true`` (one prompt, ``n`` 1): server-sent events
    as vLLM 0.32 streams them (``vllm/entrypoints/openai/completion/serving.py``: each
    ``data: {"id", "object": "text_completion", "created", "model", "choices": [{"index",
    "text", "logprobs", "finish_reason"}]}``, then ``data: [DONE]``). The request is a
    StartRequest: it holds its KV in flight, so a reset meanwhile is refused
    (``{"success": false}``, as vLLM's ``reset_prefix_cache`` returns while requests run),
    until it ends ``Session.stream_hold`` seconds later (FinishRequest: its tokens, then
    ``finish_reason`` ``"length"``) or a ``/pause?mode=abort`` aborts it
    (``finish_reason`` ``"abort"``), or its client goes away (aborted then, as vLLM aborts a
    request whose connection closed). The first event carries no text (the prefill ran)."""
    if data.get("n", 1) != 1:
        raise HttpError(HTTPStatus.BAD_REQUEST, "kvfence serve: a stream has one choice (n 1)")
    prompt = s.prompt(data, "prompt", "prompt")
    n = s.max_tokens(data.get("max_tokens"), 16)
    salt = data.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise HttpError(HTTPStatus.BAD_REQUEST, "cache_salt must be a string")
    rid = s.start_stream(prompt, salt or None, _lora(s, data), entry)
    head = {"id": f"cmpl-{rid}", "object": "text_completion", "created": int(time.time())}
    head["model"] = SERVED_MODEL

    def event(text: str, reason: str | None) -> bytes:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return f"data: {json.dumps({**head, 'choices': [choice]})}\n\n".encode()

    def finish() -> bytes:
        from .session import by_checkpoint, tokens_of  # session imports this module

        obs = s.end_stream(rid)
        if obs is None or obs.status is not Status.OK or obs.response is None:
            return event("", "abort") + b"data: [DONE]\n\n"
        ids, _ = tokens_of(by_checkpoint(obs.response.output, s.weights.sources), n)
        return event(" ".join(f"t{t}" for t in ids), "length") + b"data: [DONE]\n\n"

    return 200, Streamed(event("", None), finish, s.stream_hold, lambda: s.abort_stream(rid))


def _batch(s: Session, data) -> list[Any]:
    """The prompts of a completion request: one (a string, or token ids) or a batch."""
    prompt = data.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return [s.prompt({"prompt": p}, "prompt", "prompt") for p in prompt]
    return [s.prompt(data, "prompt", "prompt")]


def _prompt_ids(prompt: Any) -> list[int]:
    """A prompt's token ids: its own, or one id per word of a text prompt (a stable hash)."""
    if isinstance(prompt, list):
        return list(prompt)
    return [zlib.crc32(w.encode()) % 32000 for w in prompt.split()]


# ----- the one-time init and probes of real trainers (SkyRL 0.4.0, TRL, ART) -------------


def get_world_size(s: Session, data, query, entry):
    """``GET /get_world_size?include_dp=``: ``{"world_size": N}``, the engine's ranks a
    trainer adds itself to for its NCCL group (``vllm/entrypoints/rl/online/
    api_router.py``, vLLM 0.32). One scheduler here: 1."""
    return 200, {"world_size": 1}


def init_weight_transfer_engine(s: Session, data, query, entry):
    """``POST /init_weight_transfer_engine {"init_info": {...}}``: ``{"message": "Weight
    transfer initialized"}``, 400 without ``init_info`` (same file). A documented no-op:
    no NCCL rendezvous can happen on CPU, so the init answers as the engine would and is
    logged (``init_info`` in the traffic entry); what a transfer then carries is taken
    from the update's metadata (``/update_weights``' ``update_info``)."""
    info = data.get("init_info")
    if not isinstance(info, dict):
        raise HttpError(HTTPStatus.BAD_REQUEST, "Missing 'init_info' in request body")
    entry["noop"] = "weight-transfer init: no rendezvous on serve"
    entry["init_info"] = info
    return 200, {"message": "Weight transfer initialized"}


def server_info(s: Session, data, query, entry):
    """``GET /server_info?config_format=text|json``: ``{"vllm_config", "vllm_env",
    "system_env"}`` (``vllm/entrypoints/serve/dev/server_info/api_router.py``, vLLM 0.32;
    ``vllm_config`` is the config as a string for ``text``, the default, and a JSON tree
    for ``json``, which TRL reads). The tree holds the fields a weight-sync client reads:
    ``cache_config.enable_prefix_caching`` (off with ``--no-prefix-cache``) and
    ``weight_transfer_config`` (the NCCL backend the init routes answer for); the
    endpoint's own server info and weight label sit beside them."""
    info = call_with_timeout(lambda: s.engine.server_info(0), s.timeout, "server_info")
    if info is None:
        raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "server info unavailable")
    fmt = query.get("config_format", ["text"])[-1]
    if fmt not in ("text", "json"):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"config_format {fmt!r}: text or json")
    config = {
        "model_config": {"model": SERVED_MODEL},
        "cache_config": {"enable_prefix_caching": s.config.radix},
        "weight_transfer_config": {"backend": "nccl"},
    }
    return 200, {
        "vllm_config": config if fmt == "json" else str(config),
        "vllm_env": {},
        "system_env": {},
        "kvfence": {**dict(info), "weight_version": s.weights.label()},
    }


def is_sleeping(s: Session, data, query, entry):
    """``GET /is_sleeping``: ``{"is_sleeping": bool}`` (``vllm/entrypoints/serve/dev/sleep/
    api_router.py``, vLLM 0.32), from the model's phase (asleep while any memory is
    released)."""
    state = s._state()
    asleep = state is not None and state.endpoint(0).phase is Phase.ASLEEP
    return 200, {"is_sleeping": asleep}


def chat_completions(s: Session, data, query, entry):
    """``POST /v1/chat/completions`` (``vllm/entrypoints/openai``, vLLM 0.32): ServeRequest
    of the ``messages`` list (one prompt per distinct list), ``cache_salt`` as for
    ``/v1/completions``; ``max_completion_tokens`` or ``max_tokens``. Answers the OpenAI
    chat shape with ``usage.prompt_tokens_details.cached_tokens``."""
    messages = data.get("messages")
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)):
        raise HttpError(HTTPStatus.BAD_REQUEST, "need messages (a non-empty list of objects)")
    n = s.max_tokens(data.get("max_completion_tokens", data.get("max_tokens")), 16)
    ids, _, hit, _ = s.complete(messages, n, data, "cache_salt", entry, _lora(s, data))
    n_prompt = sum(len(str(m.get("content", "")).split()) for m in messages) or 1
    return 200, {
        "id": f"chatcmpl-{next(s.rids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": SERVED_MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": " ".join(f"t{t}" for t in ids)},
                "finish_reason": "length",
            }
        ],
        "usage": {
            "prompt_tokens": n_prompt,
            "completion_tokens": n,
            "total_tokens": n_prompt + n,
            "prompt_tokens_details": {"cached_tokens": n_prompt if hit else 0},
        },
    }


def generate_tokens(s: Session, data, query, entry):
    """``POST /inference/v1/generate`` (``vllm/entrypoints/scale_out/token_in_token_out/
    api_router.py`` and ``protocol.py``, vLLM 0.32; the token-in token-out route RL
    trainers use): ``GenerateRequest`` ``{"token_ids": [int, ...] (at least one, none
    negative), "sampling_params": {"max_tokens"?, ...}, "model"?, "cache_salt"?,
    "request_id"?}``: one ServeRequest, through the LoRA adapter when ``model`` names it.
    Answers ``GenerateTokensResponse``: ``{"request_id", "model", "created", "usage",
    "prompt_token_ids", "output_mode": "tokens", "choices": [{"index": 0,
    "finish_reason": "length", "stop_reason": null, "token_ids", "logprobs": {"content":
    [{"token_id", "logprob", "top_logprobs": [...]}]}}]}``. ``output_mode`` ``"text"``
    needs a tokenizer and is 400 here (vLLM answers 400 where the server has none);
    ``stream`` is 400 here too (serve answers a request whole)."""
    ids_in = data.get("token_ids")
    if not (isinstance(ids_in, list) and ids_in and all(_is_token(t) for t in ids_in)):
        raise HttpError(HTTPStatus.BAD_REQUEST, "token_ids: a non-empty list of ints >= 0")
    params = data.get("sampling_params")
    if not isinstance(params, dict):
        raise HttpError(HTTPStatus.BAD_REQUEST, "Field required: sampling_params (an object)")
    if data.get("output_mode", "tokens") != "tokens":
        raise HttpError(HTTPStatus.BAD_REQUEST, "output_mode 'text' needs a tokenizer")
    if data.get("stream"):
        raise HttpError(HTTPStatus.BAD_REQUEST, "kvfence serve: stream is not served here")
    n = s.max_tokens(params.get("max_tokens"), 16)
    lora = _lora(s, data)
    ids, logprobs, hit, n_prompt = s.complete(ids_in, n, data, "cache_salt", entry, lora)
    content = [
        {"token_id": t, "logprob": lp, "rank": 1, "top_logprobs": [{"token_id": t, "logprob": lp}]}
        for t, lp in zip(ids, logprobs, strict=True)
    ]
    return 200, {
        "request_id": data.get("request_id") or f"gen-{next(s.rids)}",
        "model": data.get("model") or SERVED_MODEL,
        "created": int(time.time()),
        "usage": {
            "prompt_tokens": n_prompt,
            "completion_tokens": n,
            "total_tokens": n_prompt + n,
            "prompt_tokens_details": {"cached_tokens": n_prompt if hit else 0},
        },
        "prompt_token_ids": list(ids_in),
        "output_mode": "tokens",
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": ids,
                "logprobs": {"content": content},
            }
        ],
    }


def _is_token(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def load_lora_adapter(s: Session, data, query, entry):
    """``POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"?}``
    (``vllm/entrypoints/serve/lora/api_router.py``, ``openai/models/serving.py``
    ``load_lora_adapter``, vLLM 0.32; served by vLLM with
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``): a text 200 ``Success: LoRA adapter '<name>'
    added successfully.``; 400 without both fields, for the base model's name, and for a
    name already loaded without ``load_inplace`` (vLLM's ``InvalidUserInput``). The
    first load is the endpoint's adapter (a logged no-op); loading it again, in place or
    after an unload, is LoadLora (``Session.load_adapter``): vLLM 0.32 keys a LoRA's
    prefix blocks by its name and path (``_gen_lora_extra_hash_keys``), so new bytes at
    the same path must not find the old blocks (ENG-007, vllm-project/vllm #42125)."""
    name, path = data.get("lora_name"), data.get("lora_path")
    if not (isinstance(name, str) and name and isinstance(path, str) and path):
        raise HttpError(
            HTTPStatus.BAD_REQUEST, "Both 'lora_name' and 'lora_path' must be provided."
        )
    in_place = data.get("load_inplace", False)
    if not isinstance(in_place, bool):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"load_inplace {in_place!r} is not a bool")
    if name == SERVED_MODEL:
        raise HttpError(
            HTTPStatus.BAD_REQUEST,
            f"The lora adapter '{name}' conflicts with a served base model.",
        )
    if s.adapter_loaded and name == s.adapter and not in_place:
        raise HttpError(
            HTTPStatus.BAD_REQUEST,
            f"The lora adapter '{name}' has already been loaded. If you want to load the "
            "adapter in place, set 'load_inplace' to True.",
        )
    entry["lora_path"] = path
    obs = s.load_adapter(name, entry)
    if obs is not None and obs.status is not Status.OK:
        raise HttpError(HTTPStatus.INTERNAL_SERVER_ERROR, obs.detail or "LoRA load failed")
    return 200, f"Success: LoRA adapter '{name}' added successfully.".encode()


def unload_lora_adapter(s: Session, data, query, entry):
    """``POST /v1/unload_lora_adapter {"lora_name", "lora_int_id"?}`` (same files): a
    text 200 ``Success: LoRA adapter '<name>' removed successfully.``; 400 without a
    name, 404 ``NotFoundError`` for a name not loaded. A documented no-op: no request can
    name the adapter until it is loaded again, and that load is LoadLora; the KV it
    leaves cached is that reload's concern (ENG-007)."""
    name = data.get("lora_name")
    if not isinstance(name, str) or not name:
        raise HttpError(
            HTTPStatus.BAD_REQUEST, "'lora_name' needs to be provided to unload a LoRA adapter."
        )
    if name != s.adapter or not s.adapter_loaded:
        raise HttpError(HTTPStatus.NOT_FOUND, f"The lora adapter '{name}' cannot be found.")
    s.adapter_loaded = False
    entry["noop"] = "unloaded: no request names the adapter until its reload (LoadLora)"
    return 200, f"Success: LoRA adapter '{name}' removed successfully.".encode()


ROUTES: tuple[Route, ...] = (
    Route("vllm", ("GET",), "/health", "", health),
    Route("vllm", ("GET",), "/v1/models", "", models),
    Route("vllm", ("GET",), "/is_paused", "", is_paused),
    Route("vllm", ("GET",), "/weight_info", "", weight_info),
    Route("vllm", ("POST",), "/pause", "PauseGeneration", pause),
    Route("vllm", ("POST",), "/resume", "ContinueGeneration", resume),
    Route(
        "vllm",
        ("POST",),
        "/reset_prefix_cache",
        "FlushCache",
        reset_prefix_cache,
        "FlushCache(preempt)",
    ),
    Route("vllm", ("POST",), "/collective_rpc", "UpdateWeights", collective_rpc),
    Route("vllm", ("POST",), "/start_weight_update", "BeginWeightUpdate", start_weight_update),
    Route("vllm", ("POST",), "/update_weights", "UpdateWeightChunk", update_weights),
    Route("vllm", ("POST",), "/finish_weight_update", "FinishWeightUpdate", finish_weight_update),
    Route("vllm", ("POST",), "/sleep", "Sleep", sleep),
    Route("vllm", ("POST",), "/wake_up", "WakeUp", wake_up),
    Route("vllm", ("POST",), "/update_weight_version", "PublishVersion", update_weight_version),
    Route(
        "vllm", ("POST",), "/v1/completions", "ServeRequest", completions, "ServeRequest(namespace)"
    ),
    Route("vllm", ("POST",), "/v1/chat/completions", "ServeRequest", chat_completions),
    Route("vllm", ("POST",), "/inference/v1/generate", "ServeRequest", generate_tokens),
    Route(
        "vllm",
        ("POST",),
        "/v1/load_lora_adapter",
        "LoadLora",
        load_lora_adapter,
        "LoadLora(second adapter)",
    ),
    Route(
        "vllm",
        ("POST",),
        "/v1/unload_lora_adapter",
        "",
        unload_lora_adapter,
        noop="no request can name the adapter until its reload, which is LoadLora",
    ),
    Route("vllm", ("GET",), "/get_world_size", "", get_world_size),
    Route("vllm", ("GET",), "/server_info", "", server_info),
    Route("vllm", ("GET",), "/is_sleeping", "", is_sleeping),
    Route(
        "vllm",
        ("POST",),
        "/init_weight_transfer_engine",
        "",
        init_weight_transfer_engine,
        noop="an NCCL group's init: no rendezvous on serve, nothing the cache depends on",
    ),
)
"""Every route of ``--api vllm``; anything else is the engine's 404. ``/collective_rpc`` is
``UpdateWeights`` for ``reload_weights`` and the two-phase actions for the methods of
``TWO_PHASE_METHODS``."""
