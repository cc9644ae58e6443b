"""The model's fast ``evolve`` (``model/fast.py``) is ``attrs.evolve``: the same value for
every state class, and the same error for an unknown field."""

from __future__ import annotations

import attrs
import pytest

from kvfence.model.explore import EXACT, STANDARD
from kvfence.model.fast import evolve
from kvfence.model.state import (
    Config,
    Endpoint,
    Entry,
    Policy,
    Request,
    Use,
    initial_state,
)

# ----- the fast evolve ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "changes"),
    [
        (Endpoint(), {"weights": 3, "cache": frozenset({Entry("P")})}),
        (Config(), {"lane": "exact"}),  # the converter runs
        (Policy(), {"mode": "none", "pause_mode": "in_place"}),
        (Request("r1", "P"), {"retracted": True}),
        (initial_state((EXACT, STANDARD)), {"trainer": 1}),
        (Use("target", 0), {}),
    ],
)
def test_fast_evolve_is_attrs_evolve(value, changes):
    got, want = evolve(value, **changes), attrs.evolve(value, **changes)
    assert got == want and hash(got) == hash(want) and type(got) is type(want)


def test_fast_evolve_names_an_unknown_field():
    with pytest.raises(TypeError, match="nonsense"):
        evolve(Endpoint(), nonsense=1)
