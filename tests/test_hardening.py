"""Regression tests for the adversarial review: each attack that once got a wrong answer
out of the checker, and the answer it must give now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvfence.adapters import registry
from kvfence.adapters.mutants import UpdateNeverFlushes
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.conformance.cli import main
from kvfence.conformance.runner import run_check
from kvfence.conformance.trace import read_trace
from kvfence.model.actions import TraceError
from kvfence.model.client import Plan
from kvfence.model.observation import Observation
from kvfence.model.vocabulary import PauseMode

REGRESSION = Path(__file__).parent / "regressions" / "PF-08-update-never-flushes.jsonl"


def adapter(cls=ReferenceEndpoint, caps=None, name="x"):
    a = InProcessAdapter(cls, name)
    if caps is not None:
        a.capabilities = caps
    return a


def test_bytes_without_the_capability_are_no_evidence(out_dir):
    """A never-flushing engine whose adapter does not declare byte_oracle must not PASS
    INV-001 on bytes the checker never compared."""
    result = run_check(
        adapter(UpdateNeverFlushes, frozenset({"flush_result", "pause"})),
        registry.client("reference"),
        out_dir=out_dir,
    )
    verdicts = {r.rule.id: r.verdict for r in result.rules}
    assert verdicts["INV-001"] != "PASS"
    assert verdicts["ENG-002"] == "SKIP"
    assert result.exit_code != 0


@pytest.mark.parametrize(
    "caps", [frozenset({"cache-probe"}), frozenset({"weight_probe", "pause"}), None, ["pause"]]
)
def test_unknown_or_malformed_capabilities_are_errors(caps, out_dir):
    a = adapter()
    a.capabilities = caps
    result = run_check(a, registry.client("reference"), out_dir=out_dir)
    assert result.verdict == "ERROR" and "ADP-002" in result.error


class Exits(InProcessAdapter):
    def apply(self, action):
        raise SystemExit(0)


class ExitingClient:
    name = "exits"

    def resolve(self, policy, info):
        raise SystemExit(0)


def test_system_exit_from_the_sut_is_an_error(out_dir):
    r1 = run_check(Exits(ReferenceEndpoint, "exits"), registry.client("reference"), out_dir=out_dir)
    r2 = run_check(registry.engine("reference"), ExitingClient(), out_dir=out_dir)
    assert r1.verdict == r2.verdict == "ERROR"


class Malformed(InProcessAdapter):
    def __init__(self, broken):
        super().__init__(ReferenceEndpoint, "malformed")
        self.broken = broken

    def apply(self, action):
        obs = super().apply(action)
        return self.broken(obs)


@pytest.mark.parametrize(
    ("broken", "field"),
    [
        (lambda o: Observation("ok"), "status"),
        (lambda o: Observation(o.status, view=o.view.__class__(0, cache=[])), "view.cache"),
        (lambda o: Observation(o.status, flushed="yes"), "flushed"),
    ],
    ids=["status-string", "cache-list", "flushed-string"],
)
def test_malformed_observation_is_adp_002_naming_the_field(broken, field, out_dir):
    result = run_check(Malformed(broken), registry.client("reference"), out_dir=out_dir)
    assert result.verdict == "ERROR"
    assert "ADP-002" in result.error and field in result.error


class TypedWrong:
    name = "typed-wrong"

    def __init__(self, plan):
        self.plan = plan

    def resolve(self, policy, info):
        return self.plan


@pytest.mark.parametrize(
    "plan", [Plan(1, PauseMode.RETRACT), Plan(True, "retract")], ids=["flush-int", "mode-str"]
)
def test_malformed_plan_is_adp_002(plan, out_dir):
    result = run_check(registry.engine("reference"), TypedWrong(plan), out_dir=out_dir)
    assert result.verdict == "ERROR" and "ADP-002" in result.error


def test_null_radix_flag_is_unknown_not_off(out_dir):
    class NullIsOff:
        name = "null-is-off"

        def resolve(self, policy, info):
            flush = policy.mode.value == "flush" or policy.flush_cache is True
            if policy.mode.value == "auto" and info is not None:
                flush = flush or bool(info.get("radix_cache_enabled", True))
            elif policy.mode.value == "auto":
                flush = True
            pause = policy.pause_mode
            if flush and pause is PauseMode.IN_PLACE:
                pause = PauseMode.RETRACT
            return Plan(flush, pause)

    result = run_check(registry.engine("reference"), NullIsOff(), out_dir=out_dir)
    assert result.verdict == "FAIL" and "CLI-002" in result.caught()


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


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--max-examples", "0"],
        ["check", "--timeout", "nan"],
        ["check", "--timeout", "-1"],
        ["explore", "--depth", "-1"],
        ["mutants", "--jobs", "0"],
    ],
)
def test_bad_numbers_are_usage_errors(argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 3


def test_engine_factory_that_raises_is_a_usage_error(capsys):
    assert main(["check", "--engine", "json:loads"]) == 3
    assert "cannot load" in capsys.readouterr().out


def test_unwritable_output_keeps_the_verdict(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["check", "--client", "never-flush", "--out", str(blocker / "sub")])
    out = capsys.readouterr().out
    assert code == 1 and "verdict: FAIL" in out and "could not write" in out
