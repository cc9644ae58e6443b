"""pytest plugin: run kvfence's conformance machine inside a user's test suite.

Installed with kvfence (entry point ``pytest11``). Use the ``kvfence_check`` fixture::

    def test_my_resolver(kvfence_check):
        result = kvfence_check(engine="reference", client="my_pkg.sync:resolve")
        assert result.verdict == "PASS", result.violations

or the command-line options ``--kvfence-engine``/``--kvfence-client``, which add one test,
``<inifile>::kvfence::<engine>::<client>`` (the file part is the ini file that holds the
options, else ``kvfence-results``, the folder of the counterexample), that fails with a
short report: the violated rules, the counterexample's steps and the replay command.
Outputs land in pytest's ``tmp_path`` unless ``out_dir`` is given.

A check that passes with MUST rules SKIP (never exercised: the adapter cannot observe
their evidence) emits a ``KvfenceSkipWarning``; ``--kvfence-strict-skips`` makes it fail.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from ..adapters import registry
from ..adapters.protocol import ClientAdapter, EngineAdapter
from .report import replay_hint, skip_warning, trace_steps_text
from .runner import Result, run_check
from .verdict import Verdict


class KvfenceSkipWarning(UserWarning):
    """A check passed with MUST rules SKIP: those rules were never exercised."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvfence", "kvfence conformance")
    group.addoption("--kvfence-engine", help="engine adapter name to check")
    group.addoption("--kvfence-client", default="reference", help="client adapter name")
    group.addoption("--kvfence-profile", default="ci", help="ci, dev or fuzz")
    group.addoption(
        "--kvfence-strict-skips",
        action="store_true",
        help="a check that passes with MUST rules SKIP fails (default: a KvfenceSkipWarning)",
    )


def _skips(result: Result, strict: bool) -> None:
    """Warn (or with ``strict`` fail) on a pass that left MUST rules SKIP."""
    line = skip_warning(result)
    if not line:
        return
    if strict:
        pytest.fail(f"kvfence: {line} (--kvfence-strict-skips)", pytrace=False)
    warnings.warn(KvfenceSkipWarning(line), stacklevel=3)


@pytest.fixture
def kvfence_check(tmp_path: Path, request: pytest.FixtureRequest):
    """``kvfence_check(engine=..., client=..., **run_check kwargs) -> Result``; engine and
    client are registry names (or ``module:function`` for a client) or adapter objects. A
    pass with MUST rules SKIP warns (``KvfenceSkipWarning``), or fails under
    ``--kvfence-strict-skips``."""
    strict = bool(request.config.getoption("--kvfence-strict-skips", False))

    def check(
        engine: str | EngineAdapter = "reference",
        client: str | ClientAdapter = "reference",
        **kwargs: Any,
    ) -> Result:
        eng = registry.engine(engine) if isinstance(engine, str) else engine
        cli = registry.client(client) if isinstance(client, str) else client
        kwargs.setdefault("out_dir", tmp_path)
        result = run_check(eng, cli, **kwargs)
        _skips(result, strict)
        return result

    return check


class KvfenceFailure(AssertionError):
    """A ``--kvfence-engine`` check that did not pass; its ``result``."""

    def __init__(self, result: Result) -> None:
        super().__init__(f"kvfence check {result.verdict}")
        self.result = result


MAX_STEP_LINES = 30
"""A failing item shows at most this many counterexample steps (the trace holds all)."""


def failure_text(result: Result) -> str:
    """A failed check in a few lines: the verdict with the rules that did not pass, the
    violations, the error, the counterexample's steps (at most ``MAX_STEP_LINES``) and the
    command that replays it."""
    bad = [rv for rv in result.rules if rv.verdict in (Verdict.FAIL, Verdict.ERROR)]
    unknown = [rv.rule.id for rv in result.rules if rv.verdict is Verdict.UNKNOWN]
    lines = [
        f"kvfence check {result.verdict}: engine={result.engine} client={result.client}"
        + (f" ({', '.join(rv.rule.id for rv in bad)})" if bad else "")
    ]
    lines += [f"  violated {v}" for v in result.violations]
    if result.error:
        lines.append(f"  error: {result.error}")
    if unknown:
        lines.append(f"  UNKNOWN (never exercised): {', '.join(unknown)}")
    if result.counterexample:
        steps = trace_steps_text(result.counterexample)
        cut = len(steps) - MAX_STEP_LINES
        lines.append(f"counterexample: {result.counterexample}")
        lines += steps[:MAX_STEP_LINES]
        if cut > 0:
            lines.append(f"  ... {cut} more steps in the trace")
        lines.append(f"replay it: {replay_hint(result)}")
    return "\n".join(lines)


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
            raise KvfenceFailure(result)
        _skips(result, bool(self.config.getoption("--kvfence-strict-skips")))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None):
        """The check's own short report, not pytest's traceback of kvfence internals."""
        if isinstance(excinfo.value, KvfenceFailure):
            return failure_text(excinfo.value.result)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"kvfence::{self.engine}::{self.client}"


class KvfenceCollector(pytest.File):
    def __init__(self, *, engine: str, client: str, profile: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.engine, self.client, self.profile = engine, client, profile

    def collect(self):
        yield KvfenceItem.from_parent(
            self,
            name=f"kvfence::{self.engine}::{self.client}",
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
    # The node id's file part: the ini file the options usually live in, else the folder
    # the check writes its counterexample to (nothing is read from either).
    path = config.inipath or Path(config.rootpath) / "kvfence-results"
    collector = KvfenceCollector.from_parent(
        session,
        path=path,
        engine=engine,
        client=config.getoption("--kvfence-client"),
        profile=config.getoption("--kvfence-profile"),
    )
    items.extend(collector.collect())
