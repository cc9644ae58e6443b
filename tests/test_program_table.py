"""The program table: a client program's client rules on every combination of producer
server-info shapes over 1-3 endpoints, so its verdict does not hang on the engine drawn."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from kvfence.adapters import registry
from kvfence.adapters.programs import AnyOnFlushesEverywhere
from kvfence.conformance.program_table import program_table, table_setups
from kvfence.conformance.record import Recorder
from kvfence.conformance.runner import run_check
from kvfence.model.client import REPORTS_WHEN_OFF, REPORTS_WHEN_ON
from kvfence.model.rules import RuleId
from kvfence.model.state import Policy
from kvfence.model.vocabulary import CacheMode, PauseMode

ENGINES = ("reference", "reference-closing")


class MajorityFlush(AnyOnFlushesEverywhere):
    """Decides across all endpoints at once, wrongly: with mode auto, every endpoint is
    flushed when most of them report the radix cache on or unknown, none otherwise. An
    endpoint reporting on beside two reporting off keeps its stale prefix cache."""

    name = "majority-flush"

    def decide(self, policy: Policy, infos: list[Mapping[str, object] | None]) -> list[bool]:
        each = [self.wants_flush(policy, info) for info in infos]
        if policy.mode is CacheMode.AUTO and policy.flush_cache is not True:
            return [2 * sum(each) > len(each)] * len(infos)
        return each


def test_setups_cover_every_producer_pair_in_order():
    setups = table_setups()
    pairs = {
        tuple(c.info for c in configs)
        for configs, p in setups
        if len(configs) == 2 and p.mode is CacheMode.AUTO and p.pause_mode is PauseMode.RETRACT
    }
    shapes = {*REPORTS_WHEN_ON, *REPORTS_WHEN_OFF}
    assert {(a, b) for a in shapes for b in shapes} <= pairs
    threes = [configs for configs, _ in setups if len(configs) == 3]
    assert len({tuple((c.radix, c.info) for c in cs) for cs in threes}) == 4**3
    assert {p.mode for _, p in setups} == set(CacheMode)
    assert {p.pause_mode for _, p in setups} == set(PauseMode)


def test_a_wrong_cross_endpoint_decision_is_in_the_table():
    whole, focused = Recorder(), Recorder()
    found = program_table(MajorityFlush(), whole, 5.0)
    assert RuleId.CLI_001 in {v.rule for v in found}
    assert any("3 endpoint(s)" in v.where for v in found)
    # focused on the rule, the table stops at its first violation: the same one, sooner
    first = program_table(MajorityFlush(), focused, 5.0, focus=RuleId.CLI_001)
    assert first[-1] == next(v for v in found if v.rule == RuleId.CLI_001)
    assert sum(focused.exercised.values()) < sum(whole.exercised.values())


def test_a_correct_cross_endpoint_decision_is_not():
    recorder = Recorder()
    assert program_table(AnyOnFlushesEverywhere(), recorder, 5.0) == []
    assert recorder.exercised[RuleId.CLI_001] > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_the_wrong_program_fails_cli001_on_both_engines(engine, out_dir):
    result = run_check(registry.engine(engine), MajorityFlush(), max_examples=10, out_dir=out_dir)
    assert result.verdict == "FAIL"
    assert RuleId.CLI_001 in {v.rule for v in result.violations}


def test_the_correct_program_gets_the_same_verdict_on_both_engines(out_dir):
    verdicts = {}
    for engine in ENGINES:
        client = registry.client("any-on-flushes-everywhere")
        result = run_check(registry.engine(engine), client, max_examples=10, out_dir=out_dir)
        verdicts[engine] = {r.rule.id: r.verdict for r in result.rules if r.rule.kind == "CLI"}
        assert not [v for v in result.violations if v.rule.startswith("CLI")], engine
    assert verdicts["reference"] == verdicts["reference-closing"]
    assert verdicts["reference"][RuleId.CLI_001] == "PASS"


def test_a_focused_check_runs_the_table_after_the_battery(out_dir):
    """Focused, a program's table runs after the battery and stops at the focus rule's
    first violation: with a one-scenario battery that passes, the table's violation is the
    FAIL, named by its setup."""
    result = run_check(
        registry.engine("reference"),
        MajorityFlush(),
        max_examples=1,
        focus=RuleId.CLI_001,
        strict=True,
        out_dir=out_dir,
    )
    assert result.verdict == "FAIL" and result.exit_code == 1
    assert result.battery is not None and result.battery.ran == 1
    assert result.battery.failed == 0
    shown = [v for v in result.violations if v.rule == RuleId.CLI_001]
    assert shown and "program table" in shown[0].where
