"""Peer check: SkyRL 0.4.0's weight-sync client (``SkyrlWeightSyncClient``,
``skyrl/backends/skyrl_train/weight_sync/control_plane.py``), installed unmodified from the
package index on a Python >= 3.12 (skyrl 0.4.0's ``Requires-Python``), drives ``kvfence
serve --api vllm`` through its checkpoint-delta engine's sync (``tests/peer/
skyrl4_sync.py``: pause with ``keep``, reset, start, update, finish, resume).

The driver runs in ``KVFENCE_SKYRL4_PYTHON``, else ``.venv-skyrl4/bin/python``
(``scripts/install-peer.sh skyrl4`` makes it from a ``python3.12`` or ``python3.13`` on
PATH); without one the module is skipped with that reason. One driver process drives four
servers:

* the reference engine: FAIL CLI-008 (the reset comes before the update: KV cached
  between the reset and the end of the update would be reused) and CLI-007 (the reset is
  asked under a ``keep`` pause with ``reset_running_requests`` in the JSON body, which vLLM
  reads from the query string only), while no stale KV is served on serve (INV-001 PASS:
  serve keeps no request in place);
* ``flush-is-a-stub`` behind serve (PF-22): FC-003, the verdict flips to the engine's fault;
* SkyRL's own switch that skips the reset (``_should_reset_prefix_cache`` false: fully
  async without ``clear_kv_cache_on_weight_sync``): INV-001, KV of the old weights served;
* ``--refuse-resets 1``: ``reset_prefix_cache`` returns ``None`` whatever the body says
  (``_post`` raises only on an HTTP status >= 400; vLLM answers a refused reset 200
  ``{"success": false}``), the sync goes on, and the prompt cached before the update is
  served from KV of the old weights: INV-001 (and CLI-002, the reset owed after the update).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from peer_lane import run_peer

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "peer" / "skyrl4_sync.py"
LOCAL = ROOT / ".venv-skyrl4" / "bin" / "python"
SKYRL4_PYTHON = os.environ.get("KVFENCE_SKYRL4_PYTHON") or (str(LOCAL) if LOCAL.exists() else None)

pytestmark = [
    pytest.mark.peer,
    pytest.mark.skipif(
        not SKYRL4_PYTHON,
        reason="no Python >= 3.12 with skyrl 0.4.0: set KVFENCE_SKYRL4_PYTHON or run "
        "`bash scripts/install-peer.sh skyrl4 .venv/bin/python` (needs python3.12 or "
        "python3.13 on PATH; docs/clients.md, 'Your trainer in CI')",
    ),
]

SERVERS = [
    ("reset", "reference", ()),
    ("reset", "flush-is-a-stub", ()),
    ("no-reset", "reference", ()),
    ("reset", "reference", ("--refuse-resets", "1")),
]


def violated(verdict: dict) -> dict[str, str]:
    """Rule -> class of each violation."""
    return {v["rule"]: v["class"] for v in verdict["violations"]}


def test_skyrl_040_client_verdicts(tmp_path):
    run = run_peer(SKYRL4_PYTHON, DRIVER, tmp_path, "vllm", SERVERS, timeout=300)
    calls, verdicts, codes = run.calls, run.verdicts, run.codes
    # SkyRL's own calls all answered: the verdicts are about what they did
    assert all(c["ok"] for c in calls), calls
    resets = [c for c in calls if c["call"] == "reset_prefix_cache"]
    assert [c["server"] for c in resets] == [0, 1, 3]  # the switch skips it
    assert {c["returned"] for c in resets} == {"None"}  # the body is never read
    reference, stub, no_reset, refused = (violated(v) for v in verdicts)
    assert codes == [1, 1, 1, 1], codes
    assert {"CLI-007", "CLI-008"} <= set(reference), reference
    assert "INV-001" not in reference, reference
    # the stub answers its reset without a flush result (LIV-001); SkyRL resets before the
    # update, when every entry is of the weights in force, which a flush may keep, so the
    # stub's missing flush is not FC-003 there
    assert stub.get("LIV-001") == "availability", stub
    assert no_reset.get("INV-001") == "safety", no_reset
    assert refused.get("INV-001") == "safety" and "CLI-002" in refused, refused
