"""An engine whose only fault breaks a SHOULD rule ends WARN (exit 0; FAIL and exit 1 under
``--strict``): a non-strict search notes the warning and goes on, instead of stopping there
and leaving every rule it had not reached yet UNKNOWN (exit 2)."""

from __future__ import annotations

from kvfence.adapters import registry
from kvfence.conformance.runner import run_check
from kvfence.model.rules import RuleId

ENGINE = "hit-path-numerics-differ"  # INV-004 (SHOULD) only: PF-18


def check(out_dir, **kw):
    return run_check(registry.engine(ENGINE), registry.client("reference"), out_dir=out_dir, **kw)


def test_the_search_goes_on_past_a_should_violation(out_dir):
    result = check(out_dir, max_examples=60)
    verdicts = {r.rule.id: r for r in result.rules}
    assert verdicts[RuleId.INV_004].verdict == "WARN"
    assert {v.rule for v in result.violations} == {RuleId.INV_004}
    stopped = [r.rule.id for r in result.rules if "run stopped" in r.reason]
    assert not stopped, stopped
    assert result.examples > 1
    assert result.counterexample is not None  # the warning's example is written


def test_strict_makes_it_a_fail(out_dir):
    result = check(out_dir, max_examples=60, strict=True)
    assert result.verdict == "FAIL" and result.exit_code == 1
    assert RuleId.INV_004 in {v.rule for v in result.violations}
