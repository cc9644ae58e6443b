"""The replay line ``kvfence serve`` prints after a FAIL reproduces the session: run as
printed, it exits 1 (FAILED) with the rule the session broke."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
from test_serve import rollout, serve

COMPLETION = {"prompt": "The capital of France is", "max_tokens": 2}


def reset_before_update(http, api: str) -> None:
    """A trainer's own fault on a correct engine: reset, then update, then resume (CLI-008)."""
    if api == "sglang":
        assert http.post("/pause_generation", json={"mode": "abort"}).status_code == 200
        assert http.post("/flush_cache").status_code == 200
        body = {"model_path": "/ckpt/step-1", "flush_cache": False}
        assert http.post("/update_weights_from_disk", json=body).status_code == 200
        assert http.post("/continue_generation", json={}).status_code == 200
        return
    assert http.post("/pause?mode=abort&clear_cache=false").status_code == 200
    assert http.post("/reset_prefix_cache").json() == {"success": True}
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/step-1"}}
    assert http.post("/collective_rpc", json=rpc).status_code == 200
    assert http.post("/resume").status_code == 200


def stale_session(http, api: str) -> None:
    """Serve, sync through a flush the engine only claims (PF-22), serve again."""
    if api == "sglang":
        rollout(http)
        assert http.post("/pause_generation", json={"mode": "abort"}).status_code == 200
        body = {"model_path": "/ckpt/step-1", "flush_cache": False}
        assert http.post("/update_weights_from_disk", json=body).status_code == 200
        http.post("/flush_cache")
        assert http.post("/continue_generation", json={}).status_code == 200
        rollout(http)
        return
    assert http.post("/v1/completions", json=COMPLETION).status_code == 200
    assert http.post("/pause?mode=keep").status_code == 200
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/step-1"}}
    assert http.post("/collective_rpc", json=rpc).status_code == 200
    http.post("/reset_prefix_cache")
    assert http.post("/resume").status_code == 200
    http.post("/v1/completions", json=COMPLETION)


@pytest.mark.parametrize("api", ["sglang", "vllm"])
@pytest.mark.parametrize(
    ("engine", "session"),
    [("flush-is-a-stub", stale_session), ("reference", reset_before_update)],
    ids=["engine-fault", "client-rule"],
)
def test_the_printed_replay_line_fails_as_the_session_did(tmp_path, api, engine, session):
    with serve(tmp_path, engine, api) as s:
        session(s.http, api)
        assert s.stop() == 1, s.stdout
    flat = s.stdout.replace("\n", " ")
    match = re.search(r"replay it: (kvfence replay \S+(?: --\S+ \S+)*)", flat)
    assert match, s.stdout
    line = match.group(1)
    assert f"--client serve:{api}" in line, line
    words = shlex.split(line)
    env = {**os.environ, "COLUMNS": "200"}
    r = subprocess.run(
        [sys.executable, "-m", "kvfence.conformance.cli", *words[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.startswith("FAILED"), r.stdout
    broken = set(re.findall(r"violated (\S+)", r.stdout))
    assert broken & set(re.findall(r"\b([A-Z]{2,3}-\d{3})\b", s.stdout)), (broken, s.stdout)
