"""The CLI's exit codes and messages: usage errors (bad numbers, unknown engines, clients
or designs, a wrong client signature, a focus that is not a rule) exit 3 before any run; a
client that crashes is its ERROR (exit 2), not a FAIL; an unwritable output folder keeps
the verdict; a closed pipe exits quietly; the matrices' exit codes tell a failure from an
unsettled run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.adapters import registry
from kvfence.adapters.mutants import UpdateNeverFlushes
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.conformance.cli import main
from kvfence.conformance.runner import run_check

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
    with pytest.raises(ValueError, match=r"did you mean 'sglang'"):
        registry.engine("sglangg")
    with pytest.raises(ValueError, match="kvfence engines"):
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


def adapter(cls=ReferenceEndpoint, caps=None, name="x"):
    a = InProcessAdapter(cls, name)
    if caps is not None:
        a.capabilities = caps
    return a


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--max-examples", "0"],
        ["check", "--timeout", "nan"],
        ["check", "--timeout", "-1"],
        ["explore", "--depth", "-1"],
        ["mutants", "--jobs", "0"],
    ],
)
def test_bad_numbers_are_usage_errors(argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 3


def test_engine_factory_that_raises_is_a_usage_error(capsys):
    assert main(["check", "--engine", "json:loads"]) == 3
    assert "cannot load" in capsys.readouterr().out


def test_unwritable_output_keeps_the_verdict(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["check", "--client", "never-flush", "--out", str(blocker / "sub")])
    out = capsys.readouterr().out
    assert code == 1 and "verdict: FAIL" in out and "could not write" in out


# ----- focus, CI, Hypothesis storage, memory; shrinker, trace verdict ---------------------


@pytest.mark.parametrize("focus", ["inv-001", "", "INV-1"])
def test_a_focus_that_is_not_a_rule_is_a_usage_error(focus, out_dir):
    """F-2: a focus that named no rule set every example aside, and the run PASSed."""
    with pytest.raises(ValueError, match="unknown rule"):
        run_check(adapter(UpdateNeverFlushes), registry.client("reference"), focus=focus)
