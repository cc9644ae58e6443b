"""Reading a trace: a replay never imports the code a trace names; hostile or odd lines,
infinities and a trace without steps are trace errors, not fixes; traces of an older spec
load and an unknown spec version says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvfence.conformance.cli import main
from kvfence.conformance.trace import read_trace
from kvfence.model.actions import (
    TraceError,
)

REGRESSION = Path(__file__).parent / "regressions" / "PF-08-update-never-flushes.jsonl"


def test_replay_never_imports_code_named_by_a_trace(tmp_path, capsys):
    lines = REGRESSION.read_text().splitlines()
    head = json.loads(next(x for x in lines if x.startswith("{")))
    head["engine"] = "os:abort"
    text = [json.dumps(head) if x.startswith('{"kvfence_trace"') else x for x in lines]
    path = tmp_path / "evil.jsonl"
    path.write_text("\n".join(text) + "\n")
    assert main(["replay", str(path)]) == 2
    assert "only runs registry names" in capsys.readouterr().out


@pytest.mark.parametrize(
    "line",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"step": 0, "action": {"action": {}}}',
        '{"step": 0, "action": {"action": ["x"]}}',
    ],
    ids=["deep", "dict-name", "list-name"],
)
def test_hostile_step_lines_are_trace_errors(line, tmp_path):
    head = REGRESSION.read_text().splitlines()[3]
    path = tmp_path / "t.jsonl"
    path.write_text(head + "\n" + line + "\n")
    with pytest.raises(TraceError):
        read_trace(path)


def test_infinity_and_odd_shapes_in_fields_are_trace_errors(tmp_path):
    lines = REGRESSION.read_text().splitlines()
    step = json.loads(lines[4])
    step["observed"]["view"]["cache"] = [{"prefix": "P", "version": float("inf")}]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([lines[3], json.dumps(step)]) + "\n")
    with pytest.raises(TraceError):
        read_trace(path)
    head = json.loads(lines[3])
    head["configs"][0]["info"] = {"radix_cache_enabled": [True]}
    path.write_text(json.dumps(head) + "\n" + lines[4] + "\n")
    with pytest.raises(TraceError, match="scalars"):
        read_trace(path)


def test_a_trace_without_steps_is_not_fixed(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(REGRESSION.read_text().splitlines()[3] + "\n")
    assert main(["replay", str(path), "--engine", "reference"]) == 2
    assert main(["replay", str(path), "--model-only"]) == 2


def test_older_spec_traces_load_and_unknown_ones_say_so(tmp_path):
    """Traces of an older spec load (later versions only added fields with defaults); any
    other version is refused with a message naming both versions."""
    from pathlib import Path

    from kvfence.conformance.trace import read_trace
    from kvfence.model import READABLE_SPECS, SPEC_VERSION
    from kvfence.model.actions import TraceError

    old = Path(__file__).parent / "regressions" / "PF-01-never-flush.jsonl"
    assert '"spec_version": "0.1"' in old.read_text() and "0.1" in READABLE_SPECS
    assert read_trace(old).configs
    alien = tmp_path / "alien.jsonl"
    alien.write_text(old.read_text().replace('"spec_version": "0.1"', '"spec_version": "9.9"'))
    with pytest.raises(TraceError, match=f"spec 9.9 .*this is spec {SPEC_VERSION}"):
        read_trace(alien)


@pytest.mark.parametrize(
    "capabilities, message",
    [
        ("flush_result", "list of capability names"),
        ([1], "list of capability names"),
        (["flush_result", "telepathy"], "unknown capabilities \\['telepathy'\\]"),
    ],
    ids=["a-string", "a-number", "unknown-name"],
)
def test_a_malformed_capabilities_header_is_a_trace_error(capabilities, message, tmp_path):
    lines = REGRESSION.read_text().splitlines()
    head = json.loads(lines[3])
    head["capabilities"] = capabilities
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(head) + "\n" + lines[4] + "\n")
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_a_declared_flush_result_makes_a_recorded_null_a_failure(tmp_path):
    """A system that declares ``flush_result`` and recorded ``"flushed": null`` (the spec
    expected a result, none came) is judged on it, as the live lockstep judged it (a
    missing result is a failure, FC-003); without the declaration, or with the key absent
    (nothing recorded about it, as in a trace cut to statuses), it is silence."""
    from kvfence.conformance.replay import RecordedEngine

    lines = REGRESSION.read_text().splitlines()
    path = tmp_path / "t.jsonl"
    for declared, key, claimed in (
        (["flush_result"], True, True),
        (["flush_result"], False, False),
        (None, True, False),
    ):
        head, step = json.loads(lines[3]), json.loads(lines[4])
        step["observed"].pop("flushed", None)
        if key:
            step["observed"]["flushed"] = None
        head.pop("capabilities", None)
        if declared is not None:
            head["capabilities"] = declared
        path.write_text(json.dumps(head) + "\n" + json.dumps(step) + "\n")
        trace = read_trace(path)
        assert trace.unanswered is key
        assert ("flush_result" in RecordedEngine(trace).capabilities) is claimed
