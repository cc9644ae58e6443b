"""Shared fixtures: adapters by registry name, and a results folder per test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
