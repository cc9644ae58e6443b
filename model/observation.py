"""What can be seen of a system after an action, and what the spec expects to see.

An adapter returns an ``Observation``; the model's ``step`` returns, per allowed branch, an
``Outcome``: the observation a correct system would give, plus ``because``, the rule that
fixes each field. A field left ``None`` in an observation was not observed (the adapter
lacks the capability) and is never compared.
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

from .state import Entry, Served, Use
from .vocabulary import Kind, Status, Tier


@frozen
class View:
    """A probe of one endpoint after an action (``/weight_info`` + cache listing).

    ``weights``: the whole target version, ``None`` while torn. ``draft``/``scales``: draft
    model and FP8 KV-scale versions (``None`` when the endpoint has none). ``label``: the
    reported weight-version label. ``cache``: every entry on every tier, ``None`` when the
    system cannot list its cache.
    """

    weights: int | None
    draft: int | None = None
    scales: int | None = None
    label: int | None = None
    cache: frozenset[Entry] | None = None


@frozen
class Response:
    """One response as the system returned it.

    ``hit``: it reported cached tokens (> 0). ``uses``: what the reused KV was computed
    under (only in-process systems can say). ``sampled``: the weight versions the system
    attributes to the response. ``output``: token ids and logprobs, for the byte oracle.
    ``cold``: the bytes a cold prefill of the same prompt under the same weights gives,
    when the adapter can compute it.
    """

    hit: bool
    uses: frozenset[Use] | None = None
    sampled: frozenset[int] | None = None
    output: tuple[Any, ...] | None = None
    cold: tuple[Any, ...] | None = None


@frozen
class Observation:
    """What a system showed after one action.

    ``status``: OK / REJECTED / INDETERMINATE. ``response``: for ServeRequest and
    FinishRequest. ``flushed``: a flush's reported result (``None``: it returned nothing).
    ``aborted``: request IDs the system ended. ``view``: a probe of the endpoint.
    ``detail``: free text (HTTP body, message) for the report.
    """

    status: Status
    response: Response | None = None
    flushed: bool | None = None
    aborted: frozenset[str] | None = None
    view: View | None = None
    detail: str = ""


@frozen
class Outcome:
    """One allowed result of an action in the model.

    ``observation``: what a correct system shows. ``served``: the ledger entry, if any.
    ``because``: ``(field, rule_id)`` pairs; the rule a mismatch on that field violates.
    ``completion``: for an action that must fail, what a system that nevertheless claims
    success would have had to show; a false claim is judged against it too, so that an
    update reported complete but never flushed is named for the flush rule it skipped.
    """

    observation: Observation
    served: Served | None = None
    because: tuple[tuple[str, str], ...] = ()
    completion: Outcome | None = None

    def rule_for(self, field_name: str, default: str) -> str:
        return dict(self.because).get(field_name, default)


def entry_json(e: Entry) -> dict[str, Any]:
    return {
        "prefix": e.prefix,
        "kind": e.kind.value,
        "tier": e.tier.value,
        "version": e.version,
        "lora": e.lora,
    }


def entry_from_json(obj: dict[str, Any]) -> Entry:
    return Entry(
        prefix=str(obj["prefix"]),
        kind=Kind(obj.get("kind", "target")),
        tier=Tier(obj.get("tier", "device")),
        version=int(obj["version"]),
        lora=obj.get("lora"),
    )
