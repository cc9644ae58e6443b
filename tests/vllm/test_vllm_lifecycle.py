"""The vLLM adapter's lifecycle actions, each dispatched by ``apply`` against
the real vLLM 0.32 CPU engine: ``PauseGeneration(clear_cache)``, ``PublishVersion``, the
native two-phase update (``BeginWeightUpdate`` / ``UpdateWeightChunk`` /
``FinishWeightUpdate`` / ``AbortWeightUpdate``, on kvfence's ``kvfence-disk`` transfer
backend) and the restart oracle (``Response.fresh``).

Each test reads what the action did through the adapter's probes (cache probe: vLLM's
block pool; label: ``get_weight_version``; weights: the worker's parameters) and the
driver, so a mapping that does nothing, or the wrong thing, fails here.
"""

from __future__ import annotations

import time

import pytest

from kvfence.adapters.vllm_engine import MIXED_LABEL, VllmAdapter
from kvfence.model.actions import (
    AbortWeightUpdate,
    BeginWeightUpdate,
    ContinueGeneration,
    FinishRequest,
    FinishWeightUpdate,
    FlushCache,
    PauseGeneration,
    PublishVersion,
    ServeRequest,
    StartRequest,
    UpdateWeightChunk,
    UpdateWeights,
)
from kvfence.model.capabilities import Capability as C
from kvfence.model.observation import Observation
from kvfence.model.vocabulary import Funnel, PauseMode, Status

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    adapter = VllmAdapter(
        "offline", log_dir=tmp_path_factory.mktemp("vllm-log"), progress=False, rl=True
    )
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
    obs = fresh.apply(PauseGeneration(0, PauseMode.ABORT, clear_cache=False))
    assert cached(obs) == {"P"}
    assert obs.flushed is None


@pytest.mark.parametrize("mode", [PauseMode.ABORT, PauseMode.RETRACT])
def test_pause_with_clear_cache_empties_the_cache(fresh, mode):
    serve(fresh)
    serve(fresh, "Q")
    obs = fresh.apply(PauseGeneration(0, mode, clear_cache=True))
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
    obs = fresh.pause_generation(PauseMode.IN_PLACE, clear_cache=True)  # not drawn: no apply
    assert cached(obs) == set(), obs
    assert obs.flushed is True
    assert obs.aborted == frozenset()  # kept, not aborted
    assert fresh._driver.waiting() == 1  # preempted: back in the waiting queue


# ----- PublishVersion --------------------------------------------------------------------


def test_publish_version_sets_the_label_only(fresh):
    """Guarded: a publish of the version the weights probe shows whole goes through
    ``update_weight_version`` and touches neither weights nor cache."""
    fresh.apply(UpdateWeights(0, 1, Funnel.DISK, True))
    serve(fresh)
    fresh._driver.set_weight_version("default")  # a label that lags the weights
    obs = fresh.apply(PublishVersion(0, 1))
    assert obs.status is Status.OK, obs
    assert obs.view is not None
    assert obs.view.label == 1
    assert fresh._driver.weight_version() == "1"  # read back: LLM.get_weight_version()
    assert obs.view.weights == 1  # no weights moved
    assert cached(obs) == {"P"}  # and no cache touched


def test_publish_of_a_version_the_weights_are_not_is_refused_when_guarded(fresh):
    """vLLM sets the label unchecked; the guarded engine checks the weights probe first
    (PUB-001), so the label stays where it was."""
    obs = fresh.apply(PublishVersion(0, 1))
    assert obs.status is Status.REJECTED, obs
    assert "live weights are v0" in obs.detail
    assert fresh._driver.weight_version() == "default"


def test_raw_publish_sets_any_label(fresh):
    """The raw engine passes the publish to vLLM as is: label 1 on weights 0."""
    fresh.label_updates = False
    try:
        obs = fresh.apply(PublishVersion(0, 1))
    finally:
        fresh.label_updates = True
    assert obs.status is Status.OK
    assert obs.view is not None and (obs.view.weights, obs.view.label) == (0, 1)


def test_publish_version_with_abort_requests_aborts_held_requests(fresh):
    fresh.apply(StartRequest(0, "r1", "P"))
    obs = fresh.apply(PublishVersion(0, 0, abort_requests=True))
    assert obs.aborted == frozenset({"r1"})
    assert fresh._driver.held() == frozenset()
    assert obs.view is not None and obs.view.label == 0


def test_publish_version_without_abort_keeps_held_requests(fresh):
    fresh.apply(StartRequest(0, "r1", "P"))
    obs = fresh.apply(PublishVersion(0, 0))
    assert obs.status is Status.OK and obs.aborted == frozenset()
    assert len(fresh._driver.held()) == 1


# ----- the native two-phase update ---------------------------------------------------------


def test_begin_sends_nothing_until_the_first_chunk(fresh):
    """``BeginWeightUpdate`` opens the window in kvfence only: vLLM's
    ``start_weight_update`` moves every layer to meta, so it goes with chunk 1; until then
    the engine serves its old weights (the model's begin)."""
    before = serve(fresh)
    begun = fresh.apply(BeginWeightUpdate(0, 1))
    assert fresh._driver.window is None
    assert begun.view is not None and (begun.view.weights, begun.view.label) == (0, 0)
    again = serve(fresh)
    assert again.response is not None and before.response is not None
    assert again.response.output == before.response.output
    chunk = fresh.apply(UpdateWeightChunk(0))
    assert fresh._driver.window is not None
    assert "start_weight_update(v1)" in chunk.detail and "1 pending" in chunk.detail


def test_inside_the_window_requests_are_refused_and_the_label_withdrawn(fresh):
    """WIN-001: once a chunk landed, nothing is served (REJECTED, no exception: vLLM cannot
    run a forward pass on meta layers) and the guarded engine's label names no version.
    The raw engine shows vLLM's own label there: the last committed one."""
    fresh.apply(StartRequest(0, "r1", "Q"))
    fresh.apply(BeginWeightUpdate(0, 1))
    chunk = fresh.apply(UpdateWeightChunk(0))
    assert chunk.view is not None and (chunk.view.weights, chunk.view.label) == (None, None)
    assert fresh._driver.weight_version() == MIXED_LABEL
    refused = fresh.apply(ServeRequest(0, "P"))
    assert refused.status is Status.REJECTED and "meta device" in refused.detail
    assert fresh.apply(StartRequest(0, "r2", "P")).status is Status.REJECTED
    ended = fresh.apply(FinishRequest(0, "r1"))
    assert ended.status is Status.REJECTED and ended.aborted == frozenset({"r1"})
    fresh.start(fresh.fixed_configs)
    fresh.label_updates = False
    try:
        fresh.apply(BeginWeightUpdate(0, 1))
        raw = fresh.apply(UpdateWeightChunk(0))
    finally:
        fresh.label_updates = True
    assert raw.view is not None and raw.view.label == 0  # "default": committed, not live
    assert fresh._driver.weight_version() == "default"


def test_two_phase_update_moves_weights_and_label_but_keeps_the_cache(fresh):
    serve(fresh)
    fresh.apply(BeginWeightUpdate(0, 1))
    fresh.apply(UpdateWeightChunk(0))
    done = fresh.apply(FinishWeightUpdate(0, flush_cache=False))
    assert done.view is not None
    assert (done.view.weights, done.view.label) == (1, 1)
    assert cached(done) == {"P"}  # finish_weight_update never resets the prefix cache
    stale = serve(fresh)
    assert stale.response is not None and stale.response.hit is True
    assert stale.response.output != stale.response.cold  # KV of v0 under v1 weights


def test_two_phase_update_with_flush_matches_an_in_place_reload(fresh):
    serve(fresh)
    fresh.apply(BeginWeightUpdate(0, 1))
    done = fresh.apply(FinishWeightUpdate(0, flush_cache=True))  # every chunk lands
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
    fresh.apply(BeginWeightUpdate(0, 1))
    fresh.apply(UpdateWeightChunk(0))
    obs = fresh.apply(AbortWeightUpdate(0))
    assert obs.view is not None
    assert (obs.view.weights, obs.view.label) == (0, 0)
    assert fresh._driver.window is None
    fresh.apply(FlushCache(0))
    after = serve(fresh)
    assert before.response is not None and after.response is not None
    assert after.response.output == before.response.output


def test_abort_before_any_chunk_sends_nothing(fresh):
    fresh.apply(BeginWeightUpdate(0, 1))
    obs = fresh.apply(AbortWeightUpdate(0))
    assert "nothing sent" in obs.detail and fresh._driver.window is None
    assert obs.view is not None and (obs.view.weights, obs.view.label) == (0, 0)


# ----- the restart oracle -------------------------------------------------------------------


def test_offline_engine_declares_the_lifecycle_capabilities(vllm):
    wired = {C.PUBLISH, C.PAUSE_CLEAR, C.TWO_PHASE, C.RESTART_ORACLE, C.DERIVED}
    assert wired <= vllm.capabilities
    assert vllm.fixed_configs[0].derived is True
    assert not {C.SLEEP, C.MEMORY_TAGS, C.FAULTS} & vllm.capabilities


def test_fresh_bytes_come_from_a_freshly_started_engine(fresh, capsys):
    """``Response.fresh``: the prompt's output from a second engine started at the version
    loaded now. It equals the in-engine cold prefill (fresh ``cache_salt``) after a reload
    to v, differs between versions, and is computed once per (prefix, version)."""
    t0 = time.monotonic()
    f1 = fresh.fresh_bytes("P", 1)
    first = time.monotonic() - t0
    t0 = time.monotonic()
    assert fresh.fresh_bytes("P", 1) == f1
    again = time.monotonic() - t0
    fresh.apply(UpdateWeights(0, 1, Funnel.DISK, True))
    served = serve(fresh)
    assert served.response is not None
    assert served.response.fresh == f1 == served.response.cold
    f0 = fresh.fresh_bytes("P", 0)
    assert f0 != f1
    with capsys.disabled():
        print(f"\nrestart oracle: first fresh_bytes {first:.1f} s, cached {again * 1000:.2f} ms")
    assert again < 0.1
