"""Client obligations over a recorded call sequence: what a sync still owes each endpoint.

A client program (``docs/clients.md``) makes engine calls one at a time; these rules judge
the sequence, not a plan. For each endpoint the model carries an ``Owed`` value while the
client drives it, updated by ``observe`` after every call the client makes and settled by
``resumes`` when serving resumes on it (ContinueGeneration, a request, or the end of the
sync with the endpoint serving). The judgement reads only the model's state and the call's
status, so the same rules apply to a Python program and to a client talking HTTP
(``kvfence serve``).

* CLI-008: an endpoint whose prefix cache the policy requires invalidated (CLI-001/002/004:
  ``plan_for``) has it invalidated after its final weights are installed and before
  serving resumes; a reset before the update does not count (huggingface/trl PR #6765
  review, PF-23). A client that never reset it is charged the rule that required the reset.
  A finished two-phase update (FinishWeightUpdate) installs the final weights as an
  UpdateWeights does, so a reset inside its window (between BeginWeightUpdate and the
  finish) is a reset before the update; a pause with ``clear_cache`` (vLLM
  ``/pause?clear_cache=true``) counts as the update's flush while the endpoint stays paused.
  A WakeUp that resumes the last released memory resumes serving (``resumes_serving``).
* CLI-009: every cache kind the engine exposes as a separate reset and does not invalidate
  on an update (vLLM ``reset_encoder_cache`` beside ``reset_prefix_cache``) is reset by the
  client after the update and before serving resumes.
* CLI-010: a reset the engine refused or failed is acted on (retried until it succeeds,
  or the endpoint left paused, or the sync failed), never ignored by resuming serving.
* CLI-007 (reused): a flush is never asked of an endpoint paused ``in_place``.
* CLI-011: a sync raises only after an engine call failed (a refused reset, a failed
  update); raising otherwise is the client's own failure.
* CLI-014: after an update the engine refused or failed on an endpoint (and no later
  update of the sync succeeded there), serving never resumes on it and the sync does not
  return as if it succeeded (``resumes``, ``returned``).
* CLI-012: a response the client delivers for a request the sync aborted and the client
  requeued is labelled with exactly the weight versions that sampled its tokens: the
  aborted partial's (when the client kept it) and the continuation's. Stitching tokens of
  two versions under one label is the fault (THUDM/slime PR #2092, rllm-org/rllm PR #622,
  vllm-project/vllm #54443); dropping the partial and regenerating is correct.
"""

from __future__ import annotations

from attrs import frozen

from .actions import (
    Action,
    ContinueGeneration,
    FinishRequest,
    FinishWeightUpdate,
    FlushCache,
    FlushEncoderCache,
    PauseGeneration,
    ServeRequest,
    StartRequest,
    UpdateWeights,
    WakeUp,
)
from .checks import Violation
from .fast import evolve
from .rules import RuleId
from .state import State
from .vocabulary import PauseMode, Status

PREFIX = "prefix"
ENCODER = "encoder"
CACHE_KINDS = (PREFIX, ENCODER)
"""The cache kinds a client can reset separately: ``prefix`` (SGLang ``/flush_cache``,
vLLM ``/reset_prefix_cache``) and ``encoder`` (vLLM ``reset_encoder_cache``), the latter
only where the engine's profile says an update leaves it to the client."""


@frozen
class Owed:
    """One endpoint's obligations during a sync.

    ``kinds``: cache kinds that must still be reset before serving resumes. ``because``:
    the rule that made the prefix reset owed (CLI-001/002/004). ``refused``: owed kinds
    whose reset the engine refused or failed. ``early``: kinds reset before the update
    that made them owed (PF-23). ``pause``: the pause mode the endpoint is held in.
    ``failed``: some call on this endpoint failed (so raising is an answer, CLI-011).
    ``reset``: kinds reset since the last update. ``due``: kinds the last update required
    reset (by the client or by the update itself: the evidence of CLI-008/009).
    ``refusals``: resets refused since the last time serving resumed (CLI-010's evidence).
    ``update_failed``: the last update of this endpoint in the sync was refused or failed
    (CLI-014); ``updates_failed``: how many were (its evidence).
    """

    kinds: frozenset[str] = frozenset()
    because: str = RuleId.CLI_001
    refused: frozenset[str] = frozenset()
    early: frozenset[str] = frozenset()
    pause: PauseMode | None = None
    failed: bool = False
    reset: frozenset[str] = frozenset()
    due: frozenset[str] = frozenset()
    refusals: int = 0
    update_failed: bool = False
    updates_failed: int = 0


UPDATES = (UpdateWeights, FinishWeightUpdate)
"""Calls that install a sync's weights (CLI-014 judges a refused or failed one)."""


def separate_kinds(state: State, index: int) -> tuple[str, ...]:
    """The cache kinds endpoint ``index`` exposes as resets of their own."""
    config = state.endpoint(index).config
    return (PREFIX, ENCODER) if config.encoder and config.encoder_reset_separate else (PREFIX,)


def flush_asked(state: State, action: Action) -> bool:
    """``action`` asks endpoint's prefix cache flushed (an omitted ``flush_cache`` read by
    the engine's profile)."""
    if isinstance(action, FlushCache):
        return True
    if isinstance(action, PauseGeneration):
        return action.clear_cache  # vLLM /pause?clear_cache=true: a flush at the pause
    if isinstance(action, (UpdateWeights, FinishWeightUpdate)):
        ep = state.endpoint(action.endpoint)
        asked = ep.config.flush_default if action.flush_cache is None else action.flush_cache
        return bool(asked)
    return False


def observe(
    owed: Owed, before: State, action: Action, status: Status
) -> tuple[Owed, list[Violation]]:
    """``owed`` after the client's call ``action`` answered ``status`` on an endpoint the
    model was in state ``before``; and the rules the call itself broke (CLI-007)."""
    from .semantics import plan_for  # the client's plan, as the spec resolves it

    index = getattr(action, "endpoint", 0)
    out: list[Violation] = []
    ok = status is Status.OK
    if not ok:
        owed = evolve(owed, failed=True)
        if flush_asked(before, action):
            owed = evolve(owed, refusals=owed.refusals + 1)
    if isinstance(action, UPDATES):
        owed = evolve(owed, update_failed=not ok, updates_failed=owed.updates_failed + (not ok))
    if owed.pause is PauseMode.IN_PLACE and flush_asked(before, action):
        where = f"endpoint {index} {action.name} while paused in_place"
        out.append(
            Violation(RuleId.CLI_007, "a retract or abort pause before a flush", "in_place", where)
        )
    if isinstance(action, PauseGeneration):
        return evolve(owed, pause=action.mode), out
    if isinstance(action, ContinueGeneration):
        return evolve(owed, pause=None), out
    if isinstance(action, (FlushCache, FlushEncoderCache)):
        kind = PREFIX if isinstance(action, FlushCache) else ENCODER
        if ok:
            return evolve(owed, kinds=owed.kinds - {kind}, reset=owed.reset | {kind}), out
        if kind in owed.kinds:
            owed = evolve(owed, refused=owed.refused | {kind})
        return owed, out
    if isinstance(action, (UpdateWeights, FinishWeightUpdate)) and ok:
        # A finished two-phase update installs the final weights as a one-shot update
        # does: the same obligations. A pause that cleared the cache (``cleared``: nothing
        # was computed since, PAUSED admits no prefill) counts as the update's flush.
        ep = before.endpoint(index)
        plan = plan_for(before, index)
        flushed = ep.config.guarded or ep.cleared or flush_asked(before, action)
        kinds: set[str] = set()
        due: set[str] = set()
        if plan.flush and ep.config.radix:
            due.add(PREFIX)
            if not flushed:
                kinds.add(PREFIX)
        if ep.config.encoder and ep.config.encoder_reset_separate:
            kinds.add(ENCODER)
            due.add(ENCODER)
        # Resets before this update do not count for what it makes stale (PF-23).
        early = owed.reset & kinds
        owed = evolve(
            owed,
            kinds=frozenset(kinds),
            because=plan.rule_for("flush"),
            refused=frozenset(),
            early=early,
            reset=frozenset(),
            due=frozenset(due),
        )
        return owed, out
    return owed, out


def evidence(owed: Owed) -> list[str]:
    """The rules a judgement of ``owed`` at resumption could have shown broken."""
    out = [RuleId.CLI_008, owed.because] if PREFIX in owed.due else []
    out += [RuleId.CLI_009] if ENCODER in owed.due else []
    out += [RuleId.CLI_010] if owed.refusals else []
    out += [RuleId.CLI_014] if owed.updates_failed else []
    return out


def resumes(owed: Owed, index: int, how: str) -> tuple[Owed, list[Violation]]:
    """Serving resumes on endpoint ``index`` (``how``: the call, or ``end of sync``): every
    kind still owed is a violation, and so is an update of the sync refused or failed
    there (CLI-014); the obligations are then spent."""
    out = []
    if owed.update_failed:
        where = f"endpoint {index} at {how}"
        expected = "the endpoint left paused, or the update retried until it succeeded"
        out.append(
            Violation(RuleId.CLI_014, expected, "serving resumed after a failed update", where)
        )
    for kind in sorted(owed.kinds):
        where = f"endpoint {index} {kind} cache at {how}"
        expected = f"{kind} cache reset after the final weights"
        if kind in owed.refused:
            out.append(
                Violation(RuleId.CLI_010, expected, "its reset refused, then ignored", where)
            )
        elif kind in owed.early:
            out.append(Violation(RuleId.CLI_008, expected, "reset only before the update", where))
        elif kind == PREFIX:
            out.append(Violation(owed.because, expected, "never reset", where))
        else:
            out.append(Violation(RuleId.CLI_009, expected, "never reset", where))
    spent = frozenset()
    owed = evolve(owed, kinds=spent, refused=spent, early=spent, due=spent, refusals=0)
    return evolve(owed, update_failed=False, updates_failed=0), out


SERVING_CALLS = (ContinueGeneration, ServeRequest, StartRequest, FinishRequest)
"""Calls after which an endpoint serves: the obligations must be met before them."""


def resumes_serving(state: State, action: Action) -> bool:
    """``action`` is a WakeUp that resumes the last memory released, so that the endpoint
    serves after it (the colocated sync's end): the obligations must be met before it, as
    before a ContinueGeneration. A WakeUp of part of the memory does not resume serving."""
    if not isinstance(action, WakeUp):
        return False
    return not (state.endpoint(action.endpoint).released - action.tags)


def returned(owed: tuple[Owed, ...]) -> list[Violation]:
    """CLI-014: the program returned (reported the sync done) though the last update of
    some endpoint was refused or failed."""
    return [
        Violation(
            RuleId.CLI_014,
            "a failed sync (the program raises)",
            "returned as if the sync succeeded, after a failed update",
            f"endpoint {i}",
        )
        for i, o in enumerate(owed)
        if o.update_failed
    ]


def raised(owed: tuple[Owed, ...], message: str) -> list[Violation]:
    """CLI-011: the program raised ``message`` though no call of the sync failed."""
    if any(o.failed for o in owed):
        return []
    return [
        Violation(RuleId.CLI_011, "a completed sync (no engine call failed)", message, "the sync")
    ]


# ----- requeue across versions (CLI-012) ---------------------------------------------------


@frozen
class Partial:
    """A request the sync aborted, as the client holds it (``Endpoint.aborted``).

    ``endpoint``, ``rid``, ``prefix``: the request. ``versions``: the weight versions that
    sampled its partial output (what SGLang returns with an aborted request's partial
    result, ``meta_info.weight_version``: sgl-project/sglang PR #11673, #17610).
    ``requeued``: the client resubmitted it; ``kept``: with the partial output in front
    (partial rollout), else from its prompt alone; ``continuation``: the versions that
    sampled what the requeued request generated.
    """

    endpoint: int
    rid: str
    prefix: str
    versions: frozenset[int]
    requeued: bool = False
    kept: bool = True
    continuation: frozenset[int] = frozenset()

    @property
    def spans(self) -> frozenset[int]:
        """The weight versions that sampled the tokens of the response the client holds."""
        return (self.versions if self.kept else frozenset()) | self.continuation


def delivered(partial: Partial, label: frozenset[int]) -> list[Violation]:
    """CLI-012: the client delivers ``partial``'s response labelled with ``label``; a
    violation unless the label is exactly the versions its tokens span."""
    if label == partial.spans:
        return []
    where = f"endpoint {partial.endpoint} response {partial.rid!r}"
    expected = f"labelled with every version that sampled it: {sorted(partial.spans)}"
    return [Violation(RuleId.CLI_012, expected, f"labelled {sorted(label)}", where)]
