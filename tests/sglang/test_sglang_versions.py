"""SGLang versions side by side (each installed by ``scripts/install-sglang.sh VERSION``;
a version that is not installed is skipped with that command). scripts/setup.sh installs
0.5.17 and 0.5.22 beside 0.5.23, so CI runs these; they pin what docs/engines.md's version
table says about the others."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from kvfence.adapters.clients import ReferenceClient
from kvfence.adapters.sglang_engine import SglangAdapter
from kvfence.conformance.runner import run_check
from kvfence.conformance.sglang_scenarios import SCENARIOS, judge

pytestmark = pytest.mark.sglang

ROW = {s.name: s for s in SCENARIOS}
GUARD = "exact lane, idle, disk update with flush_cache=false, serve again"
REQUESTED = "standard lane, request running, update with flush_cache=true, serve again"
RETRACT = "retract pause, update with flush, continue"


def need(version: str) -> None:
    home = Path(os.environ.get("KVFENCE_SGLANG_HOME", ".sglang"))
    if not (home / version / "sglang").is_dir() or importlib.util.find_spec("torch") is None:
        pytest.skip(
            f"SGLang {version} is not installed: run `bash scripts/install-sglang.sh {version}`"
        )


@pytest.fixture(scope="module", params=["0.5.22", "0.5.17"])
def version_adapter(request):
    need(request.param)
    adapter = SglangAdapter(request.param)
    yield adapter
    adapter.close()


def test_every_version_lacks_the_exact_lane_guard(version_adapter):
    assert judge(version_adapter, ROW[GUARD]) == "FAIL ENG-001"


def test_where_versions_differ_on_a_refused_flush(version_adapter):
    requested = judge(version_adapter, ROW[REQUESTED])
    retract = judge(version_adapter, ROW[RETRACT])
    if version_adapter.version == "0.5.22":
        # success=false and the stale tree keeps serving; retract then flush works
        assert (requested, retract) == ("FAIL FC-002", "ok")
    else:
        # 0.5.17 asserts after swapping weights (the process exits), and counts the
        # retracted requests, re-queued without KV, against the flush (LIV-001)
        assert "stopped" in requested
        assert retract == "FAIL LIV-001 (stopped)"


OVERLAYS = Path(__file__).parent / "overlays"


@pytest.mark.parametrize("version", ["0.5.17"])
def test_an_overlay_runs_on_a_fresh_host(version):
    """The host applies its compatibility shims (transformers' config registry, the
    torchvision stub) before it loads an overlay, whose parent packages import SGLang:
    0.5.17 registers its own ``qwen3_asr`` config, which transformers 5.x refuses unless
    shimmed (``ValueError: 'qwen3_asr' is already used by a Transformers config``). Each
    host is a fresh spawned interpreter. With the guard overlaid, ENG-001 holds. (0.5.23:
    test_sglang_engine.py's ``guarded`` fixture, the same overlay in a fresh host, in CI.)"""
    need(version)
    adapter = SglangAdapter(version, overlay=OVERLAYS / "exact_guard", lanes=("exact",))
    try:
        adapter.start(adapter.fixed_configs)
        assert adapter.loaded["version"] == version
        bad = judge(adapter, ROW[GUARD])
    finally:
        adapter.close()
    assert bad == "ok"


def test_guard_on_0_5_17_kills_the_scheduler_after_a_retract_pause(tmp_path):
    """docs/findings.md, SGL-A1: the exact-lane guard on 0.5.17's scheduler (the seed
    fork's base). The reference client's sync pauses with retract and updates with a flush;
    0.5.17's ``is_fully_idle`` counts the retracted requests, re-queued without KV, so the
    forced flush is refused and the guard raises: the scheduler process exits. Nothing stale
    is served (no safety rule breaks); the endpoint is lost (LIV-001, availability), in the
    two steps ``StartRequest``, ``SyncWeights``. On 0.5.23 the same pause and update flush."""
    need("0.5.17")
    adapter = SglangAdapter("0.5.17", overlay=OVERLAYS / "exact_guard", lanes=("exact",))
    result = run_check(adapter, ReferenceClient(), out_dir=tmp_path, focus="LIV-001")
    assert result.verdict == "FAIL" and result.caught() == ("LIV-001",), result.violations
    assert result.availability == "FAIL" and result.safety != "FAIL"
    assert result.steps == 2
    steps = [json.loads(line) for line in result.counterexample.read_text().splitlines()]
    actions = [s["action"]["action"] for s in steps if "action" in s]
    assert actions == ["StartRequest", "SyncWeights", "PauseGeneration", "UpdateWeights"]
    assert steps[4]["observed"]["status"] == "stopped"


def test_older_layout_is_an_error_naming_the_reason(tmp_path):
    need("0.5.10")
    result = run_check(
        SglangAdapter("0.5.10", lanes=("exact",)), ReferenceClient(), out_dir=tmp_path
    )
    assert result.verdict == "ERROR" and result.caught() == ()
    assert "SGLang 0.5.10" in result.error and "sgl_kernel" in result.error
