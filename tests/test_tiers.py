"""The test tiers and the xdist groups of ``tests/conftest.py``: the fast tier
(``-m "not slow"``) holds the model, the rule registry and the CLI; the matrices and the
real engines are slow; a module with a module-scoped fixture, and every real-engine test,
keeps to one xdist group, so a costly fixture is built once a session."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]

REPORT = """
import json


def pytest_collection_finish(session):
    rows = []
    for item in session.items:
        group = item.get_closest_marker("xdist_group")
        rows.append({
            "id": item.nodeid,
            "slow": item.get_closest_marker("slow") is not None,
            "group": (group.kwargs.get("name") or group.args[0]) if group else None,
            "fixtures": list(item.fixturenames),
        })
    with open(session.config.getoption("--tiers-out") or "tiers.json", "w") as f:
        json.dump(rows, f)


def pytest_addoption(parser):
    parser.addoption("--tiers-out")
"""

FILES = [
    "tests/test_model.py",
    "tests/test_rule_registry.py",
    "tests/test_cli.py",
    "tests/test_mutants.py",
    "tests/test_designs.py",
    "tests/test_peer.py",
]
"""Modules whose marks and groups the fast tests below read (no real-engine folder: those
import the engines, about ten seconds, and are read by the slow test further down)."""


def _collect(where: Path, files: list[str]) -> list[dict]:
    """How ``tests/conftest.py`` marks and groups the items of ``files`` (one process)."""
    (where / "tiers_report.py").write_text(REPORT)
    out = where / "tiers.json"
    path = os.pathsep.join(p for p in (str(where), os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0"]
    cmd += ["-p", "tiers_report", "--tiers-out", str(out), *files]
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> list[dict]:
    """The items of ``FILES``, marked and grouped (``_collect``)."""
    return _collect(tmp_path_factory.mktemp("tiers"), FILES)


def _conftest():
    """tests/conftest.py, by path: under xdist, a bare ``import conftest`` can find another
    folder's conftest."""
    spec = importlib.util.spec_from_file_location("tests_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _of(rows: list[dict], prefix: str) -> list[dict]:
    found = [r for r in rows if r["id"].startswith(prefix)]
    return found


def test_the_fast_tier_holds_the_model_the_rules_and_the_cli(collected):
    SLOW_TESTS = _conftest().SLOW_TESTS

    for prefix in ("tests/test_model.py", "tests/test_rule_registry.py", "tests/test_cli.py"):
        rows = _of(collected, prefix)
        named = SLOW_TESTS.get(prefix.split("/")[-1], set())
        slow = {r["id"].split("::")[1].split("[")[0] for r in rows if r["slow"]}
        assert slow <= named, prefix  # only the whole checks SLOW_TESTS names
        assert len([r for r in rows if not r["slow"]]) > len(slow), prefix


def test_a_slow_case_that_no_longer_exists_is_a_usage_error():
    """``SLOW_TESTS`` names a parametrized case of a collected test that has no such case
    (a renamed parameter): collection stops naming it, rather than the case moving to the
    fast tier; a test not collected at all (another selection) is not judged."""
    conftest = _conftest()
    conftest.SLOW_TESTS = {"test_x.py": {"test_pin[deep]", "test_other[deep]"}}
    path = "tests/test_x.py"
    renamed = [SimpleNamespace(fspath=path, name=f"test_pin[{i}]") for i in ("shallow", "deeper")]
    with pytest.raises(pytest.UsageError, match=r"test_pin\[deep\] in test_x.py"):
        conftest._check_slow_cases(renamed)
    conftest._check_slow_cases([*renamed, SimpleNamespace(fspath=path, name="test_pin[deep]")])
    conftest._check_slow_cases([SimpleNamespace(fspath="tests/test_y.py", name="test_pin[a]")])


def test_the_matrices_and_the_real_engines_are_slow(collected):
    for prefix in ("tests/test_mutants.py", "tests/test_designs.py", "tests/test_peer.py"):
        rows = _of(collected, prefix)
        assert rows, prefix
        assert all(r["slow"] for r in rows), [r["id"] for r in rows if not r["slow"]]
    peers = _of(collected, "tests/test_peer")
    assert peers and all(r["group"] == "real-engines-peer" for r in peers)


def test_the_real_engine_folders_are_slow_and_one_group_per_engine(tmp_path):
    """Every test of tests/vllm and tests/sglang is slow and keeps to its engine's group,
    so no two servers of one engine start at once."""
    rows = _collect(tmp_path, ["tests/vllm", "tests/sglang"])
    for engine in ("vllm", "sglang"):
        mine = _of(rows, f"tests/{engine}/")
        assert mine  # tests/sglang collects without SGLang installed (its tests then skip)
        assert all(r["slow"] and r["group"] == f"real-engines-{engine}" for r in mine)


class _Options:
    def __init__(self, markexpr: str) -> None:
        self.markexpr = markexpr

    def getoption(self, name: str) -> str:
        assert name == "markexpr"
        return self.markexpr


@pytest.mark.parametrize(
    ("markexpr", "path", "ignored"),
    [
        ("not slow", "tests/vllm", True),
        ("not  slow ", "tests/sglang", True),
        ("not slow", "tests/test_model.py", False),
        ("not slow", "tests/sglang/overlays", False),  # only the folders right under tests/
        ("slow", "tests/vllm", False),
        ("", "tests/vllm", False),
        ("not slow and vllm", "tests/vllm", False),
    ],
)
def test_the_fast_tier_does_not_import_the_real_engine_folders(markexpr, path, ignored):
    """The fast tier skips collecting tests/vllm and tests/sglang, whose every test is slow
    (importing vLLM only to deselect them cost each worker seconds); any other selection
    collects them."""
    hook = _conftest().pytest_ignore_collect
    assert bool(hook(ROOT / path, _Options(markexpr))) is ignored


def test_a_module_scoped_fixture_keeps_its_module_on_one_worker(collected):
    designs = _of(collected, "tests/test_designs.py")
    using = [r for r in designs if "matrices" in r["fixtures"]]  # both matrices: built once
    assert using and {r["group"] for r in using} == {"test_designs.py"}
    explored = _of(collected, "tests/test_designs.py::test_design_passes_under_the_explorer")
    assert explored and {r["group"] for r in explored} == {None}  # a design per test, spread
    cli = [r for r in _of(collected, "tests/test_cli.py") if "should_only_trace" in r["fixtures"]]
    assert cli and {r["group"] for r in cli} == {"test_cli.py"}
    free = [r for r in designs + _of(collected, "tests/test_cli.py") if not r["group"]]
    assert free  # tests that use no module-scoped fixture may run on any worker
    assert {r["group"] for r in _of(collected, "tests/test_model.py")} == {None}


@pytest.mark.parametrize(
    ("environ", "cores", "threads"),
    [
        ({"PYTEST_XDIST_WORKER_COUNT": "2"}, 2, "1"),
        ({"PYTEST_XDIST_WORKER_COUNT": "2"}, 8, "4"),
        ({"PYTEST_XDIST_WORKER_COUNT": "4"}, 2, "1"),
        ({"PYTEST_XDIST_WORKER_COUNT": "2"}, None, "1"),
        ({"PYTEST_XDIST_WORKER_COUNT": "2", "OMP_NUM_THREADS": "3"}, 2, None),
        ({"PYTEST_XDIST_WORKER_COUNT": "1"}, 2, None),
        ({}, 2, None),
    ],
)
def test_a_worker_gets_its_share_of_the_cores(environ, cores, threads):
    """Under several workers, each worker's OpenMP pools get its share of the cores (at
    least one), unless the user set ``OMP_NUM_THREADS``; one process keeps the default."""
    assert _conftest().worker_threads(environ, cores) == threads
