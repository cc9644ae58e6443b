"""A total order on model values that no process setting changes.

A ``frozenset`` iterates in hash order, and the hashes of strings vary between processes
(``PYTHONHASHSEED``). Wherever the spec's answer depends on an order (which of several
candidate states' explanations a failing step reports, the order of the allowed outcomes
a trace records), the candidates are taken in ``stable_key`` order instead, so the same run
names the same rule in every process.

Generic over the attrs values of the model, like ``symmetry.relabel``: ``None``, bools,
ints, strs, enums, tuples, frozensets and attrs instances (by class name, then fields in
order); a frozenset orders by its sorted elements. ``TypeError`` for any other value.

Pure: standard library and attrs only.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Any, TypeVar

import attrs

T = TypeVar("T")


def stable_key(value: Any) -> tuple:
    """A sort key for ``value``: equal values get equal keys, and any two keys compare
    (each part is tagged by its kind, so ``None``, numbers and strings never meet)."""
    if value is None:
        return (0,)
    if isinstance(value, Enum):  # before int and str: some enums are both
        return (1, type(value).__name__, value.name)
    if isinstance(value, bool):
        return (2, value)
    if isinstance(value, int):
        return (3, value)
    if isinstance(value, str):
        return (4, value)
    if isinstance(value, tuple):
        return (5, tuple(stable_key(v) for v in value))
    if isinstance(value, frozenset):
        return (6, tuple(sorted(stable_key(v) for v in value)))
    cls = type(value)
    if attrs.has(cls):
        fields = tuple(stable_key(getattr(value, a.name)) for a in attrs.fields(cls))
        return (7, cls.__name__, fields)
    raise TypeError(f"stable_key: no order for {cls.__name__} values")


def ordered(values: Iterable[T]) -> list[T]:
    """``values`` in ``stable_key`` order (a list of one, or none, as it is)."""
    items = list(values)
    return items if len(items) < 2 else sorted(items, key=stable_key)
