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
    # Reading a null flag as "off" is a parsing mistake: CLI-006 since issue 14 (it was
    # CLI-002, whose parsing fallback could never fail).
    assert result.verdict == "FAIL" and "CLI-006" in result.caught()


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


# ----- issue 8: focus, CI, Hypothesis storage, memory; issue 14: shrinker, trace verdict --


@pytest.mark.parametrize("focus", ["inv-001", "", "INV-1"])
def test_a_focus_that_is_not_a_rule_is_a_usage_error(focus, out_dir):
    """F-2: a focus that named no rule set every example aside, and the run PASSed."""
    with pytest.raises(ValueError, match="unknown rule"):
        run_check(adapter(UpdateNeverFlushes), registry.client("reference"), focus=focus)


def test_rules_broken_in_set_aside_examples_fail(out_dir):
    """F-2: focused on a rule the system does not break, the rules it does break showed
    PASS and the run PASSed. They are FAIL now, and so is the run."""
    result = run_check(
        registry.engine("sleep-keeps-index"),
        registry.client("reference"),
        out_dir=out_dir,
        focus="INV-003",
        max_examples=300,
    )
    verdicts = {r.rule.id: r for r in result.rules}
    assert verdicts["ENG-006"].verdict == "FAIL", verdicts["ENG-006"]
    assert result.verdict == "FAIL" and result.exit_code == 1
    # Since the trust trials the set-aside example is the counterexample (it was FAIL with
    # nothing to replay), and the report says whose it is.
    assert result.counterexample is not None and "ENG-006" in result.caught()
    assert any("the counterexample is an example the focus set aside" in w for w in result.warnings)


def test_ci_derandomizes_only_the_ci_profile(tmp_path):
    """D-1: with CI set, dev and fuzz inherited Hypothesis's derandomized ci profile."""
    import os
    import subprocess
    import sys

    code = (
        "from kvfence.conformance.runner import PROFILES as P;"
        "print(P['ci'].derandomize, P['dev'].derandomize, P['fuzz'].derandomize)"
    )
    env = {**os.environ, "CI": "true"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.stdout.split() == ["True", "False", "False"], proc.stderr


def test_dev_runs_vary_and_honour_the_seed(tmp_path):
    from kvfence.conformance.runner import Options, _settings

    engine = registry.engine("reference")
    dev = _settings(engine, Options(profile="dev", out_dir=tmp_path))
    assert not dev.derandomize
    assert Path(dev.database.path).is_relative_to(tmp_path)  # under --out, not the cwd
    assert _settings(engine, Options(profile="ci", out_dir=tmp_path)).database is None


def test_a_check_leaves_no_hypothesis_folder_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_check(
        registry.engine("reference"),
        registry.client("never-flush"),
        profile="dev",
        out_dir=tmp_path / "out",
        max_examples=20,
    )
    assert not (tmp_path / ".hypothesis").exists()


def test_fuzz_budgets_run_in_bounded_chunks():
    """R-1: the fuzz profile's memory grew with its whole budget (about 1 GB); it runs in
    chunks of CHUNK examples now, each with its own seed (figure: scripts/bench.py)."""
    from hypothesis import settings

    from kvfence.conformance.runner import CHUNK, PROFILES, _chunks

    fuzz = _chunks(PROFILES["fuzz"], 7)
    assert sum(c.max_examples for c, _ in fuzz) == PROFILES["fuzz"].max_examples
    assert max(c.max_examples for c, _ in fuzz) <= CHUNK
    assert [s for _, s in fuzz] == list(range(7, 7 + len(fuzz)))
    ci = settings(PROFILES["ci"], max_examples=3000)
    assert _chunks(ci, None) == [(ci, None)]  # derandomized: chunks would repeat


def test_the_shrinker_only_tries_setups_the_generator_draws():
    """Issue 14: FP8 off used to leave an FP8 kv_cache_dtype in the server info, and the
    policy simplifications set plain strings, not enums."""
    from kvfence.conformance import strategies
    from kvfence.conformance.replay import _simpler_setups
    from kvfence.model.state import Config, Policy, server_info
    from kvfence.model.vocabulary import CacheMode

    fp8_info = server_info(radix_cache_enabled=True, kv_cache_dtype="fp8_e4m3")
    start = (Config(fp8_kv=True, info=fp8_info),)
    policy = Policy(mode=CacheMode.FLUSH, flush_cache=True, pause_mode=PauseMode.ABORT)
    plain = set(strategies.REPORTS_WHEN_ON) | set(strategies.REPORTS_WHEN_OFF)
    for configs, p in _simpler_setups(start, policy):
        (c,) = configs
        dtype = c.info is not None and dict(c.info).get("kv_cache_dtype") == "fp8_e4m3"
        assert dtype == (c.fp8_kv and c.info is not None), c
        base = None if c.info is None else tuple(kv for kv in c.info if kv[0] != "kv_cache_dtype")
        assert base in plain, c.info
        assert all(type(getattr(p, f)).__name__ != "str" for f in ("mode", "pause_mode")), p


def test_a_counterexample_lists_only_violations_of_its_steps(tmp_path):
    """Issue 14: the trace's verdict line also listed the client table's violations, which
    no step of the trace shows; the result still lists them."""

    class OnAlways(InProcessAdapter):
        def server_info(self, endpoint):
            return {"radix_cache_enabled": True}

    result = run_check(
        OnAlways(ReferenceEndpoint, "on-always"), registry.client("never-flush"), out_dir=tmp_path
    )
    trace = read_trace(result.counterexample)
    written = {v["rule"] for v in trace.verdict["violations"]}
    from kvfence.conformance.replay import replay_trace

    assert written == {v.rule for v in replay_trace(trace, None, None).violations}
    assert set(result.caught()) > written  # the table's extra rules stay in the result
