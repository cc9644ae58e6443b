"""``kvfence``: check, mutants, replay, explore, engines, rules, diagram, serve.

Exit codes: 0 pass (or FIXED), 1 fail (or FAILED), 2 error or unknown, 3 usage.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..adapters import registry
from ..adapters.mutants import BY_NAME as MUTANTS_BY_NAME
from ..model import lifecycle
from ..model.actions import Action, TraceError
from ..model.capabilities import EVIDENCE, Capability
from ..model.capabilities import parse as parse_capabilities
from ..model.checks import Violation
from ..model.explore import initial_states
from ..model.rules import BY_ID, RULES
from ..model.state import Bounds, Config, Policy
from ..model.vocabulary import Tier
from . import isolate
from .calls import SIGNALLED
from .explore import DEPLOYMENTS, deployment, explore_adapter
from .report import (
    clean,
    counterexample_lines,
    plural,
    print_result,
    print_steps,
    wrapped,
    write_json,
    write_junit,
)
from .runner import PROFILES, Result, check_database, example_database, run_check
from .search import MAX_SECONDS, explore, usable_cores
from .trace import step_lines, violation_json
from .verdict import REPLAY_WORDS, ReplayKind, Verdict

EXIT_PASS, EXIT_FAIL, EXIT_ERROR, EXIT_USAGE = 0, 1, 2, 3

EXPLORE_MAX_STATES = 3_000_000
"""``kvfence explore --max-states``'s default: the model's search keeps every state it has
seen (a few hundred bytes each, plus the forked workers' copied pages), so this keeps it
to a few GB on a 2-core, 24 GB machine; the default depth needs far fewer (``scripts/
bench.py``'s explore figure counts them)."""

EXPLORE_MAX_SECONDS = 1800.0
"""``kvfence explore --max-seconds``'s default: half an hour."""


KIND_WORDS = (*registry.KIND_PREFIXES, "program")
"""Name prefixes that address the registry (``mutant:NAME``), not code to import."""


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, but never broken at a hyphen (``vllm-rl-raw`` stays whole)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error exits 3 (2 means ERROR/UNKNOWN for kvfence), and help
    is never broken at a hyphen."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

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


def rule_id(text: str) -> str:
    """A rule ID of the registry, exactly as ``kvfence rules`` lists it."""
    if text not in BY_ID:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rule ID (see `kvfence rules`)")
    return text


def capabilities_list(text: str) -> tuple[Capability, ...]:
    """``--require CAP[,CAP]``: capability names as ``kvfence check`` reports them."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = {c.value: c for c in Capability}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or repr(text)} is not a capability; known: {', '.join(known)}"
        )
    return tuple(known[n] for n in names)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", choices=sorted(PROFILES), default="ci", help="budget")
    p.add_argument("--seed", type=int, help="random seed (dev/fuzz; ci is derandomized)")
    p.add_argument("--strict", action="store_true", help="SHOULD rules fail too")
    p.add_argument("--out", type=Path, default=Path("kvfence-results"), help="output folder")
    p.add_argument("--junit", type=Path, help="write JUnit XML here")
    p.add_argument("--json", type=Path, help="write a JSON results file here")
    p.add_argument("--timeout", type=seconds, default=120.0, help="seconds per adapter call")
    p.add_argument("--max-examples", type=positive_int, help="override the profile's example count")
    _verbosity(p)


def _verbosity(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "-v",
        "--verbose",
        dest="verbosity",
        action="store_const",
        const=1,
        default=0,
        help="every rule's row (default: only the rows that FAIL, WARN, ERROR or are UNKNOWN)",
    )
    group.add_argument(
        "-q",
        "--quiet",
        dest="verbosity",
        action="store_const",
        const=-1,
        help="the summary line alone",
    )


def build_parser() -> Parser:
    parser = Parser(prog="kvfence", description=__doc__)
    parser.add_argument(
        "--version", action="version", version=version_text(), help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("check", help="run the conformance machine against one system")
    p.add_argument(
        "--engine",
        default="reference",
        metavar="ENGINE",
        help="reference (default); a real engine: "
        f"{', '.join(registry.REAL_ENGINES)}; a catalog entry as mutant:NAME or design:NAME "
        "(`kvfence engines` lists them); or package.module:factory, a callable returning "
        "your own engine adapter",
    )
    p.add_argument(
        "--client",
        default="reference",
        metavar="CLIENT",
        help="reference (default); a catalog entry as mutant:NAME or design:NAME "
        "(`kvfence engines --side client`); or package.module:function, your own resolver",
    )
    p.add_argument(
        "--client-program",
        metavar="MODULE:FUNCTION",
        help="check a client program: sync(endpoints, version, policy) making the sync's "
        "engine calls itself (docs/clients.md); replaces --client",
    )
    registry.add_engine_options(p)
    p.add_argument(
        "--focus",
        type=rule_id,
        help="search until this rule is shown broken; rules broken on the way still FAIL",
    )
    p.add_argument(
        "--database",
        metavar="URL",
        help="a shared Hypothesis example database for --profile dev/fuzz: redis://HOST:PORT/DB "
        "(needs hypothesis[redis]) or a folder; workers sharing it replay each other's "
        "failures first",
    )
    p.add_argument(
        "--no-battery",
        dest="battery",
        action="store_false",
        help="skip the battery of scenarios derived from the model (run before the random "
        "search by default; docs/cli.md): the random search alone",
    )
    p.add_argument(
        "--require",
        type=capabilities_list,
        metavar="CAP[,CAP]",
        help="capabilities the engine must declare, so that the rules they unlock are "
        "exercised, not SKIP; one missing exits 2 before the run (as ERROR/UNKNOWN)",
    )
    p.add_argument(
        "--safety-only",
        action="store_true",
        help="the exit code follows the safety verdict alone (stale KV served, wrong labels); "
        "an availability failure (a refused flush that kills the engine) is still printed",
    )
    _common(p)

    p = sub.add_parser(
        "mutants",
        help="pass matrix (every correct design passes) and kill matrix (every mutant killed)",
    )
    p.add_argument("--only", nargs="*", metavar="NAME", help="only these designs or mutants")
    p.add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1, help="parallel runs")
    p.add_argument(
        "--stateful",
        action="store_true",
        help="kill every mutant by the stateful search alone (by default an in-process "
        "mutant is first killed by breadth-first search, the shortest counterexample)",
    )
    p.add_argument(
        "--designs-times",
        type=positive_int,
        metavar="N",
        help="the pass matrix also at N times each run's budget (10: every design's plain "
        "check at 6,000 examples under ci), its runs started first; a table, JUnit suite and "
        "JSON section of its own",
    )
    p.add_argument(
        "--designs-times-only",
        nargs="+",
        metavar="NAME",
        help="with --designs-times: those runs of these designs alone (names or CD-NN; the "
        "main job: the four allowance designs, adapters/designs.py ALLOWANCES)",
    )
    p.add_argument(
        "--designs-explored",
        action="store_true",
        help="every design also under the product explorer (depth 3, every setup: about "
        "40 s of CPU each), in the same pool; a line, JUnit suite and JSON section of its own",
    )
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
    p.add_argument("--strict", action="store_true", help="SHOULD rules fail too (as check)")
    p.add_argument("--timeout", type=seconds, default=120.0)
    g = p.add_argument_group(
        "the system replayed (default: as the trace header's system records it)"
    )
    g.add_argument("--url", help="the server to replay against, for an attached engine")
    g.add_argument("--checkpoint", action="append", metavar="vN=PATH", help="as for check")
    g.add_argument("--served-model", help="the server's model name")
    g.add_argument("--allow-remote", action="store_true", help="allow a --url not on loopback")
    g.add_argument("--overlay", help="sglang engines: a folder of fork files over SGLang's")
    g.add_argument(
        "--optimize", action="store_true", help="sglang engines: the scheduler under python -O"
    )
    g.add_argument(
        "--window", action="store_true", help="sglang engines: two-phase update windows drawn"
    )
    g.add_argument("--ranks", type=int, default=None, help="sglang engines: DP ranks per endpoint")

    p = sub.add_parser("explore", help="exhaustive breadth-first search within bounds")
    p.add_argument(
        "--endpoints",
        type=positive_int,
        default=2,
        help="endpoints of the model alone (the first exact lane, the others standard)",
    )
    p.add_argument(
        "--prefixes", type=positive_int, default=1, help="distinct prompt prefixes: P, Q, R, ..."
    )
    p.add_argument(
        "--versions", type=positive_int, default=2, help="newest weight version a sync may load"
    )
    p.add_argument(
        "--inflight", type=positive_int, default=1, help="request IDs that may be in flight"
    )
    p.add_argument("--depth", type=positive_int, default=6, help="actions per path, at most")
    p.add_argument("--engine", help="explore model x this in-process engine (default: none)")
    p.add_argument("--client", help="explore model x this client (default: none)")
    p.add_argument(
        "--deployment",
        choices=sorted(DEPLOYMENTS),
        help="start from a deployment's setup instead (ranks: one endpoint of two "
        "data-parallel ranks; store: two endpoints of another lineage and KV format on one "
        "shared KV store; pd: a prefill and a decode engine, each at its own version; "
        "router: two workers behind one router, each taken out of rotation and put back); "
        "replaces --endpoints",
    )
    p.add_argument(
        "--no-symmetry",
        dest="symmetry",
        action="store_false",
        help="explore the full state space (by default states equal up to renaming of "
        "prefixes, request IDs and endpoints of equal config are explored once)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=usable_cores(),
        help="processes expanding each large level of the model's search (default: the "
        "cores this process may use, %(default)s here; 1: one process); the result is the "
        "same whatever the number",
    )
    p.add_argument(
        "--max-states",
        type=positive_int,
        default=EXPLORE_MAX_STATES,
        help="stop the model's search after this many distinct states (default "
        "%(default)s: a few GB); a search stopped by a cap is UNKNOWN beyond it, exit 2",
    )
    p.add_argument(
        "--max-seconds",
        type=seconds,
        default=EXPLORE_MAX_SECONDS,
        help="stop the model's search after this many seconds (default %(default)s); "
        "UNKNOWN beyond the cap, exit 2",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("kvfence-results"),
        help="folder for the counterexample trace (named per run, as check's)",
    )

    p = sub.add_parser(
        "engines", help="list every engine (or client) name: references, real, mutants, designs"
    )
    p.add_argument("--kind", choices=registry.KINDS, help="only names of this kind")
    p.add_argument(
        "--side", choices=("engine", "client"), default="engine", help="engines or clients"
    )

    p = sub.add_parser("rules", help="list the rule registry, or show one rule")
    p.add_argument(
        "rule",
        nargs="?",
        metavar="ID",
        help="one rule (e.g. CLI-010): its text, rationale, source, class, the mutants that "
        "break it and the correct designs that keep it",
    )
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")

    p = sub.add_parser(
        "tiny-model",
        help="build the tiny model and its checkpoints for a real vLLM server (needs torch)",
    )
    p.add_argument("--out", type=Path, required=True, help="folder for v0/, v1/, ...")
    p.add_argument(
        "--versions", type=positive_int, default=2, help="checkpoints to build: v0 .. vN-1"
    )

    p = sub.add_parser(
        "diagram",
        help="print the endpoint lifecycle (or a deployment's parts) as a Mermaid diagram",
    )
    p.add_argument(
        "--deployment",
        choices=("ranks", "store", "pd", "router"),
        help="draw this deployment's endpoints, ranks, router, store and the KV between them "
        "(docs/deployments.md) instead of the lifecycle",
    )

    p = sub.add_parser(
        "serve",
        help="an HTTP server with an engine's own weight-sync routes, judged live",
    )
    p.add_argument("--api", choices=("sglang", "vllm"), required=True, help="routes to speak")
    p.add_argument(
        "--engine",
        help="the kvfence engine behind it (default: reference; with --ranks, reference-ranks; "
        "with --pd, checks-transferred-kv-version)",
    )
    p.add_argument(
        "--port",
        type=int,
        help="port (0: a free one; default the engine's own: SGLang 30000, vLLM 8000); with "
        "--pd, the prefill server's",
    )
    p.add_argument(
        "--ranks",
        type=int,
        default=1,
        metavar="N",
        help="sglang API: the endpoint has N data-parallel ranks behind SGLang's DP "
        "controller (an engine declaring the ranks capability; RNK-001..003 judged)",
    )
    p.add_argument(
        "--fail-rank-updates",
        type=int,
        default=0,
        metavar="N",
        help="with --ranks: the first N weight updates fail on the last rank alone "
        "(RNK-002, RNK-003: is the failure merged, and does the endpoint close?)",
    )
    p.add_argument(
        "--pd",
        action="store_true",
        help="sglang API: a prefill/decode pair, the prefill server on --port and the decode "
        "server on --decode-port, each with its own weight-sync routes (PD-001, FC-005)",
    )
    p.add_argument(
        "--decode-port",
        type=int,
        help="with --pd: the decode server's port (0: a free one; default --port + 1)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (loopback unless allowed)")
    p.add_argument(
        "--allow-remote", action="store_true", help="allow a --host that is not loopback"
    )
    p.add_argument(
        "--mode",
        choices=("auto", "flush", "none"),
        default="auto",
        help="the trainer's cache_invalidation_mode (recorded in the trace's policy)",
    )
    p.add_argument(
        "--probe",
        type=int,
        default=0,
        metavar="N",
        help="after each sync, re-send up to N prompts served before it, so stale reuse is "
        "asked about whatever the trainer sends (0: off)",
    )
    p.add_argument(
        "--refuse-resets",
        type=int,
        default=0,
        metavar="N",
        help="the first N prefix-cache resets the trainer asks are refused, as the engine "
        "refuses one while requests hold KV (CLI-010: is the refusal acted on?)",
    )
    p.add_argument(
        "--stream-hold",
        type=seconds,
        default=1.0,
        metavar="S",
        help='seconds a streamed generation ("stream": true) stays in flight holding its '
        "KV before it finishes (a reset meanwhile is refused, as the engine refuses it)",
    )
    p.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="serve an endpoint with prefix caching off (its server info says so)",
    )
    p.add_argument("--out", type=Path, default=Path("kvfence-results"), help="output folder")
    p.add_argument("--strict", action="store_true", help="SHOULD rules fail too")
    p.add_argument("--timeout", type=seconds, default=120.0, help="seconds per engine call")
    p.add_argument("--json", type=Path, help="write a JSON results file here")
    p.add_argument("--junit", type=Path, help="write JUnit XML here")
    return parser


# ----- check ---------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    try:
        engine = registry.engine(args.engine, **registry.engine_options(args))
        name = args.client
        if args.client_program is not None:
            name = registry.PROGRAM_PREFIX + args.client_program
        client = registry.client(name)
        check_database(args.database, args.profile, args.seed)
        if args.database is not None:
            example_database(args.database)
    except ValueError as e:
        # One line, never broken: a message to read whole (and to grep in a CI log).
        console.print(f"[bold red]usage:[/] {escape(clean(e))}", soft_wrap=True)
        return EXIT_USAGE
    if args.require and (missing := missing_capabilities(engine, args.require)):
        console.print(missing, markup=False, highlight=False)
        with contextlib.suppress(Exception):
            engine.close()
        return EXIT_ERROR
    from .progress import Progress

    total = planned_examples(engine, args.profile, args.max_examples)
    with Progress("kvfence check", total, "examples", enabled=args.verbosity >= 0) as progress:
        count_examples(engine, progress)
        result = run_check(
            engine,
            client,
            profile=args.profile,
            seed=args.seed,
            out_dir=args.out,
            strict=args.strict,
            timeout=args.timeout,
            max_examples=args.max_examples,
            focus=args.focus,
            isolate=True,
            on_progress=lambda value: example_done(progress),
            battery=args.battery,
            database=args.database,
        )
    print_result(result, console, args.verbosity)
    if not _write_reports([result], args, console):
        return EXIT_ERROR
    if args.safety_only:
        return result.safety.exit_code
    return result.exit_code


def planned_examples(engine: object, profile: str, max_examples: int | None) -> int:
    """The examples a check plans: ``--max-examples``, else the engine's own ``ci`` budget,
    else the profile's. Extra searches for evidence may run past it (the total grows)."""
    if max_examples is not None:
        return max_examples
    budget = getattr(engine, "budget", None)
    if profile == "ci" and isinstance(budget, dict) and "max_examples" in budget:
        return int(budget["max_examples"])
    return int(PROFILES[profile].max_examples)


def example_done(progress: object, _: object = None) -> None:
    """One more example on ``progress``; the total grows with the extra searches a check
    runs for evidence (``runner.TOP_UPS``)."""
    if progress.done >= progress.total:  # type: ignore[attr-defined]
        progress.total += 1  # type: ignore[attr-defined]
    progress.advance()  # type: ignore[attr-defined]


def count_examples(engine: object, progress: object) -> None:
    """Advance ``progress`` once per example: the checker starts the engine afresh for
    each (``EngineAdapter.start``), so its ``start`` is wrapped on this object alone. An
    adapter that takes no attribute gets no progress, and is checked the same."""
    start = getattr(engine, "start", None)
    if start is None:
        return

    def counted(*args, **kwargs):
        try:
            return start(*args, **kwargs)
        finally:
            # In an isolated check's child, the parent's bar advances (``on_progress``).
            if not isolate.notify("example"):
                example_done(progress)

    with contextlib.suppress(AttributeError, TypeError):
        engine.start = counted  # type: ignore[attr-defined]


def missing_capabilities(engine: object, required: Sequence[Capability]) -> str:
    """``--require``: the message naming each required capability the engine does not
    declare and the rules it leaves SKIP; ``""`` when every one is declared (an adapter
    whose capabilities do not parse is left to the run, which reports ADP-002)."""
    try:
        declared = parse_capabilities(getattr(engine, "capabilities", None))
    except ValueError:
        return ""
    lines = []
    for cap in dict.fromkeys(required):
        if cap not in declared:
            rules = [r for r, needs in EVIDENCE.items() if cap in needs]
            lines.append(
                f"required capability {cap.value} is not declared by engine "
                f"{getattr(engine, 'name', '?')!r}: {', '.join(rules) or 'no rule'} would be SKIP"
            )
    if lines:
        lines.append("ERROR: not run (--require)")
    return "\n".join(lines)


def must_skipped(result: Result) -> str:
    """The MUST rules a run left SKIP, each with its reason, in words ("" when none). A rule
    that binds only engines of another profile, or only the other kind of client (a
    resolver's plan rules for a program, CLI-012 for a resolver), is N/A, not SKIP: no gap.
    The console prints the shorter ``report.skip_warning``."""
    return "; ".join(
        f"{r.rule.id} ({r.reason})"
        for r in result.rules
        if r.verdict is Verdict.SKIP and r.rule.level == "MUST"
    )


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
    from .progress import Progress

    designs, mutants, unknown = matrix.select(args.only)
    if unknown:
        console.print(f"[bold red]usage:[/] unknown design(s) or mutant(s) {', '.join(unknown)}")
        return EXIT_USAGE
    times = args.designs_times or 0
    times_only = None
    if args.designs_times_only:
        if not times:
            console.print("[bold red]usage:[/] --designs-times-only needs --designs-times N")
            return EXIT_USAGE
        times_only, not_designs, unknown = matrix.select(args.designs_times_only)
        names = {d.name for d in designs}
        unknown += [m.name for m in not_designs]
        unknown += [d.name for d in times_only if d.name not in names]
        if unknown:
            console.print(
                "[bold red]usage:[/] --designs-times-only: not a design of this run: "
                + ", ".join(unknown)
            )
            return EXIT_USAGE
    at_times = len(designs if times_only is None else times_only) if times else 0
    total = len(designs) * (1 + args.designs_explored) + at_times + len(mutants)
    with Progress("kvfence mutants", total, "runs", enabled=args.verbosity >= 0) as progress:
        x = matrix.run_matrices(
            designs,
            mutants,
            args.profile,
            args.out,
            args.timeout,
            args.max_examples,
            args.jobs,
            explore=not args.stateful,
            on_done=progress.advance,
            designs_times=times,
            designs_explored=args.designs_explored,
            times_only=times_only,
        )
    matrix.print_matrices(x, args.profile, console)
    try:
        if args.json:
            matrix.write_matrix_json(x, args.json, args.profile)
        if args.junit:
            matrix.write_matrix_junit(x, args.junit)
    except OSError as e:
        console.print(f"[bold magenta]error[/] could not write a report: {e}")
        return EXIT_ERROR
    for line in x.unsettled():
        console.print(line, markup=False, highlight=False)
    return x.exit_code


# ----- replay --------------------------------------------------------------------------


def cmd_replay(args: argparse.Namespace, console: Console) -> int:
    from .replay import replay_trace
    from .trace import read_trace

    try:
        trace = read_trace(args.trace, allow_other_spec=args.allow_other_spec)
    except TraceError as e:
        console.print(f"ERROR {clean(e)}", markup=False, highlight=False)
        return EXIT_ERROR
    if args.model_only:
        engine = client = None
        against = "the spec alone (recorded observations)"
    else:
        recorded = trace.header.get("system")
        recorded = recorded if isinstance(recorded, dict) else {}
        name = args.engine or recorded.get("engine") or trace.header.get("engine", "reference")
        client_name = (
            args.client or recorded.get("client") or trace.header.get("client", "reference")
        )
        if args.client is not None and args.client.startswith("serve:"):
            # The client of a serve session (``serve:API``, as its replay line names it):
            # the trainer's calls are recorded as the reference client's actions.
            from .serve import APIS

            if args.client.partition(":")[2] not in APIS:
                console.print(
                    f"usage: --client {clean(args.client)}: serve:API with API one of "
                    f"{', '.join(APIS)}",
                    markup=False,
                )
                return EXIT_USAGE
            client_name = "reference"
        for what, value, given in (
            ("engine", name, args.engine),
            ("client", client_name, args.client),
        ):
            if not isinstance(value, str) or (
                ":" in value and given is None and value.partition(":")[0] not in KIND_WORDS
            ):
                # A trace is a bug report from anywhere: never import code it names.
                console.print(
                    f"ERROR the trace names {what} {value!r}; replay only runs registry "
                    f"names from a trace. Pass --{what} explicitly to run it.",
                    markup=False,
                )
                return EXIT_ERROR
        try:
            options = registry.system_options(recorded) if args.engine is None else {}
            options.update(registry.engine_options(args))
            options.pop("log_dir", None)
            version = recorded.get("sglang_version")
            if name == "sglang" and isinstance(version, str) and args.engine is None:
                name = f"sglang@{version}"  # the release the trace was recorded on
        except ValueError as e:
            console.print(f"ERROR {clean(e)}", markup=False)
            return EXIT_ERROR
        try:
            engine = registry.engine(name, **options)
        except ValueError as e:
            return _unknown_name(e, args.engine is not None, console)
        try:
            client = registry.client(client_name)
        except ValueError as e:
            engine.close()
            return _unknown_name(e, args.client is not None, console)
        where = f" at {options['url']}" if options.get("url") else ""
        against = f"engine {name}{where}, client {client_name}"
    try:
        replayed = replay_trace(trace, engine, client, timeout=args.timeout)
    finally:
        if engine is not None:
            engine.close()
    word, code = REPLAY_WORDS[replayed.kind], EXIT_ERROR
    if replayed.kind is ReplayKind.FAIL:
        # As `check` judges: a SHOULD rule broken is WARN (exit 0) unless --strict.
        musts = [v for v in replayed.violations if BY_ID[v.rule].level == "MUST"]
        warn_only = not musts and not args.strict
        word = Verdict.WARN.value if warn_only else word
        code = EXIT_PASS if warn_only else EXIT_FAIL
    elif replayed.kind is ReplayKind.PASS:
        code = EXIT_PASS
    console.print(
        f"{word} {clean(args.trace)} against {clean(against)}", markup=False, soft_wrap=True
    )
    for v in replayed.violations:
        print_steps([f"  violated {clean(v)}"], console)
    if replayed.kind is ReplayKind.FAIL and replayed.run.steps:
        # The steps as this replay saw them, not as the trace recorded them.
        lines = step_lines(replayed.run.steps)
        top = sum(s.within is None for s in replayed.run.steps)
        violations = [violation_json(v) for v in replayed.violations]
        console.print(f"counterexample ({plural(top, 'step')} replayed):", markup=False)
        print_steps(counterexample_lines(lines, violations), console)
    if replayed.message:
        console.print(f"  {clean(replayed.message)}", markup=False)
    return code


def _unknown_name(e: ValueError, given: bool, console: Console) -> int:
    """An engine or client name replay cannot run. Given on the command line it is a usage
    error (exit 3, as for ``check``); read from the trace's header, the trace cannot be
    followed here (exit 2, as for any trace that cannot be replayed)."""
    if given:
        console.print(f"usage: {clean(e)}", markup=False, soft_wrap=True)
        return EXIT_USAGE
    console.print(
        f"ERROR the trace's header: {clean(e)}; pass --engine/--client",
        markup=False,
        soft_wrap=True,
    )
    return EXIT_ERROR


# ----- explore, rules, diagram ---------------------------------------------------------


def default_focus(engine_name: str, client_name: str) -> str | None:
    """The declared rule of the catalogued mutant among the two names, if any."""
    for name in (engine_name, client_name):
        if name in MUTANTS_BY_NAME and name != "reference":
            return MUTANTS_BY_NAME[name].rule
    return None


# ----- explore: its text --------------------------------------------------------------


def cli_bounds(prefixes: int, versions: int, inflight: int) -> Bounds:
    """``--prefixes K`` names K prefixes P, Q, R, ...; ``--inflight R`` names R request IDs
    r1..rR; ``--versions V`` is the newest weight version. LoRA revisions stay at 2."""
    names = tuple(chr(ord("P") + i) if i < 11 else f"P{i}" for i in range(prefixes))
    rids = tuple(f"r{i + 1}" for i in range(inflight))
    return Bounds(prefixes=names, rids=rids, versions=versions)


def _action_text(action: Action) -> str:
    fields = action.to_json()
    name = fields.pop("action")
    return f"{name}(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"


def _trace_text(trace: Sequence[Action], violations: Sequence[Violation]) -> list[str]:
    out = [f"  {i}. {_action_text(a)}" for i, a in enumerate(trace, start=1)]
    out += [f"  violated: {v}" for v in violations]
    return out


def _config_text(c: Config) -> str:
    words = [c.lane.value, "radix on" if c.radix else "radix off"]
    words += [f for f in ("draft", "encoder", "fp8_kv", "lora", "derived") if getattr(c, f)]
    if c.tiers != frozenset({Tier.DEVICE}):
        words.append("tiers " + "+".join(sorted(t.value for t in c.tiers)))
    if c.ranks > 1:
        words.append(f"{c.ranks} ranks")
    if c.store:
        words.append(f"shared store, lineage {c.lineage}, {c.kv_format} KV")
    if c.role is not None:
        words.append(f"{c.role.value} engine of a P/D deployment")
    if c.router:
        words.append("worker behind a router")
    return "(" + ", ".join(words) + ")"


def _policy_text(p: Policy) -> str:
    flush = "" if p.flush_cache is None else f", flush_cache={p.flush_cache}"
    return f"mode {p.mode.value}{flush}, pause {p.pause_mode.value}"


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f}" if seconds > 0 else "-"


def main_explore(
    endpoints: int = 2,
    prefixes: int = 1,
    versions: int = 2,
    inflight: int = 1,
    depth: int = 6,
    engine: str | None = None,
    client: str | None = None,
    symmetry: bool = True,
    out_dir: Path = Path("kvfence-results"),
    workers: int = 1,
    max_states: int | None = None,
    max_seconds: float | None = None,
    progress: bool = False,
    deployment_name: str | None = None,
) -> tuple[int, str]:
    """``kvfence explore``: the model alone, or model x an in-process SUT when ``engine``
    or ``client`` is named (the other side is the reference). ``deployment_name``: start
    from that deployment's setup (``explore.DEPLOYMENTS``), for the model alone and for
    model x SUT alike, instead of ``endpoints``. Returns the exit code (0 no
    violation, 1 a violation, 2 incomplete or error) and the text to print; ``ValueError``
    for a usage error (bounds out of range, an engine that cannot be explored).

    The model alone starts from ``model.explore.initial_states(endpoints)``. Model x SUT
    starts from the ``SETUPS`` that reach a catalogued mutant's rule (``--endpoints`` does
    not apply to them), else from the same endpoints as the model alone. ``symmetry``
    (the model alone): count states up to renaming (``model.symmetry``); a counterexample
    is still a concrete path. ``workers`` (the model alone): processes expanding each
    large level (``conformance.search.explore``'s ``workers``); the counts and any
    counterexample do not depend on it. ``max_states``/``max_seconds`` (the model alone;
    None: no cap): a search a cap stops is UNKNOWN beyond it (exit 2), naming the cap, the
    depth it reached and the states it saw; never PASS. The witnesses of the model's
    sometimes-properties (the REACH rules) are listed, with those not reached.
    ``progress`` (the model alone): a bar of levels on a terminal, else a line on stderr
    every few seconds (``conformance.progress``).
    """
    if workers < 1:
        raise ValueError(f"need --workers >= 1, got {workers}")
    if max_states is not None and max_states < 1:
        raise ValueError(f"need --max-states >= 1, got {max_states}")
    if max_seconds is not None and not (math.isfinite(max_seconds) and max_seconds > 0):
        raise ValueError(f"need --max-seconds > 0, got {max_seconds}")
    if endpoints < 1 or prefixes < 1 or versions < 0 or inflight < 0 or depth < 0:
        raise ValueError(
            "need --endpoints >= 1, --prefixes >= 1, --versions >= 0, --inflight >= 0, --depth >= 0"
        )
    bounds = cli_bounds(prefixes, versions, inflight)
    limits = (
        f"bounds: prefixes {' '.join(bounds.prefixes)}; versions <= {bounds.versions}; "
        f"request IDs {' '.join(bounds.rids) or '(none)'}; LoRA revisions <= "
        f"{bounds.lora_revisions}; faults on; depth {depth}"
    )
    setups = None if deployment_name is None else deployment(deployment_name)
    if engine is None and client is None:
        caps = (max_states, max_seconds)
        return _main_model(
            endpoints, bounds, depth, limits, symmetry, workers, caps, progress, setups
        )
    return _main_product(endpoints, bounds, depth, limits, engine, client, out_dir, setups)


def _main_model(
    endpoints: int,
    bounds: Bounds,
    depth: int,
    limits: str,
    symmetry: bool = True,
    workers: int = 1,
    caps: tuple[int | None, float | None] = (None, None),
    show_progress: bool = False,
    setups: tuple | None = None,
) -> tuple[int, str]:
    from .progress import Progress

    if setups is None:
        (initial,) = initial_states(endpoints)
    else:
        (setup,) = setups
        endpoints = len(setup.configs)
        (initial,) = initial_states(endpoints, (setup.policy,), setup.configs)
    max_states, max_seconds = caps
    started = time.perf_counter()
    with Progress("kvfence explore", depth, "levels", enabled=show_progress) as progress:
        done = [0]

        def level_done(level: int) -> bool:
            while done[0] < level:  # ``level`` levels are complete
                done[0] += 1
                progress.advance(f"depth {done[0]}")
            return False  # never stops the search: the caps do

        x = explore(
            initial,
            bounds,
            depth,
            max_states=max_states,
            symmetry=symmetry,
            stop=level_done,
            workers=workers,
            max_seconds=max_seconds,
        )
        level_done(x.depth_reached)
    seconds = time.perf_counter() - started
    configs = ", ".join(_config_text(ep.config) for ep in initial.endpoints)
    lines = [
        f"kvfence explore: the model, {endpoints} endpoint(s) {configs}; "
        f"client {_policy_text(initial.policy)}",
        limits,
        f"distinct states: {x.states:,}{' up to symmetry' if symmetry else ''}   "
        f"transitions: {x.transitions:,}   "
        f"depth reached: {x.depth_reached}   complete: {'yes' if x.complete else 'no'}",
        f"time: {seconds:.1f} s ({_rate(x.states, seconds)} states/s; "
        f"{workers} worker{'s' if workers != 1 else ''})",
    ]
    for w in x.witnesses:
        lines.append(f"reached {w.rule} ({BY_ID[w.rule].name}) in {len(w.trace)} step(s):")
        lines += _trace_text(w.trace, ())
    if x.unwitnessed:
        lines.append(f"not reached within depth {depth}: {', '.join(x.unwitnessed)}")
    if x.violation:
        lines.append(f"FAIL: the spec breaks its own invariants in {len(x.trace)} step(s):")
        lines += _trace_text(x.trace, x.violation)
        return 1, "\n".join(lines)
    if not x.complete:
        if x.cut == "max-states":
            cap = f"--max-states {max_states:,}"
        elif x.cut == MAX_SECONDS:
            cap = f"--max-seconds {max_seconds:g}"
        else:
            cap = x.cut or "a stop"
        lines.append(
            f"UNKNOWN: stopped by {cap} at depth {x.depth_reached} of {depth} "
            f"with {x.states:,} states; nothing beyond was checked"
        )
        return 2, "\n".join(lines)
    lines.append("PASS: no violation within bounds")
    return 0, "\n".join(lines)


def _main_product(
    endpoints: int,
    bounds: Bounds,
    depth: int,
    limits: str,
    engine: str | None,
    client: str | None,
    out_dir: Path = Path("kvfence-results"),
    setups: tuple | None = None,
) -> tuple[int, str]:
    e, c = engine or "reference", client or "reference"
    focus = default_focus(e, c)
    # Every setup (tiers, draft, encoder, FP8, LoRA, exact lane, opt-out, unreported) for a
    # system we know nothing about; a catalogued mutant gets the setups its rule needs.
    started = time.perf_counter()
    adapter = registry.engine(e)
    if not (hasattr(adapter, "snapshot") and hasattr(adapter, "restore")):
        adapter.close()
        raise ValueError(f"engine {e!r} cannot be explored: not in-process")
    x = explore_adapter(
        adapter,
        registry.client(c),
        None,
        None,
        bounds,
        depth,
        focus=focus,
        out_dir=out_dir,
        setups=setups,
    )
    seconds = time.perf_counter() - started
    chosen = f"chosen for {focus}" if focus else "all setups: an unknown system"
    chosen = "the deployment's" if setups is not None else chosen
    where = f"setups {', '.join(x.setups)} ({chosen})"
    lines = [
        f"kvfence explore: the model x engine {e} x client {c}; {where}",
        limits,
        f"distinct states: {x.states:,}   transitions: {x.transitions:,}   "
        f"depth reached: {x.depth_reached}   complete: {'yes' if x.complete else 'no'}",
        f"time: {seconds:.1f} s ({_rate(x.states, seconds)} states/s, "
        f"{_rate(x.transitions, seconds)} transitions/s)",
    ]
    if x.other:
        lines.append(f"first broke other rules in {len(x.other_trace)} step(s):")
        lines += _trace_text(x.other_trace, x.other)
    if x.error:
        lines.append(f"ERROR after {len(x.trace)} step(s): {x.error}")
        lines += _trace_text(x.trace, ())
        return 2, "\n".join(lines)
    if x.violation:
        setup = f"setup {x.setup}: " + ", ".join(_config_text(k) for k in x.configs)
        assert x.policy is not None
        lines.append(
            f"FAIL: shortest counterexample, {x.steps} step(s), from {setup}; "
            f"client {_policy_text(x.policy)}"
        )
        lines += _trace_text(x.trace, x.violation)
        if x.counterexample is not None:
            lines.append(f"trace: {x.counterexample}")
        return 1, "\n".join(lines)
    if x.other:
        lines.append(f"FAIL: {focus} was not shown broken within depth {depth}")
        return 1, "\n".join(lines)
    if not x.complete:
        lines.append("INCOMPLETE: the search was cut short")
        return 2, "\n".join(lines)
    lines.append("PASS: no violation within bounds")
    return 0, "\n".join(lines)


def cmd_explore(args: argparse.Namespace, console: Console) -> int:
    for what, name, known in (
        ("engine", args.engine, registry.ENGINES),
        ("client", args.client, registry.CLIENTS),
    ):
        if name is not None and ":" not in name and name not in known:
            console.print(f"[bold red]usage:[/] unknown {what} {name!r}; known: {', '.join(known)}")
            return EXIT_USAGE
    try:
        code, text = main_explore(
            args.endpoints,
            args.prefixes,
            args.versions,
            args.inflight,
            args.depth,
            args.engine,
            args.client,
            args.symmetry,
            args.out,
            args.workers,
            args.max_states,
            args.max_seconds,
            progress=True,
            deployment_name=args.deployment,
        )
    except ValueError as e:
        console.print(f"usage: kvfence explore: {clean(e)}", highlight=False, markup=False)
        return EXIT_USAGE
    console.print(text, highlight=False, markup=False)
    return code


def version_text() -> str:
    """``kvfence X.Y.Z (spec N.M)``: the installed package's version and the spec's."""
    from importlib.metadata import PackageNotFoundError, version

    from ..model import SPEC_VERSION

    try:
        mine = version("kvfence")
    except PackageNotFoundError:
        mine = "(not installed)"
    return f"kvfence {mine} (spec {SPEC_VERSION})"


def rule_text(rule_id_: str) -> str:
    """One rule in full: ID, name, level, class; its requirement, rationale and source;
    the catalog's mutants that must be killed by it and the correct designs that keep it."""
    from ..adapters.designs import DESIGNS
    from ..adapters.mutants import MUTANTS

    r = BY_ID[rule_id_]
    mutants = [f"mutant:{m.name}" for m in MUTANTS if m.rule == r.id]
    designs = [f"design:{d.name}" for d in DESIGNS if r.id in d.keeps]
    return "\n".join(
        [
            f"{r.id} {r.name} ({r.level}, {r.klass})",
            f"requirement: {r.text}",
            f"rationale: {r.rationale}",
            f"source: {r.source}",
            f"mutants that break it: {', '.join(mutants) or 'none'}",
            f"correct designs that keep it: {', '.join(designs) or 'none'}",
        ]
    )


def cmd_rules(args: argparse.Namespace, console: Console) -> int:
    if args.rule is not None:
        wanted = args.rule.upper()
        if wanted not in BY_ID:
            hint = registry.did_you_mean(wanted, [r.id for r in RULES])
            console.print(
                f"usage: {args.rule!r} is not a rule ID{hint} (`kvfence rules` lists them)",
                markup=False,
                highlight=False,
            )
            return EXIT_USAGE
        for line in rule_text(wanted).splitlines():
            first, *more = wrapped(line, console.width, indent=2)
            console.print(first, markup=False, highlight=False, soft_wrap=True)
            for part in more:
                console.print(part, markup=False, highlight=False, soft_wrap=True)
        return EXIT_PASS
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


def cmd_engines(args: argparse.Namespace, console: Console) -> int:
    """``kvfence engines``: one line per name, ``ADDRESS  KIND  summary``."""
    rows = [r for r in registry.catalog(args.side) if args.kind in (None, r[1])]
    wide = max((len(r[0]) for r in rows), default=0)
    for address, kind, summary in rows:
        line = f"{address:<{wide}}  {kind:<9}  {summary}"
        console.print(line, markup=False, highlight=False, overflow="ellipsis", no_wrap=True)
    return EXIT_PASS


def cmd_tiny_model(args: argparse.Namespace, console: Console) -> int:
    """``kvfence tiny-model --out DIR``: ``adapters.tiny_model.build_tiny_model`` for each
    version; exit 2 with the install hint when torch or transformers is missing."""
    from importlib.util import find_spec

    missing = [m for m in ("torch", "transformers", "tokenizers") if find_spec(m) is None]
    if missing:
        console.print(
            f"ERROR kvfence tiny-model needs {', '.join(missing)}, not installed in this "
            "environment (bash scripts/setup.sh installs them with vLLM)",
            markup=False,
            highlight=False,
        )
        return EXIT_ERROR
    from ..adapters.tiny_model import build_tiny_model

    paths = [build_tiny_model(args.out, v) for v in range(args.versions)]
    for v, path in enumerate(paths):
        console.print(f"v{v}={path}", markup=False, highlight=False, soft_wrap=True)
    flags = " ".join(f"--checkpoint v{v}={p}" for v, p in enumerate(paths))
    console.print(
        f"check a server started on {paths[0]}: kvfence check --engine vllm-http --url URL {flags}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return EXIT_PASS


def cmd_diagram(args: argparse.Namespace, console: Console) -> int:
    if args.deployment is not None:
        from .explore import deployment_diagram

        print(deployment_diagram(args.deployment))
        return EXIT_PASS
    print(lifecycle.diagram())
    return EXIT_PASS


# ----- serve ---------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace, console: Console) -> int:
    import ipaddress

    from ..model.vocabulary import CacheMode
    from .serve import Session, default_engine, run_server

    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback and not args.allow_remote:
        console.print(
            f"[bold red]usage:[/] --host {args.host!r} is not loopback; kvfence serve accepts "
            "weight updates from anyone who can reach it, so another address needs --allow-remote"
        )
        return EXIT_USAGE
    if args.port is None:
        args.port = 30000 if args.api == "sglang" else 8000
    more: dict[int, int] = {}
    if args.decode_port is not None and not args.pd:
        console.print("[bold red]usage:[/] --decode-port: only with --pd")
        return EXIT_USAGE
    if args.pd:
        default = args.port + 1 if args.port else 0  # beside the prefill server's
        more[1] = args.decode_port if args.decode_port is not None else default
    for flag, port in (("--port", args.port), ("--decode-port", more.get(1, 0))):
        if not 0 <= port < 65536:
            console.print(f"[bold red]usage:[/] {flag} {port} is not a port number")
            return EXIT_USAGE
    try:
        session = Session(
            args.api,
            args.engine or default_engine(args.ranks, args.pd),
            CacheMode(args.mode),
            args.out,
            args.timeout,
            args.strict,
            probe=args.probe,
            refuse_resets=args.refuse_resets,
            prefix_cache=not args.no_prefix_cache,
            stream_hold=args.stream_hold,
            ranks=args.ranks,
            pd=args.pd,
            fail_rank_updates=args.fail_rank_updates,
        )
    except ValueError as e:
        console.print(f"[bold red]usage:[/] {e}")
        return EXIT_USAGE
    try:
        announce = lambda line: print(line, flush=True)  # noqa: E731
        result = run_server(
            session, args.host, args.port, announce, hold_signals=True, more=more or None
        )
    except OSError as e:
        console.print(f"[bold red]error[/] cannot serve on {args.host}:{args.port}: {e}")
        return EXIT_ERROR
    print_result(result, console)
    if session.trace_path is not None:
        console.print(f"session trace: {clean(session.trace_path)}", soft_wrap=True)
    if not _write_reports([result], args, console):
        return EXIT_ERROR
    return result.exit_code


COMMANDS = {
    "serve": cmd_serve,
    "check": cmd_check,
    "mutants": cmd_mutants,
    "replay": cmd_replay,
    "explore": cmd_explore,
    "rules": cmd_rules,
    "engines": cmd_engines,
    "tiny-model": cmd_tiny_model,
    "diagram": cmd_diagram,
}


EXIT_INTERRUPTED = 130
"""Ctrl-C: the shell's code for SIGINT, after a one-line message (no traceback)."""

PRINT_ONLY = ("rules", "engines", "diagram")
"""Commands that only print: a closed pipe after them is no failure."""

EXIT_BROKEN_PIPE = 141
"""The reader of stdout went away before a verdict was printed: the shell's code for
SIGPIPE (``rules`` and ``diagram``, which only print, exit 0)."""


def _interrupt(signum: int, frame: object) -> None:
    SIGNALLED.set()  # honoured at the next step even if this KeyboardInterrupt is caught
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The width is the terminal's, or COLUMNS when set (rich reads it), else 80 when piped.
    console = Console()
    if args.command in ("check", "mutants"):
        # SIGTERM stops a check as Ctrl-C does: the search ends, what it recorded is
        # written, and the run is ERROR (exit 2).
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return COMMANDS[args.command](args, console)
    except KeyboardInterrupt:
        console.print("[bold magenta]interrupted[/]: no verdict (reports already written stay)")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`kvfence diagram | head -1`): exit quietly. Point stdout at
        # /dev/null so that the interpreter's last flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PASS if args.command in PRINT_ONLY else EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
