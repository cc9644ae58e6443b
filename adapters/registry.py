"""Names for systems under test, as the CLI and the pytest plugin take them.

Engines: ``reference``, ``reference-closing`` (the other fail-closed branch), ``vllm``
(offline in-process vLLM on CPU), ``vllm-http`` (vLLM's OpenAI server on loopback), every
engine mutant and every correct design by its catalog name. Clients: ``reference``,
``never-flush``, every client mutant, or ``package.module:function`` for a user's own
resolver.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .clients import ReferenceClient, load_callable_client
from .designs import DESIGNS
from .mutants import MUTANTS
from .protocol import ClientAdapter, EngineAdapter
from .reference import ClosingEndpoint, InProcessAdapter, ReferenceEndpoint


def _lazy(module: str, attr: str, **kwargs: object) -> Callable[[], EngineAdapter]:
    def build() -> EngineAdapter:
        return getattr(importlib.import_module(module), attr)(**kwargs)

    return build


ENGINES: dict[str, Callable[[], EngineAdapter]] = {
    "reference": lambda: InProcessAdapter(ReferenceEndpoint, "reference"),
    "reference-closing": lambda: InProcessAdapter(ClosingEndpoint, "reference-closing"),
    "vllm": _lazy("kvfence.adapters.vllm_engine", "VllmAdapter", mode="offline"),
    "vllm-http": _lazy("kvfence.adapters.vllm_engine", "VllmAdapter", mode="http"),
}
for _m in MUTANTS:
    if _m.side == "engine":
        ENGINES[_m.name] = lambda m=_m: InProcessAdapter(m.build(), m.name)
for _d in DESIGNS:  # the correct designs of the pass matrix (adapters/designs.py)
    if _d.side == "engine" and _d.name not in ENGINES:
        ENGINES[_d.name] = lambda d=_d: InProcessAdapter(d.build(), d.name)

CLIENTS: dict[str, Callable[[], ClientAdapter]] = {"reference": ReferenceClient}
for _m in MUTANTS:
    if _m.side == "client":
        CLIENTS[_m.name] = _m.build


def engine(name: str) -> EngineAdapter:
    """The engine adapter called ``name``, or ``package.module:factory`` (a callable with
    no arguments returning an ``EngineAdapter``); ``ValueError`` says what is wrong."""
    if ":" in name:
        return _load_engine(name)
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    return ENGINES[name]()


def _load_engine(spec: str) -> EngineAdapter:
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
        adapter = factory()
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as e:
        raise ValueError(f"engine {spec!r}: cannot load: {type(e).__name__}: {e}") from None
    missing = [
        a for a in ("name", "capabilities", "start", "apply", "close") if not hasattr(adapter, a)
    ]
    if missing:
        raise ValueError(f"engine {spec!r}: not an EngineAdapter (missing {', '.join(missing)})")
    return adapter


def client(name: str) -> ClientAdapter:
    """The client adapter called ``name``, or a ``module:function`` resolver."""
    if ":" in name:
        return load_callable_client(name)
    if name not in CLIENTS:
        known = ", ".join(CLIENTS)
        raise ValueError(f"unknown client {name!r}; known: {known}, or package.module:function")
    return CLIENTS[name]()
