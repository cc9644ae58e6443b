"""Every mutant is shown killed by the rule it was written to break, at the ci profile
(the kill matrix of ``kvfence mutants``); both reference systems pass in the pass matrix
(tests/test_designs.py)."""

from __future__ import annotations

import pytest
from test_explore import SHORTEST

from kvfence.adapters import registry
from kvfence.adapters.mutants import MUTANTS
from kvfence.conformance.matrix import (
    BEYOND_STATEFUL_BUDGET,
    killed,
    mutant_job,
    run_job,
)
from kvfence.conformance.runner import run_check
from kvfence.model.rules import BY_ID


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_killed_by_its_rule(mutant, out_dir):
    """By the stateful search alone (``kvfence check --focus``), in no fewer steps than the
    explorer's shortest (``SHORTEST``); the kill matrix's default
    breadth-first kill is judged on the matrix's own rows (tests/test_designs.py)."""
    if mutant.name in BEYOND_STATEFUL_BUDGET:
        pytest.skip(BEYOND_STATEFUL_BUDGET[mutant.name])
    result = run_job(mutant_job(mutant, "ci", out_dir, 60.0, None, explore=False))
    assert killed(mutant, result), (result.verdict, result.caught(), result.error)
    assert result.exit_code == 1
    if mutant.rule == "CLI-013":
        # judged in the client table alone (shapes no engine emits): the counterexample is
        # the table's row, a policy and a server info, not a run
        (v,) = [v for v in result.violations if v.rule == mutant.rule][:1]
        assert "server info" in v.where
        return
    assert result.counterexample is not None and result.counterexample.exists()
    # no shorter than the explorer's shortest (a breadth-first search cannot be beaten),
    # and short enough to read
    assert SHORTEST.get(mutant.name, 1) <= result.steps <= 6, result.steps


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_documents_its_rule(mutant):
    first = mutant.doc.splitlines()[0]
    assert first == f"Violates: {mutant.rule}."
    assert mutant.rule in BY_ID


def test_missing_guard_counterexample_is_short(out_dir):
    m = next(m for m in MUTANTS if m.name == "guard-missing-on-tensor")
    result = run_job(mutant_job(m, "ci", out_dir, 60.0, None))
    assert killed(m, result)
    assert result.steps <= 4


def test_unfocused_check_of_a_mutant_fails(out_dir):
    """Without focus, a plain `kvfence check` of a faulty engine FAILs too."""
    result = run_check(
        registry.engine("guard-missing-on-disk"), registry.client("reference"), out_dir=out_dir
    )
    assert result.verdict == "FAIL"
    assert result.caught()
