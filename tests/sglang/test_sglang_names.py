"""Engine names and flags for the SGLang lane; construction is cheap, and only the registry's
``sglang`` engine, which checks that its version is installed, needs SGLang."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvfence.adapters import registry
from kvfence.adapters.protocol import AdapterFailure
from kvfence.adapters.sglang_engine import DEFAULT_VERSION, SglangAdapter
from kvfence.conformance.cli import main
from kvfence.model.vocabulary import Lane

OVERLAYS = Path(__file__).parent / "overlays"


def sglang_engine(**options):
    """``registry.engine("sglang", **options)``; the test skips, naming the install
    command, where SGLang is not installed."""
    try:
        SglangAdapter().sglang_path()
    except AdapterFailure as e:
        pytest.skip(str(e))
    return registry.engine("sglang", **options)


def test_sglang_names_pick_the_version():
    assert SglangAdapter().version == DEFAULT_VERSION == "0.5.23"
    adapter = SglangAdapter(version="0.5.22")
    assert (adapter.version, adapter.name) == ("0.5.22", "sglang@0.5.22")
    assert SglangAdapter(version="0.4.10.post2").version == "0.4.10.post2"


def test_a_version_not_installed_names_the_install_command():
    with pytest.raises(ValueError, match=r"install-sglang\.sh 0\.4\.10\.post2"):
        registry.engine("sglang@0.4.10.post2")


def test_endpoints_are_an_exact_and_a_standard_lane():
    configs = SglangAdapter().fixed_configs
    assert [c.lane for c in configs] == [Lane.EXACT, Lane.STANDARD]
    assert all(c.radix for c in configs)
    assert dict(configs[0].info) == {"disable_radix_cache": False, "rl_on_policy_target": "fsdp"}


@pytest.mark.parametrize("name", ["sglang@", "sglang@latest", "sglang@0.5.23;rm"])
def test_bad_version_is_a_usage_error(name):
    with pytest.raises(ValueError, match="not an SGLang version"):
        registry.engine(name)


def test_overlay_only_for_sglang_and_must_be_a_folder(tmp_path):
    with pytest.raises(ValueError, match="--overlay applies to the sglang engines"):
        registry.engine("reference", overlay=str(tmp_path))
    with pytest.raises(ValueError, match="is not a folder"):
        registry.engine("sglang", overlay=str(tmp_path / "missing"))
    adapter = sglang_engine(overlay=str(OVERLAYS / "exact_guard"))
    assert adapter.name == "sglang@0.5.23+overlay"


def test_optimize_only_for_sglang_and_recorded_in_the_trace_header():
    with pytest.raises(ValueError, match="--optimize applies to the sglang engines"):
        registry.engine("reference", optimize=True)
    adapter = sglang_engine(optimize=True)
    assert adapter.optimize and adapter.name == "sglang@0.5.23 (python -O)"
    assert adapter.kvfence_system["optimize"] is True
    assert registry.system_options(adapter.kvfence_system) == {"optimize": True}
    assert not registry.engine("sglang").optimize


def test_cli_usage_errors_exit_3(tmp_path, capsys):
    assert main(["check", "--engine", "sglang@x.y", "--out", str(tmp_path)]) == 3
    assert main(["check", "--engine", "reference", "--overlay", str(tmp_path)]) == 3
    assert "--overlay applies" in capsys.readouterr().out
