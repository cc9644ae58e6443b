"""Budget sensitivity: does a verdict depend on the luck of the draw?

For each mutant: the examples its focused ci check (battery, then the stateful search, as
``kvfence check --focus RULE`` runs it; no breadth-first kill) needed to kill it, over
``--seeds`` seeds (min / median / max, and how many seeds killed it). For each correct
design: the verdict of a plain check at ``--times`` times the ci budget.

    .venv/bin/python scripts/budget.py --only never-flush always-flushes
    .venv/bin/python scripts/budget.py --seeds 10 --times 10 --json budget.json

CPU-heavy (every mutant times every seed, every design at 10x): CI does not run it; run it
on the entries you change, or whole on an idle machine. ``--no-battery`` measures the
random search alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kvfence.adapters import registry
from kvfence.conformance.matrix import FOCUSED_EXAMPLES, killed, passed, select
from kvfence.conformance.runner import PROFILES, run_check


def _systems(side: str, name: str, engine: str = "reference") -> tuple[str, str]:
    return (name, "reference") if side == "engine" else (engine, name)


def mutant_row(m, seeds: int, battery: bool, out: Path) -> dict:
    """Examples to kill ``m`` at the focused ci budget, one check per seed 1..``seeds``."""
    engine, client = _systems(m.side, m.name, m.engine)
    counts, started = [], time.monotonic()
    for seed in range(1, seeds + 1):
        r = run_check(
            registry.engine(engine),
            registry.client(client),
            profile="ci",
            seed=seed,
            out_dir=out,
            strict=True,
            max_examples=FOCUSED_EXAMPLES["ci"],
            focus=m.rule,
            battery=battery,
        )
        counts.append(r.examples if killed(m, r) else None)
    got = [c for c in counts if c is not None]
    return {
        "kind": "mutant",
        "name": m.name,
        "rule": m.rule,
        "killed": len(got),
        "seeds": seeds,
        "min": min(got, default=None),
        "median": statistics.median(got) if got else None,
        "max": max(got, default=None),
        "seconds": round(time.monotonic() - started, 1),
    }


def design_row(d, times: int, battery: bool, out: Path) -> dict:
    """The plain check of ``d`` at ``times`` times the ci budget."""
    engine, client = _systems(d.side, d.name)
    started = time.monotonic()
    r = run_check(
        registry.engine(engine),
        registry.client(client),
        profile="ci",
        out_dir=out,
        max_examples=times * PROFILES["ci"].max_examples,
        battery=battery,
    )
    return {
        "kind": "design",
        "name": d.name,
        "verdict": r.verdict.value,
        "passed": passed(r),
        "examples": r.examples,
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="only these designs or mutants")
    p.add_argument("--seeds", type=int, default=10, help="seeds per mutant (default 10)")
    p.add_argument("--times", type=int, default=10, help="designs at N x the ci budget")
    p.add_argument("--no-battery", dest="battery", action="store_false")
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    designs, mutants, unknown = select(args.only)
    if unknown:
        print(f"unknown: {', '.join(unknown)}", file=sys.stderr)
        return 3
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvfence-budget-") as tmp:
        out = Path(tmp)
        for m in mutants:
            row = mutant_row(m, args.seeds, args.battery, out)
            rows.append(row)
            print(
                f"mutant {row['name']:45} {row['rule']:8} killed {row['killed']}/{row['seeds']}"
                f"  examples min {row['min']} median {row['median']} max {row['max']}"
                f"  ({row['seconds']} s)",
                flush=True,
            )
        for d in designs:
            row = design_row(d, args.times, args.battery, out)
            rows.append(row)
            print(
                f"design {row['name']:45} {row['verdict']:8} at {args.times}x ci"
                f"  ({row['examples']} examples, {row['seconds']} s)",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    bad = [r for r in rows if (r["kind"] == "mutant" and r["killed"] < r["seeds"])]
    bad += [r for r in rows if r["kind"] == "design" and not r["passed"]]
    print(f"{'OK' if not bad else 'NOT OK'}: {len(rows) - len(bad)}/{len(rows)} meet the target")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
