"""The client resolver, as spec: what a sync asks of each endpoint.

``parse_radix`` reads an endpoint's server info (CLI-006); ``resolve_plan`` turns the
client's policy and that reading into a ``Plan`` (CLI-001..005, CLI-007). Each decision
carries the rule that made it, so a resolver under test that decides otherwise is reported
against that rule.

Mirrors the XoRL-style ``cache_invalidation_mode`` resolver and SGLang's
``/get_server_info`` fields ``radix_cache_enabled`` / ``disable_radix_cache``. The MUST rules
are judged on the shapes some engine emits (``REPORTS_WHEN_ON`` / ``REPORTS_WHEN_OFF``);
shapes none emits only by the SHOULD robustness rule CLI-013 (``judge_robust``).
"""

from __future__ import annotations

from collections.abc import Mapping

from attrs import frozen

from .rules import RuleId
from .state import ServerInfo, server_info
from .vocabulary import CacheMode, PauseMode

REPORTS_WHEN_ON: tuple[ServerInfo, ...] = (
    # SGLang: /get_server_info is the server args as JSON; disable_radix_cache is a bool
    # (python/sglang/srt/server_args.py ServerArgs.disable_radix_cache,
    # entrypoints/http_server.py get_server_info)
    server_info(disable_radix_cache=False),
    # vLLM: its server info carries neither field (vllm/entrypoints/openai/api_server.py
    # /server_info reports the vllm config, no radix flag): unknown, so enabled (SC-5)
    server_info(),
    None,  # a fetch that fails (connection refused, a timeout, a 5xx, a body not JSON)
    # a fork that reports its own bool (togethercomputer/xorl-sglang, SC-7)
    server_info(radix_cache_enabled=True),
    # strings "true"/"false": a server args field echoed from a CLI flag or an env value
    server_info(radix_cache_enabled="true"),
    server_info(disable_radix_cache="false"),
    server_info(radix_cache_enabled=None),  # null: an Optional field left unset; unknown
    server_info(disable_radix_cache=None),
    server_info(radix_cache_enabled="maybe"),  # unparseable value: unknown
    server_info(radix_cache_enabled=""),  # empty: unknown, not off
)
"""What an endpoint with the radix cache on reports, in the shapes some engine emits (the
producer of each is named beside it): every one parses as on or unknown, so ``auto``
flushes. The MUST client rules (CLI-001, CLI-002, CLI-006) are judged on these only."""

REPORTS_WHEN_OFF: tuple[ServerInfo, ...] = (
    server_info(disable_radix_cache=True),  # SGLang --disable-radix-cache
    server_info(radix_cache_enabled=False),  # a fork's own bool
    server_info(radix_cache_enabled="false"),  # strings, as above
    server_info(disable_radix_cache="true"),
    server_info(),  # vLLM: silent
    None,  # a fetch that fails
    server_info(disable_radix_cache=None),  # null
)
"""What an endpoint with the radix cache off reports, in producer shapes (silence included:
a client must then flush anyway)."""

ROBUSTNESS_SHAPES: tuple[ServerInfo, ...] = (
    server_info(radix_cache_enabled=1),
    server_info(radix_cache_enabled=0),
    server_info(disable_radix_cache=1),
    server_info(disable_radix_cache=0),
    server_info(disable_radix_cache="0"),
    server_info(disable_radix_cache="off", radix_cache_enabled="?"),
    server_info(radix_cache_enabled=True, disable_radix_cache=True),  # contradictory
    server_info(radix_cache_enabled=False, disable_radix_cache=False),  # contradictory
    server_info(radix_cache_enabled=1, disable_radix_cache=True),
    server_info(radix_cache_enabled=0, disable_radix_cache=False),
)
"""Shapes no engine is known to emit: ints for a boolean field, boolean words other than
``"true"``/``"false"``, contradictory fields. Only CLI-013 (SHOULD) judges a client on them:
its plan must be one that some admissible reading of the report gives
(``admissible_radix``); they are never drawn as an endpoint's report."""

RADIX_FIELDS = ("radix_cache_enabled", "disable_radix_cache")

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


def admissible_radix(info: Mapping[str, object] | None) -> frozenset[bool | None]:
    """Every radix state a careful reader may take ``info`` to report (CLI-013): each of
    ``radix_cache_enabled`` / ``disable_radix_cache`` either read as the boolean it spells
    (``parse_bool``: 0/1 and words included; ``disable_radix_cache`` inverted) or ignored as
    not reported, either field winning when both are read; ``None`` (unknown) when neither
    is. On a producer shape the spec's own reading (``parse_radix``) is among them."""
    if not isinstance(info, Mapping):
        return frozenset({None})
    enabled = parse_bool(info.get("radix_cache_enabled"))
    disabled = parse_bool(info.get("disable_radix_cache"))
    out: set[bool | None] = {None}
    if enabled is not None:
        out.add(enabled)
    if disabled is not None:
        out.add(not disabled)
    return frozenset(out)


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
        return dict(self.because).get(field_name, RuleId.CLI_006)


def plain_form(info: Mapping[str, object] | None) -> dict[str, object] | None:
    """The plainest report of what ``info`` says, when it needs parsing to say it: a real
    boolean ``radix_cache_enabled`` alone; for a report that says nothing definite (null,
    an unparseable value), the same body with neither radix field (vLLM's silence);
    ``None`` when ``info`` is already plain or was not fetched. A client right on the plain
    form but wrong on ``info`` made a parsing mistake (CLI-006), not a resolver one."""
    if not isinstance(info, Mapping):
        return None
    keys = set(RADIX_FIELDS) & set(info)
    rest = {k: v for k, v in info.items() if k not in keys}
    radix = parse_radix(info)
    if radix is None:
        return rest if keys else None
    if keys == {"radix_cache_enabled"} and isinstance(info["radix_cache_enabled"], bool):
        return None
    return {**rest, "radix_cache_enabled": radix}


def off_in_booleans(info: Mapping[str, object] | None) -> bool:
    """Whether ``info`` reports the radix cache off in JSON booleans alone:
    ``radix_cache_enabled`` false, or (it not a boolean) ``disable_radix_cache`` true. A
    report that says off only in a word (``"false"``) may be read as not reported by a
    client that trusts real booleans only, so the flush it then sends is not charged
    (CLI-003)."""
    if not isinstance(info, Mapping):
        return False
    enabled, disabled = info.get("radix_cache_enabled"), info.get("disable_radix_cache")
    if isinstance(enabled, bool):
        return not enabled
    return disabled is True


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
    return plan_for_radix(mode, flush_cache, pause_mode, parse_radix(info))


def plan_for_radix(
    mode: CacheMode, flush_cache: bool | None, pause_mode: PauseMode, radix: bool | None
) -> Plan:
    """The plan the spec requires for one endpoint whose radix state reads as ``radix``
    (``None``: unknown)."""
    if flush_cache is True or mode is CacheMode.FLUSH:
        flush, why = True, RuleId.CLI_004
    elif mode is CacheMode.NONE:
        flush, why = False, RuleId.CLI_005
    elif radix is None:
        flush, why = True, RuleId.CLI_002
    elif radix:
        flush, why = True, RuleId.CLI_001
    else:
        flush, why = False, RuleId.CLI_003
    return Plan(
        flush, pause_for(pause_mode, flush), (("flush", why), ("pause_mode", RuleId.CLI_007))
    )


def judge_robust(
    mode: CacheMode,
    flush_cache: bool | None,
    pause_mode: PauseMode,
    info: Mapping[str, object] | None,
    got: Plan,
) -> list[tuple[str, str, object, object]]:
    """CLI-013 on a shape no producer emits (``ROBUSTNESS_SHAPES``), as
    ``(field, rule, expected, got)``: a plan that skips the flush is charged unless some
    admissible reading of ``info`` (``admissible_radix``) makes the spec skip it too. An
    extra flush, and the pause, are not judged on these shapes."""
    if got.flush:
        return []
    readings = admissible_radix(info)
    if any(not plan_for_radix(mode, flush_cache, pause_mode, r).flush for r in readings):
        return []
    return [("flush", RuleId.CLI_013, True, False)]


def judge_plan(
    expected: Plan,
    got: Plan,
    pause_mode: PauseMode,
    flush_if_retract: bool | None = None,
    flush_if_plain: bool | None = None,
    extra_flush_charged: bool = True,
) -> list[tuple[str, str, object, object]]:
    """How the plan of a client under test differs from the spec's, as
    ``(field, rule, expected, got)``.

    The pause is judged against the flush the *client* chose (CLI-007: a client that never
    flushes keeps its configured pause; retracting without a flush is safe and not
    charged). A flush dropped only because the pause is ``in_place`` (the client flushes
    the same endpoint when configured to retract: ``flush_if_retract``) is CLI-007's fault,
    PF-06; a flush skipped that the client does not skip on the plain form of the same
    report (``flush_if_plain``, see ``plain_form``) is a parsing mistake, CLI-006; any other
    wrong flush (an extra flush from a misread report included) is the rule that decided it
    (``expected.because``). An extra flush where the report says off only in words
    (``extra_flush_charged`` false, see ``off_in_booleans``) is no fault.
    """
    out: list[tuple[str, str, object, object]] = []
    excused = got.flush and not expected.flush and not extra_flush_charged
    if got.flush != expected.flush and not excused:
        rule = expected.rule_for("flush")
        if expected.flush and flush_if_plain is True:
            rule = RuleId.CLI_006
        if expected.flush and pause_mode is PauseMode.IN_PLACE and flush_if_retract is True:
            rule = RuleId.CLI_007
        out.append(("flush", rule, expected.flush, got.flush))
    want = pause_for(pause_mode, got.flush)
    safe_upgrade = not got.flush and got.pause_mode is PauseMode.RETRACT
    if got.pause_mode != want and not (safe_upgrade and pause_mode is PauseMode.IN_PLACE):
        out.append(("pause_mode", RuleId.CLI_007, want, got.pause_mode))
    return out
