"""Speed and memory figures for kvfence (printed, never asserted in tests).

    .venv/bin/python scripts/bench.py

Targets (from the issues): a ci-profile check of the reference under 60 s; the reference
plus every mutant under 2 minutes; the explorer's default bounds under 60 s."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from kvfence.adapters import registry
from kvfence.conformance.runner import run_check
from kvfence.model.explore import explore, initial_states
from kvfence.model.state import Bounds


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    with TemporaryDirectory() as tmp:
        out = Path(tmp)
        t = time.monotonic()
        r = run_check(registry.engine("reference"), registry.client("reference"), out_dir=out)
        print(
            f"check reference (ci): {r.verdict}, {r.examples} examples, "
            f"{time.monotonic() - t:.1f} s (target < 60 s)"
        )
        t = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "kvfence.conformance.cli", "mutants", "--out", tmp],
            capture_output=True,
            text=True,
        )
        verdict = "all killed" if proc.returncode == 0 else f"exit {proc.returncode}"
        print(
            f"kill matrix (ci, parallel): {verdict}, {time.monotonic() - t:.1f} s (target < 120 s)"
        )
    for depth in (4, 6):
        state = initial_states(2)[0]
        t = time.monotonic()
        e = explore(state, Bounds(prefixes=("P",), rids=("r1",)), depth)
        dt = time.monotonic() - t
        print(
            f"explore depth {depth}: {e.states:,} states, {e.transitions:,} transitions, "
            f"{dt:.1f} s ({e.states / dt:,.0f} states/s)"
        )
    print(f"peak memory of this process: {peak_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
