"""Names for systems under test, as the CLI and the pytest plugin take them.

Engines: ``reference``, ``reference-closing`` (the other fail-closed branch), ``vllm``
(offline in-process vLLM on CPU), ``vllm-raw`` (the same engine without the adapter's
fail-closed guard and label updates); both serve one LoRA adapter reloaded by
``LoadLora`` (each revision in its own directory / on ``vllm-raw`` new bytes over the old
directory, vllm-project/vllm #42125) and run the RL lifecycle actions (publish a version,
pause with clear_cache, the native two-phase update and a restart oracle);
``vllm-lora``/``vllm-rl`` and their ``-raw`` twins are aliases of them (``ALIASES``, kept
for one release), ``vllm-http`` (vLLM's OpenAI server on
loopback), ``sglang-http`` (a user's SGLang server by URL), ``sglang`` / ``sglang@VERSION``
(upstream SGLang's scheduler control plane on CPU, optionally with a fork's ``overlay``),
every engine mutant and every correct design by its catalog name. Clients: ``reference``,
``never-flush``, every client mutant, or ``package.module:function`` for a user's own
resolver.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
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


def _ranked() -> type:
    from .ranks import RankedEndpoint

    return RankedEndpoint


def _lazy(module: str, attr: str, **kwargs: object) -> Callable[..., EngineAdapter]:
    def build(**options: object) -> EngineAdapter:
        return getattr(importlib.import_module(module), attr)(**kwargs, **options)

    return build


ENGINES: dict[str, Callable[..., EngineAdapter]] = {
    "reference": lambda: InProcessAdapter(ReferenceEndpoint, "reference"),
    "reference-closing": lambda: InProcessAdapter(ClosingEndpoint, "reference-closing"),
    # the reference DP controller over reference schedulers, on endpoints of two ranks
    "reference-ranks": lambda: InProcessAdapter(_ranked(), "reference-ranks"),
    "vllm": _lazy("kvfence.adapters.vllm_engine", "VllmAdapter", mode="offline"),
    "vllm-http": _lazy("kvfence.adapters.vllm_engine", "VllmAdapter", mode="http"),
    "vllm-raw": _lazy(
        "kvfence.adapters.vllm_engine",
        "VllmAdapter",
        mode="offline",
        fail_closed=False,
        label_updates=False,
    ),
    # Aliases kept for one release: ``vllm`` and ``vllm-raw`` now declare LoRA and the RL
    # lifecycle actions themselves (ALIASES; docs/engines.md).
    "vllm-lora": _lazy("kvfence.adapters.vllm_engine", "VllmAdapter", mode="offline"),
    "vllm-lora-raw": _lazy(
        "kvfence.adapters.vllm_engine",
        "VllmAdapter",
        mode="offline",
        fail_closed=False,
        label_updates=False,
    ),
    "vllm-rl": _lazy("kvfence.adapters.vllm_engine", "VllmAdapter", mode="offline"),
    "vllm-rl-raw": _lazy(
        "kvfence.adapters.vllm_engine",
        "VllmAdapter",
        mode="offline",
        fail_closed=False,
        label_updates=False,
    ),
    "sglang-http": _lazy("kvfence.adapters.sglang_http", "SglangHttpAdapter"),
}
for _m in MUTANTS:
    if _m.side == "engine":
        ENGINES[_m.name] = lambda m=_m: InProcessAdapter(m.build(), m.name)
for _d in DESIGNS:  # the correct designs of the pass matrix (adapters/designs.py)
    if _d.side == "engine" and _d.name not in ENGINES:
        ENGINES[_d.name] = lambda d=_d: InProcessAdapter(d.build(), d.name)

ALIASES: dict[str, str] = {
    "vllm-lora": "vllm",
    "vllm-lora-raw": "vllm-raw",
    "vllm-rl": "vllm",
    "vllm-rl-raw": "vllm-raw",
}
"""Old engine names and the one each now builds (the same adapter, under that name): kept
for one release, when ``vllm`` declared neither LoRA nor the RL lifecycle actions."""

VLLM_ENGINES_NAMES = tuple(n for n in ENGINES if n.startswith("vllm"))

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

KINDS = ("reference", "real", "mutant", "design")
"""The kinds of engine and client names: the reference systems, real engines (vLLM,
SGLang, a server by URL), the catalog's mutants (faulty systems from public bug reports)
and its correct designs."""

KIND_PREFIXES = ("mutant", "design")
"""``mutant:NAME`` and ``design:NAME`` name a catalog entry with its kind visible; the
bare ``NAME`` is accepted too."""

REAL_ENGINES: tuple[str, ...] = (*VLLM_ENGINES_NAMES, "sglang", "sglang@VERSION", "sglang-http")

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
    parser.add_argument(
        "--optimize",
        action="store_true",
        help="sglang engines: run the scheduler hosts under python -O (asserts removed)",
    )
    parser.add_argument(
        "--window",
        action="store_true",
        help="sglang engines: draw two-phase update windows, through the code's own window "
        "(a fork's prepare/complete, else SGLang's begin/end_weight_update session)",
    )
    parser.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="sglang engines: data-parallel ranks per endpoint, each a real scheduler behind "
        "SGLang's own fan-in (2 checks RNK-001..003)",
    )


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
    if getattr(args, "optimize", False):
        options["optimize"] = True
    if getattr(args, "window", False):
        options["window"] = True
    if getattr(args, "ranks", 1) not in (None, 1):
        options["ranks"] = args.ranks
    return options


def _public_url(url: str) -> str:
    """``url`` without what may be secret: user and password, query and fragment."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def system(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """How to reach the engine ``name`` built with ``options`` again, as a trace header
    records it (``system``): ``engine`` as given (a ``module:factory`` verbatim), and
    when set ``url`` (no user, password or query), ``checkpoints`` (``{"v0": PATH}``),
    ``served_model``, ``overlay``, ``optimize``, ``window``, ``ranks`` and
    ``sglang_version``. Nothing secret is kept."""
    out: dict[str, Any] = {"engine": name}
    if options.get("url") is not None:
        out["url"] = _public_url(str(options["url"]))
    if options.get("checkpoints"):
        out["checkpoints"] = {f"v{v}": str(p) for v, p in sorted(options["checkpoints"].items())}
    if options.get("served_model") is not None:
        out["served_model"] = str(options["served_model"])
    if options.get("overlay"):
        out["overlay"] = str(options["overlay"])
    if options.get("optimize"):
        out["optimize"] = True
    if options.get("window"):
        out["window"] = True
    if options.get("ranks", 1) != 1:
        out["ranks"] = options["ranks"]
    bare = _bare(name)
    if bare == "sglang" or bare.startswith("sglang@"):
        from .sglang_engine import DEFAULT_VERSION

        out["sglang_version"] = bare.partition("@")[2] or DEFAULT_VERSION
    return out


def system_options(recorded: dict[str, Any]) -> dict[str, Any]:
    """The ``engine`` options a trace header's ``system`` records (``system``'s inverse,
    less the engine name); ``ValueError`` names a field of the wrong shape."""
    out: dict[str, Any] = {}
    for key in ("url", "served_model", "overlay"):
        if key in recorded:
            if not isinstance(recorded[key], str):
                raise ValueError(f"the trace header's system.{key} is not text")
            out[key] = recorded[key]
    if "checkpoints" in recorded:
        items = recorded["checkpoints"]
        if not isinstance(items, dict) or not all(isinstance(v, str) for v in items.values()):
            raise ValueError("the trace header's system.checkpoints is not {vN: PATH}")
        out["checkpoints"] = parse_checkpoints([f"{k}={v}" for k, v in items.items()])
    for key in ("optimize", "window"):
        if key in recorded:
            if not isinstance(recorded[key], bool):
                raise ValueError(f"the trace header's system.{key} is not true or false")
            out[key] = recorded[key]
    if "ranks" in recorded:
        if type(recorded["ranks"]) is not int or recorded["ranks"] < 1:
            raise ValueError("the trace header's system.ranks is not a positive whole number")
        out["ranks"] = recorded["ranks"]
    return out


def engine(name: str, **options: Any) -> EngineAdapter:
    """The engine adapter called ``name``, with ``system(name, options)`` recorded on it as
    ``kvfence_system`` where the object allows (the counterexample's header carries it);
    see ``build_engine`` for the names and options."""
    recorded = system(name, options)
    adapter = build_engine(name, **options)
    # An adapter with __slots__ or a frozen one keeps none: its trace names it alone.
    with contextlib.suppress(AttributeError, TypeError):
        adapter.kvfence_system = recorded  # type: ignore[attr-defined]
    return adapter


def build_engine(name: str, **options: Any) -> EngineAdapter:
    """The engine adapter called ``name``, or ``package.module:factory`` (a callable with
    no arguments returning an ``EngineAdapter``); ``ValueError`` says what is wrong.

    ``options`` (from :func:`engine_options`): ``log_dir`` goes to the vLLM engines and is
    ignored by others; ``url``, ``checkpoints``, ``served_model``, ``allow_remote`` attach
    ``vllm-http`` or ``sglang-http`` to a running server and are a usage error for any
    other engine (``sglang-http`` needs them);
    ``overlay`` (a folder of fork files), ``optimize`` (the hosts under ``python -O``),
    ``window`` (two-phase update windows drawn) and ``ranks`` (data-parallel ranks per
    endpoint) are only for ``sglang`` / ``sglang@VERSION``."""
    log_dir = options.pop("log_dir", None)
    overlay = options.pop("overlay", None)
    optimize = bool(options.pop("optimize", False))
    window = bool(options.pop("window", False))
    ranks = int(options.pop("ranks", 1) or 1)
    options = {k: v for k, v in options.items() if v is not None}
    if name.partition(":")[0] in KIND_PREFIXES:
        name = _kind_name(name, "engine")
    if name == "sglang" or name.startswith("sglang@"):
        if options:
            flags = ", ".join("--" + k.replace("_", "-").rstrip("s") for k in options)
            raise ValueError(f"{flags}: only for --engine vllm-http or sglang-http, not {name!r}")
        from .sglang_engine import DEFAULT_VERSION, SglangAdapter

        version = name.partition("@")[2] if "@" in name else DEFAULT_VERSION
        if not re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", version):
            raise ValueError(f"engine {name!r}: {version!r} is not an SGLang version number")
        adapter = SglangAdapter(
            version=version, overlay=overlay, optimize=optimize, window=window, ranks=ranks
        )
        try:
            adapter.sglang_path()  # not installed: a usage error naming the install command
        except Exception as e:
            raise ValueError(f"engine {name!r}: {e}") from None
        return adapter
    if overlay:
        raise ValueError(f"--overlay applies to the sglang engines, not {name!r}")
    if optimize:
        raise ValueError(f"--optimize applies to the sglang engines, not {name!r}")
    if window:
        raise ValueError(f"--window applies to the sglang engines, not {name!r}")
    if ranks != 1:
        raise ValueError(f"--ranks applies to the sglang engines, not {name!r}")
    if options and name not in ATTACH_ENGINES:
        flags = ", ".join("--" + k.replace("_", "-").rstrip("s") for k in options)
        raise ValueError(f"{flags}: only for --engine vllm-http or sglang-http, not {name!r}")
    if "checkpoints" in options and "url" not in options:
        raise ValueError("--checkpoint needs --url (attach to a running server)")
    if ":" in name:
        return _load_engine(name)
    if name not in ENGINES:
        known = [*ENGINE_NAMES, *(f"{k}:{n}" for k in KIND_PREFIXES for n in ENGINES)]
        hint = did_you_mean(name, [n for n in ENGINE_NAMES if n != "sglang@VERSION"]) or (
            did_you_mean(name, known)
        )
        raise ValueError(
            f"unknown engine {name!r}{hint} (`kvfence engines` lists them all; "
            "or package.module:factory)"
        )
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


def kind_of(name: str, side: str = "engine") -> str:
    """``reference``, ``real``, ``mutant`` or ``design`` for a registry name of ``side``
    (``engine`` or ``client``); ``ValueError`` for a name the registry does not hold."""
    bare = _bare(name)
    if bare in ("reference", "reference-closing"):
        return "reference"
    if side == "engine" and (bare in REAL_ENGINES or bare.startswith("sglang@")):
        return "real"
    if bare in _MUTANT_NAMES.get(side, ()):
        return "mutant"
    if bare in _DESIGN_NAMES.get(side, ()):
        return "design"
    raise ValueError(f"unknown {side} {name!r}")


_MUTANT_NAMES = {s: {m.name for m in MUTANTS if m.side == s} for s in ("engine", "client")}
_DESIGN_NAMES = {s: {d.name for d in DESIGNS if d.side == s} for s in ("engine", "client")}


def _bare(name: str) -> str:
    """``mutant:NAME`` / ``design:NAME`` -> ``NAME``; any other name unchanged."""
    kind, sep, rest = name.partition(":")
    return rest if sep and kind in KIND_PREFIXES and rest else name


def _kind_name(name: str, side: str) -> str:
    """A ``mutant:NAME`` / ``design:NAME`` (or ``design:CD-NN``) as its bare registry name,
    checking the kind;
    ``ValueError`` when the catalog holds no such entry of that kind."""
    kind, _, bare = name.partition(":")
    names = (_MUTANT_NAMES if kind == "mutant" else _DESIGN_NAMES).get(side, set())
    if kind == "design":  # a design by its case too: design:CD-06
        bare = next((d.name for d in DESIGNS if d.case == bare and d.side == side), bare)
    if bare not in names:
        raise ValueError(f"no {kind} {side} {bare!r}" + did_you_mean(bare, sorted(names), kind))
    return bare


def did_you_mean(name: str, known: list[str] | tuple[str, ...], prefix: str = "") -> str:
    """``"; did you mean 'vllm'?"`` for the names of ``known`` close to ``name``
    (``difflib``), with ``prefix:`` when given; ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    if not close:
        return ""
    shown = [f"{prefix}:{c}" if prefix else c for c in close]
    return "; did you mean " + " or ".join(repr(c) for c in shown) + "?"


def _summary(doc: str) -> str:
    """The first sentence of a catalog docstring after its ``Violates:`` / ``Keeps:``
    line, on one line."""
    lines = doc.splitlines()
    if lines and lines[0].startswith(("Violates:", "Keeps:")):
        lines = lines[1:]
    text = " ".join(" ".join(lines).split())
    return text.split(". ")[0].split(": ")[0].rstrip(".") if text else ""


REAL_SUMMARIES = {
    "vllm": "vLLM offline in-process on CPU, every capability (LoRA, publish, two-phase, "
    "restart oracle, derived), with the adapter's fail-closed guard",
    "vllm-raw": "the same vLLM without the adapter's guard and label updates",
    "vllm-lora": "alias of vllm (kept for one release)",
    "vllm-lora-raw": "alias of vllm-raw (kept for one release)",
    "vllm-rl": "alias of vllm (kept for one release)",
    "vllm-rl-raw": "alias of vllm-raw (kept for one release)",
    "vllm-http": "vLLM's OpenAI server (started by kvfence, or --url to attach)",
    "sglang": "upstream SGLang's scheduler control plane on CPU (default version)",
    "sglang@VERSION": "the same, another installed SGLang release (scripts/install-sglang.sh)",
    "sglang-http": "a running SGLang server, attached by --url and --checkpoint",
}


def catalog(side: str = "engine") -> list[tuple[str, str, str]]:
    """Every name of ``side`` (``engine`` or ``client``) as ``(address, kind, summary)``:
    references and real engines by their name, catalog entries as ``mutant:NAME`` /
    ``design:NAME`` with the rule a mutant breaks or the rules a design keeps."""
    out: list[tuple[str, str, str]] = []
    if side == "engine":
        out.append(("reference", "reference", "the reference engine (the spec's own choice)"))
        out.append(("reference-closing", "reference", "the reference, fail-closed branch"))
        out += [(n, "real", REAL_SUMMARIES.get(n, "")) for n in REAL_ENGINES]
    else:
        out.append(("reference", "reference", "the reference resolver"))
    for m in MUTANTS:
        if m.side == side:
            out.append((f"mutant:{m.name}", "mutant", f"breaks {m.rule}: {_summary(m.doc)}"))
    for d in DESIGNS:
        if d.side == side and d.name not in ("reference", "reference-closing"):
            keeps = ", ".join(d.keeps)
            what = f"{d.case + ' ' if d.case else ''}keeps {keeps}: {_summary(d.doc)}"
            out.append((f"design:{d.name}", "design", what))
    return out


PROGRAM_PREFIX = "program:"
"""``program:package.module:function`` names a user's client program (``--client-program``)."""


def client(name: str) -> ClientAdapter:
    """``build_client(name)``, with ``name`` as given recorded on it as ``kvfence_name``
    where the object allows (the counterexample's header carries it)."""
    adapter = build_client(name)
    with contextlib.suppress(AttributeError, TypeError):
        adapter.kvfence_name = name  # type: ignore[attr-defined]
    return adapter


def build_client(name: str) -> ClientAdapter:
    """The client called ``name``: a registry name (a resolver or a program),
    ``program:package.module:function`` for a user's client program
    (``sync(endpoints, version, policy)``), or ``package.module:function`` for a user's
    resolver. ``ValueError`` says what is wrong."""
    if name.startswith(PROGRAM_PREFIX):
        return load_program(name.removeprefix(PROGRAM_PREFIX))  # type: ignore[return-value]
    if name.partition(":")[0] in KIND_PREFIXES:
        name = _kind_name(name, "client")
    if ":" in name:
        return load_callable_client(name)
    if name not in CLIENTS:
        hint = did_you_mean(name, list(CLIENTS))
        raise ValueError(
            f"unknown client {name!r}{hint} (`kvfence engines --side client` lists them; "
            "or package.module:function)"
        )
    return CLIENTS[name]()
