"""Reports: the terminal verdict table (rich), JUnit XML and a JSON results file."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .runner import Result
from .trace import violation_json

STYLE = {
    "PASS": "green",
    "FAIL": "bold red",
    "ERROR": "bold magenta",
    "UNKNOWN": "yellow",
    "WARN": "yellow",
    "SKIP": "dim",
}


def verdict_table(result: Result) -> Table:
    """One row per rule: ID, name, level, verdict, evidence count, reason."""
    table = Table(
        title=f"kvfence check: engine={result.engine} client={result.client} "
        f"profile={result.profile}",
        title_justify="left",
    )
    for col in ("rule", "name", "level", "verdict", "evidence", "note"):
        table.add_column(col, no_wrap=col != "note")
    for rv in result.rules:
        style = STYLE.get(rv.verdict, "")
        table.add_row(
            rv.rule.id,
            rv.rule.name,
            rv.rule.level,
            f"[{style}]{rv.verdict}[/]",
            str(rv.evidence),
            rv.reason,
        )
    return table


def print_result(result: Result, console: Console | None = None) -> None:
    console = console or Console()
    console.print(verdict_table(result))
    for v in result.violations:
        console.print(f"[bold red]violated[/] {v}")
    if result.error:
        console.print(f"[bold magenta]error[/] {result.error}")
    for w in result.warnings:
        console.print(f"[yellow]warning[/] {w}")
    if result.counterexample:
        console.print(
            f"counterexample ({result.steps} steps): {result.counterexample}\n"
            f"replay it: kvfence replay {result.counterexample}"
        )
    style = STYLE.get(result.verdict, "")
    console.print(
        f"verdict: [{style}]{result.verdict}[/]  "
        f"({result.examples} examples, {result.seconds:.1f} s)"
    )


def result_json(result: Result) -> dict[str, Any]:
    return {
        "engine": result.engine,
        "client": result.client,
        "profile": result.profile,
        "seed": result.seed,
        "verdict": result.verdict,
        "seconds": round(result.seconds, 3),
        "examples": result.examples,
        "counterexample": None if result.counterexample is None else str(result.counterexample),
        "counterexample_steps": result.steps,
        "error": result.error,
        "violations": [violation_json(v) for v in result.violations],
        "rules": [
            {
                "id": rv.rule.id,
                "name": rv.rule.name,
                "level": rv.rule.level,
                "verdict": rv.verdict,
                "evidence": rv.evidence,
                "note": rv.reason,
            }
            for rv in result.rules
        ],
    }


def write_json(results: list[Result], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([result_json(r) for r in results], indent=2) + "\n")


def write_junit(results: list[Result], path: Path) -> None:
    """One testsuite per check, one testcase per rule. FAIL is a failure; ERROR and UNKNOWN
    are errors (a checker that could not see is never a pass); SKIP is skipped."""
    root = ET.Element("testsuites", name="kvfence")
    for result in results:
        suite = ET.SubElement(
            root,
            "testsuite",
            name=f"kvfence.{result.engine}.{result.client}",
            tests=str(len(result.rules)),
            failures=str(sum(rv.verdict in ("FAIL", "WARN") for rv in result.rules)),
            errors=str(sum(rv.verdict in ("ERROR", "UNKNOWN") for rv in result.rules)),
            skipped=str(sum(rv.verdict == "SKIP" for rv in result.rules)),
            time=f"{result.seconds:.3f}",
        )
        for rv in result.rules:
            case = ET.SubElement(
                suite, "testcase", classname=f"kvfence.{rv.rule.kind}", name=rv.rule.id
            )
            text = f"{rv.rule.name}: {rv.rule.text}"
            if rv.verdict in ("FAIL", "WARN"):
                details = "\n".join(str(v) for v in result.violations if v.rule == rv.rule.id)
                el = ET.SubElement(case, "failure", message=f"{rv.rule.id} violated")
                el.text = f"{text}\n{details}\ncounterexample: {result.counterexample}"
            elif rv.verdict in ("ERROR", "UNKNOWN"):
                el = ET.SubElement(case, "error", message=f"{rv.verdict}: {rv.reason}")
                el.text = text
            elif rv.verdict == "SKIP":
                ET.SubElement(case, "skipped", message=rv.reason)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
