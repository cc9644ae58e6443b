"""The client resolver, as spec: what a sync asks of each endpoint.

``parse_radix`` reads an endpoint's server info (CLI-006); ``resolve_plan`` turns the
client's policy and that reading into a ``Plan`` (CLI-001..005, CLI-007). Each decision
carries the rule that made it, so a resolver under test that decides otherwise is reported
against that rule.

Mirrors the XoRL-style ``cache_invalidation_mode`` resolver and SGLang's
``/get_server_info`` fields ``radix_cache_enabled`` / ``disable_radix_cache``.
"""

from __future__ import annotations

from collections.abc import Mapping

from attrs import frozen

from .vocabulary import CacheMode, PauseMode

TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
FALSE_WORDS = frozenset({"false", "0", "no", "off"})


def parse_bool(value: object) -> bool | None:
    """A boolean as servers send it: ``True``/``False``, ``0``/``1``, or one of
    ``true/false/1/0/yes/no/on/off`` in any case with surrounding blanks. Anything else
    (``2``, ``"maybe"``, ``None``, a list) is ``None``: unknown."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
    return None


def parse_radix(info: Mapping[str, object] | None) -> bool | None:
    """CLI-006: the radix state an endpoint reports; ``None`` when unknown.

    ``info`` is the decoded ``/get_server_info`` body, or ``None`` when it could not be
    fetched. ``radix_cache_enabled`` wins when it parses; else ``disable_radix_cache``,
    inverted; else unknown. A body that is not a mapping is unknown.
    """
    if not isinstance(info, Mapping):
        return None
    enabled = parse_bool(info.get("radix_cache_enabled"))
    if enabled is not None:
        return enabled
    disabled = parse_bool(info.get("disable_radix_cache"))
    if disabled is not None:
        return not disabled
    return None


@frozen
class Plan:
    """What a sync asks of one endpoint.

    ``flush``: send ``flush_cache=True`` with the update. ``pause_mode``: how to pause
    before it. ``because``: ``{"flush": rule_id, "pause_mode": rule_id}``, the rule that
    decided each field (only the model's plans carry it; a resolver under test leaves it
    empty).
    """

    flush: bool
    pause_mode: PauseMode
    because: tuple[tuple[str, str], ...] = ()

    def rule_for(self, field_name: str) -> str:
        return dict(self.because).get(field_name, "CLI-006")


def resolve_plan(
    mode: CacheMode,
    flush_cache: bool | None,
    pause_mode: PauseMode,
    info: Mapping[str, object] | None,
) -> Plan:
    """The plan the spec requires for one endpoint.

    ``mode``/``flush_cache``/``pause_mode``: the client policy. ``info``: the endpoint's
    server info, or ``None`` if unreachable.
    """
    if flush_cache is True or mode is CacheMode.FLUSH:
        flush, why = True, "CLI-004"
    elif mode is CacheMode.NONE:
        flush, why = False, "CLI-005"
    else:
        radix = parse_radix(info)
        if radix is None:
            flush, why = True, "CLI-002"
        elif radix:
            flush, why = True, "CLI-001"
        else:
            flush, why = False, "CLI-003"
    pause = PauseMode.RETRACT if flush and pause_mode is PauseMode.IN_PLACE else pause_mode
    return Plan(flush, pause, (("flush", why), ("pause_mode", "CLI-007" if flush else why)))
