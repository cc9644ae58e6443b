"""The suite's worker groups hold: under ``-n 2 --dist loadgroup`` a module-scoped fixture
is built once, on one worker, as tests/conftest.py promises (the matrices and the real
engines are built once per session only because of it). A pytest that ignores the groups
pytest-xdist sets (pytest 9 with xdist 3.8 did) builds it on every worker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist")

CONFTEST = Path(__file__).with_name("conftest.py")

MODULE = """
import os
import time

import pytest


@pytest.fixture(scope="module")
def built():
    with open(os.environ["BUILDS"], "a") as f:
        f.write(f"{os.getpid()}\\n")


@pytest.mark.parametrize("i", range(12))
def test_uses_the_fixture(i, built):
    time.sleep(0.05)
"""

OTHER = """
import time

import pytest


@pytest.mark.parametrize("i", range(24))
def test_elsewhere(i):
    time.sleep(0.05)
"""


def test_a_module_scoped_fixture_is_built_on_one_worker(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(CONFTEST, tests / "conftest.py")
    (tests / "test_grouped.py").write_text(MODULE)
    (tests / "test_other.py").write_text(OTHER)
    builds = tmp_path / "builds.txt"
    argv = ["-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", str(tests)]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *argv],
        cwd=tmp_path,
        env={**os.environ, "BUILDS": str(builds)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "36 passed" in run.stdout, run.stdout[-2000:]
    pids = builds.read_text().split()
    assert len(pids) == 1, f"the module fixture was built on {len(pids)} workers: {pids}"
