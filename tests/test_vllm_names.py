"""The vLLM engine names and what each declares (no vLLM needed: construction is lazy)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.adapters.protocol import AdapterFailure
from kvfence.adapters.registry import ALIASES, REAL_SUMMARIES, VLLM_ENGINES, engine
from kvfence.adapters.vllm_engine import (
    OFFLINE_CAPABILITIES,
    VLLM_MISSING,
    VllmAdapter,
    vllm_installed,
)
from kvfence.model.capabilities import Capability

WANTED = {"lora", "publish", "pause_clear", "two_phase", "restart_oracle", "derived"}


@pytest.mark.parametrize(("name", "guarded"), [("vllm", True), ("vllm-raw", False)])
def test_one_name_declares_every_capability_the_adapter_has(name, guarded):
    """``vllm`` is judged on everything the vLLM adapter can do: LoRA and the RL lifecycle
    capabilities are no longer behind other names (docs/engines.md)."""
    adapter = engine(name)
    assert name in VLLM_ENGINES and adapter.name == name
    assert adapter.capabilities == OFFLINE_CAPABILITIES
    assert {c for c in Capability if c.value in WANTED} <= (adapter.capabilities)
    assert adapter.fixed_configs[0].lora and adapter.fixed_configs[0].derived
    assert adapter.lora_fresh_path is guarded
    assert (adapter.fail_closed, adapter.label_updates) == (guarded, guarded)


@pytest.mark.parametrize(("old", "new"), sorted(ALIASES.items()))
def test_old_names_are_aliases_of_the_one_name(old, new):
    alias, canonical = engine(old), engine(new)
    assert alias.name == new
    assert alias.capabilities == canonical.capabilities
    assert alias.fixed_configs == canonical.fixed_configs
    assert (alias.fail_closed, alias.lora_fresh_path) == (
        canonical.fail_closed,
        canonical.lora_fresh_path,
    )
    assert "alias of" in REAL_SUMMARIES[old]


def test_the_battery_runs_whole_on_vllm_at_ci():
    """The ci check's battery is not cut to vLLM's random-search budget: every scenario the
    engine can run starts (checked on the reference engine dressed as vLLM: its
    capabilities and its one fixed endpoint), and the never-flush client FAILs INV-001 in
    it."""
    from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
    from kvfence.adapters.registry import client
    from kvfence.conformance.battery import load, run_battery
    from kvfence.conformance.record import Recorder
    from kvfence.conformance.runner import Options, battery_budget

    vllm = engine("vllm")
    dressed = InProcessAdapter(ReferenceEndpoint, "dressed-as-vllm")
    dressed.capabilities = vllm.capabilities
    dressed.fixed_configs = vllm.fixed_configs
    rec = Recorder()
    run = run_battery(dressed, client("reference"), load(), rec, 60.0)
    started = rec.examples
    assert battery_budget(vllm, Options()) >= started > vllm.budget["max_examples"]
    assert battery_budget(vllm, Options(max_examples=5)) is None
    assert run.failed == 0 and run.ran >= 20
    exercised = set(rec.exercised)
    assert {"ENG-007", "PUB-001", "PUB-002", "WIN-001", "DER-001", "INV-001"} <= exercised
    rec = Recorder()
    run = run_battery(dressed, client("never-flush"), load(), rec, 60.0)
    assert run.failed == 1 and "INV-001" in {v.rule for v in rec.failure.violations}


def test_lora_is_offline_only():
    with pytest.raises(ValueError, match="LoRA"):
        VllmAdapter("http", lora=True)


@pytest.mark.parametrize("name", ["vllm", "vllm-raw", "vllm-http"])
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


def test_a_folder_named_vllm_is_not_vllm(monkeypatch):
    """A ``vllm`` folder without ``__init__.py`` on the path (``tests/vllm`` itself, with
    ``tests/`` on ``sys.path`` as pytest puts it) is a namespace package to ``find_spec``:
    not vLLM. The engine says vLLM is not installed, naming the install script, instead of
    failing later on torch missing."""
    namespace = importlib.machinery.ModuleSpec("vllm", None, is_package=True)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: namespace if name == "vllm" else real(name)
    )
    assert not vllm_installed()
    adapter = engine("vllm")
    with pytest.raises(AdapterFailure, match=r"vLLM is not installed.*install-vllm\.sh"):
        adapter.start(adapter.fixed_configs)


def test_without_vllm_its_test_modules_skip_saying_so(tmp_path):
    """Where vLLM is not installed, every module of ``tests/vllm`` that imports it is
    skipped whole at collection, naming the install script (``tests/vllm/conftest.py``),
    and the two that import none are collected as usual: no module errors."""
    (tmp_path / "no_vllm.py").write_text(
        "import kvfence.adapters.vllm_engine as v\nv.vllm_installed = lambda: False\n"
    )
    root = Path(__file__).parent.parent
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, "-m", "pytest", "-p", "no_vllm", "tests/vllm", "--co", "-q"]
    out = subprocess.run(
        [*cmd, "-n", "0", "-rs", "-p", "no:randomly"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    skipped = re.findall(r"SKIPPED \[1\] \S+: (test_vllm_\w+\.py): (.*)", out)
    assert {name for name, _ in skipped} == {
        f"test_vllm_{m}.py" for m in ("driver", "engine", "findings", "lifecycle")
    }, out
    assert all(reason == VLLM_MISSING for _, reason in skipped), out
    assert "tests/vllm/test_vllm_quiet.py::" in out and "error" not in out.lower(), out
