"""Names for systems under test, as the CLI and the pytest plugin take them.

Engines: ``reference``, ``reference-closing`` (the other fail-closed branch), ``vllm``
(offline in-process vLLM on CPU), ``vllm-raw`` (the same engine without the adapter's
fail-closed guard and label updates), ``vllm-lora`` / ``vllm-lora-raw`` (the same, serving
one LoRA adapter reloaded by ``LoadLora``: each revision in its own directory / new bytes
over the old directory, vllm-project/vllm #42125), ``vllm-rl`` / ``vllm-rl-raw`` (the same,
with the RL lifecycle actions: publish a version, pause with clear_cache, the native
two-phase update and a restart oracle), ``vllm-http`` (vLLM's OpenAI server on
loopback), ``sglang-http`` (a user's SGLang server by URL), ``sglang`` / ``sglang@VERSION``
(upstream SGLang's scheduler control plane on CPU, optionally with a fork's ``overlay``),
every engine mutant and every correct design by its catalog name. Clients: ``reference``,
``never-flush``, every client mutant, or ``package.module:function`` for a user's own
resolver.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .clients import ReferenceClient, load_callable_client
from .designs import DESIGNS
from .mutants import MUTANTS
from .programs import load_program
from .protocol import ClientAdapter, EngineAdapter
from .reference import ClosingEndpoint, InProcessAdapter, ReferenceEndpoint


def _lazy(module: str, attr: str, **kwargs: object) -> Callable[..., EngineAdapter]:
    def build(**options: object) -> EngineAdapter:
        return getattr(importlib.import_module(module), attr)(**kwargs, **options)

    return build


ENGINES: dict[str, Callable[..., EngineAdapter]] = {
    "reference": lambda: InProcessAdapter(ReferenceEndpoint, "reference"),
    "reference-closing": lambda: InProcessAdapter(ClosingEndpoint, "reference-closing"),
    "vllm": _lazy("kvfence.adapters.vllm_engine", "VllmAdapter", mode="offline"),
    "vllm-http": _lazy("kvfence.adapters.vllm_engine", "VllmAdapter", mode="http"),
    "vllm-raw": _lazy(
        "kvfence.adapters.vllm_engine",
        "VllmAdapter",
        mode="offline",
        fail_closed=False,
        label_updates=False,
    ),
    # The same engines serving one LoRA adapter (LoadLora, ENG-007): a separate name
    # because the LoRA actions dilute the ci budget (docs/engines.md).
    "vllm-lora": _lazy(
        "kvfence.adapters.vllm_engine", "VllmAdapter", mode="offline", lora=True, name="vllm-lora"
    ),
    "vllm-lora-raw": _lazy(
        "kvfence.adapters.vllm_engine",
        "VllmAdapter",
        mode="offline",
        fail_closed=False,
        label_updates=False,
        lora=True,
        name="vllm-lora-raw",
    ),
    # The same engines with the RL lifecycle actions (publish, pause clear_cache, two-phase
    # update, restart oracle): a separate name because they dilute the ci budget.
    "vllm-rl": _lazy(
        "kvfence.adapters.vllm_engine", "VllmAdapter", mode="offline", rl=True, name="vllm-rl"
    ),
    "vllm-rl-raw": _lazy(
        "kvfence.adapters.vllm_engine",
        "VllmAdapter",
        mode="offline",
        fail_closed=False,
        label_updates=False,
        rl=True,
        name="vllm-rl-raw",
    ),
    "sglang-http": _lazy("kvfence.adapters.sglang_http", "SglangHttpAdapter"),
}
for _m in MUTANTS:
    if _m.side == "engine":
        ENGINES[_m.name] = lambda m=_m: InProcessAdapter(m.build(), m.name)
for _d in DESIGNS:  # the correct designs of the pass matrix (adapters/designs.py)
    if _d.side == "engine" and _d.name not in ENGINES:
        ENGINES[_d.name] = lambda d=_d: InProcessAdapter(d.build(), d.name)

_AFTER_VLLM = list(ENGINES).index("vllm-raw") + 1
ENGINE_NAMES: tuple[str, ...] = (
    *list(ENGINES)[:_AFTER_VLLM],
    "sglang",
    "sglang@VERSION",
    *list(ENGINES)[_AFTER_VLLM:],
)
"""Every engine name ``engine`` accepts, for help and messages: the in-process and vLLM
engines of ``ENGINES``, and ``sglang`` / ``sglang@VERSION``, which ``engine`` builds itself
(their options differ)."""

CLIENTS: dict[str, Callable[[], ClientAdapter]] = {"reference": ReferenceClient}
for _m in MUTANTS:
    if _m.side == "client":
        CLIENTS[_m.name] = _m.build
for _d in DESIGNS:  # correct client programs (adapters/programs.py)
    if _d.side == "client":
        CLIENTS[_d.name] = _d.build  # type: ignore[assignment]


VLLM_ENGINES = (
    "vllm",
    "vllm-raw",
    "vllm-lora",
    "vllm-lora-raw",
    "vllm-rl",
    "vllm-rl-raw",
    "vllm-http",
)
"""Engines that take the options of :func:`add_engine_options` (``log_dir`` always)."""

ATTACH_ENGINES = ("vllm-http", "sglang-http")
"""Engines that attach to a running server by ``--url`` (``sglang-http`` only that way)."""


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """The ``check`` flags that configure a real engine (attach mode of ``vllm-http``)."""
    g = parser.add_argument_group("real engine (vllm-http / sglang-http attach mode)")
    g.add_argument("--url", help="check the server running at this URL (loopback unless allowed)")
    g.add_argument(
        "--checkpoint",
        action="append",
        metavar="vN=PATH",
        help="checkpoint directory of version N, as the server sees it (v0 and v1 needed)",
    )
    g.add_argument("--served-model", help="the server's model name (default: its first)")
    g.add_argument(
        "--allow-remote", action="store_true", help="allow a --url host that is not loopback"
    )
    parser.add_argument("--overlay", help="sglang engines: a folder of fork files over SGLang's")


def parse_checkpoints(items: list[str]) -> dict[int, Path]:
    """``["v0=PATH", "v1=PATH"]`` -> ``{0: PATH, 1: PATH}``; ``ValueError`` names a bad one
    (not ``vN=PATH``, a repeated version, or a path that is not a directory here)."""
    out: dict[int, Path] = {}
    for item in items:
        version, sep, path = item.partition("=")
        digits = version[1:] if version.startswith("v") else version
        if not sep or not digits.isdigit() or not path:
            raise ValueError(f"--checkpoint {item!r} is not vN=PATH (e.g. v0=/models/step-0)")
        if int(digits) in out:
            raise ValueError(f"--checkpoint gives version {digits} twice")
        out[int(digits)] = Path(path)
    return out


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword options ``engine`` takes, from parsed ``check`` arguments."""
    options: dict[str, Any] = {"log_dir": getattr(args, "out", None)}
    if getattr(args, "url", None) is not None:
        options["url"] = args.url
    if getattr(args, "checkpoint", None):
        options["checkpoints"] = parse_checkpoints(args.checkpoint)
    if getattr(args, "served_model", None) is not None:
        options["served_model"] = args.served_model
    if getattr(args, "allow_remote", False):
        options["allow_remote"] = True
    if getattr(args, "overlay", None):
        options["overlay"] = args.overlay
    return options


def engine(name: str, **options: Any) -> EngineAdapter:
    """The engine adapter called ``name``, or ``package.module:factory`` (a callable with
    no arguments returning an ``EngineAdapter``); ``ValueError`` says what is wrong.

    ``options`` (from :func:`engine_options`): ``log_dir`` goes to the vLLM engines and is
    ignored by others; ``url``, ``checkpoints``, ``served_model``, ``allow_remote`` attach
    ``vllm-http`` or ``sglang-http`` to a running server and are a usage error for any
    other engine (``sglang-http`` needs them);
    ``overlay`` (a folder of fork files) is only for ``sglang`` / ``sglang@VERSION``."""
    log_dir = options.pop("log_dir", None)
    overlay = options.pop("overlay", None)
    options = {k: v for k, v in options.items() if v is not None}
    if name == "sglang" or name.startswith("sglang@"):
        if options:
            flags = ", ".join("--" + k.replace("_", "-").rstrip("s") for k in options)
            raise ValueError(f"{flags}: only for --engine vllm-http or sglang-http, not {name!r}")
        from .sglang_engine import DEFAULT_VERSION, SglangAdapter

        version = name.partition("@")[2] if "@" in name else DEFAULT_VERSION
        if not re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", version):
            raise ValueError(f"engine {name!r}: {version!r} is not an SGLang version number")
        return SglangAdapter(version=version, overlay=overlay)
    if overlay:
        raise ValueError(f"--overlay applies to the sglang engines, not {name!r}")
    if options and name not in ATTACH_ENGINES:
        flags = ", ".join("--" + k.replace("_", "-").rstrip("s") for k in options)
        raise ValueError(f"{flags}: only for --engine vllm-http or sglang-http, not {name!r}")
    if "checkpoints" in options and "url" not in options:
        raise ValueError("--checkpoint needs --url (attach to a running server)")
    if ":" in name:
        return _load_engine(name)
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; known: {', '.join(ENGINE_NAMES)}")
    if name == "sglang-http":
        if "url" not in options:
            raise ValueError(
                "--engine sglang-http attaches to a running SGLang server: give --url URL "
                "--checkpoint v0=PATH --checkpoint v1=PATH"
            )
        if log_dir is not None:
            options["log_dir"] = Path(log_dir)
        return ENGINES[name](**options)
    if name in VLLM_ENGINES:
        if log_dir is not None:
            options["log_dir"] = Path(log_dir)
        return ENGINES[name](**options)
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


PROGRAM_PREFIX = "program:"
"""``program:package.module:function`` names a user's client program (``--client-program``)."""


def client(name: str) -> ClientAdapter:
    """The client called ``name``: a registry name (a resolver or a program),
    ``program:package.module:function`` for a user's client program
    (``sync(endpoints, version, policy)``), or ``package.module:function`` for a user's
    resolver. ``ValueError`` says what is wrong."""
    if name.startswith(PROGRAM_PREFIX):
        return load_program(name.removeprefix(PROGRAM_PREFIX))  # type: ignore[return-value]
    if ":" in name:
        return load_callable_client(name)
    if name not in CLIENTS:
        known = ", ".join(CLIENTS)
        raise ValueError(f"unknown client {name!r}; known: {known}, or package.module:function")
    return CLIENTS[name]()
