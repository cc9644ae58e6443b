"""The battery: fixed scenarios derived from the model, run by every check before its
random search, so that no verdict depends on the luck of the draw.

A scenario is a setup (endpoint ``configs``, client ``policy``) and a list of top-level
actions, with the rules it is for. The battery is generated, never hand-written:

- **kills**: each catalogued mutant's shortest kill, as the kill matrix's breadth-first
  search finds it (``explore.kill_search``), for the mutant's rule;
- **witnesses**: for each setup of the product explorer (``explore.SETUPS``), a shortest
  path of the model to each REACH rule (``model.explore.witnesses``);
- **cases**: for each mutant the breadth-first kill cannot reach (``BEYOND_FIRST_KILL``),
  the trace of the public case it mirrors (``adapters.cases``), where it has one: the
  catalogue's own minimal scenario of that report, so that its kill does not wait for the
  random search to draw it;
- **long**: on the plain setup, ``LONG_UPDATES`` updates with every prefix served around
  each; ``LONG_SERVES`` serves of one prefix before an update; three prompts and three
  requests in flight across an update (``BATTERY_BOUNDS``); three endpoints; and on the
  tiers setup, ``LONG_UPDATES`` rounds of serve, evict to storage, update. The random
  search's examples are ``stateful_step_count`` steps over two prompts, two request IDs
  and two endpoints: a bug that waits for the Nth update, the Kth serve or a third
  prompt is out of its reach; these scenarios are in it. Each is built from a template
  of actions, keeping only those the model enables on the way, in lockstep with the
  reference system (``_with_evidence``).

Every scenario ends with its reuse (``run_battery``): each prompt it touched served once
more on each endpoint, where the engine enables it. A fault that an engine hides from its
cache view (a storage backend that loads old KV back) shows there as stale KV served.

Each scenario also records the rules the reference system gave evidence for when it ran
it (``Scenario.evidence``): the per-rule report counts a scenario for the rules it is for
and those it exercises.

**Cache.** Generating takes seconds (the kills are breadth-first searches), so the battery
is written to ``battery_path()``: ``$KVFENCE_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvfence``,
else ``~/.cache/kvfence``, as ``battery-<spec version>-<fingerprint>.json``, where the
fingerprint is ``fingerprint.source_fingerprint`` (the model, the adapters, the checker, the
Python and Hypothesis versions). The same tree always generates the same battery (every
search in it is breadth-first and deterministic); a changed tree generates a new one.

**Running** (``run_battery``): every scenario is run in lockstep from a fresh start, in
order (a focused check's scenarios for its rule first), on the engine and client under
check. A scenario is adapted to the engine: its
configs are the engine's own when the engine runs fixed endpoints, and it is skipped, with
the reason, when it needs a config feature or an action the engine does not declare, more
endpoints than it runs, or a step its endpoints do not enable, or when on the engine's
fixed endpoints it is the same run as a scenario before it (a real engine's one endpoint
makes many setups' witnesses one scenario). At most ``limit`` scenarios
run (the check's example budget); the rest are skipped as over the budget.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from attrs import frozen

from ..adapters.protocol import ClientAdapter, EngineAdapter
from ..model import SPEC_VERSION
from ..model.actions import (
    Action,
    EvictPrefix,
    FinishRequest,
    ServeRequest,
    StartRequest,
    SyncWeights,
    action_from_json,
)
from ..model.capabilities import Capability, needed
from ..model.rules import RuleId
from ..model.state import PROFILE_FIELDS, Bounds, Config, Policy, initial_state, with_profile
from ..model.vocabulary import Lane, Tier
from .calls import stop_if_asked
from .errors import AdapterError, BeyondModel, ConformanceFailure, Diverged, NotEnabled, Refused
from .lockstep import Lockstep
from .record import Recorder
from .trace import config_from_json, config_json, policy_from_json, policy_json, write_atomic

if TYPE_CHECKING:
    from .explore import Setup

BATTERY_BOUNDS = Bounds(
    prefixes=("P", "Q", "R"), rids=("r1", "r2", "r3"), versions=64, lora_revisions=16
)
"""The battery's bounds: a third prompt and a third request ID beyond the random search's
(``lockstep.MACHINE_BOUNDS``)."""

LONG_UPDATES = 10
"""Updates in the long scenarios (a bug that waits for the 8th update is inside)."""

LONG_SERVES = 20
"""Serves of one prefix before an update in the long scenario (one after 16 is inside)."""

WITNESS_DEPTH = 4
"""Most steps of a REACH witness."""

WITNESS_STATES = 6_000
"""Most (state, memory) pairs the witness search of one setup visits."""

FORMAT = 1
"""The cache file's format; a file of another format is generated again."""


BEYOND_FIRST_KILL: dict[str, str] = {
    "serves-after-raised-flush": "its fault (a flush that raises after the weights moved) "
    "shows only at the request after a failed update, beyond the breadth-first kill's "
    "setups at depth 5 (measured: no kill in 350 s); the stateful search kills it with "
    "FC-002 in a few examples",
    "identity-true": "its rule (CLI-013) is judged on server-info shapes no engine emits, in "
    "the client table alone; an explored endpoint always reports a producer shape",
    "storage-loads-back-stale": "its stale KV is hidden from the cache view and shows only "
    "when a prefix evicted to storage is served after an update's flush; INV-001's setups "
    "(plain) have no tiers; the battery's storage kill (flush-forgets-storage's, with its "
    "reuse) kills it with INV-001",
    "in-place-pause-races-weight-write": "its KV of no version needs a request paused in "
    "place across an update and served after it, beyond the breadth-first kill's setups at "
    "depth 5 (measured: no kill in 350 s); the battery's case scenario (PF-28's trace) "
    "kills it with INV-001",
}
"""Mutants the breadth-first kill cannot reach at its setups, each with the reason: the
kill matrix goes straight to the stateful search for them (``matrix.run_job``), and the
battery holds no breadth-first kill of theirs: it holds their public case's trace where
they have one (``case_scenarios``), and its other scenarios or the client table kill the
rest (``scripts/budget.py`` shows each killed before the random search)."""


@frozen
class Scenario:
    """One battery scenario: ``name`` (how it was derived: ``kill <mutant>``, ``witness
    <REACH rule> on <setup>``, ``long <what>``), ``rules`` (the rules it is for),
    ``configs``, ``policy``, ``actions``, and ``evidence``: the rules the reference system
    gave evidence for on it."""

    name: str
    rules: tuple[str, ...]
    configs: tuple[Config, ...]
    policy: Policy
    actions: tuple[Action, ...]
    evidence: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rules": list(self.rules),
            "configs": [config_json(c) for c in self.configs],
            "policy": policy_json(self.policy),
            "actions": [a.to_json() for a in self.actions],
            "evidence": list(self.evidence),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Scenario:
        where = f"battery scenario {obj.get('name')!r}"
        return cls(
            name=str(obj["name"]),
            rules=tuple(obj["rules"]),
            configs=tuple(config_from_json(c, where) for c in obj["configs"]),
            policy=policy_from_json(obj["policy"], where),
            actions=tuple(action_from_json(a) for a in obj["actions"]),
            evidence=tuple(obj.get("evidence", ())),
        )


@frozen
class Battery:
    """A generated battery: its ``scenarios``, the ``spec_version`` and ``fingerprint`` it
    was generated for, and the ``seconds`` generating it took."""

    scenarios: tuple[Scenario, ...]
    spec_version: str
    fingerprint: str
    seconds: float


# ----- generation -------------------------------------------------------------------------


def _plain(config: Config) -> Config:
    """``config`` without an engine's profile fields (each check applies its own)."""
    defaults = Config()
    return attrs.evolve(config, **{f: getattr(defaults, f) for f in PROFILE_FIELDS})


def kill_scenarios(workers: int = 1) -> list[Scenario]:
    """Each catalogued mutant's shortest kill by breadth-first search
    (``explore.kill_search``; ``BEYOND_FIRST_KILL`` are not searched), in catalogue order,
    on ``workers`` processes."""
    from ..adapters import registry
    from ..adapters.mutants import MUTANTS
    from .explore import kill_search
    from .search import pool

    mutants = [m for m in MUTANTS if m.name not in BEYOND_FIRST_KILL]
    with tempfile.TemporaryDirectory(prefix="kvfence-battery-") as out:

        def one(i: int) -> Scenario | None:
            m = mutants[i]
            engine = m.name if m.side == "engine" else m.engine
            client = m.name if m.side == "client" else "reference"
            x = kill_search(
                lambda: registry.engine(engine),
                lambda: registry.client(client),
                m.rule,
                Path(out),
            )
            if x is None or x.policy is None:
                return None
            configs = tuple(_plain(c) for c in x.configs)
            return Scenario(f"kill {m.name}", (m.rule,), configs, x.policy, x.trace)

        found = list(pool(len(mutants), one, workers, "battery"))
    return [s for s in found if s is not None]


def witness_scenarios(setups: Sequence[Setup] | None = None) -> list[Scenario]:
    """For each setup of the product explorer (``explore.SETUPS``, then each deployment's;
    or each of ``setups``), a shortest path of the model to each REACH rule
    (``model.explore.witnesses``, within the explorer's bounds)."""
    from ..model.explore import witnesses
    from .explore import DEPLOYMENTS, EXPLORE_BOUNDS, SETUPS

    if setups is None:
        setups = (*SETUPS, *(s for group in DEPLOYMENTS.values() for s in group))
    out = []
    for setup in setups:
        root = initial_state(setup.configs, setup.policy)
        for w in witnesses((root,), EXPLORE_BOUNDS, WITNESS_DEPTH, True, cap=WITNESS_STATES):
            out.append(
                Scenario(
                    f"witness {w.rule} on {setup.name}",
                    (str(w.rule),),
                    setup.configs,
                    setup.policy,
                    w.trace,
                )
            )
    return out


def case_scenarios() -> list[Scenario]:
    """For each mutant of ``BEYOND_FIRST_KILL`` with a public case (``adapters.cases``),
    that case's trace, for the case's rule."""
    from ..adapters.cases import CASES

    return [
        Scenario(
            f"case {c.id} {c.mutant}",
            (c.rule,),
            tuple(_plain(x) for x in c.configs),
            c.policy,
            c.actions,
        )
        for c in CASES
        if c.mutant in BEYOND_FIRST_KILL
    ]


def long_scenarios() -> list[Scenario]:
    """The long scenarios (the module docstring's list), each on the model's path."""
    from .explore import SETUPS

    plain = next(s for s in SETUPS if s.name == "plain")
    tiers = next(s for s in SETUPS if s.name == "tiers")
    eps = range(len(plain.configs))
    prompts = BATTERY_BOUNDS.prefixes[:2]

    def serve_all(endpoints: Iterable[int], ps: Iterable[str]) -> list[Action]:
        return [ServeRequest(e, p) for e in endpoints for p in ps]

    updates: list[Action] = []
    for v in range(1, LONG_UPDATES + 1):
        updates += [*serve_all(eps, prompts), SyncWeights(v)]
    updates += serve_all(eps, prompts)
    serves = [ServeRequest(0, "P")] * LONG_SERVES + [SyncWeights(1), *serve_all(eps, ["P"])]
    three = BATTERY_BOUNDS.prefixes
    rids = BATTERY_BOUNDS.rids
    requests: list[Action] = [StartRequest(0, r, p) for r, p in zip(rids, three, strict=True)]
    requests += [*serve_all([1], three), SyncWeights(1)]
    requests += [FinishRequest(0, r) for r in rids] + serve_all(eps, three)
    wide = (Config(lane=Lane.EXACT), Config(), Config())
    endpoints = [*serve_all(range(3), ["P"]), SyncWeights(1), *serve_all(range(3), ["P"])]
    stored: list[Action] = []
    for v in range(1, LONG_UPDATES + 1):
        stored += [ServeRequest(0, "P"), EvictPrefix(0, "P", Tier.STORAGE), SyncWeights(v)]
    stored.append(ServeRequest(0, "P"))
    tiers_configs = tuple(_plain(c) for c in tiers.configs)
    made = [
        ("long updates", plain.configs, plain.policy, updates),
        ("long serves", plain.configs, plain.policy, serves),
        ("long three prompts and requests", plain.configs, plain.policy, requests),
        ("long three endpoints", wide, plain.policy, endpoints),
        ("long storage round trips", tiers_configs, tiers.policy, stored),
    ]
    return [
        Scenario(name, (RuleId.INV_001,), configs, policy, tuple(actions))
        for name, configs, policy, actions in made
    ]


def evidence_setups() -> list[Setup]:
    """Where the evidence witnesses start: each setup of the product explorer
    (``explore.SETUPS``) split into one setup per distinct endpoint config (same policy,
    named ``<setup>/<n>``; what one endpoint shows needs no second one, and one endpoint
    runs on every engine), then each deployment's setups (``explore.DEPLOYMENTS``) whole.
    A split setup keeps the rules of its parent that need no second endpoint: its evidence
    search goes deeper only for a one-endpoint setup's own rules."""
    from .explore import DEPLOYMENTS, SETUPS

    out: list[Setup] = []
    for s in SETUPS:
        configs = list(dict.fromkeys(s.configs))
        if len(configs) == 1:
            out.append(s)
            continue
        for n, c in enumerate(configs, 1):
            out.append(attrs.evolve(s, name=f"{s.name}/{n}", configs=(c,), rules=frozenset()))
    out += [s for group in DEPLOYMENTS.values() for s in group]
    return out


def evidence_scenarios(workers: int = 1) -> list[Scenario]:
    """The evidence witnesses: for each evidence setup (``evidence_setups``), the reference
    system's shortest path to evidence of each rule it shows there
    (``explore.evidence_search``), as one scenario per path, for the rules whose first
    evidence it is; a path that another of the same setup extends is left out, its rules
    going to the longer one. So every rule that the reference can show on a setup has a
    scenario that puts it at stake whatever the random search draws."""
    from ..adapters import registry
    from .explore import (
        DEPLOYMENTS,
        EVIDENCE_SHALLOW,
        EVIDENCE_SHALLOW_DEPLOYMENT,
        evidence_search,
    )
    from .search import pool

    setups = evidence_setups()
    deployed = {s.name for group in DEPLOYMENTS.values() for s in group}

    def one(i: int) -> list[Scenario]:
        s = setups[i]
        engine = registry.engine(_reference_for(s.configs))
        shallow = EVIDENCE_SHALLOW_DEPLOYMENT if s.name in deployed else EVIDENCE_SHALLOW
        found = evidence_search(engine, registry.client("reference"), s, shallow)
        paths: dict[tuple[Action, ...], list[str]] = {}
        for rule, path in found.items():
            paths.setdefault(path, []).append(rule)
        for path in sorted(paths, key=len):
            longer = [p for p in paths if len(p) > len(path) and p[: len(path)] == path]
            if longer:
                paths[min(longer, key=len)] += paths.pop(path)
        return [
            Scenario(
                f"evidence {', '.join(sorted(rules))} on {s.name}",
                tuple(sorted(rules)),
                tuple(_plain(c) for c in s.configs),
                s.policy,
                path,
            )
            for path, rules in sorted(paths.items(), key=lambda kv: (len(kv[0]), sorted(kv[1])))
        ]

    return [x for found in pool(len(setups), one, workers, "evidence") for x in found]


def _merged(scenarios: Iterable[Scenario]) -> list[Scenario]:
    """One scenario per (configs, policy, actions), with the rules of every copy."""
    out: dict[tuple, Scenario] = {}
    for s in scenarios:
        key = (s.configs, s.policy, s.actions)
        if key in out:
            first = out[key]
            rules = tuple(dict.fromkeys((*first.rules, *s.rules)))
            out[key] = attrs.evolve(first, rules=rules, name=f"{first.name}; {s.name}")
        else:
            out[key] = s
    return list(out.values())


def _reference_for(configs: tuple[Config, ...]) -> str:
    """The reference engine evidence on ``configs`` is taken on: the reference router
    (``drains-serving-workers``) on workers behind a router, whose rotation calls the plain
    reference engine (no ``router`` capability) would leave out; else the reference."""
    return "drains-serving-workers" if any(c.router for c in configs) else "reference"


def _with_evidence(scenarios: list[Scenario]) -> list[Scenario]:
    """Each scenario run in lockstep with the reference system: its actions those the
    model enabled on the way (a template's others left out), and its ``evidence`` the
    rules the reference exercised on it."""
    from ..adapters import registry

    out = []
    for s in scenarios:
        recorder = Recorder()
        engine, client = registry.engine(_reference_for(s.configs)), registry.client("reference")
        kept: list[Action] = []
        try:
            run_scenario(engine, client, s, recorder, 60.0, kept=kept)
        except (AdapterError, BeyondModel, ConformanceFailure, Diverged, Refused, NotEnabled):
            pass  # the reference breaking a scenario is for the pass matrix to show
        finally:
            engine.close()
        rules = sorted(set(recorder.exercised) | recorder.reached)
        out.append(attrs.evolve(s, actions=tuple(kept), evidence=tuple(rules)))
    return out


def generate(workers: int = 1) -> Battery:
    """The battery of this tree (kills, witnesses, long scenarios, each with its reuse and
    its reference evidence), timed."""
    from .fingerprint import source_fingerprint

    started = time.monotonic()
    fingerprint = source_fingerprint()
    scenarios = _merged(
        [
            *witness_scenarios(),
            *long_scenarios(),
            *kill_scenarios(workers),
            *case_scenarios(),
            *evidence_scenarios(workers),
        ]
    )
    scenarios = _with_evidence(scenarios)
    seconds = time.monotonic() - started
    return Battery(tuple(scenarios), SPEC_VERSION, fingerprint, seconds)


def cache_dir() -> Path:
    """Where generated batteries are kept: ``$KVFENCE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/kvfence``, else ``~/.cache/kvfence``."""
    given = os.environ.get("KVFENCE_CACHE_DIR")
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kvfence"


def battery_path(fingerprint: str | None = None) -> Path:
    """The cache file of the battery of this tree (``fingerprint``: its
    ``source_fingerprint``, computed when not given)."""
    if fingerprint is None:
        from .fingerprint import source_fingerprint

        fingerprint = source_fingerprint()
    return cache_dir() / f"battery-{SPEC_VERSION}-{fingerprint[:20]}.json"


def write(battery: Battery, path: Path) -> None:
    """``battery`` as JSON at ``path``, atomically."""
    data = {
        "format": FORMAT,
        "spec_version": battery.spec_version,
        "fingerprint": battery.fingerprint,
        "seconds": round(battery.seconds, 3),
        "scenarios": [s.to_json() for s in battery.scenarios],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1) + "\n")


def read(path: Path, fingerprint: str) -> Battery | None:
    """The battery at ``path`` if it is this tree's (format, spec version, fingerprint);
    ``None`` for a missing, unreadable or other tree's file."""
    try:
        data = json.loads(path.read_text())
        if (data["format"], data["spec_version"], data["fingerprint"]) != (
            FORMAT,
            SPEC_VERSION,
            fingerprint,
        ):
            return None
        scenarios = tuple(Scenario.from_json(s) for s in data["scenarios"])
        return Battery(scenarios, SPEC_VERSION, fingerprint, float(data["seconds"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


_LOADED: list[Battery] = []


def load(workers: int | None = None) -> Battery:
    """This process's battery: the one it loaded first (a forked worker inherits its
    parent's: the code a process runs is the code it loaded, whatever was edited since),
    else the cache file of this tree, else generated (on ``workers`` processes, default the
    usable cores) and written there. A cache that cannot be written is not an error: the
    battery is generated again next time."""
    from .fingerprint import source_fingerprint
    from .search import usable_cores

    if _LOADED:
        return _LOADED[0]
    fingerprint = source_fingerprint()
    path = battery_path(fingerprint)
    battery = read(path, fingerprint)
    if battery is None:
        with _generating(path):  # another process generating it: wait, then read its file
            battery = read(path, fingerprint)
            if battery is None:
                battery = generate(workers or usable_cores())
                with contextlib.suppress(OSError):
                    write(battery, path)
    _LOADED.append(battery)
    return battery


@contextlib.contextmanager
def _generating(path: Path):
    """Hold an exclusive lock (``fcntl.flock``) on ``path``'s ``.lock`` file beside it, so
    that processes started together on a cold cache (pytest-xdist workers, parallel checks)
    generate the battery once: the others wait and read what the first wrote. A cache
    folder that cannot be written (or a platform without ``fcntl``) takes no lock."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 (held until the end)
    except (ImportError, OSError):
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        lock.close()


# ----- running ----------------------------------------------------------------------------


_FEATURES: tuple[tuple[Capability, Callable[[Config], bool]], ...] = (
    (Capability.EXACT_LANE, lambda c: c.lane is Lane.EXACT),
    (Capability.TIERS, lambda c: c.tiers != frozenset({Tier.DEVICE})),
    (Capability.DRAFT, lambda c: c.draft),
    (Capability.ENCODER, lambda c: c.encoder),
    (Capability.FP8_KV, lambda c: c.fp8_kv),
    (Capability.LORA, lambda c: c.lora),
    (Capability.DERIVED, lambda c: c.derived),
    (Capability.RANKS, lambda c: c.ranks > 1),
    (Capability.ROLES, lambda c: c.role is not None),
    (Capability.ROUTER, lambda c: c.router),
    (Capability.STORE, lambda c: c.store),
)
"""The capability an engine must declare for a scenario whose configs use each feature:
every config feature (``CONFIG_FEATURES``) and every deployment shape
(``DEPLOYMENT_CAPABILITIES``). Without one, a scenario on a deployment the engine does not
run would be run on the reference deployment's endpoints in its place (``InProcessAdapter``
stands them in), crediting the engine with their evidence."""


def _endpoints_used(s: Scenario) -> int:
    used = [a.endpoint for a in s.actions if isinstance(getattr(a, "endpoint", None), int)]
    return max(used, default=-1) + 1


def adapted(engine: EngineAdapter, s: Scenario) -> tuple[tuple[Config, ...] | None, str]:
    """The configs ``s`` runs on for ``engine`` and ``""``, or ``None`` and why it is
    skipped: the engine's fixed endpoints (when it runs fixed ones, and they are enough),
    else the scenario's, when the engine declares every config feature they use."""
    fixed = engine.fixed_configs
    if fixed is not None:
        wanted = max(
            _endpoints_used(s), 1 if any(isinstance(a, SyncWeights) for a in s.actions) else 0
        )
        if len(fixed) < wanted:
            return None, f"needs {wanted} endpoints; the engine runs {len(fixed)}"
        return tuple(fixed), ""
    caps = engine.capabilities
    missing = sorted({c.value for c, uses in _FEATURES for x in s.configs if uses(x)} - caps)
    if missing:
        return None, f"needs {', '.join(missing)}"
    try:  # the engine's profile is applied to every config, as the lockstep does
        for c in s.configs:
            with_profile(c, getattr(engine, "profile", None))
    except ValueError as e:
        return None, f"its configs do not take the engine's profile ({e})"
    return s.configs, ""


def run_scenario(
    engine: EngineAdapter,
    client: ClientAdapter,
    s: Scenario,
    recorder: Recorder,
    timeout: float,
    focus: str | None = None,
    configs: tuple[Config, ...] | None = None,
    kept: list[Action] | None = None,
) -> str:
    """Run ``s`` in lockstep from a fresh start, then its reuse (each prompt it touched
    served once more on each endpoint, where enabled); ``""`` when every step ran, else why
    the rest was skipped (a step the engine's endpoints do not enable, or one needing a
    capability it lacks). ``kept``: a list to which the scenario's actions that were
    enabled are appended, the others being left out instead of ending the run (how a
    template is fitted to the model, ``_with_evidence``). Raises what ``Lockstep``
    raises: ``ConformanceFailure`` (a rule broken), ``Diverged`` (a focused run broke only
    other rules), ``Refused``, ``AdapterError``."""
    lock = Lockstep(engine, client, recorder, BATTERY_BOUNDS, timeout, focus=focus)
    lock.start(configs if configs is not None else s.configs, s.policy)
    caps = engine.capabilities
    for i, a in enumerate(s.actions):
        if kept is not None and a not in lock.enabled_actions():
            continue
        if kept is not None:
            kept.append(a)
        if a not in lock.enabled_actions():
            lacking = sorted(c.value for c in needed(a) - caps)
            why = f"needs {', '.join(lacking)}" if lacking else "not enabled on its endpoints"
            return f"step {i} {type(a).__name__}: {why}"
        lock.run(a)
        lock.check_model()
    prompts = sorted({a.prefix for a in s.actions if isinstance(a, (ServeRequest, StartRequest))})
    tail = [
        a
        for a in lock.enabled_actions()
        if type(a) is ServeRequest
        and a.prefix in prompts
        and a == ServeRequest(a.endpoint, a.prefix)
    ]
    for a in sorted(tail, key=lambda a: (a.endpoint, a.prefix)):
        if a in lock.enabled_actions():
            lock.run(a)
            lock.check_model()
    return ""


@frozen
class RuleTally:
    """The battery's outcome for one rule: scenarios for it (its own or with its evidence
    on the reference) that ``ran`` (to the end), ``passed``, ``failed``, and were
    ``skipped`` (``reason``: the first skip's)."""

    rule: str
    ran: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    reason: str = ""


@frozen
class BatteryRun:
    """What ``run_battery`` saw: per-rule ``tallies`` (rules in registry order, those with
    any scenario), and the totals ``ran``, ``passed``, ``failed``, ``skipped``; ``seconds``;
    ``failed_scenario``: the name of the scenario that broke a rule (the check's
    counterexample is shrunk from it), else ``""``."""

    tallies: tuple[RuleTally, ...] = ()
    ran: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    failed_scenario: str = ""


def run_battery(
    engine: EngineAdapter,
    client: ClientAdapter,
    battery: Battery,
    recorder: Recorder,
    timeout: float,
    focus: str | None = None,
    limit: int | None = None,
) -> BatteryRun:
    """Run every scenario of ``battery`` (``adapted`` to ``engine``) into ``recorder``,
    until one breaks a rule (``ConformanceFailure``: the recorder holds the failing run, as
    after a failing search) or at most ``limit`` have been started. ``AdapterError`` and
    ``KeyboardInterrupt`` propagate (the caller ends the check on them). With ``focus``, a
    scenario that broke only other rules is recorded as the focused search records one
    (``Recorder.other``) and the battery goes on."""
    from ..model.rules import RULES

    started = time.monotonic()
    counts: dict[str, dict[str, Any]] = {}
    totals = {"ran": 0, "passed": 0, "failed": 0, "skipped": 0}
    failed_name = ""

    def tally(s: Scenario, outcome: str, reason: str = "") -> None:
        totals[outcome] += 1
        if outcome in ("passed", "failed"):
            totals["ran"] += 1
        for rule in dict.fromkeys((*s.rules, *s.evidence)):
            c = counts.setdefault(rule, {"ran": 0, "passed": 0, "failed": 0, "skipped": 0})
            c[outcome] += 1
            if outcome in ("passed", "failed"):
                c["ran"] += 1
            if reason and not c.get("reason"):
                c["reason"] = f"{s.name}: {reason}"

    started_count = 0
    seen: dict[tuple, str] = {}
    for s in focused_first(battery.scenarios, focus):
        stop_if_asked()
        configs, why = adapted(engine, s)
        if configs is None:
            tally(s, "skipped", why)
            continue
        key = (configs, s.policy, s.actions)
        if key in seen:  # an engine's fixed endpoints make distinct scenarios one
            tally(s, "skipped", f"the same steps on this engine's endpoints as {seen[key]!r}")
            continue
        seen[key] = s.name
        if limit is not None and started_count >= limit:
            tally(s, "skipped", "over the check's example budget (raise --max-examples)")
            continue
        started_count += 1
        try:
            why = run_scenario(engine, client, s, recorder, timeout, focus, configs)
        except ConformanceFailure:
            tally(s, "failed")
            failed_name = s.name
            break
        except Diverged:
            tally(s, "failed")
            continue
        except Refused:
            tally(s, "skipped", "the client raised on this configuration")
            continue
        except BeyondModel as e:
            tally(s, "skipped", str(e))
            continue
        tally(s, "skipped", why) if why else tally(s, "passed")
    order = [r.id for r in RULES]
    tallies = tuple(
        RuleTally(rule, c["ran"], c["passed"], c["failed"], c["skipped"], c.get("reason", ""))
        for rule, c in sorted(counts.items(), key=lambda kv: _index(order, kv[0]))
    )
    return BatteryRun(
        tallies, **totals, seconds=time.monotonic() - started, failed_scenario=failed_name
    )


def focused_first(scenarios: Iterable[Scenario], focus: str | None) -> list[Scenario]:
    """``scenarios`` in battery order, those for ``focus`` (in their ``rules``) first: a
    focused check is after that rule, so its own scenarios (a mutant's shortest kill among
    them) run before the others."""
    ordered = list(scenarios)
    return ordered if focus is None else sorted(ordered, key=lambda s: focus not in s.rules)


def _index(order: list[str], rule: str) -> int:
    return order.index(rule) if rule in order else len(order)


__all__ = [
    "BATTERY_BOUNDS",
    "LONG_SERVES",
    "LONG_UPDATES",
    "Battery",
    "BatteryRun",
    "RuleTally",
    "Scenario",
    "adapted",
    "battery_path",
    "cache_dir",
    "case_scenarios",
    "focused_first",
    "generate",
    "load",
    "run_battery",
    "run_scenario",
]
