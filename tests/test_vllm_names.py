"""The vLLM engine names and what each declares (no vLLM needed: construction is lazy)."""

from __future__ import annotations

import pytest

from kvfence.adapters.registry import VLLM_ENGINES, engine
from kvfence.adapters.vllm_engine import VllmAdapter
from kvfence.model.capabilities import Capability


@pytest.mark.parametrize(
    ("name", "lora", "fresh_path", "guarded"),
    [
        ("vllm", False, True, True),
        ("vllm-raw", False, False, False),
        ("vllm-lora", True, True, True),
        ("vllm-lora-raw", True, False, False),
    ],
)
def test_offline_names(name, lora, fresh_path, guarded):
    adapter = engine(name)
    assert name in VLLM_ENGINES
    assert adapter.name == name
    assert (Capability.LORA in adapter.capabilities) is lora
    assert adapter.fixed_configs[0].lora is lora
    assert adapter.lora_fresh_path is fresh_path
    assert (adapter.fail_closed, adapter.label_updates) == (guarded, guarded)


def test_lora_is_offline_only():
    with pytest.raises(ValueError, match="LoRA"):
        VllmAdapter("http", lora=True)
