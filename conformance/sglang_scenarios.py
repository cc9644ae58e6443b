"""Named scenarios for SGLang versions side by side: short action scripts, each judged in
lockstep with the spec, one row per scenario and one column per version.

``kvfence check --engine sglang@VERSION`` searches at random and stops at the first
counterexample; these scripts instead visit every finding the SGLang probes made (exact-lane
guard on each funnel, the refused requested flush, pause modes, sleep, restart), so a new
release shows at a glance which behaviour moved. Each cell is ``ok`` (the spec agrees
with every step), ``N/A`` (the version's code has no such funnel), the rules broken,
``stopped`` (the endpoint's process would exit: an exception out of a scheduler handler,
judged as the spec judges ``STOPPED``) or ``ERROR`` (the harness did not fit the version:
ADP-001, never a verdict).

Run: ``python -m kvfence.conformance.sglang_scenarios 0.5.23 0.5.22 0.5.17`` prints the
Markdown table docs/engines.md shows.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from attrs import frozen

from ..adapters.clients import ReferenceClient
from ..adapters.protocol import AdapterFailure
from ..model.actions import (
    Action,
    BeginWeightUpdate,
    ContinueGeneration,
    FaultRefuseFlush,
    FaultUpdateFailsMidway,
    FlushCache,
    PauseGeneration,
    Restart,
    ServeRequest,
    Sleep,
    StartRequest,
    UpdateWeightChunk,
    UpdateWeights,
    WakeUp,
)
from ..model.state import Policy
from ..model.vocabulary import CacheMode, Funnel, MemoryTag, PauseMode, Status
from .errors import AdapterError, ConformanceFailure
from .lockstep import Lockstep
from .record import Recorder


@frozen
class Scenario:
    """``name``: the row label. ``actions``: the script (endpoint 0 exact lane, 1 standard
    lane). ``policy``: the client policy in force (it decides INV-001's waiver)."""

    name: str
    actions: tuple[Action, ...]
    policy: Policy = Policy()


def _guard(funnel: Funnel) -> Scenario:
    return Scenario(
        f"exact lane, idle, {funnel.value} update with flush_cache=false, serve again",
        (ServeRequest(0, "P"), UpdateWeights(0, 1, funnel, False), ServeRequest(0, "P")),
    )


SCENARIOS: tuple[Scenario, ...] = (
    *(_guard(f) for f in (Funnel.DISK, Funnel.TENSOR, Funnel.DISTRIBUTED, Funnel.IPC)),
    Scenario(
        "exact lane, request running, update with flush_cache=false",
        (StartRequest(0, "r1", "P"), UpdateWeights(0, 1, Funnel.DISK, False)),
    ),
    Scenario(
        "standard lane, request running, update with flush_cache=true, serve again",
        (
            StartRequest(1, "r1", "Q"),
            UpdateWeights(1, 1, Funnel.DISK, True),
            ServeRequest(1, "Q"),
        ),
    ),
    Scenario(
        "standard lane, flush_cache omitted (client opts out)",
        (ServeRequest(1, "P"), UpdateWeights(1, 1, Funnel.DISK, None), ServeRequest(1, "P")),
        Policy(mode=CacheMode.NONE),
    ),
    Scenario(
        "standard lane, flush_cache=false (client opts out), serve again",
        (ServeRequest(1, "P"), UpdateWeights(1, 1, Funnel.TENSOR, False), ServeRequest(1, "P")),
        Policy(mode=CacheMode.NONE),
    ),
    Scenario(
        "/flush_cache while a request runs",
        (StartRequest(1, "r1", "P"), FlushCache(1)),
    ),
    Scenario(
        "retract pause, update with flush, continue",
        (
            StartRequest(1, "r1", "P"),
            PauseGeneration(1, PauseMode.RETRACT),
            UpdateWeights(1, 1, Funnel.DISK, True),
            ContinueGeneration(1),
        ),
    ),
    Scenario(
        "in_place pause, update with flush",
        (
            StartRequest(1, "r1", "P"),
            PauseGeneration(1, PauseMode.IN_PLACE),
            UpdateWeights(1, 1, Funnel.DISK, True),
        ),
    ),
    Scenario(
        "abort pause, update with flush, continue, serve",
        (
            StartRequest(1, "r1", "P"),
            PauseGeneration(1, PauseMode.ABORT),
            UpdateWeights(1, 1, Funnel.DISK, True),
            ContinueGeneration(1),
            ServeRequest(1, "P"),
        ),
    ),
    Scenario(
        "sleep (release memory), wake up, serve",
        (ServeRequest(1, "P"), Sleep(1), WakeUp(1), ServeRequest(1, "P")),
    ),
    Scenario(
        "distributed update fails after some tensors landed, serve again",
        (ServeRequest(1, "P"), FaultUpdateFailsMidway(1, 1), ServeRequest(1, "P")),
    ),
    Scenario(
        "release kv_cache, resume every tag",
        (Sleep(1, frozenset({MemoryTag.KV_CACHE})), WakeUp(1)),
    ),
    Scenario(
        "release kv_cache with its flush refused, resume kv_cache",
        (
            ServeRequest(1, "P"),
            FaultRefuseFlush(1),
            Sleep(1, frozenset({MemoryTag.KV_CACHE})),
            WakeUp(1, frozenset({MemoryTag.KV_CACHE})),
        ),
    ),
    Scenario(
        "update session as a window (begin, one tensor chunk)",
        (ServeRequest(1, "P"), BeginWeightUpdate(1, 1, Funnel.TENSOR), UpdateWeightChunk(1)),
    ),
    Scenario(
        "release all, resume weights, update with flush, resume kv_cache, serve",
        (
            ServeRequest(1, "P"),
            Sleep(1),
            WakeUp(1, frozenset({MemoryTag.WEIGHTS})),
            UpdateWeights(1, 1, Funnel.TENSOR, True),
            WakeUp(1, frozenset({MemoryTag.KV_CACHE})),
            ServeRequest(1, "P"),
        ),
    ),
    Scenario(
        "two-phase update with flush (a fork's prepare/complete)",
        (ServeRequest(1, "P"), UpdateWeights(1, 1, Funnel.TWO_PHASE, True)),
    ),
    Scenario(
        "update, restart, serve",
        (
            ServeRequest(1, "P"),
            UpdateWeights(1, 1, Funnel.DISK, True),
            Restart(1),
            ServeRequest(1, "P"),
        ),
    ),
)


def judge(adapter: object, scenario: Scenario) -> str:
    """One cell: ``ok``, the rules broken (``FAIL ENG-001``), ``stopped``, ``N/A`` (an
    update through a funnel, or a window, this version's code lacks) or ``ERROR ...``. A
    script with a window runs with the adapter's windows on for that script alone."""
    steps = Lockstep(adapter, ReferenceClient(), Recorder())  # type: ignore[arg-type]
    try:
        steps.start(adapter.fixed_configs, scenario.policy)  # type: ignore[attr-defined]
        own = getattr(adapter, "funnels", None)
        used = {a.funnel for a in scenario.actions if isinstance(a, UpdateWeights)}
        if isinstance(own, tuple) and used - set(own):
            return "N/A (no " + ", ".join(sorted(f.value for f in used - set(own))) + ")"
        windowed = any(isinstance(a, BeginWeightUpdate) for a in scenario.actions)
        loaded = getattr(adapter, "loaded", {})
        if windowed and loaded.get("window", "?") is None:
            return "N/A (no window)"
        before = getattr(adapter, "window", None)
        if windowed and before is False:
            adapter.window = True  # type: ignore[attr-defined]  # this script's windows only
        try:
            for action in scenario.actions:
                steps.run(action)
        finally:
            if windowed and before is False:
                adapter.window = False  # type: ignore[attr-defined]
    except ConformanceFailure as failure:
        stopped = _stopped(steps)
        broken = " ".join(sorted({v.rule for v in failure.violations}))
        return f"FAIL {broken}" + (" (stopped)" if stopped else "")
    except AdapterError as e:
        return f"ERROR {e}"
    return "ok (stopped)" if _stopped(steps) else "ok"


def _stopped(steps: Any) -> bool:
    """The last step the lockstep recorded saw the endpoint's process stop."""
    last = steps.steps[-1].observed if steps.steps else None
    return last is not None and last.status is Status.STOPPED


def table(versions: Sequence[str]) -> str:
    """The Markdown table: one row per scenario, one column per version."""
    from ..adapters.sglang_engine import SglangAdapter

    columns: dict[str, list[str]] = {}
    for version in versions:
        adapter = SglangAdapter(version)
        try:
            columns[version] = [judge(adapter, s) for s in SCENARIOS]
        except AdapterFailure as e:
            columns[version] = [f"ERROR {e}"] * len(SCENARIOS)
        finally:
            adapter.close()
    head = "| scenario | " + " | ".join(versions) + " |"
    rule = "|---|" + "---|" * len(versions)
    rows = [
        "| " + s.name + " | " + " | ".join(columns[v][i] for v in versions) + " |"
        for i, s in enumerate(SCENARIOS)
    ]
    return "\n".join([head, rule, *rows])


if __name__ == "__main__":
    print(table(sys.argv[1:] or ["0.5.23"]))
