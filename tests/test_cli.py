"""The command line: exit codes, reports, usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from kvfence.conformance.cli import main


def test_check_reference_passes_and_writes_reports(tmp_path, capsys):
    junit, results = tmp_path / "junit.xml", tmp_path / "results.json"
    code = main(["check", "--out", str(tmp_path), "--junit", str(junit), "--json", str(results)])
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
    proc = subprocess.run(
        [sys.executable, "-m", "kvfence.conformance.cli", "rules"], capture_output=True, text=True
    )
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
