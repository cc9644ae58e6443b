"""The pass matrix at ten times the ci budget: every correct design of ``adapters/designs.py``
(the two reference systems and the catalog) passes a plain check at 6,000 examples, not only
at ci's 600: a bound that held by luck at 600 examples would give way somewhere in 6,000.

Each design's result is the main job's when its report is of this very tree
(``read_designs_times``: the same profile, budget and source fingerprint); one the report
holds as ERROR or UNKNOWN fails here (never read as a pass). The main job (README command
1, ``scripts/setup.sh``) runs the four allowance designs (``ALLOWANCES``) at 10x on every
setup, while the engines install; with ``KVFENCE_DESIGNS_TIMES=10`` it runs every design at
10x. A design of ``ALLOWANCES`` without such a result runs its check here, exactly as the
main job does; every other design is skipped, naming the command: the whole 10x matrix is
about an hour of CPU, more than CI's margin (docs/budget.md). ``KVFENCE_FRESH_MATRICES=1``
runs the four here and skips the rest.

One test per design, no module fixture, so pytest-xdist spreads them over the cores (slow
tier: without the main job's report, each is a whole check at ten times the ci budget)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from kvfence.adapters.designs import ALLOWANCES, DESIGNS
from kvfence.conformance.matrix import (
    design_job,
    passed,
    read_designs_times,
    run_job,
    times_budget,
)
from kvfence.conformance.runner import Result

TIMES = 10
TEN_TIMES_CI = times_budget("ci", None, TIMES)
"""``--max-examples`` of these checks: ten times the ci profile's."""

ADAPTER_TIMEOUT = 120.0
"""Seconds an adapter call may take: the main job's (``kvfence mutants --timeout``)."""

MAIN_JOB_MATRICES = Path(__file__).parents[1] / "kvfence-results" / "matrices.json"
"""Where the main job (``scripts/setup.sh``, README command 1) writes the matrices."""


@functools.cache
def main_job() -> dict[str, Result]:
    """Design name -> its result in the main job's pass matrix at ten times the ci budget,
    when that report is of this tree (else empty: every design is run here)."""
    if os.environ.get("KVFENCE_FRESH_MATRICES"):
        return {}
    return read_designs_times(MAIN_JOB_MATRICES, DESIGNS, TIMES, "ci") or {}


def result_at_ten_times(name: str, out: Path) -> Result:
    """The main job's result for design ``name``, or its plain check at ten times the ci
    budget run here (``design_job`` and ``run_job``: the main job's run)."""
    done = main_job().get(name)
    if done is not None:
        return done
    if name not in ALLOWANCES:
        pytest.skip(
            "no pass matrix at ten times the ci budget of this tree: "
            "KVFENCE_DESIGNS_TIMES=10 bash scripts/setup.sh writes it (docs/budget.md)"
        )
    design = next(d for d in DESIGNS if d.name == name)
    return run_job(design_job(design, "ci", out, ADAPTER_TIMEOUT, TEN_TIMES_CI))


def test_the_four_allowances_are_pinned_at_ten_times_the_ci_budget():
    """Each allowance of docs/spec.md has its design among the parametrized ones below."""
    assert set(ALLOWANCES) <= {d.name for d in DESIGNS}


@pytest.mark.parametrize("design", DESIGNS, ids=lambda d: d.name)
def test_design_passes_at_ten_times_the_ci_budget(design, tmp_path):
    result = result_at_ten_times(design.name, tmp_path)
    assert passed(result), (result.verdict, [str(v) for v in result.violations], result.error)
    assert result.counterexample is None and result.exit_code == 0
    assert result.examples >= TEN_TIMES_CI, result.examples
    rules = {r.rule.id: r for r in result.rules}
    for rule in design.keeps:  # the rules the design is about, each with evidence
        assert rules[rule].verdict in ("PASS", "WARN"), (design.name, rule, rules[rule].note)
        assert rules[rule].evidence > 0, (design.name, rule)
