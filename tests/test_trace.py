"""Counterexample traces: written by a failing run, replayed against an engine and against
the spec alone, and every malformed trace rejected with the line and field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvfence.adapters import registry
from kvfence.conformance.cli import main
from kvfence.conformance.replay import replay_trace
from kvfence.conformance.runner import run_check
from kvfence.conformance.trace import read_trace
from kvfence.model.actions import TraceError, action_from_json
from kvfence.model.candidates import candidates
from kvfence.model.state import Bounds, Config, initial_state


@pytest.fixture(scope="module")
def counterexample(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trace")
    result = run_check(
        registry.engine("guard-missing-on-disk"), registry.client("reference"), out_dir=out
    )
    assert result.verdict == "FAIL"
    return result.counterexample


def test_every_action_round_trips_through_json():
    state = initial_state((Config(), Config()))
    for action in candidates(state, Bounds()):
        assert action_from_json(json.loads(json.dumps(action.to_json()))) == action


def test_trace_shape(counterexample):
    lines = [json.loads(x) for x in counterexample.read_text().splitlines()]
    head, steps, last = lines[0], lines[1:-1], lines[-1]
    assert head["kvfence_trace"] == 1
    assert {"spec_version", "model_digest", "engine", "client", "seed", "profile"} <= set(head)
    assert all("action" in s and "step" in s for s in steps)
    assert last["verdict"] == "FAIL" and last["violations"][0]["rule"]
    assert {"expected", "actual"} <= set(last["violations"][0])


def test_replay_against_the_faulty_engine_fails_and_against_reference_is_fixed(counterexample):
    trace = read_trace(counterexample)
    bad = replay_trace(
        trace, registry.engine("guard-missing-on-disk"), registry.client("reference")
    )
    assert bad.kind == "FAIL"
    good = replay_trace(trace, registry.engine("reference"), registry.client("reference"))
    assert good.kind == "PASS"


def test_model_only_validation_judges_the_recorded_behaviour(counterexample):
    trace = read_trace(counterexample)
    verdict = replay_trace(trace, None, None)
    assert verdict.kind == "FAIL"
    assert {v.rule for v in verdict.violations} == {
        v["rule"] for v in json.loads(counterexample.read_text().splitlines()[-1])["violations"]
    }


def test_cli_replay_exit_codes(counterexample, capsys):
    assert main(["replay", str(counterexample)]) == 1
    assert "FAILED" in capsys.readouterr().out
    assert main(["replay", str(counterexample), "--engine", "reference"]) == 0
    assert "FIXED" in capsys.readouterr().out
    assert main(["replay", str(counterexample), "--model-only"]) == 1


def edit(path: Path, tmp: Path, change) -> Path:
    lines = path.read_text().splitlines()
    lines = change(lines)
    out = tmp / "edited.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


def set_field(index: int, key: str, value):
    def change(lines):
        obj = json.loads(lines[index])
        target = obj
        *parents, leaf = key.split(".")
        for p in parents:
            target = target[p]
        target[leaf] = value
        lines[index] = json.dumps(obj)
        return lines

    return change


BAD = [
    ("truncated", lambda ls: [*ls[:2], ls[2][: len(ls[2]) // 2]], r"\.jsonl:3: not JSON"),
    ("empty", lambda ls: [], "empty trace"),
    ("no header", lambda ls: ls[1:], "first line must be a header"),
    ("other spec", set_field(0, "spec_version", "9.9"), "trace is for spec 9.9"),
    ("unknown action", set_field(1, "action.action", "DropTables"), "unknown action 'DropTables'"),
    ("wrong type", set_field(1, "action.endpoint", "zero"), "endpoint: expected int"),
    ("bad enum", set_field(0, "policy.mode", "sometimes"), "'sometimes' is not one of"),
    ("bad config", set_field(0, "configs", []), "at least one endpoint"),
    ("endpoint range", set_field(1, "action.endpoint", 7), "endpoint 7 out of range"),
    ("bad status", set_field(1, "observed.status", "great"), "'great' is not one of"),
    ("bad view", set_field(1, "observed.view.weights", "v1"), "view.weights: expected"),
    ("after verdict", lambda ls: [*ls, ls[1]], "a line after the verdict line"),
    ("not an object", lambda ls: [ls[0], "[1, 2]", *ls[2:]], "must be a JSON object"),
]


@pytest.mark.parametrize(("name", "change", "message"), BAD, ids=[b[0] for b in BAD])
def test_malformed_trace_is_named(counterexample, tmp_path, name, change, message, capsys):
    path = edit(counterexample, tmp_path, change)
    with pytest.raises(TraceError, match=message):
        read_trace(path)
    assert main(["replay", str(path)]) == 2
    assert "ERROR" in capsys.readouterr().out


def test_binary_and_missing_files_are_errors(tmp_path, capsys):
    binary = tmp_path / "x.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="not a text file"):
        read_trace(binary)
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "missing.jsonl")
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2


def test_model_only_names_a_recorded_step_the_spec_would_not_drive(tmp_path):
    """A sync sub-step that differs from what the recorded plan drives is an ERROR naming
    the line: the recorded log does not follow the spec's sync."""
    result = run_check(
        registry.engine("reference"), registry.client("never-flush"), out_dir=tmp_path
    )
    assert result.verdict == "FAIL" and result.steps <= 4

    def swap(lines):
        objs = [json.loads(x) for x in lines]
        sub = next(o for o in objs if o.get("action", {}).get("action") == "PauseGeneration")
        sub["action"]["mode"] = "abort" if sub["action"]["mode"] != "abort" else "in_place"
        return [json.dumps(o) for o in objs]

    trace = read_trace(edit(result.counterexample, tmp_path, swap))
    verdict = replay_trace(trace, None, None)
    assert verdict.kind == "ERROR"
    assert "but the spec drives" in verdict.message
