"""Speed and memory figures for kvfence, each as a ratio against the last baseline (issue 12).

    .venv/bin/python scripts/bench.py                    # every figure, ratios vs the baseline
    .venv/bin/python scripts/bench.py --update-baseline  # ... and write them as the new baseline
    .venv/bin/python scripts/bench.py --quick            # tiny bounds (the smoke test's)

Each figure runs in its own process (``--one NAME``), so its peak memory is its own. The
baseline is ``scripts/bench-baseline.json`` (figures of the commit that wrote it). Ratios are
"new / old" for rates (higher is better) and "old / new" for times and memory (higher is
better too), so a ratio above 1 is always a gain. The machine may be shared: measure the
baseline and the change back to back, and read small ratios with care; the ``per_cpu_s``
rates (this process's CPU time) move less with the load than the wall-clock ones.

Figures (issue 12, item 5):

* ``explore-d4``, ``explore-d6``: the model explorer on ``kvfence explore``'s defaults (two
  endpoints, exact + standard lane; one prefix, one request ID, versions 2) to depth 4 and
  6: states/s, transitions/s.
* ``explore-60s``: the deepest depth of the same search finished within 60 s.
* ``product``: the product explorer (model x the in-process reference, every setup) to
  depth 3: transitions/s.
* ``check-ci``: a ci-profile ``kvfence check`` of the reference: examples/s.
* ``kill``: the kill matrix (every mutant, focused on its rule, on every core): wall time
  and the slowest single time-to-kill.
* ``vllm``: one ci-profile ``kvfence check --engine vllm --client reference`` (only where
  vLLM is installed): wall, engine, client and checker seconds from the run's own account
  (``Result.timing``) and ``checker_fraction``, the share of the wall time that is
  kvfence's own, with the 1-minute load average it ran under.

Targets (issues 8 and 12): the explorer's default bounds under 60 s; two more levels of
depth in the same time; product-explorer throughput 10 times main's (64ceba3); every mutant
killed in under 1 s on 2 cores; checker overhead under 10% of a vLLM check.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

BASELINE = Path(__file__).with_name("bench-baseline.json")
"""The previous figures (``--update-baseline`` writes them)."""

HIGHER_IS_BETTER = {
    "states_per_s",
    "transitions_per_s",
    "examples_per_s",
    "transitions_per_cpu_s",
    "examples_per_cpu_s",
    "depth",
}
"""Rates and depth; every other figure (seconds, MiB, fractions) is better lower."""


def peak_mib() -> float:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _explore(depth: int, quick: bool) -> dict[str, float]:
    from kvfence.model.explore import explore, initial_states
    from kvfence.model.state import Bounds

    bounds = Bounds(prefixes=("P",), rids=("r1",), versions=2)
    t, c = time.perf_counter(), time.process_time()
    x = explore(initial_states(2), bounds, 2 if quick else depth)
    dt, cpu = time.perf_counter() - t, time.process_time() - c
    return {
        "depth": x.depth_reached,
        "states": x.states,
        "transitions": x.transitions,
        "seconds": dt,
        "states_per_s": x.states / dt,
        "transitions_per_s": x.transitions / dt,
        "transitions_per_cpu_s": x.transitions / cpu,
    }


def explore_60s(quick: bool) -> dict[str, float]:
    """Deepest depth finished in the budget: one breadth-first search with a deadline,
    stopped between levels (``explore``'s ``stop`` hook) or, on a tree without it, by
    deepening one level at a time (each run timed alone)."""
    import inspect

    from kvfence.model.explore import explore, initial_states
    from kvfence.model.state import Bounds

    budget = 2.0 if quick else 60.0
    bounds = Bounds(prefixes=("P",), rids=("r1",), versions=2)
    t = time.perf_counter()
    if "stop" in inspect.signature(explore).parameters:
        done: list[tuple[int, float]] = []

        def stop(level: int) -> bool:
            spent = time.perf_counter() - t
            if spent <= budget:
                done.append((level, spent))
            return spent > budget

        explore(initial_states(2), bounds, 99, stop=stop)
        depth, seconds = done[-1] if done else (0, 0.0)
        return {"depth": depth, "seconds": seconds}
    depth, seconds = 0, 0.0
    for d in range(1, 99):
        t = time.perf_counter()
        explore(initial_states(2), bounds, d)
        dt = time.perf_counter() - t
        if dt > budget:
            break
        depth, seconds = d, dt
    return {"depth": depth, "seconds": seconds}


def product(quick: bool) -> dict[str, float]:
    from kvfence.adapters import registry
    from kvfence.conformance.explore import explore_adapter

    t, c = time.perf_counter(), time.process_time()
    x = explore_adapter(
        registry.engine("reference"),
        registry.client("reference"),
        depth=2 if quick else 3,
        out_dir=None,
    )
    dt, cpu = time.perf_counter() - t, time.process_time() - c
    assert x.error == "" and x.violation == (), x
    return {
        "states": x.states,
        "transitions": x.transitions,
        "seconds": dt,
        "transitions_per_s": x.transitions / dt,
        "transitions_per_cpu_s": x.transitions / cpu,
    }


def check_ci(quick: bool) -> dict[str, float]:
    from kvfence.adapters import registry
    from kvfence.conformance.runner import run_check

    with TemporaryDirectory() as tmp:
        t, c = time.perf_counter(), time.process_time()
        r = run_check(
            registry.engine("reference"),
            registry.client("reference"),
            out_dir=Path(tmp),
            max_examples=20 if quick else None,
        )
        dt, cpu = time.perf_counter() - t, time.process_time() - c
    assert str(r.verdict) == "PASS", r.verdict
    return {
        "examples": r.examples,
        "seconds": dt,
        "examples_per_s": r.examples / dt,
        "examples_per_cpu_s": r.examples / cpu,
    }


def kill(quick: bool) -> dict[str, float]:
    from kvfence.adapters.mutants import MUTANTS
    from kvfence.conformance.matrix import killed, run_matrices

    mutants = MUTANTS[:2] if quick else MUTANTS
    with TemporaryDirectory() as tmp:
        x = run_matrices(designs=(), mutants=mutants, out=Path(tmp), jobs=2)
    survived = [m.name for m, r in x.mutants if not killed(m, r)]
    assert not survived, survived
    slowest, name = max((r.seconds, m.name) for m, r in x.mutants)
    return {
        "mutants": len(x.mutants),
        "seconds": x.seconds,
        "slowest_kill_seconds": slowest,
        "slowest_mutant": name,
        # the children's peak, not this process's (``main`` reads RUSAGE_CHILDREN for it)
        "worker_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def vllm(quick: bool) -> dict[str, float | str]:
    """One ci-profile check of ``--engine vllm --client reference`` (the first check
    ``scripts/check-vllm.sh`` runs, with its 300 s call timeout), split by the run's own
    account (``Result.timing``): wall, engine (start-up and model loading included),
    client and checker seconds, and the checker's fraction of the wall time (target: under
    0.10). Not under ``--quick`` (the smoke test's): starting vLLM alone takes longer
    than every other quick figure together. vLLM's log goes to a temporary folder."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return {"note": "not measured: vLLM not installed"}
    if quick:
        return {"note": "not measured under --quick: a vLLM check loads a model"}
    from kvfence.adapters import registry
    from kvfence.conformance.runner import run_check

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    with TemporaryDirectory() as tmp:
        r = run_check(
            registry.engine("vllm", log_dir=Path(tmp)),
            registry.client("reference"),
            out_dir=Path(tmp),
            timeout=300.0,
        )
    t = r.timing
    assert t is not None and t.engine_calls > 0, "the check made no engine call"
    return {
        "verdict": str(r.verdict),
        "examples": r.examples,
        "engine_calls": t.engine_calls,
        "wall_seconds": t.wall_seconds,
        "engine_seconds": t.engine_seconds,
        "client_seconds": t.client_seconds,
        "checker_seconds": t.checker_seconds,
        "checker_fraction": t.checker_fraction,
        "load_average_1m": os.getloadavg()[0],
    }


FIGURES = {
    "explore-d4": lambda q: _explore(4, q),
    "explore-d6": lambda q: _explore(6, q),
    "explore-60s": explore_60s,
    "product": product,
    "check-ci": check_ci,
    "kill": kill,
    "vllm": vllm,
}


def one(name: str, quick: bool) -> None:
    """Child mode: measure ``name`` and print it as JSON with this process's peak memory."""
    got = FIGURES[name](quick)
    got["peak_mib"] = peak_mib()
    print(json.dumps(got))


def run_child(name: str, quick: bool) -> dict[str, float | str]:
    cmd = [sys.executable, __file__, "--one", name] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ratio(key: str, new: object, old: object) -> str:
    if not isinstance(new, (int, float)) or not isinstance(old, (int, float)) or not new or not old:
        return ""
    r = new / old if key in HIGHER_IS_BETTER else old / new
    return f" (x{r:.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", choices=sorted(FIGURES), help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="tiny bounds (smoke test)")
    p.add_argument("--only", nargs="*", choices=sorted(FIGURES), help="these figures only")
    p.add_argument("--update-baseline", action="store_true", help=f"write {BASELINE.name}")
    p.add_argument("--baseline", type=Path, default=BASELINE, help="figures to compare with")
    args = p.parse_args(argv)
    if args.one:
        one(args.one, args.quick)
        return 0
    old = json.loads(args.baseline.read_text()) if args.baseline.exists() else {}
    old_figures = old.get("figures", {})
    figures: dict[str, dict] = {}
    for name in args.only or FIGURES:
        got = run_child(name, args.quick)
        figures[name] = got
        before = old_figures.get(name, {})
        parts = [
            f"{k}={v:,.{4 if k.endswith('_fraction') else 1}f}{ratio(k, v, before.get(k))}"
            if isinstance(v, float)
            else f"{k}={v:,}{ratio(k, v, before.get(k))}"
            if isinstance(v, int)
            else f"{k}={v}"
            for k, v in got.items()
        ]
        print(f"{name}: " + ", ".join(parts), flush=True)
    if old:
        print(f"ratios against {args.baseline.name} ({old.get('commit', '?')}); >1 is a gain")
    if args.update_baseline:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        merged = {**old_figures, **figures} if args.only else figures
        text = json.dumps({"commit": commit, "figures": merged}, indent=1, sort_keys=True)
        args.baseline.write_text(text + "\n")
        print(f"wrote {args.baseline.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
