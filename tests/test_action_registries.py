"""Every action type is in every registry that is keyed by action type.

An action is one ``@action`` (the guard and effect in ``model/semantics.py``) plus an entry
in each registry below; ``registry_gaps`` names the action and the registry for every
entry missing, so that an omission fails here instead of passing silently (a missing
phase row used to read as "allowed in every phase", a missing draw frequency or
``candidates`` yield as "never drawn"):

- the trace codec: ``actions.ACTION_TYPES`` / ``BY_NAME``, and a round trip of an
  instance through ``to_json`` / ``action_from_json`` (every field type has a codec);
- the semantics: ``semantics.SPEC`` (filled by ``@action``);
- the phase table: ``lifecycle.TABLE``, a row for every action on one endpoint (an
  action on no endpoint, SyncWeights, has none);
- the draw frequency: ``machine.DRAW_FREQUENCY`` (0: never drawn);
- the enumeration: ``candidates.candidates`` yields it, or ``candidates.NOT_ENUMERATED``
  says why not (and then its draw frequency is 0);
- the docs: a row in docs/lifecycle.md's phase table (generated from ``lifecycle.TABLE``)
  for an action on one endpoint, and a mention in docs/spec.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from attrs import NOTHING, fields, frozen

from kvfence.conformance import machine
from kvfence.model import candidates, lifecycle, semantics
from kvfence.model.actions import (
    _ENUM_FIELDS,
    ACTION_TYPES,
    BY_NAME,
    Action,
    FlushEncoderCache,
    TraceError,
    action_from_json,
)
from kvfence.model.state import Bounds, Config, initial_state
from kvfence.model.vocabulary import ALL_MEMORY, Phase

ROOT = Path(__file__).resolve().parents[1]

_SAMPLES: dict[str, Any] = {
    "int": 0,
    "str": "P",
    "bool": False,
    "bool | None": None,
    "int | None": None,
    "frozenset[MemoryTag]": ALL_MEMORY,
}
"""A value per field type the trace codec reads (``actions._check``)."""


def sample(kind: type[Action]) -> Action | str:
    """An instance of ``kind`` built from one value per field, or why none can be built."""
    kwargs: dict[str, Any] = {}
    for f in fields(kind):
        if f.default is not NOTHING:
            continue
        enum_type = _ENUM_FIELDS.get(f.name)
        if enum_type is not None:
            kwargs[f.name] = next(iter(enum_type))
        elif f.type in _SAMPLES:
            kwargs[f.name] = _SAMPLES[f.type]
        else:
            return f"field {f.name!r} has type {f.type!r}, which the codec cannot read"
    return kind(**kwargs)


def _enumerated() -> set[type[Action]]:
    """The action types ``candidates`` yields from the initial state of one endpoint (it
    enumerates without asking ``enabled``, so every type it knows shows there)."""
    state = initial_state((Config(),))
    return {type(a) for a in candidates.candidates(state, Bounds(namespaces=True))}


def registry_gaps(kinds: list[type[Action]]) -> list[str]:
    """``"<action>: <registry> ..."`` for every registry entry an action of ``kinds`` lacks."""
    enumerated = _enumerated()
    spec_text = (ROOT / "docs" / "spec.md").read_text(encoding="utf-8")
    phase_rows = (ROOT / "docs" / "lifecycle.md").read_text(encoding="utf-8")
    gaps: list[str] = []
    for kind in kinds:
        name = kind.__name__
        on_endpoint = "endpoint" in {f.name for f in fields(kind)}
        if BY_NAME.get(name) is not kind:
            gaps.append(f"{name}: not in actions.ACTION_TYPES (the trace codec's BY_NAME)")
        instance = sample(kind)
        if isinstance(instance, str):
            gaps.append(f"{name}: trace codec: {instance}")
        else:
            try:
                back = action_from_json(instance.to_json())
            except TraceError as e:
                gaps.append(f"{name}: trace codec: {e}")
            else:
                if back != instance:
                    gaps.append(f"{name}: trace codec: {instance!r} came back as {back!r}")
        if kind not in semantics.SPEC:
            gaps.append(f"{name}: no @action in model/semantics.py (semantics.SPEC)")
        if on_endpoint and name not in lifecycle.ROWS:
            gaps.append(f"{name}: no row in lifecycle.TABLE (the phases it may run in)")
        if not on_endpoint and name in lifecycle.ROWS:
            gaps.append(f"{name}: a row in lifecycle.TABLE, but it acts on no one endpoint")
        if kind not in machine.DRAW_FREQUENCY:
            gaps.append(f"{name}: no entry in machine.DRAW_FREQUENCY (0: never drawn)")
        exempt = kind in candidates.NOT_ENUMERATED
        if kind not in enumerated and not exempt:
            gaps.append(f"{name}: candidates.candidates never yields it (or NOT_ENUMERATED)")
        if kind in enumerated and exempt:
            gaps.append(f"{name}: candidates.candidates yields it, yet it is NOT_ENUMERATED")
        if exempt and machine.DRAW_FREQUENCY.get(kind, 0) != 0:
            gaps.append(f"{name}: NOT_ENUMERATED, yet machine.DRAW_FREQUENCY draws it")
        if on_endpoint and f"| {name} |" not in phase_rows:
            gaps.append(f"{name}: no row in docs/lifecycle.md (run scripts/gen_docs.py)")
        if f"`{name}" not in spec_text:
            gaps.append(f"{name}: not described in docs/spec.md")
    return gaps


def test_every_action_is_in_every_registry():
    gaps = registry_gaps(list(ACTION_TYPES))
    assert not gaps, "\n".join(gaps)


def test_every_action_class_is_registered():
    """Every ``Action`` subclass the model defines is in ``ACTION_TYPES`` (the list the
    other registries are checked over)."""
    module = sys.modules[Action.__module__]
    defined = {
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, Action) and v is not Action
    }
    assert defined - set(ACTION_TYPES) == set()
    assert len(ACTION_TYPES) == len(set(ACTION_TYPES))


@frozen
class Nap(Action):
    """A throwaway action on one endpoint that no registry knows."""

    endpoint: int


def test_a_throwaway_action_is_named_in_every_registry_it_misses():
    gaps = registry_gaps([Nap])
    for registry in (
        "actions.ACTION_TYPES",
        "trace codec",
        "semantics.SPEC",
        "lifecycle.TABLE",
        "machine.DRAW_FREQUENCY",
        "candidates.candidates",
        "docs/lifecycle.md",
        "docs/spec.md",
    ):
        assert any(g.startswith("Nap: ") and registry in g for g in gaps), (registry, gaps)


def test_one_entry_added_removes_its_gap_only(monkeypatch):
    """The check reads the registries themselves: a draw frequency given to the throwaway
    action clears that gap and leaves the others."""
    before = registry_gaps([Nap])
    monkeypatch.setitem(machine.DRAW_FREQUENCY, Nap, 1)
    after = registry_gaps([Nap])
    assert [g for g in before if "DRAW_FREQUENCY" not in g] == after
    assert len(after) == len(before) - 1


def test_a_missing_phase_row_is_an_error_not_allowed_everywhere():
    with pytest.raises(ValueError, match=r"Nap has no row in lifecycle\.TABLE"):
        lifecycle.allows(Phase.STOPPED, "Nap")
    state = initial_state((Config(),))
    with pytest.raises(ValueError, match="Nap"):
        semantics.enabled(state, Nap(0))


def test_an_exempt_action_is_never_drawn():
    """FlushEncoderCache is a client program's call: not enumerated, drawn with weight 0."""
    assert FlushEncoderCache in candidates.NOT_ENUMERATED
    assert machine.DRAW_FREQUENCY[FlushEncoderCache] == 0
    assert FlushEncoderCache not in _enumerated()


def test_the_codec_check_names_a_field_it_cannot_read():
    @frozen
    class Odd(Action):
        endpoint: int
        weight: float

    assert "'weight'" in str(sample(Odd))
    assert isinstance(sample(FlushEncoderCache), FlushEncoderCache)
