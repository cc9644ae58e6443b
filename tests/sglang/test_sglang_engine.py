"""Upstream SGLang's scheduler control plane on CPU under kvfence (adapters.sglang_engine).

Endpoint 0 is an exact lane (``rl_on_policy_target`` set), endpoint 1 a standard lane; both
have the radix cache on. Scripted runs pin the findings on 0.5.23 to the rules they break:

* ENG-001: on the exact lane an update with ``flush_cache=False`` succeeds and leaves the old
  prefix matchable in the real tree, on every upstream funnel (disk, tensor, distributed,
  ipc): no guard is tied to ``rl_on_policy_target``.
* FC-002: with a request running, an update with ``flush_cache=True`` installs the new
  weights, moves the label and reports ``success=False`` (FC-001 holds), but nothing closes
  the endpoint: the stale prefix is served again.

and what 0.5.23 does right (a refused /flush_cache reports it, retract-then-update flushes,
the standard lane flushes only when asked). ``run_check`` with the ``ci`` budget must FAIL
on ENG-001. A broken harness is ERROR (ADP-001), never a verdict.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from kvfence.adapters import sglang_engine as sge
from kvfence.adapters.clients import ReferenceClient
from kvfence.adapters.sglang_engine import SglangAdapter
from kvfence.conformance.errors import ConformanceFailure
from kvfence.conformance.lockstep import Lockstep
from kvfence.conformance.record import Recorder
from kvfence.conformance.runner import run_check
from kvfence.conformance.trace import step_json
from kvfence.model import semantics as spec
from kvfence.model.actions import (
    AbortWeightUpdate,
    Action,
    BeginWeightUpdate,
    ContinueGeneration,
    FaultChunkFails,
    FaultRefuseFlush,
    FaultUpdateFailsMidway,
    FlushCache,
    PauseGeneration,
    ServeRequest,
    Sleep,
    StartRequest,
    UpdateWeightChunk,
    UpdateWeights,
    WakeUp,
)
from kvfence.model.state import Policy, initial_state
from kvfence.model.vocabulary import CacheMode, Funnel, MemoryTag, PauseMode, Status

pytestmark = pytest.mark.sglang

OVERLAYS = Path(__file__).parent / "overlays"
"""Fork overlays written for these tests: ``exact_guard`` (an exact-lane guard that stops
on a refused flush) and ``broken`` (reads an attribute no SGLang has)."""


def need(version: str) -> None:
    """Skip, naming the install command, unless ``version`` is in its folder under
    ``$KVFENCE_SGLANG_HOME`` (default ``.sglang``) and torch imports."""
    home = Path(os.environ.get("KVFENCE_SGLANG_HOME", ".sglang"))
    if not (home / version / "sglang").is_dir() or importlib.util.find_spec("torch") is None:
        pytest.skip(
            f"SGLang {version} is not installed: run `bash scripts/install-sglang.sh {version}`"
        )


UPSTREAM_FUNNELS = (Funnel.DISK, Funnel.TENSOR, Funnel.DISTRIBUTED, Funnel.IPC)


@pytest.fixture(scope="module")
def sglang(shared):
    need("0.5.23")
    adapter = SglangAdapter("0.5.23")
    yield shared(adapter)
    adapter.close()


def script(adapter: Any, actions: list[Action], policy: Policy = Policy()) -> tuple[list, Any]:
    """Run ``actions`` in lockstep from a fresh start: the violations of the first failing
    step (empty if none) and the lockstep (its ``steps`` hold every observation)."""
    steps = Lockstep(adapter, ReferenceClient(), Recorder())
    steps.start(adapter.fixed_configs, policy)
    for action in actions:
        try:
            steps.run(action)
        except ConformanceFailure as failure:
            return failure.violations, steps
    return [], steps


def rules(violations: list) -> set[str]:
    return {v.rule for v in violations}


def observed(steps: Any, index: int = -1) -> dict[str, Any]:
    """The observation of step ``index`` in its trace form (``conformance/trace.py``)."""
    return step_json(steps.steps[index])["observed"]


# ----- what 0.5.23 gets wrong -----------------------------------------------------------


@pytest.mark.parametrize("funnel", UPSTREAM_FUNNELS, ids=lambda f: f.value)
def test_exact_lane_keeps_old_prefix_when_not_asked_to_flush(sglang, funnel):
    bad, steps = script(sglang, [ServeRequest(0, "P"), UpdateWeights(0, 1, funnel, False)])
    assert rules(bad) == {"ENG-001"}, bad
    seen = observed(steps)
    assert seen["status"] == "ok"  # SGLang reports success...
    assert [e["version"] for e in seen["view"]["cache"]] == [0]  # ...and P's v0 KV stays
    assert seen["view"]["weights"] == 1 and seen["view"]["label"] == 1


def test_refused_requested_flush_reports_failure_but_keeps_serving(sglang):
    """0.5.23's ``success=False`` case: weights and label move on, the tree keeps the old
    prefix, and nothing stops the endpoint from serving it (FC-002)."""
    actions = [
        StartRequest(1, "r1", "Q"),
        UpdateWeights(1, 1, Funnel.DISK, True),
        ServeRequest(1, "Q"),
    ]
    bad, steps = script(sglang, actions)
    update = observed(steps, 1)
    assert update["status"] == "rejected"
    assert "cache was not flushed" in update["detail"]
    assert update["view"]["weights"] == 1 and update["view"]["label"] == 1
    assert rules(bad) == {"FC-002"}, bad
    assert observed(steps)["status"] == "ok"  # served from the stale tree


def test_ci_run_fails_on_the_exact_lane_guard(sglang, tmp_path):
    """scripts/check-sglang.sh's run: searched until ENG-001 is shown; the findings met on
    the way (FC-004 for a distributed update failing midway, FC-001/002 for a refused
    flush, LIV-002 for a resume of memory never released, MEM-002 for a refusal spent on
    the release's flush) FAIL too."""
    result = run_check(sglang, ReferenceClient(), out_dir=tmp_path, focus="ENG-001")
    assert result.verdict == "FAIL", result.error
    assert result.engine_version == sglang.version  # the release the hosts imported
    assert "ENG-001" in result.caught()
    known = {"ENG-001", "FC-001", "FC-002", "FC-004", "LIV-002", "MEM-002"}
    assert set(result.caught()) <= known, result.violations
    assert result.counterexample is not None and result.steps <= 3
    verdicts = {r.rule.id: r.verdict for r in result.rules}
    assert verdicts["ADP-001"] == "PASS" and verdicts["ADP-002"] == "PASS"
    assert verdicts["INV-004"] == "SKIP"  # no model runs: no byte oracle
    # faults and memory tags reach the real scheduler code: no longer SKIP
    assert verdicts["FC-004"] != "SKIP" and verdicts["MEM-001"] != "SKIP"


# ----- what 0.5.23 does right -----------------------------------------------------------


def test_standard_lane_flushes_only_when_asked(sglang):
    none = Policy(mode=CacheMode.NONE)  # a client that opts out: the caller's choice holds
    kept = [ServeRequest(1, "P"), UpdateWeights(1, 1, Funnel.TENSOR, False), ServeRequest(1, "P")]
    bad, steps = script(sglang, kept, none)
    assert bad == [] and observed(steps)["view"]["cache"][0]["version"] == 0
    flushed = [ServeRequest(1, "P"), UpdateWeights(1, 1, Funnel.DISK, True)]
    bad, steps = script(sglang, flushed)
    assert bad == [] and observed(steps)["view"]["cache"] == []


def test_flush_refused_while_a_request_runs_and_says_so(sglang):
    bad, steps = script(sglang, [StartRequest(0, "r1", "P"), FlushCache(0)])
    assert bad == []
    assert observed(steps)["status"] == "rejected" and observed(steps)["flushed"] is False


def test_retract_then_update_flushes_and_resumes_under_new_weights(sglang):
    actions = [
        StartRequest(0, "r1", "P"),
        PauseGeneration(0, PauseMode.RETRACT),
        UpdateWeights(0, 1, Funnel.DISK, True),
        ContinueGeneration(0),
    ]
    bad, steps = script(sglang, actions)
    assert bad == []
    assert observed(steps, 2)["view"]["cache"] == []
    assert [e["version"] for e in observed(steps)["view"]["cache"]] == [1]  # recomputed


def test_in_place_pause_blocks_the_flush(sglang):
    actions = [
        StartRequest(1, "r1", "P"),
        PauseGeneration(1, PauseMode.IN_PLACE),
        UpdateWeights(1, 1, Funnel.DISK, True),
    ]
    bad, steps = script(sglang, actions)
    assert bad == [] and observed(steps)["status"] == "rejected"


def test_server_info_is_the_real_build_server_info(sglang):
    sglang.start(sglang.fixed_configs)
    assert sglang.server_info(0) == {"disable_radix_cache": False, "rl_on_policy_target": "fsdp"}
    assert sglang.server_info(1) == {"disable_radix_cache": False, "rl_on_policy_target": None}
    assert {k: sglang.loaded[k] for k in ("version", "tree", "optimize")} == {
        "version": "0.5.23",
        "tree": "UnifiedRadixCache",
        "optimize": 0,
    }


def test_funnels_are_those_the_code_has(sglang):
    """0.5.23's manager has disk, tensor, distributed and ipc, and bucketed (tensor calls in
    a begin/end session); no two-phase and no sparse delta: those are N/A, never sent down
    another path, and the checker draws no update through them."""
    sglang.start(sglang.fixed_configs)
    upstream = (Funnel.DISK, Funnel.TENSOR, Funnel.DISTRIBUTED, Funnel.IPC, Funnel.BUCKETED)
    assert sglang.funnels == upstream
    from kvfence.adapters.protocol import Unsupported

    with pytest.raises(Unsupported, match="no two_phase funnel"):
        sglang.apply(UpdateWeights(0, 1, Funnel.TWO_PHASE, False))
    steps = Lockstep(sglang, ReferenceClient(), Recorder())
    steps.start(sglang.fixed_configs, Policy())
    drawn = {a.funnel for a in steps.enabled_actions() if hasattr(a, "funnel")}
    assert drawn and drawn <= set(upstream)


# ----- faults through the real code paths -------------------------------------------------


@pytest.mark.parametrize(
    ("funnel", "status", "weights", "broken"),
    [
        # model_runner weight_updater: "partially updated. Please discard the whole
        # weights", and the manager answers success=False with no flush and the old label:
        # torn weights, labelled v0, serving on from the old tree
        ("distributed", "rejected", None, {"FC-004"}),
        # no try around the tensor load: the exception leaves the handler, the process exits
        ("tensor", "stopped", None, {"FC-004"}),
        # the disk loader reloads the original checkpoint: rolled back, whole, labelled
        ("disk", "rejected", 0, set()),
    ],
)
def test_update_failing_midway_per_funnel(sglang, monkeypatch, funnel, status, weights, broken):
    """``FaultUpdateFailsMidway`` through the real manager: the stub runner fails the load
    after some tensors landed and answers as upstream's model runner does for that funnel
    (``sglang_stubs.FUNNEL_FAILURES``); what follows is upstream's own handling."""
    monkeypatch.setattr(sglang.inner, "fault_funnel", funnel)
    bad, steps = script(sglang, [ServeRequest(1, "P"), FaultUpdateFailsMidway(1, 1)])
    assert rules(bad) == broken, bad
    seen = observed(steps)
    assert seen["status"] == status
    if status != "stopped":
        assert seen["view"]["weights"] == weights and seen["view"]["label"] == 0
        assert [e["version"] for e in seen["view"]["cache"]] == [0]  # the old tree stays


def test_injected_refusal_reaches_the_real_flush(sglang):
    """``FaultRefuseFlush`` refuses the next flush attempt at ``Scheduler.flush_cache``:
    ``/flush_cache`` answers success=false through the real flush wrapper, then succeeds;
    an update's requested flush is refused the same way (0.5.23: FC-002, as with a
    running request)."""
    bad, steps = script(sglang, [ServeRequest(1, "P"), FaultRefuseFlush(1), FlushCache(1)])
    assert bad == [] and observed(steps)["flushed"] is False
    assert observed(steps)["view"]["cache"] != []
    actions = [ServeRequest(1, "P"), FaultRefuseFlush(1), UpdateWeights(1, 1, Funnel.DISK, True)]
    bad, steps = script(sglang, [*actions, ServeRequest(1, "P")])
    assert rules(bad) == {"FC-002"} and "not flushed" in observed(steps, 2)["detail"]


# ----- upstream's update session as a two-phase window ------------------------------------


def test_session_chunk_serves_torn_weights_under_the_old_label(sglang, monkeypatch):
    """docs/findings.md, SGL-W1: 0.5.23's ``begin_weight_update`` .. ``end_weight_update``
    session is the two-phase window (``window=True``, set here on the module's host). A
    non-final ``update_weights_from_tensor`` chunk (``flush_cache=False``, no
    ``weight_version``) lands in the live parameters, the label stays v0 (the manager
    records ``None``: no change) and nothing holds generation between the calls (the
    tokenizer manager takes ``model_update_lock`` per call, not per session): WIN-001."""
    monkeypatch.setattr(sglang.inner, "window", True)
    open_ = [ServeRequest(0, "P"), BeginWeightUpdate(0, 1, Funnel.TENSOR)]
    bad, steps = script(sglang, [*open_, UpdateWeightChunk(0)])
    assert rules(bad) == {"WIN-001"}, bad
    seen = observed(steps)
    assert seen["status"] == "ok" and seen["detail"] == "stub runner: chunk loaded"
    assert seen["view"]["weights"] is None and seen["view"]["label"] == 0
    # no chunk yet: the session's begin changes nothing, and an abort (the trainer
    # re-sending the old weights, flush_cache=false) leaves v0 whole with its KV
    bad, steps = script(sglang, [*open_, AbortWeightUpdate(0), ServeRequest(0, "P")])
    assert bad == [] and observed(steps)["view"]["cache"][0]["version"] == 0


def test_session_chunk_that_fails_stops_the_scheduler(sglang, monkeypatch):
    """A chunk whose load fails midway: ``update_weights_from_tensor`` has no ``try``
    around the load, so the exception leaves the handler and the process exits (WIN-003
    wants a reported failure, rolled back or closed)."""
    monkeypatch.setattr(sglang.inner, "window", True)
    actions = [BeginWeightUpdate(1, 1, Funnel.TENSOR), FaultChunkFails(1), UpdateWeightChunk(1)]
    bad, steps = script(sglang, actions)
    assert rules(bad) == {"WIN-003"}, bad
    assert observed(steps)["status"] == "stopped"


def test_window_actions_are_unsupported_without_window(sglang):
    from kvfence.adapters.protocol import Unsupported

    sglang.start(sglang.fixed_configs)
    assert "two_phase" not in sglang.capabilities and sglang.loaded["window"] == "session"
    with pytest.raises(Unsupported, match="window=True"):
        sglang.apply(BeginWeightUpdate(0, 1, Funnel.TENSOR))


# ----- memory release and resume with tags ----------------------------------------------

KV = frozenset({MemoryTag.KV_CACHE})
WEIGHTS = frozenset({MemoryTag.WEIGHTS})


def test_release_kv_flushes_the_real_tree_and_resume_brings_nothing_back(sglang):
    actions = [ServeRequest(1, "P"), Sleep(1, KV), WakeUp(1, KV), ServeRequest(1, "P")]
    bad, steps = script(sglang, actions)
    assert bad == []
    assert observed(steps, 1)["view"]["cache"] == []  # ENG-006: the index went with the KV
    assert observed(steps, 2)["view"]["cache"] == []  # MEM-002: nothing came back
    bad, steps = script(sglang, [ServeRequest(1, "P"), Sleep(1, WEIGHTS)])
    assert bad == [] and observed(steps)["view"]["cache"] != []  # weights only: kept


def test_colocated_order_updates_and_flushes_with_the_kv_released(sglang):
    """Release all, resume weights, update with flush, resume KV (MEM-001): the flush runs
    while the KV pools are released and answers."""
    actions = [
        ServeRequest(1, "P"),
        Sleep(1),
        WakeUp(1, WEIGHTS),
        UpdateWeights(1, 1, Funnel.TENSOR, True),
        FlushCache(1),
        WakeUp(1, KV),
        ServeRequest(1, "P"),
    ]
    bad, steps = script(sglang, actions)
    assert bad == [] and observed(steps, 3)["status"] == "ok"
    assert [e["version"] for e in observed(steps)["view"]["cache"]] == [1]


def test_refused_flush_inside_release_brings_the_index_back(sglang, monkeypatch):
    """docs/findings.md, SGL-M1: ``release_memory_occupation`` runs ``flush_cache()`` for
    the ``kv_cache`` tag and drops its answer. A refusal spent on that flush (the spec's
    Sleep allows it; ``refusal_at_release``, the default) leaves the tree indexing KV memory
    the release gave back, and the resume brings the index back: MEM-002. Held across the
    release instead, the refusal changes nothing there."""
    actions = [ServeRequest(1, "P"), FaultRefuseFlush(1), Sleep(1, KV), WakeUp(1, KV)]
    bad, steps = script(sglang, actions)
    assert rules(bad) == {"MEM-002"}, bad
    assert [e["version"] for e in observed(steps)["view"]["cache"]] == [0]
    assert sglang.inner.refusal_at_release is True
    monkeypatch.setattr(sglang.inner, "refusal_at_release", False)
    bad, steps = script(sglang, actions)
    assert bad == [] and observed(steps)["view"]["cache"] == []


def test_resuming_memory_never_released_stops_the_scheduler(sglang):
    """An availability finding: ``resume_memory_occupation`` removes each tag from its
    offload set (``offload_tags.remove``), so resuming every tag after releasing only the KV
    raises ``KeyError`` in the handler and the scheduler process exits (LIV-002)."""
    bad, steps = script(sglang, [Sleep(1, KV), WakeUp(1)])
    assert rules(bad) == {"LIV-002"}
    assert observed(steps)["status"] == "stopped" and "KeyError" in observed(steps)["detail"]


# ----- how hosts start ------------------------------------------------------------------


def _parent(pid: int) -> int:
    """The parent process ID of ``pid`` (``/proc/PID/stat``, field 4)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_hosts_fork_from_one_zygote_that_imported_sglang_once(sglang):
    """Every host is a fork of one zygote process (``sglang_host.zygote``) that imported
    SGLang once, shared by the adapters of this process: not a child of this process."""
    from kvfence.adapters.sglang_host import PRELOAD

    sglang.start(sglang.fixed_configs)
    other = SglangAdapter("0.5.23", lanes=("standard",))
    try:
        other.start(other.fixed_configs)
        hosts = [proc.pid for proc, _ in sglang.inner._hosts + other._hosts]
        parents = {_parent(pid) for pid in hosts}
        assert len(hosts) == 3 and len(parents) == 1 and os.getpid() not in parents
        assert other.loaded["version"] == "0.5.23" and other.loaded["tree"]
    finally:
        other.close()
    zygotes = [z for z in sge._ZYGOTES.values() if z is not None]
    assert {z._proc.pid for z in zygotes} >= parents
    assert all(set(PRELOAD) <= z.modules for z in zygotes)


def test_zygotes_are_kept_per_folder_flag_and_environment(monkeypatch):
    """One zygote per SGLang folder, ``-O`` flag and environment (a changed variable gets
    a new one: a host sees what a spawned one would), the least recently used closed
    beyond ``ZYGOTES_KEPT``; one that cannot start is ``None`` (hosts are spawned)."""
    closed = []

    class Fake:
        def __init__(self, path, optimize):
            if path == "dead":
                raise RuntimeError("no SGLang there")
            self.key = (path, optimize)

        def close(self):
            closed.append(self.key)

    monkeypatch.setattr(sge, "_Zygote", Fake)
    monkeypatch.setattr(sge, "_ZYGOTES", {})
    a = sge._zygote_for("a", False)
    assert sge._zygote_for("a", False) is a
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test")  # not part of the key
    assert sge._zygote_for("a", False) is a
    assert sge._zygote_for("dead", False) is None
    b = sge._zygote_for("a", True)
    assert b is not a and closed == []
    monkeypatch.setenv("SGLANG_SOME_SETTING", "1")
    c = sge._zygote_for("a", True)  # a third live one: the least recently used goes
    assert c is not b and closed == [("a", False)]
    assert sum(z is not None for z in sge._ZYGOTES.values()) == sge.ZYGOTES_KEPT


def test_an_overlay_of_a_preloaded_module_gets_a_spawned_host(tmp_path):
    """An overlay replacing a module the zygote imported (here an unmodified copy of
    ``schedule_batch.py``) must load before anything imports it: its host is spawned,
    a child of this process, and runs."""
    need("0.5.23")
    module = Path(SglangAdapter("0.5.23").sglang_path(), "sglang/srt/managers/schedule_batch.py")
    target = tmp_path / "sglang/srt/managers/schedule_batch.py"
    target.parent.mkdir(parents=True)
    target.write_text(module.read_text())
    adapter = SglangAdapter("0.5.23", overlay=tmp_path, lanes=("standard",))
    try:
        adapter.start(adapter.fixed_configs)
        ((proc, _),) = adapter._hosts
        assert _parent(proc.pid) == os.getpid()
        assert adapter.loaded["version"] == "0.5.23"
    finally:
        adapter.close()


# ----- the adapter's own breakage is ERROR, never a verdict -----------------------------


def test_missing_version_is_an_error_naming_the_install_command(tmp_path):
    result = run_check(SglangAdapter("0.0.1"), ReferenceClient(), out_dir=tmp_path)
    assert result.verdict == "ERROR" and result.caught() == ()
    assert result.engine_version is None  # no host started: no release to name
    assert "install-sglang.sh 0.0.1" in result.error


def test_broken_harness_is_adp_001_naming_version_and_attribute(tmp_path):
    need("0.5.23")
    adapter = SglangAdapter("0.5.23", overlay=OVERLAYS / "broken", lanes=("exact",))
    result = run_check(adapter, ReferenceClient(), out_dir=tmp_path)
    assert result.verdict == "ERROR" and result.caught() == ()
    assert "ADP-001" in result.error and "SGLang 0.5.23" in result.error
    assert "kvfence_attribute_that_no_sglang_has" in result.error


def test_apply_before_start_and_unknown_endpoint_are_failures(sglang):
    from kvfence.adapters.protocol import AdapterFailure

    with pytest.raises(AdapterFailure, match="before start"):
        SglangAdapter("0.5.23").apply(FlushCache(0))
    sglang.start(sglang.fixed_configs)
    with pytest.raises(AdapterFailure, match=r"endpoints 0\.\.1"):
        sglang.apply(FlushCache(2))


def test_stopped_status_is_known_to_the_adapter():
    """A handler that raises stops the endpoint; the adapter reports it as STOPPED, never OK."""
    adapter = SglangAdapter("0.5.23")
    out = {"status": "stopped", "detail": "RuntimeError: refused"}
    assert adapter._observation(out).status is Status.STOPPED


# ----- a fork's overlay: the exact-lane guard ---------------------------------------------


@pytest.fixture(scope="module")
def guarded(shared):
    need("0.5.23")
    adapter = SglangAdapter("0.5.23", overlay=OVERLAYS / "exact_guard")
    yield shared(adapter)
    adapter.close()


@pytest.mark.parametrize("funnel", UPSTREAM_FUNNELS, ids=lambda f: f.value)
def test_overlay_guard_turns_eng_001_from_fail_to_pass(sglang, guarded, funnel):
    actions = [ServeRequest(0, "P"), UpdateWeights(0, 1, funnel, False), ServeRequest(0, "P")]
    bad, _ = script(sglang, actions)
    assert rules(bad) == {"ENG-001"}
    bad, steps = script(guarded, actions)
    assert bad == []
    assert observed(steps, 1)["view"]["cache"] == []  # the forced flush emptied the tree
    assert observed(steps)["view"]["cache"][0]["version"] == 1  # P recomputed under v1


def test_overlay_leaves_the_standard_lane_alone(guarded):
    bad, steps = script(
        guarded,
        [ServeRequest(1, "P"), UpdateWeights(1, 1, Funnel.DISK, False)],
        Policy(mode=CacheMode.NONE),
    )
    assert bad == [] and observed(steps)["view"]["cache"][0]["version"] == 0


def test_overlay_refused_forced_flush_stops_the_endpoint(guarded):
    """A running request makes the forced flush refuse: the overlay raises out of the
    handler, and the endpoint stops instead of answering (SGLang's scheduler process exits).
    The adapter never reports that as OK."""
    guarded.start(guarded.fixed_configs)
    guarded.apply(StartRequest(0, "r1", "P"))
    obs = guarded.apply(UpdateWeights(0, 1, Funnel.DISK, False))
    assert obs.status is Status.STOPPED
    assert "RuntimeError: exact lane" in obs.detail
    assert guarded.apply(ServeRequest(0, "P")).status is Status.STOPPED


def test_overlay_refused_forced_flush_is_judged_fail_closed(guarded):
    """The spec's fail-closed-by-stopping: an engine that stops on a refused mandatory flush
    on an exact lane breaks no MUST rule."""
    actions = [StartRequest(0, "r1", "P"), UpdateWeights(0, 1, Funnel.DISK, False)]
    state = initial_state(guarded.fixed_configs)
    state = spec.step(state, actions[0])[0][0]
    allowed = {o.observation.status.value for _, o in spec.step(state, actions[1])}
    assert "stopped" in allowed  # the spec's fail-closed-by-stopping (FC-001, CD-07)
    bad, steps = script(guarded, actions)
    assert bad == [] and observed(steps)["status"] == "stopped"
