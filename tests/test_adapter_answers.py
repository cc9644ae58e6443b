"""Adapter answers: an engine or client adapter that exits, answers a malformed observation
or plan, or leaves a flag unknown is judged for it (ERROR or ADP-002 naming the field,
unknown rather than off), never PASS."""

from __future__ import annotations

import pytest

from kvfence.adapters import registry
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.conformance.runner import run_check
from kvfence.model.client import Plan
from kvfence.model.observation import Observation
from kvfence.model.vocabulary import PauseMode


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
    # Reading a null flag as "off" is a parsing mistake: CLI-006 (not CLI-002, whose
    # parsing fallback could never fail).
    assert result.verdict == "FAIL" and "CLI-006" in result.caught()
