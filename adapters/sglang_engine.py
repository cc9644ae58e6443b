"""Upstream SGLang's scheduler control plane on CPU as a kvfence system under test.

``SglangAdapter(version="0.5.23")`` runs two endpoints, each an SGLang scheduler hosted in
its own process by :mod:`adapters.sglang_host` (upstream's own ``Scheduler`` methods,
``SchedulerWeightUpdaterManager``, flush wrapper, request dispatcher and radix tree; only
the model runner, memory pools and metrics stubbed, :mod:`adapters.sglang_stubs`):

* endpoint 0: an **exact lane** (``rl_on_policy_target="fsdp"``, ``attention_backend=
  "triton"``), radix cache on;
* endpoint 1: a **standard lane**, radix cache on.

How each action maps onto SGLang (every control request is a real ``io_struct`` object
sent through the scheduler's real ``_request_dispatcher``; files are SGLang's
``python/sglang/srt/...``, as of 0.5.23):

==============================  =============================================================
``ServeRequest(i, P)``          the event loop's prefill, done by the host: ``match_prefix``
                                on the real tree, KV for the rest "computed" by the stub
                                runner under its weights, ``insert`` into the tree. ``hit``:
                                the tree matched the whole prompt; ``uses``: the versions
                                of the KV slots the tree returned.
``StartRequest`` /              the same prefill, then the request sits in the real
``FinishRequest``               ``running_batch`` (``schedule_batch.ScheduleBatch``) until
                                it finishes.
``UpdateWeights(i, v, f, fc)``  ``UpdateWeightFromDiskReqInput`` (disk, two_phase),
                                ``UpdateWeightsFromTensorReqInput`` (tensor, sparse_delta;
                                bucketed = two calls) and ``UpdateWeightsFromDistributed
                                ReqInput``, each inside ``Begin/EndWeightUpdateReqInput``
                                where that session exists (0.5.20+), and
                                ``UpdateWeightsFromIPCReqInput``; ``flush_cache`` as asked,
                                left out when ``None`` (SGLang's default is true);
                                ``weight_version="v{v}"``. Handled by
                                ``managers/scheduler_components/weight_updater.py``.
``FlushCache(i)``               ``FlushCacheReqInput`` -> ``SchedulerFlushWrapper.handle``
                                -> ``Scheduler.flush_cache`` (refused unless
                                ``is_fully_idle``); ``flushed``: its ``success``.
``PauseGeneration(i, m)``       ``PauseGenerationReqInput(mode=in_place|retract)`` ->
                                ``Scheduler.pause_generation``; ``abort`` is the tokenizer
                                manager's (every request aborted, the scheduler not paused).
``ContinueGeneration(i)``       ``ContinueGenerationReqInput``; then retracted requests are
                                scheduled again (their prefix recomputed against the tree).
``Sleep(i, tags)`` /            ``Release/ResumeMemoryOccupationReqInput(tags=[...])``, the
``WakeUp(i, tags)``             tags as given (``kv_cache``, ``weights``); SGLang's own
                                ``release/resume_memory_occupation``.
``FaultRefuseFlush(i)``         the next flush attempt (``Scheduler.flush_cache``, as the
                                manager and the flush wrapper call it) answers ``False``
                                and changes nothing, as when ``is_fully_idle`` is false.
``FaultUpdateFailsMidway``      an update through ``fault_funnel`` whose load fails after
``(i, v)``                      some tensors landed; the stub runner answers as upstream's
                                model runner does for that funnel, the rest is upstream's.
``Restart(i)``                  a new scheduler and ServerArgs from the last loaded version.
``BeginWeightUpdate(i, v, f)``  with ``window=True``, through the window the code has
                                (:meth:`sglang_host.Endpoint.window_mechanism`): with
                                ``f=two_phase``, a fork's ``PrepareWeightsUpdateReqInput``
                                (its prepare arms the receivers); otherwise upstream's
                                ``BeginWeightUpdateReqInput`` session (0.5.20+).
``UpdateWeightChunk(i)``        two-phase: the trainer writes a chunk into the receivers the
                                fork's prepare armed (live parameters or staging buffers,
                                as the fork's code chose); session: a non-final
                                ``UpdateWeightsFromTensorReqInput`` (``flush_cache=False``,
                                no ``weight_version``).
``FinishWeightUpdate(i, fc)``   the last chunk, then the fork's
                                ``CompleteWeightsUpdateReqInput`` or the final tensor call
                                (``weight_version``, ``flush_cache``) and
                                ``EndWeightUpdateReqInput``.
``AbortWeightUpdate(i)``        neither SGLang nor the seed fork has one: the window is
                                closed with the old version's weights (``flush_cache=
                                False``).
``FaultChunkFails(i)``          the next chunk fails after some tensors landed.
==============================  =============================================================

Capabilities: ``weights_probe`` (the stub runner's version; the label where SGLang records
it: ``Scheduler.record_weight_version_change``), ``cache_probe`` and ``exact_cache`` (every
served prefix matched against the real tree, which never evicts here), ``provenance``
(the weight version stored in each KV slot the tree returned), ``flush_result``,
``inflight``, ``pause``, ``sleep``, ``memory_tags``, ``faults``, ``restart``,
``exact_lane``; ``two_phase`` with ``window=True`` (a host whose code has no window is
then an ``AdapterFailure`` naming it: N/A, never aliased onto a one-shot update). Not
``byte_oracle`` (no model runs), not ``attribution`` (response versions would come from
the stub), and no tiers, draft, encoder, FP8 or LoRA. A refused flush
comes from real running requests as well as from the injected fault.

Versions side by side: ``version`` names a folder ``$KVFENCE_SGLANG_HOME/VERSION`` (default
``.sglang/VERSION`` in the current directory) filled by ``scripts/install-sglang.sh
VERSION``; if it is missing and the environment's own ``sglang`` has that version, that
one runs. ``overlay``: a folder of a fork's SGLang files served in place of upstream's
modules (see :func:`adapters.sglang_host.install_overlay`). ``optimize``: each host runs
under ``python -O`` (``PYTHONOPTIMIZE=1``): every bare ``assert`` in SGLang or the overlay
is gone, as on a server started with ``python -O -m sglang.launch_server``; a fork whose
fail-closed is an ``assert`` is checked as it would run there. The host reports
``sys.flags.optimize`` and a mismatch is an ``AdapterFailure``. ``refusal_at_release``
(default on): an injected flush refusal is spent on the flush ``release_memory_
occupation`` runs for the ``kv_cache`` tag (the spec's Sleep allows it spent or not);
off, it is held across the release for the next flush.

Errors: anything that means the harness does not fit the SGLang version (import error,
missing attribute, changed signature) is an ``AdapterFailure`` naming the version and the
attribute: an ERROR (ADP-001), never a verdict. An exception SGLang's own handler raises
stops that endpoint's process, as ``run_scheduler_process`` would: ``Status.STOPPED``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..model.actions import (
    AbortWeightUpdate,
    Action,
    BeginWeightUpdate,
    ContinueGeneration,
    FaultChunkFails,
    FaultRankUpdateFails,
    FaultRefuseFlush,
    FaultUpdateFailsMidway,
    FinishRequest,
    FinishWeightUpdate,
    FlushCache,
    PauseGeneration,
    Restart,
    ServeRequest,
    Sleep,
    StartRequest,
    UpdateWeightChunk,
    UpdateWeights,
    WakeUp,
)
from ..model.capabilities import Capability as C
from ..model.observation import Observation, Response, View
from ..model.state import Config, Entry, Use, server_info
from ..model.vocabulary import Funnel, Lane, Status
from .protocol import AdapterFailure, Unsupported

DEFAULT_VERSION = "0.5.23"
"""The SGLang release ``--engine sglang`` checks."""

SERVER_INFO_KEYS = ("disable_radix_cache", "radix_cache_enabled", "rl_on_policy_target")
"""The ``/get_server_info`` fields a cache-invalidation client reads (radix state, lane);
the adapter answers with these fields of the real ``build_server_info`` body."""

LANES = ("exact", "standard")

FAULT_FUNNELS = ("distributed", "tensor", "disk", "ipc")
"""Funnels ``FaultUpdateFailsMidway`` can go through: the load fails after some tensors
landed, and the stub runner answers as upstream's model runner does for that funnel
(``sglang_stubs.FUNNEL_FAILURES``). The default, ``distributed``, is the trainer's
NCCL broadcast path, where upstream says the weights are "partially updated"."""


def sglang_home() -> Path:
    """Where ``scripts/install-sglang.sh`` puts versions: ``$KVFENCE_SGLANG_HOME`` or
    ``.sglang`` in the current directory."""
    return Path(os.environ.get("KVFENCE_SGLANG_HOME", ".sglang"))


@contextlib.contextmanager
def _optimized(on: bool) -> Iterator[None]:
    """``PYTHONOPTIMIZE=1`` in the environment a spawned host inherits, while ``on``
    (multiprocessing's spawn passes the parent's own flags only, so ``-O`` for the host
    alone goes through the environment); restored afterwards."""
    if not on:
        yield
        return
    before = os.environ.get("PYTHONOPTIMIZE")
    os.environ["PYTHONOPTIMIZE"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONOPTIMIZE"]
        else:
            os.environ["PYTHONOPTIMIZE"] = before


class _ForkedHost:
    """A host forked by a zygote (not this process's child): the part of
    ``multiprocessing.Process`` that :meth:`SglangAdapter.close` uses, by process ID."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def is_alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)


class _Zygote:
    """One :func:`adapters.sglang_host.zygote` process: SGLang imported once, hosts forked
    from it. Shared by every adapter of this process with the same SGLang folder, ``-O``
    flag and environment (:func:`_zygote_for`)."""

    def __init__(self, sglang_path: str, optimize: bool) -> None:
        from . import sglang_host

        self._workdir = tempfile.mkdtemp(prefix="kvfence-sglang-zygote-")
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._lock = threading.Lock()  # one request and its answer at a time
        spec = {"sglang_path": sglang_path, "log": os.path.join(self._workdir, "zygote.log")}
        self._proc = ctx.Process(target=sglang_host.zygote, args=(child, spec), daemon=True)
        with _optimized(optimize):
            self._proc.start()
        child.close()
        try:
            kind, payload = self._conn.recv()  # EOFError if it died importing
        except (OSError, EOFError):
            self.close()
            raise
        if kind != "ok":
            self.close()
            raise RuntimeError(payload)
        self.modules = frozenset(payload["modules"])
        """The ``sglang`` modules it imported: an overlay replacing one needs a fresh host."""

    def fork(self, spec: dict[str, Any], target: str = "main") -> tuple[_ForkedHost, Any]:
        """A child running ``sglang_host.main`` on ``spec`` (or the ``target`` of
        ``sglang_host.FORKED_CALLS``) in this process's working folder, and its
        connection. ``OSError``/``EOFError`` if the zygote is gone."""
        parent, child = multiprocessing.Pipe()
        with self._lock:
            try:
                self._conn.send((target, child, {**spec, "cwd": os.getcwd()}))
            finally:
                child.close()
            _, pid = self._conn.recv()
        return _ForkedHost(pid), parent

    def close(self) -> None:
        self._conn.close()
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.terminate()
        shutil.rmtree(self._workdir, ignore_errors=True)


_ZYGOTES: dict[tuple[Any, ...], _Zygote | None] = {}
"""Zygotes by SGLang folder, ``-O`` flag and environment; ``None`` where one could not
start (hosts are spawned there instead). At most :data:`ZYGOTES_KEPT` live ones."""

_ZYGOTES_LOCK = threading.Lock()
"""Held while :data:`_ZYGOTES` is read or changed."""

ZYGOTES_KEPT = 2
"""Live zygotes kept per process (each holds SGLang, torch and transformers imported:
about 0.6 GiB); starting another closes the least recently used."""


def _forget(zygote: _Zygote) -> None:
    """Spawn hosts where ``zygote`` forked them (it is gone)."""
    with _ZYGOTES_LOCK:
        for key, z in _ZYGOTES.items():
            if z is zygote:
                _ZYGOTES[key] = None


def _zygote_for(sglang_path: str, optimize: bool) -> _Zygote | None:
    """The zygote that forks hosts for this SGLang folder and ``-O`` flag in this
    environment (a host must see what a spawned one would; pytest's per-test
    ``PYTEST_CURRENT_TEST`` aside), started on first use; ``None`` if it cannot start."""
    with _ZYGOTES_LOCK:  # adapters may start from several threads (timed calls)
        return _zygote_for_locked(sglang_path, optimize)


def _zygote_for_locked(sglang_path: str, optimize: bool) -> _Zygote | None:
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"))
    key = (sglang_path, optimize, env)
    if key in _ZYGOTES:
        _ZYGOTES[key] = _ZYGOTES.pop(key)  # most recently used last
        return _ZYGOTES[key]
    live = [k for k, z in _ZYGOTES.items() if z is not None]
    for old in live[: max(0, len(live) - ZYGOTES_KEPT + 1)]:
        zygote = _ZYGOTES.pop(old)
        if zygote is not None:
            zygote.close()
    try:
        _ZYGOTES[key] = _Zygote(sglang_path, optimize)
    except (OSError, EOFError, RuntimeError):
        _ZYGOTES[key] = None
    return _ZYGOTES[key]


def _start(
    zygote: _Zygote | None, target: str, spec: dict[str, Any], optimize: bool
) -> tuple[Any, Any]:
    """``(process, connection)`` of a child running ``sglang_host.main`` on ``spec``
    (``target`` ``"main"``) or ``sglang_host.FORKED_CALLS[target]``: forked from
    ``zygote``, or spawned (under ``python -O`` if ``optimize``) where there is none or it
    is gone (then forgotten)."""
    from . import sglang_host

    if zygote is not None:
        try:
            return zygote.fork(spec, target)
        except (OSError, EOFError):
            _forget(zygote)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    if target == "main":
        proc = ctx.Process(target=sglang_host.main, args=(child, spec), daemon=True)
    else:
        call = (child, sglang_host.FORKED_CALLS[target], spec)
        proc = ctx.Process(target=sglang_host.answer, args=call, daemon=True)
    with _optimized(optimize):
        proc.start()
    child.close()
    return proc, parent


def run_forked(
    sglang_path: str, function: str, spec: dict[str, Any], optimize: bool = False
) -> Any:
    """``sglang_host.FUNCTION(spec)`` (a whole run of one of ``sglang_host.FORKED_CALLS``:
    ``dp_flush``, ``dp_update``) in a process of its own with SGLang imported from
    ``sglang_path`` (under ``python -O`` if ``optimize``): a fork of the zygote, or a
    spawned process where none starts. Returns its result; ``AdapterFailure`` naming the
    function if it raises or its process dies."""
    from . import sglang_host

    if function not in sglang_host.FORKED_CALLS:
        raise ValueError(f"{function!r} is not one of {sorted(sglang_host.FORKED_CALLS)}")
    spec = {**spec, "sglang_path": sglang_path}
    proc, conn = _start(_zygote_for(sglang_path, optimize), function, spec, optimize)
    try:
        kind, payload = conn.recv()
    except (EOFError, OSError) as e:
        raise AdapterFailure(f"SGLang {function}: its process died ({type(e).__name__})") from None
    finally:
        conn.close()
        proc.join(5)
    if kind != "ok":
        raise AdapterFailure(payload)
    return payload


def _config(lane: str, ranks: int = 1) -> Config:
    info = {
        "disable_radix_cache": False,
        "rl_on_policy_target": "fsdp" if lane == "exact" else None,
    }
    return Config(
        radix=True,
        lane=Lane.EXACT if lane == "exact" else Lane.STANDARD,
        info=server_info(**info),
        flush_default=True,  # UpdateWeight*ReqInput.flush_cache defaults to true (io_struct)
        ranks=ranks,
    )


class SglangAdapter:
    """Two SGLang endpoints (exact lane, standard lane); see the module docstring.

    ``version``: the SGLang release. ``overlay``: a folder of fork files, or ``None``.
    ``lanes``: the endpoints' lanes, in order. ``optimize``: the hosts run under
    ``python -O``. Construction is cheap; the first ``start``
    launches the host processes, later starts rebuild each scheduler in place
    (milliseconds). A host is forked from a zygote that imported SGLang once per process
    (:func:`_zygote_for`; the first costs ~15 s of import, each host then ~1 s), or
    spawned (~15 s) where the overlay replaces a module the zygote holds or no zygote
    starts.
    """

    capabilities = frozenset(
        {
            C.WEIGHTS_PROBE.value,
            C.CACHE_PROBE.value,
            C.EXACT_CACHE.value,
            C.PROVENANCE.value,
            C.FLUSH_RESULT.value,
            C.INFLIGHT.value,
            C.PAUSE.value,
            C.SLEEP.value,
            C.RESTART.value,
            C.EXACT_LANE.value,
            C.FAULTS.value,
            C.MEMORY_TAGS.value,
        }
    )
    start_timeout: float = 600.0
    """Seconds the first ``start()`` may take: a zygote (or each spawned host) imports SGLang
    (and torch)."""
    budget: dict[str, int] = {"max_examples": 60, "stateful_step_count": 15}
    """The ``ci`` profile against this adapter: each action is a pipe round trip (~1 ms)."""

    def __init__(
        self,
        version: str = DEFAULT_VERSION,
        overlay: str | Path | None = None,
        lanes: tuple[str, ...] = LANES,
        optimize: bool = False,
        fault_funnel: str = "distributed",
        window: bool = False,
        refusal_at_release: bool = True,
        ranks: int = 1,
    ) -> None:
        bad = [lane for lane in lanes if lane not in LANES]
        if bad or not lanes:
            raise ValueError(f"lanes must be a non-empty tuple of {LANES}, got {lanes!r}")
        self.version = version
        self.overlay = None if overlay is None else Path(overlay)
        if self.overlay is not None and not self.overlay.is_dir():
            raise ValueError(f"overlay {str(overlay)!r} is not a folder")
        self.lanes = tuple(lanes)
        self.optimize = optimize
        if fault_funnel not in FAULT_FUNNELS:
            raise ValueError(f"fault_funnel must be one of {FAULT_FUNNELS}, got {fault_funnel!r}")
        self.fault_funnel = fault_funnel
        self.window = window
        if window:
            self.capabilities = type(self).capabilities | {C.TWO_PHASE.value}
        self.refusal_at_release = refusal_at_release
        if ranks < 1 or (ranks > 1 and window):
            raise ValueError("ranks must be >= 1 (and windows are not driven across ranks)")
        self.ranks = ranks
        if ranks > 1:
            self.capabilities = RANKED_CAPABILITIES
        self.name = (
            f"sglang@{version}"
            + ("+overlay" if overlay is not None else "")
            + (" (python -O)" if optimize else "")
        )
        self.fixed_configs: tuple[Config, ...] = tuple(_config(lane, ranks) for lane in self.lanes)
        self._hosts: list[tuple[Any, Any]] = []
        self._workdir: str | None = None
        self.loaded: dict[str, str] = {}
        """What the hosts reported at start: SGLang ``version`` and ``tree`` class."""

    # ----- lifecycle ----------------------------------------------------------------------

    @property
    def funnels(self) -> tuple[Funnel, ...] | None:
        """The update funnels the hosts' scheduler code has (``sglang_host.FUNNELS``), as
        the hosts reported them at start; ``None`` before. The checker draws updates only
        through these; any other is N/A here."""
        names = self.loaded.get("funnels")
        return None if names is None else tuple(Funnel(n) for n in names)

    @property
    def engine_version(self) -> str | None:
        """The SGLang release the hosts imported, as they reported it at start (``start``
        refuses any other than ``version``); ``None`` before."""
        return self.loaded.get("version")

    def sglang_path(self) -> str:
        """The folder holding this version's ``sglang`` package; ``AdapterFailure`` with
        the install command when there is none."""
        folder = sglang_home() / self.version
        if (folder / "sglang").is_dir():
            return str(folder.resolve())
        try:  # the environment's own SGLang, if it is this version
            from importlib.metadata import PackageNotFoundError, version

            own = version("sglang") == self.version
        except PackageNotFoundError:
            own = False
        spec = importlib.util.find_spec("sglang") if own else None
        if spec is not None and spec.origin:
            return str(Path(spec.origin).parent.parent)
        raise AdapterFailure(
            f"SGLang {self.version} is not installed: no {folder}/sglang; run "
            f"`bash scripts/install-sglang.sh {self.version}`"
        )

    def start(self, configs: tuple[Config, ...]) -> None:
        if tuple(configs) != self.fixed_configs:
            raise Unsupported(f"{self.name} is the fixed endpoints {self.fixed_configs!r}")
        if not self._hosts:
            self._launch()
        for i in range(len(self._hosts)):
            self._call(i, "reset", {})

    def _launch(self) -> None:
        path = self.sglang_path()
        self._workdir = tempfile.mkdtemp(prefix="kvfence-sglang-")
        from . import sglang_host

        zygote = _zygote_for(path, self.optimize)
        if zygote is not None and self.overlay is not None:
            try:
                replaced = {name for _, name in sglang_host.overlay_modules(str(self.overlay))}
            except sglang_host.Broken:
                replaced = {"sglang"}  # a spawned host reports what is wrong with it
            if replaced & zygote.modules:  # the overlay must load before those import
                zygote = None
        for i, lane in enumerate(self.lanes):
            workdir = os.path.join(self._workdir, f"endpoint{i}")
            os.makedirs(workdir)
            spec = {
                "sglang_path": path,
                "lane": lane,
                "workdir": workdir,
                "log": os.path.join(self._workdir, f"endpoint{i}.log"),
                "overlay": None if self.overlay is None else str(self.overlay.resolve()),
                "ranks": self.ranks,
            }
            self._hosts.append(_start(zygote, "main", spec, self.optimize))
        try:
            for i in range(len(self._hosts)):
                self.loaded = self._receive(i, "start")
        except AdapterFailure:
            self.close()  # a later start() launches afresh instead of using dead hosts
            raise
        if self.loaded.get("version") != self.version:
            found = self.loaded.get("version")
            self.close()
            raise AdapterFailure(f"asked for SGLang {self.version}, the host imported {found}")
        if self.window and self.loaded.get("window") is None:
            self.close()
            raise AdapterFailure(
                f"SGLang {self.version}: window=True, but this scheduler code has no "
                "two-phase window (no begin/end_weight_update session, no prepare/complete "
                "pair): the window actions are N/A here; check it without window"
            )
        if bool(self.loaded.get("optimize")) != self.optimize:
            flag = self.loaded.get("optimize")
            self.close()
            raise AdapterFailure(
                f"asked for hosts with optimize={self.optimize}, the host runs with "
                f"sys.flags.optimize={flag}"
            )

    def _log_tail(self, i: int) -> str:
        if self._workdir is None:
            return ""
        try:
            text = Path(self._workdir, f"endpoint{i}.log").read_text(errors="replace")
        except OSError:
            return ""
        lines = [x for x in text.splitlines() if x.strip()][-5:]
        return ("; log tail: " + " | ".join(lines)) if lines else ""

    def _receive(self, i: int, what: str) -> Any:
        conn = self._hosts[i][1]
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError) as e:
            raise AdapterFailure(
                f"SGLang {self.version} host {i} died during {what} ({type(e).__name__})"
                + self._log_tail(i)
            ) from None
        if kind == "broken":
            raise AdapterFailure(f"{payload} [endpoint {i}, during {what}]")
        return payload

    def _call(self, i: int, op: str, args: dict[str, Any]) -> Any:
        if not 0 <= i < len(self._hosts):
            raise AdapterFailure(f"{self.name} has endpoints 0..{len(self.lanes) - 1}, not {i}")
        try:
            self._hosts[i][1].send((op, args))
        except (OSError, ValueError) as e:
            raise AdapterFailure(f"SGLang host {i} is gone: {e}") from None
        return self._receive(i, op)

    def server_info(self, endpoint: int) -> Mapping[str, object] | None:
        body = self._call(endpoint, "server_info", {})
        return {k: body[k] for k in SERVER_INFO_KEYS if k in body}

    def close(self) -> None:
        hosts, self._hosts = self._hosts, []
        for proc, conn in hosts:
            try:
                conn.send(("close", {}))
                conn.poll(5) and conn.recv()
            except (OSError, EOFError, ValueError):
                pass
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            conn.close()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    # ----- actions --------------------------------------------------------------------------

    def apply(self, action: Action) -> Observation:
        i = getattr(action, "endpoint", None)
        if i is None:
            raise Unsupported(f"{action.name} is not an engine action")
        if not self._hosts:
            raise AdapterFailure(f"{self.name}: apply({action.name}) before start()")
        op, args = self._translate(action)
        out = self._call(i, op, args)
        return self._observation(out)

    def _translate(self, a: Action) -> tuple[str, dict[str, Any]]:
        if isinstance(a, (ServeRequest, StartRequest)) and a.lora:
            raise Unsupported(f"{self.name} serves no LoRA adapter")
        if isinstance(a, ServeRequest):
            return "serve", {"prefix": a.prefix, "rank": a.rank}
        if isinstance(a, StartRequest):
            return "start", {"rid": a.rid, "prefix": a.prefix, "rank": a.rank}
        if isinstance(a, FaultRankUpdateFails):
            return "fault_rank_update_fails", {"rank": a.rank}
        if isinstance(a, FinishRequest):
            return "finish", {"rid": a.rid}
        own = self.funnels
        if isinstance(a, UpdateWeights) and own is not None and a.funnel not in own:
            have = ", ".join(f.value for f in own)
            raise Unsupported(f"{self.name} has no {a.funnel.value} funnel (it has {have})")
        if isinstance(a, UpdateWeights):
            return "update", {
                "version": a.version,
                "funnel": a.funnel.value,
                "flush_cache": a.flush_cache,
            }
        if isinstance(a, FaultUpdateFailsMidway):
            return "update", {
                "version": a.version,
                "funnel": self.fault_funnel,
                "flush_cache": None,
                "fail_midway": True,
            }
        if isinstance(a, (Sleep, WakeUp)):
            tags = sorted(t.value for t in a.tags)
            if isinstance(a, WakeUp):
                return "wake_up", {"tags": tags}
            return "sleep", {"tags": tags, "spend_refusal": self.refusal_at_release}
        window = (BeginWeightUpdate, UpdateWeightChunk, FinishWeightUpdate, AbortWeightUpdate)
        if isinstance(a, (*window, FaultChunkFails)) and not self.window:
            raise Unsupported(f"{self.name} was not started with window=True")
        if isinstance(a, BeginWeightUpdate):
            if own is not None and a.funnel not in own:
                raise Unsupported(f"{self.name} has no {a.funnel.value} funnel")
            return "begin_window", {"version": a.version, "funnel": a.funnel.value}
        if isinstance(a, FinishWeightUpdate):
            return "finish_window", {"flush_cache": a.flush_cache}
        window_ops = {
            UpdateWeightChunk: "chunk",
            AbortWeightUpdate: "abort_window",
            FaultChunkFails: "fault_chunk_fails",
        }
        if type(a) in window_ops:
            return window_ops[type(a)], {}
        simple = {
            FlushCache: "flush",
            ContinueGeneration: "resume",
            Restart: "restart",
            FaultRefuseFlush: "fault_refuse_flush",
        }
        if type(a) in simple:
            return simple[type(a)], {}
        if isinstance(a, PauseGeneration):
            return "pause", {"mode": a.mode.value}
        raise Unsupported(f"{self.name} does not support {a.name}")

    def _observation(self, out: dict[str, Any]) -> Observation:
        if out["status"] == "stopped":
            return Observation(Status.STOPPED, detail=out["detail"])
        v = out["view"]
        view = View(
            weights=v["weights"],
            label=v["label"],
            cache=frozenset(Entry(prefix, version=version) for prefix, version in v["cache"]),
        )
        response = None
        if "hit" in out:
            uses = {Use("target", x) for x in out["uses"]} | {Use("target", v["weights"])}
            response = Response(hit=out["hit"], uses=frozenset(uses))
        aborted = frozenset(out["aborted"]) if "aborted" in out else None
        return Observation(
            Status.OK if out["status"] == "ok" else Status.REJECTED,
            response=response,
            flushed=out.get("flushed"),
            aborted=aborted,
            view=view,
            detail=str(out.get("detail", "")),
        )


RANKED_CAPABILITIES = (
    SglangAdapter.capabilities - {C.SLEEP.value, C.RESTART.value, C.MEMORY_TAGS.value}
) | {C.RANKS.value}
"""What an endpoint of data-parallel ranks (``ranks=2``) declares: the ranked vocabulary
(requests placed per rank, flushes, updates, pauses, the rank fault); sleep, restart and
windows are not driven across ranks."""
