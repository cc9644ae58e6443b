"""Client resolvers: the reference, a plug-in wrapper for a user's own, and never-flush.

A resolver maps ``(policy, server info)`` to a ``Plan`` for one endpoint. The reference is
written the way an RL framework's sync code is (XoRL-style ``cache_invalidation_mode``),
independently of ``kvfence.model.client``, so that checking it against the spec means
something.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ..model.client import Plan
from ..model.state import Policy
from ..model.vocabulary import PauseMode
from .protocol import AdapterFailure

_WORDS = {"true": True, "1": True, "yes": True, "on": True}
_WORDS |= {"false": False, "0": False, "no": False, "off": False}


def _as_bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return value == 1
    if isinstance(value, str):
        return _WORDS.get(value.strip().lower())
    return None


class ReferenceClient:
    """A correct resolver (SC-4..SC-8)."""

    name = "reference"
    in_process = True
    """Pure Python: called directly (see ``InProcessAdapter.in_process``). A user's
    resolver (``CallableClient``) is not declared so, and keeps its worker thread."""

    def radix_enabled(self, info: Mapping[str, object] | None) -> bool | None:
        """``radix_cache_enabled`` wins, else ``disable_radix_cache`` inverted, else None."""
        if not isinstance(info, Mapping):
            return None
        enabled = _as_bool(info.get("radix_cache_enabled"))
        if enabled is not None:
            return enabled
        disabled = _as_bool(info.get("disable_radix_cache"))
        return None if disabled is None else not disabled

    def wants_flush(self, policy: Policy, info: Mapping[str, object] | None) -> bool:
        if policy.flush_cache is True or policy.mode.value == "flush":
            return True
        if policy.mode.value == "none":
            return False
        return self.radix_enabled(info) is not False

    def pause_mode(self, policy: Policy, flush: bool) -> PauseMode:
        if flush and policy.pause_mode is PauseMode.IN_PLACE:
            return PauseMode.RETRACT
        return policy.pause_mode

    def resolve(self, policy: Policy, info: Mapping[str, object] | None) -> Plan:
        flush = self.wants_flush(policy, info)
        return Plan(flush, self.pause_mode(policy, flush))


class NeverFlushClient(ReferenceClient):
    """Violates: CLI-001.

    Never asks for a flush: the default of many RL frameworks before their fix
    (huggingface/trl #3024, PF-01). On an engine with no guard its consequence is stale
    prefix reuse (INV-001), which is what a check against a real engine shows.
    """

    name = "never-flush"

    def wants_flush(self, policy: Policy, info: Mapping[str, object] | None) -> bool:
        return False


class BoolOnlyFallbackClient(ReferenceClient):
    """Keeps: CLI-001, CLI-002, CLI-006, CLI-013.

    The xorl-style resolver (the seed's fixed client, SC-7 in
    ../shared/cases/public-faults.md): reads ``radix_cache_enabled`` only when it is a real
    JSON boolean (an int, a string or null is "not reported"), else ``disable_radix_cache``
    the same way, inverted, else unknown (so ``auto`` flushes). Right on every shape an
    engine emits: SGLang's ``disable_radix_cache`` bool, vLLM's silence, a fork's
    ``radix_cache_enabled`` bool. On the strings ``"true"``/``"false"`` it flushes where an
    ``"false"`` would let it skip: an extra flush on a report that says off only in a word,
    which CLI-003 does not charge (``model.client.off_in_booleans``); on
    ``{"radix_cache_enabled": 1, "disable_radix_cache": true}``, a shape no engine emits, it
    follows the boolean field, which CLI-013 admits.
    """

    name = "bool-only-fallback"

    def radix_enabled(self, info: Mapping[str, object] | None) -> bool | None:
        if not isinstance(info, Mapping):
            return None
        enabled = info.get("radix_cache_enabled")
        if isinstance(enabled, bool):
            return enabled
        disabled = info.get("disable_radix_cache")
        return (not disabled) if isinstance(disabled, bool) else None


class CallableClient:
    """Wraps a user's resolver function so it runs under the same rules.

    ``fn(mode: str, flush_cache: bool | None, pause_mode: str, server_info: dict | None)``
    must return ``{"flush": bool, "pause_mode": str}`` or a ``(flush, pause_mode)`` pair.
    Load one with ``kvfence check --client my_pkg.sync:resolve``.
    """

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn = fn
        self.name = name

    def resolve(self, policy: Policy, info: Mapping[str, object] | None) -> Plan:
        raw = self.fn(
            policy.mode.value,
            policy.flush_cache,
            policy.pause_mode.value,
            None if info is None else dict(info),
        )
        if isinstance(raw, Plan):
            return raw
        if isinstance(raw, Mapping):
            flush, pause = raw.get("flush"), raw.get("pause_mode")
        elif isinstance(raw, (tuple, list)) and len(raw) == 2:
            flush, pause = raw
        else:
            raise AdapterFailure(f"{self.name} returned {raw!r}; expected (flush, pause_mode)")
        if not isinstance(flush, bool):
            raise AdapterFailure(f"{self.name} returned flush={flush!r}; expected a bool")
        try:
            return Plan(flush, PauseMode(pause))
        except ValueError:
            raise AdapterFailure(f"{self.name} returned pause_mode={pause!r}") from None


def load_callable_client(spec: str) -> CallableClient:
    """``"package.module:function"`` -> a ``CallableClient``; ``ValueError`` names what is
    wrong with ``spec``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"client {spec!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as e:  # ImportError, the module's SyntaxError, even SystemExit
        raise ValueError(
            f"client {spec!r}: cannot import {module_name!r}: {type(e).__name__}: {e}"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"client {spec!r}: {module_name} has no function {attr!r}")
    check_signature(fn, spec)
    return CallableClient(fn, spec)


def check_signature(fn: Callable[..., Any], spec: str) -> None:
    """``ValueError`` (a usage error, found before any run starts) unless ``fn`` can be
    called as ``fn(mode, flush_cache, pause_mode, server_info)``. A callable whose
    signature Python cannot read (some builtins) is let through."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind("auto", None, "retract", None)
    except TypeError as e:
        raise ValueError(
            f"client {spec!r}: {getattr(fn, '__name__', spec)}{signature} cannot be called as "
            f"fn(mode, flush_cache, pause_mode, server_info): {e}"
        ) from None
