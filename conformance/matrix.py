"""The pass matrix and the kill matrix: every correct design PASSES, every mutant is killed.

A conformance suite is worth what these two tables show together. The **pass matrix** runs
every correct design of ``adapters/designs.py`` (the two reference systems and CD-01..CD-09)
through a plain ``kvfence check``: each must come out PASS, or WARN when the only findings
are SHOULD-level notes (a design that stops on a refused flush pays in availability). The
**kill matrix** runs every mutant of ``adapters/mutants.py`` focused on the rule its
docstring names (``Violates: RULE``): the run searches until that rule is shown broken,
stops at the first kill, and the mutant counts as killed only when the counterexample
breaks exactly that rule. An in-process mutant is first searched breadth-first by the
product explorer (``first_kill``: the shortest counterexample, replayed from a fresh start,
in well under a second each); only when that cannot say does the stateful search run
(``kvfence mutants --stateful``: the stateful search alone, as ``kvfence check --focus``).

Runs are independent processes (``jobs``, default: every core), so the matrices take the
wall time of the slowest few runs. ``kvfence mutants`` prints both tables and writes the
same JUnit XML and JSON as ``kvfence check``, one entry per run.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import attrs
from attrs import frozen
from rich.console import Console
from rich.table import Table

from kvfence.adapters import registry
from kvfence.adapters.designs import DESIGNS, Design
from kvfence.adapters.mutants import MUTANTS, Mutant
from kvfence.adapters.protocol import EngineAdapter
from kvfence.model.rules import BY_ID as RULES_BY_ID

from .explore import AdapterExploration, explore_adapter, setups_for
from .lockstep import Recorder, check_capabilities
from .runner import Result, _rule_verdicts, run_check
from .verdict import Verdict


@frozen
class Job:
    """One run of a matrix: an engine and a client by registry name, the row's ``label``,
        the ``rule`` a focused run is after (None: a plain check), and the run's budget.
        ``strict``: SHOULD rules fail too (the kill matrix; a pass-matrix run is not strict,
        so that a SHOULD note shows as WARN). ``explore``: a focused run on an in-process engine
    first tries the product explorer (``first_kill``)."""

    engine: str
    client: str
    label: str
    rule: str | None
    profile: str
    out: Path
    timeout: float
    max_examples: int | None
    strict: bool = True
    explore: bool = True


KILL_DEPTH = 5
"""Depth of the breadth-first kill: every catalogued mutant's shortest counterexample is
at most 5 steps (``tests/test_explore.py``'s ``SHORTEST``), except those below."""

BEYOND_FIRST_KILL: dict[str, str] = {}
"""Mutants the breadth-first kill cannot reach at its setups, each with the reason; the
kill matrix falls back to the stateful search for them. Empty since the ``mixed-info``
setup (endpoints reporting different server info) reaches ``endpoint0-info-only``."""

BEYOND_STATEFUL_BUDGET: dict[str, str] = {}
"""Mutants the stateful search alone misses at the focused ci budget, each with the reason;
each must be killed by the breadth-first kill (``first_kill``), the kill matrix's default;
``kvfence mutants --stateful`` reports them unkilled, which is the truth of that search.
Empty since the machine steers its draw to an endpoint holding lower-tier KV
(``machine.tier_steered``): ``kv-resumed-stale-after-weights-only-update`` (serve, evict to
host, release the KV, flush) is now reached at the ci budget."""

KILL_STATES = 20000
"""Nodes the breadth-first kill may visit in one setup before it gives up for the stateful
search."""

KILL_SHALLOW = 2
"""Depth of the breadth-first kill's first search, over every setup at once."""

KILL_ROUNDS = (1000, 5000, KILL_STATES)
"""The state budget of each later round of the breadth-first kill, per setup
(``first_kill``)."""


def first_kill(job: Job) -> Result | None:
    """The kill by exhaustive search (issue 12: stop each mutant at its first kill): for an
    in-process engine (``snapshot``/``restore``), the product explorer focused on
    ``job.rule`` finds a shortest path that breaks it, replays it from a fresh start and
    writes its trace. ``None`` when it cannot say (not in-process, an adapter error, the
    rule not shown within ``KILL_DEPTH``): the caller runs the stateful search, so a
    search that found nothing never counts as a verdict (fail-closed). The rules other
    than the focus are judged on no evidence (UNKNOWN, never PASS).

    First every setup that makes the rule reachable (``setups_for``) is searched at once
    to ``KILL_SHALLOW`` steps: most kills are that short, and this finds the shortest of
    all. Past that, the setups are searched one at a time, those with fewer endpoints
    first, in rounds of growing state budgets (``KILL_ROUNDS``); a setup explored
    completely without the kill is not searched again. One search over every setup to the
    full depth paid for the two-endpoint setups' wide levels before reaching a deeper kill
    in a one-endpoint one: the tier mutant (four steps on ``tiers``) took 71 s that way,
    behind ``plain``'s third level. A deeper counterexample is a shortest one within its
    setup."""
    engine = registry.engine(job.engine)
    try:
        if job.rule is None or not (hasattr(engine, "snapshot") and hasattr(engine, "restore")):
            return None
        return _first_kill(job, engine)
    finally:
        engine.close()


def _first_kill(job: Job, engine: EngineAdapter) -> Result | None:
    started = time.monotonic()
    setups = sorted(setups_for(job.rule), key=lambda s: len(s.configs))
    names = [s.name for s in setups]
    left = list(names)
    x = _kill_search(job, KILL_SHALLOW, {}, KILL_STATES)
    if x.error:
        return None
    if job.rule in x.caught() and x.counterexample is not None:
        return _killed(job, engine, x, started)
    for budget in KILL_ROUNDS:
        for name in list(left):
            x = _kill_search(job, KILL_DEPTH, {n: 0 for n in names if n != name}, budget)
            if x.error:
                return None
            if job.rule in x.caught() and x.counterexample is not None:
                return _killed(job, engine, x, started)
            if x.complete:
                left.remove(name)
    return None


def _kill_search(job: Job, depth: int, depths: dict[str, int], budget: int) -> AdapterExploration:
    """The product explorer on a fresh ``job.engine``, focused on ``job.rule``, over the
    rule's setups to ``depth`` steps (``depths``: others; 0 leaves a setup out)."""
    return explore_adapter(
        registry.engine(job.engine),
        registry.client(job.client),
        focus=job.rule,
        depth=depth,
        depths=depths,
        max_states=budget,
        out_dir=job.out,
        timeout=job.timeout,
    )


def _killed(job: Job, engine: EngineAdapter, x: AdapterExploration, started: float) -> Result:
    """The kill matrix's result for ``x``, a breadth-first search that broke ``job.rule``."""
    violations = list(x.violation)
    caps = check_capabilities(engine)
    rules = tuple(
        rv
        if rv.verdict is not Verdict.PASS
        else attrs.evolve(rv, verdict=Verdict.UNKNOWN, reason="not judged: a breadth-first kill")
        for rv in _rule_verdicts(Recorder(), violations, None, caps, job.strict, job.rule)
    )
    return Result(
        engine=job.engine,
        client=job.client,
        profile=job.profile,
        seed=None,
        verdict=Verdict.FAIL,
        rules=rules,
        violations=tuple(violations),
        error="",
        counterexample=x.counterexample,
        steps=x.steps,
        examples=0,
        seconds=time.monotonic() - started,
        warnings=(
            f"killed by breadth-first search (setup {x.setup}): a shortest counterexample there",
        ),
    )


def run_job(job: Job) -> Result:
    """Run one job in this process (a worker of the pool calls it): a focused job first
    by breadth-first search (``first_kill``) when ``job.explore``, else (or when that
    cannot say) the stateful search."""
    if job.explore and job.rule is not None:
        found = first_kill(job)
        if found is not None:
            return found
    return run_check(
        registry.engine(job.engine),
        registry.client(job.client),
        profile=job.profile,
        out_dir=job.out,
        strict=job.strict,
        timeout=job.timeout,
        max_examples=job.max_examples,
        focus=job.rule,
    )


FOCUSED_EXAMPLES = {"ci": 3000, "dev": 6000, "fuzz": 20000}
"""A focused run stops at the first example that breaks its rule, so its cap costs nothing
for a mutant that dies early and keeps a rare one (a guard missing on one funnel of seven)
from surviving by chance."""


def _systems(side: str, name: str) -> tuple[str, str]:
    """(engine, client) registry names: the other side is the reference."""
    return (name, "reference") if side == "engine" else ("reference", name)


def mutant_job(
    m: Mutant, profile: str, out: Path, timeout: float, n: int | None, explore: bool = True
) -> Job:
    """The kill-matrix run of ``m``: focused on its rule, strict; ``explore``: by
    breadth-first search first (``first_kill``)."""
    engine, client = _systems(m.side, m.name)
    if m.side == "client" and m.engine is not None:
        engine = m.engine  # a program checked on the engine profile it needs
    budget = n or FOCUSED_EXAMPLES[profile]
    return Job(engine, client, m.name, m.rule, profile, out, timeout, budget, explore=explore)


def design_job(d: Design, profile: str, out: Path, timeout: float, n: int | None) -> Job:
    """The pass-matrix run of ``d``: a plain check, as a user would run it."""
    engine, client = _systems(d.side, d.name)
    return Job(engine, client, d.name, None, profile, out, timeout, n, strict=False)


def killed(m: Mutant, result: Result) -> bool:
    """Shown killed: the run FAILed and its counterexample breaks the mutant's rule."""
    return result.verdict is Verdict.FAIL and m.rule in result.caught()


def passed(result: Result) -> bool:
    """Shown correct: PASS, or WARN whose every finding is a SHOULD-level note."""
    if result.verdict is Verdict.PASS:
        return True
    return result.verdict is Verdict.WARN and all(
        level(v.rule) == "SHOULD" for v in result.violations
    )


def level(rule_id: str) -> str:
    """A rule's level (MUST or SHOULD); unknown IDs count as MUST."""
    rule = RULES_BY_ID.get(rule_id)
    return rule.level if rule is not None else "MUST"


@frozen
class Matrices:
    """What ``run_matrices`` saw: each design and mutant with its result, and wall time."""

    designs: tuple[tuple[Design, Result], ...]
    mutants: tuple[tuple[Mutant, Result], ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(passed(r) for _, r in self.designs) and all(
            killed(m, r) for m, r in self.mutants
        )

    @property
    def exit_code(self) -> int:
        """0 when every design passes and every mutant is killed by its rule; 1 when a
        design FAILs or a mutant survives (its run PASSed, or FAILed by another rule); else
        2: what stands in the way is UNKNOWN or ERROR, not shown either way."""
        if self.ok:
            return 0
        failed = any(
            not passed(r) and r.verdict in (Verdict.FAIL, Verdict.WARN) for _, r in self.designs
        )
        survived = any(
            not killed(m, r) and r.verdict in (Verdict.FAIL, Verdict.WARN, Verdict.PASS)
            for m, r in self.mutants
        )
        return 1 if failed or survived else 2

    def unsettled(self) -> list[str]:
        """Why each design or mutant that is neither shown correct nor shown killed ended
        UNKNOWN or ERROR, one line each (its unexercised rules with their reasons, or the
        error)."""
        lines = []
        rows = [(d.name, r) for d, r in self.designs if not passed(r)]
        rows += [(m.name, r) for m, r in self.mutants if not killed(m, r)]
        for name, r in rows:
            if r.verdict not in (Verdict.UNKNOWN, Verdict.ERROR):
                continue
            why = r.error or "; ".join(
                f"{v.rule.id} {v.verdict}: {v.reason}"
                for v in r.rules
                if v.verdict in (Verdict.UNKNOWN, Verdict.ERROR)
            )
            lines.append(f"{r.verdict} {name}: {why or 'no rule was exercised'}")
        return lines

    @property
    def results(self) -> list[Result]:
        return [r for _, r in self.designs] + [r for _, r in self.mutants]


def run_matrices(
    designs: Sequence[Design] = DESIGNS,
    mutants: Sequence[Mutant] = MUTANTS,
    profile: str = "ci",
    out: Path = Path("kvfence-results"),
    timeout: float = 120.0,
    max_examples: int | None = None,
    jobs: int = os.cpu_count() or 1,
    explore: bool = True,
) -> Matrices:
    """Run the pass matrix over ``designs`` and the kill matrix over ``mutants``, ``jobs``
    runs at a time in separate processes. ``max_examples`` overrides every run's budget.
    ``explore``: kill in-process mutants by breadth-first search first (``first_kill``);
    False: by the stateful search only, as ``kvfence check --focus`` would."""
    todo = [design_job(d, profile, out, timeout, max_examples) for d in designs]
    todo += [mutant_job(m, profile, out, timeout, max_examples, explore) for m in mutants]
    started = time.monotonic()
    if jobs > 1 and len(todo) > 1:
        # spawn, not fork: a forked child would inherit the parent's adapter-call worker
        # thread pool without its thread, and its first call would time out.
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
            results = list(pool.map(run_job, todo))
    else:
        results = [run_job(j) for j in todo]
    n = len(designs)
    return Matrices(
        tuple(zip(designs, results[:n], strict=True)),
        tuple(zip(mutants, results[n:], strict=True)),
        time.monotonic() - started,
    )


# ----- tables ---------------------------------------------------------------------------


def _notes(result: Result) -> str:
    """What a passing run still reported: its SHOULD-level findings, and the notes the spec
    attached to the branches the system took (availability, off-policy reuse)."""
    found = [f"{r} ({level(r)})" for r in result.caught()]
    where: dict[str, list[str]] = {}
    for w in result.warnings:  # one line per note, its endpoints gathered
        m = re.fullmatch(r"(.*) \(endpoint (\d+)\)", w)
        text, endpoint = (m.group(1), m.group(2)) if m else (w, "")
        where.setdefault(text, []).append(endpoint)
    for text, endpoints in where.items():
        eps = ", ".join(e for e in endpoints if e)
        found.append(f"{text} (endpoint{'s' if len(endpoints) > 1 else ''} {eps})" if eps else text)
    return "; ".join(found)


def pass_table(rows: Sequence[tuple[Design, Result]], profile: str) -> Table:
    table = Table(title=f"kvfence pass matrix (profile {profile})", title_justify="left")
    for col in ("design", "case", "keeps", "verdict", "notes", "examples", "seconds"):
        table.add_column(col)
    for d, result in rows:
        good = passed(result)
        verdict = f"[{'green' if good else 'bold red'}]{result.verdict}[/]"
        if not good:
            verdict += f" {', '.join(result.caught()) or result.error[:60]}"
        table.add_row(
            d.name,
            d.case or "reference",
            ", ".join(d.keeps),
            verdict,
            _notes(result) if good else "",
            str(result.examples),
            f"{result.seconds:.1f}",
        )
    return table


def kill_table(rows: Sequence[tuple[Mutant, Result]], profile: str) -> Table:
    table = Table(title=f"kvfence kill matrix (profile {profile})", title_justify="left")
    for col in ("mutant", "side", "expected", "verdict", "caught", "steps", "seconds", "cases"):
        table.add_column(col)
    for m, result in rows:
        status = (
            "[green]killed[/]" if killed(m, result) else f"[bold red]{result.verdict} (survived)[/]"
        )
        table.add_row(
            m.name,
            m.side,
            m.rule,
            status,
            ", ".join(result.caught()),
            str(result.steps),
            f"{result.seconds:.1f}",
            ", ".join(m.cases),
        )
    return table


def print_matrices(x: Matrices, profile: str, console: Console) -> None:
    """Both tables and one summary line."""
    if x.designs:
        console.print(pass_table(x.designs, profile))
    if x.mutants:
        console.print(kill_table(x.mutants, profile))
    good_d = sum(passed(r) for _, r in x.designs)
    good_m = sum(killed(m, r) for m, r in x.mutants)
    word = "[green]OK[/]" if x.ok else "[bold red]NOT OK[/]"
    console.print(
        f"{word}: {good_d}/{len(x.designs)} correct designs pass, "
        f"{good_m}/{len(x.mutants)} mutants killed by their rule ({x.seconds:.1f} s wall)"
    )


def select(only: Sequence[str] | None) -> tuple[list[Design], list[Mutant], list[str]]:
    """The designs and mutants named in ``only`` (all when None), and the unknown names."""
    if not only:
        return list(DESIGNS), list(MUTANTS), []
    names = set(only)
    designs = [d for d in DESIGNS if d.name in names or d.case in names]
    mutants = [m for m in MUTANTS if m.name in names]
    known = {d.name for d in designs} | {d.case for d in designs} | {m.name for m in mutants}
    return designs, mutants, sorted(names - known)


__all__ = [
    "FOCUSED_EXAMPLES",
    "KILL_DEPTH",
    "Job",
    "Matrices",
    "design_job",
    "first_kill",
    "kill_table",
    "killed",
    "mutant_job",
    "pass_table",
    "passed",
    "print_matrices",
    "run_job",
    "run_matrices",
    "select",
]
