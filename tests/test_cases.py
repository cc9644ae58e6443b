"""Regression tests for the public fault reports (shared/cases/public-faults.md).

Every case replays its minimal trace: against the reference it passes; against the mutant
that makes the general mistake it fails, naming the case's rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvfence.adapters import registry
from kvfence.adapters.cases import CASES
from kvfence.adapters.mutants import BY_NAME
from kvfence.conformance.replay import replay_actions


def systems(mutant_name: str):
    m = BY_NAME[mutant_name]
    engine = m.name if m.side == "engine" else "reference"
    client = m.name if m.side == "client" else "reference"
    return registry.engine(engine), registry.client(client)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_case_fails_on_its_mutant_with_its_rule(case):
    engine, client = systems(case.mutant)
    r = replay_actions(engine, client, case.configs, case.policy, list(case.actions))
    assert r.kind == "FAIL", (r.kind, r.message)
    assert case.rule in {v.rule for v in r.violations}, [str(v) for v in r.violations]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_case_passes_on_the_reference(case):
    engine, client = registry.engine("reference"), registry.client("reference")
    r = replay_actions(engine, client, case.configs, case.policy, list(case.actions))
    assert r.kind == "PASS", [str(v) for v in r.violations]
    assert len(r.run.actions) == len(case.actions)


def test_every_public_case_is_covered():
    """Every PF id in the shared case file has a case here, and its mutant is catalogued."""
    source = Path(__file__).resolve().parents[2] / "shared" / "cases" / "public-faults.md"
    if not source.exists():
        pytest.skip(f"{source} not present in this checkout")
    ids = set(re.findall(r"^## (PF-\d\d)", source.read_text(), flags=re.M))
    assert ids == {c.id for c in CASES}
    for c in CASES:
        assert c.id in BY_NAME[c.mutant].cases


def test_case_01_real_consequence_is_stale_reuse():
    """PF-01: the never-flush client is named (CLI-001) and so is what it caused."""
    case = next(c for c in CASES if c.id == "PF-01")
    r = replay_actions(*systems(case.mutant), case.configs, case.policy, list(case.actions))
    assert [v.rule for v in r.soft] == ["CLI-001"]
    assert [v.rule for v in r.hard] == ["INV-001"]
