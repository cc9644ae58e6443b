"""The checks: invariants over model states, and the comparison of what a system showed
with what the spec allows. Every violation names the rule it breaks.

``check_state`` is what the explorer asserts on every reachable state. ``check_served``
judges one response (the model's, or one rebuilt from a system's observation).
``compare`` matches an observation against one allowed outcome, field by field, over the
fields the adapter can observe.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum
from typing import Any

from attrs import evolve, frozen

from .observation import Observation, Outcome
from .state import Served, State
from .vocabulary import Kind, Status, Tier


class SpecError(AssertionError):
    """The model broke one of its own invariants: a bug in the spec, never in the system
    under test (it is not an ADP or any other rule of the contract)."""


@frozen
class Violation:
    """A broken rule: ``rule`` ID, what the spec ``expected``, what was ``actual``, and
    ``where`` (endpoint and field) in words."""

    rule: str
    expected: Any
    actual: Any
    where: str = ""

    def __str__(self) -> str:
        where = f" at {self.where}" if self.where else ""
        return f"{self.rule}{where}: expected {_words(self.expected)}, got {_words(self.actual)}"


def _words(value: Any) -> str:
    """A value as a report shows it: enums by their word, everything else by repr."""
    return repr(value.value) if isinstance(value, Enum) else repr(value)


# ----- invariants on the model's own states ------------------------------------------


def check_served(served: Served) -> list[Violation]:
    """INV-001 on one response: nothing it used may be stale, unless the waiver holds
    (standard lane, and the last update skipped the flush at the caller's request)."""
    stale = served.stale
    if not stale or (served.waived and not served.exact):
        return []
    used = sorted((u.component, u.version) for u in stale)
    return [
        Violation(
            "INV-001",
            f"only KV of version {served.weights}",
            f"reused {used}",
            f"endpoint {served.endpoint} prefix {served.prefix}",
        )
    ]


def check_state(state: State, ledger: bool = True) -> list[Violation]:
    """Every invariant over ``state``: the ledger (INV-001), labels (INV-003), and the
    exact-lane cache itself (no stale entry may be reachable on an open guarded endpoint).

    ``ledger=False`` skips the ledger: after a client under test made an off-contract call,
    the model's own ledger records the stale reuse that call allows, and that is the
    client's violation, already reported."""
    out: list[Violation] = []
    for served in state.ledger if ledger else ():
        out += check_served(served)
    for i, ep in enumerate(state.endpoints):
        whole = {ep.weights}
        if ep.config.draft:
            whole.add(ep.draft)
        if ep.config.fp8_kv:
            whole.add(ep.scales)
        if ep.label is not None and (ep.torn or whole != {ep.label}):
            out.append(Violation("INV-003", sorted(whole), ep.label, f"endpoint {i} label"))
        if ep.config.guarded and not ep.closed:
            current = {u.component: u.version for u in ep.current(lora=True)}
            for e in ep.cache:
                component = e.kind.value
                if current.get(component, e.version) != e.version:
                    out.append(
                        Violation("INV-001", current[component], e.version, f"endpoint {i} {e}")
                    )
    return out


# ----- observations against the spec --------------------------------------------------


def _cache_rule(outcome: Outcome, observed: frozenset) -> str:
    """The rule a cache mismatch breaks. After a flush that removed some entries but not
    all, or left only lower tiers and other kinds (a forgotten tier, spared entries), it is
    ENG-003; after one that removed nothing from the device, the rule that required the
    flush (ENG-001 guard, ENG-002 asked)."""
    rule = outcome.rule_for("view.cache", "INV-001")
    before = outcome.flushed_from
    if before is None or not observed:
        return rule
    partial = observed != before
    only_lower = not any(e.tier is Tier.DEVICE and e.kind is Kind.TARGET for e in observed)
    return "ENG-003" if partial or only_lower else rule


def compare(
    outcome: Outcome, obs: Observation, capabilities: Collection[str], where: str = ""
) -> list[Violation]:
    """Mismatches between ``obs`` and the allowed ``outcome``, over observed fields.

    ``capabilities``: what the adapter can observe (``weights_probe``, ``cache_probe``,
    ``provenance``, ``attribution``, ``exact_cache``, ``flush_result``). A field the adapter
    cannot observe, or left ``None``, is not compared.
    """
    exp = outcome.observation
    out: list[Violation] = []

    def miss(field_name: str, expected: Any, actual: Any, default: str) -> None:
        rule = outcome.rule_for(field_name, default)
        out.append(Violation(rule, expected, actual, f"{where} {field_name}".strip()))

    status_differs = obs.status is not exp.status
    if status_differs:
        miss("status", exp.status.value, obs.status.value, "LIV-002")
    flush_seen = "flush_result" in capabilities and exp.flushed is not None
    if flush_seen and (obs.flushed is True) != exp.flushed:
        miss("flushed", exp.flushed, obs.flushed, "FC-003")
    if exp.aborted is not None and obs.aborted is not None and obs.aborted != exp.aborted:
        miss("aborted", sorted(exp.aborted), sorted(obs.aborted), "ENG-009")
    # When the status differs, the probe differs because of it: only the status is named
    # (a false claim of success is judged against ``completion`` below).
    view_seen = exp.view is not None and obs.view is not None and not status_differs
    if view_seen and "weights_probe" in capabilities:
        for name in ("weights", "draft", "scales", "label"):
            e, a = getattr(exp.view, name), getattr(obs.view, name)
            if e != a:
                miss(f"view.{name}", e, a, "INV-003")
    if (
        view_seen
        and obs.view.cache is not None
        and "cache_probe" in capabilities
        and obs.view.cache != exp.view.cache
    ):
        rule = _cache_rule(outcome, obs.view.cache)
        out.append(
            Violation(
                rule,
                sorted(map(str, exp.view.cache or ())),
                sorted(map(str, obs.view.cache)),
                f"{where} view.cache".strip(),
            )
        )
    if exp.response is not None and obs.response is not None:
        out += _compare_response(outcome, obs, capabilities, where)
    claims_success = obs.status is Status.OK and exp.status is not Status.OK
    if outcome.completion is not None and claims_success:
        claimed = compare(outcome.completion, obs, capabilities, where)
        out += [v for v in claimed if v not in out]
    return out


def _compare_response(
    outcome: Outcome, obs: Observation, capabilities: Collection[str], where: str
) -> list[Violation]:
    served = outcome.served
    exp, got = outcome.observation.response, obs.response
    assert served is not None and exp is not None and got is not None
    out: list[Violation] = []
    if got.uses is not None and "provenance" in capabilities:
        out += check_served(evolve(served, uses=got.uses, hit=got.hit))
    if got.sampled is not None and "attribution" in capabilities and got.sampled != exp.sampled:
        rule = outcome.rule_for("response.sampled", "INV-002")
        out.append(Violation(rule, sorted(exp.sampled or ()), sorted(got.sampled), where))
    bytes_seen = got.output is not None and got.cold is not None and "byte_oracle" in capabilities
    if bytes_seen and got.output != got.cold and not out:
        out += _judge_bytes(served, got.hit, where, got.output, got.cold)
    if "exact_cache" in capabilities and got.hit != exp.hit and not out:
        rule = outcome.rule_for("response.hit", "INV-001")
        out.append(Violation(rule, exp.hit, got.hit, f"{where} response.hit".strip()))
    return out


def divergence(output: tuple[Any, ...], cold: tuple[Any, ...]) -> str:
    """Where two outputs first differ, in words: for ``(token_ids, logprobs)`` pairs, the
    first diverging token position and the largest logprob difference."""
    pairs = len(output) == 2 == len(cold)
    if pairs and all(isinstance(x, tuple) for x in (*output, *cold)):
        (ids, lps), (cold_ids, cold_lps) = output, cold
        pos = next((i for i, (a, b) in enumerate(zip(ids, cold_ids, strict=False)) if a != b), None)
        deltas = [
            abs(a - b) for a, b in zip(lps, cold_lps, strict=False) if isinstance(a, (int, float))
        ]
        first = next((i for i, d in enumerate(deltas) if d), None)
        return (
            f"first token difference at position {pos}, first logprob difference at "
            f"position {first}, max |delta logprob| {max(deltas, default=0.0):.3g}"
        )
    return f"output {output!r} differs from cold prefill {cold!r}"


def _judge_bytes(
    served: Served, hit: bool, where: str, output: tuple[Any, ...], cold: tuple[Any, ...]
) -> list[Violation]:
    """The byte oracle: a response that differs from a cold prefill under the same weights.

    A miss that differs means the oracle itself is not deterministic (ADP-002). A hit where
    the spec allows only fresh KV, or none, is stale reuse (INV-001) unless the spec had a
    fresh hit there too, in which case the hit path's numerics differ (INV-004)."""
    how = divergence(output, cold)
    if not hit:
        return [Violation("ADP-002", "a miss equals a cold prefill", how, where)]
    if served.waived and not served.exact:
        return []
    if served.hit and not served.stale:
        return [Violation("INV-004", "a fresh hit equals a cold prefill", how, where)]
    return [Violation("INV-001", "no KV reused across the update", f"stale hit: {how}", where)]


def evidence(outcome: Outcome, obs: Observation, capabilities: Collection[str]) -> set[str]:
    """The rules an agreeing comparison gave real evidence for (for PASS vs UNKNOWN)."""
    exp = outcome.observation
    view_seen = exp.view is not None and obs.view is not None
    seen = {
        "status": True,
        "flushed": "flush_result" in capabilities,
        "aborted": obs.aborted is not None and bool(exp.aborted),
        "view.weights": view_seen and "weights_probe" in capabilities,
        "view.label": view_seen and "weights_probe" in capabilities,
        "view.draft": view_seen and "weights_probe" in capabilities and exp.view.draft is not None,
        "view.scales": view_seen
        and "weights_probe" in capabilities
        and exp.view.scales is not None,
        "view.cache": view_seen and obs.view.cache is not None and "cache_probe" in capabilities,
        "response.hit": obs.response is not None and "exact_cache" in capabilities,
        "response.sampled": obs.response is not None
        and obs.response.sampled is not None
        and "attribution" in capabilities
        and len(exp.response.sampled or ()) > 1,
    }
    rules = {rule for field_name, rule in outcome.because if seen.get(field_name, False)}
    got = obs.response
    if got is not None and outcome.served is not None:
        if got.uses is not None and "provenance" in capabilities and outcome.served.hit:
            rules.add("INV-001")
        bytes_seen = got.output is not None and got.cold is not None
        if bytes_seen and "byte_oracle" in capabilities and outcome.served.hit:
            rules.add("INV-001")
            if outcome.served.exact and not outcome.served.stale:
                rules.add("INV-004")
    return rules
