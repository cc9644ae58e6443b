"""The explorer's caps: ``kvfence explore --max-states N --max-seconds S``. A search a cap
stops is UNKNOWN beyond it (exit 2, naming the cap, the depth reached and the states
seen), never PASS; what it did check is a real prefix of the uncapped search."""

from __future__ import annotations

import multiprocessing

import pytest

import kvfence.conformance.search as search
from kvfence.conformance.cli import (
    EXPLORE_MAX_SECONDS,
    EXPLORE_MAX_STATES,
    build_parser,
    main,
    main_explore,
)
from kvfence.conformance.search import MAX_SECONDS, explore
from kvfence.model.explore import explore as explore_model
from kvfence.model.explore import initial_states
from kvfence.model.state import Bounds

CLI_DEFAULT = Bounds(prefixes=("P",), rids=("r1",), versions=2)
"""``kvfence explore``'s default bounds."""


@pytest.fixture(autouse=True)
def no_worker_left():
    before = {p.pid for p in multiprocessing.active_children()}
    yield
    assert [p.pid for p in multiprocessing.active_children() if p.pid not in before] == []


class _Clock:
    """A ``time.monotonic`` that advances one second per reading: the time cap then ends a
    search after a known number of slices, whatever the machine's speed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_the_state_cap_is_unknown_beyond_it_never_pass():
    code, text = main_explore(2, 1, 2, 1, 4, None, None, workers=1, max_states=500)
    assert code == 2, text
    assert "distinct states: 500 " in text and "complete: no" in text
    assert "UNKNOWN: stopped by --max-states 500 at depth 2 of 4 with 500 states" in text
    assert "PASS" not in text


def test_uncapped_the_same_search_passes():
    """The cap is what makes the test above UNKNOWN: the same search to the depth it
    reached, 2, is PASS without a cap and with one it does not reach (725 states)."""
    code, text = main_explore(2, 1, 2, 1, 2, None, None, workers=1)
    assert code == 0 and "PASS: no violation within bounds" in text, text
    assert "distinct states: 725 " in text, text  # more than the 500 of the cap above
    capped = main_explore(2, 1, 2, 1, 2, None, None, workers=1, max_states=726)
    assert capped == (0, capped[1]) and "PASS" in capped[1]


def test_the_time_cap_ends_the_search_between_slices(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(search.time, "monotonic", clock)
    monkeypatch.setattr(search, "DEADLINE_SLICE", 10)
    # read 1 sets the deadline (1 + 40); each slice begun reads the clock once more
    x = explore(initial_states(2), CLI_DEFAULT, 3, symmetry=True, max_seconds=40)
    assert x.cut == MAX_SECONDS and not x.complete and x.ok
    # cut inside level 3 (not complete): every state of level 2 merged, not all of level 3
    assert x.depth_reached == 3
    assert explore_model(initial_states(2), CLI_DEFAULT, 2, symmetry=True).states < x.states


def test_the_time_cap_on_forked_workers_stops_them_all():
    """A real clock and two workers: a depth-6 search (about a minute on two cores) capped
    at half a second is UNKNOWN, and no worker outlives it."""
    code, text = main_explore(2, 1, 2, 1, 6, None, None, workers=2, max_seconds=0.5)
    assert code == 2, text
    assert "UNKNOWN: stopped by --max-seconds 0.5 at depth " in text and "PASS" not in text


def test_the_caps_have_safe_defaults_and_reject_bad_values(capsys):
    args = build_parser().parse_args(["explore"])
    assert (args.max_states, args.max_seconds) == (EXPLORE_MAX_STATES, EXPLORE_MAX_SECONDS)
    assert 0 < EXPLORE_MAX_STATES <= 5_000_000 and 0 < EXPLORE_MAX_SECONDS <= 3600
    for bad in (["--max-states", "0"], ["--max-seconds", "0"], ["--max-seconds", "nan"]):
        with pytest.raises(SystemExit) as e:
            main(["explore", *bad])
        assert e.value.code != 0
        assert bad[0] in capsys.readouterr().err
    with pytest.raises(ValueError, match="--max-states >= 1, got 0"):
        main_explore(2, 1, 2, 1, 3, None, None, max_states=0)
    with pytest.raises(ValueError, match="--max-seconds > 0, got -1"):
        main_explore(2, 1, 2, 1, 3, None, None, max_seconds=-1)
    with pytest.raises(ValueError, match="max_seconds must be positive"):
        explore(initial_states(2), CLI_DEFAULT, 1, max_seconds=0)
