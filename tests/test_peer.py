"""Peer check (issue 11 item 4): a real RL framework's weight-sync client, installed
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
    with serve(tmp_path, "reference", api="vllm") as s:
        r = subprocess.run(
            [peer_python(), str(DRIVER), s.url], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr[-3000:]
        calls = [json.loads(line) for line in r.stdout.splitlines() if '"call"' in line]
        by_name = {c["call"]: c for c in calls}
        # SkyRL's own calls reached the vLLM routes and were answered in vLLM's shapes.
        assert by_name["pause"]["ok"] and by_name["reset_prefix_cache"]["ok"]
        assert by_name["resume"]["ok"]
        assert [c["ok"] for c in calls if c["call"] == "completion"] == [True, True]
        # Its two-phase update waits for the model's two-phase actions: answered 501 with
        # the action named, never silently accepted.
        for name in ("start_weight_update", "finish_weight_update"):
            assert by_name[name]["status"] == 501, by_name[name]
            assert "FinishWeightUpdate" in by_name[name]["error"]
        verdict = s.http.get("/kvfence/verdict").json()
        code = s.stop()
    # No weight update was judged, so no PASS: UNKNOWN (exit 2), with the pending routes.
    assert verdict["verdict"] == "UNKNOWN" and code == 2, verdict
    assert any("FinishWeightUpdate" in w for w in verdict["warnings"])
    log = json.loads(Path(verdict["trace"]).with_suffix(".traffic.json").read_text())
    paths = [e["path"].split("?")[0] for e in log["traffic"]]
    assert paths.count("/collective_rpc") == 2 and "/pause" in paths
