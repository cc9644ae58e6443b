"""Public vLLM faults, replayed on the real vLLM 0.32 CPU engine.

Each finding is a short action sequence run in lockstep with the model
(``conformance.replay.replay_actions``): the raw engine (no client-side fail-closed guard,
no label updates: ``--engine vllm-raw``) FAILs with the rule the public report is about,
and the same engine PASSes when its client does the right thing. One engine serves every
case: ``fail_closed`` and ``label_updates`` are read at each action, so a case flips them.

* Refused reset under running requests: ``reset_prefix_cache`` answers ``False`` while a
  request holds blocks (``BlockPool.reset_prefix_cache``); an update that ignores it keeps
  serving the old KV under the new weights (FC-002). Reproduces on 0.32.
* Keep-mode pause spanning an update: ``pause(mode="keep")`` freezes requests with their
  blocks, so the reset after the reload is refused (FC-002 again). Reproduces on 0.32;
  a ``retract`` pause (a reset with ``reset_running_requests=True``, which preempts the
  running requests) or an ``abort`` pause PASSes.
* Label vs weights: ``collective_rpc("reload_weights")`` never changes the label that
  ``/weight_info`` / ``LLM.get_weight_version`` report (INV-003). Reproduces on 0.32; a
  client that calls ``update_weight_version`` after each reload PASSes.
* Same-name LoRA reload (vllm-project/vllm #42125, open on 0.32): new adapter bytes written
  over the old directory and loaded in place under the same name
  (``add_lora(LoRARequest(name, id, path, load_inplace=True))``) leave the old revision's
  blocks reachable, because 0.32 keys a LoRA block by ``("lora", name, path)``
  (``_gen_lora_extra_hash_keys``; PR #27211 replaced ``lora_int_id`` by the name). The next
  LoRA request hits KV of the old bytes: ENG-007 (cache probe) and INV-001 (bytes).
  Reproduces on 0.32; a client that saves each revision to its own directory PASSes
  (unfixed upstream: PR #42495 was closed, PR #48352, content-derived keys, is open).
* Label-only publish unchecked (``PublishVersion``): vLLM's
  ``update_weight_version`` sets any label (``RLOfflineMixin.update_weight_version``, "Set
  the weight version without updating weights"; route ``POST /update_weight_version``), so
  a publish of a version the weights are not is accepted: PUB-001. The guarded engine checks
  the weights probe first and PASSes.
* Label inside a two-phase window: after ``start_weight_update`` and a chunk,
  vLLM still reports the last committed label (``get_weight_version``: "Return the latest
  committed weight version") on mixed weights, and it does not refuse a request there (a
  forward pass on meta layers raises; the adapter refuses on its behalf). WIN-001 asks for
  a refusal or no label; the model expects no label once a chunk landed: the raw engine
  FAILs WIN-001 at the chunk. The guarded client withdraws the label at the first chunk
  (``update_weight_version`` to a name of no version) and restores it by the finish or
  abort: PASS.
"""

from __future__ import annotations

import pytest

from kvfence.adapters.registry import client
from kvfence.adapters.vllm_engine import VllmAdapter
from kvfence.conformance.replay import Replayed, replay_actions
from kvfence.model.actions import (
    AbortWeightUpdate,
    BeginWeightUpdate,
    ContinueGeneration,
    FinishWeightUpdate,
    LoadLora,
    PauseGeneration,
    PublishVersion,
    ServeRequest,
    StartRequest,
    UpdateWeightChunk,
    UpdateWeights,
)
from kvfence.model.state import Policy
from kvfence.model.vocabulary import Funnel, PauseMode

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    adapter = VllmAdapter(
        "offline", log_dir=tmp_path_factory.mktemp("vllm-log"), progress=False, lora=True, rl=True
    )
    yield adapter
    adapter.close()


def run(
    adapter: VllmAdapter,
    actions,
    *,
    fail_closed: bool,
    label_updates: bool,
    lora_fresh_path: bool = True,
) -> Replayed:
    adapter.fail_closed, adapter.label_updates = fail_closed, label_updates
    adapter.lora_fresh_path = lora_fresh_path
    return replay_actions(
        adapter, client("reference"), adapter.fixed_configs, Policy(), actions, timeout=300
    )


def rules(replayed: Replayed) -> list[str]:
    return [v.rule for v in replayed.violations]


def describe(replayed: Replayed) -> str:
    lines = [f"{replayed.kind} {replayed.message}"]
    lines += [str(v) for v in replayed.violations]
    return "\n".join(lines)


REFUSED_RESET = [
    StartRequest(0, "r1", "P"),
    UpdateWeights(0, 1, Funnel.TENSOR, True),
    ServeRequest(0, "P"),
]


def keep_spanning_update(mode: PauseMode) -> list:
    return [
        StartRequest(0, "r1", "P"),
        PauseGeneration(0, mode),
        UpdateWeights(0, 1, Funnel.TENSOR, True),
        ContinueGeneration(0),
        ServeRequest(0, "P"),
    ]


def test_refused_reset_under_running_request_fails_raw_engine(vllm):
    replayed = run(vllm, REFUSED_RESET, fail_closed=False, label_updates=True)
    assert replayed.kind == "FAIL", describe(replayed)
    assert rules(replayed) == ["FC-002"], describe(replayed)
    assert "status" in replayed.violations[0].where


def test_refused_reset_under_running_request_passes_fail_closed_client(vllm):
    replayed = run(vllm, REFUSED_RESET, fail_closed=True, label_updates=True)
    assert replayed.kind == "PASS", describe(replayed)


def test_keep_mode_request_spanning_update_fails_raw_engine(vllm):
    replayed = run(
        vllm, keep_spanning_update(PauseMode.IN_PLACE), fail_closed=False, label_updates=True
    )
    assert replayed.kind == "FAIL", describe(replayed)
    assert rules(replayed) == ["FC-002"], describe(replayed)


@pytest.mark.parametrize("mode", [PauseMode.RETRACT, PauseMode.ABORT])
def test_retract_or_abort_pause_spanning_update_passes_raw_engine(vllm, mode):
    replayed = run(vllm, keep_spanning_update(mode), fail_closed=False, label_updates=True)
    assert replayed.kind == "PASS", describe(replayed)


def test_label_not_updated_by_reload_fails_raw_engine(vllm):
    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.TENSOR, True)]
    replayed = run(vllm, actions, fail_closed=True, label_updates=False)
    assert replayed.kind == "FAIL", describe(replayed)
    assert rules(replayed) == ["INV-003"], describe(replayed)
    assert "label" in replayed.violations[0].where


def test_label_updated_by_client_passes(vllm):
    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, Funnel.TENSOR, True)]
    replayed = run(vllm, actions, fail_closed=True, label_updates=True)
    assert replayed.kind == "PASS", describe(replayed)


LORA_RELOAD = [
    ServeRequest(0, "P", lora=True),
    LoadLora(0),
    ServeRequest(0, "P", lora=True),
]


def test_same_name_lora_reload_fails_raw_engine(vllm):
    """vllm-project/vllm #42125 on 0.32: same name, same path, new bytes, load_inplace."""
    replayed = run(vllm, LORA_RELOAD, fail_closed=False, label_updates=False, lora_fresh_path=False)
    assert replayed.kind == "FAIL", describe(replayed)
    assert rules(replayed)[0] == "ENG-007", describe(replayed)
    assert set(rules(replayed)) <= {"ENG-007", "INV-001"}, describe(replayed)
    assert "cache" in replayed.violations[0].where, describe(replayed)


def test_same_name_lora_reload_to_fresh_path_passes(vllm):
    """The client's fix on 0.32: each revision in its own directory (a new key)."""
    replayed = run(vllm, LORA_RELOAD, fail_closed=False, label_updates=False, lora_fresh_path=True)
    assert replayed.kind == "PASS", describe(replayed)


def test_same_path_new_lora_int_id_still_hits_old_blocks(vllm):
    """0.32 leaves ``lora_int_id`` out of the block key (PR #27211: the name replaced it), so
    a new id does not separate revisions either: the bytes at the same path change, the
    next LoRA request still reports cached tokens and differs from a salted cold run."""
    from kvfence.adapters.tiny_model import write_tiny_lora
    from kvfence.adapters.vllm_engine import LORA_NAME, prompt_for

    vllm.lora_fresh_path = False
    vllm.start(vllm.fixed_configs)
    driver = vllm._driver
    prompt = prompt_for("P")
    first = driver.generate(prompt, 8, lora=True)
    assert first.cached_tokens == 0
    path = write_tiny_lora(vllm.workdir / "lora" / "adapter", 7)
    driver.load_lora(path, LORA_NAME, lora_id=2)
    again = driver.generate(prompt, 8, lora=True)
    cold = driver.generate(prompt, 8, lora=True, cache_salt="kvfence-test-new-id")
    assert again.cached_tokens > 0
    assert cold.cached_tokens == 0
    assert again.logprobs != cold.logprobs


PUBLISH_AHEAD = [ServeRequest(0, "P"), PublishVersion(0, 1), ServeRequest(0, "P")]


def test_publish_ahead_of_the_weights_fails_raw_engine(vllm):
    """vLLM's ``update_weight_version`` is unchecked: label 1 on weights 0 (PUB-001)."""
    replayed = run(vllm, PUBLISH_AHEAD, fail_closed=False, label_updates=False)
    assert replayed.kind == "FAIL", describe(replayed)
    assert rules(replayed) == ["PUB-001"], describe(replayed)
    assert "status" in replayed.violations[0].where, describe(replayed)


def test_publish_ahead_of_the_weights_refused_by_guarded_client(vllm):
    replayed = run(vllm, PUBLISH_AHEAD, fail_closed=True, label_updates=True)
    assert replayed.kind == "PASS", describe(replayed)


WINDOW = [
    ServeRequest(0, "P"),
    BeginWeightUpdate(0, 1),
    UpdateWeightChunk(0),
    ServeRequest(0, "P"),
    FinishWeightUpdate(0, True),
    ServeRequest(0, "P"),
]


def test_committed_label_inside_a_window_fails_raw_engine(vllm):
    replayed = run(vllm, WINDOW, fail_closed=False, label_updates=False)
    assert replayed.kind == "FAIL", describe(replayed)
    assert rules(replayed)[0] == "WIN-001", describe(replayed)
    # Inside the window vLLM's probe shows mixed weights (no whole version) under its last
    # committed label: neither a staged chunk (old weights, old label) nor a landed one
    # (mixed weights, no label) explains it. The violation names the first branch's field.
    assert replayed.violations[0].where in ("endpoint 0 view.label", "endpoint 0 view.weights")
    views = [
        line["observed"]["view"]
        for line in replayed.run.lines
        if (line.get("observed") or {}).get("view")
    ]
    assert any(v["weights"] is None and v["label"] == 0 for v in views), views


@pytest.mark.parametrize("end", [FinishWeightUpdate(0, True), AbortWeightUpdate(0)])
def test_window_with_label_withdrawn_passes_guarded_client(vllm, end):
    actions = [*WINDOW[:4], end, ServeRequest(0, "P")]
    replayed = run(vllm, actions, fail_closed=True, label_updates=True)
    assert replayed.kind == "PASS", describe(replayed)
