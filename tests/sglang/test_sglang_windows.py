"""A fork's two-phase update windows and memory release on the SGLang lane.

Windows go through the code under test's own window (``SglangAdapter(window=True)``;
``sglang_host.Endpoint.window_mechanism``): a fork's prepare/complete pair where the
(overlaid) manager has one, upstream's ``begin/end_weight_update`` session otherwise. Two
fork overlays written for these tests, each judged on upstream 0.5.23's scheduler (one
endpoint, standard lane, one host each):

* ``careless_fork``: the prepare registers the live parameters for the trainer's writes
  (the seed fork's P2P shape): the chunks land where the forward reads while the old label
  stays, so WIN-001 FAILs at the first chunk, and a failed chunk leaves torn weights under
  that label (WIN-003). Its release is upstream's, which drops its flush's answer: MEM-002
  once that flush is refused.
* ``careful_fork``: the prepare arms receivers into staging buffers and the complete swaps
  them in (the seed fork's NCCL shape): WIN-001..003 hold; its release checks the flush's
  answer and resets the index at the resume: MEM-002 holds.

Upstream's own session and release are measured in test_sglang_engine.py (its host).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_sglang_engine import need, observed, rules, script

from kvfence.adapters.sglang_engine import SglangAdapter
from kvfence.model.actions import (
    AbortWeightUpdate,
    BeginWeightUpdate,
    FaultChunkFails,
    FaultRefuseFlush,
    FinishWeightUpdate,
    ServeRequest,
    Sleep,
    UpdateWeightChunk,
    WakeUp,
)
from kvfence.model.capabilities import Capability
from kvfence.model.vocabulary import Funnel, MemoryTag

pytestmark = pytest.mark.sglang

OVERLAYS = Path(__file__).parent / "overlays"

OPEN = [ServeRequest(0, "P"), BeginWeightUpdate(0, 1, Funnel.TWO_PHASE)]
WHOLE = [*OPEN, UpdateWeightChunk(0), ServeRequest(0, "Q"), FinishWeightUpdate(0, True)]
FAILED = [*OPEN, FaultChunkFails(0), UpdateWeightChunk(0), FinishWeightUpdate(0, True)]
ABORTED = [*OPEN, UpdateWeightChunk(0), AbortWeightUpdate(0), ServeRequest(0, "P")]


def window_adapter(name: str):
    need("0.5.23")
    adapter = SglangAdapter("0.5.23", overlay=OVERLAYS / name, lanes=("standard",), window=True)
    yield adapter
    adapter.close()


@pytest.fixture(scope="module")
def live():
    yield from window_adapter("careless_fork")


@pytest.fixture(scope="module")
def staged():
    yield from window_adapter("careful_fork")


def test_window_capability_and_mechanism_come_from_the_code(staged):
    assert Capability.TWO_PHASE.value in staged.capabilities
    assert Capability.TWO_PHASE.value not in SglangAdapter("0.5.23").capabilities
    staged.start(staged.fixed_configs)
    assert staged.loaded["window"] == "two_phase"  # the overlay's prepare/complete pair
    assert Funnel.TWO_PHASE in staged.funnels and Funnel.BUCKETED in staged.funnels


def test_prepare_into_live_parameters_fails_win_001(live):
    bad, steps = script(live, WHOLE)
    assert rules(bad) == {"WIN-001"}, bad
    chunk = observed(steps)  # the first chunk: torn weights under the old label
    assert chunk["status"] == "ok" and "live parameters" in chunk["detail"]
    assert chunk["view"]["weights"] is None and chunk["view"]["label"] == 0


def test_failed_chunk_into_live_parameters_fails_win_003(live):
    bad, steps = script(live, FAILED)
    assert rules(bad) == {"WIN-003"}, bad
    failed = observed(steps)
    assert failed["status"] == "rejected"  # reported, but torn and still labelled v0
    assert failed["view"]["weights"] is None and failed["view"]["label"] == 0


def test_staged_window_holds_win_001_to_003(staged):
    bad, steps = script(staged, [*WHOLE, ServeRequest(0, "P")])
    assert bad == []
    assert observed(steps, 2)["view"]["weights"] == 0  # the chunk was staged aside
    assert observed(steps, 4)["detail"].endswith("staged weights swapped in")
    assert observed(steps)["view"]["weights"] == observed(steps)["view"]["label"] == 1
    bad, steps = script(staged, FAILED)
    assert bad == [] and observed(steps)["status"] == "rejected"  # nothing published
    assert observed(steps)["view"]["weights"] == observed(steps)["view"]["label"] == 0
    bad, steps = script(staged, ABORTED)
    assert bad == [] and observed(steps)["view"]["weights"] == 0


def test_session_window_on_the_overlay_host_is_upstreams(staged):
    """A window through another funnel goes through SGLang's own begin/end session (the
    overlay inherits it unchanged): its chunk lands in the live parameters under the old
    label, as on upstream (test_sglang_engine.py)."""
    actions = [ServeRequest(0, "P"), BeginWeightUpdate(0, 1, Funnel.TENSOR), UpdateWeightChunk(0)]
    bad, steps = script(staged, actions)
    assert rules(bad) == {"WIN-001"} and observed(steps)["detail"] == "stub runner: chunk loaded"


KV = frozenset({MemoryTag.KV_CACHE})
REFUSED_RELEASE = [ServeRequest(0, "P"), FaultRefuseFlush(0), Sleep(0, KV), WakeUp(0, KV)]
"""The refusal is spent on the flush inside ``release_memory_occupation``."""


def test_release_that_drops_its_flush_answer_fails_mem_002(live):
    bad, steps = script(live, REFUSED_RELEASE)
    assert rules(bad) == {"MEM-002"}, bad
    assert [e["version"] for e in observed(steps)["view"]["cache"]] == [0]  # back on resume


def test_release_that_checks_its_flush_answer_passes_mem_002(staged):
    bad, steps = script(staged, [*REFUSED_RELEASE, ServeRequest(0, "P")])
    assert bad == []
    assert [e["version"] for e in observed(steps, 2)["view"]["cache"]] == [0]  # refused
    assert observed(steps, 3)["view"]["cache"] == []  # reset at the resume
    assert observed(steps)["view"]["cache"][0]["version"] == 0  # P recomputed


def test_window_on_a_host_without_one_is_an_error_naming_it():
    """0.5.17 has neither a session nor a prepare/complete pair (skipped where it is not
    installed); asking for windows there is ERROR, never a verdict."""
    need("0.5.17")
    adapter = SglangAdapter("0.5.17", lanes=("standard",), window=True)
    try:
        with pytest.raises(Exception, match="no two-phase window"):
            adapter.start(adapter.fixed_configs)
    finally:
        adapter.close()
