"""Every accepted counterexample in tests/regressions/ still replays as recorded: FAILED
against the system that produced it, FIXED against the reference, FAILED model-only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvfence.adapters import registry
from kvfence.adapters.cases import BY_MUTANT, CASES
from kvfence.conformance.replay import replay_trace
from kvfence.conformance.trace import read_trace

FILES = sorted((Path(__file__).parent / "regressions").glob("*.jsonl"))


def test_there_is_one_file_per_public_case():
    """One file per case variant, named ``PF-NN-<mutant>.jsonl``."""
    assert {f.stem for f in FILES} == {f"{c.id}-{c.mutant}" for c in CASES}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_regression_replays(path):
    text = path.read_text()
    assert text.startswith("# PF-"), "a regression file says what it shows"
    case = BY_MUTANT[path.stem[len("PF-NN-") :]]
    assert path.name.startswith(case.id)
    rule = case.rule
    recorded = {v["rule"] for v in json.loads(text.splitlines()[-1])["violations"]}
    assert rule in recorded
    trace = read_trace(path)
    engine, client = trace.header["engine"], trace.header["client"]
    failed = replay_trace(trace, registry.engine(engine), registry.client(client))
    assert failed.kind == "FAIL" and rule in {v.rule for v in failed.violations}
    fixed = replay_trace(trace, registry.engine("reference"), registry.client("reference"))
    assert fixed.kind == "PASS", [str(v) for v in fixed.violations]
    judged = replay_trace(trace, None, None)
    assert judged.kind == "FAIL" and rule in {v.rule for v in judged.violations}
