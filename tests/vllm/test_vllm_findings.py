"""Public vLLM faults, replayed on the real vLLM 0.32 CPU engine (issue 13, item 3).

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
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from kvfence.adapters.registry import client
from kvfence.adapters.vllm_engine import VllmAdapter
from kvfence.conformance.replay import Replayed, replay_actions
from kvfence.model.actions import (
    ContinueGeneration,
    PauseGeneration,
    ServeRequest,
    StartRequest,
    UpdateWeights,
)
from kvfence.model.state import Policy
from kvfence.model.vocabulary import Funnel, PauseMode

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    adapter = VllmAdapter("offline", log_dir=tmp_path_factory.mktemp("vllm-log"), progress=False)
    yield adapter
    adapter.close()


def run(adapter: VllmAdapter, actions, *, fail_closed: bool, label_updates: bool) -> Replayed:
    adapter.fail_closed, adapter.label_updates = fail_closed, label_updates
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
