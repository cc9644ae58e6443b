"""SkyRL 0.4.0's own weight-sync client driving syncs against a vLLM-API server.

Run with a Python >= 3.12 that has SkyRL 0.4.0 installed from the package index,
unmodified: ``PYTHON tests/peer/skyrl4_sync.py VARIANT=URL...`` (one sync against each
server in turn). It prints one JSON line per call: the server's index, the call and what
``SkyrlWeightSyncClient`` (``skyrl/backends/skyrl_train/weight_sync/control_plane.py``,
skyrl 0.4.0) returned or raised. The sync is the checkpoint-delta engine's
(``weight_sync/delta/trainer.py`` ``_apply_receiver_update``): ``pause_generation()``
(``/pause?mode=keep&clear_cache=false``), ``reset_prefix_cache(reset_running_requests=
True)`` when the trainer resets (``_reset_prefix_cache``), then ``start_weight_update``,
``update_weights(update_info)``, ``finish_weight_update``, and ``resume_generation`` in its
``finally``; a completion of the same prompt before and after. VARIANT ``reset`` is the
default configuration; ``no-reset`` is SkyRL's own switch that skips the reset
(``workers/worker.py`` ``_should_reset_prefix_cache``: false when prefix caching is off,
or in fully-async mode without ``clear_kv_cache_on_weight_sync``).

The glue, all of it:

* ``/fetch_weights``, which the delta engine posts first (before the pause, so the
  checkpoint download overlaps generation), is SkyRL's own server's route
  (``inference_servers/vllm_server_actor.py``), not vLLM's: not sent.
* The completions are SkyRL's generator's ``/v1/completions`` requests, sent with
  ``requests``: SkyRL 0.4.0's ``RemoteInferenceClient`` imports torch, a 5.5 GB CUDA
  build on Python 3.12 (the CPU wheel on disk is for 3.11).
"""

from __future__ import annotations

import sys

import requests
from peer_records import emit

PROMPT = {"model": "kvfence-serve", "prompt": [101, 102, 103, 104], "max_tokens": 4}


def sync(variant: str, server: int, url: str) -> None:
    from skyrl.backends.skyrl_train.weight_sync.control_plane import SkyrlWeightSyncClient

    def call(name, fn):
        line = {"server": server, "variant": variant, "call": name}
        try:
            out = fn()
            emit({**line, "ok": True, "returned": repr(out)[:200]})
        except Exception as e:  # what SkyRL raised: the verdict is serve's
            emit({**line, "ok": False, "raised": repr(e)[:300]})

    def completion():
        r = requests.post(f"{url}/v1/completions", json=PROMPT, timeout=30)
        r.raise_for_status()
        return r.json()["choices"][0]["text"]

    client = SkyrlWeightSyncClient([url])
    update_info = {"target_version": 1, "sync_dir": "/ckpt/delta"}
    call("completion", completion)
    call("pause_generation", client.pause_generation)
    try:
        if variant == "reset":
            call(
                "reset_prefix_cache", lambda: client.reset_prefix_cache(reset_running_requests=True)
            )
        call("start_weight_update", client.start_weight_update)
        call("update_weights", lambda: client.update_weights(update_info))
        call("finish_weight_update", client.finish_weight_update)
    finally:
        call("resume_generation", client.resume_generation)
    call("completion", completion)
    client.close()


if __name__ == "__main__":
    for i, arg in enumerate(sys.argv[1:]):
        variant, url = arg.split("=", 1)
        sync(variant, i, url)
