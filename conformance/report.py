"""Reports: the terminal verdict table (rich), JUnit XML and a JSON results file."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .runner import Result, TimeSplit
from .trace import violation_json, write_atomic
from .verdict import SILENT, Verdict

STYLE = {
    Verdict.PASS: "green",
    Verdict.FAIL: "bold red",
    Verdict.ERROR: "bold magenta",
    Verdict.UNKNOWN: "yellow",
    Verdict.WARN: "yellow",
    Verdict.SKIP: "dim",
    Verdict.NA: "dim",
}

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def clean(text: object) -> str:
    """``text`` printable and encodable anywhere: lone surrogates and other code points
    UTF-8 cannot carry become ``\\udcxx`` escapes (an adapter's message may hold them)."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


def xml_text(text: object) -> str:
    """``clean(text)`` without the characters XML 1.0 forbids (control characters), each
    shown as ``\\xNN``: JUnit stays parseable whatever an adapter said."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", clean(text))


def _text(text: object) -> str:
    """Adapter text for the console: clean, and never read as rich markup."""
    return escape(clean(text))


def verdict_table(result: Result) -> Table:
    """One row per rule: ID, verdict, level, evidence count, name, reason. The verdict
    sits beside the ID and never wraps, so a narrow terminal still shows it."""
    table = Table(
        title=f"kvfence check: engine={_text(result.engine)} client={_text(result.client)} "
        f"profile={result.profile}",
        title_justify="left",
    )
    for col in ("rule", "verdict", "level", "evidence", "name", "note"):
        wide = col in ("rule", "verdict")
        table.add_column(col, no_wrap=wide, min_width=7 if wide else None)
    for rv in result.rules:
        style = STYLE.get(rv.verdict, "")
        table.add_row(
            rv.rule.id,
            f"[{style}]{rv.verdict}[/]",
            rv.rule.level,
            str(rv.evidence),
            rv.rule.name,
            _text(rv.reason),
        )
    return table


def replay_hint(result: Result) -> str:
    """The command that replays the counterexample. A trace never makes ``replay`` import
    code, so a ``module:function`` engine or client is passed explicitly."""
    words = ["kvfence", "replay", str(result.counterexample)]
    for flag, name in (("--engine", result.engine), ("--client", result.client)):
        if ":" in name:
            words += [flag, name]
    return " ".join(words)


def print_result(result: Result, console: Console | None = None) -> None:
    console = console or Console()
    console.print(verdict_table(result))
    for v in result.violations:
        console.print(f"[bold red]violated[/] {_text(v)}")
    if result.error:
        console.print(f"[bold magenta]error[/] {_text(result.error)}")
    for w in result.warnings:
        console.print(f"[yellow]warning[/] {_text(w)}")
    if result.counterexample:
        console.print(
            f"counterexample ({result.steps} steps): {_text(result.counterexample)}\n"
            f"replay it: {_text(replay_hint(result))}",
            soft_wrap=True,  # a command to copy: never broken over lines
        )
    style = STYLE.get(result.verdict, "")
    overhead = "" if result.timing is None else f"; {overhead_words(result.timing)}"
    more = f" with {result.top_ups} extra searches for evidence" if result.top_ups else ""
    console.print(
        f"verdict: [{style}]{result.verdict}[/]  "
        f"({result.examples} examples{more}, {result.seconds:.1f} s{overhead})"
    )


def overhead_words(t: TimeSplit) -> str:
    """The summary line's account of the wall time, e.g. ``engine 41.2 s, client 0.0 s,
    kvfence overhead 7.9% of wall``."""
    return (
        f"engine {t.engine_seconds:.1f} s, client {t.client_seconds:.1f} s, "
        f"kvfence overhead {100 * t.checker_fraction:.1f}% of wall"
    )


def timing_json(t: TimeSplit | None) -> dict[str, Any] | None:
    """The report's ``timing`` object (``runner.TimeSplit``): ``wall_seconds``,
    ``engine_seconds``, ``client_seconds``, ``checker_seconds`` (seconds, rounded to the
    millisecond), ``checker_fraction`` (checker / wall, in [0, 1], 4 decimals),
    ``engine_calls``, ``client_calls``; ``None`` where the result was not measured."""
    if t is None:
        return None
    return {
        "wall_seconds": round(t.wall_seconds, 3),
        "engine_seconds": round(t.engine_seconds, 3),
        "client_seconds": round(t.client_seconds, 3),
        "checker_seconds": round(t.checker_seconds, 3),
        "checker_fraction": round(t.checker_fraction, 4),
        "engine_calls": t.engine_calls,
        "client_calls": t.client_calls,
    }


def result_json(result: Result) -> dict[str, Any]:
    return {
        "engine": result.engine,
        "client": result.client,
        "profile": result.profile,
        "seed": result.seed,
        "verdict": result.verdict.value,
        "seconds": round(result.seconds, 3),
        "timing": timing_json(result.timing),
        "examples": result.examples,
        "top_ups": result.top_ups,
        "counterexample": None if result.counterexample is None else str(result.counterexample),
        "counterexample_steps": result.steps,
        "error": result.error,
        "violations": [violation_json(v) for v in result.violations],
        "rules": [
            {
                "id": rv.rule.id,
                "name": rv.rule.name,
                "level": rv.rule.level,
                "verdict": rv.verdict.value,
                "evidence": rv.evidence,
                "note": rv.reason,
            }
            for rv in result.rules
        ],
    }


def write_json(results: list[Result], path: Path) -> None:
    """The results as JSON, written atomically; any text an adapter returned survives
    (``ensure_ascii`` escapes lone surrogates)."""
    data = [result_json(r) for r in results]
    write_atomic(path, json.dumps(data, indent=2, default=repr) + "\n")


def write_junit(results: list[Result], path: Path) -> None:
    """One testsuite per check, one testcase per rule. FAIL is a failure; ERROR and UNKNOWN
    are errors (a checker that could not see is never a pass); SKIP and N/A are skipped. Written
    atomically; every text is XML-safe (``xml_text``)."""
    bad, unseen = (Verdict.FAIL, Verdict.WARN), (Verdict.ERROR, Verdict.UNKNOWN)
    root = ET.Element("testsuites", name="kvfence")
    for result in results:
        suite = ET.SubElement(
            root,
            "testsuite",
            name=xml_text(f"kvfence.{result.engine}.{result.client}"),
            tests=str(len(result.rules)),
            failures=str(sum(rv.verdict in bad for rv in result.rules)),
            errors=str(sum(rv.verdict in unseen for rv in result.rules)),
            skipped=str(sum(rv.verdict in SILENT for rv in result.rules)),
            time=f"{result.seconds:.3f}",
        )
        for rv in result.rules:
            case = ET.SubElement(
                suite, "testcase", classname=f"kvfence.{rv.rule.kind}", name=rv.rule.id
            )
            text = f"{rv.rule.name}: {rv.rule.text}"
            if rv.verdict in bad:
                details = "\n".join(str(v) for v in result.violations if v.rule == rv.rule.id)
                details = details or rv.reason
                el = ET.SubElement(case, "failure", message=f"{rv.rule.id} violated")
                el.text = xml_text(f"{text}\n{details}\ncounterexample: {result.counterexample}")
            elif rv.verdict in unseen:
                el = ET.SubElement(case, "error", message=xml_text(f"{rv.verdict}: {rv.reason}"))
                el.text = text
            elif rv.verdict in SILENT:
                ET.SubElement(case, "skipped", message=xml_text(rv.reason))
    ET.indent(root)
    body = ET.tostring(root, encoding="unicode")
    write_atomic(path, '<?xml version="1.0" encoding="utf-8"?>\n' + body + "\n")
