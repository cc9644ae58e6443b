"""What the HTTP drivers of a real engine share: the URL check, attaching to a server by
URL, the ``httpx`` plumbing and the shape of a generation call.

:class:`adapters.vllm_http.HttpVllmDriver` (vLLM's OpenAI-compatible server) and
:class:`adapters.sglang_http.HttpSglangDriver` (SGLang's native routes) derive from
:class:`HttpDriverBase` and keep only their routes: the health and route probes of an
attached server (``_probe_attached``), and the request body and answer fields of a
generation (``GENERATE_ROUTE``, ``_generate_body``, ``_parse_generation``). Imports without
vLLM or SGLang (``httpx`` is imported when a driver is built).
"""

from __future__ import annotations

import ipaddress
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from .vllm_base import DriverBase, Generation, ServerStartError, VllmDriverError

LOOPBACK_HOSTS = ("localhost",)


def check_url(url: str, allow_remote: bool = False) -> str:
    """``url`` without a trailing slash, or ``ValueError`` saying what is wrong: not
    ``http(s)://host:port``, or a host that is not loopback without ``allow_remote``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--url {url!r} is not an http(s)://HOST:PORT URL")
    host = parts.hostname
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host in LOOPBACK_HOSTS
    if not loopback and not allow_remote:
        raise ValueError(
            f"--url host {host!r} is not loopback; kvfence reloads weights and resets the "
            "cache on the server it checks, so another host needs --allow-remote"
        )
    return url.rstrip("/")


class HttpDriverBase(DriverBase):
    """A client of one engine server at ``base_url`` (``httpx``, no proxy from the
    environment). ``checkpoints``: version -> checkpoint directory *as the server sees it*.
    ``request_timeout``: seconds per HTTP call.

    Subclasses set ``ENGINE`` (the engine's name in messages) and ``GENERATE_ROUTE``, and
    define ``_probe_attached``, ``_generate_body`` and ``_parse_generation``.
    """

    ENGINE: ClassVar[str] = "engine"
    GENERATE_ROUTE: ClassVar[str] = ""

    def __init__(
        self,
        base_url: str,
        checkpoints: Path | Callable[[int], Path],
        version: int = 0,
        workdir: Path | None = None,
        *,
        request_timeout: float = 120.0,
        allow_cpu_sleep: bool = False,
    ) -> None:
        super().__init__(checkpoints, version, workdir, allow_cpu_sleep)
        import httpx

        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=request_timeout, trust_env=False)

    # -- attaching to a server the user started -------------------------------------------
    @classmethod
    def attach(
        cls,
        url: str,
        checkpoints: Callable[[int], Path],
        workdir: Path | None = None,
        *,
        served_model: str | None = None,
        allow_remote: bool = False,
        request_timeout: float = 120.0,
    ) -> Any:
        """A driver for the server the user started at ``url``; nothing is started or
        downloaded. Raises ``ValueError`` for a bad or non-loopback URL (without
        ``allow_remote``), ``ServerStartError`` when the server does not answer the
        subclass's probes (``_probe_attached``); the driver is closed then."""
        base = check_url(url, allow_remote)
        driver = cls(base, checkpoints, 0, workdir, request_timeout=request_timeout)
        try:
            driver._probe_attached(served_model)
        except BaseException:
            driver.close()
            raise
        return driver

    def _probe_attached(self, served_model: str | None) -> None:  # pragma: no cover
        raise NotImplementedError

    def _check_health(self) -> None:
        """``GET /health`` answers 200, else ``ServerStartError`` naming the server."""
        import httpx

        try:
            health = self._http.get("/health", timeout=10.0)
        except httpx.HTTPError as e:
            raise ServerStartError(f"no {self.ENGINE} server at {self.base_url}: {e!r}") from e
        if health.status_code != 200:
            raise ServerStartError(f"{self.base_url}/health answered HTTP {health.status_code}")

    def _server_state(self) -> str:
        return f"attached server {self.base_url}"

    def close(self) -> None:
        """Close the HTTP client (an attached server is left running) and remove a work
        directory of our own. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._http.close()
        self._close_more()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _close_more(self) -> None:
        """What a subclass stops besides the HTTP client (a server it started)."""

    # -- HTTP helpers -------------------------------------------------------------------
    def _request(self, method: str, route: str, **kwargs: Any):
        self._check_usable()
        import httpx

        try:
            resp = self._http.request(method, route, **kwargs)
        except httpx.HTTPError as exc:
            raise VllmDriverError(
                f"{method} {route} failed: {exc!r}; {self._server_state()}"
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
        self,
        prompt: list[int] | str,
        max_tokens: int = 8,
        *,
        cache_salt: str | None = None,
        lora: bool = False,
    ) -> Generation:
        """One greedy generation of ``max_tokens`` tokens (EOS ignored) with logprobs:
        ``POST GENERATE_ROUTE`` with the subclass's body; ``cache_salt`` is the engine's
        cache namespace (a never-used one shares no cached KV: the byte oracle's cold
        prefill). Raises ``VllmDriverError`` when the answer lacks a field or its token
        and logprob lists differ in length; ``ValueError`` for ``lora`` (the HTTP drivers
        serve no adapter: docs/engines.md)."""
        if lora:
            raise ValueError("LoRA is not served over HTTP")
        body = self._generate_body(prompt, max_tokens, cache_salt)
        data = self._json_ok("POST", self.GENERATE_ROUTE, json=body)
        try:
            token_ids, logprobs, cached = self._parse_generation(data)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise VllmDriverError(
                f"unexpected {self.GENERATE_ROUTE} response: {json.dumps(data)[:2000]}"
            ) from exc
        if len(logprobs) != len(token_ids):
            raise VllmDriverError(f"{self.GENERATE_ROUTE}: tokens and logprobs differ in length")
        return Generation(token_ids, logprobs, cached)

    def _generate_body(
        self, prompt: list[int] | str, max_tokens: int, cache_salt: str | None
    ) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError

    def _parse_generation(
        self, data: Any
    ) -> tuple[tuple[int, ...], tuple[float, ...], int]:  # pragma: no cover
        """``(token_ids, logprobs, cached_tokens)`` from the answer; a missing field raises
        ``KeyError``/``IndexError``/``TypeError``/``ValueError``."""
        raise NotImplementedError


__all__ = ["LOOPBACK_HOSTS", "HttpDriverBase", "check_url"]
