"""vLLM's OpenAI-compatible server (vLLM 0.32) as a kvfence driver, over HTTP with ``httpx``.

Two ways to get one:

* :meth:`HttpVllmDriver.launch`: kvfence starts ``python -m vllm.entrypoints.openai.api_server``
  on 127.0.0.1 with the tiny model (a :class:`adapters.vllm_process.ServerProcess`, killed
  with kvfence);
* :meth:`HttpVllmDriver.attach`: a server the user started, by URL, with the user's model and
  checkpoint directories (nothing is downloaded or started; loopback only unless
  ``allow_remote``).

The routes used (``vllm/entrypoints/serve/dev/*`` need ``VLLM_SERVER_DEV_MODE=1`` on the
server; the RL routes are ``vllm/entrypoints/rl/online/api_router.py``):
``POST /v1/completions`` (needs ``--enable-prompt-tokens-details`` for the cached-token
count), ``POST /collective_rpc`` (in-place reload), ``POST /reset_prefix_cache``,
``POST /pause``, ``POST /resume``, ``GET /is_paused``, ``GET /weight_info``,
``POST /update_weight_version``, ``POST /sleep``, ``POST /wake_up``, ``GET /health``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .http_base import LOOPBACK_HOSTS, HttpDriverBase, check_url
from .vllm_base import (
    BLOCK_SIZE,
    CPU_SLEEP_REASON,
    DTYPE,
    MAX_MODEL_LEN,
    SERVED_MODEL_NAME,
    VLLM_PAUSE_MODES,
    ServerStartError,
    VllmDriverError,
    VllmPauseMode,
    WeightReloadError,
)
from .vllm_process import ServerProcess, free_port, rss_mib

#: Re-exported: attach mode's URL check lives in :mod:`adapters.http_base`.
__all__ = ["LOOPBACK_HOSTS", "HttpVllmDriver", "check_url"]


class HttpVllmDriver(HttpDriverBase):
    """A client of one vLLM OpenAI server at ``base_url``; see the module doc (the HTTP
    plumbing, attach and the generation call's shape are :class:`adapters.http_base.
    HttpDriverBase`'s; this class holds vLLM's routes).

    ``checkpoints``: version -> checkpoint directory *as the server sees it* (the in-place
    reload reads it on the server's machine). ``served_model``: the ``model`` field of
    completions. ``server``: the process kvfence started, closed with the driver (``None``
    when attached). ``version``: the version the server is taken to hold now.
    """

    ENGINE = "vLLM"
    GENERATE_ROUTE = "/v1/completions"

    def __init__(
        self,
        base_url: str,
        checkpoints: Path | Callable[[int], Path],
        version: int = 0,
        workdir: Path | None = None,
        *,
        served_model: str = SERVED_MODEL_NAME,
        server: ServerProcess | None = None,
        request_timeout: float = 120.0,
        allow_cpu_sleep: bool = False,
    ) -> None:
        super().__init__(
            base_url,
            checkpoints,
            version,
            workdir,
            request_timeout=request_timeout,
            allow_cpu_sleep=allow_cpu_sleep,
        )
        self.served_model = served_model
        self.server = server
        self._short_tmp: Path | None = None

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def launch(
        cls,
        model_root: Path,
        version: int = 0,
        workdir: Path | None = None,
        port: int | None = None,
        *,
        python: str | None = None,
        startup_timeout: float = 240.0,
        request_timeout: float = 120.0,
        allow_cpu_sleep: bool = False,
    ) -> HttpVllmDriver:
        """Start vLLM's server on 127.0.0.1 serving the tiny model at ``version``.

        Command: ``PYTHON -m vllm.entrypoints.openai.api_server --model DIR
        --served-model-name kvfence-tiny --enable-prefix-caching
        --enable-prompt-tokens-details --enforce-eager --dtype float32
        --max-model-len 512 --block-size 32 --host 127.0.0.1 --port P`` with
        ``VLLM_SERVER_DEV_MODE=1``. It runs in its own process group (API server,
        EngineCore and worker processes); HOME, XDG_CACHE_HOME, VLLM_CACHE_ROOT and TMPDIR
        point into ``workdir``; its output goes to ``workdir/vllm-server.log``. Startup
        ~30-37 s on 2 cores (three processes each import vllm), ~2.9 GB RSS.
        """
        t0 = time.monotonic()
        port = port or free_port()
        driver = cls(
            f"http://127.0.0.1:{port}",
            model_root,
            version,
            workdir,
            request_timeout=request_timeout,
            allow_cpu_sleep=allow_cpu_sleep,
        )
        try:
            cmd, env = driver._server_command(driver.weights_path(version), python, port)
            driver.server = ServerProcess(
                cmd, driver.workdir / "vllm-server.log", env=env, cwd=driver.workdir
            )
            driver._wait_healthy(startup_timeout)
        except BaseException:
            driver.close()
            raise
        driver.startup_seconds = time.monotonic() - t0
        driver.startup_rss_mib = rss_mib(driver.server.group_pids())
        return driver

    def _probe_attached(self, served_model: str | None) -> None:
        """What :meth:`HttpDriverBase.attach` checks on a vLLM server: ``GET /health``,
        and that the dev routes exist (``VLLM_SERVER_DEV_MODE=1``): ``GET /is_paused``,
        ``GET /weight_info``. ``served_model`` defaults to the first id of ``GET
        /v1/models``. ``ServerStartError`` when the server is not reachable or lacks a
        route."""
        self._check_health()
        for route in ("/is_paused", "/weight_info"):
            if self._http.get(route, timeout=10.0).status_code == 404:
                raise ServerStartError(
                    f"{self.base_url}{route} is missing: start the server with "
                    "VLLM_SERVER_DEV_MODE=1 (kvfence needs /collective_rpc, "
                    "/reset_prefix_cache, /pause, /resume)"
                )
        if served_model is None:
            models = self._json_ok("GET", "/v1/models").get("data") or []
            if not models:
                raise ServerStartError(f"{self.base_url}/v1/models lists no model")
            served_model = str(models[0]["id"])
        self.served_model = served_model

    def _server_command(
        self, path: Path, python: str | None, port: int
    ) -> tuple[list[str], dict[str, str]]:
        home = self.workdir / "home"
        tmp = self.workdir / "tmp"
        if len(str(tmp)) > 60:  # zmq ipc socket paths live in TMPDIR (limit ~107)
            self._short_tmp = Path(tempfile.mkdtemp(prefix="kvf-"))
            tmp = self._short_tmp
        for d in (home, tmp):
            d.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        env.update(
            {
                "VLLM_SERVER_DEV_MODE": "1",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                "HOME": str(home),
                "XDG_CACHE_HOME": str(self.workdir / "cache"),
                "VLLM_CACHE_ROOT": str(self.workdir / "vllm-cache"),
                "TORCHINDUCTOR_CACHE_DIR": str(self.workdir / "inductor"),
                "TMPDIR": str(tmp),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("TORCHDYNAMO_DISABLE", "1")
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        cmd = [
            python or sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(path),
            "--served-model-name",
            SERVED_MODEL_NAME,
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--enforce-eager",
            "--dtype",
            DTYPE,
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--block-size",
            str(BLOCK_SIZE),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        return cmd, env

    # -- process state --------------------------------------------------------------------
    @property
    def log_path(self) -> Path | None:
        """The server log when kvfence started the server, else ``None``."""
        return None if self.server is None else self.server.log_path

    def log_tail(self, n_lines: int = 40) -> str:
        """Last ``n_lines`` of the server log (empty when attached)."""
        return "" if self.server is None else self.server.log_tail(n_lines)

    def _server_state(self) -> str:
        if self.server is None:
            return super()._server_state()
        return (
            f"server alive={self.server.is_alive()}; log {self.server.log_path} ends with:\n"
            f"{self.server.log_tail(15)}"
        )

    def _wait_healthy(self, timeout: float) -> None:
        """Poll ``GET /health`` (200 once the engine is up) until ``timeout``."""
        import httpx

        assert self.server is not None
        deadline = time.monotonic() + timeout
        while True:
            code = self.server.poll()
            if code is not None:
                raise ServerStartError(
                    f"vLLM server exited with code {code} during startup; log "
                    f"{self.server.log_path} ends with:\n{self.server.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if self._http.get("/health", timeout=2.0).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"vLLM server not healthy after {timeout:.0f} s; log "
                    f"{self.server.log_path} ends with:\n{self.server.log_tail()}"
                )
            time.sleep(0.25)

    def group_pids(self) -> list[int]:
        """Live pids of the started server's process group (empty when attached)."""
        return [] if self.server is None else self.server.group_pids()

    def is_alive(self) -> bool:
        """Whether the started server still runs (attached: whether /health answers)."""
        if self.server is not None:
            return self.server.is_alive()
        import httpx

        try:
            return self._http.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _close_more(self) -> None:
        """Stop a server kvfence started (SIGTERM to its process group, SIGKILL after
        15 s; an attached server is left running)."""
        if self.server is not None:
            self.server.close()
        if self._short_tmp is not None:
            shutil.rmtree(self._short_tmp, ignore_errors=True)

    # -- generation -----------------------------------------------------------
    def _generate_body(
        self, prompt: list[int] | str, max_tokens: int, cache_salt: str | None
    ) -> dict[str, Any]:
        """``POST /v1/completions`` body: ``{"model", "prompt": ids|text, "max_tokens",
        "temperature": 0, "logprobs": 1, "ignore_eos": true, "return_token_ids": true,
        "cache_salt"?}``. While paused the request waits in the queue until resume (or
        the client timeout)."""
        body: dict[str, Any] = {
            "model": self.served_model,
            "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "logprobs": 1,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        return body

    def _parse_generation(self, data: Any) -> tuple[tuple[int, ...], tuple[float, ...], int]:
        """Tokens from ``choices[0].token_ids``, logprobs from
        ``choices[0].logprobs.token_logprobs``, cached tokens from
        ``usage.prompt_tokens_details.cached_tokens`` (present because of
        ``--enable-prompt-tokens-details``; a server without it: ``VllmDriverError``)."""
        choice = data["choices"][0]
        token_ids = tuple(int(t) for t in choice["token_ids"])
        logprobs = tuple(float(x) for x in choice["logprobs"]["token_logprobs"])
        cached = data["usage"]["prompt_tokens_details"]["cached_tokens"]
        if cached is None:
            raise VllmDriverError("server did not report cached_tokens")
        return token_ids, logprobs, int(cached)

    # -- weights ----------------------------------------------------------------
    def reload_weights(self, version: int) -> None:
        """Reload tiny-model ``version`` in place via ``POST /collective_rpc``.

        Body ``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}``
        (``vllm/entrypoints/serve/dev/rpc``); success is HTTP 200
        ``{"results": [null]}``. The directory is validated first: vLLM 0.32
        answers a bad path with HTTP 500 and the whole server dies.
        """
        path = self.weights_path(version)
        resp = self._request(
            "POST",
            "/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(path)}},
        )
        if resp.status_code != 200:
            time.sleep(0.5)
            self._broken = (
                f"reload_weights({path}) -> HTTP {resp.status_code}: {resp.text[:1000]}; "
                f"{self._server_state()}"
            )
            raise WeightReloadError(self._broken)
        self.loaded_version = version

    def weight_version(self) -> str | None:
        """``GET /weight_info`` -> ``{"weight_version": str}`` ("default" until set)."""
        return self._json_ok("GET", "/weight_info").get("weight_version")

    def set_weight_version(self, label: str) -> None:
        """``POST /update_weight_version`` body ``{"new_version": label}``."""
        self._json_ok("POST", "/update_weight_version", json={"new_version": label})

    # -- cache / pause / sleep ------------------------------------------------------
    def reset_prefix_cache(self) -> bool | None:
        """``POST /reset_prefix_cache`` -> ``{"success": bool}``; returns that value.

        Returns None if the body carries no ``success`` field.
        """
        data = self._json_ok("POST", "/reset_prefix_cache")
        result = data.get("success") if isinstance(data, dict) else None
        if result is None or isinstance(result, bool):
            return result
        raise VllmDriverError(f"/reset_prefix_cache answered {data!r}")

    def pause(self, mode: VllmPauseMode = "abort", *, clear_cache: bool) -> None:
        """``POST /pause?mode=MODE&clear_cache=BOOL`` -> ``{"status": "paused"}``.

        All three modes exist over HTTP (abort in-flight requests / wait for
        them to drain / keep them frozen until resume). vLLM's own default is
        clear_cache=true, which resets prefix/mm/encoder caches after draining
        (observed for "keep" too). Invalid mode -> HTTP 400.
        """
        if mode not in VLLM_PAUSE_MODES:
            raise ValueError(f"mode must be one of {VLLM_PAUSE_MODES}, got {mode!r}")
        params = {"mode": mode, "clear_cache": "true" if clear_cache else "false"}
        data = self._json_ok("POST", "/pause", params=params)
        if not isinstance(data, dict) or data.get("status") != "paused":
            raise VllmDriverError(f"/pause answered {data!r}")

    def resume(self) -> None:
        """``POST /resume`` -> ``{"status": "resumed"}``."""
        data = self._json_ok("POST", "/resume")
        if not isinstance(data, dict) or data.get("status") != "resumed":
            raise VllmDriverError(f"/resume answered {data!r}")

    def is_paused(self) -> bool:
        """``GET /is_paused`` -> ``{"is_paused": bool}``."""
        return bool(self._json_ok("GET", "/is_paused")["is_paused"])

    def sleep(self, level: int = 1) -> None:
        """``POST /sleep?level=L`` (mode=abort) -> ``{"status": "sleeping", "level": L}``.

        Raises NotImplementedError unless ``allow_cpu_sleep=True`` (CPU: see
        module doc). level must be 0..2 (HTTP 400 otherwise).
        """
        if not self.allow_cpu_sleep:
            raise NotImplementedError(CPU_SLEEP_REASON)
        self._json_ok("POST", "/sleep", params={"level": level})

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """``POST /wake_up[?tags=T...]`` -> ``{"status": "awake"|"sleeping", "tags"}``.

        Returns True when the status is "awake". Raises NotImplementedError
        unless ``allow_cpu_sleep=True``.
        """
        if not self.allow_cpu_sleep:
            raise NotImplementedError(CPU_SLEEP_REASON)
        params = [("tags", t) for t in tags] if tags else None
        data = self._json_ok("POST", "/wake_up", params=params)
        return data.get("status") == "awake"

    def is_sleeping(self) -> bool:
        """``GET /is_sleeping`` -> ``{"is_sleeping": bool}`` (true while paused too)."""
        return bool(self._json_ok("GET", "/is_sleeping")["is_sleeping"])
