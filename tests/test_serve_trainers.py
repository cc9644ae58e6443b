"""What a real trainer's traffic gets from ``kvfence serve``: no vacuous PASS (REACH-001 and
the ``--probe`` that reaches it), the client rules judged over HTTP, refused resets.

Most tests drive a ``Session`` in process (``Session.handle``: the same code the HTTP
server calls per request), so each is a few milliseconds; one runs the CLI.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from test_serve import serve

from kvfence.conformance.serve import Session
from kvfence.conformance.verdict import Verdict


def call(s: Session, method: str, target: str, body: Any = None) -> tuple[int, Any]:
    """One request through the session: ``(status, decoded body)``."""
    raw = b"" if body is None else json.dumps(body).encode()
    status, kind, out = s.handle(method, target, raw)
    if kind == "application/json":
        return status, json.loads(out)
    return status, out.decode()


def generate(s: Session, text: str) -> dict:
    status, body = call(s, "POST", "/generate", {"text": text, "sampling_params": {}})
    assert status == 200, body
    return body


def sglang_sync(s: Session, step: int, flush_cache: bool | None) -> None:
    """pause, update from disk (``flush_cache`` omitted when ``None``), continue."""
    assert call(s, "POST", "/pause_generation", {"mode": "abort"})[0] == 200
    body: dict[str, Any] = {"model_path": f"/ckpt/step-{step}"}
    if flush_cache is not None:
        body["flush_cache"] = flush_cache
    status, answer = call(s, "POST", "/update_weights_from_disk", body)
    assert status == 200, answer
    assert call(s, "POST", "/continue_generation", {})[0] == 200


def verdicts(s: Session) -> tuple[Verdict, dict[str, Verdict]]:
    """The session's verdict (closing it: the end-of-session probe runs) and its rules."""
    result = s.close()
    return result.verdict, {r.rule.id: r.verdict for r in result.rules}


def fresh_prompts(s: Session, flush_cache: bool | None, syncs: int = 2) -> None:
    """An RL loop: every rollout a prompt never sent before, a sync between rollouts."""
    for k in range(syncs):
        generate(s, f"prompt {k} a")
        generate(s, f"prompt {k} b")
        sglang_sync(s, k + 1, flush_cache)
    generate(s, "prompt last")


# ----- REACH-001: no vacuous PASS, and the probe -------------------------------------------


def test_fresh_prompts_only_is_unknown_not_pass(tmp_path):
    """A correct trainer whose prompts never repeat never asks whether stale KV is reused:
    REACH-001 is UNKNOWN, and so is the session (it was PASS)."""
    s = Session("sglang", "reference", out_dir=tmp_path)
    fresh_prompts(s, flush_cache=True)
    verdict, rules = verdicts(s)
    assert rules["REACH-001"] is Verdict.UNKNOWN
    assert verdict is Verdict.UNKNOWN


def test_the_probe_reaches_reuse_and_the_correct_trainer_passes(tmp_path):
    s = Session("sglang", "reference", out_dir=tmp_path, probe=2)
    fresh_prompts(s, flush_cache=True)
    verdict, rules = verdicts(s)
    assert rules["REACH-001"] is Verdict.PASS
    assert verdict is Verdict.PASS
    probes = [e for e in s.traffic if "probe" in e]
    # after each sync, the two prompts served before it, most recent first
    assert [e["probe"] for e in probes[:2]] == ["Q", "P"], probes
    assert all(e["status"] == 200 for e in probes)


@pytest.mark.parametrize(
    ("engine", "flush_cache", "rule"),
    [
        ("reference", False, "INV-001"),  # a trainer that never flushes (PF-01)
        ("update-never-flushes", True, "ENG-002"),  # the update is asked to flush (PF-08)
    ],
)
def test_the_probe_shows_stale_reuse_of_fresh_prompt_traffic(tmp_path, engine, flush_cache, rule):
    """Without the probe, stale reuse cannot show when prompts never repeat; with it, the
    fault FAILs with its rule."""
    s = Session("sglang", engine, out_dir=tmp_path, probe=4)
    fresh_prompts(s, flush_cache=flush_cache)
    verdict, _ = verdicts(s)
    assert verdict is Verdict.FAIL
    assert rule in {v.rule for v in s.violations}, s.violations


def test_a_never_flushing_trainer_with_fresh_prompts_does_not_pass(tmp_path):
    """The filed case: never flushes, never repeats a prompt: not PASS over either API."""
    s = Session("sglang", "reference", out_dir=tmp_path)
    fresh_prompts(s, flush_cache=False)
    assert verdicts(s)[0] is not Verdict.PASS
    v = Session("vllm", "reference", out_dir=tmp_path / "v")
    for k in range(2):
        assert call(v, "POST", "/v1/completions", {"prompt": f"p{k}", "max_tokens": 2})[0] == 200
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": f"/ckpt/{k}"}}
        assert call(v, "POST", "/collective_rpc", rpc)[0] == 200
    assert call(v, "POST", "/v1/completions", {"prompt": "last", "max_tokens": 2})[0] == 200
    assert verdicts(v)[0] is not Verdict.PASS


def test_serve_probe_option(tmp_path):
    """``kvfence serve --probe N`` from the command line: the probe turns the fresh-prompt
    stale session into a FAIL (exit 1) that names INV-001."""
    with serve(tmp_path, "reference", "sglang", ("--probe", "1")) as s:
        for k in range(2):
            r = s.http.post("/generate", json={"text": f"fresh {k}", "sampling_params": {}})
            assert r.status_code == 200
            assert s.http.post("/pause_generation", json={"mode": "abort"}).status_code == 200
            body = {"model_path": f"/ckpt/{k}", "flush_cache": False}
            assert s.http.post("/update_weights_from_disk", json=body).status_code == 200
            assert s.http.post("/continue_generation", json={}).status_code == 200
        assert s.stop() == 1, s.stdout
    assert "INV-001" in s.stdout
    log = next(Path(s.out).glob("*.traffic.json"))
    assert any("probe" in e for e in json.loads(log.read_text())["traffic"])


# ----- the client rules over HTTP ---------------------------------------------------------


def cli(rules: dict[str, Verdict]) -> dict[str, str]:
    return {k: v.value for k, v in rules.items() if k.startswith("CLI-")}


def test_reset_before_update_fails_cli_008_as_check_does(tmp_path):
    """SkyRL 0.4.0's delta backend and OpenRLHF's Ray path: reset, then update, then resume
    (vLLM ``/reset_prefix_cache`` before ``/collective_rpc reload_weights``). ``kvfence
    check`` FAILs this order with CLI-008; so does serve, whatever prompts follow."""
    s = Session("vllm", "reference", out_dir=tmp_path)
    assert call(s, "POST", "/v1/completions", {"prompt": "p", "max_tokens": 2})[0] == 200
    assert call(s, "POST", "/pause?mode=abort&clear_cache=false")[0] == 200
    assert call(s, "POST", "/reset_prefix_cache")[1] == {"success": True}
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/1"}}
    assert call(s, "POST", "/collective_rpc", rpc)[0] == 200
    assert call(s, "POST", "/resume")[0] == 200
    verdict, rules = verdicts(s)
    assert verdict is Verdict.FAIL
    assert rules["CLI-008"] is Verdict.FAIL
    assert [v.rule for v in s.violations] == ["CLI-008"]
    assert "reset only before the update" in str(s.violations[0])


def test_the_right_order_passes_each_cli_rule_with_evidence(tmp_path):
    """pause, reload, reset, resume: CLI-008 and the rule that required the reset (CLI-002:
    vLLM's server info says nothing the spec reads about the radix cache, so it is taken as
    on) PASS with evidence; the rules an HTTP session
    cannot show are N/A, never PASS."""
    s = Session("vllm", "reference", out_dir=tmp_path, probe=1)
    assert call(s, "POST", "/v1/completions", {"prompt": "p", "max_tokens": 2})[0] == 200
    assert call(s, "POST", "/pause?mode=abort&clear_cache=false")[0] == 200
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/1"}}
    assert call(s, "POST", "/collective_rpc", rpc)[0] == 200
    assert call(s, "POST", "/reset_prefix_cache")[1] == {"success": True}
    assert call(s, "POST", "/resume")[0] == 200
    result = s.close()
    assert result.verdict is Verdict.PASS, [str(v) for v in result.violations]
    by_id = {r.rule.id: r for r in result.rules}
    for rule in ("CLI-002", "CLI-007", "CLI-008"):
        assert by_id[rule].verdict is Verdict.PASS and by_id[rule].evidence > 0, by_id[rule]
    for rule in ("CLI-003", "CLI-005", "CLI-006", "CLI-011", "CLI-012", "CLI-013"):
        assert by_id[rule].verdict is Verdict.NA, by_id[rule]


def test_a_trainer_that_never_resets_fails_cli_002_without_a_repeated_prompt(tmp_path):
    """The reset the endpoint's report requires (silent on the radix cache: taken as on) is
    owed at resumption: missing, the trainer FAILs CLI-002 even when no old prompt comes
    back (INV-001 could not show)."""
    s = Session("vllm", "reference", out_dir=tmp_path)
    assert call(s, "POST", "/v1/completions", {"prompt": "p", "max_tokens": 2})[0] == 200
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/1"}}
    assert call(s, "POST", "/collective_rpc", rpc)[0] == 200
    assert call(s, "POST", "/v1/completions", {"prompt": "q", "max_tokens": 2})[0] == 200
    verdict, rules = verdicts(s)
    assert verdict is Verdict.FAIL
    assert rules["CLI-002"] is Verdict.FAIL
    assert "INV-001" not in {v.rule for v in s.violations}


def test_cli_fail_over_serve_replays_to_the_same_rule(tmp_path):
    """The session trace replays (against the engine, and on the spec alone) to CLI-008,
    and the counterexample was shrunk on it."""
    from kvfence.conformance.replay import ReplayKind, replay_trace
    from kvfence.conformance.trace import read_trace

    s = Session("vllm", "reference", out_dir=tmp_path)
    assert call(s, "POST", "/pause?mode=abort&clear_cache=false")[0] == 200
    assert call(s, "POST", "/reset_prefix_cache")[0] == 200
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/1"}}
    assert call(s, "POST", "/collective_rpc", rpc)[0] == 200
    assert call(s, "POST", "/resume")[0] == 200
    result = s.close()
    assert result.verdict is Verdict.FAIL
    assert s.trace_path is not None and s.counterexample is not None
    from kvfence.adapters import registry

    for path in (s.trace_path, s.counterexample):
        trace = read_trace(path)
        for engine in (registry.engine("reference"), None):
            client = None if engine is None else registry.client("reference")
            replayed = replay_trace(trace, engine, client)
            assert replayed.kind is ReplayKind.FAIL, (path, replayed)
            assert "CLI-008" in {v.rule for v in replayed.violations}


# ----- refused resets (CLI-010) -----------------------------------------------------------


def vllm_sync(s: Session, step: int, retries: int) -> list[dict]:
    """pause, reload, reset (again up to ``retries`` times while refused), resume: the
    reset bodies the trainer read."""
    assert call(s, "POST", "/pause?mode=abort&clear_cache=false")[0] == 200
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": f"/ckpt/{step}"}}
    assert call(s, "POST", "/collective_rpc", rpc)[0] == 200
    answers = []
    for _ in range(retries + 1):
        status, body = call(s, "POST", "/reset_prefix_cache")
        assert status == 200, body  # vLLM answers a refused reset 200 {"success": false}
        answers.append(body)
        if body["success"]:
            break
    assert call(s, "POST", "/resume")[0] == 200
    return answers


def test_a_drawn_refusal_ignored_fails_cli_010(tmp_path):
    """SkyRL and TRL never read ``/reset_prefix_cache``'s body: a refused reset is resumed
    over, CLI-010."""
    s = Session("vllm", "reference", out_dir=tmp_path, refuse_resets=1)
    assert call(s, "POST", "/v1/completions", {"prompt": "p", "max_tokens": 2})[0] == 200
    assert vllm_sync(s, 1, retries=0) == [{"success": False}]
    verdict, rules = verdicts(s)
    assert verdict is Verdict.FAIL
    assert rules["CLI-010"] is Verdict.FAIL
    assert "refused, then ignored" in str(s.violations[0])
    drawn = [e["drawn"] for e in s.traffic if "drawn" in e]
    assert [d["action"]["action"] for d in drawn] == ["FaultRefuseFlush"]


def test_a_trainer_that_retries_the_refused_reset_passes_cli_010(tmp_path):
    s = Session("vllm", "reference", out_dir=tmp_path, refuse_resets=1, probe=1)
    assert call(s, "POST", "/v1/completions", {"prompt": "p", "max_tokens": 2})[0] == 200
    assert vllm_sync(s, 1, retries=3) == [{"success": False}, {"success": True}]
    result = s.close()
    assert result.verdict is Verdict.PASS, [str(v) for v in result.violations]
    by_id = {r.rule.id: r for r in result.rules}
    assert by_id["CLI-010"].verdict is Verdict.PASS and by_id["CLI-010"].evidence > 0


def test_sglang_refused_flush_is_its_400_and_ignoring_it_fails_cli_010(tmp_path):
    s = Session("sglang", "reference", out_dir=tmp_path, refuse_resets=1)
    generate(s, "p")
    assert call(s, "POST", "/pause_generation", {"mode": "abort"})[0] == 200
    body = {"model_path": "/ckpt/1", "flush_cache": False}
    assert call(s, "POST", "/update_weights_from_disk", body)[0] == 200
    status, text = call(s, "POST", "/flush_cache")
    assert status == 400, text
    assert call(s, "POST", "/continue_generation", {})[0] == 200
    verdict, rules = verdicts(s)
    assert verdict is Verdict.FAIL and rules["CLI-010"] is Verdict.FAIL


def test_refusals_need_an_engine_that_can_refuse():
    with pytest.raises(ValueError, match="refuse-resets"):
        Session("vllm", "reference", refuse_resets=-1)


# ----- namespaces (cache_salt / extra_key) and caching off --------------------------------


def salted(s: Session, text: str, key: str) -> dict:
    body = {"text": text, "sampling_params": {}, "extra_key": key}
    status, answer = call(s, "POST", "/generate", body)
    assert status == 200, answer
    return answer


def test_a_key_that_follows_the_weights_passes_without_a_flush(tmp_path):
    """A trainer that keys every request by the weight version (SkyRL 0.4.0 salts every
    request) and, under ``cache_invalidation_mode=none``, never flushes: the old KV is in
    another namespace, never reused. PASS, with reuse after an update reached."""
    from kvfence.model.vocabulary import CacheMode

    s = Session("sglang", "reference", mode=CacheMode.NONE, out_dir=tmp_path)
    salted(s, "p", "v0")
    sglang_sync(s, 1, flush_cache=False)
    again = salted(s, "p", "v1")
    assert again["meta_info"]["cached_tokens"] == 0
    verdict, rules = verdicts(s)
    assert verdict is Verdict.PASS, s.violations
    assert rules["REACH-001"] is Verdict.PASS
    assert s.traffic[-1]["namespace"] == {"key": "v1", "version": 1}


def test_a_key_pinned_to_older_weights_is_pf_24(tmp_path):
    """SkyRL 0.4.0's fully-async mode keeps a trajectory's salt across an update: the
    request is pinned to the older weights' namespace, whose KV it reuses (PF-24)."""
    from kvfence.model.vocabulary import CacheMode

    s = Session("sglang", "reference", mode=CacheMode.NONE, out_dir=tmp_path)
    salted(s, "p", "trajectory-7")
    sglang_sync(s, 1, flush_cache=False)
    salted(s, "p", "trajectory-7")
    verdict, _ = verdicts(s)
    assert verdict is Verdict.FAIL
    assert [v.rule for v in s.violations] == ["INV-001"], s.violations
    assert s.traffic[-1]["namespace"] == {"key": "trajectory-7", "version": 0}


@pytest.mark.parametrize("api", ["sglang", "vllm"])
def test_no_prefix_cache_says_so_and_a_trainer_without_reset_reuses_nothing(tmp_path, api):
    """``--no-prefix-cache``: the server info says caching is off, and a trainer that never
    resets re-sending an old prompt reuses nothing (no INV-001) and owes no reset (the
    obligations follow the endpoint's cache: off, nothing to reset): PASS on both APIs."""
    s = Session(api, "reference", out_dir=tmp_path, prefix_cache=False)
    info_path = "/get_server_info" if api == "sglang" else "/server_info"
    status, info = call(s, "GET", info_path)
    assert status == 200, info
    info = info.get("kvfence", info)
    if api == "sglang":
        assert info["disable_radix_cache"] is True
        generate(s, "p")
        sglang_sync(s, 1, flush_cache=False)
        assert generate(s, "p")["meta_info"]["cached_tokens"] == 0
        verdict, rules = verdicts(s)
        assert verdict is Verdict.PASS, s.violations
        assert rules["REACH-001"] is Verdict.PASS
        return
    assert info["enable_prefix_caching"] is False
    completion = {"prompt": "p", "max_tokens": 2}
    assert call(s, "POST", "/v1/completions", completion)[0] == 200
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/1"}}
    assert call(s, "POST", "/collective_rpc", rpc)[0] == 200
    status, answer = call(s, "POST", "/v1/completions", completion)
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    verdict, rules = verdicts(s)
    assert verdict is Verdict.PASS, s.violations
    assert rules["REACH-001"] is Verdict.PASS


# ----- routes real trainers call ----------------------------------------------------------


def test_vllm_init_and_probe_routes_answer_as_vllm(tmp_path):
    """SkyRL 0.4.0's, TRL's and ART's one-time init: world size, the weight-transfer init
    (a logged no-op), server info, sleep state; then a chat completion is a ServeRequest."""
    s = Session("vllm", "reference", out_dir=tmp_path, probe=1)
    assert call(s, "GET", "/get_world_size") == (200, {"world_size": 1})
    assert call(s, "POST", "/init_weight_transfer_engine", {})[0] == 400
    init = {"init_info": {"master_address": "127.0.0.1", "master_port": 1, "world_size": 2}}
    assert call(s, "POST", "/init_weight_transfer_engine", init) == (
        200,
        {"message": "Weight transfer initialized"},
    )
    status, info = call(s, "GET", "/server_info?config_format=json")
    assert status == 200, info
    assert info["vllm_config"]["cache_config"]["enable_prefix_caching"] is True, info
    assert info["vllm_config"]["weight_transfer_config"] == {"backend": "nccl"}
    assert call(s, "GET", "/is_sleeping") == (200, {"is_sleeping": False})
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3}
    status, answer = call(s, "POST", "/v1/chat/completions", chat)
    assert status == 200 and answer["object"] == "chat.completion", answer
    assert call(s, "POST", "/sleep?level=1")[0] == 200
    assert call(s, "GET", "/is_sleeping") == (200, {"is_sleeping": True})
    assert call(s, "POST", "/wake_up")[0] == 200
    assert [type(a).__name__ for a in s.lockstep.actions] == ["ServeRequest", "Sleep", "WakeUp"]
    assert call(s, "GET", "/no_such_route")[0] == 404
    assert s.traffic[-1] == {"method": "GET", "path": "/no_such_route", "status": 404}


def test_sglang_init_and_session_routes_are_logged_no_ops(tmp_path):
    """AReaL's distributed path (``/init_weights_update_group``; Trinity-RFT's teardown,
    ``/destroy_weights_update_group``), SGLang 0.5.23's update
    session (``/begin_weight_update`` ... ``/end_weight_update``) around a distributed
    update with its flush, and ``/abort_request``: the update alone is stepped."""
    s = Session("sglang", "reference", out_dir=tmp_path, probe=1)
    generate(s, "p")
    group = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2}
    assert call(s, "POST", "/init_weights_update_group", group)[1]["success"] is True
    assert call(s, "POST", "/abort_request", {"abort_all": True}) == (200, "")
    assert call(s, "POST", "/pause_generation", {"mode": "abort"})[0] == 200
    assert call(s, "POST", "/begin_weight_update", {})[0] == 200
    update = {"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[2]], "flush_cache": True}
    assert call(s, "POST", "/update_weights_from_distributed", update)[0] == 200
    assert call(s, "POST", "/end_weight_update", {})[0] == 200
    assert call(s, "POST", "/continue_generation", {})[0] == 200
    destroy = {"group_name": "g"}
    assert call(s, "POST", "/destroy_weights_update_group", destroy)[1]["success"] is True
    verdict, _ = verdicts(s)
    assert verdict is Verdict.PASS, s.violations
    names = [type(a).__name__ for a in s.lockstep.actions]
    assert names[:4] == ["ServeRequest", "PauseGeneration", "UpdateWeights", "ContinueGeneration"]
    assert sum("noop" in e for e in s.traffic) == 5


# ----- LoRA routes (ENG-007 over HTTP) and vLLM's token-in token-out generate -------------


def lora_reload(s: Session, api: str, in_place: bool) -> None:
    """Load adapter ``a``, serve a prompt through it, reload it under the same name with new
    bytes (vLLM: ``load_inplace``, or unload then load; SGLang: unload then load), serve the
    prompt again through it."""
    load = "/v1/load_lora_adapter" if api == "vllm" else "/load_lora_adapter"
    unload = "/v1/unload_lora_adapter" if api == "vllm" else "/unload_lora_adapter"

    def lora_generate() -> None:
        if api == "vllm":
            body = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 4}, "model": "a"}
            status, answer = call(s, "POST", "/inference/v1/generate", body)
        else:
            body = {"text": "p", "sampling_params": {}, "lora_path": "a"}
            status, answer = call(s, "POST", "/generate", body)
        assert status == 200, answer

    assert call(s, "POST", load, {"lora_name": "a", "lora_path": "/lora/v1"})[0] == 200
    lora_generate()
    if in_place:
        again = {"lora_name": "a", "lora_path": "/lora/v2", "load_inplace": True}
        assert call(s, "POST", load, again)[0] == 200
    else:
        assert call(s, "POST", unload, {"lora_name": "a"})[0] == 200
        assert call(s, "POST", load, {"lora_name": "a", "lora_path": "/lora/v2"})[0] == 200
    lora_generate()


@pytest.mark.parametrize(("api", "in_place"), [("vllm", True), ("vllm", False), ("sglang", False)])
@pytest.mark.parametrize(
    ("engine", "expected"), [("reference", Verdict.PASS), ("lora-keyed-by-name", Verdict.FAIL)]
)
def test_lora_reload_over_http_is_judged_by_eng_007(tmp_path, api, in_place, engine, expected):
    """A same-name LoRA reload over the engines' LoRA routes is LoadLora: the reference
    engine PASSes ENG-007 with evidence, an engine that keys LoRA KV by the adapter's name
    (PF-13, vllm-project/vllm #42125) FAILs it."""
    s = Session(api, engine, out_dir=tmp_path)
    lora_reload(s, api, in_place)
    verdict, rules = verdicts(s)
    assert rules["ENG-007"] is expected, rules
    if expected is Verdict.FAIL:
        assert verdict is Verdict.FAIL


def test_lora_routes_answer_as_the_engines(tmp_path):
    """vLLM: a second load without ``load_inplace`` is 400, an unknown unload 404, a request
    naming an unloaded adapter 404, the adapter listed in ``/v1/models`` while loaded;
    SGLang: a second load is ``{"success": false}`` 400; a second adapter name is 501."""
    s = Session("vllm", "reference", out_dir=tmp_path / "v")
    body = {"lora_name": "a", "lora_path": "/lora/v1"}
    status, text = call(s, "POST", "/v1/load_lora_adapter", body)
    assert (status, text) == (200, "Success: LoRA adapter 'a' added successfully.")
    ids = [m["id"] for m in call(s, "GET", "/v1/models")[1]["data"]]
    assert ids == ["kvfence-serve", "a"]
    status, answer = call(s, "POST", "/v1/load_lora_adapter", body)
    assert status == 400 and "load_inplace" in answer["error"]["message"], answer
    assert call(s, "POST", "/v1/unload_lora_adapter", {"lora_name": "b"})[0] == 404
    assert call(s, "POST", "/v1/unload_lora_adapter", {"lora_name": "a"})[0] == 200
    req = {"prompt": "p", "model": "a"}
    assert call(s, "POST", "/v1/completions", req)[0] == 404
    assert call(s, "POST", "/v1/load_lora_adapter", {**body, "lora_name": "b"})[0] == 501
    g = SglangCalls(Session("sglang", "reference", out_dir=tmp_path / "s"))
    assert g.load("a") == (200, True)
    assert g.load("a") == (400, False)
    assert g.unload("b") == (400, False)


class SglangCalls:
    def __init__(self, s: Session) -> None:
        self.s = s

    def load(self, name: str) -> tuple[int, bool]:
        status, answer = call(
            self.s, "POST", "/load_lora_adapter", {"lora_name": name, "lora_path": "/l"}
        )
        return status, answer["success"]

    def unload(self, name: str) -> tuple[int, bool]:
        status, answer = call(self.s, "POST", "/unload_lora_adapter", {"lora_name": name})
        return status, answer["success"]


def test_inference_generate_is_a_serve_request_in_vllm_shape(tmp_path):
    """``/inference/v1/generate``: token ids in, ``GenerateTokensResponse`` out, one
    ServeRequest (a repeated prompt is a prefix hit, counted in ``cached_tokens``);
    ``output_mode`` text and a missing ``sampling_params`` are 400."""
    s = Session("vllm", "reference", out_dir=tmp_path)
    body = {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 3}, "request_id": "r1"}
    status, first = call(s, "POST", "/inference/v1/generate", body)
    assert status == 200, first
    assert first["request_id"] == "r1" and first["output_mode"] == "tokens"
    assert first["prompt_token_ids"] == [5, 6, 7]
    (choice,) = first["choices"]
    assert len(choice["token_ids"]) == 3 == len(choice["logprobs"]["content"])
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    status, second = call(s, "POST", "/inference/v1/generate", body)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 3
    assert second["choices"][0]["token_ids"] == choice["token_ids"]
    assert call(s, "POST", "/inference/v1/generate", {"token_ids": [1]})[0] == 400
    text = {**body, "output_mode": "text"}
    assert call(s, "POST", "/inference/v1/generate", text)[0] == 400
    actions = [e.get("action", {}) for e in s.traffic]
    assert sum(1 for a in actions if a and a.get("action") == "ServeRequest") == 2, actions


# ----- requests in flight over HTTP: a stream holds its KV ---------------------------------


def stream(s: Session, prompt: str):
    """Start a streamed completion; the ``Streamed`` answer (its first event sent)."""
    body = json.dumps({"prompt": prompt, "max_tokens": 3, "stream": True}).encode()
    status, kind, out = s.handle("POST", "/v1/completions", body)
    assert (status, kind) == (200, "text/event-stream"), out
    assert out.first.startswith(b"data: ") and b'"finish_reason": null' in out.first
    return out


def test_a_reset_while_a_stream_runs_is_refused_and_ignoring_it_fails_cli_010(tmp_path):
    """No fault injection: a streamed generation in flight holds its KV, so the reset of a
    sync made meanwhile (no abort first) is refused as vLLM refuses it (``{"success":
    false}``); a trainer that resumes without reading it FAILs CLI-010, and the prompt it
    cached before the update is served stale (INV-001)."""
    s = Session("vllm", "reference", out_dir=tmp_path)
    assert call(s, "POST", "/v1/completions", {"prompt": "p", "max_tokens": 2})[0] == 200
    running = stream(s, "q")
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/1"}}
    assert call(s, "POST", "/collective_rpc", rpc)[0] == 200
    assert call(s, "POST", "/reset_prefix_cache") == (200, {"success": False})
    rest = running.finish()
    assert rest.endswith(b"data: [DONE]\n\n") and b'"finish_reason": "length"' in rest
    assert call(s, "POST", "/v1/completions", {"prompt": "p", "max_tokens": 2})[0] == 200
    verdict, rules = verdicts(s)
    assert verdict is Verdict.FAIL
    assert rules["CLI-010"] is Verdict.FAIL
    assert not [e for e in s.traffic if "drawn" in e]  # no fault was drawn


def test_an_abort_pause_ends_the_stream_and_the_reset_succeeds(tmp_path):
    """The right order with a stream in flight: ``/pause?mode=abort`` aborts it (its last
    event says ``abort``), the reset then succeeds, and the session PASSes."""
    s = Session("vllm", "reference", out_dir=tmp_path, probe=1)
    assert call(s, "POST", "/v1/completions", {"prompt": "p", "max_tokens": 2})[0] == 200
    running = stream(s, "q")
    assert call(s, "POST", "/pause?mode=abort&clear_cache=false")[0] == 200
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/1"}}
    assert call(s, "POST", "/collective_rpc", rpc)[0] == 200
    assert call(s, "POST", "/reset_prefix_cache") == (200, {"success": True})
    assert call(s, "POST", "/resume")[0] == 200
    assert b'"finish_reason": "abort"' in running.finish()
    result = s.close()
    assert result.verdict is Verdict.PASS, [str(v) for v in result.violations]
    assert any(e.get("aborted") for e in s.traffic)


def sglang_stream(s: Session, prompt: str, rid: str | None = None):
    """Start a streamed SGLang ``/generate``; the ``Streamed`` answer (first event sent)."""
    body: dict[str, Any] = {"text": prompt, "sampling_params": {"max_new_tokens": 3}}
    body["stream"] = True
    if rid is not None:
        body["rid"] = rid
    status, kind, out = s.handle("POST", "/generate", json.dumps(body).encode())
    assert (status, kind) == (200, "text/event-stream"), out
    first = json.loads(out.first.removeprefix(b"data: "))
    assert first["meta_info"]["finish_reason"] is None and first["output_ids"] == []
    return out


def last_event(rest: bytes) -> dict:
    """The last JSON event of a stream's rest, which ends with ``data: [DONE]``."""
    events = [e for e in rest.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]", rest
    return json.loads(events[-2].removeprefix(b"data: "))


def test_an_sglang_stream_holds_its_kv_and_ignoring_the_refused_flush_fails(tmp_path):
    """SGLang's streamed ``/generate`` holds its KV in flight: the ``/flush_cache`` of a sync
    made meanwhile (an update sent with ``flush_cache`` false, then the flush) is refused
    with SGLang's 400, no fault drawn; a trainer that resumes anyway FAILs CLI-010, and the
    prompt cached before the update is served stale (INV-001)."""
    s = Session("sglang", "reference", out_dir=tmp_path)
    generate(s, "p")
    running = sglang_stream(s, "q")
    body = {"model_path": "/ckpt/step-1", "flush_cache": False}
    assert call(s, "POST", "/update_weights_from_disk", body)[0] == 200
    status, answer = call(s, "POST", "/flush_cache")
    assert status == 400, answer
    end = last_event(running.finish())
    assert end["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert len(end["output_ids"]) == 3
    generate(s, "p")
    verdict, rules = verdicts(s)
    assert verdict is Verdict.FAIL
    assert rules["CLI-010"] is Verdict.FAIL and rules["INV-001"] is Verdict.FAIL
    assert not [e for e in s.traffic if "drawn" in e]


@pytest.mark.parametrize("abort", [{"rid": "rollout-7"}, {"abort_all": True}])
def test_an_sglang_abort_request_ends_the_stream_and_the_flush_succeeds(tmp_path, abort):
    """The right order with a stream in flight: ``/abort_request`` naming its ``rid`` (or
    ``abort_all``) ends it now (its last event says abort), the flush after the update then
    succeeds, and the session PASSes. An abort naming no request in flight is a no-op."""
    s = Session("sglang", "reference", out_dir=tmp_path, probe=1)
    generate(s, "p")
    running = sglang_stream(s, "q", rid="rollout-7")
    assert call(s, "POST", "/abort_request", {"rid": "someone-else"}) == (200, "")
    assert call(s, "POST", "/abort_request", abort) == (200, "")
    body = {"model_path": "/ckpt/step-1", "flush_cache": False}
    assert call(s, "POST", "/update_weights_from_disk", body)[0] == 200
    assert call(s, "POST", "/flush_cache")[0] == 200
    assert last_event(running.finish())["meta_info"]["finish_reason"]["type"] == "abort"
    generate(s, "p")
    result = s.close()
    assert result.verdict is Verdict.PASS, [str(v) for v in result.violations]
    ends = [e for e in s.traffic if "stream_end" in e]
    assert len(ends) == 1 and ends[0]["aborted"] is True, ends


def test_a_client_that_disconnects_mid_stream_aborts_its_request(tmp_path):
    """Over HTTP, a stream held 60 s whose client reads the first event and goes away is
    aborted then, as both engines abort a request whose connection closed: the reset the
    trainer sends next succeeds at once (it was refused while the stream ran)."""
    import socket

    with serve(tmp_path, "reference", "vllm", ("--stream-hold", "60")) as s:
        host, port = s.url.removeprefix("http://").split(":")
        body = json.dumps({"prompt": "q", "max_tokens": 3, "stream": True}).encode()
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n"
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        with socket.create_connection((host, int(port)), timeout=20) as conn:
            conn.sendall(head.encode() + body)
            assert b"data: " in conn.recv(65536)
            assert s.http.post("/reset_prefix_cache").json() == {"success": False}
        deadline = time.monotonic() + 20
        answer = None
        while time.monotonic() < deadline:
            answer = s.http.post("/reset_prefix_cache").json()
            if answer == {"success": True}:
                break
            time.sleep(0.05)
        log = s.http.get("/kvfence/verdict").json()
        s.stop()
    assert answer == {"success": True}, log


def test_a_stream_over_http_holds_its_kv_while_a_reset_is_refused(tmp_path):
    """Through the HTTP server: while a stream is open (held 3 s), a reset on another
    connection is answered ``{"success": false}``; the stream then ends with its tokens."""
    import threading

    import httpx

    with serve(tmp_path, "reference", "vllm", ("--stream-hold", "3")) as s:
        events: list[str] = []

        def read() -> None:
            body = {"prompt": "q", "max_tokens": 3, "stream": True}
            with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=30) as r:
                events.extend(line for line in r.iter_lines() if line)

        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 20
        answer = None
        while time.monotonic() < deadline:
            log = s.http.get("/kvfence/verdict").json()
            answer = s.http.post("/reset_prefix_cache").json()
            if answer == {"success": False}:
                break
            time.sleep(0.05)
        reader.join(timeout=30)
        s.stop()
    assert answer == {"success": False}, log
    assert events[-1] == "data: [DONE]" and '"finish_reason": "length"' in events[-2]
