"""The level-parallel explorer (``conformance.search``): ``explore(..., workers=N)`` returns
exactly what the serial search returns (counts, the first violation, its trace), cut short
or not, and leaves no worker process behind.

``PARALLEL_MIN`` is lowered here so that the small searches these tests can afford fork
at every level but the first few; ``CHUNKS_PER_WORKER`` is varied so chunk borders fall
in different places.
"""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest

import kvfence.conformance.search as pool
import kvfence.model.explore as explorer
from kvfence.conformance.cli import build_parser, main_explore
from kvfence.conformance.search import explore, usable_cores
from kvfence.model.checks import Violation, check_served, check_state
from kvfence.model.explore import STANDARD, initial_states
from kvfence.model.properties import SOMETIMES
from kvfence.model.rules import RuleId
from kvfence.model.state import Bounds, State, initial_state

CLI_DEFAULT = Bounds(prefixes=("P",), rids=("r1",), versions=2)
"""``kvfence explore``'s default bounds."""

INJECTED = RuleId.ADP_001
INJECTED_SERVED = RuleId.ADP_002
"""Registered rules the model never breaks itself (adapter rules), cited by injected bugs."""

TWO = Bounds(prefixes=("P", "Q"), rids=("r1", "r2"))
"""Two prefixes, two request IDs: a search whose symmetry renames (four renamings)."""


@pytest.fixture(autouse=True)
def fork_small_levels(monkeypatch):
    """Fork at every level of 20 frontier states or more (the default waits for 2,000)."""
    monkeypatch.setattr(pool, "PARALLEL_MIN", 20)


@pytest.fixture(autouse=True)
def no_worker_left():
    """Every test here ends with no child process alive that it started."""
    before = {p.pid for p in multiprocessing.active_children()}
    yield
    assert [p.pid for p in multiprocessing.active_children() if p.pid not in before] == []


def _same(initial, bounds, depth, workers=(2, 3), **kw):
    """Serial and parallel results of one search; asserts they are equal, returns serial.
    Without the REACH witnesses unless ``sometimes`` is given: their search runs after the
    levels, in the calling process, the same code for both (one test compares them)."""
    kw.setdefault("sometimes", ())
    serial = explore(initial, bounds, depth, **kw)
    for w in workers:
        assert explore(initial, bounds, depth, workers=w, **kw) == serial, f"workers={w}"
    return serial


@pytest.mark.parametrize(
    ("initial", "bounds", "depth", "symmetry", "chunks", "workers"),
    [
        # one worker count per search but one: two and three workers on the two-endpoint
        # search with symmetry (four renamings), the other counts once each
        (initial_states(2), CLI_DEFAULT, 3, True, 1, (2,)),  # one chunk per worker
        (initial_states(2), CLI_DEFAULT, 3, True, 8, (3,)),
        (initial_states(2), CLI_DEFAULT, 3, False, 8, (3,)),  # 7,203 states
        (initial_state((STANDARD, STANDARD)), TWO, 3, True, 8, (2, 3)),
        (initial_state((STANDARD, STANDARD)), TWO, 2, False, 8, (2,)),  # 1,065 states
    ],
    ids=[
        "cli-symmetry-d3-chunks1",
        "cli-symmetry-d3",
        "cli-full-d3",
        "two-standard-symmetry-d3",
        "two-standard-full-d2",
    ],
)
def test_parallel_counts_are_the_serial_ones(
    monkeypatch, initial, bounds, depth, symmetry, chunks, workers
):
    monkeypatch.setattr(pool, "CHUNKS_PER_WORKER", chunks)
    x = _same(initial, bounds, depth, workers=workers, symmetry=symmetry)
    assert x.complete and x.ok and x.depth_reached == depth
    assert x.states > 1000  # big enough that several levels were forked


def test_parallel_witnesses_are_the_serial_ones():
    x = _same(initial_states(2), CLI_DEFAULT, 3, workers=(2,), symmetry=True, sometimes=SOMETIMES)
    assert x.complete and len(x.witnesses) == len(SOMETIMES)


def test_parallel_max_states_truncates_where_serial_does():
    for cap in (100, 500, 2345):
        x = _same(initial_states(2), CLI_DEFAULT, 3, max_states=cap, symmetry=True)
        assert x.states == cap and not x.complete


def _e1_new_kv(state: State) -> bool:
    """Endpoint 1 at version 2 holding some KV: first reached in 3 steps."""
    return state.endpoints[1].weights == 2 and bool(state.endpoints[1].cache)


def _injected_state_check(monkeypatch, guilty) -> None:
    """A model bug made to order: ``check_state`` (as the explorer calls it, in this process
    and in forked workers alike) also flags every state ``guilty`` picks (rule ``INJECTED``)."""

    def check(state: State, ledger: bool = True) -> list[Violation]:
        out = check_state(state, ledger)
        if guilty(state):
            out.append(Violation(INJECTED, "not this", "this", "injected"))
        return out

    monkeypatch.setattr(explorer, "check_state", check)


WORKERS = {True: (2, 3), False: (3,)}
"""Worker counts the first-violation searches compare with the serial one: without
symmetry (seven times the states) one count."""


@pytest.mark.parametrize("symmetry", [True, False])
def test_parallel_finds_the_serial_first_violation_of_a_state(monkeypatch, symmetry):
    # 19 states first reached at level 3 break it: which is first depends on the order
    _injected_state_check(monkeypatch, _e1_new_kv)
    x = _same(initial_states(2), CLI_DEFAULT, 4, symmetry=symmetry, workers=WORKERS[symmetry])
    assert [v.rule for v in x.violation] == [INJECTED] and len(x.trace) == 3
    assert not x.complete


def _stale_served(monkeypatch, rule: RuleId) -> None:
    """``check_served`` also flags any response endpoint 1 serves at version 2."""

    def served(s) -> list[Violation]:
        out = check_served(s)
        if s.endpoint == 1 and s.weights == 2:
            out.append(Violation(rule, "not this", "this", "injected"))
        return out

    def check(state: State, ledger: bool = True) -> list[Violation]:
        out = [v for s in (state.ledger if ledger else ()) for v in served(s)]
        return out + check_state(state, ledger=False)

    monkeypatch.setattr(explorer, "check_served", served)
    monkeypatch.setattr(explorer, "check_state", check)


@pytest.mark.parametrize("symmetry", [True, False])
def test_parallel_finds_the_serial_first_violation_of_a_response(monkeypatch, symmetry):
    # a response is judged on every transition, to a new state or one seen before
    _stale_served(monkeypatch, INJECTED_SERVED)
    x = _same(initial_states(2), CLI_DEFAULT, 4, symmetry=symmetry, workers=WORKERS[symmetry])
    assert [v.rule for v in x.violation] == [INJECTED_SERVED] and x.trace
    assert not x.complete


@pytest.mark.parametrize("inject", ["state", "response"])
def test_the_injected_bugs_are_found_late_enough_to_fork(monkeypatch, inject):
    """The two tests above test the merge only if their violations lie in a forked level
    with many candidates: else they would compare the serial search with itself."""
    if inject == "state":
        _injected_state_check(monkeypatch, _e1_new_kv)
    else:
        _stale_served(monkeypatch, INJECTED_SERVED)
    levels: list[int] = []
    x = explore(initial_states(2), CLI_DEFAULT, 4, symmetry=True, stop=levels.append)
    level = levels[-1]  # the violation was found in the last level begun
    forks_from = pool.PARALLEL_MIN
    monkeypatch.undo()
    reached = [
        explore(initial_states(2), CLI_DEFAULT, d, symmetry=True) for d in (level - 1, level)
    ]
    frontier = reached[1].states - reached[0].states  # the states first reached at ``level``
    assert x.violation and level >= 2 and frontier > 10 * forks_from


def test_stop_ends_a_parallel_search_where_a_serial_one_ends():
    x = _same(initial_states(2), CLI_DEFAULT, 6, symmetry=True, stop=lambda level: level >= 3)
    assert not x.complete and x.depth_reached == 3


class _Alarm(Exception):
    pass


def test_an_alarm_in_a_forked_level_leaves_no_worker_behind(monkeypatch):
    """``bench.py explore-60s`` cuts the search with SIGALRM mid-level: the workers die
    with it (killed and reaped), none keeps a core busy after the search."""
    monkeypatch.setattr(pool, "PARALLEL_MIN", 2000)

    alive: list[int] = []

    def alarm(signum, frame):
        alive.append(len(multiprocessing.active_children()))  # the workers it interrupts
        raise _Alarm

    started: list[int] = []

    def stop(level: int) -> bool:
        if level == 3:  # 3,011 states, then 15,565 at level 4: forked, seconds long
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            started.append(level)
        return False

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        with pytest.raises(_Alarm):
            explore(initial_states(2), CLI_DEFAULT, 5, symmetry=True, stop=stop, workers=2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert started == [3] and alive[0] >= 1


def test_a_failing_worker_fails_the_search(monkeypatch):
    """Fail-closed: a worker that raises (here: every step in a forked child) is an error
    naming the worker and the cause, never a smaller search reported complete."""
    home = os.getpid()
    real = explorer.step

    def step(state, action):
        if os.getpid() != home:
            raise ZeroDivisionError("injected in a worker")
        return real(state, action)

    monkeypatch.setattr(explorer, "step", step)
    with pytest.raises(RuntimeError, match=r"explore worker 1 .*failed(.|\n)*ZeroDivisionError"):
        explore(initial_states(2), CLI_DEFAULT, 3, symmetry=True, workers=2)


def test_a_dying_worker_fails_the_search(monkeypatch):
    home = os.getpid()
    real = explorer.step

    def step(state, action):
        if os.getpid() != home:
            os._exit(3)
        return real(state, action)

    monkeypatch.setattr(explorer, "step", step)
    with pytest.raises(RuntimeError, match=r"explore worker 1 .*died .*exit code 3"):
        explore(initial_states(2), CLI_DEFAULT, 3, symmetry=True, workers=2)


def test_workers_must_be_positive():
    with pytest.raises(ValueError, match="workers must be at least 1, got 0"):
        explore(initial_states(2), CLI_DEFAULT, 1, workers=0)


def test_usable_cores_counts_this_process_s_cores():
    n = usable_cores()
    assert n >= 1
    if hasattr(os, "sched_getaffinity"):
        assert n == len(os.sched_getaffinity(0))


def test_cli_explores_on_workers_with_the_same_result():
    """``kvfence explore --workers N`` (default: the usable cores) prints what one
    process prints, but for the time line."""

    def lines(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("time: ")]

    one = main_explore(2, 1, 2, 1, 3, None, None, workers=1)
    two = main_explore(2, 1, 2, 1, 3, None, None, workers=2)
    assert one[0] == two[0] == 0 and lines(one[1]) == lines(two[1])
    assert "; 2 workers)" in two[1] and "; 1 worker)" in one[1]
    assert build_parser().parse_args(["explore"]).workers == usable_cores()
    assert build_parser().parse_args(["explore", "--workers", "3"]).workers == 3
    with pytest.raises(ValueError, match="--workers >= 1, got 0"):
        main_explore(2, 1, 2, 1, 3, None, None, workers=0)
