"""Peer check: Trinity-RFT's SGLang client (``trinity-rft`` 0.6.0 ``SGLangRolloutModel``
over its ``SGLangClient``), installed unmodified from the package index beside the torch
and vLLM the vLLM lane installs, drives ``kvfence serve --api sglang`` through the syncs
Trinity's explorer makes (``tests/peer/trinity_sync.py``): its NCCL path and its
checkpoint path, between generations of the same token ids.

The driver runs in ``KVFENCE_TRINITY_PYTHON``, else ``.venv-trinity/bin/python`` (a Python
with trinity-rft, torch and vLLM importable; ``scripts/install-peer.sh trinity`` makes it,
docs/clients.md); without one the module is skipped with that reason. One driver process
drives twelve servers in turn (torch imported once), four per path; ``nccl`` is the sync
with nothing in flight (the explorer's synchronous styles finish their steps first),
``async`` the same sync with one rollout landing between its flush and its updates (the
fully-async explorer syncs while rollouts run, and ``SGLangRolloutModel`` pauses nothing):

* the reference engine: PASS on every path. The NCCL sync flushes first (``/flush_cache``),
  then sends one ``/update_weights_from_distributed`` per batch of
  ``weight_sync_buffer_size``, ``flush_cache`` true on the last batch only
  (``trinity/common/models/sglang_model.py`` ``sync_model_weights``); the checkpoint sync
  is one ``/update_weights_from_disk`` with SGLang's default flush.
* ``update-never-flushes`` behind serve (an update that ignores its flush): FAIL ENG-002 on
  ``async`` and ``checkpoint``, the verdict flips. On ``nccl`` it PASSes, ENG-002 not
  exercised: the early ``/flush_cache`` left the cache empty and nothing was served until
  the update ended, so there was nothing for the update to keep. Trinity has no switch of
  its own that skips the flush, so there is no skip variant to run.
* ``--refuse-resets 1``: on the NCCL paths ``SGLangClient.flush_cache`` turns the 400 into
  ``False``, which ``sync_model_weights`` discards (``await self.api_client.flush_cache()``,
  line 567 of 0.6.0's ``sglang_model.py``): no retry, the updates go on. The session PASSes,
  CLI-010 included, because the last batch's update flushes after the refusal. The
  checkpoint path asks no reset, so none is refused: PASS, CLI-010 not exercised (SKIP).
* ``update-never-flushes`` with ``--refuse-resets 1``: FAIL ENG-002 on every path, the
  ``nccl`` one included: the refused early flush, not retried, leaves the prompt cached
  before the sync for the faulty update to keep. The update claims a flush after the
  refusal, so CLI-010 is not what fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from peer_lane import run_peer

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "peer" / "trinity_sync.py"
LOCAL = ROOT / ".venv-trinity" / "bin" / "python"
TRINITY_PYTHON = os.environ.get("KVFENCE_TRINITY_PYTHON") or (
    str(LOCAL) if LOCAL.exists() else None
)

pytestmark = [
    pytest.mark.peer,
    pytest.mark.skipif(
        not TRINITY_PYTHON,
        reason="no Python with trinity-rft 0.6.0, torch and vLLM: set KVFENCE_TRINITY_PYTHON "
        "or run `bash scripts/install-peer.sh trinity .venv/bin/python` (docs/clients.md, "
        "'Your trainer in CI')",
    ),
]

SERVERS = [
    ("reference", ()),
    ("update-never-flushes", ()),
    ("reference", ("--refuse-resets", "1")),
    ("update-never-flushes", ("--refuse-resets", "1")),
]
MODES = ("nccl", "async", "checkpoint")


def outcome(verdict: dict, rule: str) -> str | None:
    return next((r["verdict"] for r in verdict["rules"] if r["id"] == rule), None)


def test_trinity_client_verdicts(tmp_path):
    servers = [(mode, engine, extra) for mode in MODES for engine, extra in SERVERS]
    run = run_peer(TRINITY_PYTHON, DRIVER, tmp_path, "sglang", servers)
    calls, verdicts, codes, traffic = run.calls, run.verdicts, run.codes, run.traffic
    # Trinity's own calls all answered: the verdicts are about what they did
    assert all(c["ok"] for c in calls), calls
    for k, mode in enumerate(MODES):
        n = len(SERVERS)
        reference, faulty, refused, both = verdicts[n * k : n * k + n]
        reference_code, faulty_code, refused_code, both_code = codes[n * k : n * k + n]
        paths = [
            [(e["path"], e["status"]) for e in t["traffic"]] for t in traffic[n * k : n * k + n]
        ]
        update = (
            "/update_weights_from_disk"
            if mode == "checkpoint"
            else "/update_weights_from_distributed"
        )
        assert reference["verdict"] == "PASS" and reference_code == 0, (mode, reference)
        assert outcome(reference, "REACH-001") == "PASS", (mode, reference["rules"])
        if mode == "checkpoint":  # the flush is the update's own: no reset asked, none refused
            assert [p for p, _ in paths[0]] == ["/generate", update, "/generate"], paths[0]
            assert faulty["verdict"] == "FAIL" and faulty_code == 1, (mode, faulty)
            assert "ENG-002" in {v["rule"] for v in faulty["violations"]}, faulty["violations"]
            assert refused["verdict"] == "PASS" and refused_code == 0, (mode, refused)
            assert outcome(refused, "CLI-010") == "SKIP", refused["rules"]
            assert both["verdict"] == "FAIL" and both_code == 1, (mode, both)
            assert outcome(both, "CLI-010") == "SKIP", both["rules"]
            continue
        # flush first, then one update per batch (two batches: the last one flushes); on
        # ``async`` the rollout lands between the flush and the updates
        rollout = ["/generate"] if mode == "async" else []
        sync = ["/flush_cache", *rollout, update, update]
        group = ["/init_weights_update_group", "/destroy_weights_update_group"]
        assert [p for p, _ in paths[0]] == [group[0], "/generate", *sync, "/generate", group[1]]
        if mode == "nccl":  # nothing in flight: the early flush leaves the update nothing to keep
            assert faulty["verdict"] == "PASS" and faulty_code == 0, (mode, faulty)
            assert outcome(faulty, "ENG-002") == "SKIP", faulty["rules"]  # nothing to keep
        else:  # a rollout cached between the flush and the updates: kept by the faulty update
            assert faulty["verdict"] == "FAIL" and faulty_code == 1, (mode, faulty)
            assert "ENG-002" in {v["rule"] for v in faulty["violations"]}, faulty["violations"]
        # the refused flush is not retried (its False is discarded); the last batch's flush
        # follows it, so nothing stale is served
        assert ("/flush_cache", 400) in paths[2], paths[2]
        assert [p for p, _ in paths[2]].count("/flush_cache") == 1, paths[2]
        assert refused["verdict"] == "PASS" and refused_code == 0, (mode, refused)
        assert outcome(refused, "CLI-010") == "PASS", (mode, refused["rules"])
        # the same refusal before an update that ignores its flush: the prompt cached before
        # the sync is left in place, and the update keeps it (ENG-002, on ``nccl`` too); the
        # update claims a flush after the refusal, so the judge charges the engine, not
        # CLI-010
        assert both["verdict"] == "FAIL" and both_code == 1, (mode, both)
        assert "ENG-002" in {v["rule"] for v in both["violations"]}, both["violations"]
        # (on ``nccl`` nothing was cached at the refusal but the earlier prompt: not exercised)
        cli_010 = "SKIP" if mode == "nccl" else "PASS"
        assert outcome(both, "CLI-010") == cli_010, (mode, both["rules"])
