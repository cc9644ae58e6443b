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

from .state import ServerInfo, server_info
from .vocabulary import CacheMode, PauseMode

REPORTS_WHEN_ON: tuple[ServerInfo, ...] = (
    server_info(radix_cache_enabled=True),
    server_info(),  # absent: unknown, so enabled (SC-5)
    server_info(radix_cache_enabled="maybe"),  # garbage: unknown
    None,  # unreachable
    server_info(radix_cache_enabled="true"),
    server_info(disable_radix_cache="0"),
    server_info(disable_radix_cache=0),
    server_info(disable_radix_cache="off", radix_cache_enabled="?"),
    server_info(radix_cache_enabled=None),  # null: unknown, not off
    server_info(radix_cache_enabled=""),  # empty: unknown, not off
    server_info(radix_cache_enabled=True, disable_radix_cache=True),  # enabled wins
    server_info(radix_cache_enabled=1, disable_radix_cache=True),  # enabled wins, as 0/1
)
"""What an endpoint with the radix cache on may honestly report (SC-7 shapes): every one
parses as on or unknown, so ``auto`` flushes."""

REPORTS_WHEN_OFF: tuple[ServerInfo, ...] = (
    server_info(radix_cache_enabled=False),
    server_info(disable_radix_cache="true"),
    server_info(disable_radix_cache=1),
    server_info(),
    None,
    server_info(radix_cache_enabled=0),
    server_info(radix_cache_enabled=False, disable_radix_cache=False),  # enabled wins
    server_info(radix_cache_enabled=0, disable_radix_cache=False),  # enabled wins, as 0/1
)
"""What an endpoint with the radix cache off may report (silence included: a client must
then flush anyway)."""

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


def plain_form(info: Mapping[str, object] | None) -> dict[str, object] | None:
    """The plainest report of what ``info`` says, when it needs parsing to say it: a real
    boolean ``radix_cache_enabled`` alone, or ``None`` when ``info`` is already plain or
    says nothing definite. A client right on the plain form but wrong on ``info`` made a
    parsing mistake (CLI-006), not a resolver one."""
    radix = parse_radix(info)
    if radix is None or not isinstance(info, Mapping):
        return None
    keys = {"radix_cache_enabled", "disable_radix_cache"} & set(info)
    if keys == {"radix_cache_enabled"} and isinstance(info["radix_cache_enabled"], bool):
        return None
    rest = {k: v for k, v in info.items() if k not in keys}
    return {**rest, "radix_cache_enabled": radix}


def pause_for(pause_mode: PauseMode, flush: bool) -> PauseMode:
    """CLI-007: the pause a plan with ``flush`` must use when ``pause_mode`` is configured."""
    return PauseMode.RETRACT if flush and pause_mode is PauseMode.IN_PLACE else pause_mode


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
    return Plan(flush, pause_for(pause_mode, flush), (("flush", why), ("pause_mode", "CLI-007")))


def judge_plan(
    expected: Plan,
    got: Plan,
    pause_mode: PauseMode,
    flush_if_retract: bool | None = None,
    flush_if_plain: bool | None = None,
) -> list[tuple[str, str, object, object]]:
    """How the plan of a client under test differs from the spec's, as
    ``(field, rule, expected, got)``.

    The pause is judged against the flush the *client* chose (CLI-007: a client that never
    flushes keeps its configured pause; retracting without a flush is safe and not
    charged). A flush dropped only because the pause is ``in_place`` (the client flushes
    the same endpoint when configured to retract: ``flush_if_retract``) is CLI-007's fault,
    PF-06; one the client gets right on the plain form of the same report
    (``flush_if_plain``, see ``plain_form``) is a parsing mistake, CLI-006; any other wrong
    flush is the rule that decided it (``expected.because``).
    """
    out: list[tuple[str, str, object, object]] = []
    if got.flush != expected.flush:
        rule = expected.rule_for("flush")
        if flush_if_plain == expected.flush:
            rule = "CLI-006"
        if expected.flush and pause_mode is PauseMode.IN_PLACE and flush_if_retract is True:
            rule = "CLI-007"
        out.append(("flush", rule, expected.flush, got.flush))
    want = pause_for(pause_mode, got.flush)
    safe_upgrade = not got.flush and got.pause_mode is PauseMode.RETRACT
    if got.pause_mode != want and not (safe_upgrade and pause_mode is PauseMode.IN_PLACE):
        out.append(("pause_mode", "CLI-007", want, got.pause_mode))
    return out
