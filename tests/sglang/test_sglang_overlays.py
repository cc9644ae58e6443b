"""Fork overlays written for kvfence's tests, judged on upstream SGLang 0.5.23's scheduler.

* ``assert_guard``: an exact-lane guard whose fail-closed is a bare ``assert``. Safe with
  assertions on (the refused forced flush stops the scheduler); under ``python -O``
  (``SglangAdapter(optimize=True)``, ``kvfence check --optimize``) the check is gone, the
  refused flush is ignored and the update reports success over the old tree (ENG-001).
* ``fork_funnels``: the seed fork's own funnels (two-phase prepare/complete, sparse
  delta), found on the overlaid manager and driven through their own request types.
* ``torn_resumes``: a tensor update whose load fails midway answers a clean failure and
  the scheduler keeps serving on torn weights (FC-004), where upstream's process exits.

Each adapter runs one endpoint (one host process) to keep the lane's CI cost small.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_sglang_engine import need, observed, rules, script

from kvfence.adapters.sglang_engine import SglangAdapter
from kvfence.model.actions import (
    FaultUpdateFailsMidway,
    ServeRequest,
    Sleep,
    StartRequest,
    UpdateWeights,
    WakeUp,
)
from kvfence.model.vocabulary import Funnel, MemoryTag

pytestmark = pytest.mark.sglang

OVERLAYS = Path(__file__).parent / "overlays"

REFUSED_FORCED_FLUSH = [StartRequest(0, "r1", "P"), UpdateWeights(0, 1, Funnel.DISK, False)]
"""On the exact lane: a request holds KV, so the guard's forced flush is refused."""


@pytest.fixture(scope="module", params=[False, True], ids=["asserts-on", "python-O"])
def assert_guard(request):
    need("0.5.23")
    adapter = SglangAdapter(
        "0.5.23", overlay=OVERLAYS / "assert_guard", lanes=("exact",), optimize=request.param
    )
    yield adapter
    adapter.close()


def test_assert_guard_is_fail_closed_only_while_asserts_run(assert_guard):
    bad, steps = script(assert_guard, REFUSED_FORCED_FLUSH)
    assert assert_guard.loaded["optimize"] == int(assert_guard.optimize)
    if not assert_guard.optimize:
        assert bad == []  # fail-closed by stopping (FC-001 allows it on an exact lane)
        assert observed(steps)["status"] == "stopped"
        assert "AssertionError: exact lane" in observed(steps)["detail"]
    else:
        assert "ENG-001" in rules(bad), bad  # the update reports success over the old tree
        assert observed(steps)["status"] == "ok"
        assert [e["version"] for e in observed(steps)["view"]["cache"]] == [0]


def test_assert_guard_still_flushes_an_idle_exact_lane(assert_guard):
    """The flush itself is not inside the ``assert``: an idle update flushes either way."""
    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.DISK, False)]
    bad, steps = script(assert_guard, actions)
    assert bad == [] and observed(steps)["view"]["cache"] == []


def test_fork_funnels_run_through_their_own_methods():
    need("0.5.23")
    adapter = SglangAdapter("0.5.23", overlay=OVERLAYS / "fork_funnels", lanes=("exact",))
    try:
        adapter.start(adapter.fixed_configs)
        assert Funnel.TWO_PHASE in adapter.funnels and Funnel.SPARSE_DELTA in adapter.funnels
        for funnel in (Funnel.TWO_PHASE, Funnel.SPARSE_DELTA):
            bad, steps = script(adapter, [ServeRequest(0, "P"), UpdateWeights(0, 1, funnel, False)])
            assert rules(bad) == {"ENG-001"}, (funnel, bad)  # no guard on the fork's funnels
            bad, steps = script(adapter, [ServeRequest(0, "P"), UpdateWeights(0, 1, funnel, True)])
            assert bad == [] and observed(steps)["view"]["cache"] == []
        # the two-phase update ran the fork's prepare (receivers armed), then its complete
        bad, steps = script(
            adapter, [ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.TWO_PHASE, True)]
        )
        assert observed(steps)["detail"].startswith("stub runner: receivers armed;")
    finally:
        adapter.close()


def test_torn_update_that_resumes_serving_fails_fc_004(tmp_path):
    need("0.5.23")
    adapter = SglangAdapter(
        "0.5.23", overlay=OVERLAYS / "torn_resumes", lanes=("standard",), fault_funnel="tensor"
    )
    try:
        actions = [ServeRequest(0, "P"), FaultUpdateFailsMidway(0, 1), ServeRequest(0, "P")]
        bad, steps = script(adapter, actions)
    finally:
        adapter.close()
    assert rules(bad) == {"FC-004"}, bad
    seen = observed(steps)
    assert seen["status"] == "rejected"  # answered, and the process lives on ...
    assert seen["view"]["weights"] is None and seen["view"]["label"] == 0  # ... torn
    assert "Failed to update weights from tensor" in seen["detail"]


KV = frozenset({MemoryTag.KV_CACHE})


def test_release_with_a_request_running_is_safe_only_while_asserts_run(assert_guard):
    """Upstream's own release (the overlay changes only the update's flush): its idle
    ``assert`` is all that keeps a release from running while a request holds KV. With it,
    the scheduler stops; under ``python -O`` the release goes on, its flush is refused
    (``is_fully_idle`` is false) and ignored, and the resumed KV memory is indexed by the
    old tree: MEM-002's mechanism with a real request (the spec draws no Sleep with a
    request in flight, so this is driven directly)."""
    assert_guard.start(assert_guard.fixed_configs)
    assert_guard.apply(ServeRequest(0, "P"))
    assert_guard.apply(StartRequest(0, "r1", "Q"))
    released = assert_guard.apply(Sleep(0, KV))
    if not assert_guard.optimize:
        assert released.status.value == "stopped"
        assert "release_memory_occupation should be called only when server is idle" in (
            released.detail
        )
        return
    assert released.status.value == "ok"
    resumed = assert_guard.apply(WakeUp(0, KV))
    assert {e.prefix for e in resumed.view.cache} == {"P", "Q"}  # indexed over garbage
