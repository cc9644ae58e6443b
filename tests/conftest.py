"""Shared fixtures: adapters by registry name, and a results folder per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvfence.adapters import registry


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
