"""A ``kvfence serve`` session: the engine and the model in lockstep, and the traffic log.

``Session.handle`` answers one HTTP request through the API's route table (``sglang.ROUTES``
or ``vllm.ROUTES``); the handlers call the session's steps (``update``, ``serve``,
``publish``, ``begin``, ``finish``), which apply one model action to the engine and the
model (``Lockstep.run``) and record it as a trace step. The judge (``judge.py``) turns the
recording into a verdict. How a request maps to the model: the package's docstring.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import struct
import threading
import time
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from attrs import evolve

from ...adapters import registry
from ...adapters.clients import ReferenceClient
from ...adapters.protocol import EngineAdapter
from ...model.actions import (
    Action,
    BeginWeightUpdate,
    ContinueGeneration,
    FaultRankUpdateFails,
    FaultRefuseFlush,
    FinishRequest,
    FinishWeightUpdate,
    FlushCache,
    LoadLora,
    PauseGeneration,
    PublishVersion,
    ServeRequest,
    StartRequest,
    UpdateWeights,
    WakeUp,
)
from ...model.capabilities import Capability
from ...model.checks import Violation
from ...model.observation import Observation
from ...model.state import Config, Policy, server_info
from ...model.vocabulary import (
    ALL_MEMORY,
    CacheMode,
    Funnel,
    Lane,
    MemoryTag,
    Phase,
    Role,
    Status,
)
from ..calls import call_with_timeout, check_capabilities
from ..errors import AdapterError, ConformanceFailure, NotEnabled
from ..lockstep import MACHINE_BOUNDS, Lockstep
from ..record import Recorder
from ..runner import Result, RuleVerdict
from . import judge, sglang, vllm
from .routes import Route
from .weights import Weights
from .wire import HttpError, PendingRoute, Streamed, error_body, parse_json

APIS = ("sglang", "vllm")

ROUTE_TABLES: dict[str, tuple[Route, ...]] = {"sglang": sglang.ROUTES, "vllm": vllm.ROUTES}
"""The route table of each API."""

SESSION_BOUNDS = evolve(MACHINE_BOUNDS, versions=2**31, namespaces=True)
"""A session may push any number of versions (an attach check reloads at every example);
``kvfence replay`` widens its bounds to the trace's newest version."""

MAX_OUTPUT_TOKENS = 16
"""Most tokens a response carries (a request asking for more gets this many)."""

SGLANG_MEMORY_TAGS = {"kv_cache": MemoryTag.KV_CACHE, "weights": MemoryTag.WEIGHTS}
"""SGLang's memory tags (``GPU_MEMORY_TYPE_*``) the model has; its third, ``cuda_graph``,
holds neither KV nor weights (``MemoryTag``): accepted, and not modelled."""

UNMODELLED_TAGS = frozenset({"cuda_graph"})

CLOSED = "kvfence serve is stopping: the session's verdict is taken, no request is served"


def endpoint_config(api: str, prefix_cache: bool = True) -> Config:
    """The one endpoint ``kvfence serve`` models for ``api``: radix (prefix) cache on
    (``prefix_cache``; off: ``--no-prefix-cache``), standard lane, one LoRA adapter slot
    (the adapter the trainer loads through the LoRA routes; see ``Session.load_adapter``).
    SGLang reports
    ``disable_radix_cache`` in its server info and an omitted ``flush_cache`` means true
    (``UpdateWeightFromDiskReqInput``); vLLM reports ``enable_prefix_caching`` and has no
    ``flush_cache`` field (false)."""
    if api == "sglang":
        info = server_info(disable_radix_cache=not prefix_cache)
        return Config(
            radix=prefix_cache, lane=Lane.STANDARD, info=info, flush_default=True, lora=True
        )
    info = server_info(enable_prefix_caching=prefix_cache)
    return Config(radix=prefix_cache, lane=Lane.STANDARD, info=info, flush_default=False, lora=True)


def deployment_configs(
    api: str, ranks: int = 1, pd: bool = False, prefix_cache: bool = True
) -> tuple[Config, ...]:
    """The endpoints ``kvfence serve`` models for a deployment (``--ranks N``, ``--pd``);
    the API's one endpoint (``endpoint_config``) when neither is asked. SGLang only (its
    server info and its ``flush_cache`` default, as ``endpoint_config``):

    * ``ranks`` N > 1: one endpoint of N data-parallel ranks (SGLang ``--dp-size N`` under
      its DP controller), radix cache on (``prefix_cache``), standard lane, no LoRA slot
      (ranks are modelled with the radix cache and lanes alone).
    * ``pd``: a prefill endpoint (index 0, radix cache on) and a decode endpoint (index 1,
      its own radix cache off and reported so: every prefix it decodes arrives by
      transfer), each a server of its own (SGLang ``--disaggregation-mode prefill`` and
      ``decode``, ``python/sglang/srt/disaggregation/``).

    ``ValueError`` for both at once, or for the vLLM API."""
    if ranks == 1 and not pd:
        return (endpoint_config(api, prefix_cache),)
    if api != "sglang":
        raise ValueError(
            "--ranks and --pd serve SGLang's deployments (its DP controller, its prefill and "
            "decode servers): use --api sglang"
        )
    if ranks != 1 and pd:
        raise ValueError("--ranks with --pd: an endpoint of a P/D deployment is one scheduler")
    info = server_info(disable_radix_cache=not prefix_cache)
    if pd:
        decode_info = server_info(disable_radix_cache=True)
        return (
            Config(radix=prefix_cache, info=info, flush_default=True, role=Role.PREFILL),
            Config(radix=False, info=decode_info, flush_default=True, role=Role.DECODE),
        )
    return (Config(radix=prefix_cache, info=info, flush_default=True, ranks=ranks),)


def default_engine(ranks: int = 1, pd: bool = False) -> str:
    """The engine ``kvfence serve`` runs when none is named: the reference engine of the
    deployment (``reference-ranks``, the reference DP controller, with ``--ranks N``;
    ``checks-transferred-kv-version``, the reference P/D engines, with ``--pd``), else
    ``reference``."""
    if pd:
        return "checks-transferred-kv-version"
    return "reference-ranks" if ranks > 1 else "reference"


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


def _token_id(value: Any) -> bool:
    """A token id: a non-negative int (JSON ``true`` is not one, as engines' pydantic
    models in strict mode and vLLM's tokenizer refuse it)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Session:
    """One ``kvfence serve`` session: the engine, the model in lockstep, the traffic.

    ``handle(method, target, body)`` answers one HTTP request: ``(status, content type,
    body bytes)``. Requests are handled one at a time (a lock). After a FAIL of the engine's
    answer or an adapter ERROR the verdict is fixed: later requests still reach the engine
    (a trainer's run goes on) but are only logged, not judged. A client rule the trainer's
    calls break (``CallSequence``) is recorded and judging goes on, as in ``check``.

    A deployment (``deployment_configs``): ``ranks`` N > 1 serves one endpoint of N
    data-parallel ranks, ``fail_rank_updates`` makes the first updates fail on its last
    rank; ``pd`` serves a prefill/decode pair, one model endpoint per listener (``handle``'s
    ``endpoint``). Each needs an engine that declares the capability (``ranks``, ``roles``).

    Raises ``ValueError`` for an ``api`` not in ``APIS``, an unknown ``engine_name``, or a
    deployment the API or the engine cannot serve (a usage error).
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
        probe: int = 0,
        refuse_resets: int = 0,
        prefix_cache: bool = True,
        stream_hold: float = 1.0,
        ranks: int = 1,
        pd: bool = False,
        fail_rank_updates: int = 0,
    ) -> None:
        if api not in APIS:
            raise ValueError(f"--api {api!r}: one of {', '.join(APIS)}")
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise ValueError(f"--ranks {ranks!r}: a number of data-parallel ranks, 1 or more")
        deployment_configs(api, ranks, pd, prefix_cache)  # the usage errors first
        self.api = api
        self.engine_name = engine_name
        #: The options the engine was built with (a real SGLang engine's ``ranks``), so
        #: that the shrink builds it again the same way.
        self.engine_options: dict[str, Any] = {}
        if ranks > 1 and (engine_name == "sglang" or engine_name.startswith("sglang@")):
            self.engine_options["ranks"] = ranks
        self.engine = (
            engine if engine is not None else registry.engine(engine_name, **self.engine_options)
        )
        self.out_dir = Path(out_dir)
        self.timeout = timeout
        self.strict = strict
        if probe < 0:
            raise ValueError(f"--probe {probe}: a number of prompts, 0 or more")
        #: ``--probe N``: after each sync, re-send up to N prompts served before it.
        self.probe = probe
        #: Prefix -> the installed weight version it was last served under.
        self.served_at: dict[str, int] = {}
        self.probing = False
        if refuse_resets < 0:
            raise ValueError(f"--refuse-resets {refuse_resets}: a number of resets, 0 or more")
        #: ``--refuse-resets N``: the first N resets the trainer asks are refused.
        self.refusals_left = refuse_resets
        # An engine of one fixed endpoint (a real engine: ``vllm``, ``sglang``) is served
        # as it is; an in-process engine gets the API's endpoint.
        fixed = getattr(self.engine, "fixed_configs", None)
        if ranks > 1 or pd:
            self.configs = self._deployment(fixed, ranks, pd, prefix_cache)
        else:
            if fixed and not prefix_cache:
                raise ValueError(
                    f"--no-prefix-cache: engine {engine_name!r} serves its own fixed endpoint"
                )
            self.configs = (fixed[0] if fixed else endpoint_config(api, prefix_cache),)
        #: The model endpoint the request being answered addresses: the listener's
        #: (``handle``'s ``endpoint``; 1 for the decode server of ``--pd``), else 0. The
        #: handlers build their actions on endpoint 0; ``step`` moves them here.
        self.index = 0
        #: ``--fail-rank-updates N``: the first N weight updates fail on the last rank.
        if fail_rank_updates < 0:
            raise ValueError(f"--fail-rank-updates {fail_rank_updates}: 0 or more updates")
        if fail_rank_updates and self.configs[0].ranks == 1:
            raise ValueError("--fail-rank-updates: the endpoint has one rank (serve --ranks N)")
        if fail_rank_updates and Capability.FAULTS not in self.engine.capabilities:
            raise ValueError(
                f"--fail-rank-updates: engine {engine_name!r} cannot be made to fail an "
                "update on one rank (it does not declare the faults capability)"
            )
        self.rank_failures_left = fail_rank_updates
        #: Round-robin placement of requests that name no rank (``place``).
        self.next_rank = 0
        self.policy = Policy(mode=mode)
        self.recorder = Recorder()
        self.lock = threading.Lock()
        self.routes = {r.path: r for r in ROUTE_TABLES[api]}
        self.prompts: dict[Any, str] = {}
        #: The endpoint's LoRA adapter: the name the trainer first loaded (the model has one
        #: adapter per endpoint), and whether it is loaded now.
        self.adapter: str | None = None
        self.adapter_loaded = False
        #: Streamed generations in flight: request id -> its prefix (``start_stream``).
        self.streams: dict[str, str] = {}
        #: A client's own name for a streamed generation (SGLang's ``rid``) -> its request
        #: id, so that ``/abort_request`` can name it.
        self.stream_names: dict[str, str] = {}
        #: Seconds a streamed generation stays in flight on a served connection.
        self.stream_hold = stream_hold
        self.salts: set[str] = set()
        #: Cache key (``extra_key`` / ``cache_salt``) -> the model's namespace: the weight
        #: version installed when the key was first used.
        self.namespaces: dict[str, int] = {}
        #: Whether the engine keys requests by namespace: it declares the capability, or
        #: it is an in-process engine (each passes a request's namespace to its endpoint;
        #: they leave the capability undeclared only so that searches do not draw it).
        self.keys_namespaces = Capability.NAMESPACES in self.engine.capabilities or bool(
            getattr(self.engine, "in_process", False)
        )
        self.cold: dict[tuple[str, int], Any] = {}
        self.traffic: list[dict[str, Any]] = []
        #: Each endpoint's weight versions and whether it is paused, by the engine's own
        #: account (the model's may be frozen); ``weights`` and ``paused`` are those of
        #: the endpoint the request addresses (``index``).
        self.all_weights = [Weights() for _ in self.configs]
        self.all_paused = [False for _ in self.configs]
        #: Streamed generation -> the endpoint it runs on.
        self.stream_endpoint: dict[str, int] = {}
        #: Prefix -> the endpoint and rank it was last served on (the probe re-sends there).
        self.served_on: dict[str, tuple[int, int]] = {}
        self.violations: list[Violation] = []
        #: The model stopped judging: the engine's answer broke a rule (a client rule
        #: broken by the trainer's calls is recorded and judging goes on, as in ``check``,
        #: so the stale reuse it causes shows too).
        self.stopped = False
        self.error: AdapterError | None = None
        self.started = time.monotonic()
        self.rids = itertools.count()
        self.trace_path: Path | None = None
        self.counterexample: Path | None = None
        self.capabilities = frozenset()
        #: Set by ``close``: the verdict is taken, later requests are refused (503).
        self.closed = False
        self.lockstep = Lockstep(
            self.engine,
            ReferenceClient(),
            self.recorder,
            SESSION_BOUNDS,
            timeout=timeout,
            calls=True,  # the trainer's calls, judged by the client obligations
        )
        try:
            self.capabilities = check_capabilities(self.engine)
            self.lockstep.start(self.configs, self.policy)
        except AdapterError as e:
            self.error = e
        if refuse_resets and Capability.FAULTS not in self.engine.capabilities:
            raise ValueError(
                f"--refuse-resets: engine {engine_name!r} cannot be made to refuse a reset "
                "(it does not declare the faults capability)"
            )

    # ----- a deployment: ranks, roles -------------------------------------------------

    def _deployment(
        self, fixed: Any, ranks: int, pd: bool, prefix_cache: bool
    ) -> tuple[Config, ...]:
        """The endpoints of ``--ranks N`` or ``--pd``: an engine that declares the
        capability (``ranks``, ``roles``) is served on ``deployment_configs``, or a real
        engine on its own fixed endpoint when that has the ranks asked; ``ValueError``
        (a usage error) otherwise."""
        needs, flag = (Capability.ROLES, "--pd") if pd else (Capability.RANKS, "--ranks")
        if needs not in self.engine.capabilities:
            hint = (
                "checks-transferred-kv-version (the reference P/D engines) or a P/D mutant or "
                "design"
                if pd
                else "reference-ranks (the reference DP controller), a ranks mutant or design, "
                "or sglang --ranks N"
            )
            raise ValueError(
                f"{flag}: engine {self.engine_name!r} does not declare the {needs.value} "
                f"capability; serve the deployment with an engine that does: {hint}"
            )
        if fixed and not getattr(self.engine, "in_process", False):
            if pd or fixed[0].ranks != ranks:
                raise ValueError(
                    f"{flag}: engine {self.engine_name!r} serves its own fixed endpoint "
                    f"({fixed[0].ranks} rank(s))"
                )
            if not prefix_cache:
                raise ValueError(
                    f"--no-prefix-cache: engine {self.engine_name!r} serves its own fixed endpoint"
                )
            return (fixed[0],)
        return deployment_configs(self.api, ranks, pd, prefix_cache)

    @property
    def config(self) -> Config:
        """The endpoint the request being answered addresses."""
        return self.configs[self.index]

    @property
    def weights(self) -> Weights:
        """The weight versions of the endpoint the request addresses."""
        return self.all_weights[self.index]

    @property
    def paused(self) -> bool:
        """Whether the endpoint the request addresses is paused, by the engine's account."""
        return self.all_paused[self.index]

    @paused.setter
    def paused(self, value: bool) -> None:
        self.all_paused[self.index] = value

    @property
    def pd(self) -> bool:
        """The session serves a prefill/decode pair (``--pd``)."""
        return any(c.role is not None for c in self.configs)

    def role(self, endpoint: int) -> str:
        """The name of ``endpoint`` in the traffic log and the announcement: its role on a
        P/D pair, else ``endpoint N``."""
        role = self.configs[endpoint].role
        return role.value if role is not None else f"endpoint {endpoint}"

    @contextlib.contextmanager
    def at(self, endpoint: int) -> Iterator[None]:
        """Answer on ``endpoint`` (``index``) inside the block, the previous one after."""
        before, self.index = self.index, endpoint
        try:
            yield
        finally:
            self.index = before

    def place(self, data: dict[str, Any]) -> int:
        """The data-parallel rank a ``/generate`` runs on: the one its body names
        (``routed_dp_rank``, or ``data_parallel_rank``, its deprecated alias: SGLang
        0.5.23 ``managers/io_struct.py`` ``GenerateReqInput``), else the next in turn
        (``DataParallelController.round_robin_scheduler``, the default
        ``--load-balance-method``). A rank the endpoint does not have is the engine's 400
        ("DP rank N is not active.", ``maybe_external_dp_rank_routing``). 0 on an
        endpoint of one rank, whatever the body names."""
        n = self.config.ranks
        if n == 1:
            return 0
        rank = data.get("routed_dp_rank")
        if rank is None:
            rank = data.get("data_parallel_rank")
        if rank is None:
            rank, self.next_rank = self.next_rank % n, self.next_rank + 1
            return rank
        if not _token_id(rank) or rank >= n:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"DP rank {rank} is not active.")
        return rank

    def rank_versions(self) -> list[int] | None:
        """The weight version of each rank of the endpoint the request addresses, as the
        model holds it after the last step (``None`` on a single scheduler, or once the
        model stopped): the per-rank evidence logged beside a fanned-out call."""
        state = self._state()
        if state is None or self.config.ranks == 1:
            return None
        return [r.weights for r in state.endpoint(self.index).ranks]

    # ----- one request ----------------------------------------------------------------

    def handle(
        self, method: str, target: str, body: bytes, endpoint: int = 0
    ) -> tuple[int, str, bytes]:
        """Answer one request; never raises for what the request holds. ``endpoint``: the
        model endpoint of the listener it came in on (the decode server of ``--pd`` is 1;
        the traffic entry names it as ``role``)."""
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query)
        with self.lock, self.at(endpoint):
            if self.closed:
                return self._refused(HTTPStatus.SERVICE_UNAVAILABLE, CLOSED, path)
            entry: dict[str, Any] = {"method": method, "path": target}
            if len(self.configs) > 1:
                entry["role"] = self.role(endpoint)
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
        return self._encode(status, payload)

    @staticmethod
    def _encode(status: int, payload: Any) -> tuple[int, str, Any]:
        if isinstance(payload, Streamed):
            return int(status), "text/event-stream", payload
        if isinstance(payload, bytes):
            return int(status), "text/plain; charset=utf-8", payload
        return int(status), "application/json", json.dumps(payload).encode()

    def _refused(self, status: int, message: str, path: str) -> tuple[int, str, bytes]:
        return self._encode(status, self._error(status, message, path))

    def refuse(self, status: int, message: str, target: str) -> tuple[int, str, bytes]:
        """Answer a request the wire could not read (its body) with the engine's error
        ``status``, and log it; nothing reaches the engine or the model."""
        path = urlsplit(target).path
        with self.lock:
            if not self.closed:
                self.traffic.append({"path": target, "status": int(status), "refused": message})
            return self._refused(status, message, path)

    def close(self) -> Result:
        """Take the verdict once the requests already inside have been answered: later
        requests are refused with the engine's 503. The result, trace written."""
        with self.lock:
            self.closed = True
            for rid in list(self.streams):
                self._end_stream(rid)
            self.probe_stale()
            self.end_calls()
            return self.result(write=True)

    def end_calls(self) -> None:
        """The session ends: the client obligations still owed on a serving endpoint are
        settled (``CallSequence.end``), as replay settles them."""
        if not self.judging or self.lockstep.calls is None:
            return
        try:
            self.lockstep.calls.end()
        except ConformanceFailure as e:  # a focused run only; serve has no focus
            self.violations, self.stopped = list(e.violations), True
        if not self.stopped:
            self.violations = list(self.lockstep.pending)

    def _error(self, status: int, message: str, path: str) -> Any:
        return error_body(self.api, status, message, path in self.routes)

    def _route(self, method, path, query, body, entry) -> tuple[int, Any]:
        route = self.routes.get(path)
        if route is None:
            raise HttpError(HTTPStatus.NOT_FOUND, "Not Found")
        if method not in route.methods:
            raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} not allowed on {path}")
        return route.handler(self, parse_json(body, path), query, entry)

    def _kvfence(self, method: str, path: str) -> tuple[int, Any]:
        if path == "/kvfence/verdict" and method == "GET":
            result = self.result(write=True)
            return 200, self.verdict_json(result)
        raise HttpError(HTTPStatus.NOT_FOUND, "Not Found")

    # ----- the model in lockstep ------------------------------------------------------

    @property
    def judging(self) -> bool:
        """Whether requests are still judged (no FAIL or ERROR yet)."""
        return not self.stopped and self.error is None

    def _state(self):
        return next(iter(self.lockstep.states)) if self.lockstep.states else None

    def step(self, action: Action, entry: dict[str, Any]) -> Observation:
        """Apply ``action`` to the engine and the model in lockstep; the engine's
        observation. A FAIL or ERROR fixes the verdict; afterwards actions go to the engine
        alone. A request the model does not enable here is the engine's 400."""
        if self.index and getattr(action, "endpoint", None) == 0:
            action = evolve(action, endpoint=self.index)  # type: ignore[misc]
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
            phase = state.endpoint(self.index).phase if state else None
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
            self.violations, self.stopped = list(e.violations), True
            entry["violated"] = [v.rule for v in e.violations]
        except AdapterError as e:
            self.error = e
            raise HttpError(HTTPStatus.INTERNAL_SERVER_ERROR, f"engine error: {e}") from None
        if not self.stopped:
            new = [v for v in self.lockstep.pending if v not in self.violations]
            if new:
                entry["violated"] = [v.rule for v in new]
            self.violations = list(self.lockstep.pending)
        obs = self.lockstep.steps[-1].observed
        assert obs is not None
        entry["step"] = self.lockstep.steps[-1].step
        versions = self.rank_versions()
        if versions is not None and not isinstance(action, (ServeRequest, StartRequest)):
            entry["rank_weights"] = versions  # each rank's version after the fan-out
        if isinstance(action, (ContinueGeneration, WakeUp)) and obs.status is Status.OK:
            self.probe_stale()  # serving resumed: the sync is over
        return obs

    def update(self, funnel: Funnel, flush: Any, source: str, entry) -> Observation:
        """A one-shot weight update of the next version through ``funnel``."""
        if flush is not None and not isinstance(flush, bool):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"flush_cache {flush!r} is not a bool")
        version = self.weights.next_version()
        entry["weights"] = {"version": version, "source": source}
        if self.rank_failures_left > 0 and self.judging:
            # --fail-rank-updates: drawn just before the update it fails, recorded in the
            # trace and as ``drawn`` in the traffic entry (as --refuse-resets draws)
            self.rank_failures_left -= 1
            drawn: dict[str, Any] = {}
            entry["drawn"] = drawn
            self.step(FaultRankUpdateFails(0, self.config.ranks - 1), drawn)
        obs = self.step(UpdateWeights(0, version, funnel, flush), entry)
        self.weights.pushed(version)
        self.weights.settle(version, source, obs)
        return obs

    def serve(
        self, prompt: Any, salt: str | None, entry, lora: bool = False, rank: int = 0
    ) -> tuple[Observation | None, Any]:
        """Serve ``prompt``. With a ``salt`` (a cache key), on an engine that keys requests
        by namespace: ServeRequest in the namespace the key names (``namespaces``: the
        weight version in force when the key was first used), judged by the spec's
        namespace semantics (a key that follows the weights is a valid way to invalidate;
        reusing one after an update pins the request to older weights, PF-24). On an engine
        that cannot (``keys_namespaces``): a never-seen key is the cold oracle (see the
        package doc, ``(None, cold bytes)``) and a reused one waits for the namespace
        action (501). ``lora``: through the endpoint's adapter (``lora_request``); ``rank``:
        the data-parallel rank it runs on (``place``)."""
        key = json.dumps(prompt)
        if key not in self.prompts:
            self.prompts[key] = prefix_name(len(self.prompts))
        prefix = self.prompts[key]
        weights = self.weights.installed
        if self.config.ranks > 1:
            entry["rank"] = rank
        if salt is not None and self.keys_namespaces:
            namespace = self.namespaces.setdefault(salt, weights)
            entry["namespace"] = {"key": salt, "version": namespace}
            if not self.probing:
                self.probe_stale()
            return self.step(ServeRequest(0, prefix, lora, namespace, rank), entry), None
        if salt is not None and lora:
            raise PendingRoute("a salted LoRA request on this engine", "ServeRequest(namespace)")
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
        if not self.probing:
            self.probe_stale()
        obs = self.step(ServeRequest(0, prefix, lora, rank=rank), entry)
        if lora:  # the probe re-sends base-model prompts only
            return obs, None
        self.served_at.pop(prefix, None)  # most recent last
        self.served_at[prefix] = self.weights.installed
        self.served_on[prefix] = (self.index, rank)
        if obs.response is not None and obs.response.cold is not None:
            self.cold[(prefix, self.weights.installed)] = obs.response.cold
        return obs, None

    def start_stream(
        self,
        prompt: Any,
        salt: str | None,
        lora: bool,
        entry,
        name: str | None = None,
        rank: int = 0,
    ) -> str:
        """Admit a streamed generation of ``prompt``: StartRequest, so it holds its KV in
        flight (a reset meanwhile is refused, as both engines refuse it while requests
        run) until ``end_stream`` (FinishRequest) or an abort (a ``mode=abort`` pause,
        ``abort_streams``, ``abort_stream``). Its request id; ``name``: the client's own
        name for it (SGLang's ``rid``); ``rank``: the data-parallel rank it runs on, where
        its KV stays. On an engine that cannot key by namespace a cache key is 501."""
        key = json.dumps(prompt)
        if key not in self.prompts:
            self.prompts[key] = prefix_name(len(self.prompts))
        prefix = self.prompts[key]
        namespace = None
        if salt is not None:
            if not self.keys_namespaces:
                raise PendingRoute("a salted stream on this engine", "ServeRequest(namespace)")
            namespace = self.namespaces.setdefault(salt, self.weights.installed)
            entry["namespace"] = {"key": salt, "version": namespace}
        if not self.probing:
            self.probe_stale()
        rid = f"stream-{next(self.rids)}"
        if self.config.ranks > 1:
            entry["rank"] = rank
        obs = self.step(StartRequest(0, rid, prefix, lora, namespace, rank), entry)
        if obs.status is not Status.OK:
            raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "request refused")
        entry["stream"] = rid
        self.streams[rid] = prefix
        self.stream_endpoint[rid] = self.index
        if name is not None:
            self.stream_names[name] = rid
        return rid

    def abort_stream(self, rid: str) -> None:
        """The client of the streamed generation ``rid`` went away before it ended: the
        engine aborts it now (vLLM's and SGLang's servers abort a request whose connection
        closed: SGLang 0.5.23 ``tokenizer_manager.py``, the ``is_disconnected`` check),
        as ``abort_streams`` does."""
        with self.lock:
            if not self.closed:
                self._end_stream(rid, aborted=True)

    def abort_streams(self, name: str | None) -> list[str]:
        """SGLang ``/abort_request``: end now the streamed generation the client named
        ``name`` (its ``rid``), or every one in flight (``None``: ``abort_all``). An abort
        releases the request's KV as its end does (the scheduler caches what it computed),
        so each is a FinishRequest, logged as ``{"stream_end": rid, "aborted": true}``; its
        stream's last event says ``abort``. The request ids ended (a name not in flight:
        none; serve answers other requests whole)."""
        if name is None:
            rids = list(self.streams)
        else:
            rid = self.stream_names.get(name)
            rids = [rid] if rid is not None and rid in self.streams else []
        for rid in rids:
            self._end_stream(rid, aborted=True)
        return rids

    def end_stream(self, rid: str) -> Observation | None:
        """The streamed generation ``rid`` ends (logged as ``{"stream_end": rid}``):
        FinishRequest while it is still in flight; ``None`` when it was aborted (a pause
        that aborts, or the engine) or the session is closed."""
        with self.lock:
            if self.closed:
                return None
            return self._end_stream(rid)

    def _end_stream(self, rid: str, aborted: bool = False) -> Observation | None:
        if self.streams.pop(rid, None) is None:
            return None
        for name in [n for n, r in self.stream_names.items() if r == rid]:
            del self.stream_names[name]
        entry: dict[str, Any] = {"stream_end": rid}
        if aborted:
            entry["aborted"] = True
        self.traffic.append(entry)
        endpoint = self.stream_endpoint.pop(rid, 0)
        if len(self.configs) > 1:
            entry["role"] = self.role(endpoint)
        state = self._state()
        if self.judging and (
            state is None or rid not in {r.rid for r in state.endpoint(endpoint).requests}
        ):
            entry["aborted"] = True
            return None
        try:
            with self.at(endpoint):
                obs = self.step(FinishRequest(0, rid), entry)
        except HttpError as e:
            entry["status"] = int(e.status)
            return None
        entry["status"] = 200
        return obs

    def probe_stale(self) -> None:
        """``--probe N``: re-send, once per weight version, up to N prompts last served
        under older weights (the most recent first), each a ServeRequest stepped and judged
        like any other and logged in the traffic as ``{"probe": prefix}``. It runs only where
        the trainer itself resumes serving (before its first request after a sync, after a
        ContinueGeneration or a WakeUp that resumes serving, at the end of the session), so
        it never falls between the calls of a sync; its answers go to no one. A trainer's
        own later request for a probed prompt may find it cached at the new weights (a
        fresh hit: the same tokens). Each prompt is re-sent to the endpoint and the rank
        it was last served on (``served_on``)."""
        if not self.probe or not self.judging or self.probing:
            return
        state = self._state()
        if state is None:
            return
        older = []
        for p, v in reversed(self.served_at.items()):
            endpoint, rank = self.served_on.get(p, (0, 0))
            serving = state.endpoint(endpoint).phase is Phase.SERVING
            if serving and v < self.all_weights[endpoint].installed:
                older.append((p, endpoint, rank))
        self.probing = True
        try:
            for prefix, endpoint, rank in older[: self.probe]:
                installed = self.all_weights[endpoint].installed
                entry: dict[str, Any] = {"probe": prefix, "version": installed}
                if rank:
                    entry["rank"] = rank
                self.traffic.append(entry)
                try:
                    with self.at(endpoint):
                        self.step(ServeRequest(0, prefix, rank=rank), entry)
                except HttpError as e:  # refused by the model or the engine: logged
                    entry["status"] = int(e.status)
                    return
                entry["status"] = 200
                self.served_at.pop(prefix)
                self.served_at[prefix] = installed
                if not self.judging:
                    return
        finally:
            self.probing = False

    def reset(self, entry: dict[str, Any]) -> Observation:
        """The trainer's prefix-cache reset (SGLang ``/flush_cache``, vLLM
        ``/reset_prefix_cache``): FlushCache. While ``--refuse-resets`` has refusals left,
        it is drawn refused: FaultRefuseFlush is stepped just before it (so no flush inside
        an update consumes it), recorded in the trace and in the traffic entry as
        ``drawn``, and the engine answers the reset as refused (vLLM ``{"success":
        false}``, SGLang's 400)."""
        if self.refusals_left > 0 and self.judging:
            self.refusals_left -= 1
            drawn: dict[str, Any] = {}
            entry["drawn"] = drawn
            self.step(FaultRefuseFlush(0), drawn)
        return self.step(FlushCache(0), entry)

    def publish(self, label: Any, abort: Any, entry) -> Observation:
        """``/update_weight_version``: PublishVersion of the version ``label`` names (see the
        package doc); ``abort``: SGLang's ``abort_all_requests``."""
        if not isinstance(label, str) or not label:
            raise HttpError(HTTPStatus.BAD_REQUEST, "missing field: new_version (a string)")
        if not isinstance(abort, bool):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"abort_all_requests {abort!r} is not a bool")
        version = self.weights.named(label)
        entry["label"] = {"new_version": label, "version": version}
        obs = self.step(PublishVersion(0, version, abort), entry)
        if obs.status is Status.OK:
            self.weights.name(version, label)
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
        version = self.weights.next_version()
        entry["weights"] = {"version": version, "source": source, "phase": "begin"}
        obs = self.step(BeginWeightUpdate(0, version), entry)
        if obs.status is Status.OK:
            self.weights.pushed(version)
            self.weights.window = (version, source)
        return obs

    def finish(self, label: Any, entry) -> Observation:
        """The open two-phase update finishes (vLLM has no ``flush_cache`` here: omitted);
        ``label``: vLLM's ``weight_version``, published with it."""
        if label is not None and not isinstance(label, str):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"weight_version {label!r} is not a string")
        obs = self.step(FinishWeightUpdate(0), entry)
        if self.weights.window is not None:
            version, source = self.weights.window
            if self.weights.settle(version, label or source, obs) and label:
                self.weights.name(version, label)
            self.weights.window = None
        return obs

    def lora_request(self, name: Any, missing: HTTPStatus) -> bool:
        """Whether a request naming adapter ``name`` (vLLM's ``model``, SGLang's
        ``lora_path``; ``None``: the base model) is served through the endpoint's adapter;
        an adapter not loaded now is the engine's ``missing`` error (vLLM 404, SGLang 400)."""
        if name is None:
            return False
        if not isinstance(name, str) or name != self.adapter or not self.adapter_loaded:
            raise HttpError(missing, f"LoRA adapter {name!r} is not loaded")
        return True

    def load_adapter(self, name: Any, entry) -> Observation | None:
        """Load LoRA adapter ``name``, the engine having accepted the request's form (the
        API checks a name already loaded). The first load is the endpoint's adapter at
        revision 0 (a logged no-op: nothing is cached under it yet; the model's endpoint
        has it from the start, and no request could name it before); loading the same name
        again, in place (vLLM ``load_inplace``) or after an unload, is LoadLora: new bytes
        under the same name, whose KV must not be reused (ENG-007). A second distinct name
        is 501 (the model has one adapter per endpoint). ``None`` for the no-op, else the
        engine's observation."""
        if not isinstance(name, str) or not name:
            raise HttpError(HTTPStatus.BAD_REQUEST, "lora_name must be a non-empty string")
        if self.adapter is not None and name != self.adapter:
            raise PendingRoute(
                f"a second LoRA adapter ({name!r} beside {self.adapter!r})",
                "LoadLora(second adapter)",
            )
        entry["adapter"] = name
        if self.adapter is None:
            self.adapter, self.adapter_loaded = name, True
            entry["noop"] = "the endpoint's adapter at revision 0: nothing cached under it"
            return None
        obs = self.step(LoadLora(0), entry)
        self.adapter_loaded = self.adapter_loaded or obs.status is Status.OK
        return obs

    def prefill_half(self, prompt: Any, data: dict[str, Any], entry) -> tuple[int, Any]:
        """``/generate`` on the prefill server of a P/D pair (``--pd``). SGLang's router
        sends each request to a prefill server and a decode server at once, both bodies
        naming the pair's ``bootstrap_host`` and ``bootstrap_room`` (``io_struct.py``
        ``GenerateReqInput``); the prefill server computes the prompt's KV and transfers it
        to the decode server, which answers the request. The model's request of a P/D
        deployment is that pair, sent to the decode endpoint (ServeRequest on it: the
        prefill endpoint computes, the decode endpoint decodes), so here the prefill half
        is a logged no-op, answered with no output tokens; a body without a
        ``bootstrap_room`` is the engine's 400 (SGLang asks to "send to the router
        instead": ``managers/data_parallel_controller.py``). A router in front of serve
        is the seam: it sends the decode half to the decode port."""
        room = data.get("bootstrap_room")
        if room is None:
            raise HttpError(
                HTTPStatus.BAD_REQUEST,
                "a prefill server takes a request only with its decode half (bootstrap_host, "
                "bootstrap_room): send it to the router, or to serve's decode server",
            )
        if not _token_id(room):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"bootstrap_room {room!r} is not an int")
        key = json.dumps(prompt)
        if key not in self.prompts:
            self.prompts[key] = prefix_name(len(self.prompts))
        entry["noop"] = (
            f"the prefill half of bootstrap room {room} (prompt {self.prompts[key]}): its KV "
            "is computed in the decode half's ServeRequest"
        )
        meta = {
            "id": data.get("rid") or f"prefill-{room}",
            "finish_reason": {"type": "length", "length": 0},
            "prompt_tokens": len(prompt) if isinstance(prompt, list) else len(prompt.split()),
            "completion_tokens": 0,
            "cached_tokens": 0,
            "weight_version": self.weights.label(),
        }
        return 200, {"text": "", "output_ids": [], "meta_info": meta}

    def health(self) -> tuple[int, Any]:
        """``/health`` on both APIs: an empty 200, a 503 once the engine failed."""
        if self.error is not None:
            raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, f"engine error: {self.error}")
        return 200, b""

    def prompt(self, data, text_field: str, ids_field: str) -> Any:
        """The request's prompt: ``text_field`` (a non-empty string) or ``ids_field`` (a
        non-empty list of int token ids); else the engine's 400."""
        text, ids = data.get(text_field), data.get(ids_field)
        if isinstance(text, str) and text:
            return text
        if isinstance(ids, list) and ids and all(_token_id(t) for t in ids):
            return ids
        raise HttpError(
            HTTPStatus.BAD_REQUEST,
            f"need {text_field} (a non-empty string) or {ids_field} (a list of token ids)",
        )

    def max_tokens(self, value: Any, default: int) -> int:
        """A request's output length, at most ``MAX_OUTPUT_TOKENS`` (a positive int)."""
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"max tokens {value!r} is not a positive int")
        return min(value, MAX_OUTPUT_TOKENS)

    def complete(
        self,
        prompt: Any,
        n: int,
        data: dict[str, Any],
        salt_field: str,
        entry,
        lora: bool = False,
    ) -> tuple[list[int], list[float], bool, int]:
        """Serve ``prompt`` for SGLang ``/generate`` and vLLM ``/v1/completions`` alike:
        ``(token ids, logprobs, prefix hit, prompt tokens)`` of ``n`` output tokens;
        ``salt_field`` is the API's cache-key field (``extra_key``, ``cache_salt``);
        ``lora``: through the endpoint's adapter. A refused request is the engine's 400."""
        salt = data.get(salt_field)
        if salt is not None and not isinstance(salt, str):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"{salt_field} must be a string")
        obs, cold = self.serve(prompt, salt or None, entry, lora, self.place(data))
        if obs is not None and obs.status is not Status.OK:
            raise HttpError(HTTPStatus.BAD_REQUEST, obs.detail or "request refused")
        output = cold if obs is None else (obs.response.output if obs.response else None)
        hit = obs is not None and obs.response is not None and obs.response.hit
        ids, logprobs = tokens_of(by_checkpoint(output, self.weights.sources), n)
        n_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        return ids, logprobs, hit, n_prompt

    # ----- the verdict (judge.py) -----------------------------------------------------

    def rule_verdicts(self) -> tuple[tuple[RuleVerdict, ...], Any, str]:
        """``judge.rule_verdicts`` of this session."""
        return judge.rule_verdicts(self)

    def result(self, write: bool = False) -> Result:
        """``judge.result`` of this session (with ``write``: trace and counterexample)."""
        return judge.result(self, write)

    def verdict_json(self, result: Result) -> dict[str, Any]:
        """``GET /kvfence/verdict``'s body: ``judge.verdict_json``."""
        return judge.verdict_json(self, result)
