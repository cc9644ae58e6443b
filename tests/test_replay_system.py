"""A replay runs the same system as the check: the trace header's ``system`` records the
engine as given (``module:factory`` verbatim), the URL (nothing secret), checkpoints,
served model, overlay and SGLang version; ``replay`` reads them back, its flags override
them, and the printed replay line reproduces the FAIL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvfence.adapters import registry
from kvfence.conformance import cli
from kvfence.conformance.cli import main

TOY = """
from kvfence.adapters.mutants import BY_NAME
from kvfence.adapters.reference import InProcessAdapter


def make():
    return InProcessAdapter(BY_NAME["guard-missing-on-disk"].build(), "toy")
"""


def _replay_line(out: str) -> list[str]:
    line = next(x for x in out.splitlines() if x.startswith("replay it: kvfence replay "))
    return line.removeprefix("replay it: kvfence ").split()


def _check_then_replay(argv: list[str], capsys) -> tuple[list[str], Path]:
    assert main(["check", "--max-examples", "60", *argv]) == 1
    words = _replay_line(capsys.readouterr().out)
    return words, Path(words[1])


def test_a_builtin_engines_replay_line_reproduces_the_fail(tmp_path, capsys):
    words, trace = _check_then_replay(
        ["--engine", "mutant:guard-missing-on-disk", "--out", str(tmp_path)], capsys
    )
    head = json.loads(trace.read_text().splitlines()[0])
    assert head["system"]["engine"] == "mutant:guard-missing-on-disk"
    assert words == ["replay", str(trace)]  # a registry name needs no flag
    assert main(words) == 1
    assert capsys.readouterr().out.startswith("FAILED")


def test_a_module_factory_engines_replay_line_reproduces_the_fail(tmp_path, monkeypatch, capsys):
    (tmp_path / "toy_engine.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    words, trace = _check_then_replay(
        ["--engine", "toy_engine:make", "--out", str(tmp_path / "out")], capsys
    )
    head = json.loads(trace.read_text().splitlines()[0])
    assert head["engine"] == "toy" and head["system"]["engine"] == "toy_engine:make"
    assert words[-2:] == ["--engine", "toy_engine:make"]
    assert main(words) == 1
    # Without the flag the trace's module is never imported: an ERROR that says why.
    assert main(["replay", str(trace)]) == 2
    assert "Pass --engine explicitly" in " ".join(capsys.readouterr().out.split())


def test_the_header_keeps_no_secret():
    recorded = registry.system(
        "vllm-http",
        {
            "url": "http://user:hunter2@127.0.0.1:8000/v1?token=abc#x",
            "checkpoints": {0: Path("/m/v0"), 1: Path("/m/v1")},
            "served_model": "tiny",
        },
    )
    assert recorded == {
        "engine": "vllm-http",
        "url": "http://127.0.0.1:8000/v1",
        "checkpoints": {"v0": "/m/v0", "v1": "/m/v1"},
        "served_model": "tiny",
    }
    assert "hunter2" not in json.dumps(recorded) and "abc" not in json.dumps(recorded)
    options = registry.system_options(recorded)
    assert options["checkpoints"] == {0: Path("/m/v0"), 1: Path("/m/v1")}
    assert options["url"] == "http://127.0.0.1:8000/v1"
    assert registry.system("sglang", {})["sglang_version"]
    assert registry.system("sglang@0.4.1", {})["sglang_version"] == "0.4.1"
    windows = registry.system("sglang", {"window": True, "optimize": True, "ranks": 2})
    assert registry.system_options(windows) == {"window": True, "optimize": True, "ranks": 2}
    with pytest.raises(ValueError, match=r"system\.ranks"):
        registry.system_options({"ranks": "2"})
    with pytest.raises(ValueError, match="--window applies to the sglang engines"):
        registry.build_engine("reference", window=True)


def _attached_trace(tmp_path: Path, capsys) -> Path:
    """A failing trace whose header says it was recorded on an attached vLLM server."""
    assert main(["check", "--max-examples", "60", "--engine", "guard-missing-on-disk",
                 "--out", str(tmp_path)]) == 1  # fmt: skip
    trace = Path(_replay_line(capsys.readouterr().out)[1])
    lines = trace.read_text().splitlines()
    head = json.loads(lines[0])
    head["system"] = {
        "engine": "vllm-http",
        "url": "http://127.0.0.1:8011",
        "checkpoints": {"v0": str(tmp_path), "v1": str(tmp_path)},
        "served_model": "tiny",
    }
    trace.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    return trace


@pytest.fixture
def built(monkeypatch):
    """registry.engine, recording each name and options; it builds the recorded mutant
    in place of the real server (none runs here)."""
    calls: list[tuple[str, dict]] = []

    def engine(name, **options):
        calls.append((name, options))
        return registry.build_engine("guard-missing-on-disk")

    monkeypatch.setattr(cli.registry, "engine", engine)
    return calls


def test_an_attached_trace_replays_against_the_recorded_server(tmp_path, capsys, built):
    trace = _attached_trace(tmp_path, capsys)
    built.clear()  # the check that recorded the trace
    assert main(["replay", str(trace)]) == 1
    ((name, options),) = built
    assert name == "vllm-http" and options["url"] == "http://127.0.0.1:8011"
    assert options["checkpoints"] == {0: tmp_path, 1: tmp_path}
    assert options["served_model"] == "tiny"
    assert "at http://127.0.0.1:8011" in " ".join(capsys.readouterr().out.split())


def test_replay_flags_override_the_recorded_server(tmp_path, capsys, built):
    trace = _attached_trace(tmp_path, capsys)
    built.clear()  # the check that recorded the trace
    argv = ["replay", str(trace), "--url", "http://127.0.0.1:9000", "--served-model", "other"]
    assert main(argv) == 1
    ((_, options),) = built
    assert options["url"] == "http://127.0.0.1:9000" and options["served_model"] == "other"
    assert options["checkpoints"] == {0: tmp_path, 1: tmp_path}  # not overridden: kept


def test_a_malformed_recorded_system_is_an_error_not_a_crash(tmp_path, capsys, built):
    trace = _attached_trace(tmp_path, capsys)
    built.clear()  # the check that recorded the trace
    lines = trace.read_text().splitlines()
    head = json.loads(lines[0])
    head["system"]["checkpoints"] = ["v0"]
    trace.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    assert main(["replay", str(trace)]) == 2
    assert "system.checkpoints" in capsys.readouterr().out
    assert not built
