"""Peer check: verl's SGLang HTTP adapter (``verl`` 0.9.1 ``AsyncHttpServerAdapter``),
installed unmodified from the package index beside the torch the vLLM lane installs,
drives ``kvfence serve --api sglang`` through the sync verl's rollout makes
(``tests/peer/verl_sync.py``: ``update_weights_from_tensor``, then ``flush_cache``).

The driver runs in ``KVFENCE_VERL_PYTHON``, else ``.venv-verl/bin/python`` (verl, the
``sglang`` source it imports, and torch; ``scripts/install-peer.sh verl``); without one the
module is skipped with that reason. One driver process drives four servers:

* the reference engine: PASS;
* ``update-never-flushes`` behind serve (an update that ignores its flush): ENG-002. verl
  has no switch of its own that skips the flush (SGLang's ``update_weights`` util, which
  verl calls per bucket, leaves ``flush_cache`` at true, and ``flush_cache()`` follows);
* ``--refuse-resets 1``: verl retries the refused ``/flush_cache`` and the second try
  succeeds: PASS, CLI-010 PASS (it acts on the refusal);
* ``--refuse-resets 4`` (every try of an adapter built with ``max_attempts=1``: 4 = 1 * 4):
  verl gives up, returns ``{}`` and generation resumes; the session still PASSes, CLI-010
  included, because the update had already flushed (``flush_cache`` true): the explicit
  flush is a second one, and giving it up leaves no KV of the old weights.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from peer_lane import run_peer

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "peer" / "verl_sync.py"
LOCAL = ROOT / ".venv-verl" / "bin" / "python"
VERL_PYTHON = os.environ.get("KVFENCE_VERL_PYTHON") or (str(LOCAL) if LOCAL.exists() else None)

pytestmark = [
    pytest.mark.peer,
    pytest.mark.skipif(
        not VERL_PYTHON,
        reason="no Python with verl 0.9.1, sglang 0.5.17's source and torch: set "
        "KVFENCE_VERL_PYTHON or run `bash scripts/install-peer.sh verl .venv/bin/python` "
        "after scripts/install-sglang.sh (docs/clients.md, 'Your trainer in CI')",
    ),
]

SERVERS = [
    ("reference", ()),
    ("update-never-flushes", ()),
    ("reference", ("--refuse-resets", "1")),
    ("reference", ("--refuse-resets", "4")),
]


def outcome(verdict: dict, rule: str) -> str:
    return next(r["verdict"] for r in verdict["rules"] if r["id"] == rule)


def test_verl_adapter_verdicts(tmp_path):
    servers = [(None, engine, extra) for engine, extra in SERVERS]
    run = run_peer(VERL_PYTHON, DRIVER, tmp_path, "sglang", servers)
    calls, verdicts, codes, traffic = run.calls, run.verdicts, run.codes, run.traffic
    assert all(c["ok"] for c in calls), calls
    flushes = [c["returned"] for c in calls if c["call"] == "flush_cache"]
    assert "Cache flushed" in flushes[2] and flushes[3] == "{}", flushes  # retried; gave up
    tries = [sum(e["path"] == "/flush_cache" for e in t["traffic"]) for t in traffic]
    assert tries[2:] == [2, 4], tries
    reference, faulty, once, always = verdicts
    assert reference["verdict"] == "PASS" and codes[0] == 0, reference
    assert outcome(reference, "REACH-001") == "PASS", reference["rules"]
    assert faulty["verdict"] == "FAIL" and codes[1] == 1, faulty
    assert "ENG-002" in {v["rule"] for v in faulty["violations"]}, faulty["violations"]
    for refused, code in ((once, codes[2]), (always, codes[3])):
        assert refused["verdict"] == "PASS" and code == 0, refused
        assert outcome(refused, "CLI-010") == "PASS", refused["rules"]
