"""The vLLM adapter's building blocks for the lifecycle vocabulary (issue 13), each against
the real vLLM 0.32 CPU engine: pause with ``clear_cache``, a label-only publish, the native
two-phase update (on kvfence's ``kvfence-disk`` transfer backend) and the restart oracle.

The model actions these serve (``PauseGeneration(clear_cache)``, ``PublishVersion``,
``BeginWeightUpdate`` / ``UpdateWeightChunk`` / ``FinishWeightUpdate`` /
``AbortWeightUpdate``, ``Response.fresh``) land on other branches; until then the tests call
the adapter's methods directly and read what they did through the adapter's probes (cache
probe: vLLM's block pool; label: ``get_weight_version``; weights: the worker's parameters).
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("vllm")

from kvfence.adapters.protocol import AdapterFailure
from kvfence.adapters.vllm_engine import VllmAdapter
from kvfence.model.actions import (
    ContinueGeneration,
    FlushCache,
    ServeRequest,
    StartRequest,
    UpdateWeights,
)
from kvfence.model.observation import Observation
from kvfence.model.vocabulary import Funnel, PauseMode, Status

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    adapter = VllmAdapter("offline", log_dir=tmp_path_factory.mktemp("vllm-log"), progress=False)
    yield adapter
    adapter.close()


@pytest.fixture
def fresh(vllm):
    """The engine at v0, empty cache, nothing held (what each example starts from)."""
    vllm.start(vllm.fixed_configs)
    return vllm


def cached(obs: Observation) -> set[str]:
    assert obs.view is not None
    return {e.prefix for e in obs.view.cache}


def serve(adapter: VllmAdapter, prefix: str = "P") -> Observation:
    obs = adapter.apply(ServeRequest(0, prefix))
    assert obs.status is Status.OK
    return obs


# ----- PauseGeneration(clear_cache) ----------------------------------------------------


def test_pause_without_clear_cache_keeps_the_cache(fresh):
    serve(fresh)
    obs = fresh.pause_generation(PauseMode.ABORT, clear_cache=False)
    assert cached(obs) == {"P"}
    assert obs.flushed is None


@pytest.mark.parametrize("mode", [PauseMode.ABORT, PauseMode.RETRACT])
def test_pause_with_clear_cache_empties_the_cache(fresh, mode):
    serve(fresh)
    serve(fresh, "Q")
    obs = fresh.pause_generation(mode, clear_cache=True)
    assert cached(obs) == set(), obs
    assert obs.flushed is True
    fresh.apply(ContinueGeneration(0))
    again = serve(fresh)
    assert again.response is not None and again.response.hit is False


def test_keep_pause_with_clear_cache_preempts_a_held_request(fresh):
    """vLLM's clear runs ``reset_prefix_cache(reset_running_requests=True)``: even in
    ``keep`` mode the held request loses its blocks (preempted, waiting to be prefilled
    again), so the clear succeeds instead of being refused."""
    fresh.apply(StartRequest(0, "r1", "P"))
    obs = fresh.pause_generation(PauseMode.IN_PLACE, clear_cache=True)
    assert cached(obs) == set(), obs
    assert obs.flushed is True
    assert obs.aborted == frozenset()  # kept, not aborted
    assert fresh._driver.waiting() == 1  # preempted: back in the waiting queue


# ----- PublishVersion --------------------------------------------------------------------


def test_publish_version_sets_the_label_only(fresh):
    serve(fresh)
    obs = fresh.publish_version(1)
    assert obs.view is not None
    assert obs.view.label == 1  # read back: LLM.get_weight_version() == "1"
    assert fresh._driver.weight_version() == "1"
    assert obs.view.weights == 0  # no weights moved
    assert cached(obs) == {"P"}  # and no cache touched


def test_publish_version_with_abort_requests_aborts_held_requests(fresh):
    fresh.apply(StartRequest(0, "r1", "P"))
    obs = fresh.publish_version(2, abort_requests=True)
    assert obs.aborted == frozenset({"r1"})
    assert fresh._driver.held() == frozenset()
    assert obs.view is not None and obs.view.label == 2


# ----- the native two-phase update ---------------------------------------------------------


def test_two_phase_update_moves_weights_and_label_but_keeps_the_cache(fresh):
    serve(fresh)
    begun = fresh.begin_weight_update(1)
    assert begun.view is not None and begun.view.weights is None  # half loaded: not read
    chunk = fresh.update_weight_chunk()
    assert "1 pending" in chunk.detail
    with pytest.raises(AdapterFailure, match="two-phase"):
        fresh.apply(ServeRequest(0, "P"))  # vLLM cannot serve inside the window
    done = fresh.finish_weight_update(flush_cache=False)
    assert done.view is not None
    assert (done.view.weights, done.view.label) == (1, 1)
    assert cached(done) == {"P"}  # finish_weight_update never resets the prefix cache
    stale = serve(fresh)
    assert stale.response is not None and stale.response.hit is True
    assert stale.response.output != stale.response.cold  # KV of v0 under v1 weights


def test_two_phase_update_with_flush_matches_an_in_place_reload(fresh):
    serve(fresh)
    fresh.begin_weight_update(1)
    done = fresh.finish_weight_update(flush_cache=True)  # finish lands the pending chunks
    assert done.status is Status.OK and cached(done) == set()
    after = serve(fresh)
    assert after.response is not None and after.response.hit is False
    two_phase_bytes = after.response.output
    fresh.start(fresh.fixed_configs)
    fresh.apply(UpdateWeights(0, 1, Funnel.DISK, True))
    reloaded = serve(fresh)
    assert reloaded.response is not None
    assert reloaded.response.output == two_phase_bytes  # bit for bit


def test_two_phase_abort_rolls_back(fresh):
    before = serve(fresh)
    fresh.begin_weight_update(1)
    fresh.update_weight_chunk()
    obs = fresh.abort_weight_update()
    assert obs.view is not None
    assert (obs.view.weights, obs.view.label) == (0, 0)
    fresh.apply(FlushCache(0))
    after = serve(fresh)
    assert before.response is not None and after.response is not None
    assert after.response.output == before.response.output


# ----- the restart oracle -------------------------------------------------------------------


def test_fresh_bytes_come_from_a_freshly_started_engine(fresh, capsys):
    """``fresh_bytes(prefix, v)``: a second engine started at checkpoint v. It equals the
    in-engine cold prefill (fresh ``cache_salt``) after a reload to v, differs between
    versions, and is computed once per (prefix, version)."""
    t0 = time.monotonic()
    f1 = fresh.fresh_bytes("P", 1)
    first = time.monotonic() - t0
    t0 = time.monotonic()
    assert fresh.fresh_bytes("P", 1) == f1
    again = time.monotonic() - t0
    fresh.apply(UpdateWeights(0, 1, Funnel.DISK, True))
    served = serve(fresh)
    assert served.response is not None and served.response.cold == f1
    f0 = fresh.fresh_bytes("P", 0)
    assert f0 != f1
    with capsys.disabled():
        print(f"\nrestart oracle: first fresh_bytes {first:.1f} s, cached {again * 1000:.2f} ms")
    assert again < 0.1
