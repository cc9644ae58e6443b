"""SGLang's data-parallel fan-in, run for real (``adapters.sglang_host.dp_flush``,
``dp_update``): the real ``FanOutCommunicator`` fans a request out to two real schedulers
and the real ``TokenizerControlMixin`` method answers with what it makes of the two
replies. Judged by the spec's ranked semantics:

* the flush (RNK-001, sgl-project/sglang PR #39562, PF-25): success only if every rank
  flushed; 0.5.23 answers with the first rank's reply (SGL-R1);
* the IPC update (RNK-002, sgl-project/sglang PR #39534, PF-26): 0.5.23 refuses it under
  DP with a bare ``assert`` before sending anything; under ``python -O`` it is sent to both
  ranks and every reply is merged (no first reply any more), but a rank that failed is
  not rolled back and nothing closes the endpoint (SGL-R2).
"""

from __future__ import annotations

import pytest
from test_sglang_engine import need, observed, rules, script

from kvfence.adapters import sglang_engine as sge
from kvfence.adapters.sglang_engine import SglangAdapter, run_forked, sglang_home
from kvfence.model import semantics as spec
from kvfence.model.actions import (
    FaultRankUpdateFails,
    FlushCache,
    ServeRequest,
    StartRequest,
    UpdateWeights,
)
from kvfence.model.capabilities import Capability
from kvfence.model.state import Config, initial_state
from kvfence.model.vocabulary import MIXED, Funnel

pytestmark = pytest.mark.sglang


def allowed_flush_replies(busy_rank: int) -> dict[str, str]:
    """What the spec allows the endpoint to answer, status -> the rule behind it, after
    both ranks served P and a request runs on ``busy_rank``."""
    state = initial_state((Config(ranks=2),))
    for action in (
        ServeRequest(0, "P", rank=0),
        ServeRequest(0, "P", rank=1),
        StartRequest(0, "r1", "P", rank=busy_rank),
    ):
        state = spec.step(state, action)[0][0]
    return {
        o.observation.status.value: o.because.status for _, o in spec.step(state, FlushCache(0))
    }


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """{busy rank: what dp_flush measured} and {(False, failing rank): what dp_update
    measured with assertions on}, each run in a process of its own (``run_forked``)."""
    need("0.5.23")
    path = str((sglang_home() / "0.5.23").resolve())
    out = {}
    for busy in (1, 0):
        work = str(tmp_path_factory.mktemp(f"dp{busy}"))
        out[busy] = run_forked(path, "dp_flush", {"workdir": work, "busy_rank": busy})
    for failing in (None, 1):  # the IPC update with assertions on
        work = str(tmp_path_factory.mktemp("dpu"))
        out[False, failing] = run_forked(
            path, "dp_update", {"workdir": work, "failing_rank": failing}
        )
    return out


def test_the_spec_allows_only_a_refusal_when_one_rank_refuses():
    assert allowed_flush_replies(1) == {"rejected": "RNK-001"}
    assert allowed_flush_replies(0) == {"rejected": "RNK-001"}


def test_first_reply_merge_reports_success_while_rank_1_kept_its_tree(measured):
    """0.5.23's ``flush_cache`` returns the first DP scheduler's reply (``[0]``): rank 0
    flushed, rank 1 refused and still matches P, and the caller is told success: RNK-001."""
    seen = measured[1]
    assert seen["ranks"] == [True, False] and seen["cached"] == [False, True]
    assert seen["merged"] is True
    assert "ok" not in allowed_flush_replies(1)  # the spec: RNK-001 FAIL


def test_a_spawned_run_measures_what_a_forked_one_does(measured, monkeypatch, tmp_path):
    """Where no zygote starts, ``run_forked`` spawns the run (importing SGLang there):
    the same measurement; a function that is not a whole run is refused by name."""
    monkeypatch.setattr(sge, "_zygote_for", lambda path, optimize: None)
    path = str((sglang_home() / "0.5.23").resolve())
    job = {"workdir": str(tmp_path), "busy_rank": 1}
    assert run_forked(path, "dp_flush", job) == measured[1]
    with pytest.raises(ValueError, match="main"):
        run_forked(path, "main", job)


def test_the_same_merge_is_honest_when_rank_0_refuses(measured):
    """Order decides: with the refusing rank first the merged reply is a refusal."""
    seen = measured[0]
    assert seen["ranks"] == [False, True] and seen["merged"] is False


def allowed_after_rank_failure() -> list[tuple[str, list[int], bool]]:
    """Every answer the spec allows to an IPC update failing on rank 1: (status, each
    rank's weights, whether the endpoint is closed)."""
    state = spec.step(initial_state((Config(ranks=2),)), FaultRankUpdateFails(0, 1))[0][0]
    out = []
    for s2, o in spec.step(state, UpdateWeights(0, 1, Funnel.IPC, True)):
        ep = s2.endpoint(0)
        out.append((o.observation.status.value, [r.weights for r in ep.ranks], ep.torn))
    return out


@pytest.fixture(scope="module")
def updates(measured, tmp_path_factory):
    """{(optimize, failing rank): what dp_update measured}: with assertions on (from
    ``measured``), and under ``python -O`` (``run_forked(optimize=True)``: a process
    started under ``PYTHONOPTIMIZE``, as ``SglangAdapter(optimize=True)``'s hosts are)."""
    path = str((sglang_home() / "0.5.23").resolve())
    out = {k: v for k, v in measured.items() if isinstance(k, tuple)}
    for failing in (None, 1):
        work = str(tmp_path_factory.mktemp("dpu"))
        job = {"workdir": work, "failing_rank": failing}
        out[True, failing] = run_forked(path, "dp_update", job, optimize=True)
    return out


def test_ipc_update_under_dp_is_refused_before_anything_is_sent(updates):
    """0.5.23: ``update_weights_from_ipc`` asserts ``dp_size == 1`` inside its ``try``:
    the caller is told failure and no rank got the update (RNK-002 holds: every rank at
    its old weights)."""
    for failing in (None, 1):
        seen = updates[False, failing]
        assert seen["sent"] == 0 and seen["weights"] == [0, 0]
        assert seen["merged"][0] is False
        assert "data-parallel replicas are not supported" in seen["merged"][1]


def test_ipc_update_under_python_o_merges_every_reply_but_leaves_ranks_torn(updates):
    """SGL-R2: with the ``assert`` gone the update reaches both ranks. The merge is every
    reply's (``merge_results``): a clean update succeeds, one failing on rank 1 reports
    failure (PF-26's first reply is gone). But rank 0 stays at v1 beside rank 1's torn
    weights and the endpoint stays open: the spec allows only every rank at its old
    weights or the endpoint closed (RNK-002)."""
    assert updates[True, None]["merged"][0] is True
    assert updates[True, None]["weights"] == [1, 1]
    seen = updates[True, 1]
    assert seen["sent"] == 2 and seen["merged"][0] is False
    assert seen["weights"] == [1, MIXED]
    allowed = allowed_after_rank_failure()
    assert {status for status, _, _ in allowed} == {"rejected"}
    assert all(closed or weights == [0, 0] for _, weights, closed in allowed)
    assert not any(weights[0] == 1 and not closed for _, weights, closed in allowed)


# ----- the fan-in inside the lockstep: an endpoint of two real schedulers --------------


@pytest.fixture(scope="module")
def ranked(shared):
    """One standard-lane endpoint of two DP ranks (``SglangAdapter(ranks=2)``): two real
    schedulers in one host, behind SGLang's own flush and disk-update fan-in."""
    need("0.5.23")
    adapter = SglangAdapter("0.5.23", lanes=("standard",), ranks=2)
    yield shared(adapter)
    adapter.close()


BOTH_SERVED = [ServeRequest(0, "P", rank=0), ServeRequest(0, "P", rank=1)]


def test_ranked_lane_judges_the_first_reply_flush_rnk_001(ranked):
    """SGL-R1 in lockstep: a request on rank 1, ``FlushCache`` -> success while rank 1
    still holds P: RNK-001 FAIL. With the request on rank 0 the reply is a refusal (PASS)."""
    assert Capability.RANKS.value in ranked.capabilities
    bad, steps = script(ranked, [*BOTH_SERVED, StartRequest(0, "r1", "P", rank=1), FlushCache(0)])
    assert rules(bad) == {"RNK-001"}, bad
    seen = observed(steps)
    assert seen["status"] == "ok" and seen["flushed"] is True
    assert [e["version"] for e in seen["view"]["cache"]] == [0]  # rank 1 kept P
    bad, steps = script(ranked, [*BOTH_SERVED, StartRequest(0, "r1", "P", rank=0), FlushCache(0)])
    assert bad == [] and observed(steps)["flushed"] is False


def test_ranked_lane_judges_a_rank_that_fails_its_update_rnk_002(ranked):
    """A disk update failing on rank 1 (it rolls back) through the real
    ``TokenizerManager.update_weights_from_disk``: every reply is merged, so the caller is
    told failure, but rank 0 keeps v1 and the endpoint stays open: RNK-002 FAIL."""
    actions = [ServeRequest(0, "P"), FaultRankUpdateFails(0, 1), UpdateWeights(0, 1, Funnel.DISK)]
    bad, steps = script(ranked, actions)
    assert "RNK-002" in rules(bad), bad
    seen = observed(steps)
    assert seen["status"] == "rejected" and "Rolling back" in seen["detail"]
    assert seen["view"]["weights"] is None and seen["view"]["label"] == 0  # split, v0 label
    assert ranked.funnels == (Funnel.DISK,)  # tensor, distributed, ipc assert dp_size == 1
