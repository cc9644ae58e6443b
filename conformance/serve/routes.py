"""The route table's entry: one engine route, the model action it maps to, and its handler.

Each API has its own table (``sglang.ROUTES``, ``vllm.ROUTES``); an entry holds the
function that answers it, so the table is the one place a route meets the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from attrs import frozen

if TYPE_CHECKING:
    from .session import Session

Handler = Callable[["Session", dict[str, Any], dict[str, list[str]], dict[str, Any]], tuple]
"""``handler(session, body, query, entry) -> (status, payload)``: ``body`` the request's JSON
object, ``query`` its parsed query string, ``entry`` the traffic-log entry it fills in;
``payload`` is JSON, raw ``bytes`` (a text answer) or ``None``."""


@frozen
class Route:
    """One engine route: ``api``, HTTP ``methods``, ``path``, the model ``action`` it maps
    to (``""``: a probe or a no-op, not stepped), its ``handler``, ``pending``: the action a
    form of it waits for (``PENDING``), and ``noop``: why a route that changes the engine
    has no model action (answered as the engine would, logged)."""

    api: str
    methods: tuple[str, ...]
    path: str
    action: str
    handler: Handler
    pending: str = ""
    noop: str = ""


PENDING: dict[str, str] = {
    "LoadLora(second adapter)": "a LoRA adapter loaded under a second name (vLLM "
    "/v1/load_lora_adapter, SGLang /load_lora_adapter): the model has one adapter per "
    "endpoint",
    "FlushCache(preempt)": "vLLM /reset_prefix_cache?reset_running_requests=true: a reset "
    "that preempts the running (and keep-paused) requests so that their blocks are freed",
    "ServeRequest(namespace)": "a reused extra_key (SGLang /generate) or cache_salt (vLLM "
    "/v1/completions): namespaced requests on a serve endpoint",
}
"""Forms of a route answered 501, by the model action they wait for (the integrator's list).
Every route of the tables is otherwise answered for real."""
