"""``kvfence serve``: a trainer's HTTP sync calls, judged live against a kvfence engine.

Each test starts ``kvfence serve`` as a subprocess on a free loopback port, drives it with
httpx as a trainer would (pause, update with ``flush_cache``, continue, generate), stops it
with SIGTERM and reads its exit code, its verdict (``GET /kvfence/verdict``) and its trace,
which ``kvfence replay`` must judge the same way.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from attrs import evolve

from kvfence.conformance.serve import PENDING, ROUTES, Session
from kvfence.model.vocabulary import MemoryTag

KVFENCE = [sys.executable, "-m", "kvfence.conformance.cli"]


class Served:
    """A running ``kvfence serve``: ``url``, ``http`` (an httpx client), ``out``."""

    def __init__(self, proc: subprocess.Popen, url: str, out: Path) -> None:
        self.proc, self.url, self.out = proc, url, out
        self.http = httpx.Client(base_url=url, timeout=30.0, trust_env=False)
        self.code: int | None = None
        self.stdout = ""

    def stop(self) -> int:
        """SIGTERM, as a CI job ends a background server; the exit code."""
        self.http.close()
        self.proc.send_signal(signal.SIGTERM)
        self.stdout, _ = self.proc.communicate(timeout=60)
        self.code = self.proc.returncode
        return self.code


@contextmanager
def serve(
    tmp_path: Path, engine: str, api: str = "sglang", extra: tuple[str, ...] = ()
) -> Iterator[Served]:
    out = tmp_path / f"out-{api}"
    cmd = [*KVFENCE, "serve", "--api", api, "--engine", engine, "--port", "0", "--out", str(out)]
    cmd += extra
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": path}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", first)
        assert match, f"kvfence serve did not announce its port: {first!r}"
        served = Served(proc, f"http://127.0.0.1:{match.group(1)}", out)
        yield served
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


GENERATE = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4}}


def sync(http: httpx.Client, flush_cache: bool | None, path: str = "/ckpt/step-1") -> None:
    """The trainer's sync as slime / XoRL send it to SGLang: pause, update from disk,
    continue (``flush_cache`` omitted when ``None``)."""
    assert http.post("/pause_generation", json={"mode": "retract"}).status_code == 200
    body: dict[str, object] = {"model_path": path}
    if flush_cache is not None:
        body["flush_cache"] = flush_cache
    r = http.post("/update_weights_from_disk", json=body)
    assert r.status_code in (200, 400), r.text
    assert http.post("/continue_generation", json={}).status_code == 200


def rollout(http: httpx.Client) -> dict:
    r = http.post("/generate", json=GENERATE)
    assert r.status_code == 200, r.text
    return r.json()


def replay(trace: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*KVFENCE, "replay", str(trace), *extra], capture_output=True, text=True, timeout=120
    )


def test_reference_engine_and_a_flushing_trainer_pass(tmp_path):
    with serve(tmp_path, "reference") as s:
        info = s.http.get("/get_server_info").json()
        assert info["disable_radix_cache"] is False
        first = rollout(s.http)
        sync(s.http, flush_cache=True)
        second = rollout(s.http)
        assert second["meta_info"]["cached_tokens"] == 0  # flushed: nothing reused
        assert first["meta_info"]["weight_version"] == "default"
        assert second["meta_info"]["weight_version"] == "1"
        verdict = s.http.get("/kvfence/verdict").json()
        assert verdict["verdict"] == "PASS", verdict
        assert verdict["exit_code"] == 0
        assert s.stop() == 0, s.stdout
    assert "verdict: PASS" in s.stdout
    trace = Path(verdict["trace"])
    assert trace.is_file()
    for args in ((), ("--model-only",)):
        r = replay(trace, *args)
        assert r.returncode == 0, r.stdout + r.stderr


def test_a_session_that_never_asks_the_question_is_unknown(tmp_path):
    """Only a request after an update can show stale reuse: without one, never PASS."""
    with serve(tmp_path, "reference") as s:
        rollout(s.http)
        assert s.stop() == 2, s.stdout
    assert "verdict: UNKNOWN" in s.stdout


@pytest.mark.parametrize(
    ("engine", "flush_cache", "explicit_flush", "rule"),
    [
        # PF-08: the update is asked to flush and does not.
        ("update-never-flushes", True, False, "ENG-002"),
        # PF-22: /flush_cache claims success without flushing.
        ("flush-is-a-stub", False, True, "FC-003"),
        # A trainer that never flushes (PF-01) against a correct engine: stale reuse.
        ("reference", False, False, "INV-001"),
    ],
)
def test_faults_fail_with_their_rule_and_replay_to_it(
    tmp_path, engine, flush_cache, explicit_flush, rule
):
    with serve(tmp_path, engine) as s:
        rollout(s.http)
        assert s.http.post("/pause_generation", json={"mode": "retract"}).status_code == 200
        body = {"model_path": "/ckpt/step-1", "flush_cache": flush_cache}
        assert s.http.post("/update_weights_from_disk", json=body).status_code == 200
        if explicit_flush:
            s.http.post("/flush_cache")
        assert s.http.post("/continue_generation", json={}).status_code == 200
        rollout(s.http)
        verdict = s.http.get("/kvfence/verdict").json()
        assert verdict["verdict"] == "FAIL"
        assert rule in {v["rule"] for v in verdict["violations"]}, verdict["violations"]
        # The trainer's run goes on after the verdict: the server still answers.
        assert s.http.post("/generate", json=GENERATE).status_code == 200
        assert s.stop() == 1, s.stdout
    assert rule in s.stdout
    broken = {v["rule"] for v in verdict["violations"]}
    r = replay(Path(verdict["trace"]))
    assert r.returncode == 1, r.stdout + r.stderr
    assert set(re.findall(r"violated (\S+)", r.stdout)) == broken
    # The counterexample is shrunk towards any rule the session broke.
    r = replay(Path(verdict["counterexample"]))
    assert r.returncode == 1, r.stdout + r.stderr
    assert set(re.findall(r"violated (\S+)", r.stdout)) & broken


def test_bad_requests_get_the_engine_error_shape_and_do_not_crash(tmp_path):
    with serve(tmp_path, "reference") as s:
        r = s.http.post(
            "/update_weights_from_disk",
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 400
        assert r.json()["object"] == "error" and "not JSON" in r.json()["message"]
        r = s.http.post("/update_weights_from_disk", json={"flush_cache": True})
        assert r.status_code == 400 and "model_path" in r.json()["message"]
        r = s.http.post("/update_weights_from_disk", json={"model_path": "/x", "flush_cache": "y"})
        assert r.status_code == 400 and "flush_cache" in r.json()["message"]
        r = s.http.post("/pause_generation", json={"mode": "sideways"})
        assert r.status_code == 400 and "mode" in r.json()["message"]
        assert s.http.post("/no_such_route").json() == {"detail": "Not Found"}
        assert s.http.post("/no_such_route").status_code == 404
        # Generation while paused: the model does not enable it; the engine is not called.
        assert s.http.post("/pause_generation", json={}).status_code == 200
        r = s.http.post("/generate", json=GENERATE)
        assert r.status_code == 400 and "the endpoint is paused" in r.text
        assert s.http.post("/continue_generation", json={}).status_code == 200
        # A continue while running is SGLang's no-op success, not a step.
        assert s.http.post("/continue_generation", json={}).status_code == 200
        # A form of a route waiting for a model action: the engine's error shape, naming it.
        r = s.http.post("/generate", json={**GENERATE, "lora_path": "adapter-1"})
        assert r.status_code == 400 and "not loaded" in r.json()["message"]
        lora = {"lora_name": "adapter-1", "lora_path": "/ckpt/a"}
        assert s.http.post("/load_lora_adapter", json=lora).json()["success"] is True
        r = s.http.post("/load_lora_adapter", json={**lora, "lora_name": "adapter-2"})
        assert r.status_code == 501 and "LoadLora(second adapter)" in r.json()["message"]
        # Still serving, still judging.
        rollout(s.http)
        sync(s.http, flush_cache=True)
        rollout(s.http)
        verdict = s.http.get("/kvfence/verdict").json()
        assert verdict["verdict"] == "PASS", verdict
        assert any("LoadLora(second adapter)" in w for w in verdict["warnings"])
        assert s.stop() == 0, s.stdout
    log = json.loads(Path(verdict["trace"]).with_suffix(".traffic.json").read_text())
    statuses = [e["status"] for e in log["traffic"]]
    assert statuses.count(400) >= 5 and 404 in statuses and 501 in statuses


DEAD_ENGINE = """
from kvfence.adapters.protocol import AdapterFailure
from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
from kvfence.model.actions import ServeRequest


class Dies(InProcessAdapter):
    def apply(self, action):
        if isinstance(action, ServeRequest):
            raise AdapterFailure("engine process exited")
        return super().apply(action)


def dies():
    return Dies(ReferenceEndpoint, "dies")
"""


def test_dead_engine_call_is_an_error_not_a_pass(tmp_path):
    """An engine that raises is ERROR (ADP-001): the server answers 500, exits 2."""
    (tmp_path / "serve_dead_engine.py").write_text(DEAD_ENGINE)
    with serve(tmp_path, "serve_dead_engine:dies") as s:
        rollout_status = s.http.post("/generate", json=GENERATE).status_code
        assert rollout_status == 500
        verdict = s.http.get("/kvfence/verdict").json()
        assert verdict["verdict"] == "ERROR"
        assert s.stop() == 2, s.stdout


def test_vllm_routes(tmp_path):
    with serve(tmp_path, "reference", api="vllm") as s:
        completion = {"model": "kvfence-serve", "prompt": [11, 12, 13], "max_tokens": 4}
        first = s.http.post("/v1/completions", json=completion).json()
        assert len(first["choices"][0]["token_ids"]) == 4
        assert s.http.post("/pause", params={"mode": "abort", "clear_cache": "false"}).json() == {
            "status": "paused"
        }
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/step-1"}}
        assert s.http.post("/collective_rpc", json=rpc).json() == {"results": [None]}
        assert s.http.post("/reset_prefix_cache").json() == {"success": True}
        assert s.http.post("/resume").json() == {"status": "resumed"}
        r = s.http.post("/v1/completions", json=completion).json()
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        # vLLM's default clear_cache=true is a pause that flushes (PauseGeneration).
        assert s.http.post("/pause").json() == {"status": "paused"}
        assert s.http.get("/is_paused").json() == {"is_paused": True}
        assert s.http.post("/resume").json() == {"status": "resumed"}
        assert s.stop() == 0, s.stdout


def test_every_route_maps_to_one_action_or_a_pending_one():
    """The route table is the one place a route meets the model: each route names at
    most one model action, and every pending action is listed for the integrator."""
    from kvfence.model.actions import BY_NAME

    for r in ROUTES:
        assert r.action == "" or r.action in BY_NAME, r
        assert r.pending == "" or r.pending in PENDING, r
        assert r.action or r.pending or r.noop or r.methods == ("GET",), r
    for api in ("sglang", "vllm"):
        session = Session(api, "reference")
        for r in ROUTES:
            if r.api == api:
                assert callable(r.handler) and session.routes[r.path] is r, r


def test_a_fixed_endpoint_engine_is_served_with_its_own_endpoint():
    """A real engine declares one fixed endpoint (``fixed_configs``): serve uses it rather
    than the API's, so the engine's ``start`` accepts it."""
    from kvfence.adapters.reference import InProcessAdapter, ReferenceEndpoint
    from kvfence.conformance.serve import endpoint_config

    engine = InProcessAdapter(ReferenceEndpoint, "fixed")
    engine.fixed_configs = (evolve(endpoint_config("sglang"), flush_default=False),)
    session = Session("sglang", "fixed", engine=engine)
    assert session.config == engine.fixed_configs[0]
    assert session.error is None


def test_serve_refuses_a_remote_host_without_the_flag(tmp_path):
    r = subprocess.run(
        [*KVFENCE, "serve", "--api", "sglang", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3 and "--allow-remote" in r.stdout


# ----- lifecycle and two-phase routes, judged in process -----------------------------------------


class InProcess:
    """A ``Session`` driven without HTTP: ``post(path, body)`` / ``get(path)`` give
    ``(status, decoded body)``; ``verdict()`` the session's result."""

    def __init__(self, api: str, tmp_path: Path, engine: str = "reference") -> None:
        self.session = Session(api, engine, out_dir=tmp_path)

    def post(self, path: str, body: object = None) -> tuple[int, object]:
        raw = b"" if body is None else json.dumps(body).encode()
        status, kind, out = self.session.handle("POST", path, raw)
        return status, json.loads(out) if kind == "application/json" else out.decode()

    def get(self, path: str) -> tuple[int, object]:
        status, kind, out = self.session.handle("GET", path, b"")
        return status, json.loads(out) if kind == "application/json" else out.decode()

    def verdict(self):
        return self.session.result()

    def actions(self) -> list[str]:
        return [type(a).__name__ for a in self.session.lockstep.actions]


def test_sglang_colocated_sync_with_tags_and_a_published_version(tmp_path):
    """miles / verl against SGLang, colocated: release all, resume the weights, update,
    resume the KV, publish the version label; each route one model action."""
    s = InProcess("sglang", tmp_path)
    assert s.post("/generate", GENERATE)[0] == 200
    assert s.post("/release_memory_occupation", {}) == (200, None)
    assert s.post("/resume_memory_occupation", {"tags": ["weights"]}) == (200, None)
    update = {"model_path": "/ckpt/step-1", "flush_cache": True}
    assert s.post("/update_weights_from_disk", update)[1]["success"] is True
    assert s.post("/resume_memory_occupation", {"tags": ["kv_cache", "cuda_graph"]})[0] == 200
    status, body = s.post("/update_weight_version", {"new_version": "step-1"})
    assert status == 200 and body["success"] and body["new_version"] == "step-1"
    assert s.get("/get_server_info")[1]["weight_version"] == "step-1"
    assert s.post("/generate", GENERATE)[0] == 200
    assert s.actions() == [
        "ServeRequest",
        "Sleep",
        "WakeUp",
        "UpdateWeights",
        "WakeUp",
        "PublishVersion",
        "ServeRequest",
    ]
    steps = s.session.lockstep.actions
    assert steps[2].tags == {MemoryTag.WEIGHTS} and steps[4].tags == {MemoryTag.KV_CACHE}
    result = s.verdict()
    assert result.verdict == "PASS", [str(v) for v in result.violations]
    # bad input: the engine's 400, naming what was wrong; nothing stepped
    status, body = s.post("/release_memory_occupation", {"tags": ["gpu"]})
    assert status == 400 and "kv_cache" in body["message"]
    status, body = s.post("/update_weight_version", {"new_version": 3})
    assert status == 400 and "new_version" in body["message"]
    assert len(s.actions()) == 7


def test_a_label_names_the_version_it_was_given_to(tmp_path):
    """An update's ``weight_version`` names its version: publishing that label again after
    the next update labels the old version, which the weights no longer back (PUB-001's
    refusal on the reference engine: SGLang's own route would set it unchecked)."""
    s = InProcess("sglang", tmp_path)
    body = {"serialized_named_tensors": ["..."], "flush_cache": True, "weight_version": "a"}
    assert s.post("/update_weights_from_tensor", body)[1]["success"] is True
    assert s.get("/get_server_info")[1]["weight_version"] == "a"
    body = {**body, "weight_version": "b"}
    assert s.post("/update_weights_from_tensor", body)[1]["success"] is True
    status, answer = s.post("/update_weight_version", {"new_version": "a"})
    assert status == 400 and answer["success"] is False
    assert s.session.traffic[-1]["label"] == {"new_version": "a", "version": 1}
    assert s.get("/get_server_info")[1]["weight_version"] == "b"
    status, answer = s.post("/update_weight_version", {"new_version": "b2"})  # a new label
    assert status == 200 and s.get("/get_server_info")[1]["weight_version"] == "b2"


def test_sglang_colocated_update_without_flush_fails_inv_001(tmp_path):
    """The same sync with ``flush_cache: false`` and no /flush_cache: the old KV is
    reused after the wake-up (the lower tier is gone with the released KV only on device:
    this endpoint has no lower tier, so the update's flush is what protects it)."""
    s = InProcess("sglang", tmp_path)
    s.post("/generate", GENERATE)
    s.post("/release_memory_occupation", {"tags": ["weights"]})
    s.post("/resume_memory_occupation", {"tags": ["weights"]})
    s.post("/update_weights_from_disk", {"model_path": "/ckpt/step-1", "flush_cache": False})
    s.post("/generate", GENERATE)
    result = s.verdict()
    assert result.verdict == "FAIL" and "INV-001" in result.caught(), result.violations


TWO_PHASE_NATIVE = [
    ("/start_weight_update", None),
    (
        "/update_weights",
        {"update_info": {"names": ["w"], "dtype_names": ["bf16"], "shapes": [[2]]}},
    ),
    ("/finish_weight_update", {"weight_version": "v1"}),
]
TWO_PHASE_RPC = [
    ("/collective_rpc", {"method": "skyrl_start_weight_update", "kwargs": {}}),
    ("/collective_rpc", {"method": "update_weights_nccl", "kwargs": {"update_info": {}}}),
    ("/collective_rpc", {"method": "skyrl_finish_weight_update"}),
]
COMPLETION = {"model": "kvfence-serve", "prompt": [11, 12, 13], "max_tokens": 4}


@pytest.mark.parametrize("calls", [TWO_PHASE_NATIVE, TWO_PHASE_RPC], ids=["native", "rpc"])
@pytest.mark.parametrize("reset", [True, False], ids=["reset", "no-reset"])
def test_vllm_two_phase_update_is_judged(tmp_path, calls, reset):
    """vLLM's two-phase update (native routes, or SkyRL's /collective_rpc methods): with a
    /reset_prefix_cache after the finish the session PASSes; without one, the prompt cached
    before the update is reused after it: INV-001 (vLLM's finish does not flush), and the
    reset the endpoint required was never made (CLI-002)."""
    s = InProcess("vllm", tmp_path)
    assert s.post("/v1/completions", COMPLETION)[0] == 200
    assert s.post("/pause?mode=abort&clear_cache=false") == (200, {"status": "paused"})
    for path, body in calls:
        status, answer = s.post(path, body)
        assert status == 200, answer
    if reset:
        assert s.post("/reset_prefix_cache") == (200, {"success": True})
    assert s.post("/resume")[0] == 200
    status, answer = s.post("/v1/completions", COMPLETION)
    assert status == 200
    assert s.actions() == [
        "ServeRequest",
        "PauseGeneration",
        "BeginWeightUpdate",
        "UpdateWeightChunk",
        "FinishWeightUpdate",
        *(["FlushCache"] if reset else []),
        "ContinueGeneration",
        "ServeRequest",
    ]
    result = s.verdict()
    if reset:
        assert result.verdict == "PASS", [str(v) for v in result.violations]
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        if calls is TWO_PHASE_NATIVE:
            assert s.get("/weight_info")[1] == {"weight_version": "v1"}
    else:
        assert result.verdict == "FAIL" and "INV-001" in result.caught(), result.violations
        assert "CLI-002" in result.caught(), result.violations


def test_vllm_reset_under_a_keep_pause_fails_cli_007(tmp_path):
    """SkyRL's order: ``/pause?mode=keep`` (requests frozen with their KV), update, reset,
    resume. vLLM refuses a reset while running requests hold blocks unless
    ``reset_running_requests=true`` is in the query string: the reset under an in-place
    pause is PF-06's order, CLI-007."""
    s = InProcess("vllm", tmp_path)
    assert s.post("/v1/completions", COMPLETION)[0] == 200
    assert s.post("/pause?mode=keep&clear_cache=false") == (200, {"status": "paused"})
    for path, body in TWO_PHASE_NATIVE:
        assert s.post(path, body)[0] == 200
    assert s.post("/reset_prefix_cache") == (200, {"success": True})
    assert s.post("/resume")[0] == 200
    result = s.verdict()
    assert result.verdict == "FAIL" and result.caught() == ("CLI-007",), result.violations
    # the preempting reset is a form serve does not judge yet: 501, never a verdict
    status, body = s.post("/reset_prefix_cache?reset_running_requests=true")
    assert status == 501, body


def test_vllm_pause_that_clears_then_reload_passes_and_sleep_wake_with_tags(tmp_path):
    """Flush at pause (vLLM's default ``clear_cache=true``): the reload needs no flush of
    its own. Then vLLM's /sleep (tags ignored, as vLLM ignores them) and /wake_up by tag."""
    s = InProcess("vllm", tmp_path)
    s.post("/v1/completions", COMPLETION)
    assert s.post("/pause?mode=abort")[0] == 200
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/step-1"}}
    assert s.post("/collective_rpc", rpc)[0] == 200
    s.post("/resume")
    assert s.post("/v1/completions", COMPLETION)[0] == 200
    assert s.session.lockstep.actions[1].clear_cache is True
    assert s.post("/sleep?level=2&tags=weights") == (200, "")
    assert s.post("/wake_up?tags=weights") == (200, "")
    assert s.post("/wake_up?tags=kv_cache") == (200, "")
    assert s.actions()[-3:] == ["Sleep", "WakeUp", "WakeUp"]
    assert s.session.traffic[-3]["ignored"] == {"tags": ["weights"]}
    assert s.post("/v1/completions", COMPLETION)[0] == 200
    result = s.verdict()
    assert result.verdict == "PASS", [str(v) for v in result.violations]
    # a finish with no update open: the engine's 400 naming the phase, not a step
    status, body = s.post("/finish_weight_update", {})
    assert status == 400 and "FinishWeightUpdate" in body["error"]["message"]
    status, body = s.post("/collective_rpc", {"method": "teleport"})
    assert status == 400 and "skyrl_start_weight_update" in body["error"]["message"]
