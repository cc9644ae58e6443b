"""The client resolver asked for its plan on every configuration (CLI-001..007).

``client_table`` asks the client under test for its plan on every policy and every
server-info shape and judges each against the spec's (``model.client``); ``resolve``
makes one such call (a refusal comes back as its message), ``check_plan`` rejects an
answer that is not a well-typed ``Plan`` (ADP-002).
"""

from __future__ import annotations

from itertools import product
from typing import Any

from attrs import evolve

from ..adapters.protocol import ClientAdapter
from ..model.checks import Violation
from ..model.client import (
    REPORTS_WHEN_OFF,
    REPORTS_WHEN_ON,
    ROBUSTNESS_SHAPES,
    Plan,
    judge_plan,
    judge_robust,
    off_in_booleans,
    plain_form,
    resolve_plan,
)
from ..model.rules import RuleId
from ..model.state import Policy
from ..model.vocabulary import CacheMode, PauseMode
from .calls import Timing, call_with_timeout, is_direct
from .errors import AdapterError
from .record import Recorder

TABLE_ONLY: frozenset[RuleId] = frozenset({RuleId.CLI_013})
"""The rules this table alone judges: CLI-013 asks about server-info shapes no engine
emits (``ROBUSTNESS_SHAPES``), so no run of the stateful search or the battery meets
them, and a check focused on one ends after the table."""


def resolve(
    client: ClientAdapter, policy: Policy, info: Any, timeout: float, timing: Timing | None = None
) -> Plan | str:
    """The client's plan for one configuration, or the message of the ``Exception`` it
    raised instead (a refusal, which the caller records against that configuration's
    rule). Hangs, ``SystemExit`` and ill-typed plans stay adapter errors. ``timing``: the
    run's ``Timing`` (the call counts as client time)."""
    try:
        got = call_with_timeout(
            lambda: client.resolve(policy, info),
            timeout,
            "resolve",
            is_direct(client),
            timing,
            client=True,
        )
    except AdapterError as e:
        if e.raised:
            return str(e).removeprefix("ADP-001: ")
        raise
    check_plan(got)
    return got


def refusal(expected: Plan, error: str, where: str) -> Violation:
    """The violation of a configuration the client raised on: the rule that decides its
    flush, expected that plan's flush, got the exception."""
    return Violation(expected.rule_for("flush"), expected.flush, error, where)


def client_table(client: ClientAdapter, recorder: Recorder, timeout: float) -> list[Violation]:
    """Ask the client under test for its plan on every policy and every server-info shape
    (CLI-001..007), whatever the engine reports: a real engine shows one shape only, and a
    pure resolver is cheap to ask. The MUST rules are judged on the shapes engines emit
    (``REPORTS_WHEN_ON`` / ``REPORTS_WHEN_OFF``), ``ROBUSTNESS_SHAPES`` by CLI-013 alone.
    Mismatches name the policy and the server info."""
    out: list[Violation] = []
    infos = [None if i is None else dict(i) for i in (*REPORTS_WHEN_ON, *REPORTS_WHEN_OFF)]
    odd = [dict(i or ()) for i in ROBUSTNESS_SHAPES]
    # Both orders, so a resolver that remembers the first answer it saw is asked the
    # unsafe way round too.
    grid = list(product(CacheMode, (None, True, False), PauseMode, infos))
    answered, refused = 0, []
    for mode, flush, pause, info in grid + grid[::-1]:
        policy = Policy(mode, flush, pause)
        expected = resolve_plan(mode, flush, pause, info)
        got = resolve(client, policy, info, timeout, recorder.timing)
        where = f"plan.flush for policy {policy_words(policy)}, server info {info!r}"
        if isinstance(got, str):
            out.append(refusal(expected, got, where))
            refused.append(out[-1].rule)
            continue
        answered += 1
        retract = evolve(policy, pause_mode=PauseMode.RETRACT)
        again = resolve(client, retract, info, timeout, recorder.timing)
        if isinstance(again, str):
            asked = resolve_plan(mode, flush, PauseMode.RETRACT, info)
            where = f"plan.flush for policy {policy_words(retract)}, server info {info!r}"
            out.append(refusal(asked, again, where))
            continue
        plain, plain_flush = plain_form(info), None
        if plain is not None:
            on_plain = resolve(client, policy, plain, timeout, recorder.timing)
            if isinstance(on_plain, str):
                where = f"plan.flush for policy {policy_words(policy)}, server info {plain!r}"
                out.append(refusal(resolve_plan(mode, flush, pause, plain), on_plain, where))
                continue
            plain_flush = on_plain.flush
            recorder.exercised[RuleId.CLI_006] += 1
        recorder.exercised[expected.rule_for("flush")] += 1
        recorder.exercised[RuleId.CLI_007] += pause is PauseMode.IN_PLACE
        for f, rule, want, was in judge_plan(
            expected, got, pause, again.flush, plain_flush, off_in_booleans(info)
        ):
            where = f"plan.{f} for policy {policy_words(policy)}, server info {info!r}"
            out.append(Violation(rule, want, was, where))
    # Shapes no engine emits: CLI-013 (SHOULD) only, never a MUST rule.
    for mode, flush, pause, info in product(CacheMode, (None, True, False), PauseMode, odd):
        policy = Policy(mode, flush, pause)
        got = resolve(client, policy, info, timeout, recorder.timing)
        if isinstance(got, str):
            continue  # a client may refuse a report it cannot read (then it syncs nothing)
        recorder.exercised[RuleId.CLI_013] += mode is CacheMode.AUTO
        for f, rule, want, was in judge_robust(mode, flush, pause, info, got):
            where = f"plan.{f} for policy {policy_words(policy)}, server info {info!r}"
            out.append(Violation(rule, want, was, where))
    if not answered:
        # Not a refusal of some configurations but a client that cannot answer at all: the
        # client crashed (an ERROR of the client under test, never an engine FAIL).
        raise AdapterError(
            RuleId.ADP_001,
            f"the client {client.name!r} crashed: resolve raised on every configuration "
            f"({out[0].actual if out else 'no answer'})",
        )
    recorder.exercised.update(refused)  # a refusal is evidence against its rule
    return out


def check_plan(plan: object) -> None:
    """ADP-002 for a client answer that is not a well-typed ``Plan``."""
    if not isinstance(plan, Plan):
        raise AdapterError(RuleId.ADP_002, f"the client returned {plan!r:.80}, not a Plan")
    if not isinstance(plan.flush, bool):
        raise AdapterError(RuleId.ADP_002, f"the client's plan.flush {plan.flush!r} is not a bool")
    if not isinstance(plan.pause_mode, PauseMode):
        raise AdapterError(
            RuleId.ADP_002, f"the client's plan.pause_mode {plan.pause_mode!r} is not a PauseMode"
        )


def policy_words(p: Policy) -> str:
    return f"mode={p.mode.value} flush_cache={p.flush_cache} pause_mode={p.pause_mode.value}"
