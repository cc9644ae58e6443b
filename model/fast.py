"""Cheap copies of the spec's frozen attrs values: what the explorer's inner loop needs.

``attrs.evolve`` looks up a class's fields and their aliases on every call; in the
explorer it was 40% of the time (a profile of ``explore`` to depth 4). ``evolve``
here reads, per class, the fields once: one ``operator.attrgetter`` fetches every field's
value in C, the changes replace theirs by position, and the copy is built through the
class's own ``__init__`` (positionally; by keyword for a class with keyword-only fields):
converters and validators still run, so the attrs classes stay the spec and this is only a
faster route to the same value (3.2 to 2.0 us per ``Endpoint`` copy, against 4.0 for
``attrs.evolve``). ``identity_eq`` lets a value's ``__eq__`` answer for itself at once.

Pure: standard library and attrs only.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, TypeVar

import attrs

T = TypeVar("T")


class _Plan:
    """How to copy one class: ``values(inst)`` every init field's value (a tuple, in field
    order); ``position`` each field's index, by attribute name and by ``__init__`` argument
    name (a private ``_x`` is passed as ``x``); ``aliases`` the argument names, used only
    when some field is keyword-only (``positional`` False)."""

    __slots__ = ("aliases", "position", "positional", "values")

    def __init__(self, cls: type) -> None:
        fields = [a for a in attrs.fields(cls) if a.init]
        names = [a.name for a in fields]
        get = attrgetter(*names) if names else (lambda inst: ())
        # attrgetter of one name returns the value itself, not a 1-tuple
        self.values = get if len(names) != 1 else (lambda inst: (get(inst),))
        self.position = {a.name: i for i, a in enumerate(fields)}
        self.position |= {a.alias: i for i, a in enumerate(fields)}
        self.aliases = tuple(a.alias for a in fields)
        self.positional = not any(a.kw_only for a in fields)


_PLANS: dict[type, _Plan] = {}


def evolve(inst: T, **changes: Any) -> T:
    """``attrs.evolve(inst, **changes)``, same value, same errors (``TypeError`` for a
    name that is not a field), without re-reading the class's fields on every call."""
    cls = inst.__class__
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _Plan(cls)
    values = list(plan.values(inst))
    position = plan.position
    for name, value in changes.items():
        i = position.get(name)
        if i is None:
            raise TypeError(
                f"{cls.__name__}.__init__() got an unexpected keyword argument {name!r}"
            )
        values[i] = value
    if plan.positional:
        return cls(*values)
    return cls(**dict(zip(plan.aliases, values, strict=True)))


def identity_eq(cls: type[T]) -> type[T]:
    """``cls`` with its attrs-generated ``__eq__`` answering at once for an object
    compared with itself. attrs compares field by field (``a.x == b.x and ...``), calling
    each field's own ``__eq__`` even where both sides hold the same object; states copied
    by :func:`evolve` share most of their parts, so most of the explorer's field
    comparisons are of an object with itself. Same answers: every value of the spec
    equals itself."""
    compare = cls.__eq__

    def __eq__(self: Any, other: Any) -> Any:
        return self is other or compare(self, other)

    __eq__.__doc__ = compare.__doc__
    cls.__eq__ = __eq__  # type: ignore[method-assign]
    return cls


__all__ = ["evolve", "identity_eq"]
