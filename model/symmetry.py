"""Symmetry reduction for the explorer: states equal up to renaming are explored once.

Three kinds of names in a state are interchangeable: prompt prefixes (the
``Bounds.prefixes``), request IDs (``Bounds.rids``), and endpoints with equal ``Config``.
No guard compares a prefix or a request ID with another by anything but equality, and an
endpoint's behaviour depends on its config and its own state only, so renaming them maps
every path onto a path (the semantics are equivariant; ``tests/test_symmetry.py`` checks this
on every state of a small search). The explorer then keeps one state per orbit:
``canonical`` picks, among the state's renamings, the one with the smallest hash.

Generic over the attrs state: ``relabel`` walks any attrs value, tuple and frozenset, and
renames every ``str`` that is a prefix or a request ID of the bounds, whatever field holds
it, so new vocabulary that names prefixes or requests is covered without a list here.
Endpoints are permuted by their position in ``State.endpoints``; an int that names an
endpoint elsewhere would have to be renamed too, and ``tests/test_symmetry.py`` fails when a
field that names an endpoint appears outside the ledger (which the explorer strips).
``Config`` values are fixed for a run and identify an endpoint's class: never renamed.

A fourth name is interchangeable in actions, not in states: the weight-update funnel. The
model reads no funnel (``OpenUpdate``'s docstring: the funnel is the system's business), so
an ``UpdateWeights``, ``SyncWeights`` or ``BeginWeightUpdate`` has the same branches,
outcomes included, through every funnel (``tests/test_symmetry.py`` checks this on every state
of a small search). ``funnel_bounds`` keeps one funnel (``Bounds.funnels``): the reduced
model explorer then steps each such action once instead of seven times. The product explorer and the
stateful search keep every funnel: a system under test may miss one (SGLang's bucketed path,
public-faults.md), and only the system can show it.

``canonical`` is sound whatever it picks (it returns a renaming of its argument, so only
states of the same orbit are merged); picking the smallest hash makes it a true canonical
form, so the count of states is the count of orbits. Hashes of strings vary between
processes (``PYTHONHASHSEED``): the counts do not, the representative kept may.

Pure: standard library and attrs only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import lru_cache
from itertools import permutations, product
from typing import Any

import attrs

from .fast import evolve
from .state import Bounds, Config, State
from .vocabulary import Funnel

OPAQUE: tuple[type, ...] = (Config,)
"""Values never renamed: an endpoint's config is fixed for a run and names its class."""

_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(a.name for a in attrs.fields(cls) if a.init)
    return names


def relabel(value: Any, names: Mapping[str, str]) -> Any:
    """``value`` with every ``str`` in ``names`` replaced by its image, inside attrs values,
    tuples and frozensets (a part with nothing renamed is returned as it is)."""
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, (tuple, frozenset)):
        items = [relabel(v, names) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(items)
    cls = type(value)
    if isinstance(value, OPAQUE) or not attrs.has(cls):
        return value
    changes = {}
    for name in _fields(cls):
        old = getattr(value, name)
        new = relabel(old, names)
        if new is not old:
            changes[name] = new
    return evolve(value, **changes) if changes else value


@lru_cache(maxsize=256)
def _renamings(bounds: Bounds) -> tuple[dict[str, str], ...]:
    """Every renaming of prefixes and request IDs (the identity first)."""
    out = []
    for ps in permutations(bounds.prefixes):
        for rs in permutations(bounds.rids):
            names = dict(zip(bounds.prefixes, ps, strict=True))
            names |= dict(zip(bounds.rids, rs, strict=True))
            out.append({k: v for k, v in names.items() if k != v})
    return tuple(out)


@lru_cache(maxsize=256)
def _orders(configs: tuple[Config, ...]) -> tuple[tuple[int, ...], ...]:
    """Every order of the endpoints that swaps only endpoints of equal config."""
    classes: dict[Config, list[int]] = {}
    for i, c in enumerate(configs):
        classes.setdefault(c, []).append(i)
    groups = list(classes.values())
    out = []
    for choice in product(*(permutations(g) for g in groups)):
        order = [0] * len(configs)
        for group, image in zip(groups, choice, strict=True):
            for src, dst in zip(group, image, strict=True):
                order[dst] = src
        out.append(tuple(order))
    return tuple(out)


def images(
    state: State, bounds: Bounds, memo: dict[tuple[int, Any], Any] | None = None
) -> Iterator[State]:
    """Every renaming of ``state`` (itself first): prefixes, request IDs, and endpoints of
    equal config. The ledger is kept as it is (the explorer strips it first).

    ``memo``: renamed endpoints by ``(renaming number, endpoint)``, kept by the caller across
    calls. States share most endpoints with their neighbours, so one search renames each
    distinct endpoint once per renaming instead of once per state it appears in."""
    orders = _orders(tuple(ep.config for ep in state.endpoints))
    for k, names in enumerate(_renamings(bounds)):
        if not names:
            base = state
        elif memo is None or state.ledger:
            base = relabel(state, names)
        else:
            eps = []
            for ep in state.endpoints:
                renamed = memo.get((k, ep))
                if renamed is None:
                    renamed = memo[(k, ep)] = relabel(ep, names)
                eps.append(renamed)
            base = evolve(state, endpoints=tuple(eps))
        for order in orders:
            if order == tuple(range(len(order))):
                yield base
            else:
                eps = base.endpoints
                yield evolve(base, endpoints=tuple(eps[i] for i in order))


REPRESENTATIVE_FUNNEL = Funnel.DISK
"""The funnel the reduced model search keeps for each class of actions equal but for it."""


def funnel_bounds(bounds: Bounds) -> Bounds:
    """``bounds`` whose update actions name ``REPRESENTATIVE_FUNNEL`` only (the search
    bound ``Bounds.funnels``): every other funnel has the same branches."""
    return evolve(bounds, funnels=(REPRESENTATIVE_FUNNEL,))


def trivial(state: State, bounds: Bounds) -> bool:
    """No renaming but the identity: one prefix, one request ID, no two equal configs."""
    return (
        len(_renamings(bounds)) == 1 and len(_orders(tuple(e.config for e in state.endpoints))) == 1
    )


def canonical(
    state: State, bounds: Bounds, memo: dict[tuple[int, Any], Any] | None = None
) -> State:
    """The representative of ``state``'s orbit: the renaming with the smallest hash
    (``memo``: see ``images``)."""
    if trivial(state, bounds):
        return state
    return min(images(state, bounds, memo), key=hash)


__all__ = [
    "OPAQUE",
    "REPRESENTATIVE_FUNNEL",
    "canonical",
    "funnel_bounds",
    "images",
    "relabel",
    "trivial",
]
