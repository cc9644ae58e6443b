"""Trust fixes found by adversarial and new-user trials: each test reproduces one finding
(it failed on main at 1f24e52) and shows the fix.

False FAILs (a correct system failed), a false PASS (few capabilities, MUST rules SKIP), and
the CLI's exit codes and messages a new user met.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from attrs import evolve

from kvfence.adapters.clients import ReferenceClient
from kvfence.adapters.designs import AbortsThenFlushes, AlwaysFlushes
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint, Reply
from kvfence.conformance.cli import main
from kvfence.conformance.replay import replay_actions
from kvfence.model.actions import (
    ContinueGeneration,
    FaultRefuseFlush,
    FinishRequest,
    PauseGeneration,
    ServeRequest,
    StartRequest,
    UpdateWeights,
)
from kvfence.model.observation import View
from kvfence.model.state import Config, Policy
from kvfence.model.vocabulary import CacheMode, Funnel, Lane, PauseMode

T = Funnel.TENSOR
EXACT = Config(lane=Lane.EXACT)
STANDARD = Config()
OPT_OUT = Policy(mode=CacheMode.NONE)


def replay(cls, configs, actions, policy=OPT_OUT):
    engine = InProcessAdapter(cls, cls.__name__)
    return replay_actions(engine, ReferenceClient(), configs, policy, actions)


def rules(result) -> set[str]:
    return {v.rule for v in result.violations}


# ----- 1. a missing version label is not observed, not a lie ------------------------------


class NoLabel(ReferenceEndpoint):
    """An engine without a version label on its ``/weight_info`` (label ``None``)."""

    def weight_info(self) -> View:
        return evolve(super().weight_info(), label=None)


def test_an_engine_without_a_version_label_is_not_inv003():
    """Was INV-003 'expected 1, got None' after every update."""
    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, T, True), ServeRequest(0, "P")]
    r = replay(NoLabel, (STANDARD,), actions, Policy())
    assert r.kind == "PASS", [str(v) for v in r.violations]


def test_a_wrong_label_is_still_inv003():
    class StaleLabel(ReferenceEndpoint):
        def _install(self, version, funnel):
            super()._install(version, funnel)
            self.label = version - 1

    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, T, True)]
    assert "INV-003" in rules(replay(StaleLabel, (STANDARD,), actions, Policy()))


# ----- 2. abort-then-flush on an exact lane -----------------------------------------------


def test_abort_then_flush_on_an_exact_lane_passes():
    """Was FC-001: the refused mandatory flush was made possible by aborting the requests
    holding KV, then the flush ran; safe."""
    actions = [StartRequest(0, "r1", "P"), UpdateWeights(0, 1, T, False), ServeRequest(0, "P")]
    r = replay(AbortsThenFlushes, (EXACT,), actions)
    assert r.kind == "PASS", [str(v) for v in r.violations]
    assert r.run.lines[1]["observed"]["status"] == "ok"
    assert r.run.lines[2]["observed"]["response"]["hit"] is False


def test_abort_then_flush_after_a_retract_pause_and_an_injected_refusal_passes():
    """Was ENG-003: with retract pause nothing holds KV; the injected refusal of the first
    flush is met by aborting the retracted requests and flushing again."""
    actions = [
        StartRequest(0, "r1", "P"),
        PauseGeneration(0, PauseMode.RETRACT),
        FaultRefuseFlush(0),
        UpdateWeights(0, 1, T, False),
        ContinueGeneration(0),
        ServeRequest(0, "P"),
    ]
    r = replay(AbortsThenFlushes, (EXACT,), actions)
    assert r.kind == "PASS", [str(v) for v in r.violations]
    assert r.run.lines[3]["observed"]["status"] == "ok"


def test_an_update_that_aborts_but_keeps_the_stale_cache_still_fails():
    """The new branch is no blanket waiver: aborting and then not flushing is ENG-001."""

    class AbortsOnly(ReferenceEndpoint):
        def update_weights(self, version, funnel, flush_cache):
            self.requests.clear()
            self._install(version, funnel)
            return Reply(True)

    actions = [
        ServeRequest(0, "P"),
        StartRequest(0, "r1", "Q"),
        UpdateWeights(0, 1, T, False),
        ServeRequest(0, "P"),
    ]
    assert replay(AbortsOnly, (EXACT,), actions).kind == "FAIL"


# ----- 3. an always-flush engine may refuse an update it cannot flush for -----------------


def test_always_flush_rejecting_an_unflushable_opt_out_update_passes():
    """Was LIV-002: flush_cache=False while a request holds KV; the engine flushes on every
    update, cannot here, and rejects the update cleanly (nothing changed)."""
    actions = [
        StartRequest(0, "r1", "P"),
        UpdateWeights(0, 1, T, False),
        FinishRequest(0, "r1"),
        UpdateWeights(0, 1, T, False),
        ServeRequest(0, "P"),
    ]
    r = replay(AlwaysFlushes, (STANDARD,), actions)
    assert r.kind == "PASS", [str(v) for v in r.violations]
    assert [line["observed"]["status"] for line in r.run.lines[1:2]] == ["rejected"]
    assert r.run.lines[4]["observed"]["response"]["hit"] is False


def test_rejecting_an_update_that_holds_nothing_is_still_liv002():
    """The branch exists only where the extra flush could not run: a refusal with nothing
    holding KV is LIV-002 as before."""

    class RefusesUpdates(ReferenceEndpoint):
        def update_weights(self, version, funnel, flush_cache):
            return Reply(False, message="no")

    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, T, False)]
    assert "LIV-002" in rules(replay(RefusesUpdates, (STANDARD,), actions))


# ----- 4. --require: a CI user demands capabilities; MUST rules SKIP warn -----------------

FEW = """
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint


def build():
    adapter = InProcessAdapter(ReferenceEndpoint, "few-capabilities")
    adapter.capabilities = frozenset({"weights_probe", "cache_probe", "inflight"})
    return adapter
"""


@pytest.fixture
def few_engine(tmp_path, monkeypatch):
    """An engine adapter loaded as ``module:function`` that declares three capabilities."""
    (tmp_path / "few_caps_engine.py").write_text(FEW)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "few_caps_engine:build"


def test_few_capabilities_pass_but_warn_of_must_rules_skip(few_engine, tmp_path, capsys):
    """Was: exit 0 and not a word about the MUST rules nobody exercised."""
    argv = ["check", "--engine", few_engine, "--max-examples", "30", "--out", str(tmp_path)]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "warning: MUST rules SKIP, never exercised:" in out
    assert "ENG-009 (needs pause)" in out and "--require" in out


def test_require_names_the_missing_capability_and_exits_2(few_engine, tmp_path, capsys):
    argv = ["check", "--engine", few_engine, "--require", "cache_probe,pause"]
    code = main([*argv, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 2, out
    assert "required capability pause is not declared" in out
    assert "ENG-009" in out and "cache_probe" not in out.split("required")[1].split("\n")[0]
    assert "verdict:" not in out  # not run


def test_require_met_runs_as_usual(tmp_path, capsys):
    argv = ["check", "--require", "cache_probe,pause"]  # the default budget: every rule seen
    assert main([*argv, "--out", str(tmp_path)]) == 0
    assert "warning: MUST rules SKIP" not in capsys.readouterr().out


def test_a_rule_of_another_profile_is_not_at_stake_not_skip(tmp_path):
    """CLI-009 (the client resets an encoder cache the engine leaves to it) binds only engines
    whose profile sets encoder_reset_separate: on the reference, which resets it on every
    update, it is N/A with that reason, not a SKIP the MUST-SKIP warning would name."""
    from kvfence.adapters import registry
    from kvfence.conformance.cli import must_skipped
    from kvfence.conformance.runner import run_check

    result = run_check(
        registry.engine("reference"),
        registry.client("reference"),
        out_dir=tmp_path,
        max_examples=20,
    )
    by_id = {r.rule.id: r for r in result.rules}
    assert by_id["CLI-009"].verdict == "N/A"
    assert "encoder_reset_separate" in by_id["CLI-009"].reason
    assert "CLI-009" not in must_skipped(result)


class SaysSeparateButNoReset(InProcessAdapter):
    """A profile that leaves the encoder reset to the client, without the call to do it."""

    def __init__(self) -> None:
        super().__init__(ReferenceEndpoint, "says-separate")
        self.profile = {"encoder_reset_separate": True}
        self.capabilities = self.capabilities - {"encoder_reset"}


def test_a_profile_without_its_capability_is_an_adapter_error(tmp_path):
    from kvfence.adapters import registry
    from kvfence.conformance.runner import run_check

    result = run_check(
        SaysSeparateButNoReset(), registry.client("reference"), out_dir=tmp_path, max_examples=5
    )
    assert result.verdict == "ERROR", result.verdict
    assert "encoder_reset_separate" in result.error and "ADP-002" in result.error


def test_require_unknown_capability_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", "--require", "cache_probe,telepathy"])
    assert e.value.code == 3
    assert "telepathy is not a capability" in capsys.readouterr().err


# ----- 5. a client that crashes is the client's ERROR; a wrong signature is usage ---------

CLIENTS = """
def crashes(mode, flush_cache, pause_mode, server_info):
    raise RuntimeError("resolver crashed: no config file")


def two_args(policy, info):
    return (True, "retract")
"""


@pytest.fixture
def bad_clients(tmp_path, monkeypatch):
    (tmp_path / "bad_clients_mod.py").write_text(CLIENTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "bad_clients_mod"


def test_a_client_that_crashes_everywhere_is_its_error_not_a_fail(bad_clients, tmp_path, capsys):
    """Was FAIL (exit 1) of CLI-001..005 beside 'ADP-001 PASS every call answered'."""
    argv = ["check", "--client", f"{bad_clients}:crashes", "--out", str(tmp_path)]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 2, out
    assert "verdict: ERROR" in out
    assert f"the client '{bad_clients}:crashes' crashed" in out and "RuntimeError" in out
    assert "every call answered" not in out


def test_a_client_with_the_wrong_signature_is_a_usage_error_before_the_run(
    bad_clients, tmp_path, capsys
):
    argv = ["check", "--client", f"{bad_clients}:two_args", "--out", str(tmp_path)]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 3, out
    assert "cannot be called as fn(mode, flush_cache, pause_mode, server_info)" in out
    assert "verdict:" not in out


def test_a_partial_refusal_names_the_refusals_in_the_adp_note(tmp_path):
    """A client that raises on some configurations only is judged on each (a refusal is
    that configuration's CLI FAIL); the ADP note no longer says 'every call answered'
    alone."""

    class RaisesWhenUnreported:
        name = "raises-when-unreported"

        def resolve(self, policy, info):
            if info is None:
                raise RuntimeError("no server info")
            return ReferenceClient().resolve(policy, info)

    from kvfence.adapters import registry
    from kvfence.conformance.runner import run_check

    engine = registry.engine("reference")
    r = run_check(engine, RaisesWhenUnreported(), out_dir=tmp_path, max_examples=20)
    notes = {x.rule.id: x.reason for x in r.rules}
    assert r.verdict == "FAIL"
    assert "the client raised on CLI-002" in notes["ADP-001"]


# ----- 6. a focused run that FAILs on a set-aside example writes its counterexample -------


def test_focus_failing_on_a_set_aside_example_writes_a_counterexample(tmp_path):
    """Was: FAIL with counterexample None (nothing to replay)."""
    from kvfence.adapters import registry
    from kvfence.conformance.runner import run_check

    engine = registry.engine("guard-missing-on-disk")
    r = run_check(engine, ReferenceClient(), out_dir=tmp_path, focus="ENG-006", max_examples=60)
    assert r.verdict == "FAIL"
    assert r.counterexample is not None and r.counterexample.exists()
    assert r.caught() and set(r.caught()) <= {"ENG-001", "FC-001"}
    assert main(["replay", str(r.counterexample)]) == 1  # it reproduces


# ----- 7. unknown names: the same exit code in check and replay --------------------------


def test_replay_and_check_agree_on_an_unknown_engine_or_client(tmp_path, capsys):
    assert main(["check", "--engine", "no-such-engine"]) == 3
    assert main(["check", "--client", "no-such-client"]) == 3
    main(["check", "--client", "never-flush", "--out", str(tmp_path)])
    (trace,) = tmp_path.glob("counterexample-*.jsonl")
    capsys.readouterr()
    assert main(["replay", str(trace), "--engine", "no-such-engine"]) == 3
    assert main(["replay", str(trace), "--client", "no-such-client"]) == 3
    assert "usage: unknown" in capsys.readouterr().out


# ----- 8. kvfence mutants: UNKNOWN is neither pass nor fail -------------------------------


def test_mutants_exit_code_for_an_unknown_design_is_2_with_the_reason(tmp_path, capsys):
    """Was exit 1 (as for a surviving mutant) and no word on why."""
    argv = ["mutants", "--only", "reference", "--max-examples", "1", "--jobs", "1"]
    code = main([*argv, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 2, out
    assert "UNKNOWN reference:" in out and "never exercised" in out


# ----- 9. a closed pipe ------------------------------------------------------------------


@pytest.mark.parametrize("command", ["diagram", "rules"])
def test_a_closed_pipe_exits_quietly(command):
    kvfence = Path(sys.executable).with_name("kvfence")
    done = subprocess.run(
        f"'{kvfence}' {command} | head -c 1", shell=True, capture_output=True, text=True
    )
    assert done.returncode == 0
    assert "Error" not in done.stderr and "Traceback" not in done.stderr, done.stderr


# ----- 10. explore: help for every option, a per-run counterexample name ------------------


def test_every_explore_option_has_help(capsys):
    with pytest.raises(SystemExit):
        main(["explore", "--help"])
    text = capsys.readouterr().out.split("options:", 1)[1]
    for option in ("--endpoints", "--prefixes", "--versions", "--inflight", "--depth", "--out"):
        after = text.split(option, 1)[1].split("\n  -", 1)[0]
        assert len(after.split()) > 2, (option, after)  # more than its metavar


def test_explore_counterexamples_are_named_per_run(tmp_path, capsys):
    argv = ["explore", "--engine", "update-never-flushes", "--depth", "3", "--out", str(tmp_path)]
    names = set()
    for _ in range(2):
        assert main(argv) == 1
        names |= {p.name for p in tmp_path.glob("explore-counterexample-*.jsonl")}
    assert len(names) == 2, names
    assert all(re.search(r"-\d{8}T\d{6}Z-\d+(-\d+)?\.jsonl$", n) for n in names), names


# ----- duplicates mended -------------------------------------------------------------------


def test_sglang_is_named_once_and_built_by_engine_alone():
    """``ENGINES["sglang"]`` was never reached (``engine`` builds SGLang itself); the help and
    the unknown-name message still list it."""
    from kvfence.adapters import registry

    assert "sglang" not in registry.ENGINES
    assert {"sglang", "sglang@VERSION"} <= set(registry.ENGINE_NAMES)
    with pytest.raises(ValueError, match="not an SGLang version number"):
        registry.engine("sglang@latest")
    with pytest.raises(ValueError, match=r"known: .*sglang, sglang@VERSION"):
        registry.engine("no-such-engine")


def _result(verdict, violations=()):
    from kvfence.conformance.runner import Result

    return Result("e", "c", "ci", None, verdict, (), tuple(violations), "", None, 0, 0, 0.0)


def test_matrix_exit_codes_tell_a_failure_from_an_unsettled_run():
    from kvfence.adapters.designs import DESIGNS
    from kvfence.adapters.mutants import MUTANTS
    from kvfence.conformance.matrix import Matrices
    from kvfence.conformance.verdict import Verdict
    from kvfence.model.checks import Violation

    design, mutant = DESIGNS[0], MUTANTS[0]
    caught = _result(Verdict.FAIL, [Violation(mutant.rule, 1, 2)])
    fine = Matrices(((design, _result(Verdict.PASS)),), ((mutant, caught),), 0.0)
    assert fine.exit_code == 0 and fine.unsettled() == []
    unknown = Matrices(((design, _result(Verdict.UNKNOWN)),), ((mutant, caught),), 0.0)
    assert unknown.exit_code == 2 and unknown.unsettled()[0].startswith("UNKNOWN reference:")
    broken = Matrices(((design, _result(Verdict.FAIL)),), ((mutant, caught),), 0.0)
    assert broken.exit_code == 1
    survived = Matrices(((design, _result(Verdict.PASS)),), ((mutant, _result(Verdict.PASS)),), 0.0)
    assert survived.exit_code == 1
    wrong_rule = _result(Verdict.FAIL, [Violation("ADP-002", 1, 2)])
    assert Matrices((), ((mutant, wrong_rule),), 0.0).exit_code == 1
    errored = Matrices((), ((mutant, _result(Verdict.ERROR)),), 0.0)
    assert errored.exit_code == 2
