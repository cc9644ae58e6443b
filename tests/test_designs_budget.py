"""The correct designs unlike the reference that the rules, not the cases, must allow (docs/spec.md,
"What a correct engine may do": a flush with nothing to flush, cleanup at another lifecycle
point, entries of the weights in force kept by a flush or a restart, an engine's own flush
spending an injected refusal) pass a plain check at ten times the ci profile's examples, not
only at ci: a bound that held by luck at 600 examples would give way somewhere in 6,000.

One test per design, no module fixture, so pytest-xdist spreads them over the cores (slow
tier: each is a whole check at ten times the ci budget)."""

from __future__ import annotations

import pytest

from kvfence.adapters import registry
from kvfence.adapters.designs import BY_NAME
from kvfence.conformance.matrix import passed
from kvfence.conformance.runner import PROFILES, run_check

TEN_TIMES_CI = 10 * PROFILES["ci"].max_examples
"""``--max-examples`` of these checks: ten times the ci profile's."""

BOUNDED_NOT_PRESCRIBED = (
    "radix-off-flushes-while-running",
    "resets-prefix-cache-on-wake",
    "keeps-current-storage",
    "flushes-inside-sleep",
)
"""The designs of a correct engine unlike the reference, one per allowance of docs/spec.md."""


@pytest.mark.parametrize("name", BOUNDED_NOT_PRESCRIBED)
def test_design_passes_at_ten_times_the_ci_budget(name, tmp_path):
    design = BY_NAME[name]
    engine, client = registry.engine(name), registry.client("reference")
    result = run_check(engine, client, out_dir=tmp_path, max_examples=TEN_TIMES_CI)
    assert passed(result), (result.verdict, [str(v) for v in result.violations], result.error)
    assert result.counterexample is None and result.exit_code == 0
    assert result.examples >= PROFILES["ci"].max_examples, result.examples
    rules = {r.rule.id: r for r in result.rules}
    for rule in design.keeps:  # the rules the design is about, each with evidence
        assert rules[rule].verdict in ("PASS", "WARN"), (name, rule, rules[rule].note)
        assert rules[rule].evidence > 0, (name, rule)
