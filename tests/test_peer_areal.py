"""Peer check: AReaL's SGLang client (``areal`` 1.0.4 ``RemoteSGLangEngine``), installed
unmodified from the package index beside the torch the vLLM lane installs, drives
``kvfence serve --api sglang`` through the syncs AReaL's FSDP trainer makes
(``tests/peer/areal_sync.py``): its disk path and its distributed (XCCL) path, each
pause, update, continue between generations of the same token ids.

The driver runs in ``KVFENCE_AREAL_PYTHON``, else ``.venv-areal/bin/python`` (a Python with
areal and torch importable; ``scripts/install-peer.sh areal`` makes it, docs/clients.md);
without one the module is skipped with that reason. One driver process drives six servers
in turn (torch imported once), three per path:

* the reference engine: PASS. AReaL never calls ``/flush_cache``: the flush is the
  update's own (``flush_cache`` omitted, SGLang's default true), after a pause that
  aborts what runs and with ``abort_all_requests`` (``areal/engine/sglang_remote.py``),
  so the update flushes an idle cache;
* ``update-never-flushes`` behind serve (an update that ignores its flush): FAIL, the
  verdict flips on a faulty engine. AReaL has no switch of its own that skips the flush
  (it never sends ``flush_cache``), so there is no skip variant to run;
* ``--refuse-resets 1``: AReaL asks no reset, so none is refused (the refusal stays
  undrawn) and the session PASSes with CLI-010 not exercised: its real behaviour, a
  framework that leaves the flush to the update, cannot ignore a refused reset.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from peer_lane import run_peer

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "peer" / "areal_sync.py"
LOCAL = ROOT / ".venv-areal" / "bin" / "python"
AREAL_PYTHON = os.environ.get("KVFENCE_AREAL_PYTHON") or (str(LOCAL) if LOCAL.exists() else None)

pytestmark = [
    pytest.mark.peer,
    pytest.mark.skipif(
        not AREAL_PYTHON,
        reason="no Python with areal 1.0.4 and torch: set KVFENCE_AREAL_PYTHON or run "
        "`bash scripts/install-peer.sh areal .venv/bin/python` (docs/clients.md, "
        "'Your trainer in CI')",
    ),
]

SERVERS = [
    ("reference", ()),
    ("update-never-flushes", ()),
    ("reference", ("--refuse-resets", "1")),
]
MODES = ("disk", "xccl")


def rules(verdict: dict, outcome: str) -> set[str]:
    return {r["id"] for r in verdict["rules"] if r["verdict"] == outcome}


def test_areal_client_verdicts(tmp_path):
    servers = [(mode, engine, extra) for mode in MODES for engine, extra in SERVERS]
    run = run_peer(AREAL_PYTHON, DRIVER, tmp_path, "sglang", servers)
    calls, verdicts, codes, traffic = run.calls, run.verdicts, run.codes, run.traffic
    # AReaL's own calls all answered: the verdicts are about what they did
    assert all(c["ok"] for c in calls), calls
    assert len(calls) == 2 * 3 * 6 + 3, calls  # xccl adds init_weights_update_group
    for k, mode in enumerate(MODES):
        reference, faulty, refused = verdicts[3 * k : 3 * k + 3]
        paths = [e["path"] for e in traffic[3 * k]["traffic"]]
        update = (
            "/update_weights_from_disk" if mode == "disk" else "/update_weights_from_distributed"
        )
        assert update in paths and "/flush_cache" not in paths, paths
        assert reference["verdict"] == "PASS" and codes[3 * k] == 0, (mode, reference)
        assert "REACH-001" in rules(reference, "PASS"), reference["rules"]
        assert faulty["verdict"] == "FAIL" and codes[3 * k + 1] == 1, (mode, faulty)
        assert "ENG-002" in {v["rule"] for v in faulty["violations"]}, faulty["violations"]
        assert refused["verdict"] == "PASS" and codes[3 * k + 2] == 0, (mode, refused)
        assert "CLI-010" not in rules(refused, "PASS") | rules(refused, "FAIL"), refused["rules"]
