"""SGLang's data-parallel flush fan-in, run for real (``adapters.sglang_host.dp_flush``):
the real ``FanOutCommunicator`` fans ``FlushCacheReqInput`` out to two real schedulers and
the real ``TokenizerControlMixin.flush_cache`` answers with what it makes of the two
replies. Judged by the spec's ranked semantics (RNK-001, sgl-project/sglang PR #39562,
PF-25): a flush reports success only if every rank flushed."""

from __future__ import annotations

import multiprocessing

import pytest
from test_sglang_engine import need

from kvfence.adapters import sglang_host
from kvfence.adapters.sglang_engine import sglang_home
from kvfence.model import semantics as spec
from kvfence.model.actions import FlushCache, ServeRequest, StartRequest
from kvfence.model.state import Config, initial_state

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
    """{busy rank: what dp_flush measured}, both in one spawned process."""
    need("0.5.23")
    path = str((sglang_home() / "0.5.23").resolve())
    out = {}
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        for busy in (1, 0):
            work = str(tmp_path_factory.mktemp(f"dp{busy}"))
            out[busy] = pool.apply(
                sglang_host.dp_flush, ({"sglang_path": path, "workdir": work, "busy_rank": busy},)
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


def test_the_same_merge_is_honest_when_rank_0_refuses(measured):
    """Order decides: with the refusing rank first the merged reply is a refusal."""
    seen = measured[0]
    assert seen["ranks"] == [False, True] and seen["merged"] is False
