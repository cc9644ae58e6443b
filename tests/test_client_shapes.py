"""Server-info shapes: the MUST client rules are judged on what engines emit, shapes no
engine emits only by the SHOULD robustness rule CLI-013."""

from __future__ import annotations

import pytest

from kvfence.adapters import registry
from kvfence.adapters.clients import BoolOnlyFallbackClient, ReferenceClient
from kvfence.adapters.mutants import IdentityTrueClient
from kvfence.conformance.client_table import client_table
from kvfence.conformance.record import Recorder
from kvfence.conformance.runner import run_check
from kvfence.model.client import (
    REPORTS_WHEN_OFF,
    REPORTS_WHEN_ON,
    ROBUSTNESS_SHAPES,
    Plan,
    admissible_radix,
    judge_robust,
    parse_radix,
)
from kvfence.model.rules import BY_ID, Klass, RuleId
from kvfence.model.vocabulary import CacheMode, PauseMode

MUST = {r.id for r in BY_ID.values() if r.level == "MUST"}


def table(client):
    return client_table(client, Recorder(), timeout=5.0)


def test_producer_shapes_parse_the_way_their_side_says():
    assert all(parse_radix(None if i is None else dict(i)) is not False for i in REPORTS_WHEN_ON)
    assert all(parse_radix(None if i is None else dict(i)) is not True for i in REPORTS_WHEN_OFF)
    # SGLang's own field and vLLM's silence are among them
    assert (("disable_radix_cache", False),) in REPORTS_WHEN_ON
    assert () in REPORTS_WHEN_ON and () in REPORTS_WHEN_OFF
    assert None in REPORTS_WHEN_ON and None in REPORTS_WHEN_OFF


def test_no_int_or_contradictory_shape_is_a_producer_shape():
    for info in (*REPORTS_WHEN_ON, *REPORTS_WHEN_OFF):
        fields = dict(info or ())
        assert not any(type(v) is int for v in fields.values()), info
        assert len({"radix_cache_enabled", "disable_radix_cache"} & set(fields)) <= 1, info
    assert ROBUSTNESS_SHAPES


def test_bool_only_resolver_breaks_no_must_rule():
    """The XoRL-style resolver: right on every producer shape; on the int shape
    ``{"radix_cache_enabled": 1, "disable_radix_cache": true}`` it follows the boolean,
    which CLI-013 admits. Its only notes are extra flushes on string reports (CLI-003)."""
    found = table(BoolOnlyFallbackClient())
    assert not [v for v in found if v.rule in MUST], found
    assert {v.rule for v in found} <= {RuleId.CLI_003}
    assert all(v.expected is False and v.actual is True for v in found)


def test_bool_only_resolver_fails_no_rule_in_a_check(out_dir):
    result = run_check(
        registry.engine("reference"), BoolOnlyFallbackClient(), max_examples=30, out_dir=out_dir
    )
    assert not [r.rule.id for r in result.rules if r.verdict == "FAIL"], result.violations
    assert {v.rule for v in result.violations} <= {RuleId.CLI_003}


def test_identity_true_mutant_is_caught_by_cli013_only():
    found = table(IdentityTrueClient())
    assert found, "the mutant misreads radix_cache_enabled: 1 as off"
    assert {v.rule for v in found} == {RuleId.CLI_013}
    assert any("'radix_cache_enabled': 1}" in v.where for v in found)


def test_cli013_fails_the_mutant_under_strict(out_dir):
    result = run_check(
        registry.engine("reference"),
        IdentityTrueClient(),
        max_examples=20,
        strict=True,
        out_dir=out_dir,
    )
    assert result.verdict == "FAIL" and result.exit_code == 1
    assert {v.rule for v in result.violations} == {RuleId.CLI_013}


def test_a_check_focused_on_cli013_ends_after_the_client_table(out_dir):
    """No run meets the shapes CLI-013 judges: focused on it, the check draws no example
    (the battery and the search could show nothing) and the table's kill stands."""
    result = run_check(
        registry.engine("reference"),
        IdentityTrueClient(),
        focus=RuleId.CLI_013,
        strict=True,
        out_dir=out_dir,
    )
    assert result.verdict == "FAIL" and RuleId.CLI_013 in result.caught()
    assert result.examples == 0 and result.battery is None


def test_a_run_focused_on_a_plan_rule_ends_with_the_sync_that_broke_it(out_dir):
    """keeps-in-place-pause's plan breaks CLI-007 at its first in_place sync: a run focused
    on CLI-007 ends there, a counterexample of one sync, instead of searching on for a
    consequence (it took 3,532 examples when the violation was only recorded)."""
    result = run_check(
        registry.engine("reference"),
        registry.client("keeps-in-place-pause"),
        focus=RuleId.CLI_007,
        strict=True,
        battery=False,
        max_examples=200,
        out_dir=out_dir,
    )
    assert result.verdict == "FAIL" and RuleId.CLI_007 in result.caught()
    assert result.examples < 50 and result.steps == 1, (result.examples, result.steps)


def test_the_reference_keeps_cli013():
    assert not table(ReferenceClient())


def test_cli013_is_a_should_safety_rule():
    rule = BY_ID[RuleId.CLI_013]
    assert rule.level == "SHOULD" and rule.klass is Klass.SAFETY


@pytest.mark.parametrize(
    ("info", "readings"),
    [
        ({"radix_cache_enabled": 1}, {True, None}),
        ({"radix_cache_enabled": 1, "disable_radix_cache": True}, {True, False, None}),
        ({"radix_cache_enabled": False, "disable_radix_cache": False}, {True, False, None}),
        ({"disable_radix_cache": "0"}, {True, None}),
        ({}, {None}),
        (None, {None}),
    ],
)
def test_admissible_readings(info, readings):
    assert admissible_radix(info) == readings


def test_judge_robust_charges_only_a_skipped_flush_nothing_says_to_skip():
    auto, pause = CacheMode.AUTO, PauseMode.RETRACT
    skip, flush = Plan(False, pause), Plan(True, pause)
    assert judge_robust(auto, None, pause, {"radix_cache_enabled": 1}, skip)
    assert not judge_robust(auto, None, pause, {"radix_cache_enabled": 1}, flush)
    both = {"radix_cache_enabled": 1, "disable_radix_cache": True}
    assert not judge_robust(auto, None, pause, both, skip)
    assert judge_robust(CacheMode.FLUSH, None, pause, both, skip)
    assert not judge_robust(CacheMode.NONE, None, pause, {"radix_cache_enabled": 1}, skip)
