"""Hostile adapters: systems and adapters written to get a PASS out of the checker, or to
make it hang, crash or lose its reports. None may PASS; each ends promptly with its reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import attrs
import pytest

from kvfence.adapters import registry
from kvfence.adapters.protocol import AdapterFailure
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.conformance.replay import replay_trace
from kvfence.conformance.report import write_json, write_junit
from kvfence.conformance.runner import run_check
from kvfence.conformance.trace import read_trace
from kvfence.model.actions import ServeRequest


class Hangs(InProcessAdapter):
    """The reference, except that the first ServeRequest never returns (H-1)."""

    def __init__(self) -> None:
        super().__init__(ReferenceEndpoint, "hangs")

    def apply(self, action):
        if isinstance(action, ServeRequest):
            threading.Event().wait()
        return super().apply(action)


class Says(InProcessAdapter):
    """The reference, except that a ServeRequest fails with ``message`` (H-5, U-2)."""

    def __init__(self, message: str, name: str = "says") -> None:
        super().__init__(ReferenceEndpoint, name)
        self.message = message

    def apply(self, action):
        if isinstance(action, ServeRequest):
            raise AdapterFailure(self.message)
        return super().apply(action)


class BytesOutput(InProcessAdapter):
    """The reference, with its response bytes as ``bytes`` (the docs call them 'the
    response bytes'), inside the output tuples (H-2)."""

    def __init__(self) -> None:
        super().__init__(ReferenceEndpoint, "bytes-output")

    def apply(self, action):
        obs = super().apply(action)
        if obs.response is None:
            return obs
        raw = (b"\xff\x00" + repr(obs.response.output).encode(),)
        cold = (b"\xff\x00" + repr(obs.response.cold).encode(),)
        return attrs.evolve(obs, response=attrs.evolve(obs.response, output=raw, cold=cold))


class ServerInfoRaises(InProcessAdapter):
    def server_info(self, endpoint):
        raise RuntimeError("server info \udcff down")


class ReturnsNone(InProcessAdapter):
    def apply(self, action):
        super().apply(action)


HOSTILE = {
    "hangs": Hangs,
    "surrogate-message": lambda: Says("engine said \ud800 then died"),
    "control-characters": lambda: Says("bell \x07 escape \x1b[31m nul \x00 [bold]markup[/]"),
    "server-info-raises": lambda: ServerInfoRaises(ReferenceEndpoint, "info-raises"),
    "apply-returns-none": lambda: ReturnsNone(ReferenceEndpoint, "returns-none"),
    "name-escapes-out": lambda: Says("x", name="../../escaped:name"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_adapter_never_passes_and_leaves_its_reports(name, tmp_path):
    out = tmp_path / "out"
    result = run_check(HOSTILE[name](), registry.client("reference"), out_dir=out, timeout=0.5)
    assert result.verdict != "PASS" and result.exit_code != 0, result.verdict
    assert result.error, result.verdict
    assert "not deterministic" not in result.error
    write_json([result], tmp_path / "r.json")
    write_junit([result], tmp_path / "r.xml")
    assert json.loads((tmp_path / "r.json").read_text())[0]["verdict"] == result.verdict
    ET.parse(tmp_path / "r.xml")  # parseable whatever the adapter said
    if result.counterexample is not None:
        assert result.counterexample.resolve().parent == out.resolve()
        assert ":" not in result.counterexample.name
        read_trace(result.counterexample)


def test_a_hung_call_is_reported_as_the_timeout(tmp_path):
    """H-1: the error names the timeout, not Hypothesis's replay ('not deterministic')."""
    result = run_check(Hangs(), registry.client("reference"), out_dir=tmp_path, timeout=0.3)
    assert result.verdict == "ERROR"
    assert "did not answer within 0.3 s" in result.error, result.error


def test_bytes_in_the_response_survive_the_trace(tmp_path):
    """H-2: a counterexample whose responses carry bytes is written, read and judged."""
    result = run_check(BytesOutput(), registry.client("never-flush"), out_dir=tmp_path)
    assert result.verdict == "FAIL" and result.counterexample is not None
    trace = read_trace(result.counterexample)
    assert replay_trace(trace, None, None).kind == "FAIL"


def test_runs_sharing_an_output_folder_keep_their_own_counterexamples(tmp_path):
    """U-6: two runs, one --out: two traces, each result naming its own."""
    client = registry.client("never-flush")
    a = run_check(registry.engine("reference"), client, out_dir=tmp_path)
    b = run_check(registry.engine("reference"), client, out_dir=tmp_path)
    assert a.counterexample != b.counterexample
    assert a.counterexample.exists() and b.counterexample.exists()
    assert len(list(tmp_path.glob("counterexample-*.jsonl"))) == 2


MODULE = """
import threading
from kvfence.adapters.protocol import AdapterFailure
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.model.actions import ServeRequest


class Hangs(InProcessAdapter):
    def apply(self, action):
        if isinstance(action, ServeRequest):
            threading.Event().wait()
        return super().apply(action)


class Says(InProcessAdapter):
    def apply(self, action):
        if isinstance(action, ServeRequest):
            raise AdapterFailure("bad \\ud800 text, bell \\x07, nul \\x00")
        return super().apply(action)


def hangs():
    return Hangs(ReferenceEndpoint, "hangs")


def says():
    return Says(ReferenceEndpoint, "says")
"""


@pytest.mark.parametrize("factory", ["hangs", "says"])
def test_the_cli_exits_with_its_verdict_and_reports(factory, tmp_path):
    """H-1, H-5, U-2 as a user meets them: the process exits (a hung adapter thread does
    not keep it alive), with exit 2, a parseable JUnit file and a JSON report, and writes
    no .hypothesis folder in the working directory."""
    (tmp_path / "hostile_mod.py").write_text(MODULE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONIOENCODING": "utf-8"}
    argv = [sys.executable, "-m", "kvfence.conformance.cli", "check"]
    argv += ["--engine", f"hostile_mod:{factory}", "--timeout", "0.5", "--max-examples", "5"]
    argv += ["--out", "out", "--json", "r.json", "--junit", "r.xml"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, timeout=120)
    out = proc.stdout.decode("utf-8", "replace")
    assert proc.returncode == 2, out + proc.stderr.decode("utf-8", "replace")
    assert "verdict: ERROR" in out and "Traceback" not in proc.stderr.decode("utf-8", "replace")
    assert json.loads((tmp_path / "r.json").read_text())[0]["verdict"] == "ERROR"
    ET.parse(tmp_path / "r.xml")
    assert not (tmp_path / ".hypothesis").exists()
    if factory == "hangs":
        assert "did not answer within 0.5 s" in out


def test_reports_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """Reports go through a temporary file and a rename: a failed write leaves the old
    report, never half of a new one."""
    result = run_check(
        registry.engine("reference"), registry.client("never-flush"), out_dir=tmp_path
    )
    path = tmp_path / "r.json"
    write_json([result], path)
    before = path.read_text()

    def broken(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", broken)
    with pytest.raises(OSError):
        write_json([result], path)
    monkeypatch.undo()
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_forked_process_starts_its_own_adapter_worker(tmp_path):
    """The matrix runs checks in forked processes; a child inheriting the parent's worker
    (a thread that does not exist after fork) waited out every call: 'resolve did not
    answer within 60 s' for the reference."""
    import multiprocessing

    from kvfence.conformance.calls import call_with_timeout

    assert call_with_timeout(lambda: 1, 5, "warm-up") == 1  # the parent has a worker now
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        assert pool.apply(call_with_timeout, (int, 5, "in the child")) == 0
