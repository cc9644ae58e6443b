"""The command line: exit codes, reports, usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvfence.conformance.cli import main


def test_check_reference_passes_and_writes_reports(tmp_path, capsys):
    junit, results = tmp_path / "junit.xml", tmp_path / "results.json"
    code = main(
        ["check", "-v", "--out", str(tmp_path), "--junit", str(junit), "--json", str(results)]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "verdict: PASS" in out and "ENG-001" in out
    data = json.loads(results.read_text())
    assert data[0]["verdict"] == "PASS"
    assert {r["id"] for r in data[0]["rules"]} >= {"ENG-001", "FC-001", "INV-001"}
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "0" and suite.get("errors") == "0"


def test_check_failing_client_exits_1_with_counterexample(tmp_path, capsys):
    code = main(["check", "--client", "never-flush", "--out", str(tmp_path)])
    assert code == 1
    out = capsys.readouterr().out
    assert "counterexample" in out and "kvfence replay" in out
    assert list(tmp_path.glob("counterexample-*.jsonl"))


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--engine", "no-such-engine"],
        ["check", "--client", "no_such_module:resolve"],
        ["check", "--profile", "forever"],
        ["mutants", "--only", "no-such-mutant"],
        ["frobnicate"],
        [],
    ],
)
def test_usage_errors_exit_3(argv):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    assert code == 3


def test_rules_and_diagram(capsys):
    assert main(["rules", "--markdown"]) == 0
    table = capsys.readouterr().out
    assert "| ENG-001 | ExactLaneGuardFlushes | MUST |" in table
    assert main(["diagram"]) == 0
    assert "stateDiagram" in capsys.readouterr().out


def test_mutants_subset(tmp_path, capsys):
    code = main(
        ["mutants", "--only", "guard-missing-on-disk", "--jobs", "1", "--out", str(tmp_path)]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "killed" in out and "1/1 mutants killed by their rule" in out


def test_console_script_is_installed():
    """The `kvfence` script pip installs beside this interpreter (not `python -m`)."""
    script = Path(sys.executable).with_name("kvfence")
    assert script.exists(), f"no console script at {script}: reinstall with pip install -e ."
    proc = subprocess.run([str(script), "rules"], capture_output=True, text=True)
    assert proc.returncode == 0 and "NoStalePrefixReuse" in proc.stdout


def test_pytest_plugin_fixture_and_options(tmp_path):
    """The plugin as a user meets it: the fixture in their tests, and the CLI options."""
    (tmp_path / "test_mine.py").write_text(
        "def test_resolver(kvfence_check):\n"
        "    result = kvfence_check(engine='reference', client='reference')\n"
        "    assert result.verdict == 'PASS'\n"
        "    bad = kvfence_check(engine='reference', client='never-flush')\n"
        "    assert bad.verdict == 'FAIL' and 'CLI-001' in bad.caught()\n"
    )
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    proc = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run(
        [*run, "--kvfence-engine", "guard-missing-on-disk"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    assert "ENG-001" in proc.stdout and "counterexample" in proc.stdout


# ----- focus, replay levels, hints, names, server info -----------------------------------


def test_check_focus_flag_and_unknown_rules(tmp_path, capsys):
    """`--focus RULE` exists on the CLI (it was only in the API); a focus that is not a rule
    ID is a usage error (it used to set every example aside and PASS)."""
    code = main(["check", "--engine", "sleep-keeps-index", "--focus", "ENG-006"])
    assert code == 1 and "ENG-006" in capsys.readouterr().out
    for bad in ("inv-001", "", "NOPE-1"):
        with pytest.raises(SystemExit) as e:
            main(["check", "--focus", bad, "--out", str(tmp_path)])
        assert e.value.code == 3


@pytest.fixture(scope="module")
def should_only_trace(tmp_path_factory):
    """A counterexample breaking only a SHOULD rule (INV-004): a check focused on it stops
    once it is shown (the battery's first scenario), instead of running the whole ci
    budget; a SHOULD rule alone never fails the check."""
    out = tmp_path_factory.mktemp("should")
    argv = ["check", "--engine", "hit-path-numerics-differ", "--focus", "INV-004"]
    assert main([*argv, "--out", str(out)]) != 1
    (path,) = out.glob("counterexample-*.jsonl")
    return path


def test_replay_honours_should_levels_and_strict(should_only_trace, capsys):
    """A run that only WARNs replays as WARN (exit 0), and as FAILED under --strict, as
    `check` judges it (replay used to say FAILED, exit 1)."""
    assert main(["replay", str(should_only_trace)]) == 0
    assert capsys.readouterr().out.startswith("WARN")
    assert main(["replay", str(should_only_trace), "--strict"]) == 1
    assert capsys.readouterr().out.startswith("FAILED")


RESOLVER = """
def never_flush(mode, flush_cache, pause_mode, server_info):
    return False, pause_mode
"""


def test_replay_hint_names_a_module_client_and_file_names_have_no_colon(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "my_resolver.py").write_text(RESOLVER)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    assert main(["check", "--client", "my_resolver:never_flush", "--out", str(out)]) == 1
    text = capsys.readouterr().out
    (trace,) = out.glob("counterexample-*.jsonl")
    assert ":" not in trace.name
    hint = next(line for line in text.splitlines() if line.startswith("replay it:"))
    assert hint == f"replay it: kvfence replay {trace} --client my_resolver:never_flush"
    assert main(hint.removeprefix("replay it: kvfence ").split()) == 1


def test_violation_line_shows_the_endpoints_server_info(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one violation, one line
    assert main(["check", "--client", "never-flush", "--out", str(tmp_path)]) == 1
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("violated CLI")]
    assert lines and all("server info" in x for x in lines), lines


def test_a_narrow_terminal_still_shows_the_verdict_column(capsys):
    from rich.console import Console

    from kvfence.adapters import registry
    from kvfence.conformance.report import print_result
    from kvfence.conformance.runner import run_check

    result = run_check(registry.engine("reference"), registry.client("reference"))
    console = Console(width=40, force_terminal=False)
    print_result(result, console, verbosity=1)
    rows = [x for x in capsys.readouterr().out.splitlines() if "ENG-001" in x]
    assert rows and "PASS" in rows[0], rows


@pytest.mark.parametrize(
    "argv",
    [
        ["explore", "--engine", "no-such-engine"],
        ["explore", "--client", "no-such-client"],
        ["explore", "--engine", "vllm"],  # not in-process: cannot be explored
    ],
)
def test_explore_usage_errors_exit_3(argv, capsys):
    assert main(argv) == 3


def test_ctrl_c_prints_one_line_not_a_traceback(monkeypatch, capsys):
    from kvfence.conformance import cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_check", interrupted)
    assert main(["check"]) == 130
    out = capsys.readouterr().out
    assert "interrupted" in out and "Traceback" not in out
