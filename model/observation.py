"""What can be seen of a system after an action, and what the spec expects to see.

An adapter returns an ``Observation``; the model's ``step`` returns, per allowed branch, an
``Outcome``: the observation a correct system would give, plus ``because``, the rule that
fixes each field. A field left ``None`` in an observation was not observed (the adapter
lacks the capability) and is never compared.
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

from .state import Entry, Served, StoreEntry, Use
from .vocabulary import Kind, Status, Tier


@frozen
class View:
    """A probe of one endpoint after an action (``/weight_info`` + cache listing)."""

    weights: int | None
    """The whole target version it serves; ``None`` while torn."""
    draft: int | None = None
    """The draft model's version; ``None`` when the endpoint has none."""
    scales: int | None = None
    """The FP8 KV-scale version; ``None`` when the endpoint has none."""
    label: int | None = None
    """The reported weight-version label; ``None``: the engine reports none (then never
    compared)."""
    cache: frozenset[Entry] | None = None
    """Every entry on every tier; ``None`` when the system cannot list its cache."""
    derived: int | None = None
    """The version of the state derived from the weights at load time; ``None`` when the endpoint
    keeps none, or cannot show it."""


@frozen
class Response:
    """One response as the system returned it."""

    hit: bool
    """It reported cached tokens (> 0)."""
    uses: frozenset[Use] | None = None
    """What the reused KV was computed under; only in-process systems can say."""
    sampled: frozenset[int] | None = None
    """The weight versions the system attributes to the response."""
    output: tuple[Any, ...] | None = None
    """Token ids and logprobs, for the byte oracle."""
    cold: tuple[Any, ...] | None = None
    """The output a cold prefill of the same prompt under the same weights gives, when the
    adapter can compute it."""
    fresh: tuple[Any, ...] | None = None
    """The restart oracle (capability ``restart_oracle``): the output of the same prompt from an
    engine freshly started at the version the endpoint claims (its label), shaped as ``output``;
    ``None`` when it claims none or there is no oracle."""
    stored: StoreEntry | None = None
    """The shared store's entry whose KV the prefill loaded, with what computed it (capability
    ``store``); ``None``: it loaded none, or the system cannot say. In an expected outcome:
    the only entry a load may show there (STO-001)."""


@frozen
class Observation:
    """What a system showed after one action."""

    status: Status
    """OK / REJECTED / STOPPED / INDETERMINATE (see ``Status``)."""
    response: Response | None = None
    """The response, for ServeRequest and FinishRequest."""
    flushed: bool | None = None
    """A flush's reported result; ``None``: it returned nothing."""
    aborted: frozenset[str] | None = None
    """The request IDs the system ended; ``None``: not shown."""
    view: View | None = None
    """A probe of the endpoint after the action; ``None``: no probe."""
    detail: str = ""
    """Free text (HTTP body, message) for the report."""


@frozen
class Blame:
    """Which rule a mismatch on each observed field breaks, for one outcome.

    A field left ``None`` is not attributed: a mismatch there falls back to the comparison's
    default rule, and an agreement there is no evidence for any rule. Built only by the
    outcome helpers of ``semantics.py``. Iterating gives ``(field, rule)`` pairs under the
    trace's field names (``status``, ``view.cache``, ``response.hit`` ...).
    """

    status: str | None = None
    """The rule a mismatch on ``status`` breaks."""
    flushed: str | None = None
    """The rule a mismatch on ``flushed`` breaks."""
    aborted: str | None = None
    """The rule a mismatch on ``aborted`` breaks."""
    weights: str | None = None
    """The rule a mismatch on ``view.weights`` breaks."""
    draft: str | None = None
    """The rule a mismatch on ``view.draft`` breaks."""
    scales: str | None = None
    """The rule a mismatch on ``view.scales`` breaks."""
    label: str | None = None
    """The rule a mismatch on ``view.label`` breaks."""
    cache: str | None = None
    """The rule a mismatch on ``view.cache`` breaks."""
    hit: str | None = None
    """The rule a mismatch on ``response.hit`` breaks."""
    sampled: str | None = None
    """The rule a mismatch on ``response.sampled`` breaks."""
    derived: str | None = None
    """The rule a mismatch on ``view.derived`` breaks."""
    fresh: str | None = None
    """The rule a mismatch on ``response.fresh`` breaks."""
    stored: str | None = None
    """The rule a load from the shared store (``response.stored``) is judged by, set only
    where the store held an entry a wrong key would have matched."""

    def __iter__(self):
        for name, dotted in _FIELD_NAMES.items():
            rule = getattr(self, name)
            if rule is not None:
                yield dotted, rule

    def rule_for(self, field_name: str, default: str) -> str:
        """The rule for a field by its trace name (``"view.cache"``), else ``default``."""
        return getattr(self, _ATTRIBUTE[field_name]) or default


_FIELD_NAMES = {
    "status": "status",
    "flushed": "flushed",
    "aborted": "aborted",
    "weights": "view.weights",
    "draft": "view.draft",
    "scales": "view.scales",
    "label": "view.label",
    "cache": "view.cache",
    "hit": "response.hit",
    "sampled": "response.sampled",
    "derived": "view.derived",
    "fresh": "response.fresh",
    "stored": "response.stored",
}
_ATTRIBUTE = {dotted: name for name, dotted in _FIELD_NAMES.items()}


@frozen
class Outcome:
    """One allowed result of an action in the model."""

    observation: Observation
    """What a correct system shows."""
    served: Served | None = None
    """The ledger entry of the response, if any."""
    because: Blame = Blame()
    """The rule a mismatch on each field violates."""
    completion: Outcome | None = None
    """For an action that must fail: what a system that nevertheless claims success would have
    had to show (a false claim is judged against it too, so an update reported complete but never
    flushed is named for the flush rule it skipped)."""
    gate: str | None = None
    """For a refusal the idle gate owes (a flush, or an update's flush, while a live request
    holds KV): the gate's rule (FC-005). A system that claims success where the observation
    confirms ``completion`` (the flush really ran) broke the gate, and its claim is named by
    this rule; one the observation contradicts (entries kept) made a false report, named by
    ``because``. An agreeing refusal is the gate's evidence."""
    droppable: frozenset[Entry] = frozenset()
    """Entries of the weights in force this step keeps as what may remain, and a system may
    as well drop (a flush keeps them: ``cache.flushed``; a restart: ``cache.restarted_cache``):
    a listing without them dropped nothing unasked (no ENG-011 note)."""
    flushed_from: frozenset[Entry] | None = None
    """The entries a flush in this action had to remove (the cache it started from, less the
    entries of the weights in force a FlushCache may keep), so that a flush that removed some
    of them but not all is told apart from one that never ran (ENG-003)."""
    dropped: bool = False
    """This branch supposes the system dropped KV it may have held (a miss where an entry was
    cached): always allowed, a performance note (ENG-011) for an adapter declaring
    ``exact_cache``."""
    note: str = ""
    """What a report should say when the system took this branch though it is no violation (an
    availability or off-policy note)."""
    at_risk: bool = False
    """Requests were in flight that a wrong abort would have ended (PUB-002's evidence)."""
    forward: bool = False
    """This branch ran a forward without answering with a response (a streamed request's
    prefill, a retracted request's recompute): derived state must be rebuilt by then, a
    lazy rebuild included (``checks._derived_lags``, CD-15)."""
    shows_aborts: bool = False
    """This branch is allowed only where the system shows the requests it ended
    (``Observation.aborted``): abort-then-flush (CD-08) cannot otherwise be told from a flush
    around KV still held (PF-17)."""

    def rule_for(self, field_name: str, default: str) -> str:
        return self.because.rule_for(field_name, default)


def malformed(obs: object) -> str | None:
    """What is wrong with an adapter's observation, in words, or ``None`` (ADP-002)."""
    if not isinstance(obs, Observation):
        return f"returned {type(obs).__name__} {obs!r:.80}, not an Observation"
    if not isinstance(obs.status, Status):
        return f"status {obs.status!r} is not a Status (ok/rejected/stopped/indeterminate)"
    if obs.flushed is not None and not isinstance(obs.flushed, bool):
        return f"flushed {obs.flushed!r} is not a bool or None"
    if obs.aborted is not None and not (
        isinstance(obs.aborted, frozenset) and all(isinstance(r, str) for r in obs.aborted)
    ):
        return f"aborted {obs.aborted!r} is not a frozenset of request IDs"
    v = obs.view
    if v is not None:
        if not isinstance(v, View):
            return f"view {v!r:.80} is not a View"
        for name in ("weights", "draft", "scales", "label", "derived"):
            x = getattr(v, name)
            if x is not None and (not isinstance(x, int) or isinstance(x, bool)):
                return f"view.{name} {x!r} is not a version or None"
        if v.cache is not None and not (
            isinstance(v.cache, frozenset) and all(isinstance(e, Entry) for e in v.cache)
        ):
            return f"view.cache {v.cache!r:.80} is not a frozenset of Entry"
    r = obs.response
    if r is not None:
        if not isinstance(r, Response) or not isinstance(r.hit, bool):
            return f"response {r!r:.80} is not a Response with a bool hit"
        if r.uses is not None and not (
            isinstance(r.uses, frozenset) and all(isinstance(u, Use) for u in r.uses)
        ):
            return f"response.uses {r.uses!r:.80} is not a frozenset of Use"
        if r.sampled is not None and not (
            isinstance(r.sampled, frozenset) and all(isinstance(x, int) for x in r.sampled)
        ):
            return f"response.sampled {r.sampled!r:.80} is not a frozenset of versions"
        for name in ("output", "cold", "fresh"):
            x = getattr(r, name)
            if x is not None and not isinstance(x, tuple):
                return f"response.{name} {x!r:.80} is not a tuple"
        if r.stored is not None and not isinstance(r.stored, StoreEntry):
            return f"response.stored {r.stored!r:.80} is not a StoreEntry or None"
    return None


def entry_json(e: Entry) -> dict[str, Any]:
    return {
        "prefix": e.prefix,
        "kind": e.kind.value,
        "tier": e.tier.value,
        "version": e.version,
        "lora": e.lora,
        "namespace": e.namespace,
    }


def entry_from_json(obj: dict[str, Any]) -> Entry:
    return Entry(
        prefix=str(obj["prefix"]),
        kind=Kind(obj.get("kind", "target")),
        tier=Tier(obj.get("tier", "device")),
        version=int(obj["version"]),
        lora=obj.get("lora"),
        namespace=obj.get("namespace"),
    )
