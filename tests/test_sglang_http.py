"""``sglang-http``: attach to a running SGLang server by URL, with its own routes.

No real SGLang server runs in this project's CI yet, so the adapter is
checked here against ``kvfence serve --api sglang``, which answers SGLang's routes with a
kvfence engine behind them: the reference engine passes, an engine that never flushes on
update is caught by the byte oracle (a fresh ``extra_key`` is a cold prefill).
"""

from __future__ import annotations

import re
import subprocess

import pytest
from test_serve import KVFENCE, serve

from kvfence.adapters import registry
from kvfence.adapters.sglang_http import SglangHttpAdapter


def checkpoints(tmp_path):
    out = []
    for v in (0, 1):
        d = tmp_path / "ckpt" / f"step-{v}"
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
        (d / "model.safetensors").write_bytes(b"")
        out += ["--checkpoint", f"v{v}={d}"]
    return out


def check(tmp_path, url: str) -> subprocess.CompletedProcess:
    cmd = [*KVFENCE, "check", "--engine", "sglang-http", "--url", url, *checkpoints(tmp_path)]
    cmd += ["--out", str(tmp_path / "check"), "-v"]  # -v: every rule's row
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_attach_to_serve_with_the_reference_engine_passes(tmp_path):
    with serve(tmp_path, "reference") as s:
        r = check(tmp_path, s.url)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert "verdict: PASS" in r.stdout
        # The check reached the stale-reuse question through SGLang's routes.
        assert re.search(r"^REACH-001\s+PASS", r.stdout, re.M), r.stdout[-3000:]
        log = s.http.get("/kvfence/verdict").json()
        # serve judged the checker's traffic as a trainer's: the search's raw updates
        # without a flush are stale reuse under --mode auto, so no exit code is asserted.
        assert log["verdict"] in ("PASS", "FAIL")
        s.stop()


def test_attach_catches_an_engine_that_never_flushes(tmp_path):
    with serve(tmp_path, "update-never-flushes") as s:
        r = check(tmp_path, s.url)
        s.stop()
    assert r.returncode == 1, r.stdout[-3000:]
    assert "violated INV-001" in r.stdout and "stale hit" in r.stdout


def test_attach_is_loopback_unless_allowed(tmp_path):
    with pytest.raises(ValueError, match="allow-remote"):
        registry.engine("sglang-http", url="http://10.1.2.3:30000", checkpoints={})
    with pytest.raises(ValueError, match="--url"):
        registry.engine("sglang-http")
    with pytest.raises(ValueError, match="served-model"):
        SglangHttpAdapter(url="http://127.0.0.1:1", served_model="m")
    with pytest.raises(ValueError, match="v0=PATH"):
        SglangHttpAdapter(url="http://127.0.0.1:1", checkpoints={0: tmp_path})


def test_attach_to_nothing_is_an_error(tmp_path):
    r = check(tmp_path, "http://127.0.0.1:9")
    assert r.returncode == 2, r.stdout[-2000:]
    assert "no SGLang server" in r.stdout


def test_http_drivers_share_attach_and_generate():
    """Attach, the HTTP plumbing and the generation call live once, in
    ``adapters.http_base.HttpDriverBase``; each driver keeps only its routes (the body and
    answer fields of a generation, the probes of an attached server)."""
    from kvfence.adapters.http_base import HttpDriverBase
    from kvfence.adapters.sglang_http import HttpSglangDriver
    from kvfence.adapters.vllm_http import HttpVllmDriver

    shared = ("attach", "generate", "_request", "_json_ok", "_check_health", "close")
    for driver in (HttpSglangDriver, HttpVllmDriver):
        assert issubclass(driver, HttpDriverBase)
        assert not [name for name in shared if name in vars(driver)], driver
        assert {"_probe_attached", "_generate_body", "_parse_generation"} <= set(vars(driver))
    assert HttpSglangDriver.GENERATE_ROUTE == "/generate"
    assert HttpVllmDriver.GENERATE_ROUTE == "/v1/completions"


@pytest.mark.parametrize(
    ("driver", "answer"),
    [
        ("sglang", {"output_ids": [5, 6], "meta_info": {"cached_tokens": 32}}),
        ("vllm", {"choices": [{"token_ids": [5, 6]}], "usage": {}}),
    ],
)
def test_a_malformed_generation_answer_is_a_clear_error(tmp_path, driver, answer):
    """A generation answer without its logprobs names the route and the answer."""
    from kvfence.adapters.sglang_http import HttpSglangDriver
    from kvfence.adapters.vllm_base import VllmDriverError
    from kvfence.adapters.vllm_http import HttpVllmDriver

    cls = HttpSglangDriver if driver == "sglang" else HttpVllmDriver
    d = cls("http://127.0.0.1:9", tmp_path, 0, tmp_path / "w")
    d._json_ok = lambda *a, **k: answer  # the server's answer, without a server
    try:
        with pytest.raises(VllmDriverError, match=f"unexpected {cls.GENERATE_ROUTE} response"):
            d.generate([1, 2, 3], 2)
    finally:
        d.close()
