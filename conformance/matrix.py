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

The pass matrix may also run **at N times the budget** (``kvfence mutants --designs-times
10``: every design's plain check at ten times the profile's examples), so that a design the
spec wrongly rejects only on a rare path, which 600 examples happen to miss, still fails it.

Runs are independent processes (``jobs``, default: every core), the longest (the designs at
N times the budget) started first, so the matrices take about the wall time of their total
CPU over the cores. ``kvfence mutants`` prints the tables and writes the same JUnit XML and
JSON as ``kvfence check``, one entry per run.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import attrs
from attrs import frozen
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from ..adapters import registry
from ..adapters.designs import DESIGNS, Design
from ..adapters.mutants import MUTANTS, Mutant
from ..adapters.protocol import EngineAdapter
from ..model.capabilities import Capability
from ..model.rules import BY_ID as RULES_BY_ID
from . import runner
from .battery import BEYOND_FIRST_KILL
from .calls import check_capabilities
from .explore import (
    KILL_DEPTH,
    AdapterExploration,
    Setup,
    deployment,
    explore_adapter,
    kill_search,
)
from .fingerprint import source_fingerprint
from .record import Recorder
from .runner import PROFILES, Result, _rule_verdicts, run_check
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


BEYOND_STATEFUL_BUDGET: dict[str, str] = {}
"""Mutants the stateful search alone misses at the focused ci budget, each with the reason;
each must be killed by the breadth-first kill (``first_kill``), the kill matrix's default;
``kvfence mutants --stateful`` reports them unkilled, which is the truth of that search.
Empty since the machine steers its draw to an endpoint holding a hazard such as lower-tier
KV (``machine.hazard_steered``): ``kv-resumed-stale-after-weights-only-update`` (serve, evict to
host, release the KV, flush) is now reached at the ci budget."""


def first_kill(job: Job) -> Result | None:
    """The kill by exhaustive search (each mutant stopped at its first kill): for an
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
    x = kill_exploration(job)
    return None if x is None else _killed(job, engine, x, started)


def kill_exploration(job: Job, out_dir: Path | None = None) -> AdapterExploration | None:
    """``explore.kill_search`` for ``job``: its engine and client built afresh from the
    registry for each search, its trace written under ``out_dir`` (``None``: ``job.out``)."""
    return kill_search(
        lambda: registry.engine(job.engine),
        lambda: registry.client(job.client),
        job.rule,
        out_dir or job.out,
        job.timeout,
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
    if job.explore and job.rule is not None and job.label not in BEYOND_FIRST_KILL:
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


def times_budget(profile: str, max_examples: int | None, times: int) -> int:
    """``--max-examples`` of a pass-matrix run at ``times`` times the budget: ``times`` x
    ``max_examples``, or x the profile's examples when ``max_examples`` is ``None``."""
    return times * (max_examples or int(PROFILES[profile].max_examples))


# ----- the pass matrix under the product explorer ----------------------------------------


EXPLORE_DEPTH = 3
"""Depth of the product exploration of each design (``explore_design``) over every setup
but the ones in ``EXPLORE_SHALLOW``: deep enough for the first steps of the designs'
witnesses (pause then serve, evict then sleep, start then update), which
tests/test_designs.py replays whole."""

EXPLORE_SHALLOW = {"plain": 2, "no-flush": 2, "in-place": 2, "unreported": 2, "mixed-info": 2}
"""The two-endpoint setups, explored to depth 2 only. At depth 3 each of them costs as much
as all eight one-endpoint setups together (``plain``: about 10,000 states and 50,000
transitions on the reference against 850 states at depth 2; the others more): the five
made every design's exploration about twice as long, and the main job's explorations about
fourteen minutes on two cores. What their third step adds is an interleaving of two
endpoints' actions, which the ci-profile runs (the stateful machine on the same
two-endpoint configs, many steps deep, for every design) exercise; their own rules (the
flush opt-out, pause in place, unreported and mixed server info, the lanes' guard) are
decided by the client's first update, within two steps, and the one-endpoint setups keep
depth 3 for the three-step paths of one engine (pause then serve, evict then sleep, start
then update)."""

_SHAPES = {
    Capability.RANKS: "ranks",
    Capability.STORE: "store",
    Capability.ROLES: "pd",
    Capability.ROUTER: "router",
}


def design_deployment(d: Design) -> str | None:
    """The deployment an engine design is explored on (``explore.deployment``): ``ranks``
    for one of endpoints with data-parallel ranks, ``store`` for one on a shared KV store,
    ``pd`` for a prefill/decode deployment, ``router`` for workers behind a router; else
    ``None`` (a client design, or an engine of plain endpoints: ``explore.SETUPS``)."""
    if d.side != "engine":
        return None
    caps = registry.engine(d.name).capabilities
    return next((shape for cap, shape in _SHAPES.items() if cap in caps), None)


def design_setups(d: Design) -> tuple[Setup, ...] | None:
    """The setups ``explore_design`` searches for ``d``: its deployment's, or ``None`` for
    ``explore.SETUPS`` (with ``EXPLORE_SHALLOW``)."""
    shape = design_deployment(d)
    return deployment(shape) if shape else None


@frozen
class Explored:
    """A correct design under the product explorer (``explore_design``): what its
    ``AdapterExploration`` showed, in the words a report keeps. ``violations`` and
    ``other``: the rules a path broke (the design is then not correct), ``error``: an
    adapter error or a stop (not shown either way); ``seconds``: wall time."""

    design: str
    setups: tuple[str, ...]
    depths: tuple[int, ...]
    setup_states: tuple[int, ...]
    states: int
    transitions: int
    depth_reached: int
    complete: bool
    violations: tuple[str, ...] = ()
    other: tuple[str, ...] = ()
    error: str = ""
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        """Searched out, every setup to its depth, and nothing broken."""
        return (
            self.complete
            and not (self.error or self.violations or self.other)
            and self.depth_reached == max(self.depths, default=0)
        )

    @property
    def outcome(self) -> str:
        """As ``outcome``: ``pass``, ``failure`` (a rule broken) or ``error``."""
        if self.clean:
            return "pass"
        return "failure" if (self.violations or self.other) and not self.error else "error"

    def why(self) -> str:
        """One line: what kept it from ``clean``."""
        if self.error:
            return f"ERROR: {self.error}"
        if self.violations or self.other:
            return "broke " + "; ".join(self.violations + self.other)
        return f"not searched out (depth {self.depth_reached} of {max(self.depths, default=0)})"


def explore_design(name: str, timeout: float = 60.0) -> Explored:
    """Design ``name`` (``adapters/designs.py``) under the product explorer: an engine
    design with the reference client, a client design against the reference engine, over
    its deployment's setups (``design_setups``) or every plain setup (``explore.SETUPS``,
    ``EXPLORE_SHALLOW``), to ``EXPLORE_DEPTH`` steps, no trace written. A correct design
    comes out ``clean``."""
    d = next(x for x in DESIGNS if x.name == name)
    engine, client = _systems(d.side, d.name)
    setups = design_setups(d)
    started = time.monotonic()
    x = explore_adapter(
        registry.engine(engine),
        registry.client(client),
        depth=EXPLORE_DEPTH,
        depths=None if setups else EXPLORE_SHALLOW,
        out_dir=None,
        timeout=timeout,
        setups=setups,
    )
    return _explored(name, x, time.monotonic() - started)


def _explored(name: str, x: AdapterExploration, seconds: float) -> Explored:
    return Explored(
        design=name,
        setups=x.setups,
        depths=x.depths,
        setup_states=x.setup_states,
        states=x.states,
        transitions=x.transitions,
        depth_reached=x.depth_reached,
        complete=x.complete,
        violations=tuple(str(v) for v in x.violation),
        other=tuple(str(v) for v in x.other),
        error=x.error,
        seconds=round(seconds, 3),
    )


@frozen
class Matrices:
    """What ``run_matrices`` saw: each design and mutant with its result, and wall time."""

    designs: tuple[tuple[Design, Result], ...]
    mutants: tuple[tuple[Mutant, Result], ...]
    seconds: float
    fingerprint: str | None = None
    """The ``source_fingerprint`` of the tree the runs started from (``None``: not known)."""
    times: int = 0
    """The pass matrix was also run at ``times`` times each run's budget (0: it was not)."""
    designs_times: tuple[tuple[Design, Result], ...] = ()
    """That pass matrix: each design with its result at ``times`` times the budget."""
    max_examples: int | None = None
    """The budget every run of the ci-size matrices was given (``None``: the profile's)."""
    explored: tuple[tuple[Design, Explored], ...] = ()
    """The pass matrix under the product explorer (``explore_design``), when it ran."""

    @property
    def all_designs(self) -> tuple[tuple[Design, Result], ...]:
        """Every pass-matrix row: at the budget, then at ``times`` times it."""
        return self.designs + self.designs_times

    @property
    def ok(self) -> bool:
        return (
            all(passed(r) for _, r in self.all_designs)
            and all(killed(m, r) for m, r in self.mutants)
            and all(e.clean for _, e in self.explored)
        )

    @property
    def exit_code(self) -> int:
        """0 when every design passes and every mutant is killed by its rule; 1 when a
        design FAILs or a mutant survives (its run PASSed, or FAILed by another rule); else
        2: what stands in the way is UNKNOWN or ERROR, not shown either way."""
        if self.ok:
            return 0
        failed = any(
            not passed(r) and r.verdict in (Verdict.FAIL, Verdict.WARN) for _, r in self.all_designs
        )
        survived = any(
            not killed(m, r) and r.verdict in (Verdict.FAIL, Verdict.WARN, Verdict.PASS)
            for m, r in self.mutants
        )
        broken = any(e.outcome == "failure" for _, e in self.explored)
        return 1 if failed or survived or broken else 2

    def unsettled(self) -> list[str]:
        """Why each design or mutant that is neither shown correct nor shown killed ended
        UNKNOWN or ERROR, one line each (its unexercised rules with their reasons, or the
        error)."""
        lines = []
        rows = [(d.name, r) for d, r in self.designs if not passed(r)]
        rows += [(f"{d.name} at {self.times}x", r) for d, r in self.designs_times if not passed(r)]
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
        lines += [
            f"ERROR {d.name} under the explorer: {e.error or e.why()}"
            for d, e in self.explored
            if e.outcome == "error"
        ]
        return lines

    @property
    def results(self) -> list[Result]:
        """The results of the designs at the budget and of the mutants (``designs_times``
        apart)."""
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
    on_done: Callable[[str], None] | None = None,
    designs_times: int = 0,
    designs_explored: bool = False,
    times_only: Sequence[Design] | None = None,
) -> Matrices:
    """Run the pass matrix over ``designs`` and the kill matrix over ``mutants``, ``jobs``
    runs at a time in separate processes. ``max_examples`` overrides every run's budget.
    ``explore``: kill in-process mutants by breadth-first search first (``first_kill``);
    False: by the stateful search only, as ``kvfence check --focus`` would. ``on_done``:
    called with the design's or mutant's name as each run ends (in the order they end;
    ``NAME at Nx`` for a run at N times the budget). ``designs_times`` > 0: the pass matrix
    also at that many times the budget (``times_budget``), its runs started first (the
    longest), of the designs of ``times_only`` alone when given (else of every one of
    ``designs``). ``designs_explored``: every design also under the product explorer
    (``explore_design``), in the same pool (``NAME explored`` to ``on_done``), after the
    runs at N times the budget."""
    if designs_times < 0:
        raise ValueError(f"designs_times must be 0 or more, not {designs_times}")
    scaled = times_budget(profile, max_examples, designs_times) if designs_times else 0
    at_times = list(designs if times_only is None else times_only) if designs_times else []
    todo = [
        attrs.evolve(
            design_job(d, profile, out, timeout, scaled), label=f"{d.name} at {designs_times}x"
        )
        for d in at_times
    ]
    explorations = [d.name for d in designs] if designs_explored else []
    todo += [design_job(d, profile, out, timeout, max_examples) for d in designs]
    todo += [mutant_job(m, profile, out, timeout, max_examples, explore) for m in mutants]
    k = len(at_times)
    tasks: list[tuple[str, Callable, object]] = [(j.label, run_job, j) for j in todo[:k]]
    tasks += [(f"{name} explored", explore_design, name) for name in explorations]
    tasks += [(j.label, run_job, j) for j in todo[k:]]
    fingerprint = source_fingerprint()  # of the files the runs load, not of later edits
    from .battery import load

    load()  # generated once here (or read), so that the runs read it from the cache
    started = time.monotonic()
    runner.STOPPED.clear()
    done = on_done or (lambda name: None)
    results: list = []
    if jobs > 1 and len(tasks) > 1:
        # spawn, not fork: a forked child would inherit the parent's adapter-call worker
        # thread pool without its thread, and its first call would time out.
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"))
        futures = {pool.submit(fn, arg): i for i, (_, fn, arg) in enumerate(tasks)}
        by_index: dict[int, object] = {}
        try:
            for future in as_completed(futures):
                i = futures[future]
                by_index[i] = future.result()
                done(tasks[i][0])
            results = [by_index[i] for i in range(len(tasks))]
        except KeyboardInterrupt:  # a stop signal: the runs done stand, the rest are ERROR
            ordered = sorted(futures, key=futures.__getitem__)
            results = [_done_or_stopped(f, t[2]) for f, t in zip(ordered, tasks, strict=True)]
            workers = list(getattr(pool, "_processes", {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for w in workers:
                w.terminate()
        else:
            pool.shutdown()
    else:
        for i, (label, fn, arg) in enumerate(tasks):
            try:
                if runner.STOPPED.is_set():
                    results.append(_stopped(arg))
                    continue
                results.append(fn(arg))
                done(label)
            except KeyboardInterrupt:  # outside a search, or while the progress was printed
                runner.STOPPED.set()
                if len(results) == i:  # this run had not finished
                    results.append(_stopped(arg))
    e = k + len(explorations)
    n = e + len(designs)
    return Matrices(
        tuple(zip(designs, results[e:n], strict=True)),
        tuple(zip(mutants, results[n:], strict=True)),
        time.monotonic() - started,
        fingerprint,
        times=designs_times,
        designs_times=tuple(zip(at_times, results[:k], strict=True)),
        max_examples=max_examples,
        explored=tuple(zip(designs, results[k:e], strict=True)) if explorations else (),
    )


STOPPED_BEFORE = "stopped by a signal before this run finished"


def _stopped(job: Job | str) -> Result | Explored:
    """An ERROR naming the stop: a run's result, or a design's exploration (``job`` is
    then the design's name)."""
    from .runner import error_result

    if isinstance(job, str):
        return Explored(job, (), (), (), 0, 0, 0, False, error=STOPPED_BEFORE)
    return error_result(job.engine, job.client, job.profile, None, STOPPED_BEFORE, job.strict)


def _done_or_stopped(future, job: Job | str) -> Result | Explored:
    """A pool task's result if it finished, else an ERROR naming the stop."""
    if future.done() and not future.cancelled() and future.exception() is None:
        return future.result()
    return _stopped(job)


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


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    """A matrix table that reads in a CI log: a light box, one space between columns, the
    first column (a design's or mutant's name, which a reader and a test look for) never
    cut; a list cell holds one item per line, so a rule ID never breaks."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    wide = max((len(r[0]) for r in rows), default=6)
    for k, col in enumerate(columns):
        table.add_column(col, no_wrap=True, min_width=wide if k == 0 else None)
    for row in rows:
        table.add_row(*row)
    return table


def _fitted(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    drop: Sequence[str],
    width: int | None,
) -> tuple[Table, list[str]]:
    """``_table`` with the columns of ``drop`` left out, in that order, until it fits
    ``width`` (``None``: all of them): the table and the columns left out."""
    left_out: list[str] = []
    while True:
        keep = [k for k, c in enumerate(columns) if c not in left_out]
        table = _table(title, [columns[k] for k in keep], [[r[k] for k in keep] for r in rows])
        if width is None or len(left_out) == len(drop):
            return table, left_out
        console = Console(width=10_000, file=open(os.devnull, "w"), color_system=None)  # noqa: SIM115
        if Measurement.get(console, console.options, table).maximum <= width:
            return table, left_out
        left_out.append(drop[len(left_out)])


def pass_table(
    rows: Sequence[tuple[Design, Result]],
    profile: str,
    width: int | None = None,
    times: int = 0,
    first_note: int = 1,
) -> tuple[Table, list[str]]:
    """One row per design: its case, the rules it keeps, the verdict, examples and seconds,
    fitted to ``width`` (``_fitted``: seconds, then examples, then the case left out), and
    the columns left out. A passing run's notes are numbered in the verdict cell, from
    ``first_note``, and printed under the table (``pass_notes``). ``times``: the rows are
    runs at that many times the budget (the title says so)."""
    cells, numbered = [], first_note - 1
    for d, result in rows:
        good = passed(result)
        verdict = f"[{'green' if good else 'bold red'}]{result.verdict}[/]"
        if not good:
            verdict += "\n" + ("\n".join(result.caught()) or result.error[:60])
        elif _notes(result):
            numbered += 1
            verdict += f" [{numbered}]"
        keeps = "\n".join(d.keeps)
        seconds = f"{result.seconds:.1f}"
        cells.append([d.name, d.case or "reference", keeps, verdict, str(result.examples), seconds])
    columns = ("design", "case", "keeps", "verdict", "examples", "s")
    scale = f", {times}x the budget" if times else ""
    title = f"kvfence pass matrix (profile {profile}{scale})"
    return _fitted(title, columns, cells, ("s", "examples", "case"), width)


def pass_notes(rows: Sequence[tuple[Design, Result]], first: int = 1) -> list[str]:
    """The numbered notes of the passing rows of ``pass_table``, one line each, numbered
    from ``first``."""
    notes = [f"{d.name}: {_notes(r)}" for d, r in rows if passed(r) and _notes(r)]
    return [f"[{k}] {note}" for k, note in enumerate(notes, first)]


def kill_table(
    rows: Sequence[tuple[Mutant, Result]], profile: str, width: int | None = None
) -> tuple[Table, list[str]]:
    """One row per mutant: its side, the rule that must kill it, whether it was killed, the
    rules its counterexample broke, the counterexample's steps, seconds and public cases,
    fitted to ``width`` (``_fitted``: cases, then seconds, then the side left out), and
    the columns left out."""
    cells = []
    for m, result in rows:
        status = "[green]killed[/]" if killed(m, result) else f"[bold red]{result.verdict}[/]"
        if not killed(m, result):
            status += "\n[bold red]survived[/]"
        caught = "\n".join(result.caught())
        steps, seconds = str(result.steps), f"{result.seconds:.1f}"
        cells.append([m.name, m.side, m.rule, status, caught, steps, seconds, "\n".join(m.cases)])
    columns = ("mutant", "side", "rule", "verdict", "caught", "steps", "s", "cases")
    title = f"kvfence kill matrix (profile {profile})"
    return _fitted(title, columns, cells, ("cases", "s", "side"), width)


def print_matrices(x: Matrices, profile: str, console: Console) -> None:
    """Both tables, fitted to the console's width (the pass table's notes under it, and
    the columns a narrow console left out named), and one summary line."""
    left_out: list[str] = []
    if x.designs:
        table, dropped = pass_table(x.designs, profile, console.width)
        console.print(table)
        notes = pass_notes(x.designs)
        for note in notes:
            console.print(note, markup=False, highlight=False)
        left_out += [f"pass matrix {c}" for c in dropped]
        if x.designs_times:
            first = len(notes) + 1
            table, dropped = pass_table(
                x.designs_times, profile, console.width, x.times, first_note=first
            )
            console.print(table)
            for note in pass_notes(x.designs_times, first):
                console.print(note, markup=False, highlight=False)
            left_out += [f"pass matrix at {x.times}x {c}" for c in dropped]
    if x.explored:
        for line in explored_lines(x.explored):
            console.print(line, markup=False, highlight=False)
    if x.mutants:
        table, dropped = kill_table(x.mutants, profile, console.width)
        console.print(table)
        left_out += [f"kill matrix {c}" for c in dropped]
    if left_out:
        console.print(
            f"not shown at {console.width} columns: {', '.join(left_out)} (--json has every field)",
            markup=False,
            highlight=False,
        )
    good_d = sum(passed(r) for _, r in x.designs)
    good_x = sum(passed(r) for _, r in x.designs_times)
    good_m = sum(killed(m, r) for m, r in x.mutants)
    word = "[green]OK[/]" if x.ok else "[bold red]NOT OK[/]"
    at_times = f" ({good_x}/{len(x.designs_times)} at {x.times}x)" if x.designs_times else ""
    if x.explored:
        clean = sum(e.clean for _, e in x.explored)
        at_times += f" ({clean}/{len(x.explored)} under the explorer)"
    console.print(
        f"{word}: {good_d}/{len(x.designs)} correct designs pass{at_times}, "
        f"{good_m}/{len(x.mutants)} mutants killed by their rule ({x.seconds:.1f} s wall)"
    )


def explored_lines(rows: Sequence[tuple[Design, Explored]]) -> list[str]:
    """The pass matrix under the explorer, for the terminal: one summary line, then one
    line per design that did not come out clean."""
    clean = sum(e.clean for _, e in rows)
    states = sum(e.states for _, e in rows)
    edges = sum(e.transitions for _, e in rows)
    lines = [
        f"pass matrix under the product explorer (every setup to depth {EXPLORE_DEPTH}, "
        "the two-endpoint ones to 2): "
        f"{clean}/{len(rows)} designs searched out with nothing broken, {states:,} states, "
        f"{edges:,} transitions"
    ]
    lines += [f"  {d.name}: {e.why()}" for d, e in rows if not e.clean]
    return lines


# ----- reports CI can read: one row per design and per mutant --------------------------


def outcome(kind: str, result: Result, rule: str | None = None) -> str:
    """A matrix row's outcome, as mutation-testing tools report one: ``pass`` (a design
    shown correct; a mutant killed by ``rule``), ``failure`` (a design that FAILs; a mutant
    that survived: its run PASSed, or FAILed only by other rules) or ``error`` (neither
    shown: UNKNOWN or ERROR, never counted as a pass)."""
    if kind == "design":
        if passed(result):
            return "pass"
        return "failure" if result.verdict in (Verdict.FAIL, Verdict.WARN) else "error"
    if result.verdict is Verdict.FAIL and rule in result.caught():
        return "pass"
    if result.verdict in (Verdict.FAIL, Verdict.WARN, Verdict.PASS):
        return "failure"
    return "error"


def _why(kind: str, result: Result, rule: str | None) -> str:
    """The one-line message of a row that did not pass."""
    caught = ", ".join(result.caught())
    if kind == "design":
        return f"{result.verdict}: {caught or result.error or 'a rule was not judged'}"
    if result.verdict is Verdict.FAIL:
        return f"survived: killed by {caught}, not by its rule {rule}"
    if result.verdict in (Verdict.PASS, Verdict.WARN):
        return f"survived: {result.verdict}, its rule {rule} held"
    unjudged = "; ".join(
        f"{v.rule.id} {v.verdict}" for v in result.rules if v.verdict in (Verdict.UNKNOWN,)
    )
    return f"{result.verdict}: {result.error or unjudged or 'not shown either way'}"


def matrix_rows(
    x: Matrices, designs: Sequence[tuple[Design, Result]] | None = None
) -> list[dict[str, object]]:
    """One JSON object per design and per mutant: ``kind`` (design, mutant), ``name``,
    ``side`` (engine, client), ``expected_rule`` (a mutant's rule; ``None`` for a design),
    ``killed_by`` (the rules its counterexample broke), ``verdict`` (the run's),
    ``outcome`` (``outcome``: pass, failure, error), ``message`` (why, when not a pass),
    ``steps``, ``seconds``, ``counterexample`` (its JSONL path or ``None``). ``designs``:
    only these design rows (``x.designs_times``), no mutant."""
    rows: list[tuple[str, str, str, str | None, Result]] = [
        ("design", d.name, d.side, None, r) for d, r in (x.designs if designs is None else designs)
    ]
    rows += [("mutant", m.name, m.side, m.rule, r) for m, r in x.mutants if designs is None]
    out = []
    for kind, name, side, rule, r in rows:
        result = outcome(kind, r, rule)
        out.append(
            {
                "kind": kind,
                "name": name,
                "side": side,
                "expected_rule": rule,
                "killed_by": list(r.caught()),
                "verdict": r.verdict.value,
                "outcome": result,
                "message": "" if result == "pass" else _why(kind, r, rule),
                "steps": r.steps,
                "seconds": round(r.seconds, 3),
                "counterexample": None if r.counterexample is None else str(r.counterexample),
            }
        )
    return out


def write_matrix_json(x: Matrices, path: Path, profile: str = "ci") -> None:
    """``kvfence mutants --json``: ``{"ok", "exit_code", "seconds", "profile",
    "max_examples" (``Matrices.max_examples``: ``None`` for the profile's budget),
    "fingerprint" (the run's ``Matrices.fingerprint``, else ``source_fingerprint`` now),
    "rows": matrix_rows, "results": [report.result_json per run]}``, and when the pass
    matrix also ran at N times the budget, ``"pass_matrix_times": {"times": N,
    "max_examples" (each of those runs': ``times_budget``), "rows", "results"}`` for its
    designs; when it ran under the product explorer, ``"pass_matrix_explored": {"depth",
    "shallow", "rows": [Explored's fields and "outcome" per design]}``. Written
    atomically."""
    import json

    from .report import result_json
    from .trace import write_atomic

    data: dict[str, object] = {
        "ok": x.ok,
        "exit_code": x.exit_code,
        "seconds": round(x.seconds, 3),
        "profile": profile,
        "max_examples": x.max_examples,
        "fingerprint": x.fingerprint or source_fingerprint(),
        "rows": matrix_rows(x),
        "results": [result_json(r) for r in x.results],
    }
    if x.designs_times:
        data["pass_matrix_times"] = {
            "times": x.times,
            "max_examples": times_budget(profile, x.max_examples, x.times),
            "rows": matrix_rows(x, x.designs_times),
            "results": [result_json(r) for _, r in x.designs_times],
        }
    if x.explored:
        data["pass_matrix_explored"] = {
            "depth": EXPLORE_DEPTH,
            "shallow": EXPLORE_SHALLOW,
            "rows": [{**attrs.asdict(e), "outcome": e.outcome} for _, e in x.explored],
        }
    write_atomic(path, json.dumps(data, indent=2, default=repr) + "\n")


def _this_tree(path: Path, profile: str, max_examples: int | None) -> dict | None:
    """The JSON object of the ``write_matrix_json`` report at ``path`` when its runs were of
    this source tree (``source_fingerprint``), ``profile`` and ``max_examples``; else
    ``None``, also for a missing or unreadable file."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("profile") != profile:
        return None
    if data.get("max_examples", -1) != max_examples:
        return None
    return data if data.get("fingerprint") == source_fingerprint() else None


def _results_by_name(path: Path, rows: object, results: object) -> dict[tuple[str, str], Result]:
    """``(kind, name)`` -> the result of that row of a report at ``path``, a relative
    counterexample path read against the folder the run ran in (``path``'s folder's parent,
    as ``kvfence mutants --out DIR --json DIR/matrices.json`` writes it). Raises
    ``KeyError``, ``ValueError`` or ``TypeError`` on rows of another shape."""
    from .report import in_run_folder, result_from_json

    if not isinstance(rows, list) or not isinstance(results, list) or len(rows) != len(results):
        raise ValueError("rows and results differ")
    by_row: dict[tuple[str, str], Result] = {}
    for row, data in zip(rows, results, strict=True):
        by_row[(row["kind"], row["name"])] = in_run_folder(result_from_json(data), path)
    return by_row


def read_matrix_json(
    path: Path,
    designs: Sequence[Design],
    mutants: Sequence[Mutant],
    profile: str = "ci",
    max_examples: int | None = None,
) -> Matrices | None:
    """The matrices a ``write_matrix_json`` report at ``path`` holds, when that run is this
    one: the same ``profile`` and ``max_examples`` (``None``: the profile's budget), the
    same ``source_fingerprint`` and a row for every one of ``designs`` and ``mutants``
    (then the results are those a new run would compute); else ``None``, also for a
    missing or unreadable file. A relative counterexample path is read against the folder
    the run ran in (``path``'s folder's parent, as ``kvfence mutants --out DIR --json
    DIR/matrices.json`` writes it). The pass matrix at N times the budget is not read
    here (``read_designs_times``)."""
    data = _this_tree(path, profile, max_examples)
    if data is None:
        return None
    try:
        by_row = _results_by_name(path, data["rows"], data["results"])
    except (ValueError, KeyError, TypeError):
        return None
    try:
        return Matrices(
            designs=tuple((d, by_row[("design", d.name)]) for d in designs),
            mutants=tuple((m, by_row[("mutant", m.name)]) for m in mutants),
            seconds=float(data["seconds"]),
            fingerprint=data["fingerprint"],
            max_examples=max_examples,
        )
    except (KeyError, ValueError, TypeError):
        return None


def read_designs_times(
    path: Path,
    designs: Sequence[Design],
    times: int,
    profile: str = "ci",
    max_examples: int | None = None,
) -> dict[str, Result] | None:
    """Design name -> its result in the pass matrix at ``times`` times the budget that the
    ``write_matrix_json`` report at ``path`` holds (``kvfence mutants --designs-times``),
    for each of ``designs`` it has a row for, when that run is this one: the same
    ``profile`` and ``max_examples`` at 1x, the same ``source_fingerprint``, the same
    ``times``, and each run's budget ``times_budget(profile, max_examples, times)``;
    else ``None``, also for a report without that matrix or a missing or unreadable file.
    A design without a row is left out (its caller runs it); a row's result is given as
    it is, so an ERROR or UNKNOWN one stays that (``passed`` is False for it)."""
    data = _this_tree(path, profile, max_examples)
    section = None if data is None else data.get("pass_matrix_times")
    if not isinstance(section, dict) or section.get("times") != times:
        return None
    if section.get("max_examples") != times_budget(profile, max_examples, times):
        return None
    try:
        by_row = _results_by_name(path, section["rows"], section["results"])
    except (ValueError, KeyError, TypeError):
        return None
    return {d.name: by_row[("design", d.name)] for d in designs if ("design", d.name) in by_row}


def read_designs_explored(
    path: Path,
    designs: Sequence[Design],
    profile: str = "ci",
    max_examples: int | None = None,
) -> dict[str, Explored] | None:
    """Design name -> its exploration in the pass matrix under the product explorer that
    the ``write_matrix_json`` report at ``path`` holds (``kvfence mutants
    --designs-explored``), for each of ``designs`` it has a row for, when that run is this
    one: the same ``profile``, ``max_examples`` and ``source_fingerprint``, and the same
    ``EXPLORE_DEPTH`` and ``EXPLORE_SHALLOW``; else ``None``, also for a report without
    that section or a missing or unreadable file (a row of another shape too). A design
    without a row is left out (its caller explores it)."""
    data = _this_tree(path, profile, max_examples)
    section = None if data is None else data.get("pass_matrix_explored")
    if not isinstance(section, dict) or section.get("depth") != EXPLORE_DEPTH:
        return None
    if section.get("shallow") != EXPLORE_SHALLOW or not isinstance(section.get("rows"), list):
        return None
    names = {d.name for d in designs}
    out: dict[str, Explored] = {}
    try:
        for row in section["rows"]:
            fields = {f.name: row[f.name] for f in attrs.fields(Explored)}
            for name in ("setups", "depths", "setup_states", "violations", "other"):
                fields[name] = tuple(fields[name])
            e = Explored(**fields)
            if e.design in names:
                out[e.design] = e
    except (KeyError, TypeError):
        return None
    return out


def write_matrix_junit(x: Matrices, path: Path) -> None:
    """``kvfence mutants --junit``: a testsuite ``kvfence.pass-matrix`` with one testcase
    per design (classname ``kvfence.design.SIDE``), ``kvfence.pass-matrix-Nx`` with one per
    design at N times the budget when it ran (classname ``kvfence.design-Nx.SIDE``) and
    ``kvfence.kill-matrix`` with one per mutant, and ``kvfence.pass-matrix-explored`` with
    one per design under the product explorer when it ran; a row's ``outcome`` is its
    element (``failure``, ``error``, none for a pass), and its expected rule, killed-by,
    verdict and counterexample are testcase properties. A green matrix has no failure and
    no error. Written atomically; every text XML-safe."""
    import xml.etree.ElementTree as ET

    from .report import xml_text
    from .trace import write_atomic

    root = ET.Element("testsuites", name="kvfence mutants")
    rows = matrix_rows(x)
    suites = [
        ("design", "kvfence.pass-matrix", "design", rows),
        ("mutant", "kvfence.kill-matrix", "mutant", rows),
    ]
    if x.designs_times:
        at_times = matrix_rows(x, x.designs_times)
        n = f"{x.times}x"
        suites.insert(1, ("design", f"kvfence.pass-matrix-{n}", f"design-{n}", at_times))
    for kind, title, classkind, every in suites:
        mine = [r for r in every if r["kind"] == kind]
        if not mine:
            continue
        suite = ET.SubElement(
            root,
            "testsuite",
            name=title,
            tests=str(len(mine)),
            failures=str(sum(r["outcome"] == "failure" for r in mine)),
            errors=str(sum(r["outcome"] == "error" for r in mine)),
            skipped="0",
            time=f"{sum(float(str(r['seconds'])) for r in mine):.3f}",
        )
        for r in mine:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"kvfence.{classkind}.{r['side']}",
                name=str(r["name"]),
                time=f"{r['seconds']}",
            )
            props = ET.SubElement(case, "properties")
            for key in ("expected_rule", "killed_by", "verdict", "counterexample"):
                value = r[key]
                value = ", ".join(value) if isinstance(value, list) else value
                if value is not None:
                    ET.SubElement(props, "property", name=key, value=xml_text(value))
            if r["outcome"] != "pass":
                el = ET.SubElement(case, str(r["outcome"]), message=xml_text(r["message"]))
                el.text = xml_text(r["message"])
    if x.explored:
        _explored_suite(root, x.explored)
    ET.indent(root)
    body = ET.tostring(root, encoding="unicode")
    write_atomic(path, '<?xml version="1.0" encoding="utf-8"?>\n' + body + "\n")


def _explored_suite(root, rows: Sequence[tuple[Design, Explored]]) -> None:
    """The JUnit suite of the pass matrix under the explorer (``write_matrix_junit``)."""
    import xml.etree.ElementTree as ET

    from .report import xml_text

    suite = ET.SubElement(
        root,
        "testsuite",
        name="kvfence.pass-matrix-explored",
        tests=str(len(rows)),
        failures=str(sum(e.outcome == "failure" for _, e in rows)),
        errors=str(sum(e.outcome == "error" for _, e in rows)),
        skipped="0",
        time=f"{sum(e.seconds for _, e in rows):.3f}",
    )
    for d, e in rows:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"kvfence.design-explored.{d.side}",
            name=d.name,
            time=f"{e.seconds}",
        )
        props = ET.SubElement(case, "properties")
        for key in ("states", "transitions", "depth_reached"):
            ET.SubElement(props, "property", name=key, value=str(getattr(e, key)))
        if e.outcome != "pass":
            el = ET.SubElement(case, e.outcome, message=xml_text(e.why()))
            el.text = xml_text(e.why())


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
    "EXPLORE_DEPTH",
    "EXPLORE_SHALLOW",
    "FOCUSED_EXAMPLES",
    "KILL_DEPTH",
    "Explored",
    "Job",
    "Matrices",
    "design_deployment",
    "design_job",
    "design_setups",
    "explore_design",
    "explored_lines",
    "first_kill",
    "kill_table",
    "killed",
    "matrix_rows",
    "mutant_job",
    "outcome",
    "pass_notes",
    "pass_table",
    "passed",
    "print_matrices",
    "read_designs_explored",
    "read_designs_times",
    "read_matrix_json",
    "run_job",
    "run_matrices",
    "select",
    "source_fingerprint",
    "times_budget",
    "write_matrix_json",
    "write_matrix_junit",
]
