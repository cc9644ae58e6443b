"""Regression tests for the public fault reports (shared/cases/*.md).

Every case replays its minimal trace: against the reference it passes; against the mutant
that makes the general mistake it fails, naming the case's rule. The coverage test reads
every case file of the shared folder: each PF case is here or deferred to a named issue,
each CD design is in the pass matrix.

The folder is ``$KVFENCE_CASES_DIR``, by default ``../shared/cases`` relative to the
repository root (where CI checks it out)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from kvfence.adapters import registry
from kvfence.adapters.cases import BY_ID, CASES, DEFERRED
from kvfence.adapters.designs import BY_CASE, DEFERRED_DESIGNS
from kvfence.adapters.mutants import BY_NAME
from kvfence.conformance.replay import replay_actions

ROOT = Path(__file__).resolve().parents[1]
CASES_DIR_VAR = "KVFENCE_CASES_DIR"


def cases_dir() -> Path:
    """The shared case folder: ``$KVFENCE_CASES_DIR``, else ``../shared/cases``."""
    given = os.environ.get(CASES_DIR_VAR)
    return Path(given) if given else ROOT.parent / "shared" / "cases"


def case_ids(prefix: str) -> dict[str, str]:
    """Every ``## PREFIX-NN`` heading of every case file -> the file it is in. Fails when
    ``$KVFENCE_CASES_DIR`` names a folder that is not there; skips (saying why) only when
    the variable is unset and the default folder is absent from this checkout."""
    folder = cases_dir()
    if not folder.is_dir():
        if os.environ.get(CASES_DIR_VAR):
            pytest.fail(f"${CASES_DIR_VAR}={folder} is not a folder of case files")
        pytest.skip(f"{folder} not present; set ${CASES_DIR_VAR} to the shared case folder")
    files = sorted(folder.glob("*.md"))
    assert files, f"no case files (*.md) in {folder}"
    found: dict[str, str] = {}
    for f in files:
        for case_id in re.findall(rf"^## ({prefix}-\d\d)\b", f.read_text(), flags=re.M):
            found[case_id] = f.name
    return found


def systems(mutant_name: str):
    m = BY_NAME[mutant_name]
    engine = m.name if m.side == "engine" else "reference"
    client = m.name if m.side == "client" else "reference"
    return registry.engine(engine), registry.client(client)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.id}-{c.mutant}")
def test_case_fails_on_its_mutant_with_its_rule(case):
    engine, client = systems(case.mutant)
    r = replay_actions(engine, client, case.configs, case.policy, list(case.actions))
    assert r.kind == "FAIL", (r.kind, r.message)
    assert case.rule in {v.rule for v in r.violations}, [str(v) for v in r.violations]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.id}-{c.mutant}")
def test_case_passes_on_the_reference(case):
    engine, client = registry.engine("reference"), registry.client("reference")
    r = replay_actions(engine, client, case.configs, case.policy, list(case.actions))
    assert r.kind == "PASS", [str(v) for v in r.violations]
    assert len(r.run.actions) == len(case.actions)


def test_every_public_case_is_covered_or_deferred():
    """Every PF case of every shared case file has a case here (its mutant catalogued and
    naming it) or is deferred to a named issue; nothing else is in either list."""
    ids = case_ids("PF")
    covered = {c.id for c in CASES}
    assert set(ids) == covered | set(DEFERRED), {
        "in the case files, nowhere here": sorted(set(ids) - covered - set(DEFERRED)),
        "here, in no case file": sorted((covered | set(DEFERRED)) - set(ids)),
    }
    assert not covered & set(DEFERRED), "a case is both covered and deferred"
    for c in CASES:
        assert c.id in BY_NAME[c.mutant].cases, (c.id, c.mutant)
    assert len({c.mutant for c in CASES}) == len(CASES), "one mutant per case variant"


@pytest.mark.parametrize("case_id", sorted(DEFERRED_DESIGNS))
def test_deferred_design(case_id):
    """A correct design another issue expresses: a skip that names the issue."""
    assert case_id not in BY_CASE
    pytest.skip(f"{case_id} is deferred to issue {DEFERRED_DESIGNS[case_id]}")


@pytest.mark.parametrize("case_id", sorted(DEFERRED))
def test_deferred_case(case_id):
    """A case another issue expresses: shown as a skip that names the issue, never silent."""
    assert case_id not in BY_ID
    pytest.skip(f"{case_id} is deferred to issue {DEFERRED[case_id]}")


def test_every_correct_design_is_in_the_pass_matrix():
    """Every CD design of the shared case files is a catalogued design; a catalogued case id
    the shared files lack (CD-08, CD-09 came from adversarial trials) is written up in
    docs/designs.md instead, so no case id is invented without its description."""
    shared = set(case_ids("CD"))
    assert shared <= set(BY_CASE) | set(DEFERRED_DESIGNS), shared - set(BY_CASE)
    assert not set(BY_CASE) & set(DEFERRED_DESIGNS), "a design is both catalogued and deferred"
    assert set(DEFERRED_DESIGNS) <= shared, "a deferred design no case file describes"
    written = (Path(__file__).parents[1] / "docs" / "designs.md").read_text()
    for case_id in sorted(set(BY_CASE) - shared):
        assert f"### {case_id} `{BY_CASE[case_id].name}`" in written, case_id


def test_case_01_real_consequence_is_stale_reuse():
    """PF-01: the never-flush client is named (CLI-001) and so is what it caused."""
    case = next(c for c in CASES if c.id == "PF-01")
    r = replay_actions(*systems(case.mutant), case.configs, case.policy, list(case.actions))
    assert [v.rule for v in r.soft] == ["CLI-001"]
    assert [v.rule for v in r.hard] == ["INV-001"]


@pytest.mark.parametrize("allowance", [False, True], ids=["undeclared", "declared"])
def test_case_24_pinned_session_is_stale_unless_the_policy_allows_it(allowance):
    """PF-24 with the pin on the request (cache_salt = the session's first version): its
    reuse of v0 KV under v1 is INV-001, unless the policy declares off-policy sessions, then
    it passes (reported as a note); a new session salted with v1 never hits v0 KV."""
    from attrs import evolve

    from kvfence.conformance.lockstep import MACHINE_BOUNDS
    from kvfence.conformance.record import Recorder
    from kvfence.model.actions import ServeRequest, UpdateWeights
    from kvfence.model.state import Config, Policy
    from kvfence.model.vocabulary import Funnel, Lane

    trace = [
        ServeRequest(0, "P", namespace=0),  # g1, turn 1, salted with v0
        UpdateWeights(0, 1, Funnel.TENSOR, False),
        ServeRequest(0, "P", namespace=0),  # g1, turn 2, still salted with v0
        ServeRequest(0, "P", namespace=1),  # g2, salted with v1
    ]
    policy = Policy(off_policy_sessions=allowance)
    engine, client = registry.engine("version-keyed-cache"), registry.client("reference")
    # Requests that name their namespace are within bounds only where namespaces are drawn.
    bounds = evolve(MACHINE_BOUNDS, namespaces=True)
    recorder = Recorder()
    configs = (Config(lane=Lane.EXACT),)
    r = replay_actions(engine, client, configs, policy, trace, bounds=bounds, recorder=recorder)
    if allowance:
        assert r.kind == "PASS", (r.message, [str(v) for v in r.violations])
        assert len(r.run.actions) == len(trace)
        assert [n for n in recorder.notes if n.startswith("off-policy reuse")], recorder.notes
    else:
        assert r.kind == "FAIL", (r.kind, r.message)
        assert [v.rule for v in r.violations] == ["INV-001"]
        assert r.run.lines[-1]["step"] == 2  # failed at g1's second turn, not before
