"""The conformance checker against a real vLLM 0.32 engine on CPU (adapters.vllm_engine).

A correct client (``reference``) must PASS against vLLM and reach REACH-001 (a prefix
served again after an update); ``never-flush`` must FAIL on INV-001 with a short
counterexample whose last step is a cache hit whose bytes differ from a cold prefill.

``run_check`` closes its engine when it ends; ``Shared`` defers that to module teardown so
that both runs of a mode share one engine (its ``start`` resets it between examples).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("vllm")

from kvfence.adapters.registry import client, engine
from kvfence.conformance.runner import Result, run_check

pytestmark = pytest.mark.vllm

#: First start of the HTTP server imports vLLM in three processes (~35 s idle, 110 s
#: seen on a loaded 2-core machine): more than the checker's default 60 s per call.
HTTP_TIMEOUT = 300.0


class Shared:
    """An engine adapter whose ``close`` waits for the module to end."""

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
        """Kept open for the next run of this module."""


@pytest.fixture(scope="module")
def offline():
    adapter = engine("vllm")
    yield Shared(adapter)
    adapter.close()


@pytest.fixture(scope="module")
def http():
    # The server runs in its own processes: it may be up while the in-process engine is.
    adapter = engine("vllm-http")
    yield Shared(adapter)
    adapter.close()


def _table(result: Result) -> str:
    rows = [f"{r.rule.id:10} {r.verdict:8} {r.evidence:5} {r.reason}" for r in result.rules]
    return f"verdict {result.verdict} ({result.seconds:.0f} s) {result.error}\n" + "\n".join(rows)


def assert_pass(result: Result) -> None:
    table = _table(result)
    verdicts = {r.rule.id: r.verdict for r in result.rules}
    assert result.error == "", table
    assert verdicts["REACH-001"] == "PASS", table
    assert "FAIL" not in verdicts.values(), table
    assert result.verdict == "PASS", table


def assert_never_flush_caught(result: Result) -> None:
    table = _table(result)
    assert result.verdict == "FAIL", table
    assert "INV-001" in result.caught(), table
    assert result.steps <= 4, table
    assert result.counterexample is not None and result.counterexample.is_file()
    lines = [json.loads(line) for line in result.counterexample.read_text().splitlines()]
    assert lines[-1]["verdict"] == "FAIL"
    last = lines[-2]
    assert last["action"]["action"] == "ServeRequest", last
    response = last["observed"]["response"]
    assert response["hit"] is True, last
    assert response["output"] != response["cold"], last
    token_ids, logprobs = response["output"]
    assert len(token_ids) == len(logprobs) == 8


def test_offline_reference_client_passes(offline, tmp_path):
    result = run_check(offline, client("reference"), profile="ci", out_dir=tmp_path)
    assert_pass(result)


def test_offline_never_flush_fails_on_stale_kv(offline, tmp_path):
    result = run_check(offline, client("never-flush"), profile="ci", out_dir=tmp_path)
    assert_never_flush_caught(result)


@pytest.mark.slow
def test_http_reference_client_passes(http, tmp_path):
    result = run_check(
        http, client("reference"), profile="ci", out_dir=tmp_path, timeout=HTTP_TIMEOUT
    )
    assert_pass(result)


@pytest.mark.slow
def test_http_never_flush_fails_on_stale_kv(http, tmp_path):
    result = run_check(
        http, client("never-flush"), profile="ci", out_dir=tmp_path, timeout=HTTP_TIMEOUT
    )
    assert_never_flush_caught(result)
