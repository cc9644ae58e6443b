"""The judge of a ``kvfence serve`` session: rule verdicts, the run's verdict, the session
trace and traffic log, and on FAIL the shrunk counterexample.

A rule the session's traffic never exercised is SKIP (serve judges only the calls it
received), except REACH-001: a session that never served a prompt cached before a weight
update is UNKNOWN, never PASS (the stale-reuse question was never asked; ``--probe N``
asks it after every sync); an adapter error is ERROR.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import evolve

from ...adapters import registry
from ...adapters.clients import ReferenceClient
from ...model.rules import RuleId
from ..runner import Result, RuleVerdict, _rule_verdicts
from ..trace import header, safe_name, unique_path, write_trace
from ..verdict import Verdict, worst

if TYPE_CHECKING:
    from .session import Session


REACH_WHY = (
    "the session never served a prompt cached before a weight update (REACH-001): stale "
    "reuse could not have shown; re-send an earlier prompt after a sync, or serve with "
    "--probe N"
)
"""Why a session that never reached reuse after an update is UNKNOWN."""


def rule_verdicts(s: Session) -> tuple[tuple[RuleVerdict, ...], Verdict, str]:
    """Rule verdicts of the session, the run's verdict, and why it is not PASS when the
    stale-reuse question was never asked (REACH-001 unreached: UNKNOWN, never PASS)."""
    rules = _rule_verdicts(s.recorder, s.violations, s.error, s.capabilities, s.strict)
    out = []
    for rv in rules:
        if rv.rule.id == RuleId.REACH_001 and rv.verdict is Verdict.UNKNOWN:
            rv = evolve(rv, reason=REACH_WHY)
        elif rv.verdict is Verdict.UNKNOWN and rv.evidence == 0 and rv.rule.kind != "ADP":
            rv = evolve(rv, verdict=Verdict.SKIP, reason=skip_reason(rv.rule.id))
        out.append(rv)
    verdict = worst([r.verdict for r in out])
    why = ""
    if s.error is not None and verdict is not Verdict.FAIL:
        verdict = Verdict.ERROR
    elif verdict is Verdict.UNKNOWN:
        why = REACH_WHY
    return tuple(out), verdict, why


SKIP_REASONS: dict[str, str] = {
    RuleId.CLI_010: "no reset was refused in this session (serve --refuse-resets N draws refusals)",
}
"""Why a rule a session never exercised is SKIP, where more can be said than the default."""


def skip_reason(rule: str) -> str:
    """Why ``rule`` is SKIP in a session that never exercised it."""
    return SKIP_REASONS.get(rule, "not exercised by this session")


def result(s: Session, write: bool = False) -> Result:
    """The session's ``Result`` (as ``check`` prints it); with ``write``, the trace and (on
    FAIL) the counterexample are written under ``s.out_dir``."""
    rules, verdict, why = rule_verdicts(s)
    warnings = [why] if why else []
    pending = sorted({e["pending"] for e in s.traffic if "pending" in e})
    if pending:
        warnings.append(f"routes not judged, waiting for model actions: {', '.join(pending)}")
    if write:
        try:
            write_session(s, verdict)
        except OSError as e:
            warnings.append(f"could not write the session trace to {s.out_dir}: {e}")
    return Result(
        engine=s.engine_name,
        client=f"serve:{s.api}",
        profile="serve",
        seed=None,
        verdict=verdict,
        rules=rules,
        violations=tuple(s.violations),
        error="" if s.error is None else str(s.error),
        counterexample=s.counterexample,
        steps=len(s.lockstep.actions),
        examples=1,
        seconds=time.monotonic() - s.started,
        warnings=tuple(warnings),
    )


def session_header(s: Session) -> dict[str, Any]:
    """The trace header of the session."""
    comment = f"kvfence serve --api {s.api}: the session's requests, in order"
    if s.pd:
        comment += " (a prefill/decode pair: endpoint 0 prefill, endpoint 1 decode)"
    elif s.configs[0].ranks > 1:
        comment += f" ({s.configs[0].ranks} data-parallel ranks)"
    return header(
        s.engine_name,
        "reference",
        None,
        "serve",
        s.configs,
        s.policy,
        comment=comment,
        capabilities=s.capabilities,
        # a real engine built with options (sglang --ranks N) is built so again on replay
        system=registry.system(s.engine_name, s.engine_options) if s.engine_options else None,
    )


def write_session(s: Session, verdict: Verdict) -> None:
    """The session trace (every judged step, replayable by ``kvfence replay``), the traffic
    log, and on FAIL the counterexample: the trace shrunk on a fresh engine."""
    head = session_header(s)
    if s.violations:
        from ..trace import violation_json

        last = s.lockstep.steps[-1].step if s.lockstep.steps else 0
        line = {
            "verdict": "FAIL",
            "step": last,
            "violations": [violation_json(v) for v in s.violations],
        }
    elif s.error is not None:
        line = {"verdict": "ERROR", "error": str(s.error)}
    else:
        line = {"verdict": verdict.value}
    stem = f"serve-{safe_name(s.engine_name)}-{s.api}"
    if s.trace_path is None:
        s.trace_path = unique_path(s.out_dir, stem)
    write_trace(s.trace_path, head, s.lockstep.steps, line)
    log = s.trace_path.with_suffix(".traffic.json")
    logged: dict[str, Any] = {"versions": s.all_weights[0].sources}
    if len(s.all_weights) > 1:  # a P/D pair: each server's own
        logged["versions_by_role"] = {s.role(i): w.sources for i, w in enumerate(s.all_weights)}
    log.write_text(json.dumps({**logged, "traffic": s.traffic}, indent=1))
    if s.violations and s.counterexample is None:
        s.counterexample = shrunk(s, head)


def shrunk(s: Session, head: dict[str, Any]) -> Path | None:
    """The failing session shrunk (``replay.shrink``) on a fresh engine of the same name,
    written as ``counterexample-*.jsonl``; ``None`` when it does not reproduce."""
    from ..replay import shrink
    from ..trace import verdict_line
    from .session import SESSION_BOUNDS

    engine = registry.engine(s.engine_name, **s.engine_options)
    try:
        run = s.lockstep.snapshot(s.violations)
        targets = {v.rule for v in s.violations}
        # A session broken only by the trainer's calls (CLI rules: recorded, the run goes
        # on) is shrunk on those; one the engine's answer stopped, on that answer's rules.
        hard = any(not v.rule.startswith("CLI-") for v in s.violations)
        best = shrink(
            engine, ReferenceClient(), run, targets, hard, SESSION_BOUNDS, s.timeout, calls=True
        )
    finally:
        engine.close()
    if best is None:
        return None
    stem = f"counterexample-{safe_name(s.engine_name)}-serve-{s.api}"
    path = unique_path(s.out_dir, stem)
    return write_trace(path, head, best.run.steps, verdict_line(best.run.steps, best.violations))


def verdict_json(s: Session, res: Result) -> dict[str, Any]:
    """``GET /kvfence/verdict``'s body: the JSON report of ``res`` with its exit code,
    warnings and the session trace's path."""
    from ..report import result_json

    out = result_json(res)
    out["exit_code"] = res.exit_code
    out["warnings"] = list(res.warnings)
    out["trace"] = None if s.trace_path is None else str(s.trace_path)
    return out
