"""``kvfence``: check, mutants, replay, explore, rules, diagram.

Exit codes: 0 pass (or FIXED), 1 fail (or FAILED), 2 error or unknown, 3 usage.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import NoReturn

from kvfence.adapters import registry
from kvfence.model import lifecycle
from kvfence.model.actions import TraceError
from kvfence.model.rules import RULES
from rich.console import Console
from rich.table import Table

from .report import print_result, write_json, write_junit
from .runner import PROFILES, Result, run_check

EXIT_PASS, EXIT_FAIL, EXIT_ERROR, EXIT_USAGE = 0, 1, 2, 3


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error exits 3 (2 means ERROR/UNKNOWN for kvfence)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", choices=sorted(PROFILES), default="ci", help="budget")
    p.add_argument("--seed", type=int, help="random seed (dev/fuzz; ci is derandomized)")
    p.add_argument("--strict", action="store_true", help="SHOULD rules fail too")
    p.add_argument("--out", type=Path, default=Path("kvfence-results"), help="output folder")
    p.add_argument("--junit", type=Path, help="write JUnit XML here")
    p.add_argument("--json", type=Path, help="write a JSON results file here")
    p.add_argument("--timeout", type=seconds, default=120.0, help="seconds per adapter call")
    p.add_argument("--max-examples", type=positive_int, help="override the profile's example count")


def build_parser() -> Parser:
    parser = Parser(prog="kvfence", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("check", help="run the conformance machine against one system")
    p.add_argument("--engine", default="reference", help=f"one of: {', '.join(registry.ENGINES)}")
    p.add_argument(
        "--client",
        default="reference",
        help=f"one of: {', '.join(registry.CLIENTS)}, or package.module:function",
    )
    _common(p)

    p = sub.add_parser(
        "mutants",
        help="pass matrix (every correct design passes) and kill matrix (every mutant killed)",
    )
    p.add_argument("--only", nargs="*", metavar="NAME", help="only these designs or mutants")
    p.add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1, help="parallel runs")
    _common(p)

    p = sub.add_parser("replay", help="replay a JSONL counterexample")
    p.add_argument("trace", type=Path)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--engine", help="replay against this engine (default: the header's)")
    group.add_argument(
        "--model-only", action="store_true", help="judge the recorded observations alone"
    )
    p.add_argument("--client", help="client for SyncWeights steps (default: the header's)")
    p.add_argument("--allow-other-spec", action="store_true", help="read another spec's trace")
    p.add_argument("--timeout", type=seconds, default=120.0)

    p = sub.add_parser("explore", help="exhaustive breadth-first search within bounds")
    p.add_argument("--endpoints", type=positive_int, default=2)
    p.add_argument("--prefixes", type=positive_int, default=1)
    p.add_argument("--versions", type=positive_int, default=2)
    p.add_argument("--inflight", type=positive_int, default=1)
    p.add_argument("--depth", type=positive_int, default=6)
    p.add_argument("--engine", help="explore model x this in-process engine")
    p.add_argument("--client", help="explore model x this client")

    p = sub.add_parser("rules", help="list the rule registry")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")

    sub.add_parser("diagram", help="print the endpoint lifecycle as a Mermaid diagram")
    return parser


# ----- check ---------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    try:
        engine = registry.engine(args.engine)
        client = registry.client(args.client)
    except ValueError as e:
        console.print(f"[bold red]usage:[/] {e}")
        return EXIT_USAGE
    result = run_check(
        engine,
        client,
        profile=args.profile,
        seed=args.seed,
        out_dir=args.out,
        strict=args.strict,
        timeout=args.timeout,
        max_examples=args.max_examples,
    )
    print_result(result, console)
    if not _write_reports([result], args, console):
        return EXIT_ERROR
    return result.exit_code


def _write_reports(results: list[Result], args: argparse.Namespace, console: Console) -> bool:
    """Write the requested reports; False (and a message naming the file) if one fails."""
    try:
        if args.json:
            write_json(results, args.json)
        if args.junit:
            write_junit(results, args.junit)
    except OSError as e:
        console.print(f"[bold magenta]error[/] could not write a report: {e}")
        return False
    return True


# ----- mutants: the pass matrix and the kill matrix (conformance/matrix.py) ------------


def cmd_mutants(args: argparse.Namespace, console: Console) -> int:
    from . import matrix

    designs, mutants, unknown = matrix.select(args.only)
    if unknown:
        console.print(f"[bold red]usage:[/] unknown design(s) or mutant(s) {', '.join(unknown)}")
        return EXIT_USAGE
    x = matrix.run_matrices(
        designs, mutants, args.profile, args.out, args.timeout, args.max_examples, args.jobs
    )
    matrix.print_matrices(x, args.profile, console)
    ok = _write_reports(x.results, args, console)
    return EXIT_PASS if ok and x.ok else EXIT_FAIL


# ----- replay --------------------------------------------------------------------------


def cmd_replay(args: argparse.Namespace, console: Console) -> int:
    from .replay import replay_trace
    from .trace import read_trace

    try:
        trace = read_trace(args.trace, allow_other_spec=args.allow_other_spec)
    except TraceError as e:
        console.print(f"ERROR {e}")
        return EXIT_ERROR
    if args.model_only:
        engine = client = None
        against = "the spec alone (recorded observations)"
    else:
        name = args.engine or trace.header.get("engine", "reference")
        client_name = args.client or trace.header.get("client", "reference")
        for what, value, given in (
            ("engine", name, args.engine),
            ("client", client_name, args.client),
        ):
            if not isinstance(value, str) or (":" in value and given is None):
                # A trace is a bug report from anywhere: never import code it names.
                console.print(
                    f"ERROR the trace names {what} {value!r}; replay only runs registry "
                    f"names from a trace. Pass --{what} explicitly to run it."
                )
                return EXIT_ERROR
        try:
            engine = registry.engine(name)
            client = registry.client(client_name)
        except ValueError as e:
            console.print(f"ERROR {e}")
            return EXIT_ERROR
        against = f"engine {name}, client {client_name}"
    try:
        replayed = replay_trace(trace, engine, client, timeout=args.timeout)
    finally:
        if engine is not None:
            engine.close()
    word = {"FAIL": "FAILED", "PASS": "FIXED"}.get(replayed.kind, "ERROR")
    console.print(f"{word} {args.trace} against {against}")
    for v in replayed.violations:
        console.print(f"  violated {v}")
    if replayed.message:
        console.print(f"  {replayed.message}")
    return {"FAILED": EXIT_FAIL, "FIXED": EXIT_PASS}.get(word, EXIT_ERROR)


# ----- explore, rules, diagram ---------------------------------------------------------


def cmd_explore(args: argparse.Namespace, console: Console) -> int:
    from .explore import main_explore

    code, text = main_explore(
        args.endpoints,
        args.prefixes,
        args.versions,
        args.inflight,
        args.depth,
        args.engine,
        args.client,
    )
    console.print(text, highlight=False, markup=False)
    return code


def cmd_rules(args: argparse.Namespace, console: Console) -> int:
    if args.markdown:
        lines = ["| ID | name | level | requirement | source |", "|---|---|---|---|---|"]
        lines += [f"| {r.id} | {r.name} | {r.level} | {r.text} | {r.source} |" for r in RULES]
        print("\n".join(lines))
        return EXIT_PASS
    table = Table(title="kvfence rules", title_justify="left")
    for col in ("ID", "name", "level", "requirement"):
        table.add_column(col)
    for r in RULES:
        table.add_row(r.id, r.name, r.level, r.text)
    console.print(table)
    return EXIT_PASS


def cmd_diagram(args: argparse.Namespace, console: Console) -> int:
    print(lifecycle.diagram())
    return EXIT_PASS


COMMANDS = {
    "check": cmd_check,
    "mutants": cmd_mutants,
    "replay": cmd_replay,
    "explore": cmd_explore,
    "rules": cmd_rules,
    "diagram": cmd_diagram,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=160)
    return COMMANDS[args.command](args, console)


if __name__ == "__main__":
    sys.exit(main())
