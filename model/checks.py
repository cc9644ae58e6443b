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

from attrs import field, frozen

from .capabilities import Capability
from .client import parse_radix
from .fast import evolve
from .observation import Observation, Outcome
from .rules import Klass, RuleId, rule_id
from .state import Config, Endpoint, Served, State, Use
from .vocabulary import MIXED, Kind, Status, Tier


class SpecError(AssertionError):
    """The model broke one of its own invariants: a bug in the spec, never in the system
    under test (it is not an ADP or any other rule of the contract)."""


@frozen
class Violation:
    """A broken rule: ``rule`` (a registered ``RuleId``; ``ValueError`` for any other),
    what the spec ``expected``, what was ``actual``, and ``where`` (endpoint and field) in
    words. ``klass``: what this violation costs when it differs from its rule's class (an
    engine that dies rather than answer a refused flush breaks FC-001 safely); ``None``
    means the rule's own."""

    rule: RuleId = field(converter=rule_id)
    expected: Any
    actual: Any
    where: str = ""
    klass: Klass | None = None

    @property
    def cost(self) -> Klass:
        """This violation's class: its own, else its rule's."""
        return self.klass if self.klass is not None else self.rule.rule.klass

    def __str__(self) -> str:
        where = f" at {self.where}" if self.where else ""
        return f"{self.rule}{where}: expected {_words(self.expected)}, got {_words(self.actual)}"


def _words(value: Any) -> str:
    """A value as a report shows it: enums by their word, everything else by repr."""
    return repr(value.value) if isinstance(value, Enum) else repr(value)


# ----- invariants on the model's own states ------------------------------------------


def check_served(served: Served) -> list[Violation]:
    """INV-001 on one response: nothing it used may be stale, unless a waiver holds (the
    standard-lane opt-out for prefix KV, or a declared off-policy session). No waiver covers
    KV of no version (computed while the weights were mixed, torn or garbage: ``MIXED``,
    ``GARBAGE``): the opt-out is for KV of whole older weights (PF-28, sgl-project/sglang
    PR #27886)."""
    stale = served.unwaived | {u for u in served.stale if u.version < 0}
    if not stale:
        return []
    used = sorted((u.component, u.version) for u in stale)
    return [
        Violation(
            RuleId.INV_001,
            f"only KV of version {served.weights}",
            f"reused {used}",
            f"endpoint {served.endpoint} prefix {served.prefix}",
        )
    ]


def check_state(state: State, ledger: bool = True) -> list[Violation]:
    """Every invariant over ``state``: the ledger (INV-001), labels (INV-003), and the
    exact-lane cache itself (no stale entry may be reachable on an open guarded endpoint;
    an entry keyed by another version's namespace is reachable only by a pinned request,
    judged when it is served).

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
        if ep.config.derived:
            whole.add(ep.derived)
        if ep.label is not None and (ep.torn or whole != {ep.label}):
            out.append(Violation(RuleId.INV_003, sorted(whole), ep.label, f"endpoint {i} label"))
        versions = sorted({r.weights for r in ep.ranks})
        if len(versions) > 1 and not ep.closed:
            out.append(Violation(RuleId.RNK_003, "one version", versions, f"endpoint {i} ranks"))
        if ep.config.guarded and not ep.closed and ep.live == ep.weights:
            current = {u.component: u.version for u in ep.current(lora=True)}
            for e in ep.cache:
                if e.kind is Kind.ENCODER and ep.config.encoder_reset_separate:
                    continue  # the client's reset to make (CLI-009); a hit on it is INV-001
                reachable = e.namespace is None or e.namespace == ep.weights
                if reachable and current.get(e.kind.value, e.version) != e.version:
                    out.append(
                        Violation(
                            RuleId.INV_001, current[e.kind.value], e.version, f"endpoint {i} {e}"
                        )
                    )
    return out


def misreported(config: Config) -> str | None:
    """ADP-002 for a config whose radix flag and reported server info disagree, in words;
    ``None`` when they agree, when the info is silent, or when the adapter declares the
    engine as misreporting (``Config.misreports``: then INV-001 is never waived for it)."""
    reported = parse_radix(None if config.info is None else dict(config.info))
    if reported is None or reported == config.radix or config.misreports:
        return None
    return (
        f"the config has the radix cache {'on' if config.radix else 'off'} but its server "
        f"info {dict(config.info or ())!r} reports it {'on' if reported else 'off'}; declare "
        "Config(misreports=True) if the engine really misreports"
    )


# ----- observations against the spec --------------------------------------------------


def _cache_rule(outcome: Outcome, observed: frozenset) -> str:
    """The rule an entry kept beyond what the spec allows breaks; ``outcome.flushed_from``
    holds the entries the flush had to remove (a FlushCache may keep those of the weights
    in force: ``cache.flushed``). After a flush that removed
    some entries but not all, or left only lower tiers and other kinds (a forgotten tier,
    spared entries), it is ENG-003; after one that removed nothing, the rule that required
    the flush (ENG-001 guard, ENG-002 asked, FC-003 for a FlushCache reported done)."""
    rule = outcome.rule_for("view.cache", RuleId.INV_001)
    before = outcome.flushed_from
    if before is None or not observed:
        return rule
    # What the flush had to remove and did not (entries it may keep are not in ``before``).
    observed = (observed & before) or observed
    only_lower = not any(e.tier is Tier.DEVICE and e.kind is Kind.TARGET for e in observed)
    # Encoder outputs follow every update, flushed or not (ENG-012): their going is no sign
    # that a flush ran. A flush that left every entry of prefix KV, device KV among them,
    # removed nothing; one that left only lower tiers forgot them (ENG-003).
    prefix_kv = frozenset(e for e in before if e.kind is not Kind.ENCODER)
    if prefix_kv and prefix_kv <= observed and not only_lower:
        return rule
    partial = observed != before
    return RuleId.ENG_003 if partial or only_lower else rule


def _derived_lags(expected: Any, actual: Any, outcome: Outcome) -> bool:
    """Derived state an engine rebuilds lazily, on the first forward after an update (a
    version check instead of a post-load hook), is allowed to show an older version than
    the weights until a forward runs: no token was computed with it. A response, a streamed
    request's prefill and a recompute are forwards (``Outcome.forward``): after one, the
    probe must show derived state of the weights in force (DER-001). Only an older version
    lags; a newer or unknown one never does."""
    lagging = isinstance(actual, int) and isinstance(expected, int) and 0 <= actual < expected
    ran = outcome.forward or outcome.observation.response is not None
    return lagging and not ran and outcome.served is None


def status_cost(obs: Observation) -> Klass | None:
    """What a wrong status costs, by one principle: a system that refused, stopped or went
    silent where the spec wanted another answer claimed nothing false, so the violation is
    AVAILABILITY whatever its rule (an engine that dies on a refused flush, areal-project/AReaL
    #140, PF-04: FC-001 broken safely); one that answered OK where the spec wanted a
    failure claimed a success it did not have, and costs what its rule costs (``None``)."""
    return None if obs.status is Status.OK else Klass.AVAILABILITY


def compare(
    outcome: Outcome, obs: Observation, capabilities: Collection[str], where: str = ""
) -> list[Violation]:
    """Mismatches between ``obs`` and the allowed ``outcome``, over observed fields.

    ``capabilities``: what the adapter can observe (``weights_probe``, ``cache_probe``,
    ``provenance``, ``attribution``, ``exact_cache``, ``flush_result``, ``byte_oracle``). A
    field the adapter cannot observe, or left ``None``, is not compared. The cache is an
    upper bound: an observed cache may hold less than the outcome's, never more (with
    ``exact_cache``, less is a performance note, ENG-011).
    """
    exp = outcome.observation
    out: list[Violation] = []
    exact = Capability.EXACT_CACHE in capabilities

    def miss(field_name: str, expected: Any, actual: Any, default: str) -> None:
        rule = outcome.rule_for(field_name, default)
        out.append(Violation(rule, expected, actual, f"{where} {field_name}".strip()))

    claims_success = obs.status is Status.OK and exp.status is not Status.OK
    claimed: list[Violation] = []
    if outcome.completion is not None and claims_success:
        claimed = compare(outcome.completion, obs, capabilities, where)
    # A claimed success where the idle gate owed a refusal: true if what was observed agrees
    # with the completed flush (it freed live KV: the gate's rule), false otherwise.
    confirmed = claims_success and outcome.completion is not None and not claimed
    gate = outcome.gate if confirmed else None
    status_differs = obs.status is not exp.status
    if status_differs:
        rule = gate or outcome.rule_for("status", RuleId.LIV_002)
        where_ = f"{where} status".strip()
        out.append(
            Violation(rule, exp.status.value, obs.status.value, where_, klass=status_cost(obs))
        )
    flush_seen = Capability.FLUSH_RESULT in capabilities and exp.flushed is not None
    if flush_seen and (obs.flushed is True) != exp.flushed:
        if gate is not None:
            where_ = f"{where} flushed".strip()
            out.append(Violation(gate, exp.flushed, obs.flushed, where_))
        else:
            miss("flushed", exp.flushed, obs.flushed, RuleId.FC_003)
    if exp.aborted is not None and obs.aborted is not None and obs.aborted != exp.aborted:
        miss("aborted", sorted(exp.aborted), sorted(obs.aborted), RuleId.ENG_009)
    elif outcome.shows_aborts and obs.aborted is None:  # an abort nobody saw (PF-17)
        where_ = f"{where} aborted".strip()
        out.append(Violation(RuleId.FC_001, sorted(exp.aborted or ()), None, where_))
    # When the status differs, the probe differs because of it: only the status is named
    # (a false claim of success is judged against ``completion`` below).
    view_seen = exp.view is not None and obs.view is not None and not status_differs
    if view_seen and Capability.WEIGHTS_PROBE in capabilities:
        for name in ("weights", "draft", "scales", "label", "derived"):
            e, a = getattr(exp.view, name), getattr(obs.view, name)
            if name == "derived" and a is None:
                continue  # an engine that cannot show its derived state: the oracle's job
            if name == "derived" and _derived_lags(e, a, outcome):
                continue  # rebuilt lazily at the next forward (CD-15): none ran since
            if name == "label" and a is None:
                continue  # an engine that reports no label: not observed, not a lie
            if e != a:
                miss(f"view.{name}", e, a, RuleId.DER_001 if name == "derived" else RuleId.INV_003)
    cache_seen = view_seen and obs.view.cache is not None and Capability.CACHE_PROBE in capabilities
    if cache_seen:
        allowed, got = exp.view.cache or frozenset(), obs.view.cache
        kept = got - allowed
        if kept:
            out.append(
                Violation(
                    _cache_rule(outcome, got),
                    f"at most {sorted(map(str, allowed))}",
                    f"also {sorted(map(str, kept))}",
                    f"{where} view.cache".strip(),
                )
            )
        elif exact and got != allowed and not _may_drop_current(outcome, allowed - got):
            dropped = sorted(map(str, allowed - got))
            out.append(
                Violation(RuleId.ENG_011, "nothing dropped unasked", f"dropped {dropped}", where)
            )
    if exp.response is not None and obs.response is not None:
        out += _compare_response(outcome, obs, capabilities, where)
    out += [v for v in claimed if v not in out]
    return out


def _may_drop_current(outcome: Outcome, dropped: frozenset) -> bool:
    """A flush or a restart may keep the entries of the weights in force, or drop them: the
    model keeps them as what may remain (``Outcome.droppable``), so an exact cache (ENG-011)
    that lists fewer after such a step dropped nothing unasked. After any flush, what the
    model lists is an upper bound the flush may undercut."""
    return outcome.flushed_from is not None or dropped <= outcome.droppable


def _compare_response(
    outcome: Outcome, obs: Observation, capabilities: Collection[str], where: str
) -> list[Violation]:
    """A response against one branch of a prefill. ``hit`` selects the branch: a hit the
    model cannot explain at all (no entry it may hold) is judged by provenance and bytes,
    and named only with ``exact_cache``; a miss is always allowed (ENG-011 note with
    ``exact_cache``)."""
    served = outcome.served
    exp, got = outcome.observation.response, obs.response
    assert served is not None and exp is not None and got is not None
    out: list[Violation] = []
    exact = Capability.EXACT_CACHE in capabilities
    if got.hit != exp.hit and (exp.hit or outcome.dropped or exact):
        rule = outcome.rule_for("response.hit", RuleId.INV_001)
        out.append(Violation(rule, exp.hit, got.hit, f"{where} response.hit".strip()))
        return out
    if exact and outcome.dropped:
        out.append(Violation(RuleId.ENG_011, "a hit on KV it held", "a miss", where))
    if got.stored is not None and Capability.STORE in capabilities and got.stored != exp.stored:
        allowed = "no load from the store" if exp.stored is None else f"a load of {exp.stored}"
        where_ = f"{where} response.stored".strip()
        out.append(Violation(RuleId.STO_001, f"{allowed} or none", str(got.stored), where_))
    if got.uses is not None and Capability.PROVENANCE in capabilities:
        out += check_served(evolve(served, uses=got.uses, hit=got.hit))
    if (
        got.sampled is not None
        and Capability.ATTRIBUTION in capabilities
        and got.sampled != exp.sampled
    ):
        rule = outcome.rule_for("response.sampled", RuleId.INV_002)
        out.append(Violation(rule, sorted(exp.sampled or ()), sorted(got.sampled), where))
    bytes_seen = (
        got.output is not None and got.cold is not None and Capability.BYTE_ORACLE in capabilities
    )
    if bytes_seen and got.output != got.cold and not out:
        out += _judge_bytes(served, obs, capabilities, where)
    own = _restart_compared(got, capabilities)
    if own is not None and own != got.fresh and not out:
        rule = outcome.rule_for("response.fresh", RuleId.INV_003)
        how = divergence(own, got.fresh)
        out.append(
            Violation(
                rule,
                "the output of an engine started fresh at that version",
                how,
                f"{where} response.fresh".strip(),
            )
        )
    return out


RESTART_FIELD = "response.fresh"
"""The field whose mismatch is the restart oracle's finding (``Violation.where`` ends so)."""

BY_CONFIG = (RuleId.DER_001, RuleId.ENG_004, RuleId.INV_003)
"""The restart oracle's default rules, which only say what the endpoint's config could hide;
``restart_mechanism`` names the mechanism the evidence shows instead."""


def restart_mechanism(
    v: Violation,
    ep: Endpoint,
    prefix: str,
    obs: Observation,
    capabilities: Collection[str],
    oracle: ColdBytes | None = None,
    lora: bool = False,
    failed: bool = False,
) -> Violation:
    """A restart-oracle finding (``v`` at ``response.fresh``: the engine's own computation
    of a prompt differs from an engine freshly started at the version it claims), named by
    the mechanism that differs, the first of these the evidence does not rule out:

    1. label vs weights (INV-003): the engine's bytes equal the fresh bytes the oracle gave
       for another whole version of the same prompt: it computes with whole weights of that
       version under a label that claims another (PF-15);
    2. torn (FC-004): an update of the endpoint failed after moving weights
       (``failed``) and no update completed since: the rollback left mixed weights (PF-27);
    3. stale KV (INV-001): the bytes judged are a reported miss's own output (no cold
       prefill separates the computation from the KV it attended to), the radix cache is
       on, and this prompt was served under another weight version before (the oracle
       holds its fresh bytes there);
    4. draft (ENG-004): a draft model is configured and no weights probe showed its
       version (PF-11);
    5. derived state (DER-001): derived state is configured and no probe showed its
       version (PF-20);
    6. otherwise INV-003: the claimed version is not what computes.

    Findings of another field, or blamed on a window (WIN-001/WIN-003, where mixed
    weights are allowed), are returned as they are. ``ep``: the endpoint in the model state
    the action started from (its config and weights); ``prefix``: the prompt served."""
    if not v.where.endswith(RESTART_FIELD) or v.rule not in BY_CONFIG:
        return v
    got = obs.response
    own = _restart_compared(got, capabilities) if got is not None else None
    if own is None:
        return v
    known = oracle.fresh.get((prefix, lora), {}) if oracle is not None else {}
    probe = obs.view if Capability.WEIGHTS_PROBE in capabilities else None
    shown = {n for n in ("draft", "derived") if probe is not None and getattr(probe, n) is not None}
    if any(b == repr(own) and version != ep.weights for version, b in known.items()):
        rule = RuleId.INV_003
    elif failed:
        rule = RuleId.FC_004
    elif (
        own is got.output
        and not got.hit
        and ep.config.radix
        and any(version != ep.weights for version in known)
    ):
        rule = RuleId.INV_001
    elif ep.config.draft and "draft" not in shown:
        rule = RuleId.ENG_004
    elif ep.config.derived and "derived" not in shown:
        rule = RuleId.DER_001
    else:
        rule = RuleId.INV_003
    return v if rule == v.rule else evolve(v, rule=rule)


def _restart_compared(got: Any, capabilities: Collection[str]) -> tuple[Any, ...] | None:
    """What the restart oracle judges: the engine's own cold computation (its cold prefill,
    or a miss's output), never a hit (whose bytes are the byte oracle's: INV-001/004).
    ``None`` when there is nothing to compare."""
    if got.fresh is None or Capability.RESTART_ORACLE not in capabilities:
        return None
    if got.cold is not None and Capability.BYTE_ORACLE in capabilities:
        return got.cold
    return None if got.hit or got.output is None else got.output


def same_output(output: tuple[Any, ...], cold: tuple[Any, ...], tolerance: float = 0.0) -> bool:
    """The byte oracle's equality: ``output`` and ``cold`` are equal, or (with a
    ``tolerance`` > 0, the adapter's declared ``logprob_tolerance``) both are
    ``(token_ids, logprobs)`` pairs with the same token ids and every logprob within
    ``tolerance`` of the other. Exact by default."""
    if output == cold:
        return True
    if tolerance <= 0.0 or not (len(output) == 2 == len(cold)):
        return False
    (ids, lps), (cold_ids, cold_lps) = output, cold
    if ids != cold_ids or len(lps) != len(cold_lps):
        return False
    numbers = all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in (*lps, *cold_lps)
    )
    return numbers and all(abs(a - b) <= tolerance for a, b in zip(lps, cold_lps, strict=True))


def within_tolerance(obs: Observation, tolerance: float) -> Observation:
    """``obs`` as the byte oracle judges it: a response whose output equals its cold
    prefill within ``tolerance`` (``same_output``) is taken to have the cold bytes. Exact
    (``obs`` itself) at 0.0."""
    got = obs.response
    if tolerance <= 0.0 or got is None or got.output is None or got.cold is None:
        return obs
    if got.output == got.cold or not same_output(got.output, got.cold, tolerance):
        return obs
    return evolve(obs, response=evolve(got, output=got.cold))


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
    served: Served, obs: Observation, capabilities: Collection[str], where: str
) -> list[Violation]:
    """The byte oracle: a response that differs from a cold prefill under the same weights.

    A miss that differs means the oracle itself is not deterministic (ADP-002). A hit is
    stale reuse (INV-001) unless a waiver covers it, or unless the model's belief that the
    hit was fresh is confirmed by a probe (provenance, or the cache listing) on an exact
    lane: then the hit path's numerics differ (INV-004, a SHOULD). The model's belief alone
    is never enough: it may have re-filled its cache where the system did not."""
    got = obs.response
    assert got is not None and got.output is not None and got.cold is not None
    how = divergence(got.output, got.cold)
    if served.weights == MIXED:
        return []  # served under a window's mixed weights: no version to hold bytes to
    if not got.hit:
        return [Violation(RuleId.ADP_002, "a miss equals a cold prefill", how, where)]
    if served.hit and not served.unwaived and served.stale:
        return []  # a waived stale hit: its bytes may differ
    if served.hit and not served.stale and fresh_confirmed(served, obs, capabilities):
        if served.exact:
            return [Violation(RuleId.INV_004, "a fresh hit equals a cold prefill", how, where)]
        return []
    return [Violation(RuleId.INV_001, "no KV reused across the update", f"stale hit: {how}", where)]


def fresh_confirmed(served: Served, obs: Observation, capabilities: Collection[str]) -> bool:
    """A probe confirms the hit reused only KV of the weights in force: the response's own
    provenance, or the cache listing of the prefix after it."""
    got = obs.response
    if got is not None and got.uses is not None and Capability.PROVENANCE in capabilities:
        return not (got.uses - served.current)
    listing = obs.view.cache if obs.view is not None else None
    if listing is None or Capability.CACHE_PROBE not in capabilities:
        return False
    versions = {Use(e.kind.value, e.version) for e in listing if e.prefix == served.prefix}
    return bool(versions) and not (versions - served.current)


class ColdBytes:
    """What the byte oracle has shown so far: the cold bytes of each prompt under each
    weight version. Bytes are evidence only once the oracle has told two versions apart for
    the same prompt: an oracle whose bytes do not depend on the weights (a stub) could never
    have shown a stale hit."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, bool], dict[int, str]] = {}
        self.fresh: dict[tuple[str, bool], dict[int, str]] = {}

    def record(self, served: Served, lora: bool, cold: tuple[Any, ...]) -> None:
        if served.weights == MIXED:
            return  # mixed weights are no version: they tell no two versions apart
        self.seen.setdefault((served.prefix, lora), {})[served.weights] = repr(cold)

    def distinguishes(self, prefix: str, lora: bool) -> bool:
        return len(set(self.seen.get((prefix, lora), {}).values())) > 1

    def record_fresh(self, served: Served, lora: bool, fresh: tuple[Any, ...]) -> None:
        """The restart oracle's bytes for a prompt at the version the model says is served
        (the same principle: evidence once two versions' fresh bytes differ)."""
        self.fresh.setdefault((served.prefix, lora), {})[served.weights] = repr(fresh)

    def fresh_distinguishes(self, prefix: str, lora: bool) -> bool:
        return len(set(self.fresh.get((prefix, lora), {}).values())) > 1


def settled_closed(states: Collection[State], index: int | None) -> bool:
    """Every candidate state in ``states`` has endpoint ``index`` closed: a serve there
    that is not refused would break FC-002 whichever branch the system took."""
    return index is not None and all(
        index < len(s.endpoints) and s.endpoint(index).closed for s in states
    )


def evidence(
    outcome: Outcome,
    obs: Observation,
    capabilities: Collection[str],
    oracle: ColdBytes | None = None,
    lora: bool = False,
    states: Collection[State] | None = None,
    index: int | None = None,
) -> set[str]:
    """The rules an agreeing comparison gave real evidence for (PASS needs some; without,
    UNKNOWN). Only observations that could have shown the violation count: a cache listing
    after a flush only if there was something to remove; provenance or bytes only on a hit
    the model explains by an entry it held; bytes only once ``oracle`` has told two weight
    versions apart for that prompt. A refusal blamed on FC-002 counts only where every
    candidate state before the step (``states``) has the action's endpoint (``index``)
    closed: elsewhere both fail-closed branches may refuse, and what tells them apart is
    FC-002's evidence (``tells_installed_apart``); without ``states`` it never counts."""
    exp = outcome.observation
    view_seen = exp.view is not None and obs.view is not None
    something_to_remove = outcome.flushed_from is None or bool(outcome.flushed_from)
    seen = {
        "status": True,
        "flushed": Capability.FLUSH_RESULT in capabilities,
        # Requests ended (expected ones), or requests a wrong abort would have ended and a
        # shown ``aborted`` that could have named them (PUB-002's ``at_risk``).
        "aborted": obs.aborted is not None and (bool(exp.aborted) or outcome.at_risk),
        "view.weights": view_seen and Capability.WEIGHTS_PROBE in capabilities,
        "view.label": view_seen
        and Capability.WEIGHTS_PROBE in capabilities
        and obs.view.label is not None,
        "view.draft": view_seen
        and Capability.WEIGHTS_PROBE in capabilities
        and exp.view.draft is not None,
        "view.scales": view_seen
        and Capability.WEIGHTS_PROBE in capabilities
        and exp.view.scales is not None,
        "view.cache": view_seen
        and obs.view.cache is not None
        and Capability.CACHE_PROBE in capabilities
        and something_to_remove,
        "response.hit": obs.response is not None and Capability.EXACT_CACHE in capabilities,
        "view.derived": view_seen
        and Capability.WEIGHTS_PROBE in capabilities
        and exp.view.derived is not None
        and obs.view.derived == exp.view.derived,  # a lag allowed by _derived_lags is none
        # a load from the shared store could have shown an entry of other weights
        "response.stored": obs.response is not None and Capability.STORE in capabilities,
        "response.sampled": obs.response is not None
        and obs.response.sampled is not None
        and Capability.ATTRIBUTION in capabilities
        and len(exp.response.sampled or ()) > 1,
    }
    rules = {rule for field_name, rule in outcome.because if seen.get(field_name, False)}
    if outcome.gate is not None:
        rules.add(outcome.gate)  # a refusal the idle gate owed, given (the status is seen)
    if seen["view.cache"] and outcome.flushed_from:
        rules.add(RuleId.ENG_003)  # a listing after a flush that had entries to remove
    if seen["view.cache"] and Capability.EXACT_CACHE in capabilities and exp.view.cache:
        rules.add(RuleId.ENG_011)  # a listing that could have shown an entry dropped unasked
    got, served = obs.response, outcome.served
    fresh_rule = outcome.because.fresh
    if got is not None and served is not None and fresh_rule is not None:
        compared = _restart_compared(got, capabilities) is not None
        if compared and oracle is not None and oracle.fresh_distinguishes(served.prefix, lora):
            rules.add(fresh_rule)
            if fresh_rule == RuleId.WIN_001:
                # Bytes of the old whole weights inside a window that received chunks show
                # that the KV this forward computed is not of mixed weights: the evidence
                # WIN-002 has on an engine that stages chunks aside (CD-14).
                rules.add(RuleId.WIN_002)
    if got is not None and served is not None and served.hit:
        if got.uses is not None and Capability.PROVENANCE in capabilities:
            rules.add(RuleId.INV_001)
        bytes_seen = got.output is not None and got.cold is not None
        if bytes_seen and Capability.BYTE_ORACLE in capabilities:
            if oracle is not None and oracle.distinguishes(served.prefix, lora):
                rules.add(RuleId.INV_001)
            if served.exact and not served.stale and served.weights != MIXED:
                rules.add(RuleId.INV_004)
    if states is None or not settled_closed(states, index):
        rules.discard(RuleId.FC_002)  # a refusal both fail-closed branches may give
    return rules


def tells_installed_apart(
    obs: Observation,
    capabilities: Collection[str],
    oracle: ColdBytes | None = None,
    served: Served | None = None,
    lora: bool = False,
) -> bool:
    """Whether ``obs`` could tell what an update installed: the branches of FC-002 ("refused
    before install, old weights and cache kept" against "installed, failed, kept serving the
    stale tree") differ by the weights in force, so only a weights probe, a byte oracle that
    has told two weight versions apart for the prompt served, or the restart oracle's bytes
    (once they have) can settle them. Hit counts, flush results, statuses and requests in
    flight look the same on both."""
    if (
        obs.view is not None
        and obs.view.weights is not None
        and Capability.WEIGHTS_PROBE in capabilities
    ):
        return True
    got = obs.response
    if got is None or served is None or oracle is None:
        return False
    if (
        got.output is not None
        and got.cold is not None
        and Capability.BYTE_ORACLE in capabilities
        and oracle.distinguishes(served.prefix, lora)
    ):
        return True
    return (
        got.fresh is not None
        and Capability.RESTART_ORACLE in capabilities
        and oracle.fresh_distinguishes(served.prefix, lora)
    )


UNKNOWN_BECAUSE: dict[str, str] = {
    RuleId.INV_001: "no observation could have shown stale reuse: no hit on KV the model held was "
    "seen through provenance, a cache listing, or a byte oracle that had told two weight "
    "versions apart for the same prompt",
    RuleId.INV_004: "no fresh hit on an exact lane was compared with a cold prefill",
    RuleId.FC_001: "no update met a flush that could not complete",
    RuleId.FC_002: "no later observation that could tell what the update installed (a "
    "weights probe, a byte oracle or restart oracle that had told two versions apart) "
    "settled which fail-closed branch the system took",
    RuleId.FC_003: "no flush result was observed",
    RuleId.FC_004: "no update failed midway",
    RuleId.FC_005: "no flush met a request holding KV",
    RuleId.ENG_001: "no cache listing after an exact-lane update that had something to remove",
    RuleId.ENG_002: "no cache listing after a requested flush that had something to remove",
    RuleId.ENG_003: "no cache listing after a flush that had something to remove",
    RuleId.ENG_011: "the adapter does not declare exact_cache, so a dropped entry is no evidence",
    RuleId.ENG_012: "no cache listing after an update of an endpoint with an encoder cache",
    RuleId.WIN_001: "no chunk of a two-phase update landed while the endpoint was probed",
    RuleId.WIN_002: "no window closed with KV of its mixed weights to drop under a cache listing",
    RuleId.WIN_003: "no chunk of a two-phase update failed",
    RuleId.DER_001: "no update of an endpoint with derived state was probed, and no restart "
    "oracle had told two versions apart for the same prompt",
}
"""Why a rule with no discriminating evidence is UNKNOWN, in words (for the report)."""


def unknown_reason(rule_id: str) -> str:
    """The reason a rule is UNKNOWN when the run gave it no evidence that could have shown
    its violation (the evidence principle, docs/spec.md)."""
    return UNKNOWN_BECAUSE.get(rule_id, "no observation in the run could have shown a violation")
