"""Shared fixtures (adapters by registry name, a results folder per test), the test tiers
and what keeps tests apart under pytest-xdist.

Tiers: ``pytest -m "not slow"`` is the fast tier (the model, every rule's unit tests, the
CLI); ``slow`` marks the pass and kill matrices, the real engines (vLLM, SGLang, the peer
client) and whole checks at the full budget. A module is slow when it is named in
``SLOW_MODULES``, a test when its module and name are in ``SLOW_TESTS``; a name there that
no longer exists in a collected module, or a case (``name[id]``) its collected test no
longer has, is a usage error, so the lists cannot go stale.

Workers: ``pytest`` runs on every core (``-n auto --dist loadgroup``, pyproject.toml).
The tests of a module that defines a module-scoped fixture share one worker (its
``xdist_group``), so a costly fixture (the matrices, a real engine) is built once per
session; the real-engine tests share one group per engine (vLLM's, SGLang's, the peer
clients'), so no two servers of one engine start at once, and a session-scoped server is
started once, while the two engines may run beside each other on two workers.
A worker's native thread pools (OpenMP: torch in vLLM's engine and server, SGLang's
scheduler hosts, each engine process a test starts) get its share of the cores
(``worker_threads``): at torch's default of one thread per core, two workers' engines ran
four threads on two cores, and an engine's loop took four times as long beside a busy
worker, on twice the CPU (a vLLM reload-and-generate loop: 2.2 s alone, 9.4 s beside a
busy core, 2.6 s there with one thread).
Each test runs in its own ``tmp_path`` as the working directory, so a command's default
``kvfence-results/`` or a ``.hypothesis/`` folder never lands in a folder two workers
share; the real-engine tests keep the repository root, where ``.sglang/`` and
``.venv-peer/`` are found.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kvfence.adapters import registry


def worker_threads(environ: dict[str, str], cores: int | None) -> str | None:
    """``OMP_NUM_THREADS`` for a pytest-xdist worker: its share of the ``cores`` (at least
    one) when it is one of several workers (``PYTEST_XDIST_WORKER_COUNT``) and the variable
    is not set already; else ``None`` (one process keeps the library's default)."""
    workers = int(environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if workers < 2 or "OMP_NUM_THREADS" in environ:
        return None
    return str(max(1, (cores or 1) // workers))


# Before any engine library is imported in this worker, and inherited by the processes its
# tests start (servers, scheduler hosts, kvfence commands).
_threads = worker_threads(dict(os.environ), os.cpu_count())
if _threads is not None:
    os.environ["OMP_NUM_THREADS"] = _threads

REAL_ENGINES = ("vllm", "sglang", "peer")
"""Markers of tests that drive a real engine or a real client's process."""

ENGINE_FOLDERS = ("vllm", "sglang")
"""Folders of tests/ whose every test drives a real engine (``_slow_reason``)."""

SLOW_MODULES = {
    "test_mutants.py": "the kill matrix: every mutant killed by its rule, two searches each",
    "test_designs.py": "the pass and kill matrices at ci and the product explorer per design",
    "test_designs_budget.py": "a whole check per design at ten times the ci budget",
    "test_bench.py": "runs scripts/bench.py, a minute of search",
    "test_peer.py": "a real RL framework's client against kvfence serve",
    "test_explore_parallel.py": "forks explorer workers, serial and parallel searches",
    "test_documented_commands.py": "runs every command the README and docs show",
}
"""Modules of the slow tier, with the reason."""

SLOW_TESTS: dict[str, set[str]] = {
    "test_adapter_answers.py": {"test_null_radix_flag_is_unknown_not_off"},
    "test_capabilities.py": {
        "test_bytes_without_the_capability_are_no_evidence",
        "test_require_met_runs_as_usual",
    },
    "test_cli.py": {
        "test_check_reference_passes_and_writes_reports",
        "test_pytest_plugin_fixture_and_options",
        "test_a_narrow_terminal_still_shows_the_verdict_column",
    },
    "test_explore.py": {
        "test_model_state_counts_are_pinned[cli-bounds-depth4]",
        "test_model_state_counts_are_pinned[one-endpoint-depth12]",
        "test_explorer_finds_a_shortest_counterexample",
        "test_main_explore_against_a_mutant",
    },
    "test_fail_closed_checker.py": {
        "test_client_raising_on_one_configuration_is_judged_on_the_others",
        "test_malformed_server_info_counts_as_unknown",
        "test_client_table_catches_what_the_engine_cannot_show",
        "test_dead_server_info_with_a_client_that_guesses_off_fails",
        "test_blind_adapter_skips_rules_it_cannot_see",
    },
    "test_check_search.py": {"test_rules_broken_in_set_aside_examples_fail"},
    "test_exit_paths.py": {
        "test_sigterm_mid_mutants_writes_the_runs_done_and_exits_2",
        "test_sigterm_mid_check_writes_what_it_recorded_and_exits_2",
        "test_sigterm_stops_a_check_whose_engine_swallows_the_interrupt",
    },
    "test_fuzz_database.py": {
        "test_a_failure_found_by_one_fuzz_process_is_replayed_first_by_another",
        "test_a_shared_folder_works_the_same",
    },
    "test_xdist_groups.py": {"test_a_module_scoped_fixture_is_built_on_one_worker"},
    "test_reports.py": {
        "test_the_fixture_warns_on_must_skips_and_strict_skips_fails",
        "test_a_failing_engine_item_is_short_and_has_a_file_part",
    },
    "test_battery.py": {"test_late_faults_pass_the_search_alone"},
    "test_programs.py": {
        "test_program_mutant_killed_by_its_rule_in_the_kill_matrix",
        "test_check_client_program_passes_a_correct_sync",
    },
    "test_runner.py": {
        "test_a_ci_check_draws_the_same_examples_whatever_modules_are_loaded",
        "test_without_the_guard_the_draw_depends_on_the_modules_loaded",
    },
    "test_twophase.py": {
        "test_relabel_without_loading_passes_a_whole_check_without_the_restart_oracle"
    },
    "test_verdicts.py": {"test_reference_passes_with_exact_cache_too"},
    "test_symmetry.py": {
        "test_the_semantics_are_equivariant_under_renaming",
        "test_the_semantics_ignore_the_funnel",
        "test_reduced_counts_are_pinned[unreduced]",
    },
    "test_ranks.py": {
        "test_the_reference_ranks_engine_passes_at_ci",
        "test_the_ranks_model_state_count_is_pinned[depth6]",
    },
    "test_pd.py": {
        "test_the_reference_pd_engine_passes_at_ci_with_evidence_for_both_rules",
        "test_the_pd_semantics_are_equivariant_under_renaming",
    },
    "test_store.py": {"test_the_store_semantics_are_equivariant_under_renaming"},
    "test_serve_deployments.py": {
        "test_a_dp_flush_answers_after_every_rank[merges-every-flush-reply-400-PASS]",
        "test_an_update_that_fails_on_one_rank_is_reported_failed[closes-on-any-rank-failure-PASS]",
        "test_an_update_that_fails_on_one_rank_is_reported_failed[rolls-back-moved-ranks-PASS]",
        "test_a_rolling_update_of_a_pd_pair[holds-admission-across-versions-statuses1-PASS]",
        "test_a_rolling_update_of_a_pd_pair[drains-transfers-before-update-statuses2-PASS]",
        "test_the_printed_replay_line_fails_as_the_deployment_did",
    },
    "test_router.py": {
        "test_the_reference_router_passes_at_ci_with_evidence_for_rtr_001",
        "test_the_router_semantics_are_equivariant_under_renaming",
    },
    "test_deployments.py": {"test_deployment_design_explores_clean"},
    "test_tiers.py": {"test_the_real_engine_folders_are_slow_and_one_group_per_engine"},
}
"""Slow tests of otherwise fast modules (module file name -> test function names, or one
parametrized case as ``name[id]``): whole checks at the full ci budget that PASS or find
nothing (600 examples: tens of seconds each), a long focused search, the kill matrix of
the client programs, the product explorer per mutant and per deployment design, the stop
of a whole one-worker ``kvfence mutants``, the deepest model counts (the single
schedulers' two deepest, the ranks deployment's at depth 6 and the unreduced count of two
endpoints; the shallower pins and the reduced count stay fast), the checks of the
symmetry reduction over the states reachable in two or three steps (the single
schedulers', about a minute each on a core, the store's and P/D's; the orbit tests stay
fast), the tests that start whole kvfence or pytest processes to signal them or share
between them (SIGTERM mid-check, two fuzz processes on one example database, pytest on two
workers, pytest runs of the kvfence plugin; the fail-closed exits of a check stay fast),
the collection of the real-engine folders (it imports the engines), and the served
deployments' correct designs beyond the reference and their replay lines (a serve
subprocess of a few seconds each; the reference and the mutants of each deployment stay
fast)."""


def _slow_reason(item: pytest.Item) -> str | None:
    path = Path(str(item.fspath))
    if path.parent.name in ENGINE_FOLDERS or any(item.get_closest_marker(m) for m in REAL_ENGINES):
        return "a real engine"
    if path.name in SLOW_MODULES:
        return SLOW_MODULES[path.name]
    slow = SLOW_TESTS.get(path.name, ())
    if getattr(item, "originalname", item.name) in slow or item.name in slow:
        return "a whole check at the full budget, or a matrix"
    return None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast tier (``-m "not slow"``, exactly) does not import the real-engine folders:
    every test there is slow, and importing vLLM to deselect its tests took about ten
    seconds of each worker's start. Any other selection collects them as usual."""
    fast_tier = " ".join(config.getoption("markexpr").split()) == "not slow"
    engine_folder = collection_path.parent == Path(__file__).parent and (
        collection_path.name in ENGINE_FOLDERS
    )
    return True if fast_tier and engine_folder else None  # None: pytest decides as usual


def _engine_family(item: pytest.Item) -> str:
    """The real engine a test drives: ``vllm``, ``sglang`` (by its folder or marker) or
    ``peer`` (a real client's process against ``kvfence serve``)."""
    folder = Path(str(item.fspath)).parent.name
    if folder in ENGINE_FOLDERS:
        return folder
    return next((m for m in REAL_ENGINES if item.get_closest_marker(m)), "peer")


def _module_scoped(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    module = Path(str(item.fspath))
    for defs in info.name2fixturedefs.values():
        for d in defs:
            if d.scope == "module" and Path(d.baseid.split("::")[0]).name == module.name:
                return True
    return False


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker and xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        module = getattr(item, "module", None)
        named = {n.split("[")[0] for n in SLOW_TESTS.get(path.name, ())}
        missing = named - set(vars(module) if module else ())
        if missing:
            raise pytest.UsageError(
                f"tests/conftest.py SLOW_TESTS names {sorted(missing)} in {path.name}, "
                "which has no such test"
            )
        if _slow_reason(item):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("xdist_group"):
            continue
        if _slow_reason(item) == "a real engine":
            item.add_marker(pytest.mark.xdist_group(f"real-engines-{_engine_family(item)}"))
        elif _module_scoped(item):
            item.add_marker(pytest.mark.xdist_group(path.name))
    if not any("::" in str(arg) for arg in config.args):  # a node ID narrows parameters
        _check_slow_cases(items)


def _check_slow_cases(items: list[pytest.Item]) -> None:
    """A ``name[id]`` of ``SLOW_TESTS`` whose test was collected must name one of its
    collected cases: a renamed parameter would otherwise move a whole check to the fast
    tier unnoticed. ``UsageError`` naming the entry."""
    names = {(Path(str(i.fspath)).name, i.name) for i in items}
    tests = {(module, name.split("[")[0]) for module, name in names}
    for module, entries in SLOW_TESTS.items():
        for entry in entries:
            test = entry.split("[")[0]
            if "[" in entry and (module, test) in tests and (module, entry) not in names:
                raise pytest.UsageError(
                    f"tests/conftest.py SLOW_TESTS names {entry} in {module}, which has no "
                    "such case"
                )


@pytest.fixture(autouse=True)
def _own_working_directory(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Each test in its own ``tmp_path`` as the current directory (real engines excepted);
    ``.sglang/``, which the SGLang lane finds in the current directory, is still the one
    where pytest started."""
    if _slow_reason(request.node) != "a real engine":
        if "KVFENCE_SGLANG_HOME" not in os.environ:
            monkeypatch.setenv("KVFENCE_SGLANG_HOME", str(Path.cwd() / ".sglang"))
        monkeypatch.chdir(request.getfixturevalue("tmp_path"))
    yield


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture
def engine():
    """``engine(name)``: a fresh engine adapter; closed after the test."""
    made = []

    def build(name: str = "reference"):
        made.append(registry.engine(name))
        return made[-1]

    yield build
    for e in made:
        e.close()


class Shared:
    """An engine adapter whose ``close`` waits for the end of the fixture that made it:
    ``run_check`` closes its engine when it ends, and a real engine (vLLM, an SGLang host)
    takes seconds to start, so the runs of one module share one (its ``start`` resets it
    between examples). The fixture that built the adapter closes ``inner`` itself."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def start(self, configs):
        return self.inner.start(configs)

    def apply(self, action):
        return self.inner.apply(action)

    def server_info(self, endpoint: int):
        return self.inner.server_info(endpoint)

    def close(self) -> None:
        """Kept open for the module's next run."""


@pytest.fixture(scope="session")
def shared() -> type[Shared]:
    """``shared(adapter)``: wrap a module-scoped real engine (tests/vllm, tests/sglang)."""
    return Shared


def after(state, *acts):
    """``state`` after ``acts`` under the model's semantics, each enabled and taking its
    first branch."""
    from kvfence.model.semantics import step

    for a in acts:
        branches = step(state, a)
        assert branches, f"{a} is not enabled"
        state = branches[0][0]
    return state
