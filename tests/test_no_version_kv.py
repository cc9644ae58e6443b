"""No waiver for KV of no version: KV computed while the weights were mixed, torn or garbage
is never covered by an opt-out (PF-28, CD-18 in shared/cases/deployments-and-failures.md)."""

from __future__ import annotations

import pytest

from kvfence.adapters import registry
from kvfence.adapters.cases import BY_ID
from kvfence.conformance.replay import replay_actions
from kvfence.model.checks import check_served
from kvfence.model.rules import RuleId
from kvfence.model.state import Served, Use
from kvfence.model.vocabulary import GARBAGE, MIXED


def _served(old: int) -> Served:
    """A standard-lane hit under version 1 on KV tagged ``old``, after an opt-out update."""
    return Served(
        endpoint=0,
        prefix="P",
        weights=1,
        uses=frozenset({Use("target", old), Use("target", 1)}),
        current=frozenset({Use("target", 1)}),
        sampled=frozenset({1}),
        hit=True,
        exact=False,
        waived=True,
    )


def test_the_opt_out_waives_kv_of_whole_older_weights():
    assert check_served(_served(0)) == []


@pytest.mark.parametrize("tag", [MIXED, GARBAGE], ids=["mixed", "garbage"])
def test_no_opt_out_covers_kv_of_no_version(tag):
    assert [v.rule for v in check_served(_served(tag))] == [RuleId.INV_001]


def _replay(engine: str):
    case = BY_ID["PF-28"]
    return replay_actions(
        registry.engine(engine),
        registry.client("reference"),
        case.configs,
        case.policy,
        list(case.actions),
    )


def test_pf28_the_racing_forward_is_stale_reuse_under_the_opt_out():
    r = _replay("in-place-pause-races-weight-write")
    assert r.kind == "FAIL" and [v.rule for v in r.violations] == [RuleId.INV_001]
    assert r.run.lines[-1]["step"] == 4  # the request that attends to it


def test_cd18_draining_the_overlapped_forward_passes():
    r = _replay("drains-overlap-before-write")
    assert r.kind == "PASS", [str(v) for v in r.violations]
    assert len(r.run.actions) == len(BY_ID["PF-28"].actions)
