"""Peer checks that cannot run here, each a named skip with the measured reason and the
command that would install the client, so that no framework of the peer lane is silently
dropped (docs/clients.md, "Peer check"; docs/findings.md, "Not run, with the reason").

The frameworks that do run: SkyRL 0.3.0 (``test_peer.py``), SkyRL 0.4.0
(``test_peer_skyrl4.py``), TRL 1.16.0 (``test_peer_trl.py``), AReaL 1.0.4
(``test_peer_areal.py``), verl 0.9.1 (``test_peer_verl.py``), Trinity-RFT 0.6.0
(``test_peer_trinity.py``).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.peer

ART_0518 = (
    "openpipe-art 0.5.18 syncs over HTTP against vLLM only in its dedicated mode "
    "(art/unsloth/service.py, art/megatron/weights/merged_weight_export.py), and neither path "
    "runs on CPU: the merged-weights sync calls torch.cuda.synchronize() and asserts the model "
    "is on a CUDA device before its first request; the LoRA sync loads a new adapter name each "
    "step (`{model}@{step}` via /v1/load_lora_adapter), which serve's one-adapter endpoint "
    "answers 501 from the second step, and both paths then call ART's own runtime route "
    "/art/set_served_model_name (art_vllm_runtime 0.1.0, not vLLM's), a 404 on serve. Install on "
    "a CUDA machine: `pip install 'openpipe-art[backend]==0.5.18'`"
)


@pytest.mark.skip(reason=ART_0518)
def test_openpipe_art_0518_dedicated_sync():
    """Named skip: see ``ART_0518``."""
