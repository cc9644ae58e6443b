"""Capabilities: what an engine adapter declares it can show (``capabilities``) decides
which rules it is judged on. Bytes without their capability are no evidence; an unknown or
malformed capability is an error; MUST rules that SKIP for want of one are warned of, and
``--require`` turns a missing one into a usage error (exit 2); a profile that needs a
capability the adapter lacks is ADP-002."""

from __future__ import annotations

import pytest

from kvfence.adapters import registry
from kvfence.adapters.mutants import UpdateNeverFlushes
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.conformance.cli import main
from kvfence.conformance.runner import run_check


def adapter(cls=ReferenceEndpoint, caps=None, name="x"):
    a = InProcessAdapter(cls, name)
    if caps is not None:
        a.capabilities = caps
    return a


def test_bytes_without_the_capability_are_no_evidence(out_dir):
    """A never-flushing engine whose adapter does not declare byte_oracle must not PASS
    INV-001 on bytes the checker never compared."""
    result = run_check(
        adapter(UpdateNeverFlushes, frozenset({"flush_result", "pause"})),
        registry.client("reference"),
        out_dir=out_dir,
    )
    verdicts = {r.rule.id: r.verdict for r in result.rules}
    assert verdicts["INV-001"] != "PASS"
    assert verdicts["ENG-002"] == "SKIP"
    assert result.exit_code != 0


@pytest.mark.parametrize(
    "caps", [frozenset({"cache-probe"}), frozenset({"weight_probe", "pause"}), None, ["pause"]]
)
def test_unknown_or_malformed_capabilities_are_errors(caps, out_dir):
    a = adapter()
    a.capabilities = caps
    result = run_check(a, registry.client("reference"), out_dir=out_dir)
    assert result.verdict == "ERROR" and "ADP-002" in result.error


# ----- 4. --require: a CI user demands capabilities; MUST rules SKIP warn -----------------

FEW = """
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint


def build():
    adapter = InProcessAdapter(ReferenceEndpoint, "few-capabilities")
    adapter.capabilities = frozenset({"weights_probe", "cache_probe", "inflight"})
    return adapter
"""


@pytest.fixture
def few_engine(tmp_path, monkeypatch):
    """An engine adapter loaded as ``module:function`` that declares three capabilities."""
    (tmp_path / "few_caps_engine.py").write_text(FEW)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "few_caps_engine:build"


def test_few_capabilities_pass_but_warn_of_must_rules_skip(few_engine, tmp_path, capsys):
    """Was: exit 0 and not a word about the MUST rules nobody exercised."""
    argv = ["check", "--engine", few_engine, "--max-examples", "30", "--out", str(tmp_path)]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    words = " ".join(out.split())
    assert "MUST rules SKIP, never exercised" in words
    assert "ENG-009" in words and "--require" in words


def test_require_names_the_missing_capability_and_exits_2(few_engine, tmp_path, capsys):
    argv = ["check", "--engine", few_engine, "--require", "cache_probe,pause"]
    code = main([*argv, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 2, out
    assert "required capability pause is not declared" in out
    assert "ENG-009" in out and "cache_probe" not in out.split("required")[1].split("\n")[0]
    assert "verdict:" not in out  # not run


def test_require_met_runs_as_usual(tmp_path, capsys):
    argv = ["check", "--require", "cache_probe,pause"]  # the default budget: every rule seen
    assert main([*argv, "--out", str(tmp_path)]) == 0
    assert "warning: MUST rules SKIP" not in capsys.readouterr().out


def test_a_rule_of_another_profile_is_not_at_stake_not_skip(tmp_path):
    """CLI-009 (the client resets an encoder cache the engine leaves to it) binds only engines
    whose profile sets encoder_reset_separate: on the reference, which resets it on every
    update, it is N/A with that reason, not a SKIP the MUST-SKIP warning would name."""
    from kvfence.adapters import registry
    from kvfence.conformance.cli import must_skipped
    from kvfence.conformance.runner import run_check

    result = run_check(
        registry.engine("reference"),
        registry.client("reference"),
        out_dir=tmp_path,
        max_examples=20,
    )
    by_id = {r.rule.id: r for r in result.rules}
    assert by_id["CLI-009"].verdict == "N/A"
    assert "encoder_reset_separate" in by_id["CLI-009"].reason
    assert "CLI-009" not in must_skipped(result)


class SaysSeparateButNoReset(InProcessAdapter):
    """A profile that leaves the encoder reset to the client, without the call to do it."""

    def __init__(self) -> None:
        super().__init__(ReferenceEndpoint, "says-separate")
        self.profile = {"encoder_reset_separate": True}
        self.capabilities = self.capabilities - {"encoder_reset"}


def test_a_profile_without_its_capability_is_an_adapter_error(tmp_path):
    from kvfence.adapters import registry
    from kvfence.conformance.runner import run_check

    result = run_check(
        SaysSeparateButNoReset(), registry.client("reference"), out_dir=tmp_path, max_examples=5
    )
    assert result.verdict == "ERROR", result.verdict
    assert "encoder_reset_separate" in result.error and "ADP-002" in result.error


def test_require_unknown_capability_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", "--require", "cache_probe,telepathy"])
    assert e.value.code == 3
    assert "telepathy is not a capability" in capsys.readouterr().err
