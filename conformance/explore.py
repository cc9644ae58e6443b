"""Exhaustive search of the model in lockstep with an in-process system under test.

``explore_adapter`` is breadth-first search over paths of top-level actions: each node is
a lockstep run paused after its path (the model's candidate states plus a snapshot of the
SUT's endpoints, ``InProcessAdapter.snapshot``); each edge restores the snapshot and runs
one more action the model enables (``Lockstep.enabled_actions``) through ``Lockstep.run``,
so every comparison is the stateful checker's own. Nodes are deduplicated on the model's
candidate states (without ledgers), a canonical rendering of the SUT's endpoints, and the
client violations seen so far. The first failing path found is a shortest counterexample:
it is replayed from a fresh start (``replay.replay_actions``) and written as the same JSONL
trace ``kvfence check`` writes.

Setups. Without ``configs``/``policy`` the search starts from the ``SETUPS`` that make the
focused rule reachable (all of them when nothing is focused), explored together, level by
level, so the counterexample is the shortest over all of them:

========== ============================================== ==================================
name       endpoints, client policy                        rules it makes reachable
========== ============================================== ==================================
plain      exact lane + standard lane; auto/retract        CLI-001/004/006, ENG-001/006/009/
                                                           010, FC-*, INV-*, LIV-001
no-flush   exact + standard; mode none, pause in_place     ENG-001/002, CLI-005, FC-001
in-place   exact + standard; auto, pause in_place          CLI-007
unreported exact (info unreachable) + standard (silent)    CLI-002, CLI-006
tiers      one endpoint, draft + host + storage tiers      ENG-003/004/008
encoder    one endpoint with a multimodal encoder cache    ENG-003; its twin encoder-opt-out
           (client mode none) makes ENG-012 reachable
fp8        one endpoint with FP8 KV (reported)             ENG-005
lora       one endpoint serving a LoRA adapter             ENG-007
========== ============================================== ==================================

Every endpoint runs with the radix cache on and honestly reported (except where the
table says otherwise). Features are split over one-endpoint setups because each multiplies
the state space; the costs of separate setups only add up. A catalogued mutant's declared
rule (``Mutant.rule``) is the focus by default: a path that breaks only other rules is
recorded (``other``) and not extended, as in a focused stateful run.

``main_explore`` is what ``kvfence explore`` prints.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen
from kvfence.adapters import registry
from kvfence.adapters.mutants import BY_NAME
from kvfence.model.actions import Action
from kvfence.model.checks import Violation
from kvfence.model.explore import EXACT, STANDARD, default_configs, explore, initial_states
from kvfence.model.state import (
    Bounds,
    Config,
    Policy,
    State,
    initial_state,
    server_info,
    with_profile,
)
from kvfence.model.vocabulary import CacheMode, Lane, PauseMode, Tier

from .lockstep import (
    AdapterError,
    ConformanceFailure,
    Diverged,
    Lockstep,
    NotEnabled,
    Recorder,
)
from .replay import replay_actions
from .trace import header, violation_json, write_trace

EXPLORE_BOUNDS = Bounds(prefixes=("P",), rids=("r1",), versions=2, lora_revisions=2)
"""One prefix and one request ID: every catalogued mutant is reachable within them."""


@frozen
class Setup:
    """A starting point of the search: endpoint ``configs``, client ``policy``, and the
    ``rules`` whose violations it makes reachable in a few steps."""

    name: str
    configs: tuple[Config, ...]
    policy: Policy
    rules: frozenset[str]


def _rules(*ids: str) -> frozenset[str]:
    return frozenset(ids)


SETUPS: tuple[Setup, ...] = (
    Setup(
        "plain",
        (EXACT, STANDARD),
        Policy(),
        _rules(
            "CLI-001",
            "CLI-004",
            "CLI-006",
            "ENG-001",
            "ENG-003",
            "ENG-006",
            "ENG-009",
            "ENG-010",
            "FC-001",
            "FC-002",
            "FC-003",
            "FC-004",
            "INV-001",
            "INV-002",
            "INV-003",
            "INV-004",
            "LIV-001",
            "LIV-002",
        ),
    ),
    Setup(
        "no-flush",
        (EXACT, STANDARD),
        Policy(mode=CacheMode.NONE, pause_mode=PauseMode.IN_PLACE),
        _rules("ENG-001", "ENG-002", "CLI-005", "FC-001"),
    ),
    Setup(
        "in-place",
        (EXACT, STANDARD),
        Policy(pause_mode=PauseMode.IN_PLACE),
        _rules("CLI-007"),
    ),
    Setup(
        "unreported",
        (Config(lane=Lane.EXACT, info=None), Config(info=server_info())),
        Policy(),
        _rules("CLI-002", "CLI-006"),
    ),
    Setup(
        "tiers",
        (Config(draft=True, tiers=frozenset(Tier)),),
        Policy(),
        _rules("ENG-003", "ENG-004", "ENG-008"),
    ),
    Setup("encoder", (Config(encoder=True),), Policy(), _rules("ENG-003")),
    # The client opts out of the prefix flush, so that an update keeps the prefix cache and
    # encoder outputs must still follow the weights (ENG-012, PF-21).
    Setup(
        "encoder-opt-out",
        (Config(encoder=True),),
        Policy(mode=CacheMode.NONE),
        _rules("ENG-012"),
    ),
    Setup(
        "fp8",
        (
            Config(
                fp8_kv=True, info=server_info(radix_cache_enabled=True, kv_cache_dtype="fp8_e4m3")
            ),
        ),
        Policy(),
        _rules("ENG-005"),
    ),
    Setup("lora", (Config(lora=True),), Policy(), _rules("ENG-007")),
)
"""The default starting points (see the module table)."""


def setups_for(focus: str | None) -> tuple[Setup, ...]:
    """The setups that make ``focus`` reachable; all of them if none does (or no focus)."""
    chosen = tuple(s for s in SETUPS if focus in s.rules)
    return chosen or SETUPS


def default_focus(engine_name: str, client_name: str) -> str | None:
    """The declared rule of the catalogued mutant among the two names, if any."""
    for name in (engine_name, client_name):
        if name in BY_NAME and name != "reference":
            return BY_NAME[name].rule
    return None


# ----- the SUT's fingerprint -------------------------------------------------------------


_ATOMS = (int, str, float, bool, type(None), Enum)


def freeze(obj: Any) -> Hashable:
    """A hashable, canonical rendering of ``obj``: dicts and sets become frozensets (so the
    insertion order that ``repr`` would show does not count), lists and tuples tuples,
    objects their class and fields. Frozen attrs values are kept as they are."""
    if isinstance(obj, _ATOMS):
        return obj
    kind = type(obj)
    if kind is dict:
        return frozenset((freeze(k), freeze(v)) for k, v in obj.items())
    if kind is set or kind is frozenset:
        return frozenset(freeze(v) for v in obj)
    if kind is list or kind is tuple:
        return tuple(freeze(v) for v in obj)
    if attrs.has(kind):
        if kind.__hash__ is not None:
            return obj
        return (kind.__qualname__, *(freeze(getattr(obj, f.name)) for f in attrs.fields(kind)))
    if hasattr(obj, "__dict__"):
        return (kind.__qualname__, freeze(vars(obj)))
    raise TypeError(f"cannot fingerprint a {kind.__name__}")


def fingerprint(endpoints: Sequence[object]) -> Hashable:
    """The SUT's state as the explorer deduplicates it: every endpoint's attributes but
    its config (fixed for a run), canonically frozen."""
    return tuple(
        (type(ep).__qualname__, freeze({k: v for k, v in vars(ep).items() if k != "config"}))
        for ep in endpoints
    )


# ----- the search --------------------------------------------------------------------------


@frozen
class AdapterExploration:
    """What ``explore_adapter`` saw.

    ``states``: distinct nodes (model candidates x SUT fingerprint x client violations).
    ``transitions``: edges run in lockstep. ``depth_reached``: most steps of a node seen.
    ``complete``: every node within ``depth`` expanded, no ``max_states`` cut, no stop.
    ``violation``/``trace``: the shortest failing path that breaks ``focus`` (any rule
    when ``focus`` is None), from ``setup`` (``configs``, ``policy``); ``counterexample``:
    its JSONL trace. ``other``/``other_trace``: the shortest path that broke only other
    rules (a focused search goes on past it). ``error``: an adapter error, or the model
    breaking its own invariants (a spec bug), with ``trace`` the path that led to it.
    """

    engine: str
    client: str
    focus: str | None
    setups: tuple[str, ...]
    states: int
    transitions: int
    depth_reached: int
    complete: bool
    violation: tuple[Violation, ...] = ()
    trace: tuple[Action, ...] = ()
    setup: str | None = None
    configs: tuple[Config, ...] = ()
    policy: Policy | None = None
    counterexample: Path | None = None
    other: tuple[Violation, ...] = ()
    other_trace: tuple[Action, ...] = ()
    error: str = ""

    @property
    def steps(self) -> int:
        """Top-level steps in the counterexample (as ``Result.steps``)."""
        return len(self.trace)

    def caught(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v.rule for v in self.violation))


@frozen
class _Node:
    setup: int
    path: tuple[Action, ...]
    states: frozenset[State]
    pending: tuple[Violation, ...]
    off_contract: bool
    snap: Any


def _bare(state: State) -> State:
    return state.without_ledger() if state.ledger else state


def explore_adapter(
    engine_name: str,
    client_name: str = "reference",
    configs: tuple[Config, ...] | None = None,
    policy: Policy | None = None,
    bounds: Bounds = EXPLORE_BOUNDS,
    depth: int = 4,
    faults: bool = True,
    focus: str | None = "auto",
    max_states: int | None = None,
    out_dir: Path | None = Path("kvfence-results"),
    timeout: float = 60.0,
) -> AdapterExploration:
    """Breadth-first search of model x SUT (``engine_name`` x ``client_name`` from the
    registry; the engine must be in-process, with ``snapshot``/``restore``).

    ``configs``/``policy``: one setup; when both are None, ``setups_for(focus)``.
    ``focus``: ``"auto"`` is the declared rule of a catalogued mutant named by either
    side (else None); None stops at any violation. ``faults``: draw injected faults.
    ``out_dir``: where the counterexample trace goes (None: not written).
    """
    if focus == "auto":
        focus = default_focus(engine_name, client_name)
    if configs is None and policy is None:
        setups = setups_for(focus)
    else:
        chosen = configs if configs is not None else default_configs(2)
        setups = (Setup("given", chosen, policy or Policy(), frozenset()),)
    engine = registry.engine(engine_name)
    client = registry.client(client_name)
    if not (hasattr(engine, "snapshot") and hasattr(engine, "restore")):
        raise ValueError(f"engine {engine_name!r} cannot be explored: not in-process")
    # The engine's declared profile holds on every endpoint, as in ``Lockstep.start``.
    profile = getattr(engine, "profile", None)
    setups = tuple(
        attrs.evolve(s, configs=tuple(with_profile(c, profile) for c in s.configs)) for s in setups
    )
    recorder = Recorder()
    seen: set[tuple[Any, ...]] = set()
    queue: deque[_Node] = deque()
    transitions = 0
    depth_reached = 0
    truncated = False
    other: tuple[tuple[Violation, ...], tuple[Action, ...]] | None = None

    def lockstep(node: _Node) -> Lockstep:
        s = setups[node.setup]
        lock = Lockstep(engine, client, recorder, bounds, timeout, focus=focus)
        lock.configs, lock.policy = s.configs, s.policy
        lock.states = node.states
        lock.pending = list(node.pending)
        lock.off_contract = node.off_contract
        return lock

    def result(**fields: Any) -> AdapterExploration:
        return AdapterExploration(
            engine=engine_name,
            client=client_name,
            focus=focus,
            setups=tuple(s.name for s in setups),
            states=len(seen),
            transitions=transitions,
            depth_reached=depth_reached,
            complete=fields.pop("complete", False),
            other=other[0] if other else (),
            other_trace=other[1] if other else (),
            **fields,
        )

    def failed(node: _Node, path: tuple[Action, ...]) -> AdapterExploration:
        s = setups[node.setup]
        return _counterexample(
            result(setup=s.name, configs=s.configs, policy=s.policy, trace=path),
            focus,
            bounds,
            timeout,
            out_dir,
        )

    def errored(node: _Node, path: tuple[Action, ...], message: str) -> AdapterExploration:
        s = setups[node.setup]
        return result(setup=s.name, configs=s.configs, policy=s.policy, trace=path, error=message)

    def key(node: _Node, fp: Hashable) -> tuple[Any, ...]:
        rules = frozenset(v.rule for v in node.pending)
        return (node.setup, node.states, fp, rules, node.off_contract)

    try:
        for i, s in enumerate(setups):
            engine.start(s.configs)
            root = _Node(i, (), frozenset({initial_state(s.configs, s.policy)}), (), False, None)
            seen.add(key(root, fingerprint(engine.endpoints)))
            queue.append(attrs.evolve(root, snap=engine.snapshot()))
        while queue:
            node = queue.popleft()
            level = len(node.path)
            if level >= depth:
                continue
            for action in lockstep(node).enabled_actions():
                if action.fault and not faults:
                    continue
                engine.restore(node.snap)
                lock = lockstep(node)
                path = (*node.path, action)
                transitions += 1
                try:
                    lock.run(action)
                    lock.check_model()
                except ConformanceFailure:
                    depth_reached = max(depth_reached, level + 1)
                    return failed(node, path)
                except Diverged as e:
                    if other is None:
                        other = (tuple(e.args[0]), path)
                    continue
                except NotEnabled:
                    continue
                except AdapterError as e:
                    return errored(node, path, str(e))
                rules = {v.rule for v in lock.pending}
                if rules and (focus is None or focus in rules):
                    depth_reached = max(depth_reached, level + 1)
                    return failed(node, path)
                if rules and other is None:
                    other = (tuple(lock.pending), path)
                child = _Node(
                    node.setup,
                    path,
                    frozenset(_bare(s) for s in lock.states),
                    tuple(lock.pending),
                    lock.off_contract,
                    None,
                )
                k = key(child, fingerprint(engine.endpoints))
                if k in seen:
                    continue
                if max_states is not None and len(seen) >= max_states:
                    truncated = True
                    continue
                seen.add(k)
                depth_reached = max(depth_reached, level + 1)
                if level + 1 < depth:
                    queue.append(attrs.evolve(child, snap=engine.snapshot()))
    finally:
        engine.close()
    return result(complete=not truncated)


def _counterexample(
    found: AdapterExploration,
    focus: str | None,
    bounds: Bounds,
    timeout: float,
    out_dir: Path | None,
) -> AdapterExploration:
    """Replay the failing path from a fresh start for its trace lines, and write them."""
    engine = registry.engine(found.engine)
    client = registry.client(found.client)
    assert found.policy is not None
    try:
        replayed = replay_actions(
            engine, client, found.configs, found.policy, list(found.trace), None, bounds, timeout
        )
    finally:
        engine.close()
    if replayed.kind != "FAIL":
        message = f"the counterexample did not reproduce on replay: {replayed.kind}"
        return attrs.evolve(found, error=f"{message} {replayed.message}".strip())
    violations = replayed.violations
    path = None
    if out_dir is not None:
        run = replayed.run
        head = header(
            found.engine,
            found.client,
            None,
            "explore",
            run.configs,
            run.policy,
            comment=f"shortest counterexample by breadth-first search (setup {found.setup})",
        )
        last: dict[str, Any] = {"verdict": "FAIL", "step": run.lines[-1]["step"]}
        last["violations"] = [violation_json(v) for v in violations]
        name = f"explore-counterexample-{found.engine}-{found.client}.jsonl".replace(":", "_")
        path = write_trace(out_dir / name, head, run.lines, last)
    return attrs.evolve(found, violation=violations, counterexample=path)


# ----- the CLI -------------------------------------------------------------------------


def cli_bounds(prefixes: int, versions: int, inflight: int) -> Bounds:
    """``--prefixes K`` names K prefixes P, Q, R, ...; ``--inflight R`` names R request IDs
    r1..rR; ``--versions V`` is the newest weight version. LoRA revisions stay at 2."""
    names = tuple(chr(ord("P") + i) if i < 11 else f"P{i}" for i in range(prefixes))
    rids = tuple(f"r{i + 1}" for i in range(inflight))
    return Bounds(prefixes=names, rids=rids, versions=versions)


def _action_text(action: Action) -> str:
    fields = action.to_json()
    name = fields.pop("action")
    return f"{name}(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"


def _trace_text(trace: Sequence[Action], violations: Sequence[Violation]) -> list[str]:
    out = [f"  {i}. {_action_text(a)}" for i, a in enumerate(trace, start=1)]
    out += [f"  violated: {v}" for v in violations]
    return out


def _config_text(c: Config) -> str:
    words = [c.lane.value, "radix on" if c.radix else "radix off"]
    words += [f for f in ("draft", "encoder", "fp8_kv", "lora") if getattr(c, f)]
    if c.tiers != frozenset({Tier.DEVICE}):
        words.append("tiers " + "+".join(sorted(t.value for t in c.tiers)))
    return "(" + ", ".join(words) + ")"


def _policy_text(p: Policy) -> str:
    flush = "" if p.flush_cache is None else f", flush_cache={p.flush_cache}"
    return f"mode {p.mode.value}{flush}, pause {p.pause_mode.value}"


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f}" if seconds > 0 else "-"


def main_explore(
    endpoints: int = 2,
    prefixes: int = 1,
    versions: int = 2,
    inflight: int = 1,
    depth: int = 6,
    engine: str | None = None,
    client: str | None = None,
) -> tuple[int, str]:
    """``kvfence explore``: the model alone, or model x an in-process SUT when ``engine``
    or ``client`` is named (the other side is the reference). Returns the exit code (0 no
    violation, 1 a violation, 2 incomplete or error) and the text to print.

    The model alone starts from ``model.explore.initial_states(endpoints)``. Model x SUT
    starts from the ``SETUPS`` that reach a catalogued mutant's rule (``--endpoints`` does
    not apply to them), else from the same endpoints as the model alone.
    """
    if endpoints < 1 or prefixes < 1 or versions < 0 or inflight < 0 or depth < 0:
        return 2, (
            "kvfence explore: need --endpoints >= 1, --prefixes >= 1, --versions >= 0, "
            "--inflight >= 0, --depth >= 0"
        )
    bounds = cli_bounds(prefixes, versions, inflight)
    limits = (
        f"bounds: prefixes {' '.join(bounds.prefixes)}; versions <= {bounds.versions}; "
        f"request IDs {' '.join(bounds.rids) or '(none)'}; LoRA revisions <= "
        f"{bounds.lora_revisions}; faults on; depth {depth}"
    )
    if engine is None and client is None:
        return _main_model(endpoints, bounds, depth, limits)
    return _main_product(endpoints, bounds, depth, limits, engine, client)


def _main_model(endpoints: int, bounds: Bounds, depth: int, limits: str) -> tuple[int, str]:
    (initial,) = initial_states(endpoints)
    started = time.perf_counter()
    x = explore(initial, bounds, depth)
    seconds = time.perf_counter() - started
    configs = ", ".join(_config_text(ep.config) for ep in initial.endpoints)
    lines = [
        f"kvfence explore: the model, {endpoints} endpoint(s) {configs}; "
        f"client {_policy_text(initial.policy)}",
        limits,
        f"distinct states: {x.states:,}   transitions: {x.transitions:,}   "
        f"depth reached: {x.depth_reached}   complete: {'yes' if x.complete else 'no'}",
        f"time: {seconds:.1f} s ({_rate(x.states, seconds)} states/s)",
    ]
    if x.violation:
        lines.append(f"FAIL: the spec breaks its own invariants in {len(x.trace)} step(s):")
        lines += _trace_text(x.trace, x.violation)
        return 1, "\n".join(lines)
    if not x.complete:
        lines.append("INCOMPLETE: the search was cut short")
        return 2, "\n".join(lines)
    lines.append("PASS: no violation within bounds")
    return 0, "\n".join(lines)


def _main_product(
    endpoints: int,
    bounds: Bounds,
    depth: int,
    limits: str,
    engine: str | None,
    client: str | None,
) -> tuple[int, str]:
    e, c = engine or "reference", client or "reference"
    focus = default_focus(e, c)
    # Every setup (tiers, draft, encoder, FP8, LoRA, exact lane, opt-out, unreported) for a
    # system we know nothing about; a catalogued mutant gets the setups its rule needs.
    configs, policy = None, None
    started = time.perf_counter()
    try:
        x = explore_adapter(e, c, configs, policy, bounds, depth)
    except ValueError as err:
        return 2, f"kvfence explore: {err}"
    seconds = time.perf_counter() - started
    chosen = f"chosen for {focus}" if focus else "all setups: an unknown system"
    where = f"setups {', '.join(x.setups)} ({chosen})"
    lines = [
        f"kvfence explore: the model x engine {e} x client {c}; {where}",
        limits,
        f"distinct states: {x.states:,}   transitions: {x.transitions:,}   "
        f"depth reached: {x.depth_reached}   complete: {'yes' if x.complete else 'no'}",
        f"time: {seconds:.1f} s ({_rate(x.states, seconds)} states/s, "
        f"{_rate(x.transitions, seconds)} transitions/s)",
    ]
    if x.other:
        lines.append(f"first broke other rules in {len(x.other_trace)} step(s):")
        lines += _trace_text(x.other_trace, x.other)
    if x.error:
        lines.append(f"ERROR after {len(x.trace)} step(s): {x.error}")
        lines += _trace_text(x.trace, ())
        return 2, "\n".join(lines)
    if x.violation:
        setup = f"setup {x.setup}: " + ", ".join(_config_text(k) for k in x.configs)
        assert x.policy is not None
        lines.append(
            f"FAIL: shortest counterexample, {x.steps} step(s), from {setup}; "
            f"client {_policy_text(x.policy)}"
        )
        lines += _trace_text(x.trace, x.violation)
        if x.counterexample is not None:
            lines.append(f"trace: {x.counterexample}")
        return 1, "\n".join(lines)
    if x.other:
        lines.append(f"FAIL: {focus} was not shown broken within depth {depth}")
        return 1, "\n".join(lines)
    if not x.complete:
        lines.append("INCOMPLETE: the search was cut short")
        return 2, "\n".join(lines)
    lines.append("PASS: no violation within bounds")
    return 0, "\n".join(lines)
