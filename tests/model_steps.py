"""Walking the model in a test: a state after a list of actions, each on the model's first
branch, shared by the model's unit tests (the lifecycle, the hazards, the rule registry)."""

from __future__ import annotations

from kvfence.model import semantics as spec
from kvfence.model.actions import Action
from kvfence.model.state import State


def go(state: State, *actions: Action) -> State:
    """``state`` after ``actions``, each on the model's first branch; ``AssertionError``
    naming the first action the model does not enable."""
    for a in actions:
        branches = spec.step(state, a)
        assert branches, f"{a!r} not enabled"
        state = branches[0][0]
    return state
