"""Engine and client names: ``kvfence engines``, kinds visible as ``mutant:NAME`` /
``design:NAME``, "did you mean" suggestions, the help text, and an SGLang version that is
not installed as a usage error."""

from __future__ import annotations

import pytest

from kvfence.adapters import registry
from kvfence.adapters.designs import DESIGNS
from kvfence.adapters.mutants import MUTANTS
from kvfence.conformance.cli import build_parser, main


def _engines(capsys, *args: str) -> list[list[str]]:
    assert main(["engines", *args]) == 0
    return [line.split() for line in capsys.readouterr().out.splitlines()]


def test_engines_lists_every_engine_once_with_its_kind(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    rows = _engines(capsys)
    names = [r[0] for r in rows]
    assert len(names) == len(set(names))
    engine_mutants = [m.name for m in MUTANTS if m.side == "engine"]
    assert {f"mutant:{n}" for n in engine_mutants} <= set(names)
    assert {n for n in registry.REAL_ENGINES} <= set(names)
    kinds = {r[0]: r[1] for r in rows}
    assert kinds["vllm"] == "real" and kinds["reference"] == "reference"
    assert all(kinds[f"mutant:{n}"] == "mutant" for n in engine_mutants)
    designs = [d.name for d in DESIGNS if d.side == "engine" and d.case]
    assert designs and all(kinds[f"design:{n}"] == "design" for n in designs)


@pytest.mark.parametrize("kind", registry.KINDS)
def test_engines_kind_filters(capsys, monkeypatch, kind):
    monkeypatch.setenv("COLUMNS", "300")
    rows = _engines(capsys, "--kind", kind)
    assert rows and all(r[1] == kind for r in rows)


def test_clients_are_listed_apart(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    names = [r[0] for r in _engines(capsys, "--side", "client")]
    assert "mutant:never-flush" in names and "vllm" not in names


def test_a_kind_prefixed_name_and_the_bare_name_build_the_same_engine():
    name = next(m.name for m in MUTANTS if m.side == "engine")
    assert registry.engine(f"mutant:{name}").name == registry.engine(name).name == name
    design = next(d.name for d in DESIGNS if d.side == "engine" and d.case)
    assert registry.engine(f"design:{design}").name == design
    assert registry.kind_of(f"mutant:{name}") == "mutant"
    case = next(d for d in DESIGNS if d.side == "engine" and d.case)
    assert registry.engine(f"design:{case.case}").name == case.name
    with pytest.raises(ValueError, match="no design engine"):
        registry.engine(f"design:{name}")  # a mutant is not a design
    assert type(registry.client("mutant:never-flush")) is type(registry.client("never-flush"))


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("vlm", "'vllm'"), ("refrence", "'reference'"), ("mutant:guard-missing-on-dsk", "on-disk")],
)
def test_a_typo_gets_did_you_mean(capsys, typo, meant):
    assert main(["check", "--engine", typo]) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert "did you mean" in out and meant in out, out


def test_a_client_typo_gets_did_you_mean(capsys):
    assert main(["check", "--client", "never-flsh"]) == 3
    assert "did you mean 'never-flush'" in " ".join(capsys.readouterr().out.split())


def test_help_lists_the_real_engines_and_module_factory():
    text = " ".join(
        build_parser()._subparsers._group_actions[0].choices["check"].format_help().split()
    )
    assert "package.module:factory" in text and "mutant:NAME" in text
    words = [w.strip(",;") for w in text.split()]
    for name in registry.REAL_ENGINES:
        assert name in words, name  # whole: never broken at a hyphen


def test_an_sglang_version_not_installed_is_a_usage_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("KVFENCE_SGLANG_HOME", str(tmp_path))
    assert main(["check", "--engine", "sglang@0.9.9"]) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert "scripts/install-sglang.sh 0.9.9" in out and "not installed" in out
