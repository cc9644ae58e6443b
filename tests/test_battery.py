"""The battery: scenarios derived from the model, run by every check before its search.

Engines whose fault waits past the random search's reach (the 8th update, the 17th serve,
a prefix loaded back from storage) FAIL at the ci profile because of it; without it (the
search alone, as before the battery) the same engines pass (the slow tier shows that).
"""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import attrs
import pytest

from kvfence.adapters import registry
from kvfence.adapters.mutants import MUTANTS
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.conformance import battery
from kvfence.conformance.matrix import BEYOND_FIRST_KILL
from kvfence.conformance.record import Recorder
from kvfence.conformance.report import result_from_json, result_json, summary_line
from kvfence.conformance.runner import run_check
from kvfence.conformance.verdict import Verdict
from kvfence.model import SPEC_VERSION
from kvfence.model.actions import ServeRequest, StartRequest, SyncWeights
from kvfence.model.capabilities import Capability
from kvfence.model.properties import SOMETIMES
from kvfence.model.state import Config, Policy


class StaleOnEighthUpdate(ReferenceEndpoint):
    """The 8th update of an endpoint keeps the KV its flush should drop (a counter that
    wraps, a table of 7 slots): every earlier update is correct."""

    def update_weights(self, version, funnel, flush_cache):
        self.__dict__["updates"] = self.__dict__.get("updates", 0) + 1
        kept = dict(self.cache)
        reply = super().update_weights(version, funnel, flush_cache)
        if self.__dict__["updates"] == 8:
            self.cache.update(kept)
        return reply


class StaleAfterSixteenServes(ReferenceEndpoint):
    """After 16 requests served, a flush clears nothing (a tree the flush walks only to a
    fixed size): every flush before that is correct."""

    def generate(self, prefix, lora=False, namespace=None):
        self.__dict__["served"] = self.__dict__.get("served", 0) + 1
        return super().generate(prefix, lora, namespace)

    def _clear_cache(self) -> None:
        if self.__dict__.get("served", 0) < 16:
            super()._clear_cache()


LATE = {
    "stale-on-8th-update": StaleOnEighthUpdate,
    "stale-after-16-serves": StaleAfterSixteenServes,
}


def _late(name: str) -> InProcessAdapter:
    return InProcessAdapter(LATE[name], name)


@pytest.fixture(scope="module")
def the_battery() -> battery.Battery:
    return battery.load()


@pytest.mark.parametrize("name", sorted(LATE))
def test_late_faults_fail_at_ci_by_the_battery(name, tmp_path):
    r = run_check(_late(name), registry.client("reference"), "ci", out_dir=tmp_path)
    assert r.verdict is Verdict.FAIL, r.rules
    assert {"INV-001", "ENG-001", "ENG-003"} & set(r.caught())
    assert r.battery is not None and r.battery.failed == 1
    assert r.battery.failed_scenario.startswith("long"), r.battery.failed_scenario
    assert r.counterexample is not None


@pytest.mark.parametrize("name", sorted(LATE))
def test_late_faults_pass_the_search_alone(name, tmp_path):
    """What the battery adds: the same ci check without it passes these engines (the
    search's examples are 15 steps over two prompts: too short for either fault)."""
    r = run_check(_late(name), registry.client("reference"), "ci", out_dir=tmp_path, battery=False)
    assert r.verdict is not Verdict.FAIL, r.caught()
    assert r.battery is None


def test_storage_load_back_fails_at_ci_by_the_battery(tmp_path):
    engine = registry.engine("storage-loads-back-stale")
    r = run_check(engine, registry.client("reference"), "ci", out_dir=tmp_path)
    assert r.verdict is Verdict.FAIL
    assert "INV-001" in r.caught()
    assert r.battery is not None and r.battery.failed == 1
    assert r.examples <= len(battery.load().scenarios)


def test_the_battery_holds_every_kill_and_witness(the_battery):
    names = " ; ".join(s.name for s in the_battery.scenarios)
    reached = {m.name for m in MUTANTS if f"kill {m.name}" in names}
    missing = {m.name for m in MUTANTS} - reached - set(BEYOND_FIRST_KILL)
    assert not missing, f"mutants without their kill in the battery: {sorted(missing)}"
    witnessed = {r for s in the_battery.scenarios for r in s.rules if r.startswith("REACH")}
    assert witnessed == {str(p.rule) for p in SOMETIMES}


def test_long_scenarios_reach_past_the_search(the_battery):
    long = {s.name: s for s in the_battery.scenarios if s.name.startswith("long")}
    updates = long["long updates"].actions
    assert sum(isinstance(a, SyncWeights) for a in updates) == battery.LONG_UPDATES
    serves = long["long serves"].actions
    assert sum(isinstance(a, ServeRequest) for a in serves) >= battery.LONG_SERVES
    three = long["long three prompts and requests"].actions
    assert {a.rid for a in three if isinstance(a, StartRequest)} == {"r1", "r2", "r3"}
    assert len(long["long three endpoints"].configs) == 3


def test_the_reference_passes_every_scenario(the_battery):
    engine, client = registry.engine("reference"), registry.client("reference")
    run = battery.run_battery(engine, client, the_battery, Recorder(), 60.0)
    assert run.failed == 0, run.failed_scenario
    assert run.ran > 0.9 * len(the_battery.scenarios)
    assert run.ran + run.skipped == len(the_battery.scenarios)


def test_a_scenario_needing_a_missing_capability_is_skipped_with_the_reason(the_battery):
    engine = registry.engine("reference")
    engine.capabilities = engine.capabilities - {Capability.TIERS}
    run = battery.run_battery(engine, registry.client("reference"), the_battery, Recorder(), 60)
    eng008 = next(t for t in run.tallies if t.rule == "ENG-008")
    assert eng008.skipped >= 1 and "needs tiers" in eng008.reason
    assert run.failed == 0


def test_every_config_feature_and_deployment_shape_needs_its_capability():
    """A scenario on a deployment the engine does not declare is skipped, never run on the
    reference deployment's endpoints standing in for the engine's (which would credit the
    engine with their evidence): every config feature and deployment capability is in
    ``battery._FEATURES``, and a store scenario on the plain reference is skipped."""
    from kvfence.model.capabilities import CONFIG_FEATURES, DEPLOYMENT_CAPABILITIES

    named = {c for c, _ in battery._FEATURES}
    assert set(CONFIG_FEATURES) | set(DEPLOYMENT_CAPABILITIES) <= named
    store = battery.Scenario("store", ("STO-001",), (Config(store=True),), Policy(), ())
    configs, why = battery.adapted(registry.engine("reference"), store)
    assert configs is None and why == "needs store"
    assert battery.adapted(registry.engine("keys-store-by-weights"), store)[0] is not None


def test_a_scenario_whose_configs_refuse_the_engine_profile_is_skipped_with_the_reason():
    """A store scenario on a design whose profile sets a flag the store does not model
    (encoder-left-to-client's ``encoder_reset_separate``) is skipped, never an ERROR: the
    lockstep applies the profile to every config and a store endpoint refuses the flag."""
    engine = registry.engine("design:encoder-left-to-client")
    assert (engine.profile or {}).get("encoder_reset_separate")
    engine.capabilities = engine.capabilities | {Capability.STORE}  # past the store gate
    store = battery.Scenario(
        name="store scenario",
        rules=("STO-001",),
        configs=(Config(store=True),),
        policy=Policy(),
        actions=(ServeRequest(0, "P"),),
    )
    configs, why = battery.adapted(engine, store)
    assert configs is None and "store" in why and "encoder_reset_separate" in why
    plain = attrs.evolve(store, configs=(Config(),))
    assert battery.adapted(engine, plain) == ((Config(),), "")


def test_over_the_budget_is_skipped_and_said(the_battery):
    engine = registry.engine("reference")
    run = battery.run_battery(
        engine, registry.client("reference"), the_battery, Recorder(), 60, limit=3
    )
    assert run.ran == 3
    assert any("budget" in t.reason for t in run.tallies)


def test_the_cache_is_keyed_by_spec_version_and_fingerprint(tmp_path, monkeypatch):
    monkeypatch.setenv("KVFENCE_CACHE_DIR", str(tmp_path))
    path = battery.battery_path("f" * 64)
    assert path.parent == tmp_path and SPEC_VERSION in path.name and "ffff" in path.name
    scenario = battery.Scenario("s", ("INV-001",), (), Policy(), (SyncWeights(1),))
    b = battery.Battery((scenario,), SPEC_VERSION, "f" * 64, 1.5)
    battery.write(b, path)
    assert battery.read(path, "f" * 64) == b
    assert battery.read(path, "e" * 64) is None  # another tree's battery
    data = json.loads(path.read_text())
    data["spec_version"] = "0.0"
    path.write_text(json.dumps(data))
    assert battery.read(path, "f" * 64) is None  # another spec's
    assert battery.read(tmp_path / "absent.json", "f" * 64) is None


def test_every_verdict_states_its_bounds(tmp_path):
    r = run_check(
        _late("stale-on-8th-update"), registry.client("reference"), "ci", out_dir=tmp_path
    )
    assert r.bounds is not None and r.bounds.updates >= 8 and r.bounds.endpoints >= 2
    assert "bounds covered: " in summary_line(r) and "battery " in summary_line(r)
    data = result_json(r)
    assert data["bounds"]["updates"] == r.bounds.updates
    assert data["battery"]["failed"] == 1
    back = result_from_json(json.loads(json.dumps(data)))
    assert back.bounds == r.bounds
    assert attrs.evolve(back.battery, seconds=0) == attrs.evolve(
        r.battery, seconds=round(r.battery.seconds, 3) * 0
    )


def _load_counting(made: Path) -> None:
    """A forked process's ``battery.load`` on a cold cache, whose generation (a stand-in
    that takes a second) leaves a line in ``made``."""
    from kvfence.conformance.fingerprint import source_fingerprint

    fingerprint = source_fingerprint()

    def slow(workers: int = 1) -> battery.Battery:
        with made.open("a") as f:
            f.write("generated\n")
        time.sleep(1.0)
        scenario = battery.Scenario("s", ("INV-001",), (), Policy(), (SyncWeights(1),))
        return battery.Battery((scenario,), SPEC_VERSION, fingerprint, 1.0)

    battery.generate = slow
    assert battery.load().fingerprint == fingerprint


def test_processes_on_a_cold_cache_generate_the_battery_once(tmp_path, monkeypatch):
    """Two processes that start together on a cold cache (two pytest-xdist workers, two
    checks) generate it once: the second waits for the first's file and reads it."""
    monkeypatch.setenv("KVFENCE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(battery, "_LOADED", [])
    made = tmp_path / "made.txt"
    fork = multiprocessing.get_context("fork")
    procs = [fork.Process(target=_load_counting, args=(made,)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert made.read_text().splitlines() == ["generated"]


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("KVFENCE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert battery.cache_dir() == tmp_path / "kvfence"
    monkeypatch.setenv("KVFENCE_CACHE_DIR", str(tmp_path / "x"))
    assert battery.cache_dir() == Path(tmp_path / "x")


def _battery_evidence(engine_name: str, client_name: str, scenarios) -> set[str]:
    """The rules a system gets evidence for with the random search off: its client table
    (a client program's, or a resolver's), then every battery scenario, as ``run_check``
    runs them before its search; no example is drawn."""
    from kvfence.conformance.client_table import client_table
    from kvfence.conformance.program import is_program
    from kvfence.conformance.program_table import program_table

    engine, client = registry.engine(engine_name), registry.client(client_name)
    recorder = Recorder()
    try:
        table = program_table if is_program(client) else client_table
        table(client, recorder, 60.0)
        run = battery.run_battery(engine, client, scenarios, recorder, 60.0)
    finally:
        engine.close()
    assert run.failed == 0, run.failed_scenario
    return {r for r, n in recorder.exercised.items() if n} | recorder.reached


def _design_systems():
    from kvfence.adapters.designs import DESIGNS

    return {
        d.name: ((d.name, "reference") if d.side == "engine" else ("reference", d.name), d)
        for d in DESIGNS
    }


@pytest.mark.parametrize("name", sorted(_design_systems()))
def test_every_design_keeps_its_evidence_with_the_search_off(name, the_battery):
    """Every correct design's Keeps rules (the rules whose safety it keeps by other means
    than the reference) have evidence from the battery and client table alone, so its PASS
    on them does not depend on what the random search draws or how it is steered. Without
    the evidence witnesses, ``keeps-current-storage`` had none for ENG-010 (a restart
    reopening its storage tier), shown only when the search happened to draw a restart."""
    (engine, client), design = _design_systems()[name]
    got = _battery_evidence(engine, client, the_battery)
    assert set(design.keeps) <= got, sorted(set(design.keeps) - got)
    witnesses = attrs.evolve(
        the_battery,
        scenarios=tuple(s for s in the_battery.scenarios if not s.name.startswith("evidence")),
    )
    if name == "keeps-current-storage":  # what the evidence witnesses add
        assert "ENG-010" not in _battery_evidence(engine, client, witnesses)


def test_each_evidence_witness_gives_the_reference_its_rules(the_battery):
    """An evidence witness is for the rules whose first evidence it is on its setup, and
    the reference system gave each of them evidence when the battery was generated."""
    found = [s for s in the_battery.scenarios if "evidence " in s.name]
    assert found
    for s in found:  # a scenario merged with a kill is also for the mutant's rule
        for part in s.name.split("; "):
            if part.startswith("evidence "):
                rules = set(part.removeprefix("evidence ").split(" on ")[0].split(", "))
                assert rules <= set(s.rules) and rules <= set(s.evidence), (s.name, s.evidence)
    names = {n.split(" on ")[-1] for s in found for n in s.name.split("; ") if "evidence" in n}
    assert {"plain/1", "plain/2", "two-phase", "ranks", "store", "pd", "router"} <= names
    win = [s for s in found if "WIN-002" in s.rules]
    assert win and all(len(s.actions) >= 4 for s in win)  # open, a chunk, a serve, the finish
