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
two-phase  one standard endpoint; mode none                WIN-001/002/003
derived    one endpoint with derived weight state          DER-001
mixed-info radix off (reported) + radix on (reported)      CLI-001 across endpoints
abort      one standard endpoint; auto, pause abort        CLI-012
========== ============================================== ==================================

Every endpoint runs with the radix cache on and honestly reported (except where the
table says otherwise). Features are split over one-endpoint setups because each multiplies
the state space; the costs of separate setups only add up. A catalogued mutant's declared
rule (``Mutant.rule``) is the focus by default: a path that breaks only other rules is
recorded (``other``) and not extended, as in a focused stateful run. The caller (the
CLI, a test) passes the adapter objects and the focus; this module names no catalogue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from ..adapters.protocol import ClientAdapter, EngineAdapter
from ..model.actions import Action
from ..model.checks import SpecError, Violation
from ..model.explore import EXACT, STANDARD, default_configs
from ..model.rules import RuleId
from ..model.state import (
    Bounds,
    Config,
    Policy,
    State,
    initial_state,
    server_info,
    with_profile,
)
from ..model.vocabulary import CacheMode, Lane, PauseMode, Role, Tier
from .errors import AdapterError, BeyondModel, ConformanceFailure, Diverged, NotEnabled
from .lockstep import Cursor, Lockstep
from .record import Recorder
from .replay import replay_actions
from .trace import header, safe_name, unique_path, verdict_line, write_trace
from .verdict import ReplayKind

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
            RuleId.CLI_001,
            RuleId.CLI_004,
            RuleId.CLI_006,
            RuleId.ENG_001,
            RuleId.ENG_003,
            RuleId.ENG_006,
            RuleId.ENG_009,
            RuleId.ENG_010,
            RuleId.FC_001,
            RuleId.FC_002,
            RuleId.FC_003,
            RuleId.FC_004,
            RuleId.FC_005,
            RuleId.INV_001,
            RuleId.INV_002,
            RuleId.INV_003,
            RuleId.INV_004,
            RuleId.LIV_001,
            RuleId.LIV_002,
            # the colocated order and label-only publishing
            RuleId.MEM_001,
            RuleId.MEM_002,
            RuleId.PUB_001,
            RuleId.PUB_002,
        ),
    ),
    Setup(
        "no-flush",
        (EXACT, STANDARD),
        Policy(mode=CacheMode.NONE, pause_mode=PauseMode.IN_PLACE),
        _rules(RuleId.ENG_001, RuleId.ENG_002, RuleId.CLI_005, RuleId.FC_001),
    ),
    Setup(
        "in-place",
        (EXACT, STANDARD),
        Policy(pause_mode=PauseMode.IN_PLACE),
        _rules(RuleId.CLI_007),
    ),
    Setup(
        "unreported",
        (Config(lane=Lane.EXACT, info=None), Config(info=server_info())),
        Policy(),
        _rules(RuleId.CLI_002, RuleId.CLI_006),
    ),
    Setup(
        "tiers",
        (Config(draft=True, tiers=frozenset(Tier)),),
        Policy(),
        _rules(RuleId.ENG_003, RuleId.ENG_004, RuleId.ENG_008),
    ),
    Setup("encoder", (Config(encoder=True),), Policy(), _rules(RuleId.ENG_003)),
    # The client opts out of the prefix flush, so that an update keeps the prefix cache and
    # encoder outputs must still follow the weights (ENG-012, PF-21).
    Setup(
        "encoder-opt-out",
        (Config(encoder=True),),
        Policy(mode=CacheMode.NONE),
        _rules(RuleId.ENG_012),
    ),
    Setup(
        "fp8",
        (
            Config(
                fp8_kv=True, info=server_info(radix_cache_enabled=True, kv_cache_dtype="fp8_e4m3")
            ),
        ),
        Policy(),
        _rules(RuleId.ENG_005),
    ),
    Setup("lora", (Config(lora=True),), Policy(), _rules(RuleId.ENG_007)),
    # Two-phase windows on one standard endpoint whose client opts out of the flush, so a
    # finish keeps what the engine must drop itself (WIN-002); derived state on its own.
    Setup(
        "two-phase",
        (STANDARD,),
        Policy(mode=CacheMode.NONE),
        _rules(RuleId.WIN_001, RuleId.WIN_002, RuleId.WIN_003),
    ),
    Setup("derived", (Config(derived=True),), Policy(), _rules(RuleId.DER_001)),
    # Endpoints that report different server info: endpoint 0 without the radix cache,
    # endpoint 1 with it, so a decision read from one endpoint is wrong for the other
    # (endpoint0-info-only, CLI-001).
    Setup(
        "mixed-info",
        (Config(radix=False, info=server_info(radix_cache_enabled=False)), STANDARD),
        Policy(),
        _rules(RuleId.CLI_001),
    ),
    # A pause that aborts in-flight requests, so a client program has aborted requests to
    # requeue (CLI-012).
    Setup("abort", (STANDARD,), Policy(pause_mode=PauseMode.ABORT), _rules(RuleId.CLI_012)),
)
"""The default starting points (see the module table)."""


DEPLOYMENTS: dict[str, tuple[Setup, ...]] = {
    # One standard endpoint of two data-parallel ranks: a request placed on either rank, the
    # flush and update fanned out to both, a rank's injected failure (PF-25, PF-26).
    "ranks": (
        Setup(
            "ranks",
            (Config(ranks=2),),
            Policy(),
            _rules(RuleId.RNK_001, RuleId.RNK_002, RuleId.RNK_003),
        ),
    ),
    # Two standard endpoints on one shared KV store, of another lineage and KV format each:
    # an entry stored by one is offered to the other, and to itself after an update or a
    # restart (PF-31).
    "store": (
        Setup(
            "store",
            (Config(store=True), Config(store=True, lineage="sft-b", kv_format="fp8")),
            Policy(),
            _rules(RuleId.STO_001),
        ),
    ),
    # A prefill and a decode engine, each updated, flushed, paused by its own calls: a
    # request on the decode engine is prefilled on the other, a live transfer holds the
    # prefill side's KV until it finishes, and a rolling update leaves the two at two
    # versions (PF-29, PF-30).
    "pd": (
        Setup(
            "pd",
            (
                Config(role=Role.PREFILL),
                Config(role=Role.DECODE, radix=False, info=server_info(radix_cache_enabled=False)),
            ),
            Policy(),
            _rules(RuleId.PD_001, RuleId.FC_005),
        ),
    ),
    # Two workers behind one router: requests only to workers in rotation, each worker
    # updated, flushed, paused and continued by its own call, taken out of the rotation and
    # put back (RTR-001).
    "router": (
        Setup(
            "router",
            (Config(router=True), Config(router=True)),
            Policy(),
            _rules(RuleId.RTR_001),
        ),
    ),
}
"""Deployment setups (``kvfence explore --deployment NAME``): opt-in, never among the
default ``SETUPS``, so the default search and its counts stay those of single schedulers;
``setups_for`` picks one when the focused rule is one of its own."""


def setups_for(focus: str | None) -> tuple[Setup, ...]:
    """The setups that make ``focus`` reachable (a deployment's too); all of ``SETUPS`` if
    none does (or no focus)."""
    every = (*SETUPS, *(s for group in DEPLOYMENTS.values() for s in group))
    chosen = tuple(s for s in every if focus in s.rules)
    return chosen or SETUPS


def deployment_diagram(name: str) -> str:
    """Deployment ``name`` (``DEPLOYMENTS``) as a Mermaid flowchart, drawn from its setup:
    one node per endpoint of its configs (a prefill or decode role, a router's worker, its
    ranks as nodes of their own), the trainer's control calls (pause, update, flush,
    continue: each endpoint's own call, fanned out to its ranks), the KV that moves between
    parts (a P/D transfer, a shared store's entries), the router's traffic, and on each
    edge the setup's rules that judge it. ``ValueError`` for an unknown name."""
    lines = ["flowchart LR", '  trainer(["trainer: its weight sync"])']
    for setup in deployment(name):
        rules = ", ".join(sorted(setup.rules))
        routed = [i for i, c in enumerate(setup.configs) if c.router]
        if routed:
            lines.append('  router{{"router: rotation"}}')
            lines.append('  requests(["requests"]) --> router')
        for i, c in enumerate(setup.configs):
            what = [f"endpoint {i}"]
            if c.role is not None:
                what.append(c.role.value)
            if c.router:
                what.append("worker")
            what.append("radix cache on" if c.radix else "radix cache off")
            lines.append(f'  ep{i}["{", ".join(what)}"]')
            control = "pause, update, flush, continue"
            if c.ranks > 1:
                lines.append(f"  trainer -->|{control}| ep{i}")
                for k in range(c.ranks):
                    lines.append(f'  ep{i}r{k}["rank {k}: weights, radix cache, requests"]')
                    lines.append(f"  ep{i} <-->|fan-out, merged reply: {rules}| ep{i}r{k}")
                    if not c.router:
                        lines.append(f'  requests(["requests"]) -->|placed on a rank| ep{i}r{k}')
            else:
                lines.append(f"  trainer -->|{control}: its own call| ep{i}")
                if not c.router and c.role is None:
                    lines.append(f'  requests(["requests"]) --> ep{i}')
            if c.router:
                lines.append(f"  router -->|traffic while in rotation: {rules}| ep{i}")
            if c.store:
                lines.append(f"  ep{i} <-->|store, load: {rules}| store")
        if any(c.store for c in setup.configs):
            lines.append('  store[("KV store: shared, outlives restarts")]')
        prefill = [i for i, c in enumerate(setup.configs) if c.role is Role.PREFILL]
        decode = [i for i, c in enumerate(setup.configs) if c.role is Role.DECODE]
        for p in prefill:
            for d in decode:
                lines.append(
                    f"  ep{p} -->|KV transfer, live until the request finishes: {rules}| ep{d}"
                )
        for d in decode:
            lines.append(f'  requests(["requests"]) --> ep{d}')
    return "\n".join(lines)


def deployment(name: str) -> tuple[Setup, ...]:
    """The setups of deployment ``name``; ``ValueError`` names the known ones."""
    try:
        return DEPLOYMENTS[name]
    except KeyError:
        known = ", ".join(DEPLOYMENTS)
        raise ValueError(f"unknown deployment {name!r}; known: {known}") from None


# ----- the SUT's fingerprint -------------------------------------------------------------


_ATOMS = (int, str, float, bool, type(None), Enum)
_ATOM_KINDS = frozenset({int, str, float, bool, type(None)})
_ATTRS_KINDS: dict[type, tuple[bool, tuple[str, ...]]] = {}
"""Per attrs class: whether its instances are kept as they are (hashable), and its field
names: looked up once per class, not once per value."""


def freeze(obj: Any) -> Hashable:
    """A hashable, canonical rendering of ``obj``: dicts and sets become frozensets (so the
    insertion order that ``repr`` would show does not count), lists and tuples tuples,
    objects their class and fields. Frozen attrs values are kept as they are."""
    kind = type(obj)
    if kind in _ATOM_KINDS:
        return obj
    if kind is dict:
        return frozenset([(freeze(k), freeze(v)) for k, v in obj.items()])
    if kind is list or kind is tuple:
        return tuple([freeze(v) for v in obj])
    if kind is set or kind is frozenset:
        return frozenset([freeze(v) for v in obj])
    if isinstance(obj, _ATOMS):
        return obj
    known = _ATTRS_KINDS.get(kind)
    if known is None and attrs.has(kind):
        known = _ATTRS_KINDS[kind] = (
            kind.__hash__ is not None,
            tuple(f.name for f in attrs.fields(kind)),
        )
    if known is not None:
        hashable, names = known
        if hashable:
            return obj
        return (kind.__qualname__, *[freeze(getattr(obj, n)) for n in names])
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
    ``complete``: every node within its setup's depth expanded, no ``max_states`` cut, no
    stop. ``setup_states``: distinct nodes per setup, in the order of ``setups`` (so a
    caller can tell every setup was explored, not one corner of one); ``depths``: the
    depth each setup was explored to, in the same order.
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
    setup_states: tuple[int, ...] = ()
    depths: tuple[int, ...] = ()

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
    cursor: Cursor
    snap: Any


def _bare(state: State) -> State:
    return state.without_ledger() if state.ledger else state


class _Search:
    """The breadth-first search's bookkeeping: seen nodes, the queue, counts, and the first
    path that broke only other rules. ``run`` returns how it ended: ``None`` (searched
    out), or ``(node, path, error)`` for the first failing path (``error`` empty) or the
    first adapter error."""

    def __init__(self, engine, client, setups, bounds, depths, faults, focus, timeout) -> None:
        self.engine, self.client, self.setups = engine, client, setups
        self.bounds, self.depths, self.faults = bounds, depths, faults
        self.focus, self.timeout = focus, timeout
        self.recorder = Recorder()
        self.seen: set[tuple[Any, ...]] = set()
        self.queue: deque[_Node] = deque()
        self.transitions = self.depth_reached = 0
        self.setup_states = [0] * len(setups)
        self.max_states: int | None = None
        self.truncated = False
        self.other: tuple[tuple[Violation, ...], tuple[Action, ...]] | None = None

    def lockstep(self, node: _Node) -> Lockstep:
        s = self.setups[node.setup]
        lock = Lockstep(
            self.engine, self.client, self.recorder, self.bounds, self.timeout, focus=self.focus
        )
        lock.resume(s.configs, s.policy, node.cursor)
        return lock

    def key(self, node: _Node) -> tuple[Any, ...]:
        c = node.cursor
        rules = frozenset(v.rule for v in c.pending)
        return (node.setup, c.states, fingerprint(self.engine.endpoints), rules, c.off_contract)

    def run(self) -> tuple[_Node, tuple[Action, ...], str] | None:
        for i, s in enumerate(self.setups):
            self.engine.start(s.configs)
            root = _Node(i, (), Cursor(frozenset({initial_state(s.configs, s.policy)})), None)
            self.seen.add(self.key(root))
            self.setup_states[i] += 1
            self.queue.append(attrs.evolve(root, snap=self.engine.snapshot()))
        while self.queue:
            node = self.queue.popleft()
            if len(node.path) < self.depths[node.setup]:
                for action in self.lockstep(node).enabled_actions():
                    if not (action.fault and not self.faults):
                        end = self.step(node, action)
                        if end is not None:
                            return end
        return None

    def step(self, node: _Node, action: Action) -> tuple[_Node, tuple[Action, ...], str] | None:
        """Run one edge; the search's end if it found one."""
        self.engine.restore(node.snap)
        lock, path, level = self.lockstep(node), (*node.path, action), len(node.path) + 1
        self.transitions += 1
        try:
            lock.run(action)
            lock.check_model()
        except ConformanceFailure:
            self.depth_reached = max(self.depth_reached, level)
            return node, path, ""
        except Diverged as e:
            self.other = self.other or (tuple(e.args[0]), path)
            return None
        except (NotEnabled, BeyondModel):
            return None
        except (AdapterError, SpecError) as e:
            return node, path, str(e)
        rules = {v.rule for v in lock.pending}
        if rules and (self.focus is None or self.focus in rules):
            self.depth_reached = max(self.depth_reached, level)
            return node, path, ""
        if rules and self.other is None:
            self.other = (tuple(lock.pending), path)
        c = lock.cursor()
        child = _Node(
            node.setup, path, attrs.evolve(c, states=frozenset(map(_bare, c.states))), None
        )
        k = self.key(child)
        if k in self.seen:
            return None
        if self.max_states is not None and len(self.seen) >= self.max_states:
            self.truncated = True
            return None
        self.seen.add(k)
        self.setup_states[node.setup] += 1
        self.depth_reached = max(self.depth_reached, level)
        if level < self.depths[node.setup]:
            self.queue.append(attrs.evolve(child, snap=self.engine.snapshot()))
        return None

    def result(self, **fields: Any) -> AdapterExploration:
        return AdapterExploration(
            engine=self.engine.name,
            client=self.client.name,
            focus=self.focus,
            setups=tuple(s.name for s in self.setups),
            states=len(self.seen),
            setup_states=tuple(self.setup_states),
            depths=self.depths,
            transitions=self.transitions,
            depth_reached=self.depth_reached,
            complete=fields.pop("complete", False),
            other=self.other[0] if self.other else (),
            other_trace=self.other[1] if self.other else (),
            **fields,
        )


def explore_adapter(
    engine: EngineAdapter,
    client: ClientAdapter,
    configs: tuple[Config, ...] | None = None,
    policy: Policy | None = None,
    bounds: Bounds = EXPLORE_BOUNDS,
    depth: int = 4,
    depths: Mapping[str, int] | None = None,
    faults: bool = True,
    focus: str | None = None,
    max_states: int | None = None,
    out_dir: Path | None = Path("kvfence-results"),
    timeout: float = 60.0,
    setups: tuple[Setup, ...] | None = None,
) -> AdapterExploration:
    """Breadth-first search of model x SUT: ``engine`` must be in-process, with
    ``snapshot``/``restore`` (``ValueError`` otherwise); it is closed at the end.

    ``setups``: where to start (a ``deployment``'s); else ``configs``/``policy``: one
    setup; when both are None, ``setups_for(focus)``.
    ``depth``: steps from each setup's start; ``depths``: a different depth for some
    setups, by setup name (``ValueError`` for a name not among the setups explored, or a
    depth below 0).
    ``focus``: a rule ID the search is after (a path that breaks only other rules is
    recorded and not extended); None stops at any violation. ``faults``: draw injected
    faults. ``out_dir``: where the counterexample trace goes (None: not written).
    """
    if not (hasattr(engine, "snapshot") and hasattr(engine, "restore")):
        raise ValueError(f"engine {engine.name!r} cannot be explored: not in-process")
    if setups is not None:
        pass
    elif configs is None and policy is None:
        setups = setups_for(focus)
    else:
        chosen = configs if configs is not None else default_configs(2)
        setups = (Setup("given", chosen, policy or Policy(), frozenset()),)
    # The engine's declared profile holds on every endpoint, as in ``Lockstep.start``.
    profile = getattr(engine, "profile", None)
    setups = tuple(
        attrs.evolve(s, configs=tuple(with_profile(c, profile) for c in s.configs)) for s in setups
    )
    limits = _depths(setups, depth, depths or {})
    search = _Search(engine, client, setups, bounds, limits, faults, focus, timeout)
    search.max_states = max_states
    try:
        end = search.run()
    finally:
        engine.close()
    if end is None:
        return search.result(complete=not search.truncated)
    node, path, error = end
    s = setups[node.setup]
    found = search.result(setup=s.name, configs=s.configs, policy=s.policy, trace=path)
    if error:
        return attrs.evolve(found, error=error)
    return _counterexample(engine, client, found, bounds, timeout, out_dir)


def _depths(setups: tuple[Setup, ...], depth: int, depths: Mapping[str, int]) -> tuple[int, ...]:
    """Each setup's depth: ``depths[name]`` where given, else ``depth``."""
    names = [s.name for s in setups]
    unknown = sorted(set(depths) - set(names))
    if unknown:
        raise ValueError(f"depths name setups not explored here: {unknown} (setups: {names})")
    limits = tuple(depths.get(n, depth) for n in names)
    bad = {n: d for n, d in zip(names, limits, strict=True) if not isinstance(d, int) or d < 0}
    if bad:
        raise ValueError(f"a depth must be a whole number of steps, 0 or more: {bad}")
    return limits


def _counterexample(
    engine: EngineAdapter,
    client: ClientAdapter,
    found: AdapterExploration,
    bounds: Bounds,
    timeout: float,
    out_dir: Path | None,
) -> AdapterExploration:
    """Replay the failing path from a fresh start for its trace lines, and write them."""
    assert found.policy is not None
    try:
        replayed = replay_actions(
            engine, client, found.configs, found.policy, list(found.trace), None, bounds, timeout
        )
    finally:
        engine.close()
    if replayed.kind is not ReplayKind.FAIL:
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
            capabilities=engine.capabilities,
        )
        stem = f"explore-counterexample-{safe_name(found.engine)}-{safe_name(found.client)}"
        path = unique_path(out_dir, stem)  # per run, as check's: time and process ID
        path = write_trace(path, head, run.steps, verdict_line(run.steps, violations))
    return attrs.evolve(found, violation=violations, counterexample=path)


# ----- the breadth-first kill ------------------------------------------------------------

KILL_DEPTH = 5
"""Depth of the breadth-first kill: every catalogued mutant's shortest counterexample is
at most 5 steps (``tests/test_explore.py``'s ``SHORTEST``), except those the kill matrix
sends straight to the stateful search (``battery.BEYOND_FIRST_KILL``)."""

KILL_STATES = 20000
"""Nodes the breadth-first kill may visit in one setup before it gives up for the stateful
search."""

KILL_SHALLOW = 2
"""Depth of the breadth-first kill's first search, over every setup at once."""

KILL_ROUNDS = (1000, 5000, KILL_STATES)
"""The state budget of each later round of the breadth-first kill, per setup
(``kill_search``)."""


def kill_search(
    engine: Callable[[], EngineAdapter],
    client: Callable[[], ClientAdapter],
    rule: str | None,
    out_dir: Path | None,
    timeout: float = 60.0,
) -> AdapterExploration | None:
    """The breadth-first kill of ``rule`` (the kill matrix's ``first_kill``, and the
    battery's kills): the exploration that broke it (its ``configs``, ``policy`` and
    ``trace`` are a shortest kill), or ``None`` when it cannot say (an adapter error, the
    rule not shown). ``engine``/``client`` build a fresh adapter for each search; its trace
    is written under ``out_dir``.

    First every setup that makes the rule reachable (``setups_for``) is searched at once
    to ``KILL_SHALLOW`` steps; then the setups one at a time, those with fewer endpoints
    first, in rounds of growing state budgets (``KILL_ROUNDS``) to ``KILL_DEPTH`` steps; a
    setup explored completely without the kill is not searched again. A rule reachable in
    one setup alone (a deployment's) skips the first search: breadth-first, the rounds
    find the same shortest kill, and the shallow levels were searched twice."""
    setups = sorted(setups_for(rule), key=lambda s: len(s.configs))
    names = [s.name for s in setups]
    left = list(names)

    def search(depth: int, depths: dict[str, int], budget: int) -> AdapterExploration:
        return explore_adapter(
            engine(),
            client(),
            focus=rule,
            depth=depth,
            depths=depths,
            max_states=budget,
            out_dir=out_dir,
            timeout=timeout,
        )

    if len(setups) > 1:
        x = search(KILL_SHALLOW, {}, KILL_STATES)
        if x.error:
            return None
        if rule in x.caught() and x.counterexample is not None:
            return x
    for budget in KILL_ROUNDS:
        for name in list(left):
            x = search(KILL_DEPTH, {n: 0 for n in names if n != name}, budget)
            if x.error:
                return None
            if rule in x.caught() and x.counterexample is not None:
                return x
            if x.complete:
                left.remove(name)
    return None


# ----- evidence witnesses ----------------------------------------------------------------


EVIDENCE_SHALLOW = 2
"""Depth to which the evidence search records a shortest path for every rule (a
deployment's setups: ``EVIDENCE_SHALLOW_DEPLOYMENT``)."""

EVIDENCE_SHALLOW_DEPLOYMENT = 3
"""The same for a deployment's setups: a request or a refused update crosses two parts
(an update's failure settled on a router's worker, a token sampled across a P/D update),
one step more than on a single endpoint."""

EVIDENCE_DEPTH = 4
"""Depth to which it goes on for the rules its setup names (``Setup.rules``) not shown yet
(a window's WIN-002 is four steps: open, a chunk, a serve under mixed weights, the finish)."""

EVIDENCE_STATES = 8000
"""Nodes the evidence search of one setup visits at most."""


class _EvidenceSearch(_Search):
    """The breadth-first search of ``evidence_search``: every edge is judged as in
    ``_Search``, and the first path whose last step gave a rule evidence (the recorder's
    ``exercised`` count grew, or a REACH rule was reached) is kept for it. It ends once no
    level beyond ``shallow`` is needed (every rule of ``wanted`` has its path), or
    at the state budget."""

    def __init__(self, *args: Any, wanted: frozenset[str], shallow: int) -> None:
        super().__init__(*args)
        self.wanted, self.shallow = wanted, shallow
        self.found: dict[str, tuple[Action, ...]] = {}

    def step(self, node: _Node, action: Action) -> tuple[_Node, tuple[Action, ...], str] | None:
        path = (*node.path, action)
        if len(node.path) >= self.shallow and self.wanted <= set(self.found):
            return node, path, "done"
        rec = self.recorder
        before, reached = dict(rec.exercised), set(rec.reached)
        end = super().step(node, action)
        grew = {r for r, n in rec.exercised.items() if n > before.get(r, 0)}
        for r in grew | (rec.reached - reached):
            self.found.setdefault(r, path)
        if self.truncated:
            return node, path, "done"
        return end


def evidence_search(
    engine: EngineAdapter,
    client: ClientAdapter,
    setup: Setup,
    shallow: int = EVIDENCE_SHALLOW,
    timeout: float = 60.0,
) -> dict[str, tuple[Action, ...]]:
    """For each rule an in-process ``engine`` and ``client`` gave evidence for from
    ``setup``, a shortest path of top-level actions whose last step gave it: every rule to
    ``shallow`` steps, the setup's own rules (``Setup.rules``) to
    ``EVIDENCE_DEPTH``, within ``EVIDENCE_STATES`` nodes. Breadth-first in lockstep, as
    ``explore_adapter``; a path that breaks a rule ends there (the caller's reference system
    should break none). ``engine`` is closed at the end; ``ValueError`` if it is not
    in-process."""
    if not (hasattr(engine, "snapshot") and hasattr(engine, "restore")):
        raise ValueError(f"engine {engine.name!r} cannot be explored: not in-process")
    profile = getattr(engine, "profile", None)
    setup = attrs.evolve(setup, configs=tuple(with_profile(c, profile) for c in setup.configs))
    args = (engine, client, (setup,), EXPLORE_BOUNDS, (EVIDENCE_DEPTH,), True, None, timeout)
    search = _EvidenceSearch(*args, wanted=setup.rules, shallow=shallow)
    search.max_states = EVIDENCE_STATES
    try:
        search.run()
    finally:
        engine.close()
    return search.found
