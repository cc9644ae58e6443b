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
import itertools
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
        lora: bool = False,
        two_phase: bool = True,
    ) -> None:
        super().__init__(checkpoints, version, workdir, allow_cpu_sleep)
        #: The engine serves one LoRA adapter (``enable_lora``); see :meth:`load_lora`.
        self.lora = lora
        #: The ``LoRARequest`` that LoRA requests carry now (set by :meth:`load_lora`).
        self.lora_request: Any = None
        #: The engine runs with kvfence's ``kvfence-disk`` weight-transfer backend, so the
        #: native two-phase update works on CPU (:mod:`adapters.vllm_transfer`).
        self.two_phase = two_phase
        self._window: Any = None
        self._transfer_ready = False
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

            extra_args: dict[str, Any] = {}
            if lora:
                from .tiny_model import LORA_RANK

                # The CPU platform serves LoRA through its punica wrapper
                # (vllm/lora/punica_wrapper/punica_cpu.py, vllm/platforms/cpu.py).
                extra_args = {"enable_lora": True, "max_lora_rank": LORA_RANK, "max_loras": 1}
            if two_phase:
                from vllm.config import WeightTransferConfig

                from .vllm_transfer import BACKEND, register_backend

                register_backend()
                extra_args["weight_transfer_config"] = WeightTransferConfig(backend=BACKEND)
            self._llm = vllm.LLM(
                model=str(path),
                enable_prefix_caching=True,
                dtype=DTYPE,
                enforce_eager=True,
                max_model_len=MAX_MODEL_LEN,
                block_size=BLOCK_SIZE,
                **extra_args,
            )
        except BaseException:
            self.close()
            raise
        self.startup_seconds = time.monotonic() - t0
        self.startup_rss_mib = rss_mib([os.getpid()])
        self._ids = itertools.count()
        #: Requests held in flight that vLLM still runs (see :meth:`start_request`).
        self._held: set[str] = set()
        #: How each held request ended: ``"aborted"`` or ``"finished"``.
        self.ended: dict[str, str] = {}
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
        self,
        prompt: list[int] | str,
        max_tokens: int = 8,
        *,
        cache_salt: str | None = None,
        lora: bool = False,
    ) -> Generation:
        """Greedy generation of ``max_tokens`` tokens, run to completion.

        vLLM API: ``LLMEngine.add_request(id, {"prompt_token_ids"|"prompt", "cache_salt"?},
        SamplingParams(temperature=0, max_tokens, logprobs=1, ignore_eos=True))`` then
        ``LLMEngine.step()`` until this request's output is finished (what
        ``LLM.generate`` does, except that requests held in flight by
        :meth:`start_request` keep running instead of being drained with it).
        Logprobs are those of the sampled tokens, ``cached_tokens`` is
        ``RequestOutput.num_cached_tokens``; a salted request never shares prefix blocks
        with other salts. ``lora``: through the adapter :meth:`load_lora` loaded last (its
        ``LoRARequest``). Raises VllmDriverError while paused (the loop would spin).
        """
        self._check_usable()
        self._no_window("generate")
        with contextlib.suppress(NotImplementedError):
            if self._engine_core().is_scheduler_paused():
                raise VllmDriverError("engine is paused/sleeping; call resume()/wake_up() first")
        rid = f"kvfence-gen-{next(self._ids)}"
        self._add(rid, prompt, max_tokens, cache_salt, lora)
        out = self._run_until_finished(rid)
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

    def _add(
        self,
        rid: str,
        prompt: list[int] | str,
        max_tokens: int,
        cache_salt: str | None,
        lora: bool = False,
    ) -> None:
        from vllm import SamplingParams

        if isinstance(prompt, str):
            request: dict[str, Any] = {"prompt": prompt}
        else:
            request = {"prompt_token_ids": [int(t) for t in prompt]}
        if cache_salt is not None:
            request["cache_salt"] = cache_salt
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=1, ignore_eos=True)
        lora_request = None
        if lora:
            if self.lora_request is None:
                raise VllmDriverError("a LoRA request before any load_lora()")
            lora_request = self.lora_request
        self._llm.llm_engine.add_request(rid, request, params, lora_request=lora_request)

    def _step(self) -> list[Any]:
        """One ``LLMEngine.step()``; remembers which held request ended and how."""
        outs = self._llm.llm_engine.step()
        for o in outs:
            if o.request_id in self._held and o.finished:
                self._held.discard(o.request_id)
                self.ended[o.request_id] = "finished"
        return outs

    def _run_until_finished(self, rid: str, max_steps: int = 10_000) -> Any:
        for _ in range(max_steps):
            for o in self._step():
                if o.request_id == rid and o.finished:
                    return o
        raise VllmDriverError(f"request {rid} did not finish in {max_steps} engine steps")

    # -- requests held in flight --------------------------------------------------------
    def start_request(
        self, rid: str, prompt: list[int], max_tokens: int, *, lora: bool = False
    ) -> None:
        """Admit a request that stays in flight: ``add_request`` then ``step()`` until it
        has been prefilled (its first output token came back), so it holds its KV blocks.

        Later engine steps (any other request's) decode it further; it ends when
        :meth:`abort_requests` ends it, a pause in mode ``abort`` ends it, or it reaches
        ``max_tokens`` (then ``ended[rid] == "finished"``).
        """
        self._check_usable()
        self._add(rid, prompt, max_tokens, None, lora)
        self._held.add(rid)
        for _ in range(1000):
            if any(o.request_id == rid for o in self._step()):
                return
        raise VllmDriverError(f"request {rid} was not prefilled in 1000 engine steps")

    def held(self) -> frozenset[str]:
        """The requests started by :meth:`start_request` that vLLM still holds."""
        return frozenset(self._held)

    def abort_requests(self, rids: list[str]) -> None:
        """``LLMEngine.abort_request(rids)``: vLLM ends them and frees their blocks."""
        self._check_usable()
        self._llm.llm_engine.abort_request(list(rids))
        for rid in rids:
            if rid in self._held:
                self._held.discard(rid)
                self.ended[rid] = "aborted"

    def waiting(self) -> int:
        """Requests the scheduler holds in its waiting queue (preempted ones included)."""
        return len(self._engine_core().scheduler.waiting)

    def settle(self, max_steps: int = 1000) -> None:
        """Step until no request waits to be (re)scheduled: a request preempted by
        ``reset_prefix_cache(reset_running_requests=True)`` is prefilled again (on resume,
        under the weights then loaded)."""
        scheduler = self._engine_core().scheduler
        for _ in range(max_steps):
            if not scheduler.waiting or scheduler.pause_state != _unpaused():
                return
            self._step()
        raise VllmDriverError(f"requests still waiting after {max_steps} engine steps")

    # -- probes ---------------------------------------------------------------------------
    def prompt_cached(self, prompt: list[int], *, lora: bool = False) -> bool:
        """Whether the prefix cache holds the first full block of ``prompt`` (unsalted)
        under the key a request would look it up by now: ``BlockPool.get_cached_block(hash,
        [0])`` with the hash vLLM's scheduler gives that block (``hash_block_tokens`` with
        the engine's ``prefix_caching_hash_algo``, ``vllm/v1/core/kv_cache_utils.py``). With
        ``lora`` the block's extra keys are those of the adapter loaded now,
        ``("lora", name, path)`` (``_gen_lora_extra_hash_keys`` in 0.32: the name and the
        path, not the bytes and not ``lora_int_id``). Read from the scheduler's own block
        pool; ``BLOCK_SIZE`` tokens per block."""
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import hash_block_tokens

        core = self._engine_core()
        algo = core.vllm_config.cache_config.prefix_caching_hash_algo
        extra = None
        if lora:
            r = self.lora_request
            if r is None:
                raise VllmDriverError("a LoRA cache probe before any load_lora()")
            extra = (("lora", r.lora_name, r.lora_path),)
        block = hash_block_tokens(
            get_hash_fn_by_name(algo), None, tuple(prompt[:BLOCK_SIZE]), extra
        )
        pool = core.scheduler.kv_cache_manager.block_pool
        return pool.get_cached_block(block, [0]) is not None

    def weights_fingerprint(self) -> tuple[float, ...]:
        """The float64 sums of :data:`PROBED_PARAMETERS` as the worker holds them, read
        in the worker through ``LLM.collective_rpc(callable)``; equal to
        :func:`checkpoint_fingerprint` of the checkpoint last loaded whole."""
        self._check_usable()
        (value,) = self._llm.collective_rpc(_param_sum)
        return tuple(value)

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

    def load_lora(self, path: Path, name: str = "kvfence-lora", lora_id: int = 1) -> None:
        """(Re)load the LoRA adapter ``name`` from ``path`` in place: ``LLMEngine.add_lora(
        LoRARequest(name, lora_id, path, load_inplace=True))`` (the offline twin of ``POST
        /v1/load_lora_adapter`` with ``load_inplace=true``,
        ``vllm/entrypoints/openai/models/serving.py``; the worker replaces the adapter's
        weights, ``vllm/lora/worker_manager.py``). It never touches the prefix cache. Later
        LoRA requests carry ``LoRARequest(name, lora_id, path)``."""
        self._check_usable()
        if not self.lora:
            raise VllmDriverError("the engine was started without LoRA (lora=False)")
        from vllm.lora.request import LoRARequest

        path = Path(path)
        if not (path / "adapter_config.json").is_file():
            raise VllmDriverError(f"not a LoRA adapter directory (no adapter_config.json): {path}")
        ok = self._llm.llm_engine.add_lora(LoRARequest(name, lora_id, str(path), load_inplace=True))
        if ok is not True:
            raise VllmDriverError(f"add_lora({name!r}, {path}) returned {ok!r}")
        self.lora_request = LoRARequest(name, lora_id, str(path))

    # -- the native two-phase update (kvfence-disk backend) ---------------------------------
    def _no_window(self, what: str) -> None:
        if self._window is not None:
            raise VllmDriverError(
                f"{what} inside an open two-phase update (v{self._window.version}): vLLM's "
                "layerwise reload leaves layers on the meta device until finish, and a "
                "forward pass fails ('Tensor on device cpu is not on the expected device meta')"
            )

    @property
    def window(self) -> Any:
        """The open two-phase update (``vllm_transfer.TwoPhase``) or ``None``."""
        return self._window

    def begin_weight_update(self, version: int) -> None:
        """Open a native update to tiny-model ``version``: ``LLM.start_weight_update()``
        (worker: ``initialize_layerwise_reload``), after a one-time
        ``init_weight_transfer_engine``. Nothing lands yet; the chunks come from
        :func:`adapters.vllm_transfer.chunks_of`. Raises if a window is open or the engine
        started without ``two_phase``."""
        self._check_usable()
        from .vllm_transfer import TwoPhase, chunks_of

        if not self.two_phase:
            raise VllmDriverError("the engine was started without two_phase")
        self._no_window("begin_weight_update")
        pending = chunks_of(self.weights_path(version))
        if not self._transfer_ready:
            self._llm.init_weight_transfer_engine({"init_info": {}})
            self._transfer_ready = True
        self._llm.start_weight_update()
        self._window = TwoPhase(version, pending, before=self.loaded_version)

    def update_weight_chunk(self) -> int:
        """Land the next chunk of the open update: ``LLM.update_weights({"update_info":
        ...})``. Returns the chunks still pending. A chunk that raises ends vLLM's window
        (the worker drops its flag) and leaves layers half loaded: the engine is then
        marked unusable."""
        self._check_usable()
        w = self._window
        if w is None:
            raise VllmDriverError("update_weight_chunk without an open update")
        if not w.pending:
            raise VllmDriverError(f"every chunk of v{w.version} has landed; finish it")
        info = w.pending.pop(0)
        try:
            self._llm.update_weights(w.payload(info))
        except Exception as exc:
            self._window = None
            self._broken = f"update_weights chunk {w.landed + 1} of v{w.version} failed: {exc!r}"
            raise WeightReloadError(self._broken) from exc
        w.landed += 1
        w.landed_names.update(info.names)
        return len(w.pending)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Land any chunk still pending, then ``LLM.finish_weight_update(weight_version)``
        (worker: ``finalize_layerwise_reload``; the label is set when given). Does not
        touch the prefix cache."""
        self._check_usable()
        w = self._window
        if w is None:
            raise VllmDriverError("finish_weight_update without an open update")
        while w.pending:
            self.update_weight_chunk()
        self._llm.finish_weight_update(weight_version=weight_version)
        self._window = None
        self.loaded_version = w.version

    def abort_weight_update(self) -> None:
        """Give the open update up. vLLM 0.32 has no abort (no route, engine or worker
        method); the rollback goes through vLLM's own API in two windows: the open one is
        finished with the previous version's tensors for every layer not yet loaded (a
        layer loads once per window), then a second window lands the previous version's
        whole checkpoint. No label is set."""
        self._check_usable()
        from .vllm_transfer import DiskUpdateInfo, chunks_of

        w = self._window
        if w is None:
            raise VllmDriverError("abort_weight_update without an open update")
        old = chunks_of(self.weights_path(w.before))
        rest = [n for c in old for n in c.names if n not in w.landed_names]
        w.pending = [DiskUpdateInfo(old[0].path, rest)] if rest else []
        while w.pending:
            self.update_weight_chunk()
        self._llm.finish_weight_update(weight_version=None)
        self._window = None
        self.begin_weight_update(w.before)
        self._window.pending = chunks_of(self.weights_path(w.before))
        while self._window.pending:
            self.update_weight_chunk()
        self._llm.finish_weight_update(weight_version=None)
        self._window = None
        self.loaded_version = w.before

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
    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool | None:
        """``LLM.reset_prefix_cache(reset_running_requests)``; returns exactly what it
        returned.

        vLLM 0.32 returns a bool: False while running requests hold blocks
        (``BlockPool.reset_prefix_cache``). With ``reset_running_requests=True`` the
        scheduler first preempts every running request (``Scheduler._preempt_request``:
        its blocks are freed and it is prefilled again when scheduled), so the reset can
        succeed with requests in flight.
        """
        self._check_usable()
        result = self._llm.reset_prefix_cache(reset_running_requests=reset_running_requests)
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
        if mode == "abort" and self._held:
            # The core's scheduler ended them (Scheduler.finish_requests, FINISHED_ABORTED);
            # the engine's output processor still tracks them until told.
            self.abort_requests(sorted(self._held))

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


#: Parameters the weights probe reads. vLLM's CPU linear layers repack their weights at
#: load (the registered ``weight`` parameter then reads as zeros), so only tensors kept as
#: loaded can be compared with a checkpoint: the token embedding and the LM head.
PROBED_PARAMETERS = ("model.embed_tokens.weight", "lm_head.weight")


def _param_sum(worker: Any) -> tuple[float, ...]:
    """Runs inside the worker (``collective_rpc``): float64 sums of the probed parameters."""
    import torch

    with torch.no_grad():
        params = dict(worker.model_runner.model.named_parameters())
        sums = []
        for name in PROBED_PARAMETERS:
            # With LoRA on, vLLM wraps the layer: its own weight is ``<module>.base_layer.weight``.
            module, _, leaf = name.rpartition(".")
            param = params.get(name, params.get(f"{module}.base_layer.{leaf}"))
            if param is None:
                raise KeyError(f"worker has neither {name} nor its LoRA base_layer twin")
            sums.append(float(param.detach().double().sum().item()))
        return tuple(sums)


def checkpoint_fingerprint(path: Path) -> tuple[float, ...]:
    """The float64 sums of :data:`PROBED_PARAMETERS` in the ``*.safetensors`` of ``path``."""
    import torch
    from safetensors.torch import load_file

    found: dict[str, float] = {}
    with torch.no_grad():
        for file in sorted(Path(path).glob("*.safetensors")):
            for name, tensor in load_file(str(file)).items():
                if name in PROBED_PARAMETERS:
                    found[name] = float(tensor.double().sum().item())
    missing = [n for n in PROBED_PARAMETERS if n not in found]
    if missing:
        raise VllmDriverError(f"checkpoint {path} lacks {missing}: the weights probe needs them")
    return tuple(found[n] for n in PROBED_PARAMETERS)


def _unpaused() -> Any:
    from vllm.v1.core.sched.interface import PauseState

    return PauseState.UNPAUSED
