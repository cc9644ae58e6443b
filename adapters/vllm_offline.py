"""An in-process ``vllm.LLM`` (vLLM 0.32, CPU) as a kvfence driver.

The V1 engine runs with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: ``LLM.llm_engine.engine_core``
is an ``InprocClient`` around an ``EngineCore`` living in this process
(``vllm/v1/engine/core_client.py``), so the driver can reach the scheduler (pause, requests
held in flight) the way the HTTP routes do in a server. Settings: ``enable_prefix_caching=True,
dtype=float32, enforce_eager, max_model_len=512, block_size=32`` (the default block size
would cache nothing for ~100-token prompts). Staleness is judged from the logprobs of the
generated tokens plus the engine's cached-token count; prompt logprobs are never requested
because vLLM skips the prefix cache for such requests. See :mod:`adapters.vllm_base` for
the facts every driver follows. vllm is imported lazily.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .vllm_base import (
    BLOCK_SIZE,
    CPU_SLEEP_REASON,
    DTYPE,
    MAX_MODEL_LEN,
    VLLM_PAUSE_MODES,
    DriverBase,
    Generation,
    VllmDriverError,
    VllmPauseMode,
    WeightReloadError,
)
from .vllm_process import rss_mib

#: Live offline engines of this process (see :func:`adapters.vllm_cold.cold_generate`).
LIVE_OFFLINE: weakref.WeakSet[OfflineVllmDriver] = weakref.WeakSet()


class OfflineVllmDriver(DriverBase):
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
    not initialized"); see :func:`adapters.vllm_cold.cold_generate`.
    """

    def __init__(
        self,
        checkpoints: Path | Callable[[int], Path],
        version: int = 0,
        workdir: Path | None = None,
        *,
        allow_cpu_sleep: bool = False,
    ) -> None:
        super().__init__(checkpoints, version, workdir, allow_cpu_sleep)
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
            path = self.weights_path(version)
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
        self.startup_rss_mib = rss_mib([os.getpid()])
        LIVE_OFFLINE.add(self)

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
        path = self.weights_path(version)
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

    def pause(self, mode: VllmPauseMode = "abort", *, clear_cache: bool) -> None:
        """Pause scheduling via ``EngineCore.pause_scheduler(mode, clear_cache)``.

        ``vllm.LLM`` has no ``pause_generation``; this calls the same engine
        method that HTTP ``POST /pause`` reaches, on the in-process core.
        "abort" and "keep" work; "wait" raises NotImplementedError (vLLM:
        "'wait' mode can't be used in inproc-engine mode"; offline generate is
        synchronous, so nothing is ever in flight to drain). With
        ``clear_cache=True`` the engine resets prefix/mm/encoder caches.
        """
        self._check_usable()
        if mode not in VLLM_PAUSE_MODES:
            raise ValueError(f"mode must be one of {VLLM_PAUSE_MODES}, got {mode!r}")
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
            raise NotImplementedError(CPU_SLEEP_REASON)

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
        LIVE_OFFLINE.discard(self)
        llm = self.__dict__.pop("_llm", None)
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            del llm
            import gc

            gc.collect()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
