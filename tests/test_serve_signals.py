"""``kvfence serve`` stops on SIGTERM or SIGINT under load with its verdict, trace and
reports written; a second signal exits at once (2) with what was written.

A CI job ends a background server with ``kill -TERM $pid; wait $pid``: a stop that loses the
verdict (or hangs) would leave the job with no judgement of the trainer it ran.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

KVFENCE = [sys.executable, "-m", "kvfence.conformance.cli"]

SLOW_CLOSE = """
import time
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint


class SlowClose(InProcessAdapter):
    def close(self):
        time.sleep(60)


def make():
    return SlowClose(ReferenceEndpoint, "slow-close")
"""


def start(tmp_path: Path, engine: str = "reference", *extra: str) -> tuple[subprocess.Popen, int]:
    """A ``kvfence serve --api sglang`` subprocess and its port."""
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    cmd = [*KVFENCE, "serve", "--api", "sglang", "--engine", engine, "--port", "0"]
    cmd += ["--out", str(tmp_path / "out"), *extra]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200", "PYTHONPATH": path},
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)", first)
    assert match, f"kvfence serve did not announce its port: {first!r}"
    return proc, int(match.group(1))


@contextlib.contextmanager
def reaped(proc: subprocess.Popen):
    """``proc`` for the block; on the way out, killed and reaped if it still runs (a test
    that fails never leaves a server behind)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def post(conn: http.client.HTTPConnection, path: str, body: dict) -> int:
    raw = json.dumps(body).encode()
    conn.request("POST", path, raw, {"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    return response.status


def sync_and_serve(port: int) -> None:
    """One judged round: serve a prompt, sync with a flush, serve it again."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    generate = {"text": "the prompt", "sampling_params": {"max_new_tokens": 2}}
    assert post(conn, "/generate", generate) == 200
    assert post(conn, "/pause_generation", {"mode": "abort"}) == 200
    assert post(conn, "/update_weights_from_disk", {"model_path": "/ckpt/1"}) == 200
    assert post(conn, "/continue_generation", {}) == 200
    assert post(conn, "/generate", generate) == 200
    conn.close()


def load(port: int, stop: threading.Event, answers: list[int]) -> None:
    """One client thread: keep-alive requests until ``stop`` or the server goes away."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        i = 0
        while not stop.is_set():
            i += 1
            body = {"text": f"prompt {i % 7}", "sampling_params": {"max_new_tokens": 1}}
            answers.append(post(conn, "/generate", body))
    except (OSError, http.client.HTTPException):
        pass  # the server stopped: expected


@pytest.mark.slow
def test_sigterm_under_a_50_thread_load_gives_a_verdict_20_times_in_20(tmp_path):
    for attempt in range(20):
        here = tmp_path / str(attempt)
        here.mkdir()
        proc, port = start(here, "reference", "--json", str(here / "report.json"))
        with reaped(proc):
            sync_and_serve(port)
            stop = threading.Event()
            answers: list[int] = []
            threads = [
                threading.Thread(target=load, args=(port, stop, answers), daemon=True)
                for _ in range(50)
            ]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 10
            while len(answers) < 50 and time.monotonic() < deadline:
                time.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            stdout, _ = proc.communicate(timeout=60)
            stop.set()
            for t in threads:
                t.join(timeout=30)
        assert answers, f"attempt {attempt}: no request answered under load"
        # Answered requests are served (200); none gets a half-judged reply (a 503 would
        # be the closed session's refusal).
        assert set(answers) <= {200, 503}, (attempt, sorted(set(answers)))
        assert proc.returncode == 0, (attempt, proc.returncode, stdout[-2000:])
        assert "PASS" in stdout, (attempt, stdout[-2000:])
        report = json.loads((here / "report.json").read_text())
        assert [r["verdict"] for r in report] == ["PASS"], (attempt, report)
        traces = list((here / "out").glob("serve-*.jsonl"))
        assert len(traces) == 1, (attempt, traces)
        served = sum(1 for a in answers if a == 200)
        steps = sum(1 for line in traces[0].read_text().splitlines() if '"step"' in line)
        # Every request answered 200 is in the trace (5 of the first round, the load's).
        assert steps >= served + 5 - 1, (attempt, steps, served)


def test_sigint_gives_the_verdict_as_sigterm_does(tmp_path):
    proc, port = start(tmp_path)
    with reaped(proc):
        sync_and_serve(port)
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, stdout
    assert "PASS" in stdout and list((tmp_path / "out").glob("serve-*.jsonl")), stdout


def test_a_second_signal_exits_at_once_with_the_trace_written(tmp_path):
    """The engine's ``close`` hangs after the verdict: the second SIGTERM ends serve with 2
    within seconds, the session trace already written."""
    (tmp_path / "slow_close.py").write_text(SLOW_CLOSE)
    proc, port = start(tmp_path, "slow_close:make")
    with reaped(proc):
        sync_and_serve(port)
        proc.send_signal(signal.SIGTERM)
        out = tmp_path / "out"
        deadline = time.monotonic() + 30
        while not list(out.glob("serve-*.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=30)
        took = time.monotonic() - started
    assert proc.returncode == 2, stdout
    assert took < 10, took
    traces = list((tmp_path / "out").glob("serve-*.jsonl"))
    assert traces and '"verdict": "PASS"' in traces[0].read_text()


HANGS_ON_SERVE = """
import time
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint


class HangsOnServe(InProcessAdapter):
    def apply(self, action):
        if action.name == "ServeRequest":
            time.sleep(600)
        return super().apply(action)


def make():
    return HangsOnServe(ReferenceEndpoint, "hangs-on-serve")
"""


def test_an_engine_call_that_hangs_is_timed_out_and_the_verdict_is_error(tmp_path):
    """The in-process engine's calls run on serve's main thread under the SIGALRM watchdog:
    ``--timeout`` ends a hung ``generate`` with the engine's 500, and the session's
    verdict is ERROR (exit 2), never PASS."""
    (tmp_path / "hangs_on_serve.py").write_text(HANGS_ON_SERVE)
    proc, port = start(tmp_path, "hangs_on_serve:make", "--timeout", "1")
    with reaped(proc):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        started = time.monotonic()
        status = post(conn, "/generate", {"text": "hi", "sampling_params": {}})
        took = time.monotonic() - started
        conn.close()
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=60)
    assert status == 500 and took < 10, (status, took)
    assert proc.returncode == 2, stdout[-2000:]
    assert "ERROR" in stdout and "PASS" not in stdout.split("verdict:")[-1][:20], stdout[-2000:]
