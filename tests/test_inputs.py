"""Hostile inputs get clean answers: HTTP bodies serve cannot take get the engine's 400
shape (never a 500 or a hang), trace fields print as text, replay refuses what is not a
trace file without waiting on it, and a trace whose observations cannot discriminate is
UNKNOWN (exit 2), never FIXED and never a traceback.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvfence.conformance.serve import ROUTES, Session, make_server

KVFENCE = [sys.executable, "-m", "kvfence.conformance.cli"]


def kvfence(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [*KVFENCE, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


# ----- HTTP: raw bytes on a socket -------------------------------------------------------


@pytest.fixture
def server():
    """An in-process serve endpoint (SGLang API) on a free loopback port: its port."""
    session = Session("sglang", "reference")
    srv = make_server(session, "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def exchange(port: int, raw: bytes) -> tuple[int, dict]:
    """Send ``raw`` (a whole request), read one response: ``(status, JSON body)``."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            chunk = s.recv(65536)
            assert chunk
            body += chunk
    return int(head.split(b" ", 2)[1]), json.loads(body)


def post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def is_sglang_400(status: int, body: dict) -> bool:
    return status == 400 and body.get("object") == "error" and body.get("code") == 400


def test_a_5000_digit_integer_is_the_engines_400(server):
    body = b'{"text": "hi", "sampling_params": {"max_new_tokens": ' + b"9" * 5000 + b"}}"
    status, out = exchange(server, post("/generate", body, f"Content-Length: {len(body)}"))
    assert is_sglang_400(status, out), (status, out)
    assert "not JSON" in out["message"]


def test_a_chunked_body_is_the_engines_400_not_ignored(server):
    chunk = b'{"text": "hi"}'
    raw = post(
        "/generate",
        f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n0\r\n\r\n",
        "Transfer-Encoding: chunked",
    )
    status, out = exchange(server, raw)
    assert is_sglang_400(status, out), (status, out)
    assert "Transfer-Encoding" in out["message"]


@pytest.mark.parametrize("length", ["abc", "-5", "1e3", "9" * 40, "+7"])
def test_a_bad_content_length_is_the_engines_400(server, length):
    status, out = exchange(server, post("/generate", b"{}", f"Content-Length: {length}"))
    assert is_sglang_400(status, out), (status, out)


def test_one_write_per_response(server):
    """Status line, headers and body arrive in one segment on loopback (a response in two
    writes waits for the client's delayed ACK on keep-alive: ~40 ms a request)."""
    body = b'{"text": "hi"}'
    with socket.create_connection(("127.0.0.1", server), timeout=10) as s:
        s.sendall(post("/generate", body, f"Content-Length: {len(body)}"))
        first = s.recv(1 << 20)
    head, _, rest = first.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    assert len(rest) == length, first


def test_the_listen_backlog_holds_a_burst():
    session = Session("vllm", "reference")
    srv = make_server(session, "127.0.0.1", 0)
    try:
        assert srv.request_queue_size >= 128
        # 200 connections before the server accepts any: none is reset.
        socks = [socket.create_connection(srv.server_address, timeout=10) for _ in range(200)]
        for s in socks:
            s.close()
    finally:
        srv.server_close()


# ----- wrong JSON types, route by route --------------------------------------------------

WRONG = [True, 1.5, -1, "x", [], [True], {}, None, 10**30]


@pytest.mark.parametrize("api", ["sglang", "vllm"])
def test_wrong_json_types_in_every_field_never_give_a_500(api):
    fields = {
        "text",
        "input_ids",
        "prompt",
        "sampling_params",
        "max_tokens",
        "lora_path",
        "extra_key",
        "cache_salt",
        "mode",
        "model_path",
        "flush_cache",
        "weight_version",
        "new_version",
        "abort_all_requests",
        "tags",
        "serialized_named_tensors",
        "names",
        "method",
        "kwargs",
        "update_info",
        "return_logprob",
        "rid",
    }
    session = Session(api, "reference")
    for route in (r for r in ROUTES if r.api == api and "POST" in r.methods):
        for name in sorted(fields):
            for value in WRONG:
                status, _, out = session.handle(
                    "POST", route.path, json.dumps({name: value}).encode()
                )
                assert status != 500, (route.path, name, value, out)
                assert status < 500 or status == 503, (route.path, name, value, out)


@pytest.mark.parametrize(
    "api, path, body",
    [
        ("sglang", "/generate", {"input_ids": [True, False]}),
        ("sglang", "/generate", {"input_ids": [1, -2]}),
        ("vllm", "/v1/completions", {"prompt": [True]}),
    ],
)
def test_booleans_and_negative_numbers_are_not_token_ids(api, path, body):
    status, _, out = Session(api, "reference").handle("POST", path, json.dumps(body).encode())
    assert status == 400, out
    assert session_steps(api, path, body) == 0


def session_steps(api: str, path: str, body: dict) -> int:
    session = Session(api, "reference")
    session.handle("POST", path, json.dumps(body).encode())
    return len(session.lockstep.actions)


# ----- replay: what is not a trace, and what cannot discriminate ------------------------


@pytest.fixture
def session_trace(tmp_path) -> Path:
    """A serve session that FAILs (the trainer skips the flush, then re-sends a prompt)."""
    session = Session("sglang", "reference", out_dir=tmp_path / "out")
    for path, body in [
        ("/generate", {"text": "prompt"}),
        ("/pause_generation", {"mode": "abort"}),
        ("/update_weights_from_disk", {"model_path": "/c/1", "flush_cache": False}),
        ("/continue_generation", {}),
        ("/generate", {"text": "prompt"}),
    ]:
        assert session.handle("POST", path, json.dumps(body).encode())[0] == 200
    assert str(session.result(write=True).verdict) == "FAIL"
    assert session.trace_path is not None
    return session.trace_path


def cut_to_status(src: Path, dst: Path) -> Path:
    lines = []
    for line in src.read_text().splitlines():
        obj = json.loads(line)
        if "observed" in obj:
            obj["observed"] = {"status": obj["observed"]["status"]}
            obj.pop("expected", None)
        lines.append(json.dumps(obj))
    dst.write_text("\n".join(lines) + "\n")
    return dst


def test_a_status_only_trace_is_judged_on_its_calls_never_a_traceback(session_trace, tmp_path):
    """Cut to statuses, the stale reuse cannot be told (no response), but the trainer's
    calls and their statuses are all the client rules read: the skipped flush still FAILs
    CLI-001 (the reset the endpoint's report required)."""
    cut = cut_to_status(session_trace, tmp_path / "cut.jsonl")
    r = kvfence("replay", str(cut), "--model-only")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.startswith("FAILED") and "violated CLI-001" in r.stdout, r.stdout
    assert "INV-001" not in r.stdout.split("counterexample")[0], r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_a_passing_trace_cut_to_status_is_unknown_not_fixed(tmp_path):
    session = Session("sglang", "reference", out_dir=tmp_path / "out")
    for path, body in [
        ("/generate", {"text": "prompt"}),
        ("/pause_generation", {"mode": "abort"}),
        ("/update_weights_from_disk", {"model_path": "/c/1"}),
        ("/continue_generation", {}),
        ("/generate", {"text": "prompt"}),
    ]:
        assert session.handle("POST", path, json.dumps(body).encode())[0] == 200
    assert str(session.result(write=True).verdict) == "PASS"
    whole = kvfence("replay", str(session.trace_path), "--model-only")
    assert whole.stdout.startswith("FIXED"), whole.stdout
    cut = cut_to_status(session.trace_path, tmp_path / "cut.jsonl")
    r = kvfence("replay", str(cut), "--model-only")
    assert r.returncode == 2 and r.stdout.startswith("UNKNOWN"), r.stdout + r.stderr


def test_a_fail_whose_read_field_was_not_recorded_is_unknown_not_fixed(tmp_path):
    """A real FAIL counterexample (the explorer's shortest, so the same trace every run):
    the stub flush answers without a flush result although the engine declares one
    (LIV-001 read ``flushed``). Cut to statuses, the record no longer holds the missing
    result: judged from the recorded observations alone it is UNKNOWN (exit 2), never
    FIXED. Whole, the trace recorded the missing result (``"flushed": null``), so the
    model-only replay FAILs as the search did."""
    from kvfence.adapters import registry
    from kvfence.conformance.explore import explore_adapter

    result = explore_adapter(
        registry.engine("flush-is-a-stub"),
        registry.client("reference"),
        depth=2,
        out_dir=tmp_path / "out",
        focus="LIV-001",
    )
    assert result.caught() == ("LIV-001",) and result.counterexample is not None
    recorded = json.loads(result.counterexample.read_text().splitlines()[-1])
    read = [v["where"].split()[-1] for v in recorded["violations"]]
    assert "flushed" in read, recorded
    cut = cut_to_status(result.counterexample, tmp_path / "cut.jsonl")
    r = kvfence("replay", str(cut), "--model-only")
    assert r.returncode == 2 and r.stdout.startswith("UNKNOWN"), r.stdout + r.stderr
    assert "does not hold" in r.stdout.replace("\n", " "), r.stdout
    r = kvfence("replay", str(result.counterexample), "--model-only")
    assert r.returncode == 1 and r.stdout.startswith("FAIL"), r.stdout + r.stderr


@pytest.mark.parametrize(
    "where",
    ["prefix", "detail", "engine"],
)
def test_markup_in_a_trace_field_prints_verbatim(session_trace, tmp_path, where):
    markup = "[link=https://example.invalid]P[/link][/]"
    lines = session_trace.read_text().splitlines()
    head, first = json.loads(lines[0]), json.loads(lines[1])
    if where == "prefix":
        first["action"]["prefix"] = markup
    elif where == "detail":
        first["observed"]["detail"] = markup
    else:
        head["engine"] = markup
    path = tmp_path / "markup.jsonl"
    path.write_text("\n".join([json.dumps(head), json.dumps(first), *lines[2:]]) + "\n")
    for extra in ([], ["--model-only"]):
        r = kvfence("replay", str(path), *extra)
        assert r.returncode in (0, 1, 2), r.stdout + r.stderr
        assert "Traceback" not in r.stdout + r.stderr
        out = r.stdout.replace("\n", "")
        # Where the field is printed, it is printed whole: never rendered as a link.
        if "example.invalid" in out or (where == "engine" and not extra):
            assert markup in out, r.stdout


def test_a_markup_error_message_prints_verbatim(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"kvfence_trace": 1, "spec_version": "[/][link=x]y"}\n')
    r = kvfence("replay", str(path))
    assert r.returncode == 2 and "[/][link=x]y" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("target", ["/proc/kmsg", "/proc/self/status", "/dev/zero"])
def test_replay_refuses_a_link_to_a_pseudo_file_without_waiting(tmp_path, target):
    if not os.path.exists(target):
        pytest.skip(f"{target} does not exist here")
    link = tmp_path / "trace.jsonl"
    link.symlink_to(target)
    r = kvfence("replay", str(link), timeout=30)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.startswith("ERROR"), r.stdout


def test_the_trace_size_limit_is_overridden_by_its_variable(session_trace):
    env = {**os.environ, "KVFENCE_MAX_TRACE_BYTES": "100"}
    r = subprocess.run(
        [*KVFENCE, "replay", str(session_trace)], capture_output=True, text=True, env=env
    )
    assert r.returncode == 2 and "KVFENCE_MAX_TRACE_BYTES" in r.stdout, r.stdout
    env["KVFENCE_MAX_TRACE_BYTES"] = "lots"
    r = subprocess.run(
        [*KVFENCE, "replay", str(session_trace)], capture_output=True, text=True, env=env
    )
    assert r.returncode == 2 and "positive number of bytes" in r.stdout, r.stdout
