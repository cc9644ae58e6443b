"""The pass matrix: every correct design PASSES, at the ci profile and under the product
explorer, and the kill matrix beside it still kills every mutant by its own rule.

A correct design is only shown correct if the run reached what makes it differ from the
reference: each design also has a witness, a short trace on which its observations differ
from the reference's (or from the mutant that makes the opposite mistake), replayed to PASS.
Without the witness, a design that the checker never exercised where it differs would pass
vacuously.
"""

from __future__ import annotations

import functools
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import attrs
import pytest
from attrs import frozen

from kvfence.adapters import registry
from kvfence.adapters.cases import CASES
from kvfence.adapters.designs import (
    BY_CASE,
    BY_NAME,
    DESIGNS,
    AbortsBeforePublishCheck,
    DerivedRebuiltLazily,
    FlushesInsideSleep,
    KeepsCurrentStorage,
    RefusesFlushWhileKvReleased,
    ResetsPrefixCacheOnWake,
    StagesChunksAside,
)
from kvfence.adapters.mutants import MUTANTS
from kvfence.adapters.pd import PD_CONFIGS
from kvfence.adapters.reference import CachedKV, InProcessAdapter, Key, ReferenceEndpoint, Reply
from kvfence.adapters.router import ROUTER_CONFIGS
from kvfence.conformance.cli import main
from kvfence.conformance.explore import SETUPS, deployment
from kvfence.conformance.matrix import (
    BEYOND_FIRST_KILL,
    EXPLORE_DEPTH,
    EXPLORE_SHALLOW,
    KILL_DEPTH,
    Explored,
    Matrices,
    design_setups,
    explore_design,
    killed,
    level,
    passed,
    read_designs_explored,
    read_matrix_json,
    run_matrices,
)
from kvfence.conformance.replay import Replayed, replay_actions
from kvfence.conformance.runner import Result
from kvfence.model.actions import (
    Action,
    BeginWeightUpdate,
    ContinueGeneration,
    EvictPrefix,
    FaultChunkFails,
    FaultRankUpdateFails,
    FaultRefuseFlush,
    FinishRequest,
    FinishWeightUpdate,
    FlushCache,
    PauseGeneration,
    PublishVersion,
    Restart,
    ServeRequest,
    Sleep,
    StartRequest,
    UpdateWeightChunk,
    UpdateWeights,
    WakeUp,
)
from kvfence.model.rules import BY_ID
from kvfence.model.state import Config, Policy, Use, server_info
from kvfence.model.vocabulary import MIXED, CacheMode, Funnel, Lane, MemoryTag, PauseMode, Tier

JOBS = os.cpu_count() or 1


MAIN_JOB_MATRICES = Path(__file__).parents[1] / "kvfence-results" / "matrices.json"
"""Where the main job (``scripts/setup.sh``, README command 1) writes both matrices."""


@pytest.fixture(scope="module")
def matrices(tmp_path_factory) -> Matrices:
    """Both matrices at the ci profile, run once for the module on every core; or read from
    the main job's report when that run was of this very tree (``read_matrix_json``: the
    same profile, the same source fingerprint, a row for every design and mutant), as in CI,
    which runs the main job first: the same results, computed once.
    ``KVFENCE_FRESH_MATRICES=1`` always runs them here."""
    if not os.environ.get("KVFENCE_FRESH_MATRICES"):
        done = read_matrix_json(MAIN_JOB_MATRICES, DESIGNS, MUTANTS, "ci")
        if done is not None:
            return done
    out = tmp_path_factory.mktemp("matrices")
    return run_matrices(DESIGNS, MUTANTS, "ci", out, timeout=60.0, jobs=JOBS)


# ----- the pass matrix -------------------------------------------------------------------


def design_row(matrices: Matrices, name: str) -> Result:
    """The pass-matrix row of the design called ``name``."""
    return next(r for d, r in matrices.designs if d.name == name)


@pytest.mark.parametrize("design", DESIGNS, ids=lambda d: d.name)
def test_design_passes_at_ci(design, matrices):
    result = design_row(matrices, design.name)
    assert passed(result), (result.verdict, [str(v) for v in result.violations], result.error)
    assert result.counterexample is None and result.exit_code == 0
    verdicts = {r.rule.id: r.verdict for r in result.rules}
    bad = {
        rid: v
        for rid, v in verdicts.items()
        if level(rid) == "MUST" and v not in ("PASS", "SKIP", "N/A")
    }
    assert not bad, bad  # no MUST rule failed, errored or went unexercised
    for rule in design.keeps:
        assert verdicts[rule] in ("PASS", "WARN"), f"{design.name} never exercised {rule}"


@pytest.mark.parametrize("name", ["reference", "reference-closing"])
def test_reference_passes_every_rule(name, matrices):
    """Both reference systems PASS at ci and reach every scenario (each REACH rule PASS)."""
    result = design_row(matrices, name)
    assert result.verdict == "PASS", [(r.rule.id, r.verdict, r.reason) for r in result.rules]
    verdicts = {r.rule.id: r.verdict for r in result.rules}
    assert {v for k, v in verdicts.items() if k.startswith("REACH")} == {"PASS"}
    assert result.counterexample is None
    assert result.exit_code == 0


def test_a_resolver_is_not_judged_by_cli_012(matrices):
    """The reference resolver's pass-matrix row: CLI-012 (a program's stitched responses)
    is N/A for a client that makes no engine calls of its own."""
    result = design_row(matrices, "reference")
    assert {r.rule.id: r.verdict for r in result.rules}["CLI-012"] == "N/A"


@pytest.mark.parametrize(
    "name",
    [
        "reference-program",
        "any-on-flushes-everywhere",
        "requeue-labels-every-version",
        "colocated-program",
        "two-phase-program",
    ],
)
def test_correct_program_passes_the_client_rules(name, matrices):
    """A client program's pass-matrix row (its check on the reference engine at ci): the
    client rules judged on the calls its syncs made, each PASS (not only not broken), and
    CLI-012 where it delivers stitched responses."""
    result = design_row(matrices, name)
    assert result.verdict == "PASS", [(r.rule.id, r.verdict, r.reason) for r in result.rules]
    verdicts = {r.rule.id: r.verdict for r in result.rules}
    assert {verdicts[r] for r in ("CLI-001", "CLI-008", "CLI-010", "CLI-011")} == {"PASS"}
    if name == "requeue-labels-every-version":
        assert verdicts["CLI-012"] == "PASS"


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_still_killed_by_its_rule(mutant, matrices):
    """Each kill-matrix row: killed by the mutant's rule; outside ``BEYOND_FIRST_KILL``, by
    the breadth-first first kill (``first_kill``: a shortest counterexample within
    ``KILL_DEPTH`` steps, replayed and written, and no other rule PASSES on its one path)."""
    result = dict((m.name, r) for m, r in matrices.mutants)[mutant.name]
    assert killed(mutant, result), (result.verdict, result.caught(), result.error)
    assert result.exit_code == 1
    if mutant.rule == "CLI-013" or mutant.name in BEYOND_FIRST_KILL:
        return  # judged in the client table alone, or by the stateful search
    assert result.counterexample is not None and result.counterexample.exists()
    assert 1 <= result.steps <= KILL_DEPTH, result.steps
    verdicts = {r.rule.id: r.verdict for r in result.rules}
    assert verdicts[mutant.rule] == "FAIL"
    assert "PASS" not in {v for k, v in verdicts.items() if k != mutant.rule}  # no evidence


def test_matrices_agree_with_their_verdict(matrices):
    assert matrices.ok
    assert len(matrices.designs) == len(DESIGNS) and len(matrices.mutants) == len(MUTANTS)


@functools.cache
def main_job_explored() -> dict[str, Explored]:
    """Design name -> its exploration in the main job's pass matrix under the product
    explorer (``kvfence mutants --designs-explored``, which scripts/setup.sh runs), when
    that report is of this tree (else empty: each design is explored here)."""
    if os.environ.get("KVFENCE_FRESH_MATRICES"):
        return {}
    return read_designs_explored(MAIN_JOB_MATRICES, DESIGNS) or {}


@pytest.mark.parametrize("design", DESIGNS, ids=lambda d: d.name)
def test_design_passes_under_the_explorer(design):
    """The product explorer (model x design, every setup: ``EXPLORE_DEPTH``,
    ``EXPLORE_SHALLOW``) finds nothing on the design: the main job's exploration when its
    report is of this tree, else explored here (``explore_design``, the main job's own
    function). One design per test and no module fixture: pytest-xdist spreads the designs
    over the cores."""
    x = main_job_explored().get(design.name) or explore_design(design.name)
    assert not x.error, x.error
    assert not x.violations, x.violations
    assert not x.other, x.other
    assert x.complete and x.depth_reached == EXPLORE_DEPTH and x.clean
    setups = design_setups(design) or SETUPS
    assert x.setups == tuple(s.name for s in setups)
    assert x.depths == tuple(EXPLORE_SHALLOW.get(s.name, EXPLORE_DEPTH) for s in setups)
    # every setup was explored, not one corner of one: on the reference the smallest
    # setup has 148 distinct nodes at depth 2 and 609 at depth 3
    assert sum(x.setup_states) == x.states
    assert all(n > 100 for n in x.setup_states), dict(zip(x.setups, x.setup_states, strict=True))


def test_every_design_documents_what_it_keeps():
    for d in DESIGNS[2:]:
        first = d.doc.splitlines()[0]
        assert first.startswith("Keeps: ") and first.endswith("."), (d.name, first)
        assert d.keeps and all(r in BY_ID for r in d.keeps), (d.name, d.keeps)
        assert any(w in d.doc for w in ("vllm", "sglang", "xorl")), f"{d.name} cites no source"
    assert [d.case for d in DESIGNS[:2]] == [None, None]
    assert sorted(BY_CASE) == [*(f"CD-{i:02d}" for i in range(1, 21))]


# ----- witnesses: the run reaches what makes each design differ ---------------------------


@frozen
class Witness:
    """A trace on which ``design`` shows something the ``contrast`` system does not, and
    ``design`` still PASSES. ``contrast_passes``: whether the contrast system is itself
    correct there (the reference) or must FAIL (a mutant making the opposite mistake)."""

    design: str
    configs: tuple[Config, ...]
    policy: Policy
    actions: tuple[Action, ...]
    contrast: str = "reference"
    contrast_passes: bool = True


STANDARD = Config()
EXACT = Config(lane=Lane.EXACT)
OPT_OUT = Policy(mode=CacheMode.NONE)
RADIX_OFF = Config(radix=False, info=server_info(radix_cache_enabled=False))
WEIGHTS = frozenset({MemoryTag.WEIGHTS})
KV = frozenset({MemoryTag.KV_CACHE})
DERIVED = Config(derived=True)
STORAGE = Config(tiers=frozenset({Tier.DEVICE, Tier.STORAGE}))
ON_DISK = (ServeRequest(0, "P"), EvictPrefix(0, "P", Tier.STORAGE))
"""A prefix served at v0, its KV written back to the storage tier."""


def _case_witness(design: str, case_id: str) -> Witness:
    """The witness of ``design`` on public case ``case_id``'s trace (adapters/cases.py),
    contrasted with the case's mutant, which must FAIL there."""
    case = next(c for c in CASES if c.id == case_id)
    return Witness(
        design, case.configs, case.policy, case.actions, contrast=case.mutant, contrast_passes=False
    )


WITNESSES = (
    Witness(
        "pause-abort-clears-cache",
        (STANDARD,),
        Policy(),
        (
            ServeRequest(0, "P"),
            StartRequest(0, "r1", "Q"),
            PauseGeneration(0, PauseMode.ABORT),
            ContinueGeneration(0),
            ServeRequest(0, "P"),
        ),
    ),
    Witness(
        "sleep-flushes-every-tier",
        (Config(tiers=frozenset(Tier)),),
        Policy(),
        (ServeRequest(0, "P"), EvictPrefix(0, "P", Tier.HOST), Sleep(0), WakeUp(0)),
    ),
    Witness(
        "version-keyed-cache",  # its profile declares versioned_keys; the reference's does not
        (EXACT,),
        OPT_OUT,
        (ServeRequest(0, "P"), UpdateWeights(0, 1, flush_cache=False), ServeRequest(0, "P")),
    ),
    Witness(
        "encoder-follows-weights",
        (Config(encoder=True),),
        OPT_OUT,
        (ServeRequest(0, "P"), UpdateWeights(0, 1, flush_cache=False), ServeRequest(0, "P")),
        contrast="encoder-kept-on-opt-out",
        contrast_passes=False,
    ),
    Witness(
        "omitted-flush-means-flush",  # its profile declares flush_default
        (STANDARD,),
        OPT_OUT,
        (ServeRequest(0, "P"), UpdateWeights(0, 1, flush_cache=None), ServeRequest(0, "P")),
    ),
    Witness(
        "radix-off-skips-flush",
        (RADIX_OFF,),
        Policy(),
        (
            StartRequest(0, "r1", "P"),
            UpdateWeights(0, 1, flush_cache=True),
            FinishRequest(0, "r1"),
        ),
    ),
    Witness(
        "radix-off-flushes-while-running",  # the reference refuses the flush; this one answers
        (RADIX_OFF,),
        Policy(),
        (StartRequest(0, "r1", "P"), FlushCache(0), FinishRequest(0, "r1"), ServeRequest(0, "P")),
    ),
    Witness(
        "resets-prefix-cache-on-wake",  # the index stays listed while asleep; the wake drops it
        (STANDARD,),
        Policy(),
        (ServeRequest(0, "P"), Sleep(0), WakeUp(0), ServeRequest(0, "P")),
    ),
    Witness(
        "flushes-inside-sleep",  # the refusal is spent inside the sleep: the next flush succeeds
        (STANDARD,),
        Policy(),
        (ServeRequest(0, "P"), FaultRefuseFlush(0), Sleep(0), WakeUp(0), FlushCache(0)),
    ),
    Witness(
        "keeps-current-storage",  # v0's entry outlives a flush and a restart, not the update
        (STORAGE,),
        Policy(),
        (
            *ON_DISK,
            FlushCache(0),
            Restart(0),
            ServeRequest(0, "P"),
            UpdateWeights(0, 1, flush_cache=True),
            ServeRequest(0, "P"),
        ),
    ),
    Witness(
        "stops-on-refused-flush",
        (EXACT,),
        OPT_OUT,
        (StartRequest(0, "r1", "P"), UpdateWeights(0, 1, flush_cache=False), Restart(0)),
        contrast="crashes-after-swap",
        contrast_passes=False,
    ),
    Witness(
        "aborts-then-flushes",  # the reference rejects the update; this one aborts r1
        (EXACT,),
        OPT_OUT,
        (StartRequest(0, "r1", "P"), UpdateWeights(0, 1, flush_cache=False), ServeRequest(0, "P")),
    ),
    Witness(
        "always-flushes",  # the reference keeps the cache and succeeds; this one rejects
        (STANDARD,),
        OPT_OUT,
        (
            StartRequest(0, "r1", "P"),
            UpdateWeights(0, 1, flush_cache=False),
            FinishRequest(0, "r1"),
        ),
    ),
    Witness(
        "refuses-flush-while-kv-released",  # the colocated order: the update is refused
        (STANDARD,),
        Policy(),
        (
            ServeRequest(0, "P"),
            Sleep(0),
            WakeUp(0, WEIGHTS),
            UpdateWeights(0, 1, flush_cache=True),
            WakeUp(0, KV),
            ServeRequest(0, "P"),
        ),
    ),
    Witness(
        "labels-only-with-updates",  # the reference accepts a publish its weights back
        (STANDARD,),
        Policy(),
        (UpdateWeights(0, 1, flush_cache=True), PublishVersion(0, 1), ServeRequest(0, "P")),
    ),
    Witness(
        "aborts-before-publish-check",  # refused, and the asked-for abort already ran
        (STANDARD,),
        Policy(),
        (StartRequest(0, "r1", "P"), PublishVersion(0, 1, abort_requests=True)),
    ),
    Witness(
        "refuses-inside-window",  # refused from the begin, before any chunk landed
        (STANDARD,),
        Policy(),
        (
            BeginWeightUpdate(0, 1),
            ServeRequest(0, "P"),
            UpdateWeightChunk(0),
            ServeRequest(0, "P"),
            FinishWeightUpdate(0, flush_cache=True),
            ServeRequest(0, "P"),
        ),
    ),
    Witness(
        "stages-chunks-aside",  # serves the old version, whole and labelled, in the window
        (STANDARD,),
        OPT_OUT,
        (
            ServeRequest(0, "P"),
            UpdateWeights(0, 1, flush_cache=True),
            ServeRequest(0, "P"),
            BeginWeightUpdate(0, 2),
            UpdateWeightChunk(0),
            ServeRequest(0, "P"),
            FaultChunkFails(0),
            UpdateWeightChunk(0),
            ServeRequest(0, "P"),
        ),
    ),
    Witness(
        "derived-rebuilt-lazily",  # the probe shows the old derived state until a forward
        (DERIVED,),
        Policy(),
        (UpdateWeights(0, 1, flush_cache=True), ServeRequest(0, "P"), Restart(0)),
    ),
    # each public case's trace, on the design that fixes it: its mutant FAILs there
    _case_witness("drains-overlap-before-write", "PF-28"),  # the drained KV is all v0
    _case_witness("closes-on-raised-flush", "PF-32"),  # the raised flush closes it
    # data-parallel ranks: on ranked configs the reference engine is the reference DP
    # controller (ranks.RankedEndpoint), whose flush runs only if every rank can flush
    Witness(
        "merges-every-flush-reply",  # rank 0 empties its tree although rank 1 refused
        (Config(ranks=2),),
        Policy(),
        (ServeRequest(0, "P"), StartRequest(0, "r1", "Q", rank=1), FlushCache(0)),
    ),
    Witness(
        "closes-on-any-rank-failure",  # no rank moved, and it closes anyway
        (Config(ranks=2),),
        Policy(),
        (
            FaultRankUpdateFails(0, 0),
            FaultRankUpdateFails(0, 1),
            UpdateWeights(0, 1, Funnel.DISK, True),
            ServeRequest(0, "P"),
        ),
    ),
    # a shared KV store: on store configs the reference engine is the reference store
    # endpoint (store.StoreEndpoint), which loads what it stored before a restart
    _case_witness("keys-store-by-weights", "PF-31"),  # the v0 entry is never matched at v1
    Witness(
        "rotates-store-namespace",  # a restart takes a fresh namespace: a miss, not a load
        (Config(store=True),),
        Policy(),
        (ServeRequest(0, "P"), Restart(0), ServeRequest(0, "P")),
    ),
    # prefill/decode deployments (endpoint 0 the prefill engine, endpoint 1 the decode one)
    _case_witness("checks-transferred-kv-version", "PF-29"),  # v0 KV refused at v1
    Witness(
        "holds-admission-across-versions",  # refused before the prefill: P's tree stays empty
        PD_CONFIGS,
        Policy(),
        (
            UpdateWeights(1, 1, Funnel.DISK, True),
            ServeRequest(1, "P"),
            UpdateWeights(0, 1, Funnel.DISK, False),
        ),
    ),
    Witness(
        "drains-transfers-before-update",  # no update while a transfer is live, even unflushed
        PD_CONFIGS,
        Policy(),
        (StartRequest(1, "r1", "P"), UpdateWeights(0, 1, Funnel.DISK, False)),
    ),
    # workers behind a router: on router configs the reference engine is the reference
    # router (router.RouterWorker), which drains a serving worker and updates it
    Witness(
        "updates-paused-rotation",  # refuses the update of a serving worker in rotation
        ROUTER_CONFIGS,
        Policy(),
        (UpdateWeights(0, 1, Funnel.DISK, True), ServeRequest(1, "P")),
    ),
)


def _replay(engine: str, w: Witness) -> Replayed:
    adapter = registry.engine(engine)
    try:
        return replay_actions(
            adapter, registry.client("reference"), w.configs, w.policy, list(w.actions)
        )
    finally:
        adapter.close()


def _observed(r: Replayed) -> list[object]:
    return [line.get("observed") for line in r.run.lines]


def test_every_correct_design_has_a_witness():
    """Every design of a public case has one; a design of ours may (where it differs from
    the reference on a trace of its own)."""
    witnessed = {w.design for w in WITNESSES}
    assert {d.name for d in DESIGNS if d.case} <= witnessed <= set(BY_NAME)


@pytest.mark.parametrize("w", WITNESSES, ids=lambda w: BY_NAME[w.design].case or w.design)
def test_witness_passes_where_the_design_differs(w):
    mine = _replay(w.design, w)
    assert mine.kind == "PASS", (mine.message, [str(v) for v in mine.violations])
    assert len(mine.run.actions) == len(w.actions)
    other = _replay(w.contrast, w)
    assert _observed(mine) != _observed(other), "the witness does not reach the difference"
    assert (other.kind == "PASS") is w.contrast_passes, (other.kind, other.message)


def test_a_crash_on_a_standard_lane_stays_a_fault():
    """Stopping is fail-closed only for a mandatory flush on an exact lane: the seed fork's
    bare assert on a standard lane (PF-04's shape) is still FC-001, while CD-07 answers
    there with a clean failure and passes."""
    trace = (StartRequest(0, "r1", "P"), UpdateWeights(0, 1, flush_cache=True))
    w = Witness("stops-on-refused-flush", (STANDARD,), Policy(), trace)
    assert _replay("stops-on-refused-flush", w).kind == "PASS"
    crash = _replay("crashes-after-swap", w)
    assert crash.kind == "FAIL" and "FC-001" in {v.rule for v in crash.violations}


def test_kvfence_mutants_shows_both_matrices(tmp_path, capsys):
    """The CLI prints the pass matrix and the kill matrix and exits 0 only when both hold;
    a design that passes and a mutant killed by its rule are two green JUnit cases."""
    junit, report = tmp_path / "m.xml", tmp_path / "m.json"
    argv = ["mutants", "--only", "CD-06", "flush-stub-claims-success", "--jobs", "1"]
    code = main([*argv, "--out", str(tmp_path), "--junit", str(junit), "--json", str(report)])
    out = capsys.readouterr().out
    assert "pass matrix" in out and "kill matrix" in out
    assert "radix-off-skips-flush" in out and "flush-stub-claims-success" in out
    assert code == 0, out
    root = ET.parse(junit).getroot()
    assert len(list(root.iter("testcase"))) == 2
    assert not list(root.iter("failure")) and not list(root.iter("error"))
    assert [r["outcome"] for r in json.loads(report.read_text())["rows"]] == ["pass", "pass"]


def test_kvfence_mutants_explores_the_designs_and_reports_it(tmp_path, capsys):
    """``--designs-explored``: the design's exploration is a line on the terminal, a JUnit
    case of ``kvfence.pass-matrix-explored`` and a JSON section that ``read_designs_explored``
    gives back whole for this tree (and not for a report of another depth)."""
    junit, report = tmp_path / "m.xml", tmp_path / "m.json"
    argv = ["mutants", "--only", "closes-on-any-rank-failure", "--jobs", "1"]
    argv += ["--designs-explored", "--out", str(tmp_path)]
    code = main([*argv, "--junit", str(junit), "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1/1 designs searched out with nothing broken" in " ".join(out.split())
    suites = {s.get("name"): s for s in ET.parse(junit).getroot().iter("testsuite")}
    explored = suites["kvfence.pass-matrix-explored"]
    assert explored.get("tests") == "1" and explored.get("failures") == "0"
    (x,) = read_designs_explored(report, DESIGNS).values()
    assert x.design == "closes-on-any-rank-failure" and x.clean and x.states > 100
    assert x.setups == tuple(s.name for s in deployment("ranks"))
    data = json.loads(report.read_text())
    data["pass_matrix_explored"]["depth"] = EXPLORE_DEPTH + 1
    report.write_text(json.dumps(data))
    assert read_designs_explored(report, DESIGNS) is None


def test_a_design_the_explorer_breaks_fails_the_matrices():
    """A design's exploration that broke a rule fails the matrices (exit 1); one that erred
    or stopped is not shown either way (exit 2, its reason among the unsettled lines)."""
    d = DESIGNS[0]
    clean = Explored(d.name, ("tiers",), (3,), (609,), 609, 3000, 3, True)
    assert clean.clean and clean.outcome == "pass"
    broken = attrs.evolve(clean, violations=("INV-001 at endpoint 0 prefix P",))
    stopped = attrs.evolve(clean, complete=False, error="stopped by a signal")
    shallow = attrs.evolve(clean, depth_reached=2)
    assert (broken.outcome, stopped.outcome, shallow.outcome) == ("failure", "error", "error")
    for e, code in ((clean, 0), (broken, 1), (stopped, 2), (shallow, 2)):
        x = Matrices((), (), 0.0, explored=((d, e),))
        assert x.exit_code == code and x.ok is (code == 0)
    x = Matrices((), (), 0.0, explored=((d, stopped),))
    assert x.unsettled() == [f"ERROR {d.name} under the explorer: stopped by a signal"]


def test_a_failing_design_fails_the_command(tmp_path, capsys):
    """A survivor or a falsely failed design makes the command fail: the matrix can fail."""
    code = main(["mutants", "--only", "no-such-design", "--out", str(tmp_path)])
    assert code == 3
    p = Path(tmp_path)
    code = main(["mutants", "--only", "reference", "--max-examples", "1", "--out", str(p)])
    out = capsys.readouterr().out
    # One example cannot reach every REACH rule: the reference is UNKNOWN, not PASS; that
    # is exit 2 with the reason printed (it was 1, as for a survivor, until the trust
    # trials: an UNKNOWN design is not shown broken either).
    assert code == 2 and "NOT OK" in out and "UNKNOWN reference:" in out


# ----- adversarial: broken engines dressed up as the lifecycle designs ---------------------
#
# Each looks like one of CD-10..CD-15 (or the reference) on the surface: the same replies,
# the same probe in the common case. Each is broken in one place, and kvfence must FAIL it
# with the rule that place breaks. None is a general mistake from a public report, so they
# stay here rather than in adapters/mutants.py.


class FailedChunkKeptLive(ReferenceEndpoint):
    """Dressed as the reference's rollback: a failed chunk reports failure and the probe and
    the label go back to the old version, but the landed tensors stay in the live
    parameters (only the bookkeeping is rolled back). Breaks WIN-003."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.mixed = False

    def _chunk_failed(self) -> None:
        self.mixed = self.mixed or self.torn
        super()._chunk_failed()

    def _install(self, version: int, funnel: Funnel) -> None:
        super()._install(version, funnel)
        self.mixed = False

    def _numerics(self, prefix: str, uses: set[Use], hit: bool) -> tuple[object, ...]:
        if self.mixed:
            uses = {Use(u.component, MIXED) if u.component == "target" else u for u in uses}
        return super()._numerics(prefix, uses, hit)


class ReleaseDemotesIndexToHost(ReferenceEndpoint):
    """Dressed as the reference's release (lower tiers survive it): releasing the KV memory
    re-files every device entry of the index as a host-tier entry, so that the index
    'survives for the host tier', but no KV was copied to host. Breaks ENG-006."""

    def _on_sleep(self) -> None:
        for kv in self.cache.values():
            if kv.tier is Tier.DEVICE:
                kv.tier = Tier.HOST


class LazyDerivedOnWholeRequestsOnly(DerivedRebuiltLazily):
    """Dressed as CD-15: the version check runs before a whole request's forward, but a
    streamed request's prefill skips it and computes its KV with the old derived state.
    Breaks DER-001."""

    def start(
        self, rid: str, prefix: str, lora: bool = False, namespace: int | None = None
    ) -> Reply:
        return ReferenceEndpoint.start(self, rid, prefix, lora, namespace)


class AbortsOnAnyRefusedPublish(AbortsBeforePublishCheck):
    """Dressed as CD-12: a refused publish aborts the in-flight requests whether or not the
    caller asked. Breaks PUB-002."""

    def publish_version(self, version: int, abort_requests: bool) -> Reply:
        reply = super().publish_version(version, abort_requests)
        if reply.ok:
            return reply
        aborted = reply.aborted | frozenset(self.requests)
        self.requests.clear()
        return Reply(False, aborted=aborted, message=reply.message)


class StagesButLabelsEarly(StagesChunksAside):
    """Dressed as CD-14: chunks are staged and the old weights serve, but the first chunk
    already publishes the new version's label. Breaks WIN-001."""

    def update_weight_chunk(self) -> Reply:
        reply = super().update_weight_chunk()
        if reply.ok and self.window is not None:
            self.label = self.window.version
        return reply


class RefusesAfterInstalling(RefusesFlushWhileKvReleased):
    """Dressed as CD-10: the update with a flush while the KV is released is refused, but
    only after the weights were installed, and the endpoint keeps serving them. A failed
    update may move the weights only if the endpoint then closes: FC-002."""

    def update_weights(self, version: int, funnel: Funnel, flush_cache: bool | None) -> Reply:
        if MemoryTag.KV_CACHE in self.released and self._must_flush(funnel, flush_cache):
            self._install(version, funnel)
            return Reply(False, message="flush refused while KV is released")
        return super().update_weights(version, funnel, flush_cache)


class FlushAnswersWhileRunning(ReferenceEndpoint):
    """Dressed as ``radix-off-flushes-while-running``: answers ``/flush_cache`` with success
    while requests run, but with the radix cache on, where the tree holds KV and nothing
    was removed. Breaks FC-005: a success while a request holds KV, which the idle gate
    does not allow (the entries it kept are of the weights in force, which a completed flush
    may keep, so the report itself is not shown false)."""

    def flush_cache(self) -> Reply:
        if self._can_flush():
            return super().flush_cache()
        return Reply(True, flushed=True, message="flushed")


class KeepsIndexThroughWake(ResetsPrefixCacheOnWake):
    """Dressed as ``resets-prefix-cache-on-wake``: keeps the index at the release, and the
    resume forgets to reset it, so the index of the discarded KV is back after the wake
    (PF-02's fault, vllm-project/vllm #17103, on the resume side). Breaks MEM-002."""

    def _on_resume_kv(self) -> None:
        """No reset: the stale index comes back with the memory."""


class SleepIgnoresRefusedFlush(FlushesInsideSleep):
    """Dressed as ``flushes-inside-sleep``: the release relies on its own flush alone (as
    SGLang's ``release_memory_occupation``, which ignores the flush's result), so when that
    flush is refused the index of the released KV survives the release and the resume.
    Breaks MEM-002."""

    def _on_sleep(self) -> None:
        """The internal flush was the only cleanup: nothing more here."""


class ReopensStorageAsIs(KeepsCurrentStorage):
    """Dressed as ``keeps-current-storage``: a flush keeps only the storage entries of the
    weights in force, but a restart reopens the disk tier as it was, entries of any version
    (a store keyed by token hashes alone, as an L3 backend reopened after a restart).
    Breaks ENG-010."""

    def restart(self) -> None:
        disk = {k: kv for k, kv in self.cache.items() if kv.tier is Tier.STORAGE}
        ReferenceEndpoint.restart(self)
        self.cache.update(disk)


class KeepsStorageOfAnyVersion(KeepsCurrentStorage):
    """Dressed as ``keeps-current-storage``: every flush, an update's among them, keeps the
    storage tier whatever version computed it (the version is written but never compared),
    so the old weights' KV outlives the update. Breaks ENG-003."""

    def _kept(self, key: Key, kv: CachedKV) -> bool:
        return kv.tier is Tier.STORAGE


@frozen
class Adversary:
    cls: type[ReferenceEndpoint]
    rule: str
    configs: tuple[Config, ...]
    policy: Policy
    actions: tuple[Action, ...]
    looks_like: str


ADVERSARIES = (
    Adversary(
        ReopensStorageAsIs,
        "ENG-010",
        (STORAGE,),
        OPT_OUT,  # the update keeps v0's entry, as asked; the restart must drop it
        (*ON_DISK, UpdateWeights(0, 1, flush_cache=False), Restart(0), ServeRequest(0, "P")),
        "keeps-current-storage",
    ),
    Adversary(
        KeepsStorageOfAnyVersion,
        "ENG-003",
        (STORAGE,),
        Policy(),
        (*ON_DISK, UpdateWeights(0, 1, flush_cache=True), ServeRequest(0, "P")),
        "keeps-current-storage",
    ),
    Adversary(
        FailedChunkKeptLive,
        "WIN-003",
        (STANDARD,),
        Policy(),
        (
            ServeRequest(0, "P"),
            UpdateWeights(0, 1, flush_cache=True),
            ServeRequest(0, "P"),
            BeginWeightUpdate(0, 2),
            UpdateWeightChunk(0),
            FaultChunkFails(0),
            UpdateWeightChunk(0),
            ServeRequest(0, "P"),
        ),
        "reference",
    ),
    Adversary(
        ReleaseDemotesIndexToHost,
        "ENG-006",
        (Config(tiers=frozenset(Tier)),),
        Policy(),
        (ServeRequest(0, "P"), Sleep(0), WakeUp(0), ServeRequest(0, "P")),
        "reference",
    ),
    Adversary(
        LazyDerivedOnWholeRequestsOnly,
        "DER-001",
        (DERIVED,),
        Policy(),
        (UpdateWeights(0, 1, flush_cache=True), StartRequest(0, "r1", "P"), FinishRequest(0, "r1")),
        "derived-rebuilt-lazily",
    ),
    Adversary(
        AbortsOnAnyRefusedPublish,
        "PUB-002",
        (STANDARD,),
        Policy(),
        (StartRequest(0, "r1", "P"), PublishVersion(0, 1, abort_requests=False)),
        "aborts-before-publish-check",
    ),
    Adversary(
        StagesButLabelsEarly,
        "WIN-001",
        (STANDARD,),
        Policy(),
        (BeginWeightUpdate(0, 1), UpdateWeightChunk(0), ServeRequest(0, "P")),
        "stages-chunks-aside",
    ),
    Adversary(
        FlushAnswersWhileRunning,
        "FC-005",
        (STANDARD,),
        Policy(),
        (ServeRequest(0, "P"), StartRequest(0, "r1", "Q"), FlushCache(0), ServeRequest(0, "P")),
        "radix-off-flushes-while-running",
    ),
    Adversary(
        KeepsIndexThroughWake,
        "MEM-002",
        (STANDARD,),
        Policy(),
        (ServeRequest(0, "P"), Sleep(0), WakeUp(0), ServeRequest(0, "P")),
        "resets-prefix-cache-on-wake",
    ),
    Adversary(
        SleepIgnoresRefusedFlush,
        "MEM-002",
        (STANDARD,),
        Policy(),
        (ServeRequest(0, "P"), FaultRefuseFlush(0), Sleep(0), WakeUp(0), ServeRequest(0, "P")),
        "flushes-inside-sleep",
    ),
    Adversary(
        RefusesAfterInstalling,
        "FC-002",
        (STANDARD,),
        Policy(),
        (
            Sleep(0),
            WakeUp(0, WEIGHTS),
            UpdateWeights(0, 1, flush_cache=True),
            WakeUp(0, KV),
            ServeRequest(0, "P"),
        ),
        "refuses-flush-while-kv-released",
    ),
)


@pytest.mark.parametrize("adv", ADVERSARIES, ids=lambda a: a.cls.__name__)
def test_a_dressed_up_broken_engine_fails_with_its_rule(adv):
    """The same trace PASSES on the design it imitates and FAILS on the imitation, with the
    rule its one broken place breaks."""
    w = Witness(adv.looks_like, adv.configs, adv.policy, adv.actions)
    assert _replay(adv.looks_like, w).kind == "PASS"
    adapter = InProcessAdapter(adv.cls, "adversary")
    broken = replay_actions(
        adapter, registry.client("reference"), adv.configs, adv.policy, list(adv.actions)
    )
    assert broken.kind == "FAIL", (broken.kind, broken.message)
    assert adv.rule in {v.rule for v in broken.violations}, [str(v) for v in broken.violations]
