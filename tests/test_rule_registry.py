"""The rule registry: typed rule IDs, the class of every rule, and what judging does with a
rule the registry does not hold."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kvfence.adapters import registry
from kvfence.conformance import runner
from kvfence.conformance.runner import by_class, judge, run_check
from kvfence.conformance.verdict import Verdict
from kvfence.model.checks import Violation
from kvfence.model.rules import BY_ID, RULES, Klass, RuleId, rule_id

ROOT = Path(__file__).resolve().parents[1]
KINDS = (
    "CLI",
    "ENG",
    "FC",
    "INV",
    "LIV",
    "ADP",
    "REACH",
    "MEM",
    "PUB",
    "WIN",
    "DER",
    "RNK",
    "STO",
    "PD",
    "RTR",
)
LITERAL = re.compile("(?:" + "|".join(KINDS) + r")-\d{3}")


def test_every_rule_kind_is_known_and_every_known_kind_has_rules():
    assert {r.kind for r in RULES} == set(KINDS)


def test_rule_id_members_are_the_registry():
    assert [m.value for m in RuleId] == [r.id for r in RULES]
    assert RuleId.INV_001 == "INV-001" and f"{RuleId.INV_001}" == "INV-001"
    assert RuleId.WIN_002.rule is BY_ID["WIN-002"]
    assert rule_id("DER-001") is RuleId.DER_001
    with pytest.raises(ValueError, match="no rule 'WIN-010' in the registry"):
        rule_id("WIN-010")


def test_a_violation_of_an_unregistered_rule_cannot_be_made():
    with pytest.raises(ValueError, match="WIN-010"):
        Violation("WIN-010", "x", "y")
    assert Violation("INV-001", "x", "y").rule is RuleId.INV_001


def _code_files():
    for folder in ("model", "adapters", "conformance"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_rule_id_is_a_string_literal_in_code():
    """Code names rules by ``RuleId`` members; a literal escapes the registry's check.
    Docstrings and longer messages may mention IDs in prose; a bare ``"KIND-NNN"`` value
    may not (the registry itself is the exception)."""
    found = []
    for path in _code_files():
        if path.name == "rules.py" and path.parent.name == "model":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and LITERAL.fullmatch(text):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert not found, found


def test_every_rule_id_member_cited_in_code_exists():
    """``RuleId.X_NNN`` raises ``AttributeError`` for an unknown member only when that line
    runs; this reads every citation so that a typo in a rarely taken branch fails here."""
    names = {m.name for m in RuleId}
    cited = set()
    for path in _code_files():
        cited |= set(re.findall(r"RuleId\.([A-Z]+_\d{3})", path.read_text()))
    assert cited and cited <= names, cited - names


def test_every_rule_has_a_class_and_check_rules_are_adp_and_reach():
    for r in RULES:
        assert isinstance(r.klass, Klass), r.id
        assert (r.klass is Klass.CHECK) == (r.kind in ("ADP", "REACH")), r.id
    assert BY_ID["INV-001"].klass is Klass.SAFETY
    assert BY_ID["LIV-001"].klass is Klass.AVAILABILITY


def test_evidence_of_an_unregistered_rule_makes_the_run_error_not_pass():
    """A judging step fed a run where every rule was exercised, plus evidence citing a rule
    the registry does not hold, is ERROR: a check citing ``WIN-010`` is a checker bug."""
    search = runner.Search(runner.Recorder(), [])
    for r in RULES:
        search.recorder.exercised[r.id] += 1
    search.capabilities = frozenset(runner.Capability)
    rules, verdict = judge(search, [], runner.Options())
    assert verdict is not Verdict.ERROR  # the control: the same run without the bad ID
    search.recorder.exercised["WIN-010"] += 1
    rules, verdict = judge(search, [], runner.Options())
    assert verdict is Verdict.ERROR
    adp = {r.rule.id: r for r in rules}["ADP-001"]
    assert adp.verdict is Verdict.ERROR and "WIN-010" in adp.reason


def _verdict(rule, verdict, n=1):
    return runner.RuleVerdict(BY_ID[rule], verdict, n)


def test_safety_and_availability_are_judged_apart():
    ok = [_verdict(r.id, Verdict.PASS) for r in RULES if r.id not in ("FC-001", "LIV-001")]
    # An engine that dies rather than answer a refused flush: FC-001 broken, safely.
    died = Violation("FC-001", "REJECTED", "LOST", "endpoint 0", klass=Klass.AVAILABILITY)
    rules = (*ok, _verdict("FC-001", Verdict.FAIL), _verdict("LIV-001", Verdict.PASS))
    split = by_class(rules, (died,), Verdict.FAIL)
    assert split == {Klass.SAFETY: Verdict.PASS, Klass.AVAILABILITY: Verdict.FAIL}
    # The same rule broken by a lie (success reported, stale KV kept) is a safety FAIL.
    lied = Violation("FC-001", "REJECTED", "OK", "endpoint 0")
    split = by_class(rules, (lied,), Verdict.FAIL)
    assert split == {Klass.SAFETY: Verdict.FAIL, Klass.AVAILABILITY: Verdict.PASS}
    # A refusal the spec does not allow is availability by its rule's class.
    rules = (*ok, _verdict("FC-001", Verdict.PASS), _verdict("LIV-001", Verdict.FAIL))
    split = by_class(rules, (Violation("LIV-001", "OK", "REJECTED"),), Verdict.FAIL)
    assert split == {Klass.SAFETY: Verdict.PASS, Klass.AVAILABILITY: Verdict.FAIL}


def test_a_real_check_reports_both_halves(tmp_path):
    engine, client = registry.engine("reference"), registry.client("reference")
    result = run_check(engine, client, out_dir=tmp_path, max_examples=60, timeout=30)
    assert result.safety in (Verdict.PASS, Verdict.UNKNOWN)
    assert result.availability in (Verdict.PASS, Verdict.UNKNOWN)
    assert Verdict.FAIL not in (result.safety, result.availability)
