"""What ``kvfence check`` and ``kvfence replay`` print: the counterexample's steps, the
quiet default (failing rows and one summary line), ``-v`` / ``-q``, the width, the
MUST-SKIP warning and ``--safety-only``."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from rich.console import Console

from kvfence.adapters import registry
from kvfence.conformance import cli
from kvfence.conformance.cli import main
from kvfence.conformance.report import (
    counterexample_lines,
    counts_words,
    print_result,
    summary_line,
    trace_steps_text,
)
from kvfence.conformance.runner import Result, run_check
from kvfence.conformance.verdict import Verdict
from kvfence.model.checks import Violation
from kvfence.model.rules import BY_ID, RULES, Klass, RuleId

REGRESSIONS = Path(__file__).parent / "regressions"
NEVER_FLUSH = REGRESSIONS / "PF-01-never-flush.jsonl"


def _lines(path: Path) -> tuple[list[dict], dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x and not x.startswith("#")]
    return [r for r in rows[1:] if "action" in r], rows[-1]


def test_each_violated_rule_is_marked_on_the_step_it_broke():
    lines, verdict = _lines(NEVER_FLUSH)
    text = counterexample_lines(lines, verdict["violations"], verdict["step"])
    assert len(text) == len(lines)  # one line per step
    marked = {i: line for i, line in enumerate(text) if "<- " in line}
    # The client's plan broke CLI-001 on the sync (step 1); the stale reuse on step 5.
    assert list(marked) == [1, 5], text
    assert "SyncWeights" in marked[1] and marked[1].endswith("<- CLI-001")
    assert "ServeRequest ep0 P" in marked[5] and marked[5].endswith("<- INV-001")
    assert "flush=False" in marked[1] and "spec allowed: ep0 flush=True" in marked[1]


def test_an_answer_outside_the_spec_shows_what_the_spec_allowed():
    trace = REGRESSIONS / "PF-22-flush-is-a-stub.jsonl"
    text = trace_steps_text(trace)
    last = text[-1]
    assert "FlushCache ep0" in last and "status=ok" in last
    assert "spec allowed: flushed=True" in last and "view.cache=[]" in last
    assert "LIV-001" in last and "FC-003" in last
    assert all("spec allowed" not in line for line in text[:-1]), text


def test_an_unreadable_trace_is_named_not_raised(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    (line,) = trace_steps_text(bad)
    assert "cannot be shown" in line and "bad.jsonl" in line


def test_replay_prints_the_steps_it_replayed(capsys):
    assert main(["replay", str(NEVER_FLUSH)]) == 1
    out = capsys.readouterr().out
    assert "counterexample (3 steps replayed)" in out  # 0, the sync, 5
    steps = [x for x in out.splitlines() if x.startswith("   ")]
    assert any("SyncWeights" in x for x in steps)
    assert any(x.rstrip().endswith("<- INV-001") for x in out.splitlines()), out


@pytest.fixture(scope="module")
def never_flush(tmp_path_factory) -> Result:
    out = tmp_path_factory.mktemp("never-flush")
    return run_check(
        registry.engine("reference"), registry.client("never-flush"), out_dir=out, max_examples=10
    )


def _print(result: Result, width: int = 80, verbosity: int = 0) -> str:
    console = Console(width=width, record=True, force_terminal=False)
    print_result(result, console, verbosity)
    return console.export_text()


def test_the_default_output_is_the_failing_rows_the_steps_and_one_summary(never_flush):
    out = _print(never_flush)
    shown = [rv for rv in never_flush.rules if rv.verdict is not Verdict.PASS]
    passed = [rv for rv in never_flush.rules if rv.verdict is Verdict.PASS]
    assert never_flush.verdict is Verdict.FAIL and passed
    rows = [x.split()[0] for x in out.splitlines() if x[:8].strip() in BY_ID]
    bad = {Verdict.FAIL, Verdict.WARN, Verdict.ERROR, Verdict.UNKNOWN}
    assert rows == [rv.rule.id for rv in shown if rv.verdict in bad]
    marked = " ".join(x.split("<- ")[1] for x in out.splitlines() if "<- " in x)
    trace_rules = {v["rule"] for v in _lines(never_flush.counterexample)[1]["violations"]}
    assert trace_rules and all(rule in marked for rule in trace_rules), (trace_rules, out)
    assert "replay it: kvfence replay" in out
    assert out.count("verdict: FAIL") == 1
    assert f"counterexample ({never_flush.steps} step" in out


def test_verbose_shows_every_rule_and_quiet_the_summary_alone(never_flush):
    verbose = _print(never_flush, verbosity=1)
    for r in RULES:
        assert any(x.startswith(r.id + " ") for x in verbose.splitlines()), r.id
    quiet = _print(never_flush, width=400, verbosity=-1)
    assert quiet.strip() == summary_line(never_flush)


def test_the_summary_counts_every_rule_and_splits_safety_from_availability(never_flush):
    words = counts_words(never_flush)
    total = sum(int(part.split()[0]) for part in words.split(", "))
    assert total == len(never_flush.rules) == len(RULES)
    failed = sum(rv.verdict is Verdict.FAIL for rv in never_flush.rules)
    assert words.startswith(f"{failed} failed")
    line = summary_line(never_flush)
    assert f"safety: {never_flush.safety}" in line
    assert f"availability: {never_flush.availability}" in line


def test_the_heading_names_the_engine_release_where_the_adapter_reports_one(never_flush):
    """``Result.engine_version`` (JSON ``engine_version``) is in the text report too: the
    first line names the release that answered, and says nothing where none was reported
    (the reference engine names none)."""
    assert never_flush.engine_version is None
    first = _print(never_flush).splitlines()[0]
    assert first == "kvfence check: engine=reference client=never-flush profile=ci"
    released = attrs.evolve(never_flush, engine_version="0.5.23")
    first = _print(released).splitlines()[0]
    assert first.startswith("kvfence check: engine=reference engine_version=0.5.23 client=")


def test_80_columns_cut_no_rule_name_and_no_line_is_wider(never_flush):
    out = _print(never_flush, width=80, verbosity=1)
    for rv in never_flush.rules:
        assert rv.rule.name in out, rv.rule.name
    copyable = ("counterexample (", "replay it:")
    wide = [x for x in out.splitlines() if len(x) > 80 and not x.startswith(copyable)]
    assert not wide, wide
    assert "…" not in out


def test_the_width_comes_from_columns_not_a_constant(monkeypatch, capsys, never_flush):
    monkeypatch.setattr(cli, "run_check", lambda *a, **k: never_flush)
    for width in (80, 150):
        monkeypatch.setenv("COLUMNS", str(width))
        assert main(["check", "-v", "--client", "never-flush"]) == 1
        lines = capsys.readouterr().out.splitlines()
        longest = max(len(x) for x in lines if not x.startswith(("counterexample (", "replay")))
        assert width - 15 <= longest <= width, (width, longest)


def _with(result: Result, verdicts: dict[str, Verdict], violations=()) -> Result:
    rules = tuple(
        attrs.evolve(rv, verdict=verdicts.get(rv.rule.id, Verdict.PASS), evidence=1)
        for rv in result.rules
    )
    verdict = Verdict.FAIL if violations else Verdict.PASS
    return attrs.evolve(
        result,
        rules=rules,
        violations=tuple(violations),
        verdict=verdict,
        counterexample=None,
        warnings=(),
    )


def _a_must_rule(klass: Klass) -> str:
    return next(r.id for r in RULES if r.level == "MUST" and r.klass is klass)


def test_the_must_skip_warning_is_printed_once_and_never_after_a_fail(never_flush):
    skip = _a_must_rule(Klass.SAFETY)
    passing = _with(never_flush, {skip: Verdict.SKIP})
    out = _print(passing)
    assert out.count("MUST rule SKIP") == 1 and skip in out
    assert len([x for x in out.splitlines() if "warning" in x]) == 1
    failing = _with(
        never_flush,
        {skip: Verdict.SKIP, RuleId.INV_001: Verdict.FAIL},
        [Violation(RuleId.INV_001, "fresh", "stale")],
    )
    assert "MUST rule" not in _print(failing)


def test_safety_only_exits_on_the_safety_verdict(monkeypatch, capsys, never_flush):
    rule = _a_must_rule(Klass.AVAILABILITY)
    unavailable = _with(
        never_flush, {rule: Verdict.FAIL}, [Violation(rule, "answers", "engine died")]
    )
    assert unavailable.safety is Verdict.PASS and unavailable.availability is Verdict.FAIL
    monkeypatch.setattr(cli, "run_check", lambda *a, **k: unavailable)
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["check", "-q"]) == 1
    assert main(["check", "-q", "--safety-only"]) == 0
    out = capsys.readouterr().out
    assert f"availability: FAIL ({rule}: {BY_ID[rule].name})" in out
    unsafe = _with(
        never_flush,
        {RuleId.INV_001: Verdict.FAIL},
        [Violation(RuleId.INV_001, "fresh", "stale")],
    )
    monkeypatch.setattr(cli, "run_check", lambda *a, **k: unsafe)
    assert main(["check", "-q", "--safety-only"]) == 1


def test_one_step_is_not_steps(never_flush):
    one = attrs.evolve(never_flush, steps=1)
    assert "counterexample (1 step)" in _print(one, width=200)


def test_the_checker_share_is_not_called_overhead(never_flush):
    assert never_flush.timing is not None
    out = _print(never_flush, width=200)
    assert "checker share" in out and "overhead" not in out
