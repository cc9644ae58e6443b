"""The harm classification (``model/harm.py``): every safety rule of the registry is a harm
(H1..H4) or a mechanism that names the harm it explains, and the check of that fails on a
gap."""

from __future__ import annotations

from kvfence.model.harm import HARMS, ROLE, Role, harm_of, is_harm, is_mechanism, unclassified
from kvfence.model.rules import RULES, Klass


def test_every_safety_rule_is_a_harm_or_explains_one():
    assert unclassified() == []
    for h in HARMS:
        assert any(r == Role.HARM and hid == h.id for r, hid in ROLE.values()), h.id
    klasses = {r.id: r.klass for r in RULES}
    assert all(klasses[r] is Klass.SAFETY for r in ROLE)


def test_the_classification_check_fails_on_a_gap(monkeypatch):
    from kvfence.model import harm

    monkeypatch.delitem(harm.ROLE, "INV-001")
    assert harm.unclassified() == ["INV-001"]


def test_roles_of_the_bug_class():
    assert is_harm("INV-001") and harm_of("INV-001").id == "H1"
    assert is_harm("FC-002") and harm_of("FC-002").id == "H3"
    assert is_harm("CLI-014") and harm_of("CLI-014").id == "H4"
    assert is_mechanism("CLI-001") and is_mechanism("ENG-001")
    assert harm_of("LIV-001") is None and not is_harm("ADP-001")
