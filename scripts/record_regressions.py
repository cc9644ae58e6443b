"""Record tests/regressions/*.jsonl: every public fault case replayed against its mutant.

Run after an intended spec change: python scripts/record_regressions.py  (then read the
diff). Each file starts with comment lines saying what it shows and where it came from."""

from __future__ import annotations

import sys
from pathlib import Path

from kvfence.adapters import registry
from kvfence.adapters.cases import CASES
from kvfence.adapters.mutants import BY_NAME
from kvfence.conformance.replay import replay_actions
from kvfence.conformance.trace import header, violation_json, write_trace

ROOT = Path(__file__).resolve().parents[1]


def record(out_dir: Path) -> list[Path]:
    written = []
    for case in CASES:
        mutant = BY_NAME[case.mutant]
        engine = mutant.name if mutant.side == "engine" else "reference"
        client = mutant.name if mutant.side == "client" else "reference"
        r = replay_actions(
            registry.engine(engine),
            registry.client(client),
            case.configs,
            case.policy,
            list(case.actions),
        )
        if r.kind != "FAIL" or case.rule not in {v.rule for v in r.violations}:
            raise SystemExit(f"{case.id}: expected FAIL with {case.rule}, got {r.kind}")
        head = header(engine, client, None, "case", case.configs, case.policy)
        last = {"verdict": "FAIL", "step": r.run.lines[-1]["step"]}
        last["violations"] = [violation_json(v) for v in r.violations]
        path = out_dir / f"{case.id}-{case.mutant}.jsonl"
        write_trace(path, head, r.run.lines, last)
        comment = [
            f"# {case.id}: {case.title}",
            f"# Source: {case.source}. Mutant: {case.mutant}. Rule: {case.rule}.",
            "# Recorded by scripts/record_regressions.py from adapters/cases.py.",
        ]
        path.write_text("\n".join(comment) + "\n" + path.read_text())
        written.append(path)
    return written


if __name__ == "__main__":
    for p in record(ROOT / "tests" / "regressions"):
        print(f"wrote {p.relative_to(ROOT)}")
    sys.exit(0)
