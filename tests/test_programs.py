"""Client programs: the call sequence of a sync, judged by the model (CLI-007..011).

The obligations are pure model functions (``model/obligations.py``), shown here one rule at
a time; then whole programs run in lockstep against the reference engine (each mutant
killed by its own rule on a setup where its mistake matters), recorded runs replayed, and
the CLI's ``--client-program``. The correct programs' checks at ci are their pass-matrix
rows, read in tests/test_designs.py.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest
from attrs import evolve

from kvfence.adapters import registry
from kvfence.adapters.programs import (
    AnyOnFlushesEverywhere,
    Endpoint0InfoOnly,
    PrefixOnlyReset,
    ReferenceProgram,
    RefusedResetIgnored,
    RequeueAcrossVersions,
    RequeueLabelsEveryVersion,
    ResetBeforeFinishProgram,
)
from kvfence.conformance.cli import EXIT_USAGE, main
from kvfence.conformance.matrix import killed, mutant_job, run_job
from kvfence.conformance.replay import replay_actions, replay_trace
from kvfence.conformance.trace import header, read_trace, step_json, write_trace
from kvfence.model.actions import (
    ContinueGeneration,
    FaultRefuseFlush,
    FlushCache,
    PauseGeneration,
    ServeRequest,
    StartRequest,
    SyncWeights,
    TraceError,
    UpdateWeights,
)
from kvfence.model.obligations import Owed, Partial, delivered, observe, raised, resumes
from kvfence.model.state import Config, Policy, initial_state, server_info
from kvfence.model.vocabulary import CacheMode, PauseMode, Status

ON = Config()
OFF = Config(radix=False, info=server_info(radix_cache_enabled=False))
ENCODER_SEPARATE = Config(encoder=True, encoder_reset_separate=True)
PROGRAM_MUTANTS = (
    "reset-before-finish",
    "refused-reset-ignored",
    "endpoint0-info-only",
    "prefix-only-reset",
    "requeue-across-versions",
    "two-phase-finish-without-flush",
)


def _calls(configs, calls, policy=Policy()):
    """Feed ``(action, status)`` calls of endpoint 0 to the obligations; every violation,
    with serving resumed at the end."""
    state = initial_state(configs, policy)
    owed, out = Owed(), []
    for action, status in calls:
        if isinstance(action, ContinueGeneration):
            owed, bad = resumes(owed, 0, "ContinueGeneration")
            out += bad
        owed, bad = observe(owed, state, action, status)
        out += bad
    owed, bad = resumes(owed, 0, "the end of the sync")
    return [v.rule for v in out + bad]


OK, REFUSED = Status.OK, Status.REJECTED
PAUSE, GO = PauseGeneration(0, PauseMode.RETRACT), ContinueGeneration(0)


# ----- the rules over a call sequence, one at a time ---------------------------------------


def test_a_reset_after_the_update_meets_the_obligation():
    calls = [(PAUSE, OK), (UpdateWeights(0, 1, flush_cache=False), OK), (FlushCache(0), OK)]
    assert _calls((ON,), [*calls, (GO, OK)]) == []


def test_a_reset_before_the_update_does_not_count():
    """PF-23: the right decision in the wrong order is CLI-008, not the missing flush."""
    calls = [(PAUSE, OK), (FlushCache(0), OK), (UpdateWeights(0, 1, flush_cache=False), OK)]
    assert _calls((ON,), [*calls, (GO, OK)]) == ["CLI-008"]


def test_no_reset_at_all_is_charged_the_rule_that_required_it():
    update = (UpdateWeights(0, 1, flush_cache=False), OK)
    assert _calls((ON,), [(PAUSE, OK), update, (GO, OK)]) == ["CLI-001"]
    unknown = Config(info=server_info())
    assert _calls((unknown,), [(PAUSE, OK), update, (GO, OK)]) == ["CLI-002"]
    assert _calls((ON,), [update], Policy(mode=CacheMode.FLUSH)) == ["CLI-004"]
    assert _calls((OFF,), [(PAUSE, OK), update, (GO, OK)]) == []  # reported off: none owed
    assert _calls((ON,), [update], Policy(mode=CacheMode.NONE)) == []  # the caller opted out


def test_a_flush_with_the_update_meets_it():
    assert _calls((ON,), [(PAUSE, OK), (UpdateWeights(0, 1, flush_cache=True), OK)]) == []


def test_a_refused_reset_must_be_acted_on():
    base = [(PAUSE, OK), (UpdateWeights(0, 1, flush_cache=False), OK), (FlushCache(0), REFUSED)]
    assert _calls((ON,), [*base, (GO, OK)]) == ["CLI-010"]
    assert _calls((ON,), [*base, (FlushCache(0), OK), (GO, OK)]) == []  # retried
    # left paused: nothing resumes, nothing owed is charged (the sync's end settles only
    # serving endpoints; see SyncRun.finish)
    state = initial_state((ON,), Policy())
    owed = Owed()
    for action, status in base:
        owed, _ = observe(owed, state, action, status)
    assert owed.kinds == {"prefix"} and owed.refused == {"prefix"}


def test_in_place_pause_with_a_flush_is_cli_007():
    calls = [(PauseGeneration(0, PauseMode.IN_PLACE), OK), (UpdateWeights(0, 1, None, True), OK)]
    assert _calls((ON,), calls) == ["CLI-007"]


def test_an_encoder_cache_left_to_the_client_is_owed():
    update = (UpdateWeights(0, 1, flush_cache=True), OK)
    assert _calls((ENCODER_SEPARATE,), [(PAUSE, OK), update, (GO, OK)]) == ["CLI-009"]
    from kvfence.model.actions import FlushEncoderCache

    reset = (FlushEncoderCache(0), OK)
    assert _calls((ENCODER_SEPARATE,), [(PAUSE, OK), update, reset, (GO, OK)]) == []
    assert _calls((Config(encoder=True),), [(PAUSE, OK), update, (GO, OK)]) == []  # ENG-012's


def test_raising_is_an_answer_only_after_a_failure():
    assert [v.rule for v in raised((Owed(),), "TypeError: oops")] == ["CLI-011"]
    assert raised((Owed(failed=True),), "SyncFailed") == []


# ----- whole programs in lockstep ------------------------------------------------------------


def _run(program, configs, actions, policy=Policy(), engine="reference"):
    adapter = registry.engine(engine)
    try:
        return replay_actions(adapter, program, configs, policy, actions)
    finally:
        adapter.close()


def _rules(replayed) -> set[str]:
    return {v.rule for v in replayed.violations}


MIXED = (OFF, ON)
"""Endpoint 0 without the radix cache, endpoint 1 with it: invisible one at a time."""


def test_endpoint0_info_only_fails_on_a_mixed_fleet_and_the_correct_programs_pass():
    actions = [ServeRequest(1, "P"), SyncWeights(1), ServeRequest(1, "P")]
    bad = _run(Endpoint0InfoOnly(), MIXED, actions)
    assert bad.kind == "FAIL" and "CLI-001" in _rules(bad), bad.violations
    assert any("endpoint 1" in v.where for v in bad.violations)
    assert _run(Endpoint0InfoOnly(), (ON, OFF), actions).kind == "PASS"  # 0 decides right
    for good in (ReferenceProgram(), AnyOnFlushesEverywhere()):
        assert _run(good, MIXED, actions).kind == "PASS", good.name


def test_a_refused_reset_comes_back_as_false_and_must_be_acted_on():
    actions = [ServeRequest(0, "P"), FaultRefuseFlush(0), SyncWeights(1), ServeRequest(0, "P")]
    bad = _run(RefusedResetIgnored(), (ON,), actions)
    assert bad.kind == "FAIL" and "CLI-010" in _rules(bad), bad.violations
    good = _run(ReferenceProgram(), (ON,), actions)  # retries: the fault is consumed
    assert good.kind == "PASS", good.violations
    flushes = [s for s in good.run.steps if isinstance(s.action, FlushCache)]
    assert [s.observed.flushed for s in flushes] == [False, True]


def test_reset_before_finish_is_cli_008():
    actions = [ServeRequest(0, "P"), SyncWeights(1), ServeRequest(0, "P")]
    bad = _run(ResetBeforeFinishProgram(), (ON,), actions)
    assert bad.kind == "FAIL" and _rules(bad) == {"CLI-008"}, bad.violations


def test_prefix_only_reset_leaves_stale_encoder_outputs():
    actions = [ServeRequest(0, "P"), SyncWeights(1), ServeRequest(0, "P")]
    engine = "encoder-left-to-client"
    bad = _run(PrefixOnlyReset(), (ENCODER_SEPARATE,), actions, engine=engine)
    assert bad.kind == "FAIL" and "CLI-009" in _rules(bad), bad.violations
    good = _run(ReferenceProgram(), (ENCODER_SEPARATE,), actions, engine=engine)
    assert good.kind == "PASS", good.violations
    resolver = _run(registry.client("reference"), (ENCODER_SEPARATE,), actions, engine=engine)
    assert resolver.kind == "PASS", resolver.violations  # the thin program resets it too


def test_a_verb_the_phase_does_not_allow_is_the_programs_failure():
    def continue_first(endpoints, version, policy):
        endpoints[0].continue_generation()  # not paused: the engine API refuses the call

    from kvfence.adapters.programs import ProgramClient

    r = _run(ProgramClient(continue_first, "continue-first"), (ON,), [SyncWeights(1)])
    assert r.kind == "FAIL" and _rules(r) == {"CLI-011"}
    assert "not allowed now" in str(r.violations[0].actual)


def test_a_call_the_deployment_has_no_model_of_is_beyond_the_spec_not_the_programs_failure():
    """The two-phase program on endpoints attached to the shared KV store: the store's model
    has no two-phase update (``semantics.STORE_ACTIONS``), so its ``begin_update`` is beyond
    the spec's bounds there, neither allowed nor forbidden: the replay is INVALID naming the
    call, never a CLI-011 FAIL of a correct program; on plain endpoints the same program
    PASSes."""
    from kvfence.adapters.programs import TwoPhaseProgram
    from kvfence.model.actions import BeginWeightUpdate
    from kvfence.model.semantics import modelled

    store = (Config(store=True), Config(store=True, lineage="sft-b", kv_format="fp8"))
    r = _run(TwoPhaseProgram(), store, [SyncWeights(1)])
    assert r.kind == "INVALID" and not r.violations, (r.kind, r.violations)
    assert "has no model of BeginWeightUpdate" in r.message, r.message
    assert _run(TwoPhaseProgram(), (ON, ON), [SyncWeights(1)]).kind == "PASS"
    state = initial_state(store)
    assert not modelled(state.endpoint(0), BeginWeightUpdate(0, 1))
    assert modelled(state.endpoint(0), UpdateWeights(0, 1))
    assert modelled(initial_state((ON,)).endpoint(0), BeginWeightUpdate(0, 1))


@pytest.mark.parametrize("name", PROGRAM_MUTANTS)
def test_program_mutant_killed_by_its_rule_in_the_kill_matrix(name, out_dir):
    from kvfence.adapters.mutants import BY_NAME

    mutant = BY_NAME[name]
    result = run_job(mutant_job(mutant, "ci", out_dir, 60.0, None))
    assert killed(mutant, result), (result.verdict, result.caught(), result.error)
    assert result.counterexample is not None and result.steps <= 6
    # the recorded run replays to the same rule, model-only and against the engine
    trace = read_trace(result.counterexample)
    assert any(s.program is not None for s in trace.steps)
    alone = replay_trace(trace, None, None)
    assert alone.kind == "FAIL" and mutant.rule in _rules(alone), alone.message
    again = replay_trace(trace, registry.engine(mutant.engine), registry.client(name))
    assert again.kind == "FAIL" and mutant.rule in _rules(again)


# ----- requeue across versions (CLI-012) -----------------------------------------------------


def test_a_stitched_response_is_labelled_with_every_version_it_spans():
    aborted = Partial(0, "r1", "P", frozenset({0}))
    kept = evolve(aborted, requeued=True, continuation=frozenset({1}))
    assert [v.rule for v in delivered(kept, frozenset({1}))] == ["CLI-012"]
    assert delivered(kept, frozenset({0, 1})) == []
    assert [v.rule for v in delivered(kept, frozenset({0, 1, 2}))] == ["CLI-012"]  # not sampled
    dropped = evolve(kept, kept=False)  # regenerated from the prompt: v1 alone
    assert delivered(dropped, frozenset({1})) == []
    assert [v.rule for v in delivered(dropped, frozenset({0, 1}))] == ["CLI-012"]
    assert delivered(aborted, frozenset({0})) == []  # the partial as it is


ABORT = Policy(pause_mode=PauseMode.ABORT)
IN_FLIGHT = [StartRequest(0, "r1", "P"), SyncWeights(1)]


class RequeueDiscardsPartial(RequeueLabelsEveryVersion):
    """The other correct answer: drop the partial, regenerate from the prompt under the new
    weights, label with the new version alone (slime's ``abort()`` without partial
    rollout, THUDM/slime PR #2092)."""

    name = "requeue-discards-partial"
    keep_partial = False


def test_requeue_across_versions_is_cli_012_and_the_correct_requeues_pass():
    bad = _run(RequeueAcrossVersions(), (ON,), IN_FLIGHT, ABORT)
    assert bad.kind == "FAIL" and _rules(bad) == {"CLI-012"}, bad.violations
    assert bad.violations[0].actual == "labelled [1]" and "[0, 1]" in bad.violations[0].expected
    for good in (RequeueLabelsEveryVersion(), RequeueDiscardsPartial()):
        r = _run(good, (ON,), IN_FLIGHT, ABORT)
        assert r.kind == "PASS", (good.name, r.violations)
        requeued = [
            s for s in r.run.steps if s.within is not None and s.action == ServeRequest(0, "P")
        ]
        assert len(requeued) == 1, good.name  # the requeue reached the engine
    # a retract pause aborts nothing: nothing is requeued, the mutant's mistake stays hidden
    assert _run(RequeueAcrossVersions(), (ON,), IN_FLIGHT).kind == "PASS"


def test_requeue_calls_are_recorded_and_replayed(tmp_path):
    """The requeue and the delivery are in the trace (``program.calls``), so a model-only
    replay judges the label again; a trace with a malformed call is refused by name."""
    import json

    bad = _run(RequeueAcrossVersions(), (ON,), IN_FLIGHT, ABORT)
    head = header("reference", "requeue-across-versions", None, "t", (ON,), ABORT)
    path = write_trace(tmp_path / "rq.jsonl", head, bad.run.lines, {"verdict": "FAIL"})
    trace = read_trace(path)
    sync = next(s for s in trace.steps if s.program is not None)
    assert [(c.verb, c.args) for c in sync.program.calls] == [
        ("requeue_request", ("r1", True)),
        ("deliver_response", ("r1", [1])),
    ]
    alone = replay_trace(trace, None, None)
    assert alone.kind == "FAIL" and _rules(alone) == {"CLI-012"}, alone.message
    fixed = replay_trace(trace, registry.engine("reference"), registry.client("reference"))
    assert fixed.kind == "PASS"
    lines = path.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if '"calls"' in line)
    obj = json.loads(lines[n])
    obj["program"]["calls"][1]["args"] = ["r1", ["one"]]
    lines[n] = json.dumps(obj)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match="deliver_response versions must be ints"):
        read_trace(path)


def test_requeue_of_a_request_never_aborted_is_the_programs_mistake():
    def requeue_stranger(endpoints, version, policy):
        endpoints[0].requeue_request("r9")

    from kvfence.adapters.programs import ProgramClient

    r = _run(ProgramClient(requeue_stranger, "requeue-stranger"), (ON,), IN_FLIGHT, ABORT)
    assert r.kind == "FAIL" and _rules(r) == {"CLI-011"}
    assert "not a request this sync aborted on endpoint 0" in str(r.violations[0].actual)


# ----- the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user's trainer module on ``sys.path``: a correct sync, a resolver-shaped function,
    and a sync with a bug of its own."""
    (tmp_path / "my_trainer.py").write_text(
        textwrap.dedent(
            """
            def sync(endpoints, version, policy):
                for ep in endpoints:
                    info = ep.server_info() or {}
                    off = info.get("radix_cache_enabled") is False
                    flush = policy.mode.value == "flush" or (
                        policy.mode.value == "auto" and not off
                    ) or policy.flush_cache is True
                    pause = "retract" if flush and policy.pause_mode.value == "in_place" else (
                        policy.pause_mode.value
                    )
                    ep.pause(pause)
                    if not ep.update_weights(version, flush_cache=flush):
                        raise RuntimeError("update failed; endpoint left paused")
                    ep.continue_generation()

            def resolve(mode, flush_cache, pause_mode, server_info):
                return True, "retract"

            def buggy(endpoints, version, policy):
                endpoints[0].update_weights(version, funnel="carrier-pigeon")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_trainer"
    sys.modules.pop("my_trainer", None)


def test_check_client_program_passes_a_correct_sync(user_module, tmp_path, capsys):
    argv = ["check", "--client-program", f"{user_module}:sync", "--out", str(tmp_path)]
    assert main([*argv, "--max-examples", "300"]) == 0, capsys.readouterr().out


def test_a_wrong_signature_is_a_usage_error(user_module, tmp_path, capsys):
    code = main(["check", "--client-program", f"{user_module}:resolve", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == EXIT_USAGE and "sync(endpoints, version, policy)" in out


def test_a_program_that_raises_is_the_clients_failure(user_module, tmp_path, capsys):
    argv = ["check", "--client-program", f"{user_module}:buggy", "--out", str(tmp_path)]
    code = main([*argv, "--max-examples", "50", "-v"])
    out = capsys.readouterr().out
    assert code == 1 and "CLI-011" in out and "carrier-pigeon" in out
    assert re.search(r"^ADP-001\s+PASS", out, re.M)  # not an adapter failure


PF23 = Path(__file__).parent / "regressions" / "PF-23-reset-before-finish.jsonl"


def test_pf23_is_a_replayable_program_trace_that_names_cli_008(tmp_path):
    """PF-23 (huggingface/trl PR #6765 review) through the program protocol: the sync's own
    calls are recorded (pause, reset, update without a flush, continue) and replay judges
    them: CLI-008 alone, model-only and against the engine; a correct program on the same
    trace passes. Writing the recorded run back out and reading it again keeps every line
    (the round trip a ``kvfence replay`` of a program run relies on)."""
    from kvfence.adapters.cases import BY_ID

    case = BY_ID["PF-23"]
    assert (case.mutant, case.rule) == ("reset-before-finish", "CLI-008")
    trace = read_trace(PF23)
    sync = next(s for s in trace.steps if s.program is not None)
    calls = [type(s.action).__name__ for s in trace.steps if s.within == sync.step]
    assert calls == ["PauseGeneration", "FlushCache", "UpdateWeights", "ContinueGeneration"]
    assert [c.endpoint for c in sync.program.infos] == [0]
    for replayed in (
        replay_trace(trace, None, None),
        replay_trace(trace, registry.engine("reference"), registry.client(case.mutant)),
    ):
        assert replayed.kind == "FAIL" and _rules(replayed) == {"CLI-008"}, replayed.message
        assert [v.actual for v in replayed.violations] == ["reset only before the update"]
    good = replay_trace(trace, registry.engine("reference"), registry.client("reference-program"))
    assert good.kind == "PASS", good.violations
    # the round trip: the replayed run written as a trace reads back to the same lines
    again = replay_trace(trace, registry.engine("reference"), registry.client(case.mutant))
    head = header("reference", case.mutant, None, "case", trace.configs, trace.policy)
    out = write_trace(tmp_path / "pf23.jsonl", head, again.run.lines, {"verdict": "FAIL"})
    back = read_trace(out)
    assert [step_json(s) for s in back.steps] == [step_json(s) for s in trace.steps]
    assert _rules(replay_trace(back, None, None)) == {"CLI-008"}


@pytest.mark.skip(reason="needs two-phase actions (task T)")
def test_pf23_reset_between_begin_and_finish():
    """PF-23 exactly (huggingface/trl PR #6765 review): BeginWeightUpdate; FlushCache ->
    True; ServeRequest(P) admitted meanwhile and cached under half-updated weights;
    FinishWeightUpdate(flush_cache=False); ServeRequest(P) hits that KV. Expected: CLI-008
    (the reset came before the weights were final) and INV-001 on the second ServeRequest.
    TODO(integrator): once task T's actions land, add ``begin_weight_update`` /
    ``finish_weight_update`` to ``conformance.program.VERBS``, make ``observe`` treat
    FinishWeightUpdate as the update that installs the final weights, record this trace
    under tests/regressions, and drop the skip."""


# ----- lifecycle and two-phase verbs ------------------------------------------------------------

from kvfence.adapters.programs import (  # noqa: E402
    ColocatedProgram,
    ProgramClient,
    TwoPhaseFinishWithoutFlush,
    TwoPhaseProgram,
)
from kvfence.model.actions import (  # noqa: E402
    AbortWeightUpdate,
    BeginWeightUpdate,
    FinishWeightUpdate,
    PublishVersion,
    Sleep,
    UpdateWeightChunk,
    WakeUp,
)
from kvfence.model.vocabulary import MemoryTag  # noqa: E402

STALE_RISK = [ServeRequest(0, "P"), SyncWeights(1), ServeRequest(0, "P")]
"""P cached under version 0, a sync, P again: stale reuse shows unless the sync flushed."""


def _driven(replayed) -> list[object]:
    return [s.action for s in replayed.run.steps if s.within is not None]


def test_a_finished_two_phase_update_owes_what_an_update_owes():
    begin, chunk = (BeginWeightUpdate(0, 1), OK), (UpdateWeightChunk(0), OK)
    finish = (FinishWeightUpdate(0, flush_cache=False), OK)
    assert _calls((ON,), [(PAUSE, OK), begin, chunk, finish, (GO, OK)]) == ["CLI-001"]
    reset = (FlushCache(0), OK)
    assert _calls((ON,), [(PAUSE, OK), begin, chunk, finish, reset, (GO, OK)]) == []
    flushed = (FinishWeightUpdate(0, flush_cache=True), OK)
    assert _calls((ON,), [(PAUSE, OK), begin, chunk, flushed, (GO, OK)]) == []
    # PF-23's order: the reset lands inside the window, before the weights are final
    assert _calls((ON,), [(PAUSE, OK), begin, chunk, reset, finish, (GO, OK)]) == ["CLI-008"]
    # a window given up installs nothing: nothing is owed
    assert _calls((ON,), [(PAUSE, OK), begin, chunk, (AbortWeightUpdate(0), OK), (GO, OK)]) == []


def test_a_pause_that_cleared_the_cache_counts_as_the_flush():
    """vLLM /pause?clear_cache=true: nothing is computed between the pause and the update
    (PAUSED admits no prefill), so the update needs no flush of its own. The model state
    carries it (``cleared``), so the obligation is read after the pause is applied."""
    from kvfence.model import semantics as spec

    state = initial_state((ON,), Policy())
    owed = Owed()
    for action in (PauseGeneration(0, PauseMode.ABORT, clear_cache=True),):
        owed, _ = observe(owed, state, action, OK)
        ((state, _),) = spec.step(state, action)
    owed, bad = observe(owed, state, UpdateWeights(0, 1, flush_cache=False), OK)
    assert bad == [] and owed.kinds == frozenset()
    plain = initial_state((ON,), Policy())
    ((plain, _),) = spec.step(plain, PauseGeneration(0, PauseMode.ABORT))
    owed, _ = observe(Owed(), plain, UpdateWeights(0, 1, flush_cache=False), OK)
    assert owed.kinds == {"prefix"}  # the same pause without the clear owes the reset


def test_colocated_program_sleeps_updates_and_wakes_and_passes():
    r = _run(ColocatedProgram(), (ON,), STALE_RISK)
    assert r.kind == "PASS", r.violations
    driven = _driven(r)
    kinds = [type(a).__name__ for a in driven]
    assert kinds == [
        "Sleep",
        "WakeUp",
        "UpdateWeights",
        "FlushCache",
        "WakeUp",
    ], kinds
    assert driven[0].tags == frozenset(MemoryTag) and driven[1].tags == {MemoryTag.WEIGHTS}
    assert driven[-1].tags == {MemoryTag.KV_CACHE}
    # the flush ran while the KV memory was released, and the endpoint serves again
    last = r.run.steps[-1]
    assert isinstance(last.action, ServeRequest) and last.observed.status is Status.OK


def test_colocated_sync_that_wakes_before_the_reset_is_charged():
    """The obligations settle at the WakeUp that resumes serving, not at the sync's end."""

    def wake_then_reset(endpoints, version, policy):
        for ep in endpoints:
            ep.release_memory()
            ep.resume_memory(["weights"])
            ep.update_weights(version, flush_cache=False)
            ep.resume_memory(["kv_cache"])  # serving again, the old KV index still owed
            ep.flush_cache()

    r = _run(ProgramClient(wake_then_reset, "wake-then-reset"), (ON,), STALE_RISK)
    assert r.kind == "FAIL" and "CLI-001" in _rules(r), r.violations
    assert any("at WakeUp" in v.where for v in r.violations)


def test_two_phase_program_passes_and_its_mutant_fails_cli_001():
    good = _run(TwoPhaseProgram(), (ON,), STALE_RISK)
    assert good.kind == "PASS", good.violations
    kinds = [type(a).__name__ for a in _driven(good)]
    assert kinds == [
        "PauseGeneration",
        "BeginWeightUpdate",
        "UpdateWeightChunk",
        "UpdateWeightChunk",
        "FinishWeightUpdate",
        "ContinueGeneration",
        "PublishVersion",
    ], kinds
    bad = _run(TwoPhaseFinishWithoutFlush(), (ON,), STALE_RISK)
    assert bad.kind == "FAIL" and "CLI-001" in _rules(bad), bad.violations
    assert "INV-001" in _rules(bad)  # and the stale KV was served again
    # where the endpoint needs no flush (radix off), the same calls pass
    assert _run(TwoPhaseFinishWithoutFlush(), (OFF,), STALE_RISK).kind == "PASS"


def test_new_verbs_name_bad_arguments():
    from kvfence.conformance.program import VERBS, ProgramError

    for verb, args, word in [
        ("release_memory", (["gpu"],), "kv_cache, weights"),
        ("resume_memory", (7,), "resume_memory(tags)"),
        ("finish_update", ("yes",), "finish_update(flush_cache)"),
        ("begin_update", ("1",), "begin_update(version)"),
        ("begin_update", (1, "pigeon"), "begin_update(funnel)"),
        ("publish_version", (1, "no"), "publish_version(abort_requests)"),
        ("pause", ("abort", 1), "pause(clear_cache)"),
    ]:
        with pytest.raises(ProgramError, match=re.escape(word)):
            VERBS[verb](0, *args)
    assert VERBS["release_memory"](0, None) == Sleep(0)
    assert VERBS["resume_memory"](0, ["weights"]) == WakeUp(0, frozenset({MemoryTag.WEIGHTS}))
    assert VERBS["publish_version"](0, 2, True) == PublishVersion(0, 2, True)


def test_a_verb_the_engine_cannot_take_is_an_error_not_a_client_verdict():
    """Fail-closed: an engine without ``sleep`` cannot judge a colocated sync (ERROR)."""
    from kvfence.model.capabilities import Capability

    adapter = registry.engine("reference")
    adapter.capabilities = adapter.capabilities - {Capability.SLEEP, Capability.MEMORY_TAGS}
    try:
        r = replay_actions(adapter, ColocatedProgram(), (ON,), Policy(), STALE_RISK)
    finally:
        adapter.close()
    assert r.kind == "ERROR", (r.kind, r.violations)
    assert "sleep" in r.message

    def clears_at_pause(endpoints, version, policy):
        for ep in endpoints:
            ep.pause("abort", clear_cache=True)  # not a no-op: it would have flushed
            ep.update_weights(version, flush_cache=False)
            ep.continue_generation()

    adapter = registry.engine("reference")
    adapter.capabilities = adapter.capabilities - {Capability.PAUSE, Capability.PAUSE_CLEAR}
    program = ProgramClient(clears_at_pause, "clears-at-pause")
    try:
        r = replay_actions(adapter, program, (ON,), Policy(), STALE_RISK)
    finally:
        adapter.close()
    assert r.kind == "ERROR" and "pause" in r.message, (r.kind, r.message)
    assert _run(program, (ON,), STALE_RISK).kind == "PASS"  # where the engine can pause


def test_a_colocated_reset_refused_while_asleep_is_retried_before_waking():
    """The refused reset (an injected fault, spent on the first attempt) is asked again
    with the KV still released; only then does the endpoint wake and serve."""
    actions = [ServeRequest(0, "P"), FaultRefuseFlush(0), SyncWeights(1), ServeRequest(0, "P")]
    r = _run(ColocatedProgram(), (ON,), actions)
    assert r.kind == "PASS", r.violations
    flushes = [s for s in r.run.steps if isinstance(s.action, FlushCache)]
    assert [s.observed.flushed for s in flushes] == [False, True]
    ignored = _run(RefusedResetIgnored(), (ON,), actions)  # the pause-based mutant, same fault
    assert ignored.kind == "FAIL" and "CLI-010" in _rules(ignored)
