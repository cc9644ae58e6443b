"""Progress on long runs: a rich bar on a terminal, a periodic line elsewhere, nothing
under ``-q``; ``check`` counts one per example (each starts the engine afresh)."""

from __future__ import annotations

import io
import json

from kvfence.conformance.cli import main
from kvfence.conformance.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_it_prints_a_line_per_period_and_one_at_the_end():
    out = io.StringIO()
    with Progress("kvfence mutants", 3, "runs", stream=out, period=0.0) as p:
        for name in ("a", "b", "c"):
            p.advance(name)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("kvfence mutants: 1/3 runs") and lines[0].endswith("(last: a)")
    assert lines[-1].startswith("kvfence mutants: 3/3 runs")
    quiet = io.StringIO()
    with Progress("kvfence mutants", 3, "runs", stream=quiet, period=3600.0) as p:
        p.advance("a")
    assert quiet.getvalue().count("\n") == 1  # only the closing line


def test_disabled_it_prints_nothing():
    out = io.StringIO()
    with Progress("kvfence check", 2, "examples", stream=out, enabled=False, period=0.0) as p:
        p.advance()
        p.advance()
    assert out.getvalue() == "" and p.done == 2


def test_on_a_terminal_it_draws_a_bar_with_the_total():
    out = Terminal()
    with Progress("kvfence check", 4, "examples", stream=out) as p:
        p.advance()
    assert "1/4" in out.getvalue() and "examples" in out.getvalue()


def test_check_counts_its_examples_on_stderr(tmp_path, capsys):
    report = tmp_path / "r.json"
    argv = ["check", "--max-examples", "5", "--out", str(tmp_path), "--json", str(report)]
    main(argv)
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("kvfence check: ") and " examples, " in last
    done = int(last.removeprefix("kvfence check: ").split("/")[0])
    assert done >= json.loads(report.read_text())[0]["examples"] > 0
    main([*argv, "-q"])
    assert "kvfence check:" not in capsys.readouterr().err


def test_explore_counts_levels_to_its_depth(capsys):
    """``kvfence explore`` reports the levels it completed, ending at the depth reached,
    on stderr (stdout keeps the result)."""
    assert main(["explore", "--depth", "2", "--workers", "1"]) == 0
    captured = capsys.readouterr()
    assert "PASS: no violation within bounds" in captured.out
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("kvfence explore: 2/2 levels"), captured.err
