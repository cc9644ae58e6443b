"""A fuzz campaign shares one example database (``kvfence check --database URL``): a failure
one fuzz process found is replayed first by another process pointed at the same database.

The Redis test starts a real ``redis-server`` on 127.0.0.1 (a free port, no persistence)
and runs two ``kvfence check --profile fuzz`` processes against it, one after the other.
The battery is off in both (``--no-battery``): it would find the fault before the random
search, and what is shown here is the search's database.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvfence.conformance.runner import check_database, example_database

KVFENCE = [sys.executable, "-m", "kvfence.conformance.cli"]
MUTANT = "lora-keyed-by-name"
"""A mutant the fuzz search finds after some examples (12 with seed 1), not at once: its
fault needs a LoRA endpoint, a reload and a reuse."""

REDIS = shutil.which("redis-server")


def _fuzz(out: Path, database: str | None) -> dict:
    """One fuzz check of ``MUTANT`` in a process of its own, unseeded (Hypothesis uses no
    database for a run given an explicit seed): its JSON result."""
    report = out / "result.json"
    argv = [*KVFENCE, "check", "--engine", MUTANT, "--profile", "fuzz"]
    argv += ["--no-battery", "-q", "--out", str(out), "--json", str(report)]
    argv += [] if database is None else ["--database", database]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # FAIL
    (result,) = json.loads(report.read_text())
    return result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
    if REDIS is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    redis = pytest.importorskip("redis", reason="the redis client: pip install 'kvfence[redis]'")
    port = _free_port()
    argv = [REDIS, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly"]
    argv += ["no", "--dir", str(tmp_path)]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("redis-server did not start")
                time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_a_failure_found_by_one_fuzz_process_is_replayed_first_by_another(tmp_path, redis_url):
    import redis

    first = _fuzz(tmp_path / "a", redis_url)
    assert "ENG-007" in {v["rule"] for v in first["violations"]}
    saved = redis.Redis.from_url(redis_url).keys(b"kvfence:*")
    assert saved, "the first process saved nothing to the shared database"
    second = _fuzz(tmp_path / "b", redis_url)
    # the shared failure replayed first, then run once more by Hypothesis to report it
    assert second["examples"] <= 2 < first["examples"], (first["examples"], second["examples"])
    assert "ENG-007" in {v["rule"] for v in second["violations"]}


def test_a_shared_folder_works_the_same(tmp_path):
    shared = tmp_path / "shared-db"
    first = _fuzz(tmp_path / "a", str(shared))
    assert any(p.is_file() for p in shared.rglob("*"))
    second = _fuzz(tmp_path / "b", f"file://{shared}")
    assert second["examples"] <= 2 < first["examples"], (first["examples"], second["examples"])


def test_ci_keeps_no_database():
    with pytest.raises(ValueError, match="dev, fuzz"):
        check_database("redis://127.0.0.1:1/0", "ci", None)
    check_database("redis://127.0.0.1:1/0", "fuzz", None)
    assert type(example_database("/tmp/x")).__name__ == "DirectoryBasedExampleDatabase"
