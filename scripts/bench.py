"""Speed and memory figures for kvfence (printed, never asserted in tests).

    .venv/bin/python scripts/bench.py

Targets (from the issues): a ci-profile check of the reference under 60 s; the reference
plus every mutant under 2 minutes; the explorer's default bounds under 60 s."""

from __future__ import annotations

import os
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


def rss_mib() -> float:
    """Resident memory now (Linux ``/proc``; the peak elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except OSError:
        return peak_mib()
    return pages * resource.getpagesize() / 2**20


def fuzz_memory(out: Path, examples: int) -> None:
    """Issue 8 R-1: the fuzz profile's memory grew with its budget (about 6 MB/s, up to
    about 1 GB). Runs ``examples`` fuzz examples of the reference (in chunks of
    ``CHUNK``) and prints resident memory before, after half, and at the end."""
    from kvfence.conformance.runner import CHUNK

    before = rss_mib()
    t = time.monotonic()
    half = run_check(
        registry.engine("reference"),
        registry.client("reference"),
        profile="fuzz",
        seed=1,
        out_dir=out,
        max_examples=examples // 2,
    )
    mid = rss_mib()
    r = run_check(
        registry.engine("reference"),
        registry.client("reference"),
        profile="fuzz",
        seed=2,
        out_dir=out,
        max_examples=examples,
    )
    print(
        f"fuzz memory: {half.examples} then {r.examples} examples (chunks of {CHUNK}): "
        f"resident {before:.0f} -> {mid:.0f} -> {rss_mib():.0f} MiB, "
        f"{time.monotonic() - t:.0f} s (bounded: a chunk's Hypothesis data plus the model's "
        "enabled-action cache, at most 65,536 states)"
    )


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
        examples = int(os.environ.get("KVFENCE_BENCH_FUZZ_EXAMPLES", "1000"))
        fuzz_memory(out, examples)
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
