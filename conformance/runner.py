"""Run the conformance machine against one SUT and turn what it saw into verdicts.

Verdicts, worst first: FAIL (a rule broken), ERROR (the SUT or adapter could not answer),
UNKNOWN (a rule or scenario never exercised), PASS, SKIP (the adapter cannot observe the
rule's evidence, with the reason). The run's verdict is the worst over its rules; SKIP never
decides it. A SHOULD rule's FAIL counts only with ``strict``; otherwise it shows as WARN.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from attrs import frozen
from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Flaky
from hypothesis.stateful import get_state_machine_test
from kvfence.adapters.protocol import ClientAdapter, EngineAdapter
from kvfence.model.capabilities import EVIDENCE
from kvfence.model.checks import Violation, unknown_reason
from kvfence.model.rules import RULES, Rule
from kvfence.model.state import Bounds

from .lockstep import (
    MACHINE_BOUNDS,
    AdapterError,
    ConformanceFailure,
    Recorder,
    call_with_timeout,
    check_capabilities,
    client_table,
)
from .machine import build_machine
from .replay import shrink
from .trace import header, violation_json, write_trace

ORDER = ("FAIL", "ERROR", "UNKNOWN", "WARN", "PASS", "SKIP")

PROFILES: dict[str, settings] = {
    "ci": settings(
        max_examples=600,
        stateful_step_count=15,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        print_blob=False,
        verbosity=Verbosity.quiet,
    ),
    "dev": settings(
        max_examples=400,
        stateful_step_count=40,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        print_blob=False,
        verbosity=Verbosity.quiet,
    ),
    "fuzz": settings(
        max_examples=5000,
        stateful_step_count=80,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        print_blob=False,
        verbosity=Verbosity.quiet,
    ),
}
"""Named budgets. ``ci`` is derandomized (the same examples every run); ``dev`` and
``fuzz`` are random unless ``seed`` is given. These are kvfence's own profiles and do not
depend on Hypothesis's profile registry (which loads its own ``ci`` when ``CI`` is set)."""

REQUIRES: dict[str, tuple[str, ...]] = {
    rule: tuple(c.value for c in caps) for rule, caps in EVIDENCE.items()
}
"""Capabilities (and config features) a rule's evidence needs; without them it is SKIP."""


@frozen
class RuleVerdict:
    rule: Rule
    verdict: str
    evidence: int
    reason: str = ""


@frozen
class Result:
    """One check. ``verdict``: the run's verdict. ``rules``: one ``RuleVerdict`` per rule.
    ``violations``: what failed (rule, expected, actual). ``counterexample``: JSONL path.
    ``steps``: top-level steps in the counterexample. ``seconds``: wall time."""

    engine: str
    client: str
    profile: str
    seed: int | None
    verdict: str
    rules: tuple[RuleVerdict, ...]
    violations: tuple[Violation, ...]
    error: str
    counterexample: Path | None
    steps: int
    examples: int
    seconds: float
    warnings: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return {"PASS": 0, "WARN": 0, "FAIL": 1}.get(self.verdict, 2)

    def caught(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v.rule for v in self.violations))


def _worst(verdicts: list[str]) -> str:
    present = [v for v in verdicts if v != "SKIP"] or ["UNKNOWN"]
    return min(present, key=ORDER.index)


def _rule_verdicts(
    recorder: Recorder,
    violations: list[Violation],
    error: AdapterError | None,
    capabilities: frozenset[str],
    strict: bool,
) -> tuple[RuleVerdict, ...]:
    broken = {v.rule for v in violations}
    have = capabilities if isinstance(capabilities, (set, frozenset)) else frozenset()
    out = []
    for r in RULES:
        n = recorder.exercised[r.id] + (1 if r.id in recorder.reached else 0)
        missing = [c for c in REQUIRES.get(r.id, ()) if c not in have]
        if r.id in broken:
            verdict = "FAIL" if r.level == "MUST" or strict else "WARN"
            out.append(RuleVerdict(r, verdict, n, "violated"))
        elif error is not None and r.id == error.rule:
            out.append(RuleVerdict(r, "ERROR", n, str(error)))
        elif missing and n == 0:
            out.append(RuleVerdict(r, "SKIP", 0, f"needs {', '.join(missing)}"))
        elif n > 0:
            out.append(RuleVerdict(r, "PASS", n))
        elif r.kind == "ADP" and error is None:
            out.append(RuleVerdict(r, "PASS", recorder.steps, "every call answered"))
        elif r.kind == "ADP":
            out.append(RuleVerdict(r, "UNKNOWN", 0, "the run ended on an adapter error"))
        elif error is not None or violations:
            out.append(RuleVerdict(r, "UNKNOWN", 0, "run stopped before it was exercised"))
        else:
            reason = f"never exercised: {unknown_reason(r.id)}; raise the budget"
            out.append(RuleVerdict(r, "UNKNOWN", 0, reason))
    return tuple(out)


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
) -> Result:
    """Run the stateful machine against ``engine`` + ``client``, shrink what fails, and
    judge. ``focus``: search until that rule is shown broken (see ``Lockstep``). Never
    raises for what the SUT does (that is the verdict); ``KeyError`` for an unknown
    profile.

    Hypothesis generates (derandomized under ``ci``); the first failing example is shrunk
    by ``replay.shrink`` on its action list, which is faster here than shrinking the choice
    sequence and yields the same JSONL record that ``kvfence replay`` reads.
    """
    overrides: dict[str, Any] = {"phases": (Phase.explicit, Phase.reuse, Phase.generate)}
    budget = getattr(engine, "budget", {}) if profile == "ci" else {}
    overrides.update(budget)
    if seed is not None:
        overrides["derandomize"] = False
    if max_examples is not None:
        overrides["max_examples"] = max_examples
    config = settings(PROFILES[profile], **overrides)
    recorder = Recorder()
    machine = build_machine(engine, client, recorder, bounds, timeout, focus)
    test = get_state_machine_test(machine, settings=config)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    started = time.monotonic()
    error: AdapterError | None = None
    table: list[Violation] = []
    try:
        check_capabilities(engine)
        table = client_table(client, recorder, timeout)
    except AdapterError as e:
        error = e
    try:
        if error is None:
            test()
    except ConformanceFailure:
        pass
    except AdapterError as e:
        error = e
    except Flaky as e:
        error = AdapterError("ADP-001", f"the SUT is not deterministic: {e}")
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # a SystemExit from the SUT is an error, not 'exit 0'
        error = AdapterError("ADP-001", f"{type(e).__name__}: {e}")
    found = recorder.failure or (recorder.soft if error is None else None)
    best = None
    if found is not None:
        # Shrink towards what stopped the run; towards the client's violation only when
        # nothing else did, or when that is the rule a focused run is after.
        hard = bool(found.hard)
        targets = {v.rule for v in (found.hard or found.pending)}
        if focus is not None:
            hard = focus not in {v.rule for v in found.pending}
            targets = {focus}
        try:
            best = shrink(engine, client, found, targets or {"?"}, hard, bounds, timeout)
        except AdapterError as e:
            error = error or e
    try:
        call_with_timeout(engine.close, timeout, "close")
    except AdapterError as e:
        error = error or e
    seconds = time.monotonic() - started
    violations: list[Violation] = []
    warnings: list[str] = []
    path = None
    steps = 0
    if focus is not None:
        table = [v for v in table if v.rule == focus]
    run = None
    if best is not None:
        violations, run = list(best.violations), best.run
    elif found is not None:
        violations, run = list(found.violations), found
    elif recorder.error is not None:
        run = recorder.error[0]
    # What only the client table saw: a pure function's counterexample is its input.
    seen_rules = {v.rule for v in violations}
    extra = [v for v in table if v.rule not in seen_rules]
    violations += [v for i, v in enumerate(extra) if v.rule not in {x.rule for x in extra[:i]}]
    if run is not None and (violations or error):
        head = header(engine.name, client.name, seed, profile, run.configs, run.policy)
        if violations:
            last = {"verdict": "FAIL", "step": run.lines[-1]["step"] if run.lines else 0}
            last["violations"] = [violation_json(v) for v in violations]
        else:
            last = {"verdict": "ERROR", "error": str(error)}
        path = out_dir / f"counterexample-{engine.name}-{client.name}.jsonl"
        try:
            write_trace(path, head, run.lines, last)
        except OSError as e:
            warnings.append(f"could not write the counterexample to {path}: {e}")
            path = None
        steps = len(run.actions)
    warnings += sorted(recorder.notes)  # availability and off-policy notes: no violation
    other = sorted(recorder.other - {v.rule for v in violations})
    if other:
        warnings.append(f"examples set aside by the focus on {focus} also broke {other}")
    rules = _rule_verdicts(recorder, violations, error, engine.capabilities, strict)
    verdict = _worst([r.verdict for r in rules])
    if error is not None and verdict != "FAIL":
        verdict = "ERROR"
    return Result(
        engine=engine.name,
        client=client.name,
        profile=profile,
        seed=seed,
        verdict=verdict,
        rules=rules,
        violations=tuple(violations),
        error="" if error is None else str(error),
        counterexample=path,
        steps=steps,
        examples=recorder.examples,
        seconds=seconds,
        warnings=tuple(warnings),
    )
