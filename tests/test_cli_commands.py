"""The small commands: ``kvfence --version``, ``kvfence rules ID``, ``kvfence tiny-model``."""

from __future__ import annotations

import importlib.util
import re

import pytest

from kvfence.adapters.designs import DESIGNS
from kvfence.adapters.mutants import MUTANTS
from kvfence.conformance.cli import main
from kvfence.model import SPEC_VERSION
from kvfence.model.rules import BY_ID, RuleId


def test_version_names_the_package_and_the_spec(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("kvfence ") and f"spec {SPEC_VERSION}" in out


def test_rules_id_prints_one_rule_with_its_mutants_and_designs(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "500")
    assert main(["rules", "cli-010"]) == 0
    out = capsys.readouterr().out
    rule = BY_ID[RuleId.CLI_010]
    assert out.startswith(f"{rule.id} {rule.name} ({rule.level}, {rule.klass})")
    assert rule.rationale in out and rule.source in out and rule.text in out
    mutants = [m.name for m in MUTANTS if m.rule == rule.id]
    designs = [d.name for d in DESIGNS if rule.id in d.keeps]
    assert mutants and all(f"mutant:{m}" in out for m in mutants)
    assert designs and all(f"design:{d}" in out for d in designs)
    assert "ENG-001" not in out  # one rule, not the table


def test_rules_with_an_unknown_id_suggests_one(capsys):
    assert main(["rules", "CLI-01"]) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert "did you mean" in out and re.search(r"'CLI-01\d'", out)


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch installed")
def test_tiny_model_without_torch_is_a_clear_error(capsys, tmp_path):
    assert main(["tiny-model", "--out", str(tmp_path / "m")]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "needs torch" in out and "scripts/setup.sh" in out
    assert not (tmp_path / "m").exists()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_tiny_model_builds_two_checkpoints(capsys, tmp_path):
    assert main(["tiny-model", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for v in (0, 1):
        assert (tmp_path / f"v{v}" / "config.json").is_file()
        assert f"--checkpoint v{v}={tmp_path / f'v{v}'}" in out
