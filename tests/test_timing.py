"""The check's account of where its wall time went: engine, client and
kvfence's own seconds (``calls.Timing``, ``runner.TimeSplit``, the report's ``timing``).

Nothing here times kvfence against a threshold: the engine and client are made slow by a
known sleep per call, and the account must hold at least those sleeps."""

from __future__ import annotations

import json
import time

import pytest

from kvfence.adapters import registry
from kvfence.conformance.calls import Timing, call_with_timeout
from kvfence.conformance.report import print_result, result_json, write_json
from kvfence.conformance.runner import TimeSplit, run_check

SLEEP = 0.002
"""Seconds every engine call sleeps."""

CLIENT_SLEEP = 0.0002
"""Seconds every client call sleeps: a tenth of an engine call's, as the client table asks
the resolver thousands of questions (2,700 in a check of two examples)."""


class SlowEngine:
    """The in-process reference engine, each call (start, apply, server_info, close) after
    a sleep of ``SLEEP``; every other attribute is the reference's. ``in_process``: whether
    the checker calls it directly (watchdog) or on its adapter worker thread."""

    def __init__(self, in_process: bool) -> None:
        self.inner = registry.engine("reference")
        self.in_process = in_process
        self.calls = 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def _slow(self) -> None:
        self.calls += 1
        time.sleep(SLEEP)

    def start(self, configs):
        self._slow()
        return self.inner.start(configs)

    def apply(self, action):
        self._slow()
        return self.inner.apply(action)

    def server_info(self, endpoint):
        self._slow()
        return self.inner.server_info(endpoint)

    def close(self):
        self._slow()
        return self.inner.close()


class SlowClient:
    """The reference client resolver, each ``resolve`` after a sleep of ``CLIENT_SLEEP``."""

    in_process = True

    def __init__(self) -> None:
        self.inner = registry.client("reference")
        self.name = "slow-reference"
        self.calls = 0

    def resolve(self, policy, info):
        self.calls += 1
        time.sleep(CLIENT_SLEEP)
        return self.inner.resolve(policy, info)


@pytest.mark.parametrize("in_process", [True, False], ids=["direct", "worker"])
def test_engine_and_client_seconds_hold_at_least_their_sleeps(tmp_path, in_process):
    engine, client = SlowEngine(in_process), SlowClient()
    r = run_check(engine, client, out_dir=tmp_path, max_examples=4)
    t = r.timing
    assert isinstance(t, TimeSplit)
    assert str(r.verdict) != "ERROR", r.error
    # every call the checker made into the engine and the client is counted, once
    assert t.engine_calls == engine.calls > 0
    assert t.client_calls == client.calls > 0
    assert t.engine_seconds >= t.engine_calls * SLEEP
    assert t.client_seconds >= t.client_calls * CLIENT_SLEEP
    assert t.wall_seconds == r.seconds
    assert t.wall_seconds >= t.engine_seconds + t.client_seconds
    assert t.checker_seconds == pytest.approx(t.wall_seconds - t.engine_seconds - t.client_seconds)
    assert 0.0 <= t.checker_fraction <= 1.0


def test_a_failing_check_counts_its_shrinking_replays(tmp_path):
    """The never-flush client makes the reference FAIL; shrinking replays the failing run
    on fresh recorders, and their engine calls are still the check's."""
    engine = SlowEngine(in_process=True)
    r = run_check(engine, registry.client("never-flush"), out_dir=tmp_path)
    assert str(r.verdict) == "FAIL"
    assert r.timing is not None
    assert r.timing.engine_calls == engine.calls
    assert r.timing.engine_seconds >= engine.calls * SLEEP


def test_no_call_divides_nothing_by_zero():
    t = TimeSplit.of(0.0, Timing())
    assert (t.checker_seconds, t.checker_fraction) == (0.0, 0.0)
    idle = TimeSplit.of(2.0, Timing())
    assert (idle.checker_seconds, idle.checker_fraction) == (2.0, 1.0)
    # an account above the wall time (clock granularity) never gives a negative share
    over = TimeSplit(1.0, 1.5, 0.0, 1, 0)
    assert (over.checker_seconds, over.checker_fraction) == (0.0, 0.0)


def test_a_call_that_raises_or_times_out_is_still_counted():
    timing = Timing()

    def boom():
        time.sleep(SLEEP)
        raise RuntimeError("engine down")

    with pytest.raises(Exception, match="engine down"):
        call_with_timeout(boom, 5.0, "apply", direct=False, timing=timing)
    with pytest.raises(Exception, match="did not answer"):
        call_with_timeout(lambda: time.sleep(1.0), 0.05, "apply", direct=False, timing=timing)
    assert timing.engine_calls == 2
    assert timing.engine_seconds >= SLEEP + 0.05
    call_with_timeout(lambda: None, 5.0, "resolve", direct=True, timing=timing, client=True)
    assert (timing.client_calls, timing.engine_calls) == (1, 2)


def test_the_json_report_and_summary_carry_the_split(tmp_path):
    # the split's fields, not its sums (the test above): no battery before the search
    r = run_check(SlowEngine(True), SlowClient(), out_dir=tmp_path, max_examples=2, battery=False)
    path = tmp_path / "results.json"
    write_json([r], path)
    (data,) = json.loads(path.read_text())
    got = data["timing"]
    assert set(got) == {
        "wall_seconds",
        "engine_seconds",
        "client_seconds",
        "checker_seconds",
        "checker_fraction",
        "engine_calls",
        "client_calls",
    }
    assert got["engine_calls"] == r.timing.engine_calls > 0
    assert got["engine_seconds"] >= got["engine_calls"] * SLEEP
    assert 0.0 <= got["checker_fraction"] <= 1.0
    assert got["wall_seconds"] == data["seconds"]
    from rich.console import Console

    console = Console(record=True, width=200)
    print_result(r, console)
    assert "checker share" in console.export_text()


def test_an_unmeasured_result_reports_null_timing(tmp_path):
    import attrs

    engine, client = registry.engine("reference"), registry.client("reference")
    r = run_check(engine, client, out_dir=tmp_path, max_examples=2)

    assert result_json(attrs.evolve(r, timing=None))["timing"] is None
