"""Workers behind a router: the vocabulary (``Config.router``, the rotation, LeaveRotation
and EnterRotation), what the spec allows the router (RTR-001), the reference router
(``adapters/router.py``), and the router deployment of the explorer. The catalog's router
mutants and designs are also in the catalog-wide tests (tests/test_mutants.py,
tests/test_designs.py, tests/test_explore.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import after

from kvfence.adapters import registry
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.adapters.router import ROUTER_CONFIGS, Rotation, RouterWorker
from kvfence.conformance.cli import main_explore
from kvfence.conformance.explore import deployment, explore_adapter
from kvfence.conformance.replay import replay_actions, replay_trace
from kvfence.conformance.runner import run_check
from kvfence.conformance.trace import config_from_json, config_json, read_trace
from kvfence.model.actions import (
    ContinueGeneration,
    EnterRotation,
    FinishRequest,
    LeaveRotation,
    PauseGeneration,
    ServeRequest,
    Sleep,
    StartRequest,
    UpdateWeights,
)
from kvfence.model.rules import RuleId
from kvfence.model.semantics import deployment_version, enabled, settled, step
from kvfence.model.state import Config, Policy, initial_state
from kvfence.model.vocabulary import Funnel, PauseMode, Status

W, _ = ROUTER_CONFIGS
DISK = Funnel.DISK
REGRESSION = Path(__file__).parent / "regressions" / "router" / "readds-too-early.jsonl"


def _landed(state, update):
    """``state`` after ``update`` on the branch where it succeeded."""
    ok = [s2 for s2, o in step(state, update) if o.observation.status is Status.OK]
    assert ok, f"{update} cannot succeed"
    return ok[0]


def _statuses(state, action):
    return {(o.observation.status, o.because.status) for _, o in step(state, action)}


# ----- vocabulary ---------------------------------------------------------------------------


def test_a_worker_is_one_plain_scheduler_and_the_rotation_is_opt_in():
    assert W.router and not Config().router
    with pytest.raises(ValueError, match=r"Config\.router with ranks"):
        Config(router=True, ranks=2)
    with pytest.raises(ValueError, match="the exact lane"):
        Config(router=True, lane="exact")
    single = initial_state((Config(),))
    assert not enabled(single, LeaveRotation(0)) and not enabled(single, EnterRotation(0))
    s = initial_state(ROUTER_CONFIGS)
    assert all(ep.rotation for ep in s.endpoints)
    assert enabled(s, LeaveRotation(0)) and not enabled(s, EnterRotation(0))
    assert not enabled(s, Sleep(0))  # only the router's vocabulary on a worker
    out = after(s, LeaveRotation(0))
    # no traffic to a worker out of rotation; what it admitted before runs on
    assert not enabled(out, ServeRequest(0, "P")) and enabled(out, ServeRequest(1, "P"))
    held = after(s, StartRequest(0, "r1", "P"), LeaveRotation(0))
    assert enabled(held, FinishRequest(0, "r1"))


def test_config_fields_round_trip_and_stay_out_of_plain_traces():
    assert "router" not in config_json(Config())
    assert config_from_json(config_json(W), "c") == W


# ----- the spec: RTR-001 ---------------------------------------------------------------------


def test_a_worker_re_enters_only_once_its_sync_settled():
    s = initial_state(ROUTER_CONFIGS)
    out = after(s, LeaveRotation(0))
    assert settled(out, 0)
    assert _statuses(out, EnterRotation(0)) == {(Status.OK, RuleId.RTR_001)}
    # paused for its sync: refused, and it stays out
    paused = after(out, PauseGeneration(0, PauseMode.RETRACT))
    assert _statuses(paused, EnterRotation(0)) == {(Status.REJECTED, RuleId.RTR_001)}
    assert not step(paused, EnterRotation(0))[0][0].endpoint(0).rotation
    # behind the deployment: worker 1 moved to v1, worker 0 is still at v0
    behind = _landed(out, UpdateWeights(1, 1, DISK, True))
    assert deployment_version(behind) == 1 and not settled(behind, 0)
    assert _statuses(behind, EnterRotation(0)) == {(Status.REJECTED, RuleId.RTR_001)}
    # updated and continued: settled
    done = after(_landed(paused, UpdateWeights(0, 1, DISK, True)), ContinueGeneration(0))
    assert settled(done, 0)
    assert _statuses(done, EnterRotation(0)) == {(Status.OK, RuleId.RTR_001)}


def test_a_stale_or_closed_worker_is_not_settled():
    """An update whose flush a live request refused leaves the tree stale (closed, FC-002):
    the router keeps the worker out until its flush completes."""
    s = after(initial_state(ROUTER_CONFIGS), StartRequest(0, "r1", "P"), LeaveRotation(0))
    branches = step(s, UpdateWeights(0, 1, DISK, True))
    stale = [s2 for s2, o in branches if s2.endpoint(0).weights == 1 and s2.endpoint(0).closed]
    assert stale and not any(settled(s2, 0) for s2 in stale)
    for s2 in stale:
        assert _statuses(s2, EnterRotation(0)) == {(Status.REJECTED, RuleId.RTR_001)}


def test_an_update_of_a_serving_worker_in_rotation_drains_it_or_is_refused():
    s = initial_state(ROUTER_CONFIGS)
    branches = step(s, UpdateWeights(0, 1, DISK, True))
    refused = [s2 for s2, o in branches if o.because.status == RuleId.RTR_001]
    moved = [s2 for s2, o in branches if s2.endpoint(0).weights == 1]
    assert refused and all(s2.endpoint(0).rotation for s2 in refused)
    assert moved and not any(s2.endpoint(0).rotation for s2 in moved)
    # paused (the whole rotation paused for the sync): in place, or drained first
    paused = after(s, PauseGeneration(0, PauseMode.RETRACT))
    kept = {s2.endpoint(0).rotation for s2, _ in step(paused, UpdateWeights(0, 1, DISK, True))}
    assert kept == {True, False}


# ----- the reference router ------------------------------------------------------------------


def test_the_reference_engine_on_router_configs_runs_the_reference_workers():
    engine = InProcessAdapter(ReferenceEndpoint, "reference")
    engine.start(ROUTER_CONFIGS)
    a, b = engine.endpoints
    assert type(a) is RouterWorker and type(b) is RouterWorker
    assert isinstance(a.router, Rotation) and a.router is b.router
    assert engine.apply(UpdateWeights(0, 1, DISK, True)).status is Status.OK
    assert not a.rotation and a.router.newest == 1  # drained: it served
    assert engine.apply(LeaveRotation(1)).status is Status.OK
    assert engine.apply(EnterRotation(1)).status is Status.REJECTED  # v0 behind v1
    assert engine.apply(EnterRotation(0)).status is Status.OK and a.rotation


def test_the_mutant_is_killed_by_the_stateful_check(out_dir):
    result = run_check(
        registry.engine("readds-too-early"),
        registry.client("reference"),
        out_dir=out_dir,
        battery=False,
    )
    verdicts = {r.rule.id: r.verdict for r in result.rules}
    assert result.verdict == "FAIL" and verdicts["RTR-001"] == "FAIL"
    assert {v for k, v in verdicts.items() if k != "RTR-001"} & {"FAIL"} == set()


def test_the_reference_router_passes_at_ci_with_evidence_for_rtr_001(out_dir):
    engine = registry.engine("drains-serving-workers")
    assert engine.fixed_configs == ROUTER_CONFIGS
    result = run_check(engine, registry.client("reference"), out_dir=out_dir, battery=False)
    assert result.verdict == "PASS", [(r.rule.id, r.verdict, r.reason) for r in result.rules]
    verdicts = {r.rule.id: r for r in result.rules}
    assert verdicts["RTR-001"].verdict == "PASS" and verdicts["RTR-001"].evidence > 0


def test_the_regression_trace_replays():
    """The mutant's counterexample (a worker paused for its sync, taken out, put back)
    FAILS against the mutant and the model alone, and PASSES against the reference router."""
    trace = read_trace(REGRESSION)
    assert trace.header["engine"] == "readds-too-early"
    failed = replay_trace(trace, registry.engine("readds-too-early"), registry.client("reference"))
    assert failed.kind == "FAIL" and {v.rule for v in failed.violations} == {RuleId.RTR_001}
    fixed = replay_trace(trace, registry.engine("reference"), registry.client("reference"))
    assert fixed.kind == "PASS", [str(v) for v in fixed.violations]
    judged = replay_trace(trace, None, None)
    assert judged.kind == "FAIL" and RuleId.RTR_001 in {v.rule for v in judged.violations}


def test_the_look_alike_is_killed_where_the_reference_refuses():
    """``readds-at-newest-weights`` reads only the weight version: a worker paused for its
    sync at the deployment's weights is put back."""
    acts = [LeaveRotation(0), PauseGeneration(0, PauseMode.RETRACT), EnterRotation(0)]
    client = registry.client("reference")
    broken = replay_actions(
        registry.engine("readds-at-newest-weights"), client, ROUTER_CONFIGS, Policy(), acts
    )
    assert broken.kind == "FAIL" and {v.rule for v in broken.violations} == {RuleId.RTR_001}
    ok = replay_actions(registry.engine("reference"), client, ROUTER_CONFIGS, Policy(), acts)
    assert ok.kind == "PASS", [str(v) for v in ok.violations]


# ----- the explorer's router deployment ------------------------------------------------------


def test_the_router_model_state_count_is_pinned():
    """``kvfence explore --deployment router --depth 3`` at the CLI's other default bounds
    (one prefix, one request ID, versions <= 2, symmetry on): two workers behind one
    router. 3,300 states: requests, updates, flushes, pauses and continues on each worker,
    each taken out of the rotation and put back; the count moves only with the router's
    semantics. (At depth 4: 11,570 states, about 25 s on one core.)"""
    code, text = main_explore(depth=3, workers=1, deployment_name="router")
    assert code == 0, text
    assert "distinct states: 3,300 up to symmetry" in text and "transitions: 19,482" in text
    assert "PASS" in text


@pytest.mark.parametrize("mutant", ["readds-too-early", "readds-at-newest-weights"])
def test_the_explorer_kills_each_router_mutant_with_rtr_001(mutant):
    x = explore_adapter(
        registry.engine(mutant),
        registry.client("reference"),
        focus=RuleId.RTR_001,
        depth=3,
        out_dir=None,
        setups=deployment("router"),
    )
    assert {v.rule for v in x.violation} == {RuleId.RTR_001}, x.violation
    assert len(x.trace) == 3 and isinstance(x.trace[-1], EnterRotation)


def test_the_router_semantics_are_equivariant_under_renaming():
    """Swapping the two workers (same config) and renaming prefixes maps every successor
    onto a successor: the explorer's orbits stay sound with a rotation, on states where
    one worker is out of it."""
    from kvfence.model.candidates import actions
    from kvfence.model.state import Bounds
    from kvfence.model.symmetry import canonical, images

    two = Bounds(prefixes=("P", "Q"))
    start = initial_state(ROUTER_CONFIGS)
    seen, todo = {start}, [start]
    for _ in range(2):
        todo = [n.without_ledger() for s in todo for a in actions(s, two) for n, _ in step(s, a)]
        todo = [s for s in todo if s not in seen and not seen.add(s)]
    states = [s for s in seen if not all(ep.rotation for ep in s.endpoints)][:8]
    assert len(states) == 8

    def successors(s):
        return {canonical(n.without_ledger(), two) for a in actions(s, two) for n, _ in step(s, a)}

    for s in states:
        want = successors(s)
        for image in images(s, two):
            assert successors(image) == want
