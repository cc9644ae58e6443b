"""Reports: the terminal verdict table (rich), JUnit XML and a JSON results file."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..model.rules import BY_ID, Klass
from .battery import BatteryRun, RuleTally
from .record import Covered
from .runner import NOT_REACHED, Result, RuleVerdict, TimeSplit, by_class, check_fingerprint
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


SHOWN: frozenset[Verdict] = frozenset({Verdict.FAIL, Verdict.WARN, Verdict.ERROR, Verdict.UNKNOWN})
"""The rows the default output shows: a rule broken, or one the run could not judge."""


def heading(result: Result) -> str:
    """The verdict table's first line: ``kvfence check: engine=NAME client=NAME
    profile=NAME``, with `` engine_version=X`` after the engine where its adapter reported
    the release that answered (``Result.engine_version``). Not yet escaped for a console."""
    version = f" engine_version={result.engine_version}" if result.engine_version else ""
    return (
        f"kvfence check: engine={result.engine}{version} client={result.client} "
        f"profile={result.profile}"
    )


def verdict_table(result: Result, rows: frozenset[Verdict] | None = None) -> Table:
    """One row per rule (only those whose verdict is in ``rows``; ``None``: every rule):
    ID, verdict, level, evidence count, name, note, as a rich table (for a wide console;
    ``print_result`` prints ``verdict_rows``, which fit any width)."""
    table = Table(
        title=_text(heading(result)),
        title_justify="left",
    )
    for col in ("rule", "verdict", "level", "evidence", "name", "note"):
        table.add_column(col, no_wrap=col != "note", min_width=7 if col == "verdict" else None)
    for rv in result.rules:
        if rows is not None and rv.verdict not in rows:
            continue
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


def wrapped(text: str, width: int, indent: int = 4) -> list[str]:
    """``text`` broken at spaces into lines of at most ``width`` characters (a word longer
    than a line is never cut), the lines after the first indented by ``indent``."""
    import textwrap

    return textwrap.wrap(
        text,
        width=max(width, 20),
        subsequent_indent=" " * indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [""]


def verdict_rows(
    result: Result, width: int, rows: frozenset[Verdict] | None = None
) -> list[tuple[str, Verdict | None]]:
    """The verdict table as plain lines for a console ``width`` columns wide: a heading,
    then per rule ``ID VERDICT LEVEL SEEN Name: note``, ``SEEN`` being the steps that
    exercised the rule's scenario (``RuleVerdict.evidence``; a FAIL may show 0, a SKIP more:
    docs/cli.md). The ID, verdict and name are
    never cut; a note that does not fit wraps onto indented lines. Each line comes with
    the verdict that colours it (``None``: the heading)."""
    out: list[tuple[str, Verdict | None]] = [
        (clean(heading(result)), None),
        ("rule     verdict  level     seen name: note", None),
    ]
    unreached = 0
    for rv in result.rules:
        if rows is not None and rv.verdict not in rows:
            continue
        if rows is not None and rv.verdict is Verdict.UNKNOWN and rv.reason == NOT_REACHED:
            unreached += 1  # folded into one line below: the run stopped, not the rule
            continue
        head = f"{rv.rule.id:<8} {rv.verdict.value:<8} {rv.rule.level:<6}{rv.evidence:>8} "
        text = f"{head}{rv.rule.name}" + (f": {clean(rv.reason)}" if rv.reason else "")
        out += [(line, rv.verdict) for line in wrapped(text, width, indent=len(head))]
    if unreached:
        rules = "rule" if unreached == 1 else "rules"
        text = f"UNKNOWN  {unreached} more {rules}: {NOT_REACHED} (-v lists them)"
        out += [(line, Verdict.UNKNOWN) for line in wrapped(text, width, indent=9)]
    return out


def trace_system(path: Path | None) -> dict[str, Any]:
    """The ``system`` object of a trace's header (how to reach the system under test;
    ``{}`` when the trace has none or cannot be read)."""
    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip() and not line.lstrip().startswith("#"):
                    head = json.loads(line)
                    found = head.get("system") if isinstance(head, dict) else None
                    return found if isinstance(found, dict) else {}
    except (OSError, ValueError):
        pass
    return {}


def _imports(name: object) -> bool:
    """A ``package.module:function`` name (not ``mutant:NAME``, ``design:NAME`` or
    ``program:...``, which name no code of their own)."""
    return (
        isinstance(name, str)
        and ":" in name
        and name.partition(":")[0]
        not in (
            "mutant",
            "design",
        )
    )


def replay_hint(result: Result) -> str:
    """The command that replays the counterexample on the same system. A trace never
    makes ``replay`` import code, so an engine or client given as ``module:function`` is
    passed explicitly (as given, from the trace header's ``system``); the URL, checkpoints,
    served model and overlay the header records are read back by ``replay`` itself."""
    words = ["kvfence", "replay", str(result.counterexample)]
    recorded = trace_system(result.counterexample)
    engine = recorded.get("engine", result.engine)
    client = recorded.get("client", result.client)
    for flag, name in (("--engine", engine), ("--client", client)):
        if _imports(name) or (isinstance(name, str) and name.startswith("program:")):
            words += [flag, str(name)]
    return " ".join(words)


def plural(count: int, word: str) -> str:
    """``1 step``, ``3 steps``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


_COUNT_WORDS = (
    (Verdict.FAIL, "failed"),
    (Verdict.WARN, "warned"),
    (Verdict.ERROR, "error"),
    (Verdict.UNKNOWN, "unknown"),
    (Verdict.PASS, "passed"),
    (Verdict.SKIP, "skipped"),
    (Verdict.NA, "n/a"),
)


def counts_words(result: Result) -> str:
    """``4 failed, 24 passed, 18 skipped, 1 n/a``: the rules per verdict, none left out
    but the verdicts no rule holds."""
    counts = {v: sum(rv.verdict is v for rv in result.rules) for v, _ in _COUNT_WORDS}
    return ", ".join(f"{counts[v]} {word}" for v, word in _COUNT_WORDS if counts[v])


def class_words(result: Result) -> str:
    """``safety: PASS, availability: FAIL (FC-001: EngineSurvivesRefusedFlush)``: the
    verdict of each half (``runner.by_class``), naming the rules that broke it."""
    halves = by_class(result.rules, result.violations, result.verdict)
    out = []
    for klass in (Klass.SAFETY, Klass.AVAILABILITY):
        verdict = halves[klass]
        broke = [
            v.rule
            for v in result.violations
            if v.cost is klass or BY_ID[v.rule].klass is Klass.CHECK
        ]
        unique = list(dict.fromkeys(broke))
        named = f"{unique[0]}: {BY_ID[unique[0]].name}" if len(unique) == 1 else ", ".join(unique)
        bad = verdict in (Verdict.FAIL, Verdict.WARN) and named
        out.append(f"{klass}: {verdict}" + (f" ({named})" if bad else ""))
    return ", ".join(out)


def must_skipped(result: Result) -> list[str]:
    """The IDs of the MUST rules a run left SKIP. A rule that binds only engines of another
    profile, or only the other kind of client, is N/A, not SKIP: no gap."""
    return [r.rule.id for r in result.rules if r.verdict is Verdict.SKIP and r.rule.level == "MUST"]


def skip_warning(result: Result) -> str:
    """The one-line warning for a PASS (or WARN) that left MUST rules SKIP, ``""`` when
    none did or the run did not pass (a FAIL or ERROR already says more)."""
    skipped = must_skipped(result)
    if not skipped or result.verdict not in (Verdict.PASS, Verdict.WARN):
        return ""
    return (
        f"warning: {plural(len(skipped), 'MUST rule')} SKIP, never exercised "
        f"({', '.join(skipped)}); -v shows why, --require CAP[,CAP] demands them"
    )


def result_warnings(result: Result) -> list[str]:
    """Every warning of a run, as the reports carry it: the run's own and the MUST-SKIP
    warning (``skip_warning``)."""
    out = [clean(w) for w in result.warnings]
    if line := skip_warning(result):
        out.append(line.removeprefix("warning: "))
    return out


def summary_line(result: Result) -> str:
    """The run in one line: ``verdict: FAIL  1 failed, 40 passed, 6 skipped; safety: FAIL
    (INV-001: ...), availability: PASS; 30 examples, 3.9 s, engine 0.4 s, client 0.0 s``
    (plain text)."""
    more = f" with {result.top_ups} extra searches for evidence" if result.top_ups else ""
    timing = "" if result.timing is None else f", {overhead_words(result.timing)}"
    covered = "" if result.bounds is None else f"; {result.bounds.words()}"
    return (
        f"verdict: {result.verdict}  {counts_words(result)}; {class_words(result)}; "
        f"{battery_words(result)}{plural(result.examples, 'example')}{more}, "
        f"{result.seconds:.1f} s{timing}{covered}"
    )


def battery_words(result: Result) -> str:
    """``"battery 83 ran (82 passed, 1 failed), 4 skipped; "``, or ``""`` when no battery
    ran."""
    b = result.battery
    if b is None:
        return ""
    return f"battery {b.ran} ran ({b.passed} passed, {b.failed} failed), {b.skipped} skipped; "


def battery_json(b: BatteryRun | None) -> dict[str, Any] | None:
    """A ``BatteryRun`` as JSON: totals, seconds, the failed scenario's name, and one
    object per rule (``rule``, ``ran``, ``passed``, ``failed``, ``skipped``, ``reason``:
    the first skip's)."""
    if b is None:
        return None
    return {
        "ran": b.ran,
        "passed": b.passed,
        "failed": b.failed,
        "skipped": b.skipped,
        "seconds": round(b.seconds, 3),
        "failed_scenario": b.failed_scenario,
        "rules": [attrs.asdict(t) for t in b.tallies],
    }


def battery_from_json(data: dict[str, Any] | None) -> BatteryRun | None:
    """The ``BatteryRun`` a ``battery_json`` object describes (``None`` for none)."""
    if data is None:
        return None
    tallies = tuple(RuleTally(**t) for t in data["rules"])
    return BatteryRun(
        tallies,
        int(data["ran"]),
        int(data["passed"]),
        int(data["failed"]),
        int(data["skipped"]),
        float(data["seconds"]),
        str(data["failed_scenario"]),
    )


def print_result(result: Result, console: Console | None = None, verbosity: int = 0) -> None:
    """Print one check. ``verbosity`` -1 (``-q``): the summary line alone; 0 (default):
    the rows that FAIL, WARN, ERROR or are UNKNOWN, the violations, the counterexample's
    steps and its replay command, warnings, the summary line; 1 (``-v``): every row."""
    console = console or Console()
    if verbosity >= 0:
        rows = None if verbosity > 0 else SHOWN
        if rows is None or any(rv.verdict in rows for rv in result.rules):
            for line, verdict in verdict_rows(result, console.width, rows):
                style = "bold" if verdict is None else STYLE.get(verdict, "")
                console.print(line, style=style, markup=False, highlight=False, soft_wrap=True)
        for v in result.violations:
            first, *more = wrapped(f"violated {clean(v)}", console.width)
            console.print(f"[bold red]violated[/]{_text(first.removeprefix('violated'))}")
            for line in more:
                console.print(line, markup=False, highlight=False, soft_wrap=True)
        if result.error:
            console.print(f"[bold magenta]error[/] {_text(result.error)}")
        for w in result.warnings:
            console.print(f"[yellow]warning[/] {_text(w)}")
        if result.counterexample:
            console.print(
                f"counterexample ({plural(result.steps, 'step')}): {_text(result.counterexample)}",
                soft_wrap=True,
            )
            print_steps(trace_steps_text(result.counterexample), console)
            console.print(
                f"replay it: {_text(replay_hint(result))}",
                soft_wrap=True,  # a command to copy: never broken over lines
            )
        if warning := skip_warning(result):
            console.print(warning, markup=False, highlight=False)
    style = STYLE.get(result.verdict, "")
    first, *more = wrapped(summary_line(result), console.width, indent=2)
    rest = first.removeprefix(f"verdict: {result.verdict}")
    console.print(
        f"verdict: [{style}]{result.verdict}[/]{_text(rest)}", soft_wrap=True, highlight=False
    )
    for line in more:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def print_steps(lines: list[str], console: Console) -> None:
    """Counterexample step lines (``counterexample_lines``), each wrapped to the console's
    width under its own indentation; a step that broke a rule in bold."""
    for line in lines:
        depth = len(line) - len(line.lstrip())
        indent = depth + 5 if line.lstrip()[:1].isdigit() else depth + 2
        for part in wrapped(line, console.width, indent=indent):
            style = "bold" if "<- " in line else ""
            console.print(part, style=style, markup=False, highlight=False, soft_wrap=True)


def overhead_words(t: TimeSplit) -> str:
    """The summary line's account of the wall time, e.g. ``engine 41.2 s, client 0.0 s,
    checker share 7.9%``. On an in-process engine (the reference, a mutant, a design) the
    engine answers in microseconds, so the checker's share is most of a run and says
    nothing; on a real engine it is the cost kvfence adds (docs/bench.md)."""
    return (
        f"engine {t.engine_seconds:.1f} s, client {t.client_seconds:.1f} s, "
        f"checker share {100 * t.checker_fraction:.1f}%"
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
        "engine_version": result.engine_version,
        "fingerprint": result.fingerprint,
        "client": result.client,
        "profile": result.profile,
        "seed": result.seed,
        "verdict": result.verdict.value,
        "seconds": round(result.seconds, 3),
        "timing": timing_json(result.timing),
        "examples": result.examples,
        "top_ups": result.top_ups,
        "battery": battery_json(result.battery),
        "bounds": None if result.bounds is None else result.bounds.to_json(),
        "counterexample": None if result.counterexample is None else str(result.counterexample),
        "counterexample_steps": result.steps,
        "error": result.error,
        "safety": result.safety.value,
        "availability": result.availability.value,
        "warnings": result_warnings(result),
        "violations": [{**violation_json(v), "class": v.cost.value} for v in result.violations],
        "rules": [
            {
                "id": rv.rule.id,
                "name": rv.rule.name,
                "level": rv.rule.level,
                "class": rv.rule.klass.value,
                "verdict": rv.verdict.value,
                "evidence": rv.evidence,
                "note": rv.reason,
            }
            for rv in result.rules
        ],
    }


def result_from_json(data: dict[str, Any]) -> Result:
    """The ``Result`` a ``result_json`` object describes: verdicts, rules, violations (their
    expected and actual values as the JSON holds them), counterexample path, steps and
    counts; the timing split and the raw notes are not kept (``None`` and the report's
    ``warnings``). Raises ``KeyError``, ``ValueError`` or ``TypeError`` on an object of
    another shape, or a rule ID no longer registered."""
    from ..model.checks import Violation

    rules = tuple(
        RuleVerdict(BY_ID[r["id"]], Verdict(r["verdict"]), int(r["evidence"]), r["note"] or "")
        for r in data["rules"]
    )
    violations = tuple(
        Violation(v["rule"], v["expected"], v["actual"], v["where"], Klass(v["class"]))
        for v in data["violations"]
    )
    counterexample = data["counterexample"]
    return Result(
        engine=data["engine"],
        client=data["client"],
        profile=data["profile"],
        seed=data["seed"],
        verdict=Verdict(data["verdict"]),
        rules=rules,
        violations=violations,
        error=data["error"],
        counterexample=None if counterexample is None else Path(counterexample),
        steps=int(data["counterexample_steps"]),
        examples=int(data["examples"]),
        seconds=float(data["seconds"]),
        warnings=tuple(data["warnings"]),
        top_ups=int(data["top_ups"]),
        battery=battery_from_json(data.get("battery")),
        bounds=None if data.get("bounds") is None else Covered(**data["bounds"]),
        engine_version=data.get("engine_version"),
        fingerprint=data.get("fingerprint"),
    )


def write_json(results: list[Result], path: Path) -> None:
    """The results as JSON, written atomically; any text an adapter returned survives
    (``ensure_ascii`` escapes lone surrogates)."""
    data = [result_json(r) for r in results]
    write_atomic(path, json.dumps(data, indent=2, default=repr) + "\n")


def in_run_folder(result: Result, report: Path) -> Result:
    """``result`` with a relative counterexample path read against the folder its run ran
    in: ``report``'s folder's parent, as ``kvfence check`` and ``kvfence mutants`` write it
    with ``--out DIR --json DIR/x.json``."""
    path = result.counterexample
    if path is None or path.is_absolute():
        return result
    return attrs.evolve(result, counterexample=report.resolve().parent.parent / path)


def read_check_json(
    path: Path, engine: str, client: str, fingerprint: str | None = None
) -> Result | None:
    """The result of ``engine`` + ``client`` that a ``write_json`` report at ``path`` holds
    (``kvfence check --json``), when that check is the one asked for: its ``fingerprint``
    (``runner.check_fingerprint``: this source tree and the check's options) is
    ``fingerprint``, by default a plain ``ci`` check's of this tree (no ``--max-examples``,
    no ``--focus``, the battery first). Else ``None``, also for a missing or unreadable
    file or a result of another shape. A relative counterexample path is read against
    the folder the run ran in (``in_run_folder``). Which engine release answered is the
    result's ``engine_version``: the caller compares it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, list):
        return None
    want = check_fingerprint() if fingerprint is None else fingerprint
    for item in data:
        if not isinstance(item, dict):
            continue
        if (item.get("engine"), item.get("client"), item.get("fingerprint")) != (
            engine,
            client,
            want,
        ):
            continue
        try:
            return in_run_folder(result_from_json(item), path)
        except (KeyError, ValueError, TypeError):
            return None
    return None


def write_junit(results: list[Result], path: Path) -> None:
    """One testsuite per check, one testcase per rule. FAIL is a failure; ERROR and UNKNOWN
    are errors (a checker that could not see is never a pass); SKIP and N/A are skipped.
    A suite's properties carry the run's verdict, its safety and availability verdicts and
    one ``warning`` property per warning (``result_warnings``, also in its system-out); a
    testcase's property ``class`` is its rule's (safety, availability, check). Written
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
        props = ET.SubElement(suite, "properties")
        warnings = result_warnings(result)
        facts = [
            ("verdict", result.verdict.value),
            ("safety", result.safety.value),
            ("availability", result.availability.value),
        ]
        for name, value in facts + [("warning", w) for w in warnings]:
            ET.SubElement(props, "property", name=name, value=xml_text(value))
        for rv in result.rules:
            case = ET.SubElement(
                suite, "testcase", classname=f"kvfence.{rv.rule.kind}", name=rv.rule.id
            )
            case_props = ET.SubElement(case, "properties")
            ET.SubElement(case_props, "property", name="class", value=rv.rule.klass.value)
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
        if warnings:
            out = ET.SubElement(suite, "system-out")
            out.text = xml_text("\n".join(f"warning: {w}" for w in warnings))
    ET.indent(root)
    body = ET.tostring(root, encoding="unicode")
    write_atomic(path, '<?xml version="1.0" encoding="utf-8"?>\n' + body + "\n")


# ----- the counterexample, one line per step ------------------------------------------------

_ACTION_SHORT = {"endpoint": "ep", "version": "v", "prefix": "", "funnel": "", "mode": ""}


def _action_words(action: dict[str, Any]) -> str:
    """``SyncWeights v1 tensor``, ``ServeRequest ep0 P``: the action and its fields, short."""
    fields = dict(action)
    words = [str(fields.pop("action", "?"))]
    for key, value in fields.items():
        if value is None or (value is False and key == "lora"):
            continue
        prefix = _ACTION_SHORT.get(key)
        words.append(f"{prefix}{value}" if prefix is not None else f"{key}={value}")
    return " ".join(words)


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A JSON object as ``{"view.cache": [...], "status": "ok"}`` (dotted paths)."""
    if not isinstance(obj, dict):
        return {prefix: obj}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(_flat(value, path))
        else:
            out[path] = value
    return out


def _short(value: Any) -> str:
    """A JSON value in few characters: cache entries as ``P:target@0``, lists joined."""
    if isinstance(value, list):
        if value and all(isinstance(e, dict) and "prefix" in e for e in value):
            parts = [f"{e.get('prefix')}:{e.get('kind')}@{e.get('version')}" for e in value]
            return "[" + " ".join(parts) + "]"
        if value and all(isinstance(e, list) and len(e) == 2 for e in value):
            return "[" + " ".join(f"{a}@{b}" for a, b in value) + "]"
        return "[" + " ".join(_short(e) for e in value) + "]"
    return str(value)


_ANSWER_FIELDS = ("status", "response.hit", "response.uses", "flushed", "aborted")


def _differences(observed: dict[str, Any], allowed: dict[str, Any]) -> list[str]:
    """The fields in which ``observed`` differs from one allowed outcome, as the spec
    states them; a field the spec leaves open (``null`` where the system says more, as a
    response's output) is no difference."""
    seen = _flat(observed)
    out = []
    for path, want in _flat(allowed).items():
        if want is not None and seen.get(path) != want:
            shown = "" if path in _ANSWER_FIELDS else f" (answered {_short(seen.get(path))})"
            out.append(f"{path}={_short(want)}{shown}")
    return out


def _engine_step_words(line: dict[str, Any]) -> tuple[str, str]:
    """(what the system answered, what the spec allowed) for an engine step's trace line."""
    seen = _flat(line.get("observed") or {})
    answered = ", ".join(
        f"{p.split('.')[-1]}={_short(seen[p])}"
        for p in _ANSWER_FIELDS
        if p in seen and seen[p] is not None
    )
    if "expected" not in line:  # a trace that records observations alone
        return answered, ""
    outcomes = [o.get("observation") or {} for o in line.get("expected") or ()]
    if not outcomes:
        return answered, "spec allowed: nothing (the action is not enabled)"
    diffs = min((_differences(line.get("observed") or {}, o) for o in outcomes), key=len)
    if not diffs:
        return answered, "as allowed"
    return answered, "spec allowed: " + ", ".join(diffs)


def _sync_step_words(line: dict[str, Any]) -> tuple[str, str]:
    """(the client's plans, the spec's plans where they differ) for a sync's trace line."""
    answered, allowed = [], []
    for p in line.get("plans") or ():
        got, want = p.get("observed") or {}, p.get("expected")
        plan = " ".join(f"{k}={v}" for k, v in got.items())
        answered.append(f"ep{p.get('endpoint')} {plan}")
        if want is not None and want != got:
            allowed.append(
                f"ep{p.get('endpoint')} " + " ".join(f"{k}={v}" for k, v in want.items())
            )
    raised = (line.get("program") or {}).get("raised")
    if raised is not None:
        answered.append(f"raised {raised}")
    return "plan " + "; ".join(answered), (
        "spec allowed: " + "; ".join(allowed) if allowed else "as allowed"
    )


def _breaks_at(lines: list[dict[str, Any]], violation: dict[str, Any], last: int) -> int:
    """The step a violation broke on: a client's plan rule (``where``: ``endpoint N
    plan.FIELD``) on the first sync whose plan for that endpoint differs from the spec's in
    that field; any other rule on the step the run stopped on (``last``: the lockstep stops
    at the first engine step that breaks a rule, and records the client's on the way)."""
    m = re.match(r"endpoint (\d+) plan\.(\w+)", str(violation.get("where", "")))
    if m:
        ep, key = int(m.group(1)), m.group(2)
        for line in lines:
            for p in line.get("plans") or ():
                want = p.get("expected") or {}
                got = (p.get("observed") or {}).get(key)
                if p.get("endpoint") == ep and key in want and got != want[key]:
                    return int(line.get("step", last))
    return last


def counterexample_lines(
    lines: list[dict[str, Any]], violations: list[dict[str, Any]], last: int | None = None
) -> list[str]:
    """A counterexample's steps as text, one line each: its number, the action with its
    endpoint, what the system answered and what the spec allowed (``as allowed`` when the
    answer was one of the spec's outcomes), and ``<- RULE`` on the step where each violated
    rule broke. ``lines``: the steps as trace lines (``trace.step_json``); ``violations``:
    ``violation_json`` objects; ``last``: the step the run stopped on (default the last
    line's). An engine call a sync made is indented under it."""
    if not lines:
        return []
    stop = int(lines[-1].get("step", 0)) if last is None else last
    marks: dict[int, list[str]] = {}
    for v in violations:
        rules = marks.setdefault(_breaks_at(lines, v, stop), [])
        if v.get("rule") not in rules:
            rules.append(str(v.get("rule")))
    out = []
    for line in lines:
        number = int(line.get("step", 0))
        if "plans" in line or "program" in line:
            answered, allowed = _sync_step_words(line)
        else:
            answered, allowed = _engine_step_words(line)
        indent = "    " if line.get("within") is not None else "  "
        words = [f"{indent}{number:>2} {_action_words(line.get('action') or {})}"]
        words += [w for w in (answered, allowed) if w]
        text = " | ".join(words)
        if number in marks:
            text += "  <- " + ", ".join(marks.pop(number))
        out.append(text)
    for rules in marks.values():  # a step the trace does not hold: say so, never drop it
        out.append(f"  (after the last step) <- {', '.join(rules)}")
    return out


def trace_steps_text(path: Path | None) -> list[str]:
    """``counterexample_lines`` of a JSONL trace file, with a heading ``counterexample (N
    steps): PATH``; one line naming the problem when it cannot be read (never raises)."""
    if path is None:
        return []
    from ..model.actions import TraceError
    from .trace import read_trace

    try:
        trace = read_trace(path, allow_other_spec=True)
        # The reader keeps observations only; the spec's outcomes are read from the lines.
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
        lines = [json.loads(x) for x in text if x.strip() and not x.lstrip().startswith("#")]
    except (TraceError, OSError, ValueError) as e:
        return [f"(the counterexample's steps cannot be shown: {clean(e)})"]
    lines = [x for x in lines[1:] if isinstance(x, dict) and "action" in x]
    verdict = trace.verdict or {}
    last = verdict.get("step") if isinstance(verdict.get("step"), int) else None
    return counterexample_lines(lines, list(verdict.get("violations") or ()), last)
