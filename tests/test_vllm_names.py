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


@pytest.mark.parametrize("name", ["vllm", "vllm-raw", "vllm-lora", "vllm-http"])
def test_every_capability_not_declared_says_why(name):
    """The SKIP notes carry the real reason (docs/engines.md): sleep is CPU's, not ours."""
    from kvfence.conformance.runner import missing_reasons

    adapter = engine(name)
    reasons = missing_reasons(adapter)
    assert set(reasons) == {c.value for c in Capability} - set(adapter.capabilities)
    assert "CUDA, ROCm and XPU only" in reasons["sleep"]


def test_skip_notes_name_the_engines_reason():
    from kvfence.conformance.record import Recorder
    from kvfence.conformance.runner import _rule_verdicts

    caps = frozenset(Capability) - {Capability.SLEEP}
    verdicts = {
        v.rule.id: v
        for v in _rule_verdicts(Recorder(), [], None, caps, False, reasons={"sleep": "no CPU"})
    }
    assert verdicts["ENG-006"].reason == "needs sleep (sleep: no CPU)"
    plain = {v.rule.id: v for v in _rule_verdicts(Recorder(), [], None, caps, False)}
    assert plain["ENG-006"].reason == "needs sleep"


def test_missing_reasons_must_name_capabilities():
    from kvfence.conformance.runner import missing_reasons

    class Bad:
        missing_reasons = {"slep": "typo"}

    with pytest.raises(ValueError, match="slep"):
        missing_reasons(Bad())
