"""A user's running SGLang server as a kvfence system under test, over its own HTTP routes
(attach mode: ``kvfence check --engine sglang-http --url URL --checkpoint v0=PATH
--checkpoint v1=PATH``). Nothing is started or downloaded; the host must be loopback unless
``--allow-remote``.

It reuses the vLLM attach mode (:mod:`adapters.vllm_engine`): the same adapter
(``VllmAdapter`` in HTTP attach mode, one endpoint, the byte oracle, the fail-closed
bookkeeping, the checkpoints as ``given_checkpoints``) over a driver that speaks SGLang's
routes instead of vLLM's; what the two HTTP drivers share (attach, the ``httpx``
plumbing, the generation call) is :class:`adapters.http_base.HttpDriverBase`. Routes and
bodies (SGLang 0.5.23,
``python/sglang/srt/entrypoints/http_server.py``, ``managers/io_struct.py``):

================================  ===========================================================
``ServeRequest(0, prefix)``       ``POST /generate`` ``{"input_ids", "sampling_params":
                                  {"max_new_tokens", "temperature": 0, "ignore_eos": true},
                                  "return_logprob": true}``: tokens ``output_ids``, logprobs
                                  ``meta_info.output_token_logprobs[i][0]``, ``hit`` is
                                  ``meta_info.cached_tokens`` > 0.
byte oracle (cold bytes)          the same request with a fresh ``extra_key``: SGLang keys
                                  the radix tree by it (``Req.extra_key`` ->
                                  ``mem_cache/common.py`` -> ``root_node_handle(extra_key)``
                                  in ``mem_cache/base_prefix_cache.py``), so a never-used key
                                  shares no cached KV. ``rid`` does not: it names a request,
                                  not a cache scope.
``UpdateWeights(0, v, funnel,     ``POST /update_weights_from_disk`` ``{"model_path": DIR,
flush_cache)``                    "flush_cache"?}`` (omitted when the action's is ``None``:
                                  SGLang then flushes, ``UpdateWeightFromDiskReqInput.
                                  flush_cache`` defaults to true). Answer ``{"success",
                                  "message", "num_paused_requests"}``; ``success: false``
                                  (HTTP 400) is REJECTED. Every funnel maps onto this one
                                  route: a user's checkpoints are directories.
``FlushCache(0)``                 ``POST /flush_cache``: HTTP 200 is ``flushed=True``, 400 (it
                                  refuses while requests run or wait) ``flushed=False``.
``PauseGeneration(0, mode)``      ``POST /pause_generation`` ``{"mode": "abort" | "retract" |
                                  "in_place"}`` (the spec's words are SGLang's).
``ContinueGeneration(0)``         ``POST /continue_generation`` ``{}``.
================================  ===========================================================

Probes on attach: ``GET /health`` and ``GET /get_server_info`` (its ``disable_radix_cache``
must be false: kvfence checks prefix-cache reuse). The label route ``POST
/update_weight_version`` is not called: the weight-version label is not compared over HTTP
(no ``weights_probe``), as for ``vllm-http``.

Until a real SGLang server is available to this project's CI, this adapter is tested
against ``kvfence serve --api sglang`` (tests/test_sglang_http.py); docs/engines.md says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..model.actions import PauseGeneration, UpdateWeights
from ..model.observation import Observation
from ..model.state import Config, server_info
from ..model.vocabulary import Lane, PauseMode, Status
from .http_base import HttpDriverBase
from .protocol import AdapterFailure
from .vllm_base import ServerStartError, VllmDriverError
from .vllm_engine import VllmAdapter


class HttpSglangDriver(HttpDriverBase):
    """A client of one SGLang server at ``base_url`` (see the module doc for the routes);
    the HTTP plumbing, attach and the generation call's shape are
    :class:`adapters.http_base.HttpDriverBase`'s, this class holds SGLang's routes. SGLang
    has no ``is_paused`` route: the driver remembers its own pause."""

    ENGINE = "SGLang"
    GENERATE_ROUTE = "/generate"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._paused = False

    def _probe_attached(self, served_model: str | None) -> None:
        """What :meth:`HttpDriverBase.attach` checks on an SGLang server: ``GET /health``
        and ``GET /get_server_info``, whose ``disable_radix_cache`` must be false
        (``ServerStartError`` otherwise). ``served_model`` is unused: SGLang's
        ``/generate`` names no model."""
        self._check_health()
        info = self._json_ok("GET", "/get_server_info")
        if not isinstance(info, dict):
            raise ServerStartError(f"{self.base_url}/get_server_info answered {info!r:.200}")
        if info.get("disable_radix_cache") in (True, "true", 1, "1"):
            raise ServerStartError(
                f"{self.base_url} runs with --disable-radix-cache: there is no prefix cache "
                "to check; start it without that flag"
            )

    def _generate_body(
        self, prompt: list[int] | str, max_tokens: int, cache_salt: str | None
    ) -> dict[str, Any]:
        """``POST /generate`` body (see the module doc); ``cache_salt`` is sent as SGLang's
        ``extra_key``."""
        body: dict[str, Any] = {
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0,
                                "ignore_eos": True},
            "return_logprob": True,
        }  # fmt: skip
        if isinstance(prompt, str):
            body["text"] = prompt
        else:
            body["input_ids"] = [int(t) for t in prompt]
        if cache_salt is not None:
            body["extra_key"] = cache_salt
        return body

    def _parse_generation(self, data: Any) -> tuple[tuple[int, ...], tuple[float, ...], int]:
        """Tokens ``output_ids``, logprobs ``meta_info.output_token_logprobs[i][0]``, cached
        tokens ``meta_info.cached_tokens``."""
        meta = data["meta_info"]
        token_ids = tuple(int(t) for t in data["output_ids"])
        logprobs = tuple(float(x[0]) for x in meta["output_token_logprobs"])
        return token_ids, logprobs, int(meta["cached_tokens"])

    def update_weights(self, version: int, flush_cache: bool | None) -> tuple[bool, str]:
        """``POST /update_weights_from_disk``; ``(success, message)``. ``flush_cache``
        ``None`` leaves the field out (SGLang's default: true)."""
        path = self.weights_path(version)
        body: dict[str, Any] = {"model_path": str(path)}
        if flush_cache is not None:
            body["flush_cache"] = flush_cache
        resp = self._request("POST", "/update_weights_from_disk", json=body)
        try:
            data = resp.json()
        except ValueError:
            data = {}
        ok = resp.status_code == 200 and isinstance(data, dict) and data.get("success") is True
        if ok:
            self.loaded_version = version
        message = data.get("message", "") if isinstance(data, dict) else ""
        return ok, f"HTTP {resp.status_code}: {message or resp.text[:500]}"

    def reload_weights(self, version: int) -> None:
        """Load ``version`` without flushing (the adapter's reset flushes after it)."""
        ok, message = self.update_weights(version, flush_cache=False)
        if not ok:
            raise VllmDriverError(f"update_weights_from_disk(v{version}) failed: {message}")

    def reset_prefix_cache(self) -> bool | None:
        """``POST /flush_cache``: 200 -> True, 400 (refused) -> False."""
        resp = self._request("POST", "/flush_cache")
        if resp.status_code == 200:
            return True
        if resp.status_code == 400:
            return False
        raise VllmDriverError(f"/flush_cache -> HTTP {resp.status_code}: {resp.text[:500]}")

    def pause(self, mode: str = "abort", *, clear_cache: bool = False) -> None:
        """``POST /pause_generation {"mode": mode}`` (SGLang's pause never flushes)."""
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"SGLang pause mode must be abort, retract or in_place: {mode!r}")
        self._json_ok("POST", "/pause_generation", json={"mode": mode})
        self._paused = True

    def resume(self) -> None:
        """``POST /continue_generation {}``."""
        self._json_ok("POST", "/continue_generation", json={})
        self._paused = False

    def is_paused(self) -> bool:
        return self._paused

    def weight_version(self) -> str | None:
        """``GET /get_server_info`` -> its ``weight_version`` field."""
        info = self._json_ok("GET", "/get_server_info")
        return info.get("weight_version") if isinstance(info, dict) else None


class SglangHttpAdapter(VllmAdapter):
    """A user's SGLang server (one endpoint, index 0) by URL; see the module doc.

    ``url``, ``checkpoints`` (version -> directory as the server sees it; v0 and v1
    needed), ``allow_remote``, ``log_dir``, ``progress``: as for ``vllm-http`` attach
    (``served_model`` is refused: SGLang's ``/generate`` names no model).
    ``flush_cache`` goes to SGLang inside the update (the engine's own guard, not the
    client-side one ``vllm-http`` adds): ``fail_closed`` is off.
    """

    fixed_configs: tuple[Config, ...] = (
        Config(
            radix=True,
            lane=Lane.STANDARD,
            info=server_info(disable_radix_cache=False),
            flush_default=True,
        ),
    )
    start_timeout: float = 120.0

    def __init__(
        self,
        url: str | None = None,
        checkpoints: Mapping[int, Path] | None = None,
        allow_remote: bool = False,
        log_dir: Path | None = None,
        served_model: str | None = None,
        progress: bool = True,
        name: str = "sglang-http",
    ) -> None:
        if url is None:
            raise ValueError(
                "--engine sglang-http attaches to a running SGLang server: give --url URL "
                "--checkpoint v0=PATH --checkpoint v1=PATH"
            )
        if served_model is not None:
            raise ValueError("--served-model is for vllm-http: SGLang's /generate names none")
        super().__init__(
            "http",
            fail_closed=False,
            label_updates=False,
            url=url,
            checkpoints=checkpoints,
            served_model=served_model,
            allow_remote=allow_remote,
            log_dir=log_dir,
            name=name,
            progress=progress,
        )

    def _build_driver(self, workdir: Path) -> Any:
        from .vllm_base import given_checkpoints

        assert self.url is not None and self.checkpoints is not None
        self.log_path = None  # nothing of SGLang's runs here: no log of ours to name
        return HttpSglangDriver.attach(
            self.url,
            given_checkpoints(self.checkpoints),
            workdir / "engine",
            allow_remote=self.allow_remote,
        )

    def _progress(self, line: str) -> None:
        """kvfence's own progress line, without the vLLM log path (nothing runs here)."""
        super()._progress(line.split("; vLLM's own output")[0])

    def _quiet(self):
        import contextlib

        return contextlib.nullcontext()

    def _reset(self) -> None:
        driver = self._driver
        try:
            if driver.is_paused():
                driver.resume()
            driver.reload_weights(0)
            flushed = driver.reset_prefix_cache()
        except Exception as e:
            raise AdapterFailure(f"{self.name} reset failed: {type(e).__name__}: {e}") from e
        if flushed is not True:
            raise AdapterFailure(f"{self.name} reset: /flush_cache refused; cannot start empty")
        self._clear_example_state()

    def _update(self, a: UpdateWeights) -> Observation:
        ok, message = self._driver.update_weights(a.version, a.flush_cache)
        if ok:
            self._loaded_versions.add(a.version)
        detail = f"update_weights_from_disk(v{a.version}, flush_cache={a.flush_cache}): {message}"
        return self._observe(Status.OK if ok else Status.REJECTED, detail=detail)

    def _pause(self, a: PauseGeneration) -> Observation:
        self._driver.pause(a.mode.value)
        self._paused = a.mode
        return self._observe(Status.OK, aborted=frozenset(), detail=f"pause(mode={a.mode.value})")


__all__ = ["HttpSglangDriver", "PauseMode", "SglangHttpAdapter"]
