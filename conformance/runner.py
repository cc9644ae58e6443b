"""Run the conformance machine against one SUT and turn what it saw into verdicts.

``run_check`` is four phases: ``generate`` (the client table and Hypothesis's search),
``minimise`` (shrink the failing run), ``write_counterexample`` and ``judge``.

Verdicts, worst first: FAIL (a rule broken), ERROR (the SUT or adapter could not answer),
UNKNOWN (a rule or scenario never exercised), PASS, SKIP (the adapter cannot observe the
rule's evidence, with the reason). The run's verdict is the worst over its rules; SKIP never
decides it. A SHOULD rule's FAIL counts only with ``strict``; otherwise it shows as WARN.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs import define, field, frozen
from hypothesis import HealthCheck, Phase, Verbosity, configuration, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Flaky
from hypothesis.stateful import get_state_machine_test

from ..adapters.protocol import ClientAdapter, EngineAdapter
from ..model.capabilities import (
    DEPLOYMENT_CAPABILITIES,
    EVIDENCE,
    PROFILE_CAPABILITIES,
    Capability,
)
from ..model.checks import Violation, unknown_reason
from ..model.rules import BY_ID, RULES, Klass, Rule, RuleId
from ..model.state import Bounds
from .battery import BatteryRun, run_battery
from .battery import load as load_battery
from .calls import SIGNALLED, Timing, call_with_timeout, check_capabilities, is_direct
from .client_table import TABLE_ONLY, client_table
from .errors import AdapterError, ConformanceFailure
from .fingerprint import source_fingerprint
from .isolate import run_isolated
from .lockstep import MACHINE_BOUNDS
from .machine import build_machine
from .program import is_program
from .program_table import program_table
from .record import Covered, Recorder, Run
from .replay import Replayed, ReplayKind, holding, reference_contrast, replay_actions, shrink
from .trace import header, safe_name, unique_path, verdict_line, write_trace
from .verdict import ORDER, Verdict, worst

_QUIET: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": list(HealthCheck),
    "report_multiple_bugs": False,
    "print_blob": False,
    "verbosity": Verbosity.quiet,
}

PROFILES: dict[str, settings] = {
    "ci": settings(max_examples=600, stateful_step_count=15, derandomize=True, **_QUIET),
    "dev": settings(max_examples=400, stateful_step_count=40, derandomize=False, **_QUIET),
    "fuzz": settings(max_examples=5000, stateful_step_count=80, derandomize=False, **_QUIET),
}
"""Named budgets. ``ci`` is derandomized (the same examples every run, with or without the
``CI`` environment variable); ``dev`` and ``fuzz`` draw new examples every run unless
``seed`` is given, also under ``CI`` (``derandomize`` is set here, never inherited from
Hypothesis's own ``ci`` profile, which ``CI`` would load). ``dev`` and ``fuzz`` keep
Hypothesis's example database under the run's output folder (``<out>/.hypothesis``), never
in the working directory; ``ci`` keeps none."""

REQUIRES: dict[str, tuple[Capability, ...]] = dict(EVIDENCE)
"""Capabilities (and config features) a rule's evidence needs; without them it is SKIP."""


@frozen
class RuleVerdict:
    rule: Rule
    verdict: Verdict
    evidence: int
    reason: str = ""


@frozen
class TimeSplit:
    """A check's wall time split between the system under test and kvfence itself (the
    target, in ``scripts/bench.py``: checker overhead under 10% of a vLLM check's wall time).

    ``wall_seconds``: ``run_check`` from its start to its result (search, shrinking, close,
    counterexample, judging). ``engine_seconds`` / ``engine_calls``: inside the engine
    adapter (start-up and model loading included), ``client_seconds`` / ``client_calls``:
    inside the client resolver (``calls.Timing`` says what is counted).
    ``checker_seconds``: the rest, kvfence's own work (the model, Hypothesis, judging,
    thread handoffs), never below 0. ``checker_fraction``: ``checker_seconds /
    wall_seconds`` in [0, 1]; 0.0 for a zero wall time (nothing to divide)."""

    wall_seconds: float
    engine_seconds: float
    client_seconds: float
    engine_calls: int = 0
    client_calls: int = 0

    @classmethod
    def of(cls, wall_seconds: float, timing: Timing) -> TimeSplit:
        return cls(
            wall_seconds,
            timing.engine_seconds,
            timing.client_seconds,
            timing.engine_calls,
            timing.client_calls,
        )

    @property
    def checker_seconds(self) -> float:
        return max(0.0, self.wall_seconds - self.engine_seconds - self.client_seconds)

    @property
    def checker_fraction(self) -> float:
        if self.wall_seconds <= 0:
            return 0.0
        return min(1.0, self.checker_seconds / self.wall_seconds)


@frozen
class Result:
    """One check. ``verdict``: the run's verdict. ``rules``: one ``RuleVerdict`` per rule.
    ``violations``: what failed (rule, expected, actual). ``counterexample``: JSONL path.
    ``steps``: top-level steps in the counterexample. ``seconds``: wall time of the whole
    check. ``timing``: that wall time split between the engine, the client and kvfence
    (``TimeSplit``); ``None`` where no run measured it (a result built from a matrix cell
    or a served session). ``top_ups``: extra searches run because a rule was still
    unexercised after the profile's budget (``TOP_UPS``), counted in ``examples``.
    ``battery``: the battery run before the search (``battery.BatteryRun``: scenarios
    ran, passed, failed, skipped, per rule), ``None`` when none ran. ``bounds``: what the
    check's examples covered (``record.Covered``: most endpoints, prompts, requests in
    flight, updates and serves in one example), battery and search together.
    ``engine_version``: the release of the engine that answered, as its adapter reports
    it (``EngineAdapter``'s optional ``engine_version``), ``None`` when it reports none.
    ``fingerprint``: the source tree and the options the check ran with
    (``check_fingerprint``, taken as it started), ``None`` where no check ran."""

    engine: str
    client: str
    profile: str
    seed: int | None
    verdict: Verdict
    rules: tuple[RuleVerdict, ...]
    violations: tuple[Violation, ...]
    error: str
    counterexample: Path | None
    steps: int
    examples: int
    seconds: float
    warnings: tuple[str, ...] = ()
    timing: TimeSplit | None = None
    top_ups: int = 0
    battery: BatteryRun | None = None
    bounds: Covered | None = None
    engine_version: str | None = None
    fingerprint: str | None = None

    @property
    def exit_code(self) -> int:
        return Verdict(self.verdict).exit_code

    def caught(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v.rule for v in self.violations))

    @property
    def safety(self) -> Verdict:
        """The verdict over the SAFETY rules and violations (``by_class``)."""
        return by_class(self.rules, self.violations, self.verdict)[Klass.SAFETY]

    @property
    def availability(self) -> Verdict:
        """The verdict over the AVAILABILITY rules and violations (``by_class``)."""
        return by_class(self.rules, self.violations, self.verdict)[Klass.AVAILABILITY]


NOT_REACHED = "run stopped before it was exercised"
"""The note of a rule left UNKNOWN because the run stopped (at its first counterexample, or on
an error) before any step exercised it."""


def by_class(
    rules: tuple[RuleVerdict, ...], violations: tuple[Violation, ...], overall: Verdict
) -> dict[Klass, Verdict]:
    """The run's verdict split into SAFETY and AVAILABILITY: each the worst verdict of the
    rules of that class. A broken rule counts under the classes of its violations (an
    engine that dies on a refused flush breaks FC-001 under AVAILABILITY); CHECK rules (the
    adapter answered, the scenarios were reached) count under both, since neither half is
    judged without them. A run that ended on ERROR is ERROR in both halves unless one
    FAILs."""
    costs: dict[str, set[Klass]] = {}
    for v in violations:
        costs.setdefault(v.rule, set()).add(v.cost)
    out = {}
    for klass in (Klass.SAFETY, Klass.AVAILABILITY):
        verdicts = []
        for r in rules:
            broken = r.verdict in (Verdict.FAIL, Verdict.WARN) and r.rule.id in costs
            classes = costs[r.rule.id] if broken else {r.rule.klass}
            if klass in classes or Klass.CHECK in classes:
                verdicts.append(r.verdict)
        verdict = worst(verdicts)
        if overall is Verdict.ERROR and verdict is not Verdict.FAIL:
            verdict = Verdict.ERROR
        out[klass] = verdict
    return out


@frozen
class Options:
    """How a check runs (``run_check``'s keyword arguments, validated)."""

    profile: str = "ci"
    seed: int | None = None
    out_dir: Path = Path("kvfence-results")
    strict: bool = False
    timeout: float = 60.0
    bounds: Bounds = MACHINE_BOUNDS
    max_examples: int | None = None
    focus: str | None = None
    battery: bool = True
    database: str | None = None


@define
class Search:
    """What the generate phase leaves for the others: the ``recorder``, the client
    ``table``'s violations, the ``error`` that ended it, and the parsed capabilities."""

    recorder: Recorder
    table: list[Violation]
    error: AdapterError | None = None
    capabilities: frozenset[Capability] = frozenset()
    reasons: dict[str, str] = field(factory=dict)
    """Capability -> why the engine lacks it (the adapter's optional ``missing_reasons``),
    added to the SKIP notes."""
    top_ups: int = 0
    """Extra searches run because a rule was still unexercised (``_top_up_due``)."""
    battery: BatteryRun | None = None
    """What the battery run before the search saw (``None``: not run)."""


def missing_reasons(engine: object) -> dict[str, str]:
    """The adapter's optional ``missing_reasons`` (capability name -> why the engine lacks
    it), checked: ``ValueError`` naming an entry that is not a known capability or not a
    string."""
    given = getattr(engine, "missing_reasons", None) or {}
    if not isinstance(given, Mapping):
        raise ValueError(f"missing_reasons {given!r:.80} is not a mapping")
    known = {c.value for c in Capability}
    bad = sorted(str(k) for k, v in given.items() if k not in known or not isinstance(v, str))
    if bad:
        raise ValueError(f"missing_reasons names unknown capabilities or non-text: {bad}")
    return {str(k): v for k, v in given.items()}


def check_focus(focus: str | None) -> None:
    """``ValueError`` unless ``focus`` is None or a rule ID of the registry (exactly:
    ``"inv-001"`` and ``""`` are not rules, and would otherwise set every example aside)."""
    if focus is not None and focus not in BY_ID:
        raise ValueError(f"unknown rule {focus!r} to focus on; known: {', '.join(BY_ID)}")


def _rule_verdicts(
    recorder: Recorder,
    violations: list[Violation],
    error: AdapterError | None,
    capabilities: frozenset[Capability],
    strict: bool,
    focus: str | None = None,
    refused: frozenset[str] = frozenset(),
    reasons: Mapping[str, str] | None = None,
) -> tuple[RuleVerdict, ...]:
    """One verdict per rule. ``refused``: rules of configurations the client raised on in
    the client table (named in the ADP notes: the client did not answer there).
    ``reasons``: capability -> why the engine lacks it, appended to a SKIP's note."""
    reasons = reasons or {}
    broken = {v.rule for v in violations}
    refusals = ", ".join(sorted({v.rule for v in recorder.refused.values()} | set(refused)))
    out = []
    for r in RULES:
        n = recorder.exercised[r.id] + (1 if r.id in recorder.reached else 0)
        missing = [c.value for c in REQUIRES.get(r.id, ()) if c not in capabilities]
        if r.id in broken:
            verdict = Verdict.FAIL if r.level == "MUST" or strict else Verdict.WARN
            out.append(RuleVerdict(r, verdict, n, "violated"))
        elif r.id in recorder.other:
            # Broken where the focused search looked away: still broken (never PASS/WARN).
            why = f"broken in an example set aside by the focus on {focus}: {recorder.other[r.id]}"
            out.append(RuleVerdict(r, Verdict.FAIL, n, why))
        elif error is not None and r.id == error.rule:
            out.append(RuleVerdict(r, Verdict.ERROR, n, str(error)))
        elif r.id in recorder.not_at_stake:
            # a rule of the other kind of client (a resolver's plan, a program's calls)
            out.append(RuleVerdict(r, Verdict.NA, n, recorder.not_at_stake[r.id]))
        elif missing and all(Capability(c) in DEPLOYMENT_CAPABILITIES for c in missing):
            shapes = ", ".join(DEPLOYMENT_CAPABILITIES[Capability(c)] for c in missing)
            out.append(RuleVerdict(r, Verdict.NA, n, f"not at stake: binds only {shapes}"))
        elif missing and all(Capability(c) in PROFILE_CAPABILITIES for c in missing):
            fields = ", ".join(PROFILE_CAPABILITIES[Capability(c)] for c in missing)
            why = f"not at stake: binds only engines whose profile sets {fields}"
            out.append(RuleVerdict(r, Verdict.NA, n, why))
        elif missing:
            # Evidence counted without a capability it needs could not have shown a
            # violation: never a PASS.
            why = [f"{c}: {reasons[c]}" for c in missing if c in reasons]
            note = f"needs {', '.join(missing)}" + (f" ({'; '.join(why)})" if why else "")
            out.append(RuleVerdict(r, Verdict.SKIP, n, note))
        elif n > 0:
            out.append(RuleVerdict(r, Verdict.PASS, n))
        elif r.kind == "ADP" and error is None and refusals:
            note = f"every call answered; the client raised on {refusals} configurations"
            out.append(RuleVerdict(r, Verdict.PASS, recorder.steps, note))
        elif r.kind == "ADP" and error is None:
            out.append(RuleVerdict(r, Verdict.PASS, recorder.steps, "every call answered"))
        elif r.kind == "ADP":
            out.append(RuleVerdict(r, Verdict.UNKNOWN, 0, "the run ended on an adapter error"))
        elif error is not None or recorder.failure is not None:
            out.append(RuleVerdict(r, Verdict.UNKNOWN, 0, NOT_REACHED))
        else:
            reason = f"never exercised: {unknown_reason(r.id)}; raise the budget"
            out.append(RuleVerdict(r, Verdict.UNKNOWN, 0, reason))
    return tuple(out)


def _settings(engine: EngineAdapter, opts: Options) -> settings:
    overrides: dict[str, Any] = {"phases": (Phase.explicit, Phase.reuse, Phase.generate)}
    overrides.update(getattr(engine, "budget", {}) if opts.profile == "ci" else {})
    if opts.seed is not None:
        overrides["derandomize"] = False
    if opts.max_examples is not None:
        overrides["max_examples"] = opts.max_examples
    derandomized = overrides.get("derandomize", PROFILES[opts.profile].derandomize)
    if opts.database is not None:
        overrides["database"] = example_database(opts.database)
    elif opts.profile != "ci" and not derandomized:
        examples = opts.out_dir / ".hypothesis" / "examples"
        overrides["database"] = DirectoryBasedExampleDatabase(examples)
    else:
        overrides["database"] = None
    return settings(PROFILES[opts.profile], **overrides)


def example_database(url: str) -> Any:
    """The Hypothesis example database at ``url``, shared by every check that names it:
    ``redis://HOST:PORT/DB`` (or ``rediss://``, ``unix://``) is Hypothesis's
    ``RedisExampleDatabase`` (needs ``hypothesis[redis]``: ``pip install
    'kvfence[redis]'``), keyed under ``kvfence:``; anything else a folder
    (``DirectoryBasedExampleDatabase``; ``file://`` is stripped), e.g. on a shared mount.
    Fuzz workers on many machines pointed at one database replay each other's failures
    first (Hypothesis's ``reuse`` phase). ``ValueError`` when redis is named but the
    client library is missing. Opened lazily: an unreachable server is an adapter error
    of the run (ERROR), not a pass."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError:
            raise ValueError(
                f"{url!r} needs the redis client: pip install 'hypothesis[redis]'"
            ) from None
        return RedisExampleDatabase(redis.Redis.from_url(url), key_prefix=b"kvfence:")
    return DirectoryBasedExampleDatabase(url.removeprefix("file://"))


def check_database(url: str | None, profile: str, seed: int | None) -> None:
    """``ValueError`` when ``url`` is given for a derandomized run (``ci`` without a seed):
    it draws the same examples every run and keeps no database to share."""
    if url is not None and PROFILES[profile].derandomize and seed is None:
        raise ValueError(
            f"--database needs a profile that draws new examples (dev, fuzz), not {profile}"
        )


GC_YOUNGEST = 20_000
"""Allocations between two collections of the cyclic garbage collector's youngest
generation while a check runs (``fewer_collections``; Python's default is 700)."""


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """The cyclic garbage collector's youngest generation collected every ``GC_YOUNGEST``
    allocations while a check runs, then Python's thresholds back as they were. A check
    allocates millions of short-lived model values (states, outcomes, actions) and few
    cycles: at the default threshold the collector took about 15% of a ci check's CPU,
    most of it scanning values that were about to be freed anyway; the memory a check
    holds stays the same (the explorer turns the collector off for the same reason)."""
    before = gc.get_threshold()
    gc.set_threshold(GC_YOUNGEST, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


@contextlib.contextmanager
def _hypothesis_home(folder: Path) -> Iterator[None]:
    """Hypothesis's storage (``.hypothesis/``) under ``folder`` while a check runs, then
    back to where it was: a check leaves nothing in the working directory."""
    key = "__hypothesis_home_directory"
    before = vars(configuration).get(key)
    configuration.set_hypothesis_home_dir(folder / ".hypothesis")
    try:
        yield
    finally:
        configuration.set_hypothesis_home_dir(before)


@contextlib.contextmanager
def no_local_constants() -> Iterator[None]:
    """Hypothesis's draws without the literals of the modules imported so far, while a
    search runs; then back to how they were.

    Hypothesis (6.1xx, ``hypothesis/internal/conjecture/providers.py``
    ``_get_local_constants``) mixes into about one draw in twenty the constants it finds in
    every *local* module (outside site-packages and the standard library) loaded in the
    process when the draw is made. Which modules those are depends on the process: the CLI
    imports its report, a pytest run imports the test files, a pool worker only what its
    jobs needed. So the same derandomized ``ci`` search drew different examples in each,
    and a design's evidence (or a mutant's kill) could depend on where it ran. With no
    local constants the draw depends only on the seed. When the Hypothesis in use has no
    such function the guard does nothing; ``tests/test_runner.py`` then fails, so an upgrade
    that moves it is noticed."""
    from hypothesis.internal.conjecture import providers

    cache = getattr(providers, "CONSTANTS_CACHE", None)
    get = getattr(providers, "_get_local_constants", None)
    constants = getattr(providers, "Constants", None)
    if cache is None or get is None or constants is None:
        yield
        return
    none = constants()
    providers._get_local_constants = lambda: none
    cache.cache.clear()  # (choice kind, bounds) -> the constants they permit, local ones too
    try:
        yield
    finally:
        providers._get_local_constants = get
        cache.cache.clear()


def generate(engine: EngineAdapter, client: ClientAdapter, opts: Options) -> Search:
    """Phase 1: the client table (a check focused on a rule of ``TABLE_ONLY`` ends there),
    then the battery and Hypothesis's stateful search. Never raises for what
    the SUT does; the first adapter error (``Recorder.error``) is the one reported, so a
    hung call is named as a timeout, not as the non-determinism of Hypothesis's replay."""
    search = Search(Recorder(), [])
    if not opts.strict and opts.focus is None:
        search.recorder.tolerate = frozenset(r.id for r in RULES if r.level == "SHOULD")
    try:
        search.capabilities = check_capabilities(engine)
        search.reasons = missing_reasons(engine)
        if not is_program(client):
            search.table = client_table(client, search.recorder, opts.timeout)
            if opts.focus in TABLE_ONLY:
                return search  # the search never meets its shapes: it could show nothing
        elif not _program_table_last(opts):
            search.table = program_table(client, search.recorder, opts.timeout)
    except AdapterError as e:
        search.error = e
        return search
    machine = build_machine(engine, client, search.recorder, opts.bounds, opts.timeout, opts.focus)
    budget = _settings(engine, opts)
    if opts.battery:
        own = battery_budget(engine, opts)
        _battery(engine, client, search, opts, budget.max_examples if own is None else own)
        if search.error is not None or search.recorder.failure is not None:
            return search
        assert search.battery is not None
    if is_program(client) and _program_table_last(opts):
        try:
            search.table = program_table(client, search.recorder, opts.timeout, opts.focus)
        except AdapterError as e:
            search.error = e
            return search
        if any(v.rule == opts.focus for v in search.table):
            return search  # the focus is shown broken: a focused check judges nothing else
    if opts.battery:
        assert search.battery is not None
        if own is None:
            left = max(1, budget.max_examples - search.battery.ran - search.battery.failed)
            budget = settings(budget, max_examples=left)
    runs = _chunks(budget, opts.seed)
    for config, seed in runs:
        _search(machine, config, seed, search, opts)
        if search.error is not None or search.recorder.failure is not None:
            return search
    for config, seed in _top_ups(budget, opts.seed, len(runs)):
        if not _top_up_due(search, opts):
            break
        search.top_ups += 1
        _search(machine, config, seed, search, opts)
        if search.error is not None or search.recorder.failure is not None:
            break
    return search


def _program_table_last(opts: Options) -> bool:
    """A client program's table (``program_table``: about 780 one-sync runs, seconds) runs
    after the battery in a focused check, and stops at the focus rule's first violation:
    a focused check stops at its rule's first kill, and the battery (one scenario per
    example) shows most rules long before the table has run. Unfocused, the table runs
    first and whole, so every CLI rule is judged on every setup."""
    return opts.focus is not None and opts.battery


def battery_budget(engine: EngineAdapter, opts: Options) -> int | None:
    """The most battery scenarios a check starts on ``engine`` apart from its example
    budget: the adapter's ``battery_budget`` at the ``ci`` profile without
    ``--max-examples`` (a real engine's ``budget`` sizes its random search; the battery,
    which reaches the rules that search would not, is not cut to fit it), else ``None``:
    the battery's scenarios count against the example budget."""
    own = getattr(engine, "battery_budget", None)
    if opts.profile != "ci" or opts.max_examples is not None or own is None:
        return None
    return int(own)


def _battery(
    engine: EngineAdapter, client: ClientAdapter, search: Search, opts: Options, limit: int
) -> None:
    """The battery (``battery.run_battery``), at most ``limit`` scenarios, before the
    search; its outcome on ``search`` (an adapter error or a stop signal as ``error``)."""
    try:
        search.battery = run_battery(
            engine, client, load_battery(), search.recorder, opts.timeout, opts.focus, limit
        )
    except AdapterError as e:
        search.error = e
    except KeyboardInterrupt:
        search.error = AdapterError(RuleId.ADP_001, "stopped by a signal during the battery")
        STOPPED.set()
    if search.recorder.error is not None:
        search.error = search.recorder.error[1]


def _search(machine: Any, config: settings, seed: int | None, search: Search, opts: Options):
    """One Hypothesis run of ``machine`` under ``config`` (and ``seed``), its outcome
    recorded on ``search``: the recorder's failure, or ``search.error``."""
    test = get_state_machine_test(machine, settings=config)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    try:
        with _hypothesis_home(opts.out_dir), no_local_constants():
            test()
    except ConformanceFailure:
        pass
    except AdapterError as e:
        search.error = e
    except Flaky as e:
        search.error = AdapterError(RuleId.ADP_001, f"the SUT is not deterministic: {e}")
    except KeyboardInterrupt:  # a stop signal: what was recorded is kept, the run is ERROR
        search.error = AdapterError(RuleId.ADP_001, "stopped by a signal before the search ended")
        STOPPED.set()
    except BaseException as e:  # a SystemExit from the SUT is an error, not 'exit 0'
        search.error = AdapterError(RuleId.ADP_001, f"{type(e).__name__}: {e}")
    if search.recorder.error is not None:
        search.error = search.recorder.error[1]


STOPPED = threading.Event()
"""Set when a stop signal ended a search (``_search``): a caller running several checks
(the matrices) runs no more."""

TOP_UPS = 2
"""Extra searches an unfocused check runs while some rule is still unexercised."""


def _top_ups(config: settings, seed: int | None, after: int) -> list[tuple[settings, int | None]]:
    """The extra searches, each half the budget, with seeds of their own: fixed ones
    (``1``, ``2``) for a derandomized profile, so a ``ci`` check stays the same every run;
    ``seed`` plus the runs before for a seeded one; random ones otherwise."""
    n = max(1, config.max_examples // 2)
    fixed = config.derandomize and seed is None
    out = []
    for i in range(TOP_UPS):
        s = i + 1 if fixed else None if seed is None else seed + after + i
        out.append((settings(config, derandomize=False, max_examples=n), s))
    return out


def _top_up_due(search: Search, opts: Options) -> bool:
    """An unfocused search that found nothing left some rule UNKNOWN for want of evidence
    (never exercised): before saying so, it looks further (``_top_ups``). A rule that needs
    what the engine lacks is SKIP or N/A, never looked for here. The evidence a search
    draws depends on its examples; a correct system whose check passed or failed UNKNOWN by
    the luck of one derandomized draw is what this avoids."""
    rec = search.recorder
    if opts.focus is not None or rec.soft is not None or rec.set_aside is not None:
        return False
    rules, _ = judge(search, [], opts)
    return any(r.verdict is Verdict.UNKNOWN for r in rules)


CHUNK = 500
"""Examples per Hypothesis run in a random profile. Hypothesis keeps a tree of every choice
a run drew until the run ends; a fuzz budget split into runs of this size (each with its
own seed) keeps memory bounded by one chunk instead of growing with the budget (it grew
to about 1 GB over a 5,000-example fuzz run)."""


def _chunks(config: settings, seed: int | None) -> list[tuple[settings, int | None]]:
    """``config`` as runs of at most ``CHUNK`` examples; a derandomized run stays whole
    (its chunks would repeat the same examples)."""
    total = config.max_examples
    if config.derandomize or total <= CHUNK:
        return [(config, seed)]
    sizes = [min(CHUNK, total - start) for start in range(0, total, CHUNK)]
    return [
        (settings(config, max_examples=n), None if seed is None else seed + i)
        for i, n in enumerate(sizes)
    ]


def minimise(
    engine: EngineAdapter, client: ClientAdapter, search: Search, opts: Options
) -> tuple[Run | None, Replayed | None]:
    """Phase 2: the run that failed (or only broke a client rule), and its shrunk replay.
    Shrinks towards what stopped the run; towards the client's violation only when nothing
    else did, or when that is the rule a focused run is after."""
    rec = search.recorder
    found = rec.failure or (rec.soft if search.error is None else None)
    aside = found is None and search.error is None and rec.set_aside is not None
    if aside:
        # A focused run whose focus rule held, but an example it set aside broke another
        # rule: that is a FAIL, and its counterexample is that example's.
        found = rec.set_aside
    if found is None and search.error is None and rec.warned_run is not None:
        found = rec.warned_run  # only SHOULD rules broke: the WARN's counterexample
    if found is None:
        return (rec.error[0] if rec.error else None), None
    hard = bool(found.hard)
    targets = {v.rule for v in (found.hard or found.pending)}
    opts = attrs.evolve(opts, bounds=holding(opts.bounds, found.actions))
    if opts.focus is not None and not aside:
        hard = opts.focus not in {v.rule for v in found.pending}
        targets = {opts.focus}
    try:
        best = shrink(
            engine,
            client,
            found,
            targets or {"?"},
            hard,
            opts.bounds,
            opts.timeout,
            timing=rec.timing,
            contrast=reference_contrast(
                engine, client, {v.rule for v in (*found.hard, *found.pending)}
            ),
        )
    except AdapterError as e:
        search.error = search.error or e
        best = None
    return found, best


def _system(engine: EngineAdapter, client: ClientAdapter) -> dict[str, Any] | None:
    """The names the engine and client were built from (``registry.system``), if known."""
    out = dict(getattr(engine, "kvfence_system", None) or {})
    given = getattr(client, "kvfence_name", None)
    if isinstance(given, str):
        out["client"] = given
    return out or None


def write_counterexample(
    engine: EngineAdapter, client: ClientAdapter, run: Run, violations, search, opts: Options
) -> tuple[Path | None, str]:
    """Phase 3: the counterexample trace, under a name no other run can take (in
    ``out_dir``, whatever the adapters are called); the path, or a warning."""
    error = "" if search.error is None else str(search.error)
    head = header(
        engine.name,
        client.name,
        opts.seed,
        opts.profile,
        run.configs,
        run.policy,
        capabilities=search.capabilities,
        system=_system(engine, client),
    )
    stem = f"counterexample-{safe_name(engine.name)}-{safe_name(client.name)}"
    try:
        path = unique_path(opts.out_dir, stem)
        written = write_trace(path, head, run.steps, verdict_line(run.steps, violations, error))
    except OSError as e:
        return None, f"could not write the counterexample to {opts.out_dir}: {e}"
    timing = search.recorder.timing
    return written, _not_discriminating(engine, client, run, violations, opts, timing)


def _not_discriminating(
    engine: EngineAdapter,
    client: ClientAdapter,
    run: Run,
    violations,
    opts: Options,
    timing: Timing | None = None,
) -> str:
    """The counterexample replayed on the reference counterpart (``reference_contrast``:
    same configs and policy, the side its rules judge swapped for the reference): a
    warning in words if it breaks one of the same rules there too (then it does not show
    this system's fault), else ``""``."""
    rules = {v.rule for v in violations}
    contrast = reference_contrast(engine, client, rules)
    if contrast is None or not rules or not run.actions:
        return ""
    # The engine under test's calls count as its time (``timing``); kvfence's own reference
    # engine, when the contrast swaps it in, is the checker's.
    same = contrast[0] is engine
    try:
        r = replay_actions(
            *contrast,
            run.configs,
            run.policy,
            list(run.actions),
            None,
            opts.bounds,
            opts.timeout,
            timing=timing if same else None,
        )
    except AdapterError:
        return ""
    shared = sorted(str(v.rule) for v in (*r.hard, *r.soft) if v.rule in rules)
    if r.kind is not ReplayKind.FAIL or not shared:
        return ""
    names = f"{contrast[0].name} + {contrast[1].name}"
    return (
        f"the counterexample breaks {sorted(set(shared))} on {names} too: it does not show "
        "a fault of this system alone"
    )


def judge(search: Search, violations: list[Violation], opts: Options):
    """Phase 4: one verdict per rule, and the run's (worst first; an adapter error makes
    anything short of FAIL an ERROR)."""
    rules = _rule_verdicts(
        search.recorder,
        violations,
        search.error,
        search.capabilities,
        opts.strict,
        opts.focus,
        frozenset(v.rule for v in search.table if _is_refusal(v)),
        search.reasons,
    )
    unregistered = unregistered_rules(search.recorder)
    if unregistered:
        note = f"the checker cited rules the registry does not hold: {', '.join(unregistered)}"
        rules = tuple(
            RuleVerdict(r.rule, Verdict.ERROR, r.evidence, note) if r.rule.kind == "ADP" else r
            for r in rules
        )
    verdict = worst([r.verdict for r in rules])
    if (search.error is not None or unregistered) and verdict is not Verdict.FAIL:
        verdict = Verdict.ERROR
    return rules, verdict


def unregistered_rules(recorder: Recorder) -> list[str]:
    """Rule IDs the recorder holds evidence or violations of that are not in the registry:
    a bug in a check (never a rule of the contract), so the run is ERROR, never PASS."""
    cited = set(recorder.exercised) | recorder.reached | set(recorder.other)
    cited |= set(recorder.refused) | set(recorder.not_at_stake)
    return sorted(str(r) for r in cited if r not in BY_ID)


def _is_refusal(v: Violation) -> bool:
    """A client-table violation where the client raised instead of answering."""
    return isinstance(v.actual, str) and v.actual.startswith("resolve raised ")


def _collect(
    search: Search, shown: list[Violation], problem: str, focus: str | None
) -> tuple[list[Violation], list[str]]:
    """The result's violations: the counterexample's, then what only the client table or
    a refusal showed (a pure function's counterexample is its input); and the warnings."""
    table = [v for v in search.table if focus is None or v.rule == focus]
    rec = search.recorder
    more = table + list(rec.refused.values()) + list(rec.warned.values())
    violations = shown + _extra(shown, more)
    warnings = [problem] if problem else []
    warnings += sorted(search.recorder.notes)  # availability and off-policy notes
    other = sorted(set(search.recorder.other) - {v.rule for v in violations})
    if other:
        warnings.append(f"examples set aside by the focus on {focus} also broke {other}")
    return violations, warnings


def _extra(violations: list[Violation], more: list[Violation]) -> list[Violation]:
    """``more``'s first violation of each rule ``violations`` does not already break."""
    seen = {v.rule for v in violations}
    out = []
    for v in more:
        if v.rule not in seen:
            seen.add(v.rule)
            out.append(v)
    return out


def run_check(
    engine: EngineAdapter,
    client: ClientAdapter,
    profile: str = "ci",
    seed: int | None = None,
    out_dir: Path = Path("kvfence-results"),
    strict: bool = False,
    timeout: float = 60.0,
    bounds: Bounds = MACHINE_BOUNDS,
    max_examples: int | None = None,
    focus: str | None = None,
    isolate: bool = False,
    on_progress: Callable[[Any], None] | None = None,
    battery: bool = True,
    database: str | None = None,
) -> Result:
    """Run the stateful machine against ``engine`` + ``client``, shrink what fails, write
    the counterexample, and judge. ``focus``: a rule ID; search until that rule is shown
    broken (see ``Lockstep``); rules broken in the examples it sets aside are FAIL too.
    Never raises for what the SUT does (that is the verdict); ``KeyError`` for an unknown
    profile, ``ValueError`` for a ``focus`` that is not a rule ID.

    Hypothesis generates (derandomized under ``ci``); the first failing example is shrunk
    by ``replay.shrink`` on its action list, which is faster here than shrinking the choice
    sequence and yields the same JSONL record that ``kvfence replay`` reads.

    ``battery``: run the battery first (``battery.run_battery``). ``database``: a shared
    example database for a profile that draws new examples (``example_database``;
    ``ValueError`` for ``ci`` without a seed).

    ``isolate``: an in-process engine (``is_direct``) is checked in a child process
    (``isolate.run_isolated``), so that one which exits the process or hangs past SIGALRM
    gives ERROR, never a pass or a hang; ``on_progress`` then receives, in this process,
    what the check passes to ``isolate.notify`` in the child (the CLI's progress).
    """
    check_focus(focus)
    PROFILES[profile]  # KeyError before anything runs
    check_database(database, profile, seed)
    opts = Options(
        profile, seed, out_dir, strict, timeout, bounds, max_examples, focus, battery, database
    )
    if isolate and is_direct(engine):
        args = (engine, client, profile, seed, out_dir, strict, timeout, bounds, max_examples)
        return run_isolated(
            lambda: run_check(*args, focus=focus, battery=battery, database=database),
            lambda why: error_result(engine.name, client.name, profile, seed, why, strict),
            timeout,
            on_progress,
        )
    SIGNALLED.clear()  # a stop received before this check was for the one it ended
    started = time.perf_counter()
    fingerprint = check_fingerprint(profile, seed, strict, bounds, max_examples, focus, battery)
    with fewer_collections():
        search = generate(engine, client, opts)
        run, best = minimise(engine, client, search, opts)
    timing = search.recorder.timing
    try:
        call_with_timeout(engine.close, timeout, "close", is_direct(engine), timing)
    except AdapterError as e:
        search.error = search.error or e
    run = best.run if best is not None else run
    # The trace lists only violations of the steps it holds.
    shown = list(best.violations if best else run.violations if run else [])
    path, problem = None, ""
    if run is not None and (shown or search.error):
        path, problem = write_counterexample(engine, client, run, shown, search, opts)
    violations, warnings = _collect(search, shown, problem, focus)
    rec = search.recorder
    if path is not None and focus is not None and rec.failure is None and rec.set_aside:
        warnings.append(
            f"{focus} was not shown broken; the counterexample is an example the focus set "
            f"aside, which broke {sorted({v.rule for v in shown})}"
        )
    rules, verdict = judge(search, violations, opts)
    seconds = time.perf_counter() - started
    return Result(
        engine=engine.name,
        client=client.name,
        profile=profile,
        seed=seed,
        verdict=verdict,
        rules=rules,
        violations=tuple(violations),
        error="" if search.error is None else str(search.error),
        counterexample=path,
        steps=len(run.actions) if path is not None and run is not None else 0,
        examples=search.recorder.examples,
        seconds=seconds,
        warnings=tuple(warnings),
        timing=TimeSplit.of(seconds, search.recorder.timing),
        top_ups=search.top_ups,
        battery=search.battery,
        bounds=search.recorder.covered,
        engine_version=engine_version(engine),
        fingerprint=fingerprint,
    )


def check_fingerprint(
    profile: str = "ci",
    seed: int | None = None,
    strict: bool = False,
    bounds: Bounds = MACHINE_BOUNDS,
    max_examples: int | None = None,
    focus: str | None = None,
    battery: bool = True,
) -> str:
    """A digest of what a check's result depends on besides its engine and client: the
    source tree (``source_fingerprint``) and ``run_check``'s options that change what is
    drawn or how it is judged. Two checks of the same engine release and client with the
    same fingerprint compute the same result (``ci`` is derandomized); a report's
    ``fingerprint`` is read back by ``report.read_check_json``."""
    options = (profile, seed, strict, bounds, max_examples, focus, battery)
    text = f"{source_fingerprint()} {options!r}"
    return hashlib.sha256(text.encode()).hexdigest()


def engine_version(engine: EngineAdapter) -> str | None:
    """``engine``'s optional ``engine_version`` (``EngineAdapter``) when it is a string,
    else ``None``; an adapter whose attribute raises reports none."""
    try:
        version = getattr(engine, "engine_version", None)
    except Exception:  # a property of a broken adapter: the check's verdict stands
        return None
    return version if isinstance(version, str) else None


def error_result(
    engine: str, client: str, profile: str, seed: int | None, message: str, strict: bool
) -> Result:
    """An ERROR ``Result`` of a check that gave no result: every rule as an adapter error
    leaves it (``_rule_verdicts``), ``message`` its error."""
    error = AdapterError(RuleId.ADP_001, message)
    rules = _rule_verdicts(Recorder(), [], error, frozenset(), strict)
    return Result(
        engine=engine,
        client=client,
        profile=profile,
        seed=seed,
        verdict=Verdict.ERROR,
        rules=rules,
        violations=(),
        error=message,
        counterexample=None,
        steps=0,
        examples=0,
        seconds=0.0,
    )


__all__ = [
    "ORDER",
    "PROFILES",
    "REQUIRES",
    "Result",
    "RuleVerdict",
    "TimeSplit",
    "Verdict",
    "by_class",
    "check_fingerprint",
    "engine_version",
    "run_check",
]
