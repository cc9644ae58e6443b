"""Peer check: a real RL framework's weight-sync client, installed
unmodified from the package index, drives ``kvfence serve`` over HTTP.

The client is SkyRL 0.3.0's ``RemoteInferenceClient`` (it talks to vLLM's own routes:
``/pause``, ``/collective_rpc``, ``/reset_prefix_cache``, ``/resume``, ``/v1/completions``),
run by ``tests/peer/skyrl_sync.py`` in its own Python: ``KVFENCE_PEER_PYTHON``, else
``.venv-peer/bin/python`` (``scripts/setup.sh`` makes it, ~45 s). Skipped with the reason
when neither exists. Why SkyRL and not another framework: docs/clients.md, "Over HTTP".
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from test_serve import serve

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "peer" / "skyrl_sync.py"


def peer_python() -> str | None:
    given = os.environ.get("KVFENCE_PEER_PYTHON")
    if given:
        return given
    local = ROOT / ".venv-peer" / "bin" / "python"
    return str(local) if local.exists() else None


pytestmark = [
    pytest.mark.peer,
    pytest.mark.skipif(
        peer_python() is None,
        reason="no peer Python with SkyRL: set KVFENCE_PEER_PYTHON or run scripts/setup.sh",
    ),
]


def test_skyrl_remote_client_sync_is_judged_by_serve(tmp_path):
    """SkyRL's sync is pause(keep), a two-phase update (start, a chunk, finish), a prefix
    reset after the finish, resume: every call is one model action. The reset follows the
    final weights (CLI-008 PASSes, and no stale KV is served: safety PASS), but it is asked
    while requests are kept in place: SkyRL sends ``reset_running_requests`` in the JSON
    body, which vLLM 0.32 reads from the query string only, so against vLLM's own routes
    the reset is one vLLM refuses while a kept request holds blocks: CLI-007, an
    availability FAIL (SkyRL's own server reads the body field, so there the reset
    preempts instead). ``test_skyrl_sync_without_its_reset_fails`` shows the safety half
    could have failed."""
    with serve(tmp_path, "reference", api="vllm") as s:
        calls = _drive(s.url)
        by_name = {c["call"]: c for c in calls}
        for name in ("pause", "start_weight_update", "update_weights_nccl"):
            assert by_name[name]["ok"], by_name[name]
        for name in ("finish_weight_update", "reset_prefix_cache", "resume"):
            assert by_name[name]["ok"], by_name[name]
        assert [c["ok"] for c in calls if c["call"] == "completion"] == [True, True]
        verdict = s.http.get("/kvfence/verdict").json()
        code = s.stop()
    assert verdict["verdict"] == "FAIL" and code == 1, verdict
    assert {v["rule"] for v in verdict["violations"]} == {"CLI-007"}, verdict["violations"]
    assert verdict["safety"] == "PASS", verdict
    rules = {r["id"]: r["verdict"] for r in verdict["rules"]}
    assert rules["CLI-008"] == "PASS", rules
    log = json.loads(Path(verdict["trace"]).with_suffix(".traffic.json").read_text())
    actions = [e["action"]["action"] for e in log["traffic"] if e.get("action")]
    assert actions == [
        "ServeRequest",
        "PauseGeneration",
        "BeginWeightUpdate",
        "UpdateWeightChunk",
        "FinishWeightUpdate",
        "FlushCache",
        "ContinueGeneration",
        "ServeRequest",
    ], actions
    reset = next(e for e in log["traffic"] if e["path"].startswith("/reset_prefix_cache"))
    assert reset["ignored"] == {"reset_running_requests": True}, reset


def test_skyrl_sync_without_its_reset_fails(tmp_path):
    """The same client with ``reset_prefix_cache`` dropped (a trainer config with
    ``enable_prefix_caching`` misread, ``fsdp_worker.py`` skips the reset): the second
    completion reuses KV of the old weights, INV-001, exit 1."""
    with serve(tmp_path, "reference", api="vllm") as s:
        calls = _drive(s.url, skip="reset_prefix_cache")
        assert "reset_prefix_cache" not in {c["call"] for c in calls}
        verdict = s.http.get("/kvfence/verdict").json()
        code = s.stop()
    assert verdict["verdict"] == "FAIL" and code == 1, verdict
    assert "INV-001" in {v["rule"] for v in verdict["violations"]}


def _drive(url: str, skip: str = "") -> list[dict]:
    cmd = [peer_python(), str(DRIVER), url, *([skip] if skip else [])]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines() if '"call"' in line]
