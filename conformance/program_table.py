"""The program table: a client program's client rules judged on every combination of
producer server-info shapes over one to three endpoints, whatever engine the check drives.

A resolver is a pure function and is asked on every shape (``client_table``); a program
makes its own calls, so each setup here is one sync driven on a fresh reference endpoint and
the model in lockstep. A program that decides one endpoint's plan from another's report is
judged on every combination, not only on the configs a run happens to draw, so its verdict
is the same against every engine.
"""

from __future__ import annotations

from itertools import product
from typing import Any

from attrs import evolve

from ..adapters.reference import InProcessAdapter, ReferenceEndpoint
from ..model.actions import SyncWeights
from ..model.checks import Violation
from ..model.client import REPORTS_WHEN_OFF, REPORTS_WHEN_ON
from ..model.rules import BY_ID
from ..model.state import Config, Policy, server_info
from ..model.vocabulary import CacheMode, PauseMode
from .client_table import policy_words
from .errors import AdapterError, BeyondModel, ConformanceFailure, Diverged, NotEnabled, Refused
from .lockstep import Lockstep
from .program import ProgramError
from .record import Recorder


def table_setups() -> list[tuple[tuple[Config, ...], Policy]]:
    """Every setup of the program table, in producer server-info shapes only
    (``REPORTS_WHEN_ON`` for an endpoint with the radix cache on, ``REPORTS_WHEN_OFF`` for
    one with it off), ``flush_cache`` unset:

    * one endpoint: every shape, with every ``CacheMode`` and ``PauseMode``;
    * two endpoints: every ordered pair of shapes with mode ``auto`` (the only mode whose
      plan depends on the reports) and pause mode ``retract``;
    * two endpoints: every ordered pair of readings (reported on, reported off, silent,
      unreachable) with every ``CacheMode`` and ``PauseMode`` (a program that flushes one
      endpoint of two under mode ``flush`` is seen here);
    * three endpoints: every ordered triple of readings with mode ``auto`` and every
      ``PauseMode``.

    Ordered, so a program that decides one endpoint's plan from another's report is asked
    the unsafe way round. About 780 one-sync runs on the reference model (seconds to tens
    of seconds, once per check of a client program)."""
    shapes = [Config(radix=True, info=i) for i in REPORTS_WHEN_ON]
    shapes += [Config(radix=False, info=i) for i in REPORTS_WHEN_OFF]
    classes = [
        Config(radix=True, info=REPORTS_WHEN_ON[0]),  # reported on
        Config(radix=False, info=REPORTS_WHEN_OFF[0]),  # reported off
        Config(radix=True, info=server_info()),  # silent
        Config(radix=False, info=None),  # unreachable
    ]
    every = [Policy(m, None, q) for m in CacheMode for q in PauseMode]
    auto = [Policy(CacheMode.AUTO, None, q) for q in PauseMode]
    out = [((c,), p) for c in shapes for p in every]
    out += [
        (pair, Policy(CacheMode.AUTO, None, PauseMode.RETRACT))
        for pair in product(shapes, repeat=2)
    ]
    out += [(cs, p) for cs in product(classes, repeat=2) for p in every]
    out += [(cs, p) for cs in product(classes, repeat=3) for p in auto]
    return out


def program_table(
    client: Any, recorder: Any, timeout: float, focus: str | None = None
) -> list[Violation]:
    """A client program's client rules on every setup of ``table_setups``, whatever the
    engine under test: one sync per setup, driven on a fresh reference endpoint and the
    model in lockstep, so that a program deciding across endpoints is judged on every
    combination of reports, not only on the configs a run draws (the resolver's
    ``client_table`` does the same for one endpoint), and its verdict does not depend on
    which engine is checked. Returns the CLI violations found, the first per rule and
    number of endpoints, each naming its setup; the engine's rules are the run's, not the
    table's. The CLI rules it exercised are counted on ``recorder``.

    ``focus`` (a rule ID, ``kvfence check --focus``): the table stops at the first setup
    that shows that rule broken, since a focused check judges no other rule; without one,
    or while the rule holds, every setup runs."""
    engine = InProcessAdapter(ReferenceEndpoint, "program-table")
    out: list[Violation] = []
    seen: set[tuple[str, int]] = set()
    for configs, policy in table_setups():
        lock = Lockstep(engine, client, Recorder(), timeout=timeout)
        lock.start(configs, policy)
        bad: list[Violation] = []
        try:
            lock.run(SyncWeights(1))
        except ConformanceFailure as e:
            bad = list(e.violations)
        except (AdapterError, BeyondModel, Diverged, NotEnabled, Refused, ProgramError):
            pass  # the run judges what the table cannot (a capability, a phase)
        where = f"{len(configs)} endpoint(s), {policy_words(policy)}, server info " + ", ".join(
            repr(None if c.info is None else dict(c.info)) for c in configs
        )
        for v in [*lock.pending, *bad]:
            if BY_ID[v.rule].kind != "CLI" or (v.rule, len(configs)) in seen:
                continue
            seen.add((v.rule, len(configs)))
            out.append(evolve(v, where=f"{v.where} (program table: {where})"))
        for rule_id, n in lock.recorder.exercised.items():
            if BY_ID[rule_id].kind == "CLI":
                recorder.exercised[rule_id] += n
        if focus is not None and any(v.rule == focus for v in out):
            break
    engine.close()
    return out
