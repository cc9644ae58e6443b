"""``kvfence serve``: an HTTP server that speaks an engine's own weight-sync routes, with a
kvfence engine behind it, judged live.

A trainer's sync code (or any HTTP client) talks to ``kvfence serve`` as it would to SGLang
or vLLM. Each request that maps to a model action (the ``ROUTES`` table: one route, one
action) is applied to the model and to the engine in lockstep (``Lockstep.run``) and
recorded as a kvfence trace step; the answer is the engine's observation in the real
engine's own JSON shape. Routes that only probe (server info, health, the model list) are
answered from the engine and logged, not stepped. Forms of a route whose model action a
serve endpoint cannot take yet (``PENDING``: LoRA and namespaced requests) are parsed and
answered 501 in the engine's error shape, naming the action they wait for.

Sources of the request and response bodies (read, not copied):

* SGLang 0.5.23: ``python/sglang/srt/entrypoints/http_server.py`` (routes, the 400 error
  shape ``{"object": "error", "message", "type": "Bad Request", "param": null, "code":
  400}`` of its ``RequestValidationError`` handler, ``/flush_cache``'s text answer) and
  ``python/sglang/srt/managers/io_struct.py`` (``PauseGenerationReqInput.mode``,
  ``UpdateWeightFromDiskReqInput`` / ``UpdateWeightsFromTensorReqInput`` /
  ``UpdateWeightsFromDistributedReqInput`` with ``flush_cache`` (default true) and
  ``weight_version``, ``UpdateWeightVersionReqInput.new_version``,
  ``Release/ResumeMemoryOccupationReqInput.tags``, ``GenerateReqInput.extra_key``).
  SGLang's ``/update_weight_version`` answers ``{"success", "message", "new_version"}`` and
  aborts every request first when ``abort_all_requests``.
* vLLM 0.32: ``vllm/entrypoints/serve/dev/*`` (``/collective_rpc``, ``/reset_prefix_cache``
  answering ``{"success": bool}``, ``/is_paused``; ``dev/sleep/api_router.py``: ``/sleep``
  reads only the ``level`` and ``mode`` query parameters, ``/wake_up`` reads ``tags`` as a
  repeated query parameter, none meaning all, both answer an empty 200),
  ``vllm/entrypoints/rl/online/api_router.py`` (``/pause?mode=abort|wait|keep&
  clear_cache=`` with ``clear_cache`` true by default and ignored for ``keep``, answering
  ``{"status": "paused"}``; ``/resume``; ``/weight_info``; ``/update_weight_version
  {"new_version"}``; the two-phase update ``/start_weight_update``, ``/update_weights
  {"update_info"}``, ``/finish_weight_update {"weight_version"?}``, each answering
  ``{"message"}``), ``vllm/entrypoints/openai`` (``/v1/completions`` with ``cache_salt``,
  ``return_token_ids``, ``usage.prompt_tokens_details.cached_tokens``; errors ``{"error":
  {"message", "type", "param", "code"}}``).
* SkyRL 0.3.0's ``RemoteInferenceClient`` (``skyrl/backends/skyrl_train/inference_servers/
  remote_inference_client.py``): the same two-phase update through ``/collective_rpc``
  methods (``TWO_PHASE_METHODS``), and ``/sleep?level=&tags=`` (tags vLLM ignores).

How a request maps to the model (docs/clients.md, "Over HTTP: kvfence serve"):

* Weight versions: every weight update a trainer sends is the next weight version of the
  endpoint (the checkpoint path, tensor payload or ``weight_version`` label is recorded in
  the session log beside it). An update always changes the weights as far as the cache is
  concerned: the engine cannot know two checkpoints hold the same bytes, so KV computed
  before it is stale after it, whatever the path or label says. A retry after a refused
  update keeps the version the refused one had.
* Prompts: each distinct prompt (text, or token ids) is one prefix name of the model (P, Q,
  R, ...), in order of first appearance. Two prompts sharing only a leading part are
  distinct prefixes (the model then sees less reuse than a radix tree would: never a false
  stale-reuse FAIL).
* The byte oracle: a ``/generate`` with an ``extra_key`` (SGLang) or a ``/v1/completions``
  with a ``cache_salt`` (vLLM) never sent before shares no cached KV on the real engines
  (SGLang scopes the radix tree's root by ``extra_key``, ``mem_cache/base_prefix_cache.py``
  ``root_node_handle``; vLLM hashes ``cache_salt`` into the first block). It is answered
  with the engine's cold prefill of that prompt at the weights in force (the ``cold`` bytes
  of the last request served for it), and logged, not stepped.
* Output tokens: the engine's output bytes hashed into token ids and logprobs, so a stale
  reuse changes them and a fresh hit does not.
* Version labels (``/update_weight_version``, an update's ``weight_version``): a label names
  the version it was first given to (an update's ``weight_version``), else the newest
  version the trainer pushed; publishing it is PublishVersion of that version, which the
  model refuses when the installed weights do not back it (PUB-001).
* In-flight requests: serve answers each request whole (ServeRequest), so none is in flight
  when a pause arrives: vLLM's ``mode=wait`` (drain, then pause) is a pause with nothing to
  drain, modelled as ``abort`` with nothing to abort.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import signal
import struct
import threading
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from attrs import evolve, frozen

from kvfence.adapters import registry
from kvfence.adapters.clients import ReferenceClient
from kvfence.adapters.protocol import EngineAdapter
from kvfence.model.actions import (
    Action,
    BeginWeightUpdate,
    ContinueGeneration,
    FinishWeightUpdate,
    FlushCache,
    PauseGeneration,
    PublishVersion,
    ServeRequest,
    Sleep,
    UpdateWeightChunk,
    UpdateWeights,
    WakeUp,
)
from kvfence.model.checks import Violation
from kvfence.model.observation import Observation
from kvfence.model.state import Config, Policy, server_info
from kvfence.model.vocabulary import (
    ALL_MEMORY,
    CacheMode,
    Funnel,
    Lane,
    MemoryTag,
    PauseMode,
    Phase,
    Status,
)

from .lockstep import (
    MACHINE_BOUNDS,
    AdapterError,
    ConformanceFailure,
    Lockstep,
    NotEnabled,
    Recorder,
    call_with_timeout,
    check_capabilities,
)
from .runner import Result, RuleVerdict, _rule_verdicts
from .trace import header, safe_name, unique_path, write_trace
from .verdict import Verdict, worst

APIS = ("sglang", "vllm")

SERVED_MODEL = "kvfence-serve"
"""The model name ``/v1/models`` lists and completions answer with (vLLM API)."""

SESSION_BOUNDS = evolve(MACHINE_BOUNDS, versions=2**31)
"""A session may push any number of versions (an attach check reloads at every example);
``kvfence replay`` widens its bounds to the trace's newest version."""

MAX_OUTPUT_TOKENS = 16
"""Most tokens a response carries (a request asking for more gets this many)."""


class HttpError(Exception):
    """A request answered with an error: ``status`` and the engine-shaped message."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


class PendingRoute(HttpError):
    """A route (or a form of one) whose model action does not exist yet."""

    def __init__(self, route: str, waits_for: str) -> None:
        super().__init__(
            HTTPStatus.NOT_IMPLEMENTED,
            f"kvfence serve: {route} is not implemented yet: it waits for the model action "
            f"{waits_for}",
        )
        self.waits_for = waits_for


@frozen
class Route:
    """One engine route: ``api``, HTTP ``methods``, ``path``, the model ``action`` it maps
    to (``""``: a probe, not stepped), and ``pending``: the action a form of it waits for."""

    api: str
    methods: tuple[str, ...]
    path: str
    action: str
    pending: str = ""


ROUTES: tuple[Route, ...] = (
    Route("sglang", ("GET",), "/get_server_info", ""),
    Route("sglang", ("GET",), "/server_info", ""),
    Route("sglang", ("GET",), "/health", ""),
    Route("sglang", ("GET",), "/get_model_info", ""),
    Route("sglang", ("POST",), "/pause_generation", "PauseGeneration"),
    Route("sglang", ("POST",), "/continue_generation", "ContinueGeneration"),
    Route("sglang", ("POST",), "/update_weights_from_disk", "UpdateWeights"),
    Route("sglang", ("POST",), "/update_weights_from_tensor", "UpdateWeights"),
    Route("sglang", ("POST",), "/update_weights_from_distributed", "UpdateWeights"),
    Route("sglang", ("GET", "POST"), "/flush_cache", "FlushCache"),
    Route("sglang", ("POST",), "/update_weight_version", "PublishVersion"),
    Route("sglang", ("GET", "POST"), "/release_memory_occupation", "Sleep"),
    Route("sglang", ("GET", "POST"), "/resume_memory_occupation", "WakeUp"),
    Route("sglang", ("POST",), "/generate", "ServeRequest", "ServeRequest(lora)"),
    Route("vllm", ("GET",), "/health", ""),
    Route("vllm", ("GET",), "/v1/models", ""),
    Route("vllm", ("GET",), "/is_paused", ""),
    Route("vllm", ("GET",), "/weight_info", ""),
    Route("vllm", ("POST",), "/pause", "PauseGeneration"),
    Route("vllm", ("POST",), "/resume", "ContinueGeneration"),
    Route("vllm", ("POST",), "/reset_prefix_cache", "FlushCache"),
    Route("vllm", ("POST",), "/collective_rpc", "UpdateWeights"),
    Route("vllm", ("POST",), "/start_weight_update", "BeginWeightUpdate"),
    Route("vllm", ("POST",), "/update_weights", "UpdateWeightChunk"),
    Route("vllm", ("POST",), "/finish_weight_update", "FinishWeightUpdate"),
    Route("vllm", ("POST",), "/sleep", "Sleep"),
    Route("vllm", ("POST",), "/wake_up", "WakeUp"),
    Route("vllm", ("POST",), "/update_weight_version", "PublishVersion"),
    Route("vllm", ("POST",), "/v1/completions", "ServeRequest", "ServeRequest(namespace)"),
)
"""Every route ``kvfence serve`` answers, by API; anything else is the engine's 404.
``/collective_rpc`` is ``UpdateWeights`` for ``reload_weights`` and the two-phase actions
for the methods of ``TWO_PHASE_METHODS``."""

PENDING: dict[str, str] = {
    "ServeRequest(lora)": "SGLang /generate with a lora_path: LoRA requests on a serve "
    "endpoint (its config has no LoRA adapter)",
    "ServeRequest(namespace)": "a reused extra_key (SGLang /generate) or cache_salt (vLLM "
    "/v1/completions): namespaced requests on a serve endpoint",
}
"""Forms of a route answered 501, by the model action they wait for (the integrator's list).
Every route of ``ROUTES`` is otherwise answered for real."""

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
0.3's ``RemoteInferenceClient`` (``skyrl/backends/skyrl_train/inference_servers/
remote_inference_client.py``: ``start_weight_update``, ``update_weights_ipc``,
``update_weights_nccl``, ``finish_weight_update`` call these worker methods) and the worker
methods behind vLLM's native ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``."""

SGLANG_MEMORY_TAGS = {"kv_cache": MemoryTag.KV_CACHE, "weights": MemoryTag.WEIGHTS}
"""SGLang's memory tags (``GPU_MEMORY_TYPE_*``) the model has; its third, ``cuda_graph``,
holds neither KV nor weights (``MemoryTag``): accepted, and not modelled."""

UNMODELLED_TAGS = frozenset({"cuda_graph"})

SGLANG_FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


def endpoint_config(api: str) -> Config:
    """The one endpoint ``kvfence serve`` models for ``api``: radix (prefix) cache on,
    standard lane; SGLang reports ``disable_radix_cache: false`` in its server info and an
    omitted ``flush_cache`` means true (``UpdateWeightFromDiskReqInput``); vLLM reports
    ``enable_prefix_caching: true`` and has no ``flush_cache`` field (false)."""
    if api == "sglang":
        info = server_info(disable_radix_cache=False)
        return Config(radix=True, lane=Lane.STANDARD, info=info, flush_default=True)
    info = server_info(enable_prefix_caching=True)
    return Config(radix=True, lane=Lane.STANDARD, info=info, flush_default=False)


def prefix_name(i: int) -> str:
    """The model's name of the ``i``-th distinct prompt: P, Q, ..., Z, then P11, P12, ..."""
    return chr(ord("P") + i) if i < 11 else f"P{i}"


def by_checkpoint(output: Any, sources: dict[int, str]) -> Any:
    """``output`` with each ``(component, version)`` pair's version replaced by the
    checkpoint it was loaded from: a real engine's bytes depend on the weights, not on the
    count of updates, so reloading the same checkpoint gives the same tokens again (what
    the byte oracle of an attach adapter relies on)."""
    if isinstance(output, tuple):
        if (
            len(output) == 2
            and isinstance(output[0], str)
            and isinstance(output[1], int)
            and output[1] in sources
        ):
            return (output[0], sources[output[1]])
        return tuple(by_checkpoint(x, sources) for x in output)
    return output


def tokens_of(output: Any, n: int) -> tuple[list[int], list[float]]:
    """``n`` token ids and logprobs derived from an engine's output bytes (a pure function:
    the same output gives the same tokens)."""
    digest = hashlib.sha256(repr(output).encode()).digest()
    ids, logprobs = [], []
    for k in range(n):
        block = hashlib.sha256(digest + k.to_bytes(4, "big")).digest()
        ids.append(int.from_bytes(block[:4], "big") % 32000)
        logprobs.append(-(struct.unpack(">I", block[4:8])[0] / 2**32) * 5.0)
    return ids, logprobs


class Session:
    """One ``kvfence serve`` session: the engine, the model in lockstep, the traffic.

    ``handle(method, target, body)`` answers one HTTP request: ``(status, content type,
    body bytes)``. Requests are handled one at a time (a lock). After a FAIL or an adapter
    ERROR the verdict is fixed: later requests still reach the engine (a trainer's run goes
    on) but are only logged, not judged.
    """

    def __init__(
        self,
        api: str,
        engine_name: str,
        mode: CacheMode = CacheMode.AUTO,
        out_dir: Path = Path("kvfence-results"),
        timeout: float = 60.0,
        strict: bool = False,
        engine: EngineAdapter | None = None,
    ) -> None:
        if api not in APIS:
            raise ValueError(f"--api {api!r}: one of {', '.join(APIS)}")
        self.api = api
        self.engine_name = engine_name
        self.engine = engine if engine is not None else registry.engine(engine_name)
        self.out_dir = Path(out_dir)
        self.timeout = timeout
        self.strict = strict
        # An engine of one fixed endpoint (a real engine: ``vllm``, ``sglang``) is served
        # as it is; an in-process engine gets the API's endpoint.
        fixed = getattr(self.engine, "fixed_configs", None)
        self.config = fixed[0] if fixed else endpoint_config(api)
        self.policy = Policy(mode=mode)
        self.recorder = Recorder()
        self.lock = threading.Lock()
        self.routes = {r.path: r for r in ROUTES if r.api == api}
        self.prompts: dict[Any, str] = {}
        self.salts: set[str] = set()
        self.cold: dict[tuple[str, int], Any] = {}
        self.traffic: list[dict[str, Any]] = []
        self.versions: dict[int, str] = {0: "initial weights"}
        #: The engine's own account, kept apart from the model's (which a FAIL freezes):
        #: the newest version pushed, the version installed, and whether it is paused.
        self.trainer = 0
        self.weights = 0
        self.paused = False
        #: Version labels: label -> the version it names; the label published last.
        self.labels: dict[str, int] = {}
        self.published: tuple[int, str] | None = None
        #: The version an open two-phase update installs, and its source (traffic log).
        self.window: tuple[int, str] | None = None
        self.violations: list[Violation] = []
        self.error: AdapterError | None = None
        self.started = time.monotonic()
        self.rids = itertools.count()
        self.trace_path: Path | None = None
        self.counterexample: Path | None = None
        self.capabilities = frozenset()
        self.lockstep = Lockstep(
            self.engine, ReferenceClient(), self.recorder, SESSION_BOUNDS, timeout=timeout
        )
        try:
            self.capabilities = check_capabilities(self.engine)
            self.lockstep.start((self.config,), self.policy)
        except AdapterError as e:
            self.error = e

    # ----- one request ----------------------------------------------------------------

    def handle(self, method: str, target: str, body: bytes) -> tuple[int, str, bytes]:
        """Answer one request; never raises for what the request holds."""
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query)
        with self.lock:
            entry: dict[str, Any] = {"method": method, "path": target}
            try:
                if path.startswith("/kvfence/"):
                    status, payload = self._kvfence(method, path)
                else:
                    status, payload = self._route(method, path, query, body, entry)
            except PendingRoute as e:
                entry["pending"] = e.waits_for
                status, payload = e.status, self._error(e.status, e.message, path)
            except HttpError as e:
                status, payload = e.status, self._error(e.status, e.message, path)
            except AdapterError as e:  # a probe or an unjudged call the engine failed
                self.error = self.error or e
                status = HTTPStatus.INTERNAL_SERVER_ERROR
                payload = self._error(status, f"engine error: {e}", path)
            except Exception as e:  # a bug of ours: the engine's 500, never a crash
                message = f"kvfence serve: {type(e).__name__}: {e}"
                status = HTTPStatus.INTERNAL_SERVER_ERROR
                payload = self._error(status, message, path)
            entry["status"] = int(status)
            if not path.startswith("/kvfence/"):
                self.traffic.append(entry)
        if isinstance(payload, bytes):
            return int(status), "text/plain; charset=utf-8", payload
        return int(status), "application/json", json.dumps(payload).encode()

    def _error(self, status: int, message: str, path: str) -> Any:
        """The engine's error body for ``status`` (404: FastAPI's ``{"detail": "Not
        Found"}``, as both engines answer an unknown route)."""
        if status == HTTPStatus.NOT_FOUND and path not in self.routes:
            return {"detail": "Not Found"}
        phrase = HTTPStatus(status).phrase
        if self.api == "sglang":
            return {
                "object": "error",
                "message": message,
                "type": phrase,
                "param": None,
                "code": int(status),
            }
        kind = {400: "BadRequestError", 404: "NotFoundError", 501: "NotImplementedError"}
        error = {"message": message, "type": kind.get(status, phrase), "param": None}
        return {"error": {**error, "code": int(status)}}

    def _route(self, method, path, query, body, entry) -> tuple[int, Any]:
        route = self.routes.get(path)
        if route is None:
            raise HttpError(HTTPStatus.NOT_FOUND, "Not Found")
        if method not in route.methods:
            raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} not allowed on {path}")
        data = self._json(body, path)
        handler = getattr(self, f"_{self.api}_{path.strip('/').replace('/', '_')}")
        return handler(data, query, entry)

    def _json(self, body: bytes, path: str) -> dict[str, Any]:
        if not body.strip():
            return {}
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"{path}: the body is not JSON ({e})") from None
        if not isinstance(data, dict):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"{path}: the body must be a JSON object")
        return data

    # ----- the model in lockstep ------------------------------------------------------

    @property
    def judging(self) -> bool:
        """Whether requests are still judged (no FAIL or ERROR yet)."""
        return not self.violations and self.error is None

    def _state(self):
        return next(iter(self.lockstep.states)) if self.lockstep.states else None

    def step(self, action: Action, entry: dict[str, Any]) -> Observation:
        """Apply ``action`` to the engine and the model in lockstep; the engine's
        observation. A FAIL or ERROR fixes the verdict; afterwards actions go to the engine
        alone. A request the model does not enable here is the engine's 400."""
        entry["action"] = action.to_json()
        if not self.judging:
            if self.error is not None:
                raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, f"engine error: {self.error}")
            entry["judged"] = False
            obs = call_with_timeout(lambda: self.engine.apply(action), self.timeout, action.name)
            return obs
        try:
            self.lockstep.run(action)
            self.lockstep.check_model()
        except NotEnabled:
            entry["action"] = None
            state = self._state()
            phase = state.endpoint(0).phase if state else None
            if (isinstance(action, ContinueGeneration) and phase is Phase.SERVING) or (
                isinstance(action, PauseGeneration) and phase is Phase.PAUSED
            ):
                # Both engines answer a repeated pause or a continue while running with
                # success and do nothing: so does serve, without a step.
                entry["noop"] = f"{action.name} while {phase.value}"
                return Observation(Status.OK, detail="no-op")
            phase = phase.value if phase else "?"
            raise HttpError(
                HTTPStatus.BAD_REQUEST,
                f"kvfence serve: the model does not enable {action.name} here (the "
                f"endpoint is {phase}); not sent to the engine",
            ) from None
        except ConformanceFailure as e:
            self.violations = list(e.violations)
            entry["violated"] = [v.rule for v in e.violations]
        except AdapterError as e:
            self.error = e
            raise HttpError(HTTPStatus.INTERNAL_SERVER_ERROR, f"engine error: {e}") from None
        self.violations = self.violations or list(self.lockstep.pending)
        obs = self.lockstep.steps[-1].observed
        assert obs is not None
        entry["step"] = self.lockstep.steps[-1].step
        return obs

    def next_version(self) -> int:
        """The version the next update installs: the one a refused update left pending,
        else one past the trainer's newest."""
        return self.trainer if self.trainer > self.weights else self.trainer + 1

    def update(self, funnel: Funnel, flush: Any, source: str, entry) -> Observation:
        if flush is not None and not isinstance(flush, bool):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"flush_cache {flush!r} is not a bool")
        version = self.next_version()
        entry["weights"] = {"version": version, "source": source}
        obs = self.step(UpdateWeights(0, version, funnel, flush), entry)
        self.trainer = max(self.trainer, version)
        shown = obs.view.weights if obs.view is not None else None
        installed = shown if shown is not None else version if obs.status is Status.OK else None
        if installed == version:
            self.weights = version
            self.versions[version] = source
        return obs

    def serve(self, prompt: Any, salt: str | None, entry) -> tuple[Observation | None, Any]:
        """Serve ``prompt``; with a never-seen ``salt``, the cold oracle (see the module
        doc): ``(None, cold bytes)``."""
        key = json.dumps(prompt)
        if key not in self.prompts:
            self.prompts[key] = prefix_name(len(self.prompts))
        prefix = self.prompts[key]
        weights = self.weights
        if salt is not None and salt not in self.salts:
            self.salts.add(salt)
            cold = self.cold.get((prefix, weights))
            if cold is None:
                raise HttpError(
                    HTTPStatus.BAD_REQUEST,
                    f"kvfence serve: a fresh cache key ({salt!r}) is answered with the "
                    f"engine's cold prefill of a prompt served at these weights; prompt "
                    f"{prefix} has not been served at weight version {weights} yet",
                )
            entry["cold_oracle"] = {"prefix": prefix, "version": weights}
            return None, cold
        if salt is not None:
            raise PendingRoute(
                "a reused cache key (extra_key / cache_salt)", "ServeRequest(namespace)"
            )
        obs = self.step(ServeRequest(0, prefix), entry)
        if obs.response is not None and obs.response.cold is not None:
            self.cold[(prefix, weights)] = obs.response.cold
        return obs, None

    def label(self) -> str:
        """The weight-version label the engine reports: the one published for the weights
        in force, else "default" at the start (as both engines until one is set), else the
        version number."""
        if self.published is not None and self.published[0] == self.weights:
            return self.published[1]
        return "default" if self.weights == 0 else str(self.weights)

    def publish(self, label: Any, abort: Any, entry) -> Observation:
        """``/update_weight_version``: PublishVersion of the version ``label`` names (see the
        module doc); ``abort``: SGLang's ``abort_all_requests``."""
        if not isinstance(label, str) or not label:
            raise HttpError(HTTPStatus.BAD_REQUEST, "missing field: new_version (a string)")
        if not isinstance(abort, bool):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"abort_all_requests {abort!r} is not a bool")
        version = self.labels.get(label, self.trainer)
        entry["label"] = {"new_version": label, "version": version}
        obs = self.step(PublishVersion(0, version, abort), entry)
        if obs.status is Status.OK:
            self.labels.setdefault(label, version)
            self.published = (version, label)
        return obs

    def memory(self, tags: Any, route: str) -> frozenset[MemoryTag] | None:
        """SGLang's ``tags`` (a list of strings; none or empty: every tag) or vLLM's
        repeated ``tags`` query parameter, as model tags; ``None`` when only tags the model
        does not have (``cuda_graph``) were named: nothing to step."""
        if tags is None or tags == []:
            return ALL_MEMORY
        if not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"{route}: tags {tags!r} is not a list")
        unknown = sorted(set(tags) - set(SGLANG_MEMORY_TAGS) - UNMODELLED_TAGS)
        if unknown:
            words = ", ".join([*SGLANG_MEMORY_TAGS, *sorted(UNMODELLED_TAGS)])
            raise HttpError(HTTPStatus.BAD_REQUEST, f"{route}: tags {unknown} (known: {words})")
        modelled = frozenset(SGLANG_MEMORY_TAGS[t] for t in tags if t in SGLANG_MEMORY_TAGS)
        return modelled or None

    def begin(self, source: str, entry) -> Observation:
        """A two-phase update opens: BeginWeightUpdate of the next version."""
        version = self.next_version()
        entry["weights"] = {"version": version, "source": source, "phase": "begin"}
        obs = self.step(BeginWeightUpdate(0, version), entry)
        if obs.status is Status.OK:
            self.trainer = max(self.trainer, version)
            self.window = (version, source)
        return obs

    def finish(self, label: Any, entry) -> Observation:
        """The open two-phase update finishes (vLLM has no ``flush_cache`` here: omitted);
        ``label``: vLLM's ``weight_version``, published with it."""
        if label is not None and not isinstance(label, str):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"weight_version {label!r} is not a string")
        obs = self.step(FinishWeightUpdate(0), entry)
        if self.window is not None:
            version, source = self.window
            shown = obs.view.weights if obs.view is not None else None
            ok = obs.status is Status.OK
            installed = shown if shown is not None else version if ok else None
            if installed == version:
                self.weights = version
                self.versions[version] = label or source
                if label:
                    self.labels.setdefault(label, version)
                    self.published = (version, label)
            self.window = None
        return obs

    # ----- SGLang routes --------------------------------------------------------------

    def _sglang_get_server_info(self, data, query, entry):
        info = call_with_timeout(lambda: self.engine.server_info(0), self.timeout, "server_info")
        if info is None:
            raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "server info unavailable")
        return 200, {**dict(info), "weight_version": self.label(), "version": "kvfence-serve"}

    _sglang_server_info = _sglang_get_server_info

    def _sglang_health(self, data, query, entry):
        if self.error is not None:
            raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, f"engine error: {self.error}")
        return 200, b""

    def _sglang_get_model_info(self, data, query, entry):
        latest = self.versions[max(self.versions)]
        return 200, {"model_path": latest, "is_generation": True, "weight_version": self.label()}

    def _sglang_pause_generation(self, data, query, entry):
        mode = data.get("mode", "abort")
        try:
            pause = PauseMode(mode)
        except ValueError:
            raise HttpError(
                HTTPStatus.BAD_REQUEST, f"mode {mode!r}: one of 'abort', 'retract', 'in_place'"
            ) from None
        obs = self.step(PauseGeneration(0, pause), entry)
        if obs.status is not Status.OK:
            raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "pause failed")
        self.paused = True
        return 200, {"message": "Generation paused successfully.", "status": "ok"}

    def _sglang_continue_generation(self, data, query, entry):
        obs = self.step(ContinueGeneration(0), entry)
        self.paused = self.paused and obs.status is not Status.OK
        if obs.status is not Status.OK:
            raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "continue failed")
        return 200, {"message": "Generation continued successfully.", "status": "ok"}

    def _sglang_update(self, funnel, data, required, source, entry):
        missing = [f for f in required if f not in data]
        if missing:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"missing field(s): {', '.join(missing)}")
        label = data.get("weight_version")
        if label is not None and not isinstance(label, str):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"weight_version {label!r} is not a string")
        obs = self.update(funnel, data.get("flush_cache"), source, entry)
        ok = obs.status is Status.OK
        if label and self.weights == self.trainer and ok:
            # The update's label names its version (SGLang sets weight_version with it).
            self.labels.setdefault(label, self.weights)
            self.published = (self.weights, label)
        message = "Succeeded to update model weights." if ok else obs.detail or "update failed"
        return (200 if ok else 400), {"success": ok, "message": message}

    def _sglang_update_weights_from_disk(self, data, query, entry):
        path = data.get("model_path")
        if "model_path" in data and not isinstance(path, str):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"model_path {path!r} is not a string")
        status, body = self._sglang_update(Funnel.DISK, data, ("model_path",), str(path), entry)
        return status, {**body, "num_paused_requests": 0}

    def _sglang_update_weights_from_tensor(self, data, query, entry):
        label = data.get("weight_version") or "tensor payload"
        return self._sglang_update(
            Funnel.TENSOR, data, ("serialized_named_tensors",), str(label), entry
        )

    def _sglang_update_weights_from_distributed(self, data, query, entry):
        label = (
            data.get("weight_version") or f"group {data.get('group_name', 'weight_update_group')}"
        )
        required = ("names", "dtypes", "shapes")
        return self._sglang_update(Funnel.DISTRIBUTED, data, required, str(label), entry)

    def _sglang_flush_cache(self, data, query, entry):
        obs = self.step(FlushCache(0), entry)
        if obs.status is Status.OK and obs.flushed is not False:
            return 200, SGLANG_FLUSHED.encode()
        return 400, (obs.detail or "Flush cache failed.\n").encode()

    def _sglang_update_weight_version(self, data, query, entry):
        label = data.get("new_version")
        obs = self.publish(label, data.get("abort_all_requests", False), entry)
        if obs.status is not Status.OK:
            message = obs.detail or f"Failed to update weight version: {label}"
            return 400, {"success": False, "message": message}
        message = f"Weight version updated to {label}"
        return 200, {"success": True, "message": message, "new_version": label}

    def _sglang_release_memory_occupation(self, data, query, entry):
        tags = self.memory(data.get("tags"), "/release_memory_occupation")
        if tags is None:
            entry["noop"] = "only tags the model does not have"
            return 200, None
        obs = self.step(Sleep(0, tags), entry)
        if obs.status is not Status.OK:
            return 400, {"error": {"message": obs.detail or "release failed"}}
        return 200, None

    def _sglang_resume_memory_occupation(self, data, query, entry):
        tags = self.memory(data.get("tags"), "/resume_memory_occupation")
        if tags is None:
            entry["noop"] = "only tags the model does not have"
            return 200, None
        obs = self.step(WakeUp(0, tags), entry)
        if obs.status is not Status.OK:
            return 400, {"error": {"message": obs.detail or "resume failed"}}
        return 200, None

    def _prompt(self, data, text_field: str, ids_field: str) -> Any:
        text, ids = data.get(text_field), data.get(ids_field)
        if isinstance(text, str) and text:
            return text
        if isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids):
            return ids
        raise HttpError(
            HTTPStatus.BAD_REQUEST,
            f"need {text_field} (a non-empty string) or {ids_field} (a list of token ids)",
        )

    def _max_tokens(self, value: Any, default: int) -> int:
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"max tokens {value!r} is not a positive int")
        return min(value, MAX_OUTPUT_TOKENS)

    def complete(
        self, prompt: Any, n: int, data: dict[str, Any], salt_field: str, entry
    ) -> tuple[list[int], list[float], bool, int]:
        """Serve ``prompt`` for SGLang ``/generate`` and vLLM ``/v1/completions`` alike:
        ``(token ids, logprobs, prefix hit, prompt tokens)`` of ``n`` output tokens;
        ``salt_field`` is the API's cache-key field (``extra_key``, ``cache_salt``). A
        refused request is the engine's 400."""
        salt = data.get(salt_field)
        if salt is not None and not isinstance(salt, str):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"{salt_field} must be a string")
        obs, cold = self.serve(prompt, salt or None, entry)
        if obs is not None and obs.status is not Status.OK:
            raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "request refused")
        output = cold if obs is None else (obs.response.output if obs.response else None)
        hit = obs is not None and obs.response is not None and obs.response.hit
        ids, logprobs = tokens_of(by_checkpoint(output, self.versions), n)
        n_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        return ids, logprobs, hit, n_prompt

    def _sglang_generate(self, data, query, entry):
        prompt = self._prompt(data, "text", "input_ids")
        params = data.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise HttpError(HTTPStatus.BAD_REQUEST, "sampling_params must be an object")
        if data.get("lora_path") is not None:
            raise PendingRoute("/generate with lora_path", "ServeRequest(lora)")
        n = self._max_tokens(params.get("max_new_tokens"), 8)
        ids, logprobs, hit, n_prompt = self.complete(prompt, n, data, "extra_key", entry)
        meta = {
            "id": data.get("rid") or uuid.uuid4().hex,
            "finish_reason": {"type": "length", "length": n},
            "prompt_tokens": n_prompt,
            "completion_tokens": n,
            "cached_tokens": n_prompt if hit else 0,
            "weight_version": self.label(),
        }
        if data.get("return_logprob"):
            meta["output_token_logprobs"] = [
                [lp, t, None] for lp, t in zip(logprobs, ids, strict=True)
            ]
        return 200, {"text": " ".join(f"t{t}" for t in ids), "output_ids": ids, "meta_info": meta}

    # ----- vLLM routes ----------------------------------------------------------------

    def _vllm_health(self, data, query, entry):
        return self._sglang_health(data, query, entry)

    def _vllm_v1_models(self, data, query, entry):
        return 200, {"object": "list", "data": [{"id": SERVED_MODEL, "object": "model"}]}

    def _vllm_is_paused(self, data, query, entry):
        return 200, {"is_paused": self.paused}

    def _vllm_weight_info(self, data, query, entry):
        return 200, {"weight_version": self.label()}

    def _vllm_pause(self, data, query, entry):
        """``/pause?mode=abort|wait|keep&clear_cache=true|false``: ``keep`` is an in-place
        pause and ignores ``clear_cache`` (as vLLM does); ``wait`` drains nothing here (see
        the module doc); ``clear_cache`` (vLLM's default true) is PauseGeneration's."""
        mode = query.get("mode", ["abort"])[-1]
        clear = query.get("clear_cache", ["true"])[-1].lower()
        if mode not in ("abort", "wait", "keep") or clear not in ("true", "false"):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"mode {mode!r} / clear_cache {clear!r}")
        pause = PauseMode.IN_PLACE if mode == "keep" else PauseMode.ABORT
        clear_cache = clear == "true" and pause is not PauseMode.IN_PLACE
        obs = self.step(PauseGeneration(0, pause, clear_cache), entry)
        self.paused = True  # a refused clear still pauses (PauseGeneration)
        if obs.status is not Status.OK:
            raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "pause failed")
        return 200, {"status": "paused"}

    def _vllm_resume(self, data, query, entry):
        obs = self.step(ContinueGeneration(0), entry)
        self.paused = self.paused and obs.status is not Status.OK
        if obs.status is not Status.OK:
            raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "resume failed")
        return 200, {"status": "resumed"}

    def _vllm_reset_prefix_cache(self, data, query, entry):
        obs = self.step(FlushCache(0), entry)
        return 200, {"success": obs.status is Status.OK and obs.flushed is not False}

    def _two_phase(self, action: str, source: str, label: Any, entry) -> Observation:
        """One step of a two-phase update (vLLM's native routes or ``/collective_rpc``);
        a failed step is the engine's 500, as vLLM raises it."""
        if action == "BeginWeightUpdate":
            obs = self.begin(source, entry)
        elif action == "UpdateWeightChunk":
            obs = self.step(UpdateWeightChunk(0), entry)
        else:
            obs = self.finish(label, entry)
        if obs.status is not Status.OK:
            raise HttpError(HTTPStatus.INTERNAL_SERVER_ERROR, obs.detail or f"{action} failed")
        return obs

    def _vllm_start_weight_update(self, data, query, entry):
        self._two_phase("BeginWeightUpdate", "/start_weight_update", None, entry)
        return 200, {"message": "Weight update started"}

    def _vllm_update_weights(self, data, query, entry):
        if not isinstance(data.get("update_info"), dict):
            raise HttpError(HTTPStatus.BAD_REQUEST, "missing field: update_info (an object)")
        self._two_phase("UpdateWeightChunk", "/update_weights", None, entry)
        return 200, {"message": "Weights updated"}

    def _vllm_finish_weight_update(self, data, query, entry):
        self._two_phase("FinishWeightUpdate", "", data.get("weight_version"), entry)
        return 200, {"message": "Weight update finished"}

    def _vllm_collective_rpc(self, data, query, entry):
        method, kwargs = data.get("method"), data.get("kwargs") or {}
        if method in TWO_PHASE_METHODS:
            action = TWO_PHASE_METHODS[method]
            self._two_phase(action, f"collective_rpc {method}", None, entry)
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
        obs = self.update(Funnel.DISK, None, path, entry)
        if obs.status is not Status.OK:
            raise HttpError(HTTPStatus.INTERNAL_SERVER_ERROR, obs.detail or "reload failed")
        return 200, {"results": [None]}

    def _vllm_sleep(self, data, query, entry):
        """``/sleep?level=N``: every level releases the weights (offloaded or discarded)
        and the KV memory: Sleep of every tag. vLLM reads no ``tags`` here (SkyRL sends
        them): they are logged as ignored, as vLLM ignores them."""
        level = query.get("level", ["1"])[-1]
        if level not in ("0", "1", "2"):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"level {level!r}: 0, 1 or 2")
        if query.get("tags"):
            entry["ignored"] = {"tags": query["tags"]}
        obs = self.step(Sleep(0), entry)
        if obs.status is not Status.OK:
            raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "sleep failed")
        return 200, b""

    def _vllm_wake_up(self, data, query, entry):
        """``/wake_up?tags=weights&tags=kv_cache`` (none: every tag)."""
        tags = self.memory(query.get("tags"), "/wake_up")
        if tags is None:
            entry["noop"] = "only tags the model does not have"
            return 200, b""
        obs = self.step(WakeUp(0, tags), entry)
        if obs.status is not Status.OK:
            raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "wake_up failed")
        return 200, b""

    def _vllm_update_weight_version(self, data, query, entry):
        label = data.get("new_version")
        obs = self.publish(label, False, entry)
        if obs.status is not Status.OK:
            raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or f"label {label!r} refused")
        return 200, {"success": True, "new_version": label}

    def _vllm_v1_completions(self, data, query, entry):
        prompt = self._prompt(data, "prompt", "prompt")
        n = self._max_tokens(data.get("max_tokens"), 16)
        ids, logprobs, hit, n_prompt = self.complete(prompt, n, data, "cache_salt", entry)
        choice = {
            "index": 0,
            "text": " ".join(f"t{t}" for t in ids),
            "token_ids": ids,
            "logprobs": {
                "tokens": [f"t{t}" for t in ids],
                "token_logprobs": logprobs,
                "top_logprobs": None,
                "text_offset": list(range(n)),
            },
            "finish_reason": "length",
        }
        usage = {
            "prompt_tokens": n_prompt,
            "completion_tokens": n,
            "total_tokens": n_prompt + n,
            "prompt_tokens_details": {"cached_tokens": n_prompt if hit else 0},
        }
        rid = f"cmpl-{next(self.rids)}"
        created = int(time.time())
        return 200, {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": SERVED_MODEL,
            "choices": [choice],
            "usage": usage,
        }

    # ----- kvfence's own routes and the verdict ---------------------------------------

    def _kvfence(self, method: str, path: str) -> tuple[int, Any]:
        if path == "/kvfence/verdict" and method == "GET":
            result = self.result(write=True)
            return 200, self.verdict_json(result)
        raise HttpError(HTTPStatus.NOT_FOUND, "Not Found")

    def rule_verdicts(self) -> tuple[tuple[RuleVerdict, ...], Verdict, str]:
        """Rule verdicts of the session, the run's verdict, and why it is not PASS when a
        rule could not show anything. A rule the session's traffic never exercised is SKIP
        (serve judges only the calls it received); the run is UNKNOWN, never PASS, unless
        a request was served after a weight update (the stale-reuse question was asked)."""
        rules = _rule_verdicts(
            self.recorder, self.violations, self.error, self.capabilities, self.strict
        )
        out = []
        for rv in rules:
            if rv.verdict is Verdict.UNKNOWN and rv.evidence == 0 and rv.rule.kind != "ADP":
                rv = evolve(rv, verdict=Verdict.SKIP, reason="not exercised by this session")
            out.append(rv)
        verdict = worst([r.verdict for r in out])
        why = ""
        if self.error is not None and verdict is not Verdict.FAIL:
            verdict = Verdict.ERROR
        updates = (UpdateWeights, UpdateWeightChunk, FinishWeightUpdate)
        asked = any(
            isinstance(a, ServeRequest)
            and i > 0
            and any(isinstance(b, updates) for b in self.lockstep.actions[:i])
            for i, a in enumerate(self.lockstep.actions)
        )
        if verdict is Verdict.PASS and not asked:
            verdict = Verdict.UNKNOWN
            why = (
                "the session served no request after a weight update: stale reuse could "
                "not have shown; drive pause, update, continue and a request"
            )
        return tuple(out), verdict, why

    def result(self, write: bool = False) -> Result:
        """The session's ``Result`` (as ``check`` prints it); with ``write``, the trace and
        (on FAIL) the counterexample are written under ``out_dir``."""
        rules, verdict, why = self.rule_verdicts()
        warnings = [why] if why else []
        pending = sorted({e["pending"] for e in self.traffic if "pending" in e})
        if pending:
            warnings.append(f"routes not judged, waiting for model actions: {', '.join(pending)}")
        if write:
            try:
                self.write(verdict)
            except OSError as e:
                warnings.append(f"could not write the session trace to {self.out_dir}: {e}")
        return Result(
            engine=self.engine_name,
            client=f"serve:{self.api}",
            profile="serve",
            seed=None,
            verdict=verdict,
            rules=rules,
            violations=tuple(self.violations),
            error="" if self.error is None else str(self.error),
            counterexample=self.counterexample,
            steps=len(self.lockstep.actions),
            examples=1,
            seconds=time.monotonic() - self.started,
            warnings=tuple(warnings),
        )

    def write(self, verdict: Verdict) -> None:
        """The session trace (every judged step, replayable by ``kvfence replay``), the
        traffic log, and on FAIL the counterexample: the trace shrunk on a fresh engine."""
        comment = f"kvfence serve --api {self.api}: the session's requests, in order"
        head = header(
            self.engine_name,
            "reference",
            None,
            "serve",
            (self.config,),
            self.policy,
            comment=comment,
            capabilities=self.capabilities,
        )
        if self.violations:
            from .trace import violation_json

            last = self.lockstep.steps[-1].step if self.lockstep.steps else 0
            line = {
                "verdict": "FAIL",
                "step": last,
                "violations": [violation_json(v) for v in self.violations],
            }
        elif self.error is not None:
            line = {"verdict": "ERROR", "error": str(self.error)}
        else:
            line = {"verdict": verdict.value}
        stem = f"serve-{safe_name(self.engine_name)}-{self.api}"
        if self.trace_path is None:
            self.trace_path = unique_path(self.out_dir, stem)
        write_trace(self.trace_path, head, self.lockstep.steps, line)
        log = self.trace_path.with_suffix(".traffic.json")
        log.write_text(json.dumps({"versions": self.versions, "traffic": self.traffic}, indent=1))
        if self.violations and self.counterexample is None:
            self.counterexample = self.shrunk(head)

    def shrunk(self, head: dict[str, Any]) -> Path | None:
        """The failing session shrunk (``replay.shrink``) on a fresh engine of the same
        name, written as ``counterexample-*.jsonl``; ``None`` when it does not reproduce."""
        from .replay import shrink
        from .trace import verdict_line

        engine = registry.engine(self.engine_name)
        try:
            run = self.lockstep.snapshot(self.violations)
            targets = {v.rule for v in self.violations}
            best = shrink(
                engine, ReferenceClient(), run, targets, True, SESSION_BOUNDS, self.timeout
            )
        finally:
            engine.close()
        if best is None:
            return None
        stem = f"counterexample-{safe_name(self.engine_name)}-serve-{self.api}"
        path = unique_path(self.out_dir, stem)
        return write_trace(
            path, head, best.run.steps, verdict_line(best.run.steps, best.violations)
        )

    def verdict_json(self, result: Result) -> dict[str, Any]:
        from .report import result_json

        out = result_json(result)
        out["exit_code"] = result.exit_code
        out["warnings"] = list(result.warnings)
        out["trace"] = None if self.trace_path is None else str(self.trace_path)
        return out


# ----- the HTTP server ------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    session: Session
    server_version = "kvfence-serve"
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = self.headers.get("Content-Length")
        try:
            size = int(length) if length else 0
        except ValueError:
            size = -1
        if size < 0 or size > 64 * 2**20:
            status, kind, body = 400, "application/json", b'{"detail": "bad Content-Length"}'
        else:
            raw = self.rfile.read(size) if size else b""
            status, kind, body = self.session.handle(self.command, self.path, raw)
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the traffic is in the session log."""


class _Stop(Exception):
    """SIGTERM: stop serving and give the verdict."""


def make_server(session: Session, host: str, port: int) -> ThreadingHTTPServer:
    """A threading HTTP server for ``session`` on ``host:port`` (0: a free port)."""
    handler = type("Handler", (_Handler,), {"session": session})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def run_server(session: Session, host: str, port: int, announce: Callable[[str], None]) -> Result:
    """Serve until SIGINT or SIGTERM, then the session's result (trace written)."""
    server = make_server(session, host, port)

    def stop(signum, frame):
        raise _Stop

    previous = signal.signal(signal.SIGTERM, stop)
    bound = server.server_address[1]
    announce(
        f"kvfence serve: {session.api} API on http://{host}:{bound} (engine {session.engine_name})"
    )
    try:
        server.serve_forever(poll_interval=0.2)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
    with session.lock:
        result = session.result(write=True)
    call_with_timeout(session.engine.close, session.timeout, "close")
    return result
