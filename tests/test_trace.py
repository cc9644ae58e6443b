"""Counterexample traces: written by a failing run, replayed against an engine and against
the spec alone, and every malformed trace rejected with the line and field named."""

from __future__ import annotations

import json
import os
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
    # a sync needs at most a request before and after it; moves if shrinking gets worse
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


# ----- traces that replayed nothing, special files, size, encoding -----------------------


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _write(tmp: Path, objs: list[dict]) -> Path:
    out = tmp / "t.jsonl"
    out.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return out


@pytest.mark.parametrize("within", [0, -7, 999])
def test_within_must_name_the_sync_just_before(counterexample, tmp_path, within, capsys):
    """F-3: every step marked `within` (even -7) replayed zero actions and printed FIXED.
    `within` now only names the SyncWeights step just before the engine call."""
    objs = _lines(counterexample)
    for o in objs[1:-1]:
        o["within"] = within
    path = _write(tmp_path, objs)
    with pytest.raises(TraceError, match="within"):
        read_trace(path)
    assert main(["replay", str(path), "--engine", "reference"]) == 2
    assert main(["replay", str(path), "--model-only"]) == 2
    assert "FIXED" not in capsys.readouterr().out


def test_a_replay_with_no_top_level_action_is_error(counterexample):
    trace = read_trace(counterexample)
    trace.steps = [s for s in trace.steps if s.within is not None]
    for engine, client in (
        (None, None),
        (registry.engine("reference"), registry.client("reference")),
    ):
        replayed = replay_trace(trace, engine, client)
        assert replayed.kind == "ERROR" and "no top-level action" in replayed.message


def test_model_only_validation_consumes_every_recorded_step(tmp_path):
    """A recorded engine call the spec's replay never reached is an ERROR, not a PASS (the
    spec never judged it)."""
    path = _long_trace(tmp_path, 100)  # ends on a sync and its engine calls
    objs = _lines(path)
    objs.insert(-1, {**objs[-2], "step": objs[-2]["step"] + 1})  # one more call in that sync
    trace = read_trace(_write(tmp_path, objs))
    replayed = replay_trace(trace, None, None)
    assert replayed.kind == "ERROR" and "never drove line" in replayed.message


def test_special_files_are_refused(tmp_path, capsys):
    """H-3: a symlink to an endless device read until MemoryError; a FIFO hung."""
    link = tmp_path / "zero.jsonl"
    link.symlink_to("/dev/zero")
    with pytest.raises(TraceError, match="not a regular file"):
        read_trace(link)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(TraceError, match="not a regular file"):
        read_trace(fifo)
    assert main(["replay", str(fifo)]) == 2


def test_oversized_traces_are_refused(tmp_path, monkeypatch):
    from kvfence.conformance import trace as trace_module

    monkeypatch.setattr(trace_module, "MAX_TRACE_BYTES", 100)
    path = tmp_path / "big.jsonl"
    path.write_text("#" * 200 + "\n")
    with pytest.raises(TraceError, match="limited to 100"):
        read_trace(path)


def test_an_encoding_problem_names_the_line(counterexample, tmp_path):
    data = counterexample.read_bytes().split(b"\n")
    data[2] = data[2][:10] + b"\xff" + data[2][10:]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(data))
    with pytest.raises(TraceError, match=r"bad\.jsonl:3: not a text file .*column 11"):
        read_trace(path)


def _long_trace(tmp: Path, n: int) -> Path:
    from kvfence.conformance.replay import replay_actions
    from kvfence.conformance.trace import header, verdict_line, write_trace
    from kvfence.model.actions import ServeRequest, SyncWeights
    from kvfence.model.state import Policy
    from kvfence.model.vocabulary import Funnel

    actions = [
        SyncWeights(i // 100 + 1, Funnel.DISK) if i % 100 == 99 else ServeRequest(0, "P")
        for i in range(n)
    ]
    configs = (Config(),)
    run = replay_actions(
        registry.engine("reference"), registry.client("reference"), configs, Policy(), actions
    ).run
    assert len(run.actions) == n
    head = header("reference", "reference", None, "ci", configs, Policy())
    return write_trace(tmp / f"long{n}.jsonl", head, run.steps, verdict_line(run.steps, [], "x"))


def test_replay_is_linear_in_trace_length(tmp_path):
    """H-4: replay time grew quadratically (a 50k-step trace ran past 2 minutes): the
    model's ledger was re-checked and re-hashed whole at every step. Four times the steps
    must cost about four times the work, counted as Python and C calls (a count, not a
    clock: a loaded machine cannot make it flake; scripts/bench.py keeps the timings)."""
    import sys

    calls = []
    for n in (200, 800):
        trace = read_trace(_long_trace(tmp_path, n))
        count = [0]

        def tally(frame, event, arg, count=count):
            if event in ("call", "c_call"):
                count[0] += 1

        sys.setprofile(tally)
        try:
            verdict = replay_trace(trace, None, None).kind
        finally:
            sys.setprofile(None)
        assert verdict == "PASS"
        calls.append(count[0])
    # linear is 4x, quadratic 16x
    assert calls[1] < 6 * calls[0], calls


def test_model_only_replays_a_trace_from_an_adapter_without_pause(tmp_path, capsys):
    """U-1: kvfence's own counterexample from an adapter without `pause` could not be judged
    with --model-only (the replay drove pauses the trace never recorded: ADP-001)."""
    from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint

    engine = InProcessAdapter(ReferenceEndpoint, "no-pause")
    engine.capabilities = engine.capabilities - {"pause"}
    result = run_check(engine, registry.client("never-flush"), out_dir=tmp_path)
    assert result.verdict == "FAIL"
    assert main(["replay", str(result.counterexample), "--model-only"]) == 1
    assert "ADP-001" not in capsys.readouterr().out
