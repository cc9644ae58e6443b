"""A serve session's trace is linear in its traffic (no repeated snapshots of the cache)
and replays: 1,000 distinct prompts, then a stale reuse at the end that replay must find."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvfence.conformance.serve import Session
from kvfence.conformance.trace import read_trace, write_trace


def session_of(tmp_path, prompts: int) -> Session:
    """``prompts`` distinct prompts, an update without a flush, then the first prompt
    again: INV-001 on the last request (the trainer skipped the flush)."""
    session = Session("sglang", "reference", out_dir=tmp_path / "out")
    for i in range(prompts):
        body = json.dumps({"text": f"prompt number {i}"}).encode()
        assert session.handle("POST", "/generate", body)[0] == 200
    for path, body in [
        ("/pause_generation", {"mode": "abort"}),
        ("/update_weights_from_disk", {"model_path": "/c/1", "flush_cache": False}),
        ("/continue_generation", {}),
        ("/generate", {"text": "prompt number 0"}),
    ]:
        assert session.handle("POST", path, json.dumps(body).encode())[0] == 200
    return session


def test_the_trace_grows_linearly_with_distinct_prompts(tmp_path):
    sizes = {}
    for n in (50, 200):
        session = session_of(tmp_path / str(n), n)
        assert str(session.result(write=True).verdict) == "FAIL"
        sizes[n] = session.trace_path.stat().st_size
    # Quadratic growth (a cache listing per line) would give ~16x; linear ~4x.
    assert sizes[200] < 5 * sizes[50], sizes


def test_a_cache_delta_round_trips(tmp_path):
    session = session_of(tmp_path, 30)
    session.result(write=True)
    trace = read_trace(session.trace_path)
    assert '"cache_delta"' in session.trace_path.read_text()
    back = tmp_path / "back.jsonl"
    write_trace(back, trace.header, trace.steps, trace.verdict)
    again = read_trace(back)
    caches = [s.observed.view.cache for s in trace.steps if s.observed and s.observed.view]
    assert caches == [s.observed.view.cache for s in again.steps if s.observed and s.observed.view]
    assert caches == [
        s.observed.view.cache for s in session.lockstep.steps if s.observed and s.observed.view
    ]


def test_a_delta_with_no_earlier_cache_is_a_trace_error(tmp_path):
    session = session_of(tmp_path, 30)
    session.result(write=True)
    lines = session.trace_path.read_text().splitlines()
    deltas = [i for i, line in enumerate(lines) if '"cache_delta"' in line]
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join([lines[0], *lines[deltas[0] :]]) + "\n")
    r = subprocess.run(
        [sys.executable, "-m", "kvfence.conformance.cli", "replay", str(cut), "--model-only"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "no earlier step showed a cache" in r.stdout, r.stdout


@pytest.mark.slow
def test_a_1000_prompt_session_replays(tmp_path):
    session = session_of(tmp_path, 1000)
    result = session.result(write=True)
    assert str(result.verdict) == "FAIL" and "INV-001" in result.caught()
    size = session.trace_path.stat().st_size
    assert size < 1004 * 4096, size  # ~1 KB a request, not 100 MB
    env = {**os.environ, "COLUMNS": "200"}
    for extra in (["--model-only"], []):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvfence.conformance.cli",
                "replay",
                str(session.trace_path),
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stdout.startswith("FAILED") and "INV-001" in r.stdout, r.stdout
