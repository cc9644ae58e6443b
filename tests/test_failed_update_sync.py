"""CLI-014: a client program that resumes serving, or reports the sync done, after an update
the engine refused or failed is judged; retrying the update, or staying paused and failing
the sync, keeps the rule."""

from __future__ import annotations

from kvfence.adapters import registry
from kvfence.adapters.programs import ResumesAfterFailedUpdate, RetriesFailedUpdate
from kvfence.conformance.runner import run_check
from kvfence.model.actions import UpdateWeights
from kvfence.model.obligations import Owed, evidence, observe, resumes, returned
from kvfence.model.rules import RuleId
from kvfence.model.state import Config, initial_state
from kvfence.model.vocabulary import Status

STATE = initial_state((Config(),))
UPDATE = UpdateWeights(0, 1, flush_cache=True)


def after(*statuses: Status) -> Owed:
    owed = Owed()
    for status in statuses:
        owed, bad = observe(owed, STATE, UPDATE, status)
        assert not bad
    return owed


def test_resuming_after_a_refused_update_breaks_cli014():
    _, bad = resumes(after(Status.REJECTED), 0, "ContinueGeneration")
    assert [v.rule for v in bad] == [RuleId.CLI_014]


def test_returning_after_a_failed_update_breaks_cli014():
    assert [v.rule for v in returned((after(Status.INDETERMINATE),))] == [RuleId.CLI_014]


def test_a_retried_update_that_succeeded_keeps_it():
    owed = after(Status.REJECTED, Status.OK)
    assert not returned((owed,))
    assert RuleId.CLI_014 in evidence(owed)  # a failed update was answered
    _, bad = resumes(owed, 0, "ContinueGeneration")
    assert RuleId.CLI_014 not in {v.rule for v in bad}


def test_the_mutant_is_killed_by_cli014(out_dir):
    result = run_check(
        registry.engine("reference"),
        ResumesAfterFailedUpdate(),
        max_examples=200,
        focus=RuleId.CLI_014,
        strict=True,
        out_dir=out_dir,
    )
    assert result.verdict == "FAIL"
    assert RuleId.CLI_014 in result.caught()


def test_retrying_the_update_keeps_cli014(out_dir):
    result = run_check(
        registry.engine("reference"), RetriesFailedUpdate(), max_examples=200, out_dir=out_dir
    )
    verdicts = {r.rule.id: r for r in result.rules}
    assert not [v for v in result.violations if v.rule == RuleId.CLI_014]
    assert verdicts[RuleId.CLI_014].verdict == "PASS", verdicts[RuleId.CLI_014]
    assert verdicts[RuleId.CLI_014].evidence > 0


def test_cli014_is_not_at_stake_for_a_resolver(out_dir):
    result = run_check(
        registry.engine("reference"), registry.client("reference"), max_examples=5, out_dir=out_dir
    )
    assert {r.rule.id: r.verdict for r in result.rules}[RuleId.CLI_014] == "N/A"
