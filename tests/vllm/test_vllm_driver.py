"""Live tests of the vLLM drivers (vllm_offline, vllm_http, vllm_cold) on vLLM 0.32 CPU (SC-9).

A ~100-token prompt fills three 32-token KV blocks (96 cacheable tokens).
After an in-place reload without a prefix-cache reset, a repeated prompt hits
those blocks and its logprobs differ from a cold engine holding the new
weights: stale KV. After a reset, the bytes equal the cold engine exactly.
"""

from __future__ import annotations

import pytest

from kvfence.adapters.tiny_model import prompt_ids
from kvfence.adapters.vllm_base import Generation
from kvfence.adapters.vllm_cold import cold_generate
from kvfence.adapters.vllm_offline import OfflineVllmDriver

pytestmark = pytest.mark.vllm

PROMPT = prompt_ids(100)
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def model_root(checkpoints):
    return checkpoints[0].parent


@pytest.fixture(scope="module")
def cold_v1(model_root, tmp_path_factory, server_startup) -> Generation:
    """Reference: a fresh engine holding v1, empty cache.

    Built before ``offline`` starts: closing an in-process engine breaks any
    other live one, so cold_generate would otherwise need a subprocess.
    """
    gen = cold_generate(model_root, 1, PROMPT, MAX_TOKENS, tmp_path_factory.mktemp("cold"))
    assert gen.cached_tokens == 0
    assert len(gen.token_ids) == len(gen.logprobs) == MAX_TOKENS
    return gen


@pytest.fixture(scope="module")
def offline(model_root, tmp_path_factory, cold_v1):
    with OfflineVllmDriver(model_root, 0, tmp_path_factory.mktemp("offline")) as driver:
        yield driver


def _fresh_at(driver, version: int) -> None:
    driver.reload_weights(version)
    assert driver.reset_prefix_cache() is True


def _max_diff(a: Generation, b: Generation) -> float:
    return max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True))


def test_repeat_hits_prefix_cache_with_identical_bytes(offline):
    _fresh_at(offline, 0)
    first = offline.generate(PROMPT, MAX_TOKENS)
    second = offline.generate(PROMPT, MAX_TOKENS)
    assert first.cached_tokens == 0
    assert second.cached_tokens == 96
    assert (second.token_ids, second.logprobs) == (first.token_ids, first.logprobs)


def test_reload_without_reset_serves_stale_kv(offline, cold_v1):
    _fresh_at(offline, 0)
    offline.generate(PROMPT, MAX_TOKENS)  # KV of the prompt under v0
    offline.reload_weights(1)
    stale = offline.generate(PROMPT, MAX_TOKENS)
    assert stale.cached_tokens > 0
    assert stale.logprobs != cold_v1.logprobs
    assert _max_diff(stale, cold_v1) > 1e-2


def test_reload_then_reset_equals_cold_engine(offline, cold_v1):
    _fresh_at(offline, 0)
    offline.generate(PROMPT, MAX_TOKENS)
    offline.reload_weights(1)
    assert offline.reset_prefix_cache() is True
    fresh = offline.generate(PROMPT, MAX_TOKENS)
    assert fresh.cached_tokens == 0
    assert fresh == cold_v1
    salted = offline.generate(PROMPT, MAX_TOKENS, cache_salt="kvfence-salt")
    assert salted == cold_v1


def test_offline_pause_and_sleep_support(offline):
    _fresh_at(offline, 0)
    offline.generate(PROMPT, MAX_TOKENS)
    with pytest.raises(NotImplementedError):
        offline.pause("wait", clear_cache=False)
    offline.pause("abort", clear_cache=False)
    assert offline.is_paused()
    offline.resume()
    assert offline.generate(PROMPT, MAX_TOKENS).cached_tokens == 96  # kept
    offline.pause("keep", clear_cache=True)
    offline.resume()
    assert offline.generate(PROMPT, MAX_TOKENS).cached_tokens == 0  # cleared
    with pytest.raises(NotImplementedError, match="CPU"):
        offline.sleep(1)
    with pytest.raises(NotImplementedError, match="CPU"):
        offline.wake_up()
    assert offline.weight_version() == "default"


def test_http_server_stale_kv_and_reset(server_startup, cold_v1):
    http = server_startup.result()
    _fresh_at(http, 0)  # the shared server, as another test may have left it
    http.set_weight_version("default")
    first = http.generate(PROMPT, MAX_TOKENS)
    second = http.generate(PROMPT, MAX_TOKENS)
    assert (first.cached_tokens, second.cached_tokens) == (0, 96)
    assert second == Generation(first.token_ids, first.logprobs, 96)

    http.reload_weights(1)  # (b) no reset: stale prefix
    stale = http.generate(PROMPT, MAX_TOKENS)
    # The server's own cold v1 bytes: a salted request shares no cached block.
    # (Its decode steps differ from the offline engine's by ~1e-6, so the
    # server is compared bit-for-bit with itself and loosely with cold_v1.)
    cold_http = http.generate(PROMPT, MAX_TOKENS, cache_salt="kvfence-cold-v1")
    assert cold_http.cached_tokens == 0
    assert cold_http.token_ids == cold_v1.token_ids
    assert _max_diff(cold_http, cold_v1) < 1e-4
    assert stale.cached_tokens > 0
    assert _max_diff(stale, cold_http) > 1e-2

    assert http.reset_prefix_cache() is True  # (c) reset: cold bytes
    assert http.generate(PROMPT, MAX_TOKENS) == cold_http

    http.pause("wait", clear_cache=False)  # pause without clearing keeps KV
    assert http.is_paused()
    http.resume()
    assert http.generate(PROMPT, MAX_TOKENS).cached_tokens == 96
    http.pause("abort", clear_cache=True)
    http.resume()
    assert http.generate(PROMPT, MAX_TOKENS).cached_tokens == 0
    assert http.weight_version() == "default"
    with pytest.raises(NotImplementedError, match="CPU"):
        http.sleep(1)
    # closing it ends its whole process group: checked when the shared server is closed
    # (tests/vllm/conftest.py, server_startup)
