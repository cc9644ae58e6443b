"""pytest plugin: run kvfence's conformance machine inside a user's test suite.

Installed with kvfence (entry point ``pytest11``). Use the ``kvfence_check`` fixture::

    def test_my_resolver(kvfence_check):
        result = kvfence_check(engine="reference", client="my_pkg.sync:resolve")
        assert result.verdict == "PASS", result.violations

or the command-line options ``--kvfence-engine``/``--kvfence-client``, which add one test,
``kvfence::<engine>::<client>``, that fails with the violated rules and the counterexample
path. Outputs land in pytest's ``tmp_path`` unless ``out_dir`` is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvfence.adapters import registry
from kvfence.adapters.protocol import ClientAdapter, EngineAdapter

from .runner import Result, run_check
from .verdict import Verdict


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvfence", "kvfence conformance")
    group.addoption("--kvfence-engine", help="engine adapter name to check")
    group.addoption("--kvfence-client", default="reference", help="client adapter name")
    group.addoption("--kvfence-profile", default="ci", help="ci, dev or fuzz")


@pytest.fixture
def kvfence_check(tmp_path: Path):
    """``kvfence_check(engine=..., client=..., **run_check kwargs) -> Result``; engine and
    client are registry names (or ``module:function`` for a client) or adapter objects."""

    def check(
        engine: str | EngineAdapter = "reference",
        client: str | ClientAdapter = "reference",
        **kwargs: Any,
    ) -> Result:
        eng = registry.engine(engine) if isinstance(engine, str) else engine
        cli = registry.client(client) if isinstance(client, str) else client
        kwargs.setdefault("out_dir", tmp_path)
        return run_check(eng, cli, **kwargs)

    return check


class KvfenceItem(pytest.Item):
    """One conformance check as a test item."""

    def __init__(self, *, engine: str, client: str, profile: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.engine, self.client, self.profile = engine, client, profile

    def runtest(self) -> None:
        out = Path(self.config.rootpath) / "kvfence-results"
        result = run_check(
            registry.engine(self.engine),
            registry.client(self.client),
            profile=self.profile,
            out_dir=out,
        )
        if result.verdict not in (Verdict.PASS, Verdict.WARN):
            lines = [f"verdict {result.verdict}"]
            lines += [str(v) for v in result.violations]
            if result.error:
                lines.append(result.error)
            lines += [f"{rv.rule.id} {rv.verdict}: {rv.reason}" for rv in result.rules]
            if result.counterexample:
                lines.append(f"counterexample: {result.counterexample}")
            raise AssertionError("\n".join(lines))

    def reportinfo(self):
        return self.path, None, f"kvfence::{self.engine}::{self.client}"


class KvfenceCollector(pytest.Collector):
    def __init__(self, *, engine: str, client: str, profile: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.engine, self.client, self.profile = engine, client, profile

    def collect(self):
        yield KvfenceItem.from_parent(
            self,
            name=f"{self.engine}::{self.client}",
            engine=self.engine,
            client=self.client,
            profile=self.profile,
        )


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    engine = config.getoption("--kvfence-engine")
    if not engine:
        return
    collector = KvfenceCollector.from_parent(
        session,
        name="kvfence",
        engine=engine,
        client=config.getoption("--kvfence-client"),
        profile=config.getoption("--kvfence-profile"),
    )
    items.extend(collector.collect())
