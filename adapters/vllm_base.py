"""What the vLLM drivers share: engine settings, errors, the ``Generation`` result, and the
bookkeeping base class (workdir, loaded version, checkpoints).

The drivers are :mod:`adapters.vllm_offline` (an in-process ``vllm.LLM``),
:mod:`adapters.vllm_http` (vLLM's OpenAI-compatible server, started by kvfence or attached
to by URL) and :mod:`adapters.vllm_cold` (a cold prefill in a fresh engine). Process
management lives in :mod:`adapters.vllm_process`. Every module here imports without vLLM.

Facts verified on vLLM 0.32.0 CPU that every driver follows:

* In-place reload: ``collective_rpc("reload_weights", kwargs={"weights_path": DIR})``
  (worker method ``Worker.reload_weights`` ->
  ``vllm/model_executor/model_loader/reload/inplace.py``). It does NOT reset the prefix
  cache: a repeated prompt then hits KV computed under the old weights. A failed reload
  (bad path) leaves the offline engine with meta-tensor weights and kills the whole HTTP
  server, so paths are validated first.
* ``reset_prefix_cache`` returns a bool (``EngineCore.reset_prefix_cache`` ->
  ``Scheduler.reset_prefix_cache``, ``vllm/v1/core/sched/scheduler.py``): ``False`` while
  running requests hold blocks (``BlockPool.reset_prefix_cache`` refuses unless every
  block is free). Over HTTP ``POST /reset_prefix_cache`` answers ``{"success": bool}``
  (``vllm/entrypoints/serve/dev/cache``).
* Sleep: ``CpuPlatform.is_sleep_mode_available()`` is False (``enable_sleep_mode=True`` is
  rejected), and ``CPUWorker.sleep/wake_up`` are no-ops that log "sleep mode is not
  supported on CPU". The engine-level call still pauses the scheduler and, for level >= 1,
  clears the prefix cache; no memory is offloaded or discarded, even at level 2.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .tiny_model import build_tiny_model, model_dir

VllmPauseMode = Literal["abort", "wait", "keep"]
"""vLLM's own pause modes (``/pause?mode=``, ``EngineCore.pause_scheduler``); kvfence's
spec word is ``model.vocabulary.PauseMode``, mapped onto these by the adapter."""
VLLM_PAUSE_MODES: tuple[VllmPauseMode, ...] = ("abort", "wait", "keep")

#: Engine settings shared by the drivers that start their own engine.
MAX_MODEL_LEN = 512
BLOCK_SIZE = 32
DTYPE = "float32"
SERVED_MODEL_NAME = "kvfence-tiny"

CPU_SLEEP_REASON = (
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
        multiple of the block size), as reported by the engine.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    cached_tokens: int


def validate_weights_dir(path: Path) -> None:
    """Raise ``WeightReloadError`` unless ``path`` holds ``config.json`` and safetensors."""
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        raise WeightReloadError(
            f"not a model directory (needs config.json and *.safetensors): {path}"
        )


def tiny_checkpoints(model_root: Path) -> Callable[[int], Path]:
    """Version -> directory of the tiny model of :mod:`adapters.tiny_model`, built on
    first use under ``model_root``."""
    root = Path(model_root)

    def path_of(version: int) -> Path:
        path = model_dir(root, version)
        if (path / "KVFENCE_OK").is_file():
            return path
        return build_tiny_model(root, version)

    return path_of


def given_checkpoints(paths: Mapping[int, Path]) -> Callable[[int], Path]:
    """Version -> directory from a user's ``--checkpoint vN=PATH`` list (versions 0..K-1).

    The checker may push more versions than the user gave (each sync is a new version): a
    version N >= K reuses checkpoint ``N mod K``. Alternating checkpoints keep every
    update a real change of weights from the one before, so stale KV still shows in the
    bytes; only reuse across two versions with the same checkpoint is invisible to the
    byte oracle (never a false FAIL)."""
    fixed = {int(v): Path(p) for v, p in paths.items()}
    if sorted(fixed) != list(range(len(fixed))) or len(fixed) < 2:
        raise WeightReloadError(
            "checkpoints must be versions 0..K-1 with K >= 2; given: "
            + ", ".join(f"v{v}" for v in sorted(fixed))
        )

    def path_of(version: int) -> Path:
        return fixed[version % len(fixed)]

    return path_of


class DriverBase:
    """Shared bookkeeping: the checkpoints, the loaded version, closed/broken state, the
    work directory (a temp dir removed by ``close`` when ``workdir`` is ``None``).

    ``checkpoints``: a model root (the tiny model is built there per version) or a
    callable version -> checkpoint directory (:func:`given_checkpoints`).
    """

    def __init__(
        self,
        checkpoints: Path | Callable[[int], Path],
        version: int,
        workdir: Path | None,
        allow_cpu_sleep: bool = False,
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = (
            Path(tempfile.mkdtemp(prefix="kvfence-vllm-")) if workdir is None else Path(workdir)
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.checkpoints = (
            checkpoints if callable(checkpoints) else tiny_checkpoints(Path(checkpoints))
        )
        self.allow_cpu_sleep = allow_cpu_sleep
        #: Version whose weights the driver last loaded successfully.
        self.loaded_version = version
        #: Seconds from constructor start to a usable engine.
        self.startup_seconds = 0.0
        #: Resident memory (MiB) right after startup (process or process group).
        self.startup_rss_mib = 0.0
        self._closed = False
        self._broken: str | None = None

    @property
    def broken(self) -> str | None:
        """Why the engine is unusable (a failed reload), or ``None``."""
        return self._broken

    def _check_usable(self) -> None:
        if self._closed:
            raise VllmDriverError("driver is closed")
        if self._broken:
            raise VllmDriverError(f"engine unusable: {self._broken}")

    def weights_path(self, version: int) -> Path:
        """The validated checkpoint directory of ``version``."""
        path = self.checkpoints(version)
        validate_weights_dir(path)
        return path

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError
