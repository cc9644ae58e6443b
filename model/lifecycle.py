"""The endpoint phase table: which action may run in which phase, and where it leads.

Only the phase table lives in a ``transitions`` machine (it also draws the docs diagram);
data invariants stay in plain code in ``semantics.py``. A ``transitions`` guard that fails
returns False silently, so this module uses no guards at all: ``allows`` asks the table,
``next_phase`` reads it, and both raise nothing.

Phases: SERVING, PAUSED (``/pause_generation``), ASLEEP (some device memory released by
``Sleep``: vLLM ``/sleep``, SGLang ``/release_memory_occupation``; *what* is released, KV
and/or weights, is the endpoint's ``released`` set, not a phase), STOPPED (the
engine process exited: ``EngineStops`` is not an action anyone draws but an outcome of an
update whose mandatory flush was refused on an exact lane). Being *closed* (FC-002) is not a
phase: a closed endpoint is in any phase and refuses to serve.
"""

from __future__ import annotations

from functools import cache

from transitions import Machine
from transitions.extensions import GraphMachine

from .vocabulary import Phase

S, P, A, X = Phase.SERVING.value, Phase.PAUSED.value, Phase.ASLEEP.value, Phase.STOPPED.value

TABLE: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    # (action, phases it may run in, phase it leads to; None = stays)
    ("ServeRequest", (S,), None),
    ("StartRequest", (S,), None),
    ("FinishRequest", (S,), None),
    # ASLEEP: the colocated order updates with the KV released (only with the weights
    # resident: the guard in semantics.py), and a flush there must not crash (MEM-001).
    ("UpdateWeights", (S, P, A), None),
    ("FaultUpdateFailsMidway", (S, P), None),
    ("FlushCache", (S, P, A), None),
    ("FlushEncoderCache", (S, P), None),
    ("FaultRefuseFlush", (S, P), None),
    ("EvictPrefix", (S,), None),
    ("LoadLora", (S, P), None),
    ("PauseGeneration", (S,), P),
    ("ContinueGeneration", (P,), S),
    # Sleep may release more while asleep; WakeUp serves again only once nothing stays
    # released, else its outcome is "WakeUpPartly" (an outcome, not an action, like
    # EngineStops: the same call, whose effect picks the row).
    ("Sleep", (S, A), A),
    ("WakeUp", (A,), S),
    ("WakeUpPartly", (A,), None),
    ("PublishVersion", (S, P), None),
    ("Restart", (S, P, A, X), S),
    ("EngineStops", (S, P, A), X),
    # two-phase updates (WIN-001..003): the window is endpoint data, not a phase
    ("BeginWeightUpdate", (S, P), None),
    ("UpdateWeightChunk", (S, P), None),
    ("FinishWeightUpdate", (S, P), None),
    ("AbortWeightUpdate", (S, P), None),
    ("FaultChunkFails", (S, P), None),
    # data-parallel ranks (RNK-001..003)
    ("FaultRankUpdateFails", (S, P), None),
    # workers behind a router (RTR-001): the rotation is the router's, not a phase
    ("LeaveRotation", (S, P), None),
    ("EnterRotation", (S, P), None),
)
"""SyncWeights is the client's: it needs every endpoint SERVING and runs through
PauseGeneration, UpdateWeights and ContinueGeneration on each."""


def _transitions() -> list[dict[str, object]]:
    return [{"trigger": t, "source": list(src), "dest": dst} for t, src, dst in TABLE]


class _Phase:
    """The model object a ``transitions`` machine binds to (not slotted: it must not be)."""


@cache
def _machine() -> Machine:
    return Machine(
        model=None,
        states=[p.value for p in Phase],
        transitions=_transitions(),
        initial=S,
        auto_transitions=False,
    )


ROWS: frozenset[str] = frozenset(t for t, _, _ in TABLE)
"""The action (and outcome) names that have a row in ``TABLE``."""


@cache
def allows(phase: Phase, action_name: str) -> bool:
    """``action_name`` may run in ``phase``. Only actions on one endpoint have a row
    (SyncWeights, the client's, has none and is never asked about); ``ValueError`` for a
    name without a row, so that a forgotten row fails closed instead of reading as
    "allowed in every phase", STOPPED included."""
    if action_name not in ROWS:
        raise ValueError(
            f"{action_name} has no row in lifecycle.TABLE: add the phases it may run in "
            "and the phase it leads to"
        )
    return action_name in _machine().get_triggers(phase.value)


def next_phase(phase: Phase, action_name: str) -> Phase:
    """The phase after ``action_name`` runs in ``phase``; ``ValueError`` if not allowed."""
    for trigger, sources, dest in TABLE:
        if trigger == action_name and phase.value in sources:
            return phase if dest is None else Phase(dest)
    raise ValueError(f"{action_name} is not allowed in phase {phase.value}")


def diagram() -> str:
    """The phase table as a Mermaid state diagram (for docs/)."""
    model = _Phase()
    GraphMachine(
        model=model,
        states=[p.value for p in Phase],
        transitions=_transitions(),
        initial=S,
        auto_transitions=False,
        graph_engine="mermaid",
    )
    text = model.get_graph().draw(None)
    if text.startswith("---"):  # drop the front matter transitions puts around its title
        text = text.split("---", 2)[2].lstrip("\n")
    return text
