"""Speed and memory figures for kvfence, each as a ratio against the last baseline.

    .venv/bin/python scripts/bench.py                    # every figure, ratios vs the baseline
    .venv/bin/python scripts/bench.py --update-baseline  # ... and write them as the new baseline
    .venv/bin/python scripts/bench.py --quick            # tiny bounds (the smoke test's)

Each figure runs in its own process (``--one NAME``), so its peak memory is its own. The
baseline is ``scripts/bench-baseline.json`` (figures of the commit that wrote it). Ratios are
"new / old" for rates (higher is better) and "old / new" for times and memory (higher is
better too), so a ratio above 1 is always a gain. The machine may be shared: measure the
baseline and the change back to back, and read small ratios with care; the ``per_cpu_s``
rates (CPU time: the explorer's figures add its forked workers') move less with the load
than the wall-clock ones.

Figures:

* ``explore-d4``, ``explore-d6``: the model explorer on ``kvfence explore``'s defaults (two
  endpoints, exact + standard lane; one prefix, one request ID, versions 2; symmetry on) to
  depth 4 and 6, on ``workers`` processes as the CLI runs it (its default ``--workers``:
  the usable cores): states/s, transitions/s, and transitions per CPU second of this
  process and its forked workers together (``cpu_seconds``).
* ``explore-60s``: the deepest depth of the same search finished within 60 s, and within
  the 13.7 s the filing's depth 6 took (on the same ``workers``).
* ``product``: the product explorer (model x the in-process reference, every setup) to
  depth 3: transitions/s.
* ``check-ci``: a ci-profile ``kvfence check`` of the reference: examples/s.
* ``kill``: the kill matrix (every mutant, focused on its rule, on every core): wall time
  and the slowest single time-to-kill.
* ``deployment-kills``: each deployment mutant (data-parallel ranks, a shared KV store,
  prefill/decode) killed alone, focused on its rule, on one worker: its seconds to kill.
* ``serve``: ``kvfence serve`` under load (127.0.0.1 only; ``wrk`` where installed, else
  Python clients over several processes): requests/s and p50/p99 latency at 1 and 50
  keep-alive clients; the session trace's bytes per request
  and the verdict's seconds after 100, 1,000 and 10,000 requests.
* ``battery``: the battery's generation on a cold cache (``KVFENCE_CACHE_DIR`` a fresh temp
  folder): seconds and scenarios.
* ``battery-kills``: every mutant's first kill with the battery (a focused ci check until
  its rule is shown): the slowest, the median and how many took 1 s or more.
* ``hazards``: per hazard of ``model.hazards`` (lower-tier KV, released memory, an open
  window, requests held in place, torn or mixed weights, a refused flush pending), the
  examples of a ci check of the reference whose random search reached it, and those in
  which the next action drawn there met it.
* ``vllm``: one ci-profile ``kvfence check --engine vllm --client reference`` (only where
  vLLM is installed): wall, engine, client and checker seconds from the run's own account
  (``Result.timing``) and ``checker_fraction``, the share of the wall time that is
  kvfence's own, with the 1-minute load average it ran under.

Targets: the explorer's default bounds under 60 s; two more levels of
depth in the same time; product-explorer throughput 10 times main's (64ceba3); every mutant
killed in under 1 s on 2 cores (by the kill matrix, and with the battery); checker overhead
under 10% of a vLLM check; serve >= 1,000 requests/s at 50 clients with p99 under 50 ms,
its trace size and verdict time linear in requests. A full run ends
with one line per target (``targets``): MET or NOT MET with its figure, and the reason the
figures give for one not met.
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
from unittest.mock import patch

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


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its children it has reaped: the
    explorer's forked workers are reaped at the end of each level, so their CPU counts."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _explore(depth: int, quick: bool) -> dict[str, float]:
    from kvfence.conformance.search import explore, usable_cores
    from kvfence.model.explore import initial_states
    from kvfence.model.state import Bounds

    bounds = Bounds(prefixes=("P",), rids=("r1",), versions=2)
    workers = WORKERS or usable_cores()  # what ``kvfence explore`` uses by default
    t, c = time.perf_counter(), cpu_seconds()
    x = explore(initial_states(2), bounds, 2 if quick else depth, symmetry=True, workers=workers)
    dt, cpu = time.perf_counter() - t, cpu_seconds() - c
    return {
        "depth": x.depth_reached,
        "states": x.states,
        "transitions": x.transitions,
        "seconds": dt,
        "states_per_s": x.states / dt,
        "transitions_per_s": x.transitions / dt,
        "transitions_per_cpu_s": x.transitions / cpu,
        "workers": workers,
    }


def explore_60s(quick: bool) -> dict[str, float]:
    """Deepest depth finished in the budget: one breadth-first search on ``kvfence
    explore``'s defaults (symmetry on), its levels timed through ``explore``'s ``stop``
    hook, cut by ``SIGALRM`` when the budget runs out (a level can take minutes: waiting
    for it to end would measure the next depth, not this budget)."""
    import signal

    from kvfence.conformance.search import explore, usable_cores
    from kvfence.model.explore import initial_states
    from kvfence.model.state import Bounds

    class OutOfTime(Exception):
        pass

    def alarm(signum: int, frame: object) -> None:
        raise OutOfTime

    budget = 2.0 if quick else 60.0
    workers = WORKERS or usable_cores()  # what ``kvfence explore`` uses by default
    bounds = Bounds(prefixes=("P",), rids=("r1",), versions=2)
    done: list[tuple[int, float]] = []
    t = time.perf_counter()

    def stop(level: int) -> bool:  # ``level`` levels are complete
        done.append((level, time.perf_counter() - t))
        return False

    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, budget)
    try:
        x = explore(initial_states(2), bounds, 99, symmetry=True, stop=stop, workers=workers)
        done.append((x.depth_reached, time.perf_counter() - t))  # the space ran dry
    except OutOfTime:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    depth, seconds = done[-1] if done else (0, 0.0)
    filed = [d for d, t in done if t <= FILED["explore_d6_seconds"]]
    return {
        "depth": depth,
        "seconds": seconds,
        "budget_seconds": budget,
        "depth_in_filed_time": filed[-1] if filed else 0,
        "workers": workers,
    }


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


def deployment_kills(quick: bool) -> dict[str, float]:
    """Each deployment mutant's time to kill (an engine declaring a deployment capability:
    ranks, a shared store, prefill/decode roles, a router), focused on its rule, one at a time on
    one worker, so each figure is its own search: ``<mutant>_seconds``."""
    from kvfence.adapters import registry
    from kvfence.adapters.mutants import MUTANTS
    from kvfence.conformance.matrix import killed, run_matrices
    from kvfence.model.capabilities import DEPLOYMENT_CAPABILITIES

    shaped = [
        m
        for m in MUTANTS
        if m.side == "engine"
        and registry.engine(m.name).capabilities & set(DEPLOYMENT_CAPABILITIES)
    ]
    out: dict[str, float] = {}
    for m in shaped[:1] if quick else shaped:
        with TemporaryDirectory() as tmp:
            x = run_matrices(designs=(), mutants=(m,), out=Path(tmp), jobs=1)
        ((_, r),) = x.mutants
        assert killed(m, r), m.name
        out[f"{m.name}_seconds"] = r.seconds
    return out


def battery(quick: bool) -> dict[str, float]:
    """The battery's generation on a cold cache (``KVFENCE_CACHE_DIR`` set to a fresh temp
    folder, so nothing cached is read): seconds (wall, as ``battery.load`` runs it on the
    usable cores), CPU seconds (its workers' included) and scenarios. ``--quick``: the
    long scenarios and the model's witnesses on the first setup only (no breadth-first
    kills)."""
    from kvfence.conformance import battery as b
    from kvfence.conformance.explore import SETUPS

    # the figures after this one read the user's cache again, not a removed folder
    with TemporaryDirectory() as tmp, patch.dict(os.environ, {"KVFENCE_CACHE_DIR": tmp}):
        t, c = time.perf_counter(), cpu_seconds()
        if quick:  # the first setup's witnesses, in seconds (all: about 80 s)
            n = len(b.witness_scenarios(SETUPS[:1])) + len(b.long_scenarios())
        else:
            n = len(b.load().scenarios)
            assert (Path(tmp) / b.battery_path().name).exists()
        dt, cpu = time.perf_counter() - t, cpu_seconds() - c
    return {"seconds": dt, "cpu_seconds": cpu, "scenarios": n}


def battery_kills(quick: bool) -> dict[str, float | str]:
    """Every mutant's first kill with the battery: the wall seconds of its focused ci check
    (``run_check``, battery on) until the rule is shown, capped at the example that shows
    it (``scripts/budget.py`` ``prefix_kill``), shrinking and the counterexample included;
    the battery is generated beforehand (not timed: ``battery`` is). The slowest, its
    mutant, and the number over 1 s."""
    sys.path.insert(0, str(Path(__file__).parent))
    import budget

    from kvfence.adapters import registry
    from kvfence.adapters.mutants import MUTANTS
    from kvfence.conformance.battery import load
    from kvfence.conformance.matrix import killed
    from kvfence.conformance.runner import run_check

    load()
    times: dict[str, float] = {}
    for m in MUTANTS[:3] if quick else MUTANTS:
        at, _ = budget.prefix_kill(m)
        engine, client = budget._systems(m.side, m.name, m.engine)
        with TemporaryDirectory() as tmp:
            t = time.perf_counter()
            r = run_check(
                registry.engine(engine),
                registry.client(client),
                out_dir=Path(tmp),
                strict=True,
                max_examples=max(at or 0, 1) if at is not None else None,
                focus=m.rule,
            )
            times[m.name] = time.perf_counter() - t
        assert killed(m, r), m.name
    slowest = max(times, key=times.__getitem__)
    return {
        "mutants": len(times),
        "slowest_kill_seconds": times[slowest],
        "slowest_mutant": slowest,
        "over_1s": sum(t >= 1 for t in times.values()),
        "median_kill_seconds": sorted(times.values())[len(times) // 2],
    }


def hazards(quick: bool) -> dict[str, float]:
    """How often the random search of a ci check of the reference reaches each hazard of
    ``model.hazards`` and meets it (``run_check``, the battery first, not counted): per
    hazard, ``<hazard>_reached``, the examples with a step that began with it held on some
    endpoint, and ``<hazard>_met``, the examples in which the action drawn at such a step
    meets it (``hazards.meets``); ``examples``, the examples the search ran. Counted by
    wrapping the machine's steering (``machine.hazard_steered``), which every step calls
    with the run's lockstep before its draw. ``--quick``: 30 examples."""
    from kvfence.adapters import registry
    from kvfence.conformance import machine
    from kvfence.conformance.runner import run_check
    from kvfence.model.hazards import HAZARDS, hazards_held, meets

    steps: list[tuple[object, tuple, int]] = []
    steer = machine.hazard_steered

    def counted(lockstep, data, held=None):
        held = hazards_held(lockstep.states) if held is None else held
        steps.append((lockstep, held, len(lockstep.actions)))
        return steer(lockstep, data, held)

    machine.hazard_steered = counted
    try:
        with TemporaryDirectory() as tmp:
            run_check(
                registry.engine("reference"),
                registry.client("reference"),
                out_dir=Path(tmp),
                max_examples=30 if quick else None,
            )
    finally:
        machine.hazard_steered = steer
    reached: dict[str, set[int]] = {h.name: set() for h in HAZARDS}
    met: dict[str, set[int]] = {h.name: set() for h in HAZARDS}
    for lockstep, held, n in steps:
        ran = lockstep.actions[n] if len(lockstep.actions) > n else None
        for h, i in held:
            reached[h.name].add(id(lockstep))
            if ran is not None and meets(h, i, ran):
                met[h.name].add(id(lockstep))
    slug = {h.name: h.name.replace(" ", "_").replace("-", "_").lower() for h in HAZARDS}
    out: dict[str, float] = {"examples": len({id(x) for x, _, _ in steps})}
    for h in HAZARDS:
        out[f"{slug[h.name]}_reached"] = len(reached[h.name])
        out[f"{slug[h.name]}_met"] = len(met[h.name])
    return out


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


def _serve_load(port: int, clients: int, per_client: int) -> tuple[float, list[float]]:
    """``clients`` threads, each one keep-alive connection sending ``per_client`` requests
    (8 prompts in turn) to 127.0.0.1:``port``: the wall seconds and each latency (s)."""
    import http.client
    import threading

    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine = []
        try:
            for i in range(per_client):
                body = json.dumps({"text": f"prompt {(k + i) % 8}", "sampling_params": {}})
                t = time.perf_counter()
                conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                mine.append(time.perf_counter() - t)
                if response.status != 200:
                    failures.append(str(response.status))
        except OSError as e:
            failures.append(repr(e))
        finally:
            conn.close()
            with lock:
                latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    wall = time.perf_counter() - t
    assert not failures, failures[:5]
    return wall, latencies


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local i = 0
request = function()
  i = i + 1
  local body = '{"text": "prompt ' .. (i % 8) .. '", "sampling_params": {}}'
  return wrk.format(nil, "/generate", nil, body)
end
"""
"""wrk's request script: the Python generator's requests (8 prompts in turn)."""


def _wrk_load(port: int, clients: int, seconds: int, tmp: str) -> tuple[float, float, float]:
    """``wrk`` (a C load generator, one thread, ``clients`` keep-alive connections) for
    ``seconds`` against 127.0.0.1:``port``: requests/s, p50 and p99 latency (ms)."""
    import re
    import shutil

    script = Path(tmp) / "generate.lua"
    script.write_text(WRK_SCRIPT)
    cmd = [shutil.which("wrk") or "wrk", "-t1", f"-c{clients}", f"-d{seconds}s", "--latency"]
    cmd += ["-s", str(script), f"http://127.0.0.1:{port}/"]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    assert "Non-2xx" not in text and "Socket errors" not in text, text

    def ms(label: str) -> float:
        value, unit = re.search(rf"{label}\s+([\d.]+)(us|ms|s)\b", text).groups()
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    return rate, ms("50%"), ms("99%")


def _load_part(args: tuple[int, int, int]) -> tuple[float, list[float]]:
    return _serve_load(*args)


def _python_load(port: int, clients: int, per_client: int) -> tuple[float, float, float]:
    """The Python generator when wrk is not installed: ``clients`` keep-alive connections
    over up to 10 processes (5 threads each, so one process's GIL does not queue 50
    clients' reads): requests/s, p50 and p99 latency (ms). Its own scheduling still adds
    to the tail that wrk would not."""
    from concurrent.futures import ProcessPoolExecutor

    procs = max(1, min(10, clients // 5))
    shares = [clients // procs + (k < clients % procs) for k in range(procs)]
    with ProcessPoolExecutor(procs) as pool:
        list(pool.map(_load_part, [(port, 1, 1)] * procs))  # processes started, warm
        t = time.perf_counter()
        parts = list(pool.map(_load_part, [(port, n, per_client) for n in shares]))
        wall = time.perf_counter() - t
    lat = [x for _, xs in parts for x in xs]
    return len(lat) / wall, 1000 * _quantile(lat, 0.50), 1000 * _quantile(lat, 0.99)


def serve(quick: bool) -> dict[str, float]:
    """``kvfence serve --api sglang`` (the reference engine) as a subprocess on a free
    loopback port: requests/s and p50/p99 latency (ms) at 1 and 50 keep-alive clients,
    measured by ``wrk`` where it is installed (``generator`` 1; Debian's package ``wrk``),
    else by Python clients over several processes (``generator`` 0: ``_python_load``);
    then, in process (``Session.handle``, no HTTP), the session trace's bytes per request
    and the verdict's seconds (trace written) after 100, 1,000 and 10,000 requests over 8
    prompts with a sync every 100. Traffic goes to 127.0.0.1 only, bounded in count and
    time."""
    import re
    import shutil
    import signal

    from kvfence.conformance.serve import Session

    out: dict[str, float] = {}
    wrk = shutil.which("wrk") is not None
    out["generator"] = 1.0 if wrk else 0.0
    with TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "kvfence.conformance.cli", "serve", "--api", "sglang"]
        cmd += ["--engine", "reference", "--port", "0", "--out", tmp]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert proc.stdout is not None
            port = int(re.search(r":(\d+) ", proc.stdout.readline() + " ").group(1))
            _serve_load(port, 1, 20)  # warm up
            for clients, per in ((1, 100 if quick else 1000), (50, 4 if quick else 60)):
                if wrk:
                    rate, p50, p99 = _wrk_load(port, clients, 1 if quick else 5, tmp)
                else:
                    rate, p50, p99 = _python_load(port, clients, per)
                out[f"c{clients}_requests_per_s"] = rate
                out[f"c{clients}_p50_ms"] = p50
                out[f"c{clients}_p99_ms"] = p99
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
        for n in (100, 1000) if quick else (100, 1000, 10000):
            session = Session("sglang", "reference", out_dir=Path(tmp) / str(n))
            for i in range(n):
                if i and i % 100 == 0:
                    for path, body in (
                        ("/pause_generation", {"mode": "abort"}),
                        ("/update_weights_from_disk", {"model_path": f"/ckpt/{i}"}),
                        ("/continue_generation", {}),
                    ):
                        session.handle("POST", path, json.dumps(body).encode())
                body = json.dumps({"text": f"prompt {i % 8}"}).encode()
                assert session.handle("POST", "/generate", body)[0] == 200
            t = time.perf_counter()
            session.result(write=True)
            out[f"verdict_{n}_seconds"] = time.perf_counter() - t
            assert session.trace_path is not None
            out[f"trace_{n}_bytes_per_request"] = session.trace_path.stat().st_size / n
    return out


FIGURES = {
    "explore-d4": lambda q: _explore(4, q),
    "explore-d6": lambda q: _explore(6, q),
    "explore-60s": explore_60s,
    "product": product,
    "check-ci": check_ci,
    "kill": kill,
    "deployment-kills": deployment_kills,
    "battery": battery,
    "battery-kills": battery_kills,
    "hazards": hazards,
    "vllm": vllm,
    "serve": serve,
}


WORKERS: int | None = None
"""``--workers N``: the explore figures on N processes (default: the usable cores, as
``kvfence explore``); ``--workers 1`` measures the one-process search back to back."""


def one(name: str, quick: bool) -> None:
    """Child mode: measure ``name`` and print it as JSON with this process's peak memory."""
    got = FIGURES[name](quick)
    got["peak_mib"] = peak_mib()
    print(json.dumps(got))


def run_child(name: str, quick: bool) -> dict[str, float | str]:
    cmd = [sys.executable, __file__, "--one", name] + (["--quick"] if quick else [])
    cmd += ["--workers", str(WORKERS)] if WORKERS else []
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


FILED = {
    "commit": "64ceba3",
    "explore_d6_seconds": 13.7,
    "explore_depth": 6,
    "explore_d6_states": 33_028,
    "explore_transitions_per_s": 58_000,
    "product_transitions_per_s": 2_500,
    "slowest_kill_seconds": 4.9,
}
"""The figures the speed targets were set against (main at the time, on that commit's
vocabulary)."""


def targets(f: dict[str, dict]) -> list[str]:
    """The speed targets against ``f`` (this run's figures): one line each, MET or NOT MET
    with the measured figure, and for a target not met the reason the figures give."""
    out: list[str] = []

    def line(name: str, met: bool | None, figure: str, why: str = "") -> None:
        verdict = "not measured" if met is None else "MET" if met else "NOT MET"
        reason = f"\n{'':16}why: {why}" if why and met is False else ""
        out.append(f"  {verdict:12} {name}: {figure}{reason}")

    d6, d4, x60 = f.get("explore-d6", {}), f.get("explore-d4", {}), f.get("explore-60s", {})
    if "seconds" in d6:
        line(
            "default-bound explore (kvfence explore's defaults, depth 6) under 60 s",
            d6["seconds"] < 60,
            f"{d6['seconds']:.1f} s for {d6['states']:,} states, {d6['transitions']:,} transitions",
            f"the lifecycle and soundness vocabulary grew depth 6 from "
            f"{FILED['explore_d6_states']:,} states ({FILED['commit']}) to {d6['states']:,}",
        )
    else:
        line("default-bound explore under 60 s", None, str(d6.get("error", "not run")))
    if "depth" in x60:
        gained = x60["depth_in_filed_time"] - FILED["explore_depth"]
        line(
            f"two more levels of depth in the same time ({FILED['explore_d6_seconds']} s)",
            gained >= 2,
            f"depth {x60['depth_in_filed_time']} (depth {FILED['explore_depth']} at "
            f"{FILED['commit']}); depth {x60['depth']} in {x60['seconds']:.1f} s of a "
            f"{x60['budget_seconds']:g} s budget",
            "measured on today's vocabulary, whose states per level grew ~6x since the filing; "
            "the filing's vocabulary is not on this tree to measure",
        )
    if "transitions_per_s" in (pr := f.get("product", {})):
        want = 10 * FILED["product_transitions_per_s"]
        model = d4.get("transitions_per_cpu_s")
        bound = (
            f"; every edge also runs the model step, and the model alone steps "
            f"{model:,.0f} transitions per CPU-second here: the product explorer, on one "
            f"core, cannot pass that"
            if model
            else ""
        )
        line(
            "product-explorer throughput 10x the filing's (25,000 transitions/s)",
            pr["transitions_per_s"] >= want,
            f"{pr['transitions_per_s']:,.0f} transitions/s "
            f"(x{pr['transitions_per_s'] / FILED['product_transitions_per_s']:.1f})",
            f"an edge is a model step, a system call, a snapshot restore and judging{bound}",
        )
    if "slowest_kill_seconds" in (k := f.get("kill", {})):
        line(
            "every mutant killed in under 1 s on 2 cores (the goal)",
            k["slowest_kill_seconds"] < 1,
            f"slowest {k['slowest_kill_seconds']:.1f} s ({k.get('slowest_mutant')}), "
            f"matrix {k['seconds']:.1f} s for {k['mutants']} mutants",
            "the slowest kills are four steps deep (a window opened, a chunk set to fail, "
            "sent, the finish), and the product explorer visits every shorter path of its "
            "setup first, at the product throughput above",
        )
    if "slowest_kill_seconds" in (bk := f.get("battery-kills", {})):
        line(
            "every mutant's first kill with the battery under 1 s",
            bk["slowest_kill_seconds"] < 1,
            f"slowest {bk['slowest_kill_seconds']:.2f} s ({bk.get('slowest_mutant')}), "
            f"median {bk.get('median_kill_seconds', 0):.2f} s, {bk.get('over_1s', 0)} of "
            f"{bk.get('mutants')} over 1 s",
            "the slowest are client programs: their check first runs the program table "
            "(every policy and server-info shape through the program's whole sync: about "
            "2 s of CPU alone, measured on two-phase-finish-without-flush), before the "
            "battery; the battery's own kills are a few scenarios each",
        )
    if "seconds" in (bg := f.get("battery", {})):
        out.append(
            f"  {'figure':12} battery generation (cold cache): {bg['seconds']:.1f} s "
            f"({bg.get('cpu_seconds', 0):.1f} s of CPU) for {bg.get('scenarios')} scenarios"
        )
    dk = {k: v for k, v in f.get("deployment-kills", {}).items() if k.endswith("_seconds")}
    if dk:
        slow = {k.removesuffix("_seconds"): v for k, v in dk.items() if v >= 1}
        line(
            "every deployment mutant (ranks, shared store, P/D, router) killed in under 1 s",
            not slow,
            ", ".join(f"{k.removesuffix('_seconds')} {v:.2f} s" for k, v in dk.items()),
            f"over 1 s: {', '.join(slow)}",
        )
    sv = f.get("serve", {})
    by = "wrk" if sv.get("generator") else "Python clients (wrk not installed)"
    if "c50_requests_per_s" in sv:
        line(
            "serve: >= 1,000 requests/s at 50 keep-alive clients on 2 cores",
            sv["c50_requests_per_s"] >= 1000,
            f"{sv['c50_requests_per_s']:,.0f} requests/s (1 client: "
            f"{sv['c1_requests_per_s']:,.0f}/s, p50 {sv['c1_p50_ms']:.2f} ms), by {by}",
            "every request is a model step, an engine call and judging, one at a time on "
            "one Python thread; the load generator shares the same two cores",
        )
        line(
            "serve: p99 latency under 50 ms at 50 clients",
            sv["c50_p99_ms"] < 50,
            f"p99 {sv['c50_p99_ms']:.1f} ms, p50 {sv['c50_p50_ms']:.1f} ms, by {by}",
            "50 clients wait in turn: p50 is about 50 service times; a Python load "
            "generator adds its own threads' scheduling to the tail (wrk does not)",
        )
    sizes = [sv.get(f"trace_{n}_bytes_per_request") for n in (100, 1000, 10000)]
    times = [sv.get(f"verdict_{n}_seconds") for n in (100, 1000, 10000)]
    if all(sizes) and all(times):
        line(
            "serve: trace size linear in requests (bytes per request within 1.5x, 100 to 10,000)",
            max(sizes) <= 1.5 * min(sizes),
            " / ".join(f"{b:,.0f}" for b in sizes) + " bytes per request",
        )
        line(
            "serve: verdict time linear in requests (per request at 10,000 within 2x of 1,000)",
            times[2] / 10000 <= 2 * times[1] / 1000,
            " / ".join(f"{t:.2f}" for t in times) + " s at 100 / 1,000 / 10,000 requests",
        )
    v = f.get("vllm", {})
    if "checker_fraction" in v:
        line(
            "checker overhead under 10% of a vLLM check's wall time",
            v["checker_fraction"] < 0.10,
            f"{100 * v['checker_fraction']:.1f}% of {v.get('wall_seconds', 0):.0f} s",
        )
    else:
        line("checker overhead under 10% of a vLLM check", None, str(v.get("note", "not run")))
    return out


def ratio(key: str, new: object, old: object) -> str:
    if not isinstance(new, (int, float)) or not isinstance(old, (int, float)) or not new or not old:
        return ""
    r = new / old if key in HIGHER_IS_BETTER else old / new
    return f" (x{r:.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", choices=sorted(FIGURES), help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="tiny bounds (smoke test)")
    p.add_argument(
        "--workers",
        type=int,
        help="explore figures on this many processes (default: the usable cores, as the CLI)",
    )
    p.add_argument("--only", nargs="*", choices=sorted(FIGURES), help="these figures only")
    p.add_argument("--update-baseline", action="store_true", help=f"write {BASELINE.name}")
    p.add_argument("--baseline", type=Path, default=BASELINE, help="figures to compare with")
    args = p.parse_args(argv)
    global WORKERS
    if args.workers is not None and args.workers < 1:
        p.error(f"--workers must be at least 1, got {args.workers}")
    WORKERS = args.workers
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
    if not args.quick:
        print("targets:")
        print("\n".join(targets(figures)))
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
