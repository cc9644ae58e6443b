"""The check's search (``runner.run_check``): rules broken in set-aside examples still
FAIL, a focused FAIL writes its counterexample, only the ci profile is derandomized and dev
runs honour the seed, budgets run in bounded chunks, the shrinker tries only setups the
generator draws, a counterexample lists only its own steps' violations, a client refusing
some configurations is named in the ADP note, and no Hypothesis folder is left behind."""

from __future__ import annotations

from pathlib import Path

from kvfence.adapters import registry
from kvfence.adapters.clients import ReferenceClient
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.conformance.cli import main
from kvfence.conformance.runner import run_check
from kvfence.conformance.trace import read_trace
from kvfence.model.vocabulary import PauseMode


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
    """FP8 off used to leave an FP8 kv_cache_dtype in the server info, and the
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
    """The trace's verdict line once also listed the client table's violations, which
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


def test_a_partial_refusal_names_the_refusals_in_the_adp_note(tmp_path):
    """A client that raises on some configurations only is judged on each (a refusal is
    that configuration's CLI FAIL); the ADP note no longer says 'every call answered'
    alone."""

    class RaisesWhenUnreported:
        name = "raises-when-unreported"

        def resolve(self, policy, info):
            if info is None:
                raise RuntimeError("no server info")
            return ReferenceClient().resolve(policy, info)

    from kvfence.adapters import registry
    from kvfence.conformance.runner import run_check

    engine = registry.engine("reference")
    r = run_check(engine, RaisesWhenUnreported(), out_dir=tmp_path, max_examples=20)
    notes = {x.rule.id: x.reason for x in r.rules}
    assert r.verdict == "FAIL"
    assert "the client raised on CLI-002" in notes["ADP-001"]


# ----- 6. a focused run that FAILs on a set-aside example writes its counterexample -------


def test_focus_failing_on_a_set_aside_example_writes_a_counterexample(tmp_path):
    """Was: FAIL with counterexample None (nothing to replay)."""
    from kvfence.adapters import registry
    from kvfence.conformance.runner import run_check

    engine = registry.engine("guard-missing-on-disk")
    r = run_check(engine, ReferenceClient(), out_dir=tmp_path, focus="ENG-006", max_examples=60)
    assert r.verdict == "FAIL"
    assert r.counterexample is not None and r.counterexample.exists()
    assert r.caught() and set(r.caught()) <= {"ENG-001", "FC-001"}
    assert main(["replay", str(r.counterexample)]) == 1  # it reproduces
