"""Reports CI reads: the matrices' JUnit and JSON (one row per design and per mutant),
check's JSON and JUnit (warnings, rule classes), and the pytest plugin (a short failure,
a node id with a file part, MUST-SKIP warnings and ``--kvfence-strict-skips``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import attrs
import pytest

from kvfence.adapters.designs import DESIGNS
from kvfence.adapters.mutants import MUTANTS
from kvfence.conformance import matrix, report, runner
from kvfence.conformance.cli import EXIT_USAGE, main
from kvfence.conformance.report import result_json, write_junit
from kvfence.conformance.runner import Result, RuleVerdict
from kvfence.conformance.verdict import Verdict
from kvfence.model.checks import Violation
from kvfence.model.rules import RULES, RuleId


def _result(verdict: Verdict, broke: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> Result:
    rules = tuple(
        RuleVerdict(
            r,
            Verdict.FAIL if r.id in broke else Verdict.SKIP if r.id in skip else Verdict.PASS,
            0 if r.id in skip else 3,
            "needs exact_cache" if r.id in skip else "",
        )
        for r in RULES
    )
    violations = tuple(Violation(rule, "fresh", "stale") for rule in broke)
    return Result(
        "reference", "reference", "ci", None, verdict, rules, violations, "", None, 2, 10, 0.5
    )


def _matrices() -> matrix.Matrices:
    """Two designs (one passes, one FAILs) and four mutants: killed by its rule, killed by
    another rule, survived (PASS), and UNKNOWN."""
    d_ok, d_bad = DESIGNS[0], DESIGNS[1]
    m = MUTANTS[:4]
    other = next(r.id for r in RULES if r.id != m[1].rule and r.level == "MUST")
    return matrix.Matrices(
        designs=(
            (d_ok, _result(Verdict.PASS)),
            (d_bad, _result(Verdict.FAIL, broke=(RuleId.INV_001,))),
        ),
        mutants=(
            (m[0], _result(Verdict.FAIL, broke=(m[0].rule,))),
            (m[1], _result(Verdict.FAIL, broke=(other,))),
            (m[2], _result(Verdict.PASS)),
            (m[3], _result(Verdict.UNKNOWN)),
        ),
        seconds=1.0,
    )


def test_matrix_junit_has_one_testcase_per_design_and_mutant(tmp_path):
    x = _matrices()
    path = tmp_path / "m.xml"
    matrix.write_matrix_junit(x, path)
    root = ET.parse(path).getroot()
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"kvfence.pass-matrix", "kvfence.kill-matrix"}
    passes, kills = suites["kvfence.pass-matrix"], suites["kvfence.kill-matrix"]
    assert [c.get("name") for c in passes.findall("testcase")] == [DESIGNS[0].name, DESIGNS[1].name]
    assert [c.get("name") for c in kills.findall("testcase")] == [m.name for m in MUTANTS[:4]]
    assert (passes.get("failures"), passes.get("errors")) == ("1", "0")
    assert (kills.get("failures"), kills.get("errors")) == ("2", "1")
    outcome = [
        "failure"
        if c.find("failure") is not None
        else "error"
        if c.find("error") is not None
        else "pass"
        for c in kills.findall("testcase")
    ]
    assert outcome == ["pass", "failure", "failure", "error"]
    survivor = kills.findall("testcase")[1].find("failure")
    assert survivor is not None and "not by its rule" in survivor.get("message", "")
    props = {p.get("name"): p.get("value") for p in kills.find("testcase").iter("property")}
    assert props["expected_rule"] == MUTANTS[0].rule == props["killed_by"]


def test_matrix_json_carries_expected_rule_killed_by_and_verdict(tmp_path):
    x = _matrices()
    path = tmp_path / "m.json"
    matrix.write_matrix_json(x, path)
    data = json.loads(path.read_text())
    assert data["ok"] is False and data["exit_code"] == x.exit_code == 1
    rows = {r["name"]: r for r in data["rows"]}
    first = rows[MUTANTS[0].name]
    assert first["expected_rule"] == MUTANTS[0].rule and first["killed_by"] == [MUTANTS[0].rule]
    assert first["outcome"] == "pass" and first["verdict"] == "FAIL"
    assert rows[MUTANTS[2].name]["outcome"] == "failure"
    assert rows[MUTANTS[3].name]["outcome"] == "error"
    assert rows[DESIGNS[0].name]["expected_rule"] is None
    assert len(data["results"]) == len(data["rows"]) == 6


def test_a_green_kill_matrix_writes_a_green_junit(tmp_path, capsys):
    """Two mutants killed by their rules: two passing cases, two ``pass`` rows. (A design's
    passing run through the command, whole at ci, is
    tests/test_designs.py::test_kvfence_mutants_shows_both_matrices.)"""
    junit, report = tmp_path / "m.xml", tmp_path / "m.json"
    argv = ["mutants", "--only", "guard-missing-on-disk", "flush-stub-claims-success"]
    argv += ["--jobs", "1", "--out", str(tmp_path), "--junit", str(junit), "--json", str(report)]
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, out.out
    assert "kill matrix" in out.out and "flush-stub-claims-success" in out.out
    root = ET.parse(junit).getroot()
    cases = list(root.iter("testcase"))
    assert len(cases) == 2
    assert not list(root.iter("failure")) and not list(root.iter("error"))
    rows = json.loads(report.read_text())["rows"]
    assert [r["outcome"] for r in rows] == ["pass", "pass"]
    assert "kvfence mutants: 2/2 runs" in out.err  # progress, not a TTY


def test_check_json_and_junit_carry_warnings_and_rule_classes(tmp_path):
    skip = next(r.id for r in RULES if r.level == "MUST")
    result = _result(Verdict.PASS, skip=(skip,))
    data = result_json(result)
    assert any(skip in w for w in data["warnings"])
    classes = {r["id"]: r["class"] for r in data["rules"]}
    assert classes == {r.id: r.klass.value for r in RULES}
    assert data["safety"] == "PASS"
    path = tmp_path / "r.xml"
    write_junit([result], path)
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    props = [(p.get("name"), p.get("value")) for p in suite.find("properties")]
    assert ("safety", "PASS") in props
    assert any(n == "warning" and skip in (v or "") for n, v in props)
    assert skip in (suite.findtext("system-out") or "")
    case = next(c for c in suite.findall("testcase") if c.get("name") == RULES[0].id)
    assert case.find("properties/property").get("value") == RULES[0].klass.value


def test_a_fail_carries_no_skip_warning():
    skip = next(r.id for r in RULES if r.level == "MUST" and r.id != RuleId.INV_001)
    failing = _result(Verdict.FAIL, broke=(RuleId.INV_001,), skip=(skip,))
    assert result_json(failing)["warnings"] == []


def test_a_check_report_reads_back_only_for_the_same_check(tmp_path, monkeypatch):
    """``read_check_json`` gives back what ``kvfence check --json`` wrote (verdict, rules,
    violations, the counterexample under the folder the run ran in, the engine release),
    and ``None`` for another engine or client, another check's options, another source
    tree, a garbage file or none."""
    monkeypatch.chdir(tmp_path)
    path = Path("kvfence-results") / "r.json"
    argv = ["check", "--client", "never-flush", "--out", "kvfence-results", "--json", str(path)]
    assert main([*argv, "--max-examples", "5", "--no-battery", "-q"]) == 1
    small = runner.check_fingerprint(max_examples=5, battery=False)
    assert report.read_check_json(path, "reference", "never-flush") is None  # not a ci check
    back = report.read_check_json(tmp_path / path, "reference", "never-flush", small)
    assert back is not None and back.verdict is Verdict.FAIL
    (written,) = json.loads(path.read_text())
    assert back.caught() == tuple(dict.fromkeys(v["rule"] for v in written["violations"]))
    assert RuleId.CLI_002 in back.caught(), back.violations
    assert [r.verdict.value for r in back.rules] == [r["verdict"] for r in written["rules"]]
    assert back.counterexample is not None and back.counterexample.is_absolute()
    assert back.counterexample == tmp_path / written["counterexample"]
    assert back.counterexample.is_file()
    assert back.engine_version is None  # the reference engine names no release
    assert report.read_check_json(path, "vllm", "never-flush", small) is None
    assert report.read_check_json(path, "reference", "reference", small) is None
    monkeypatch.setattr(runner, "source_fingerprint", lambda: "another tree")
    assert (
        report.read_check_json(
            path,
            "reference",
            "never-flush",
            runner.check_fingerprint(max_examples=5, battery=False),
        )
        is None
    )
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert report.read_check_json(path, "reference", "never-flush", small) is not None
    path.write_text("not json")
    assert report.read_check_json(path, "reference", "never-flush", small) is None
    path.write_text(json.dumps([{**written, "rules": "garbage"}]))
    assert report.read_check_json(path, "reference", "never-flush", small) is None
    assert report.read_check_json(tmp_path / "none.json", "reference", "never-flush", small) is None


PLUGIN_TEST = """
import kvfence.conformance.plugin as plugin
from kvfence.conformance.runner import Result, RuleVerdict
from kvfence.conformance.verdict import Verdict
from kvfence.model.rules import RULES

SKIP = next(r.id for r in RULES if r.level == "MUST")


def fake(engine, client, **kwargs):
    rules = tuple(
        RuleVerdict(r, Verdict.SKIP if r.id == SKIP else Verdict.PASS, 1, "needs x")
        for r in RULES
    )
    return Result("e", "c", "ci", None, Verdict.PASS, rules, (), "", None, 0, 1, 0.1)


def test_passes_with_a_skip(kvfence_check, monkeypatch):
    monkeypatch.setattr(plugin, "run_check", fake)
    assert kvfence_check(engine="reference").verdict == "PASS"
"""


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(run, capture_output=True, text=True, cwd=folder, timeout=600)


def test_the_fixture_warns_on_must_skips_and_strict_skips_fails(tmp_path):
    (tmp_path / "test_skips.py").write_text(textwrap.dedent(PLUGIN_TEST))
    warned = _pytest(tmp_path, "-W", "default")
    assert warned.returncode == 0, warned.stdout + warned.stderr
    assert "KvfenceSkipWarning" in warned.stdout and "MUST rule SKIP" in warned.stdout
    strict = _pytest(tmp_path, "--kvfence-strict-skips")
    assert strict.returncode == 1, strict.stdout
    assert "--kvfence-strict-skips" in strict.stdout


def test_a_failing_engine_item_is_short_and_has_a_file_part(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = _pytest(tmp_path, "--kvfence-engine", "guard-missing-on-disk", "-rN")
    assert proc.returncode == 1, proc.stdout
    lines = proc.stdout.splitlines()
    assert len(lines) < 60, proc.stdout
    assert "Traceback" not in proc.stdout and "site-packages" not in proc.stdout
    assert any("<- " in x and "ENG-001" in x for x in lines), proc.stdout
    assert any(x.startswith("replay it: kvfence replay") for x in lines)
    ids = _pytest(tmp_path, "--kvfence-engine", "guard-missing-on-disk", "--collect-only")
    assert "pytest.ini::kvfence::guard-missing-on-disk::reference" in ids.stdout, ids.stdout


def test_the_matrix_tables_read_at_80_columns_in_a_log():
    """Piped at 80 columns (a CI log), every design's and mutant's name is whole, no line
    is wider, every rule ID is whole, the columns left out are named, and at 160 columns
    nothing is left out."""
    import io
    import re

    from rich.console import Console

    x = matrix.Matrices(
        designs=tuple((d, _result(Verdict.PASS)) for d in DESIGNS),
        mutants=tuple((m, _result(Verdict.FAIL, broke=(m.rule,))) for m in MUTANTS),
        seconds=1.0,
    )
    for width, dropped in ((80, True), (160, False)):
        out = io.StringIO()
        matrix.print_matrices(x, "ci", Console(file=out, width=width, force_terminal=False))
        text = out.getvalue()
        lines = text.splitlines()
        assert max(len(line.rstrip()) for line in lines) <= width, width
        for name in [d.name for d in DESIGNS] + [m.name for m in MUTANTS]:
            assert any(re.search(rf"^\s*{re.escape(name)}\s", line) for line in lines), name
        assert not re.search(r"\b[A-Z]{2,5}-\d{0,2}…|\b[A-Z]{2,5}…", text)  # no cut rule ID
        # every rule cell whole: a mutant's rule and what caught it, each design's keeps
        ids = re.findall(r"\b[A-Z]{2,5}-\d{3}\b", text)
        assert len(ids) >= 2 * len(MUTANTS) + sum(len(d.keeps) for d in DESIGNS), len(ids)
        assert ("not shown at" in text) is dropped, text[-400:]


def test_a_matrix_report_reads_back_only_for_the_same_tree(tmp_path, monkeypatch):
    """``read_matrix_json`` gives back what ``write_matrix_json`` wrote (verdicts, rules,
    violations, counterexample under the run's folder), and ``None`` for another source
    fingerprint, another profile, a design or mutant it lacks, or a garbage file."""
    x = _matrices()
    out = tmp_path / "kvfence-results"
    out.mkdir()
    (out / "ce.jsonl").write_text("{}\n")
    first = x.mutants[0]
    x = attrs.evolve(
        x,
        mutants=(
            (first[0], attrs.evolve(first[1], counterexample=Path("kvfence-results/ce.jsonl"))),
            *x.mutants[1:],
        ),
    )
    path = out / "matrices.json"
    matrix.write_matrix_json(x, path, "ci")
    designs, mutants = [d for d, _ in x.designs], [m for m, _ in x.mutants]
    back = matrix.read_matrix_json(path, designs, mutants, "ci")
    assert back is not None and back.ok == x.ok and back.exit_code == x.exit_code
    for a, b in zip(x.results, back.results, strict=True):
        assert (a.verdict, a.caught(), a.steps, a.examples) == (
            b.verdict,
            b.caught(),
            b.steps,
            b.examples,
        )
        assert [(r.rule.id, r.verdict, r.evidence) for r in a.rules] == [
            (r.rule.id, r.verdict, r.evidence) for r in b.rules
        ]
    assert back.mutants[0][1].counterexample == tmp_path / "kvfence-results" / "ce.jsonl"
    assert matrix.read_matrix_json(path, designs, mutants, "fuzz") is None
    assert matrix.read_matrix_json(path, designs, [*mutants, MUTANTS[5]], "ci") is None
    # a run that started from another tree (edited while it ran) is not this tree's
    matrix.write_matrix_json(attrs.evolve(x, fingerprint="the tree it started from"), path)
    assert matrix.read_matrix_json(path, designs, mutants, "ci") is None
    matrix.write_matrix_json(x, path, "ci")
    monkeypatch.setattr(matrix, "source_fingerprint", lambda: "another tree")
    assert matrix.read_matrix_json(path, designs, mutants, "ci") is None
    monkeypatch.undo()
    path.write_text("not json")
    assert matrix.read_matrix_json(path, designs, mutants, "ci") is None
    assert matrix.read_matrix_json(tmp_path / "none.json", designs, mutants, "ci") is None


def _with_designs_times(times: int = 10) -> matrix.Matrices:
    """``_matrices`` with its pass matrix also at ``times`` times the budget: the first
    design passes there, the second is ERROR (an adapter timeout, say)."""
    x = _matrices()
    (d_ok, _), (d_err, _) = x.designs
    err = attrs.evolve(_result(Verdict.ERROR), error="adapter call timed out")
    return attrs.evolve(x, times=times, designs_times=((d_ok, _result(Verdict.PASS)), (d_err, err)))


def test_the_pass_matrix_at_ten_times_reads_back_only_for_this_tree_and_budget(
    tmp_path, monkeypatch
):
    """``read_designs_times`` gives back each design's result at ten times the budget when
    the report is of this tree, profile and budget: an ERROR row stays ERROR (never a
    pass), a design without a row is left out (its test runs it); and ``None`` for a report
    without that matrix, of another ``times``, of another budget at 1x or per run, of
    another tree, or a garbage file."""
    x = _with_designs_times()
    (d_ok, _), (d_err, _) = x.designs
    path = tmp_path / "matrices.json"
    matrix.write_matrix_json(x, path, "ci")
    section = json.loads(path.read_text())["pass_matrix_times"]
    assert (section["times"], section["max_examples"]) == (10, 6000)
    assert [r["outcome"] for r in section["rows"]] == ["pass", "error"]
    back = matrix.read_designs_times(path, DESIGNS, 10, "ci")
    assert back is not None and set(back) == {d_ok.name, d_err.name}
    assert matrix.passed(back[d_ok.name])
    assert back[d_err.name].verdict is Verdict.ERROR and not matrix.passed(back[d_err.name])
    assert back[d_err.name].error == "adapter call timed out"
    # the 1x matrices of that report read as before; the 10x rows are not among them
    both = matrix.read_matrix_json(path, [d_ok, d_err], [m for m, _ in x.mutants], "ci")
    assert both is not None and [r.verdict for _, r in both.designs] == [
        Verdict.PASS,
        Verdict.FAIL,
    ]
    # another number of times, another profile
    assert matrix.read_designs_times(path, DESIGNS, 5, "ci") is None
    assert matrix.read_designs_times(path, DESIGNS, 10, "fuzz") is None
    # each run's budget edited in the report: not the budget asked for
    data = json.loads(path.read_text())
    data["pass_matrix_times"]["max_examples"] = 600
    path.write_text(json.dumps(data))
    assert matrix.read_designs_times(path, DESIGNS, 10, "ci") is None
    # the 1x budget given by --max-examples: neither matrix is ci's
    matrix.write_matrix_json(attrs.evolve(x, max_examples=50), path, "ci")
    assert json.loads(path.read_text())["pass_matrix_times"]["max_examples"] == 500
    assert matrix.read_designs_times(path, DESIGNS, 10, "ci") is None
    assert matrix.read_matrix_json(path, [d_ok, d_err], [m for m, _ in x.mutants], "ci") is None
    assert matrix.read_designs_times(path, DESIGNS, 10, "ci", max_examples=50) is not None
    # a report without that matrix
    matrix.write_matrix_json(_matrices(), path, "ci")
    assert "pass_matrix_times" not in json.loads(path.read_text())
    assert matrix.read_designs_times(path, DESIGNS, 10, "ci") is None
    # another tree: the run started from it, or the tree changed since
    matrix.write_matrix_json(attrs.evolve(x, fingerprint="the tree it started from"), path)
    assert matrix.read_designs_times(path, DESIGNS, 10, "ci") is None
    matrix.write_matrix_json(x, path, "ci")
    assert matrix.read_designs_times(path, [d_ok], 10, "ci") == {d_ok.name: back[d_ok.name]}
    monkeypatch.setattr(matrix, "source_fingerprint", lambda: "another tree")
    assert matrix.read_designs_times(path, DESIGNS, 10, "ci") is None
    monkeypatch.undo()
    # rows and results that do not match, garbage, nothing
    data = json.loads(path.read_text())
    data["pass_matrix_times"]["results"].pop()
    path.write_text(json.dumps(data))
    assert matrix.read_designs_times(path, DESIGNS, 10, "ci") is None
    path.write_text("[1, 2]")
    assert matrix.read_designs_times(path, DESIGNS, 10, "ci") is None
    assert matrix.read_designs_times(tmp_path / "none.json", DESIGNS, 10, "ci") is None


def test_a_design_failing_only_at_ten_times_fails_the_matrices(tmp_path):
    """A design that passes at the budget and is ERROR at ten times it: the matrices are not
    OK (exit 2, its reason printed), JUnit has the third suite with that error."""
    x = attrs.evolve(
        _with_designs_times(), designs=_matrices().designs[:1], mutants=_matrices().mutants[:1]
    )
    assert not x.ok and x.exit_code == 2
    assert [line.split(":")[0] for line in x.unsettled()] == [f"ERROR {DESIGNS[1].name} at 10x"]
    path = tmp_path / "m.xml"
    matrix.write_matrix_junit(x, path)
    suites = {s.get("name"): s for s in ET.parse(path).getroot().findall("testsuite")}
    assert list(suites) == ["kvfence.pass-matrix", "kvfence.pass-matrix-10x", "kvfence.kill-matrix"]
    tenx = suites["kvfence.pass-matrix-10x"]
    assert (tenx.get("tests"), tenx.get("failures"), tenx.get("errors")) == ("2", "0", "1")
    assert {c.get("classname") for c in tenx.findall("testcase")} == {"kvfence.design-10x.engine"}
    fail = attrs.evolve(x, designs_times=((DESIGNS[0], _result(Verdict.FAIL, broke=("INV-001",))),))
    assert fail.exit_code == 1


def test_run_matrices_starts_the_designs_at_ten_times_first(monkeypatch, tmp_path):
    """``run_matrices(designs_times=10)``: each design runs twice, at ten times the budget
    (started first, the longest) and at the budget; the results land in their own rows."""
    import kvfence.conformance.battery as battery

    ran: list[tuple[str, int | None]] = []

    def fake(job: matrix.Job) -> Result:
        ran.append((job.label, job.max_examples))
        return attrs.evolve(_result(Verdict.PASS), examples=job.max_examples or 600)

    monkeypatch.setattr(matrix, "run_job", fake)
    monkeypatch.setattr(battery, "load", lambda: None)
    done: list[str] = []
    d = DESIGNS[:2]
    x = matrix.run_matrices(d, [], "ci", tmp_path, jobs=1, on_done=done.append, designs_times=10)
    assert ran == [
        (f"{d[0].name} at 10x", 6000),
        (f"{d[1].name} at 10x", 6000),
        (d[0].name, None),
        (d[1].name, None),
    ]
    assert done == [label for label, _ in ran]
    assert [r.examples for _, r in x.designs_times] == [6000, 6000]
    assert [r.examples for _, r in x.designs] == [600, 600]
    assert x.times == 10 and x.ok
    plain = matrix.run_matrices(d, [], "ci", tmp_path, jobs=1, max_examples=40)
    assert plain.designs_times == () and plain.times == 0 and plain.max_examples == 40
    ran.clear()
    some = matrix.run_matrices(d, [], "ci", tmp_path, jobs=1, designs_times=10, times_only=d[1:])
    assert ran == [(f"{d[1].name} at 10x", 6000), (d[0].name, None), (d[1].name, None)]
    assert [x for x, _ in some.designs_times] == [d[1]] and len(some.designs) == 2


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--designs-times-only", "reference"], "needs --designs-times N"),
        (["--designs-times", "10", "--designs-times-only", "no-such"], "no-such"),
        (["--designs-times", "10", "--designs-times-only", "never-flush"], "never-flush"),
        (
            ["--only", "reference", "--designs-times", "10", "--designs-times-only", "CD-01"],
            "pause-abort-clears-cache",
        ),
    ],
    ids=["without-times", "unknown", "a-mutant", "outside-only"],
)
def test_designs_times_only_names_what_is_not_a_design_of_the_run(
    argv, named, tmp_path, capsys, monkeypatch
):
    """``kvfence mutants --designs-times-only``: a name that is no design of this run, or
    the option without ``--designs-times``, is a usage error naming it; nothing runs."""
    monkeypatch.setattr(matrix, "run_matrices", lambda *a, **k: pytest.fail("it ran"))
    code = main(["mutants", *argv, "--out", str(tmp_path)])
    out = " ".join(capsys.readouterr().out.split())
    assert code == EXIT_USAGE, out
    assert named in out, out


def test_the_main_job_writes_the_matrices_where_the_tests_read_them():
    """README command 1 (scripts/setup.sh) runs ``kvfence mutants`` at the ci profile's own
    budget into ``kvfence-results/matrices.json``, the report tests/test_designs.py and
    tests/test_designs_budget.py read, with every design under the explorer
    (``--designs-explored``), the allowance designs at ten times the budget
    (``--designs-times 10 --designs-times-only``) and every design at
    ``--designs-times $KVFENCE_DESIGNS_TIMES`` when that is set: another path, budget or
    profile there would leave every design to run again."""
    import shlex

    setup = (Path(__file__).parents[1] / "scripts" / "setup.sh").read_text()
    joined = setup.replace("\\\n", " ")
    [line] = [x for x in joined.splitlines() if x.startswith(".venv/bin/kvfence mutants")]
    argv = shlex.split(line)
    assert argv[2] == "--designs-explored", argv  # the designs under the explorer too
    assert argv[3] == "${times[@]}", argv  # --designs-times N and which designs
    flags = dict(zip(argv[4::2], argv[5::2], strict=False))
    assert flags.get("--json") == "kvfence-results/matrices.json", argv
    assert "--max-examples" not in argv and "--profile" not in argv, argv
    # by default the allowance designs at 10x (tests/test_designs_budget.py reads them);
    # the whole pass matrix at N times with KVFENCE_DESIGNS_TIMES=N
    assert 'times=(--designs-times 10 --designs-times-only "${allowances[@]}")' in setup
    assert "import ALLOWANCES" in setup
    assert 'times=(--designs-times "$KVFENCE_DESIGNS_TIMES")' in setup
