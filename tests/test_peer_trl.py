"""Peer check: TRL's vLLM client (``trl`` 1.16.0 ``VLLMClient``), installed unmodified from
the package index beside the torch and vLLM the vLLM lane installs, drives ``kvfence serve
--api vllm`` through the sync TRL's trainer makes in server mode (``tests/peer/
trl_sync.py``: update the parameters, reset the prefix cache, generate).

The driver runs in ``KVFENCE_TRL_PYTHON``, else ``.venv-trl/bin/python`` (a Python with
trl, torch and vLLM importable; docs/clients.md says how to make one); without one the
module is skipped with that reason (``scripts/setup.sh`` makes ``.venv-trl`` with
``scripts/install-trl.sh``). One driver process drives three
servers in turn (torch and vLLM imported once, about a minute on two loaded cores):

* the reference engine: PASS (the reset follows the update, no stale KV);
* ``flush-is-a-stub`` behind serve (PF-22, the reset claims success and keeps the KV):
  FAIL FC-003, the verdict flips on a faulty engine;
* ``--refuse-resets 1``: TRL reads nothing of ``/reset_prefix_cache``'s ``{"success":
  false}`` (``reset_prefix_cache`` returns ``None``), resumes generating, and serves KV of
  the old weights: FAIL CLI-010 and INV-001.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from peer_lane import run_peer

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "peer" / "trl_sync.py"
LOCAL = ROOT / ".venv-trl" / "bin" / "python"
TRL_PYTHON = os.environ.get("KVFENCE_TRL_PYTHON") or (str(LOCAL) if LOCAL.exists() else None)

pytestmark = [
    pytest.mark.peer,
    pytest.mark.skipif(
        not TRL_PYTHON,
        reason="no Python with trl 1.16.0, torch and vLLM: set KVFENCE_TRL_PYTHON "
        "(docs/clients.md, 'Your trainer in CI')",
    ),
]

SERVERS = [
    ("reference", ()),
    ("flush-is-a-stub", ()),
    ("reference", ("--refuse-resets", "1")),
]


def test_trl_client_verdicts(tmp_path):
    servers = [(None, engine, extra) for engine, extra in SERVERS]
    run = run_peer(TRL_PYTHON, DRIVER, tmp_path, "vllm", servers)
    calls, verdicts, codes = run.calls, run.verdicts, run.codes
    # TRL's own calls all answered: the verdicts are about what they did
    assert all(c["ok"] for c in calls), calls
    reset = [c for c in calls if c["call"] == "reset_prefix_cache"]
    assert [c["returned"] for c in reset] == ["None"] * 3  # the body is never read
    reference, stub, refused = verdicts
    assert reference["verdict"] == "PASS" and codes[0] == 0, reference
    assert stub["verdict"] == "FAIL" and codes[1] == 1, stub
    assert "FC-003" in {v["rule"] for v in stub["violations"]}, stub["violations"]
    assert refused["verdict"] == "FAIL" and codes[2] == 1, refused
    assert {"CLI-010", "INV-001"} <= {v["rule"] for v in refused["violations"]}
