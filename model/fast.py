"""Cheap copies of the spec's frozen attrs values: what the explorer's inner loop needs.

``attrs.evolve`` looks up a class's fields and their aliases on every call; in the
explorer it was 40% of the time (issue 12, profile of ``explore`` to depth 4). ``evolve``
here caches, per class, the ``(attribute, init argument)`` pairs once, then builds the copy
through the class's own ``__init__``: converters and validators still run, so the attrs
classes stay the spec and this is only a faster route to the same value.

Pure: standard library and attrs only.
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs

T = TypeVar("T")

_PLANS: dict[type, tuple[tuple[str, str], ...]] = {}


def _plan(cls: type) -> tuple[tuple[str, str], ...]:
    """``(attribute name, __init__ argument name)`` of every init field of ``cls``."""
    plan = tuple((a.name, a.alias) for a in attrs.fields(cls) if a.init)
    _PLANS[cls] = plan
    return plan


def evolve(inst: T, **changes: Any) -> T:
    """``attrs.evolve(inst, **changes)``, same value, same errors (``TypeError`` for a
    name that is not a field), without re-reading the class's fields on every call."""
    cls = inst.__class__
    plan = _PLANS.get(cls) or _plan(cls)
    kwargs = {alias: getattr(inst, name) for name, alias in plan if name not in changes}
    for name, value in changes.items():
        kwargs[name.lstrip("_") if name not in kwargs and name.startswith("_") else name] = value
    return cls(**kwargs)


__all__ = ["evolve"]
